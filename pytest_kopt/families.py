"""Kernel families: parametric candidates the search agent renders concrete candidates from.

A family is a complete candidate whose tunable constants sit in one marked block, followed by the
choices for each knob::

    # kopt:knobs-begin
    KNOBS = {"BV": 32, "num_warps": 4}
    # kopt:knobs-end
    SPACE = {"BV": [16, 32, 64], "num_warps": [1, 2, 4, 8]}

An optional ``TRY_EARLY = [{"BV": 64}, ...]`` lists knob overrides (inside SPACE) that its author
wants measured right after the defaults: new ideas not yet seen on a GPU, so the search loop is
what measures them, and the defaults stay the best measured configuration.

An optional ``REQUIRES = [({"num_warps": 8}, {"BV": [32, 64]}), ...]`` states the combinations the
family refuses whatever the shape: when every knob of the first dict holds (a value, or one of a
list), each knob of the second must take one of the listed values. The family's own launch code
stays the authority (it raises for these too); the list lets the search agent skip a refused
combination without spending two tool calls to learn what the author already knew.

A family is one file, ``kernels/families/<name>.py``, or a folder of stage files,
``kernels/families/<name>/`` (a Python package: ``__init__.py`` holds the family's docstring and
imports the stages in the order the candidate holds them, ``from . import knobs, rows, ...``; each
stage imports what it needs from the others with ``from .stage import name``; ``from ..other import a, b`` takes a
sibling family's stages as they are, for a family that calls another's kernels with another signature). A folder is
joined into one text (``join_folder``): the package docstring, the stages' imports merged, then each stage
under a comment header made of its docstring, with its relative imports dropped.

Families are read, never imported: ``KNOBS`` and ``SPACE`` come out with ``ast.literal_eval``.
A candidate is the family's text with the block replaced and then reduced to live code
(``pytest_kopt.livecode``): branches its knob values never take folded away, definitions nothing
reaches dropped. A family that is live code at its defaults (the baselines) renders to itself, so
its baseline candidate keeps its id.
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from . import KERNELS_DIR
from .livecode import live

BEGIN = "# kopt:knobs-begin"
END = "# kopt:knobs-end"
FAMILIES_DIR = KERNELS_DIR / "families"


class FamilyError(ValueError):
    """A family file is malformed, or knobs were asked for that it does not have."""


@dataclass(frozen=True)
class Family:
    name: str
    path: Path  # the family's file, or its folder
    source: str  # the file's text, or the folder joined into one text
    knobs: dict[str, Any]  # the defaults, in file order
    space: dict[str, list]  # choices per knob (a knob missing here stays at its default)
    try_early: tuple[dict, ...] = ()  # knob overrides to measure right after the defaults
    requires: tuple[tuple[dict, dict], ...] = ()  # (when, then): combinations the family refuses

    def refusal(self, knobs: dict[str, Any]) -> str | None:
        """Why REQUIRES refuses these knobs (missing ones at their defaults), or None."""
        merged = {**self.knobs, **knobs}
        for when, then in self.requires:
            if all(merged.get(k) in (v if isinstance(v, list) else [v]) for k, v in when.items()):
                bad = {k: merged.get(k) for k, allowed in then.items() if merged.get(k) not in allowed}
                if bad:
                    return f"{self.name}: {when} requires {then}, got {bad}"
        return None

    def size(self) -> int:
        """How many distinct candidates the space holds."""
        return math.prod(len(self.space.get(k, [v])) for k, v in self.knobs.items())

    def combinations(self) -> Iterator[dict[str, Any]]:
        """Every knob combination, defaults first in each position."""
        names = list(self.knobs)
        choices = [self.space.get(k, [self.knobs[k]]) for k in names]
        for values in itertools.product(*choices):
            yield dict(zip(names, values))

    def render(self, knobs: dict[str, Any] | None = None) -> str:
        """The candidate source for ``knobs`` (missing ones keep their defaults)."""
        return render(self, knobs or {})


def family_path(name: str, directory: Path | None = None) -> Path:
    """``<directory>/<name>/`` where that folder is a family, else ``<directory>/<name>.py``."""
    folder = Path(directory or FAMILIES_DIR) / name
    return folder if (folder / "__init__.py").is_file() else folder.with_name(f"{name}.py")


def family_names(directory: Path | None = None) -> list[str]:
    """The families in a directory: its ``*.py`` files (but ``__init__.py``) and its folders with an ``__init__.py``."""
    directory = Path(directory or FAMILIES_DIR)
    files = [p.stem for p in directory.glob("*.py") if p.name != "__init__.py"]
    folders = [p.name for p in directory.iterdir() if p.is_dir() and (p / "__init__.py").is_file()]
    return sorted(files + folders)


def _block(source: str, where: str) -> tuple[int, int]:
    """Line indices (begin marker, end marker) of the knobs block."""
    lines = source.splitlines()
    begins = [i for i, line in enumerate(lines) if line.strip() == BEGIN]
    ends = [i for i, line in enumerate(lines) if line.strip() == END]
    if len(begins) != 1 or len(ends) != 1 or ends[0] <= begins[0]:
        raise FamilyError(f"{where}: needs exactly one '{BEGIN}' line followed by one '{END}' line")
    return begins[0], ends[0]


def _literal(tree: ast.Module, name: str, where: str, default: Any = ...) -> Any:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            try:
                return ast.literal_eval(node.value)
            except ValueError as exc:
                raise FamilyError(f"{where}: {name} must be a literal ({exc})") from None
    if default is not ...:
        return default
    raise FamilyError(f"{where}: no top-level {name} = {{...}}")


def parse_family(source: str, name: str = "family", path: Path | None = None) -> Family:
    """Read KNOBS and SPACE from a family's text and check they fit together."""
    where = str(path or name)
    begin, end = _block(source, where)
    try:
        tree = ast.parse(source)
        block = ast.parse("\n".join(source.splitlines()[begin + 1 : end]))
    except SyntaxError as exc:
        raise FamilyError(f"{where}: not valid Python ({exc})") from None
    if not any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "KNOBS" for t in n.targets) for n in block.body):
        raise FamilyError(f"{where}: KNOBS must be assigned inside the knobs block")
    knobs = _literal(tree, "KNOBS", where)
    space = _literal(tree, "SPACE", where)
    if not isinstance(knobs, dict) or not isinstance(space, dict):
        raise FamilyError(f"{where}: KNOBS and SPACE must be dicts")
    for knob, choices in space.items():
        if knob not in knobs:
            raise FamilyError(f"{where}: SPACE names {knob!r}, which KNOBS lacks")
        if not isinstance(choices, (list, tuple)) or not choices:
            raise FamilyError(f"{where}: SPACE[{knob!r}] must be a non-empty list of choices")
    try_early = _literal(tree, "TRY_EARLY", where, default=[])
    if not isinstance(try_early, (list, tuple)) or not all(isinstance(t, dict) for t in try_early):
        raise FamilyError(f"{where}: TRY_EARLY must be a list of knob dicts")
    for overrides in try_early:
        for knob, value in overrides.items():
            if value not in space.get(knob, [knobs.get(knob, ...)]):
                raise FamilyError(f"{where}: TRY_EARLY sets {knob}={value!r}, which SPACE does not hold")
    requires = _requires(_literal(tree, "REQUIRES", where, default=[]), knobs, where)
    return Family(name, Path(path) if path else Path(f"{name}.py"), source, dict(knobs), {k: list(v) for k, v in space.items()},
                  tuple(dict(t) for t in try_early), requires)


def _requires(rules: Any, knobs: dict, where: str) -> tuple[tuple[dict, dict], ...]:
    """REQUIRES as (when, then) pairs naming only existing knobs, each ``then`` value a list."""
    if not isinstance(rules, (list, tuple)):
        raise FamilyError(f"{where}: REQUIRES must be a list of (when, then) pairs of dicts")
    out = []
    for rule in rules:
        if not (isinstance(rule, (list, tuple)) and len(rule) == 2 and all(isinstance(d, dict) for d in rule)):
            raise FamilyError(f"{where}: REQUIRES entry {rule!r} is not a (when, then) pair of dicts")
        when, then = rule
        for knob in [*when, *then]:
            if knob not in knobs:
                raise FamilyError(f"{where}: REQUIRES names {knob!r}, which KNOBS lacks")
        if not all(isinstance(v, list) for v in then.values()):
            raise FamilyError(f"{where}: REQUIRES entry {rule!r}: the allowed values must be lists")
        out.append((dict(when), dict(then)))
    return tuple(out)


def load_family(name_or_path: str | Path, directory: Path | None = None) -> Family:
    """A family by name (``kernels/families/<name>/`` or ``<name>.py``) or by path (a file or a folder)."""
    path = Path(name_or_path)
    if not path.is_dir() and path.suffix != ".py":
        path = family_path(str(name_or_path), directory)
    if path.is_dir():
        return parse_family(join_folder(path), path.name, path)
    if not path.exists():
        raise FamilyError(f"no family file {path}")
    return parse_family(path.read_text(), path.stem, path)


def render(family: Family, knobs: dict[str, Any]) -> str:
    """The knobs block set to ``KNOBS = {...}`` (the defaults updated by ``knobs``), reduced to live code."""
    unknown = sorted(set(knobs) - set(family.knobs))
    if unknown:
        raise FamilyError(f"{family.name} has no knob(s) {', '.join(unknown)}; it has {', '.join(family.knobs)}")
    merged = {**family.knobs, **knobs}
    text = family.source
    if merged != family.knobs:
        literal = repr(merged)
        if ast.literal_eval(literal) != merged:
            raise FamilyError(f"{family.name}: knob values must be plain literals, got {literal}")
        lines = family.source.splitlines(keepends=True)
        begin, end = _block(family.source, family.name)
        text = "".join(lines[: begin + 1]) + f"KNOBS = {literal}\n" + "".join(lines[end:])
    try:
        return _live(text)
    except SyntaxError as exc:
        raise FamilyError(f"{family.name}: not valid Python ({exc})") from None


@functools.lru_cache(maxsize=64)
def _live(text: str) -> str:
    """``live`` of a text, remembered: the search agent and the tests render the same candidates again."""
    return live(text)


HEADER_WIDTH = 120


def _parse(text: str, where: str | Path) -> ast.Module:
    try:
        return ast.parse(text)
    except SyntaxError as exc:
        raise FamilyError(f"{where}: not valid Python ({exc})") from None


def _docstring_node(tree: ast.Module) -> ast.Expr | None:
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first
    return None


def _stage_order(folder: Path, tree: ast.Module) -> dict[str, Path]:
    """The stages ``__init__.py`` imports, in that order, and their files: ``from . import a, b, ...`` names the
    folder's own, ``from ..family import c, ...`` stages of a sibling family folder, taken as they are (a family
    that calls another's kernels with another signature: stage names stay unique, since they share a namespace)."""
    order: dict[str, Path] = {}
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom) or not node.level or (node.level == 1 and node.module):
            continue
        if node.level == 1:
            home = folder
        elif node.level == 2 and node.module and "." not in node.module:
            home = folder.parent / node.module
        else:
            raise FamilyError(f"{folder}/__init__.py: line {node.lineno}: stages come from 'from . import' or "
                              "'from ..<family> import' only")
        for alias in node.names:
            path = home / f"{alias.name}.py"
            if alias.name in order:
                raise FamilyError(f"{folder}/__init__.py names stage {alias.name!r} twice")
            if alias.asname or not path.is_file():
                raise FamilyError(f"{folder}/__init__.py names stage {alias.name!r}, but {alias.name}.py is not in the folder {home}"
                                  + (" (a stage is imported under its own name)" if alias.asname else ""))
            order[alias.name] = path
    if not order:
        raise FamilyError(f"{folder}/__init__.py: no 'from . import <stage>, ...' naming the stages in order")
    return order


def _bound(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _imports_text(plain: dict[tuple[str, str | None], None], froms: dict[str, dict[tuple[str, str | None], None]]) -> str:
    """isort's order: ``from __future__`` first, then ``import x`` lines, then ``from x import ...``, by module."""
    lines = []
    if "__future__" in froms:
        lines.append("from __future__ import " + ", ".join(n for n, _ in froms.pop("__future__")) + "\n")
    for name, asname in sorted(plain):
        lines.append(f"import {name}" + (f" as {asname}" if asname else "") + "\n")
    for module in sorted(froms):
        parts = sorted(n + (f" as {a}" if a else "") for n, a in froms[module])
        line = f"from {module} import " + ", ".join(parts)
        lines.append(line + "\n" if len(line) <= HEADER_WIDTH else
                     f"from {module} import (\n" + "".join(f"    {p},\n" for p in parts) + ")\n")
    return "".join(lines)


def join_folder(folder: Path) -> str:
    """A folder family as one candidate text: the package docstring, the stages' imports merged, then each stage
    (in ``__init__.py``'s order) under a comment header made of its docstring, its relative imports dropped."""
    folder = Path(folder)
    init_text = (folder / "__init__.py").read_text()
    init = _parse(init_text, folder / "__init__.py")
    doc = _docstring_node(init)
    if doc is None:
        raise FamilyError(f"{folder}/__init__.py: the family's docstring (the candidate's) is missing")
    order = _stage_order(folder, init)
    plain: dict[tuple[str, str | None], None] = {}
    froms: dict[str, dict[tuple[str, str | None], None]] = {}
    owner: dict[str, str] = {}  # top-level name -> the stage defining it
    exported: dict[str, set[str]] = {}
    wanted: list[tuple[str, str, str]] = []  # (stage, from stage, name) of every relative import
    sections = []
    for stage, path in order.items():
        text = path.read_text()
        tree = _parse(text, path)
        lines = text.splitlines(keepends=True)
        drop: set[int] = set()
        stage_doc = _docstring_node(tree)
        title = f"{stage}.py" if path.parent == folder else f"{path.parent.name}/{stage}.py"
        header = [f"# -- {title} " + "-" * (HEADER_WIDTH - len(title) - 6) + "\n"]
        if stage_doc is not None:
            drop.update(range(stage_doc.lineno, stage_doc.end_lineno + 1))
            header += [("# " + line).rstrip() + "\n" for line in inspect.cleandoc(stage_doc.value.value).splitlines()]
        exported[stage] = set()
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                drop.update(range(node.lineno, node.end_lineno + 1))
                if isinstance(node, ast.ImportFrom) and node.level:
                    if node.level != 1 or node.module not in order:
                        raise FamilyError(f"{path}: line {node.lineno}: a stage imports from another stage of the "
                                          f"family only ('from .<stage> import name'; stages: {', '.join(order)})")
                    wanted += [(stage, node.module, a.name) for a in node.names]
                elif isinstance(node, ast.Import):
                    plain.update({(a.name, a.asname): None for a in node.names})
                else:
                    froms.setdefault(node.module or "", {}).update({(a.name, a.asname): None for a in node.names})
                exported[stage] |= _bound(node)
                continue
            for name in _bound(node):
                if owner.get(name, stage) != stage:
                    raise FamilyError(f"{path}: line {node.lineno}: {name} is defined in stage {owner[name]} too "
                                      "(the stages share one namespace in the candidate)")
                owner[name] = stage
                exported[stage].add(name)
        body = "".join(line for i, line in enumerate(lines, start=1) if i not in drop).strip("\n")
        sections.append("".join(header) + ("\n" + body + "\n" if body else ""))
    for stage, source_stage, name in wanted:
        if name not in exported[source_stage]:
            raise FamilyError(f"{order[stage]}: imports {name} from stage {source_stage}, which does not define it")
    docstring = ast.get_source_segment(init_text, doc)
    return docstring + "\n\n" + _imports_text(plain, froms) + "\n\n" + "\n\n".join(sections)


# ---- kopt render --------------------------------------------------------------------------------------------------
# A promoted kernel must be its family rendered with the knobs its provenance records (tests/test_best_kernels.py), so
# an edit of a family's shared code is followed by a re-render of every best made from it; and a knob setting is timed
# on a GPU as a rendered file. Both are this command.

def add_arguments(parser) -> None:  # noqa: ANN001
    """``kopt render``'s options."""
    parser.description = ("Render a family with knobs (its defaults updated by --knobs), or a promoted kernel's family with "
                          "the knobs of kernels/best/PROBLEM.json (--best). The source goes to --out, or to standard output.")
    parser.add_argument("family", nargs="?", help="a family's name (kernels/families/) or path")
    parser.add_argument("--best", metavar="PROBLEM", help="the family and knobs of kernels/best/PROBLEM.json")
    parser.add_argument("--knobs", default="{}", metavar="JSON", help='knob overrides, e.g. \'{"MERGE_ROWS": 8}\'')
    parser.add_argument("--out", metavar="PATH", help="write the candidate here and print its id")
    parser.add_argument("--check", action="store_true",
                        help="with --best: exit 1 (and show the difference) unless kernels/best/PROBLEM.py is that render")


def run(args) -> int:  # noqa: ANN001
    """Exit 0 on success, 1 where --check finds a difference, 2 on bad input (said on standard error)."""
    import difflib
    import json
    import sys

    from .events import atomic_write
    from .judge import candidate_id

    def fail(message: str) -> int:
        print(f"kopt render: {message}", file=sys.stderr)
        return 2

    if (args.family is None) == (args.best is None):
        return fail("name a family or --best PROBLEM (one of them)")
    if args.check and (args.best is None or args.out or args.knobs.strip() != "{}"):
        return fail("--check takes --best PROBLEM alone (it compares the promoted file with its family's render)")
    try:
        overrides = json.loads(args.knobs)
    except ValueError as exc:
        return fail(f"--knobs is not JSON: {exc}")
    if not isinstance(overrides, dict):
        return fail(f"--knobs must be a JSON object of knob names to values, got {args.knobs!r}")
    record, best_file = None, None
    if args.best is not None:
        record_path = KERNELS_DIR / "best" / f"{args.best}.json"
        try:
            record = json.loads(record_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            return fail(f"cannot read {record_path}: {exc}")
        if not isinstance(record, dict) or not record.get("family") or not isinstance(record.get("knobs"), dict):
            return fail(f"{record_path} names no family and knobs: that kernel was not rendered from a family")
        best_file = record_path.with_suffix(".py")
    name = record["family"] if record is not None else args.family
    knobs = {**(record["knobs"] if record is not None else {}), **overrides}
    try:
        family = load_family(name)
        text = family.render(knobs)
    except (FamilyError, OSError) as exc:
        return fail(str(exc))
    cid = candidate_id(text)
    if args.check:
        current = best_file.read_text(encoding="utf-8") if best_file.is_file() else ""
        if current != text:
            print(f"{best_file} is not {family.name} rendered with its knobs (that render is {cid}):")
            diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(), str(best_file), f"render of {family.name}",
                                             lineterm="", n=1))
            print("\n".join(diff[:60] + ([f"... {len(diff) - 60} more diff lines"] if len(diff) > 60 else [])))
            return 1
        named = record.get("candidate_id")
        print(f"{best_file} is {family.name} rendered with its knobs: {cid}"
              + ("" if named == cid else f" (its JSON names {named}, the candidate its figures are of)"))
        return 0
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        atomic_write(Path(args.out), text)
    except OSError as exc:  # a folder of that name, no permission, a full disk: nothing half written
        return fail(f"cannot write {args.out}: {exc}")
    changed = {k: v for k, v in knobs.items() if family.knobs.get(k) != v}
    print(f"{args.out}: candidate {cid}, {family.name} with {json.dumps(changed)}")
    return 0
