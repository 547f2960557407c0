"""Kernel families: parametric candidate files the search agent renders concrete candidates from.

A family (``kernels/families/<name>.py``) is a complete candidate whose tunable constants sit in
one marked block, followed by the choices for each knob::

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

Families are read, never imported: ``KNOBS`` and ``SPACE`` come out with ``ast.literal_eval``,
and a candidate is the family's text with the block replaced. Rendering the default knobs
gives back the file unchanged, so the baseline candidate keeps its id.
"""

from __future__ import annotations

import ast
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from . import KERNELS_DIR

BEGIN = "# kopt:knobs-begin"
END = "# kopt:knobs-end"
FAMILIES_DIR = KERNELS_DIR / "families"


class FamilyError(ValueError):
    """A family file is malformed, or knobs were asked for that it does not have."""


@dataclass(frozen=True)
class Family:
    name: str
    path: Path
    source: str
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
    return Path(directory or FAMILIES_DIR) / f"{name}.py"


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
    """A family by name (``kernels/families/<name>.py``) or by path."""
    path = Path(name_or_path)
    if path.suffix != ".py":
        path = family_path(str(name_or_path), directory)
    if not path.exists():
        raise FamilyError(f"no family file {path}")
    return parse_family(path.read_text(), path.stem, path)


def render(family: Family, knobs: dict[str, Any]) -> str:
    """Replace the knobs block with ``KNOBS = {...}`` holding the defaults updated by ``knobs``."""
    unknown = sorted(set(knobs) - set(family.knobs))
    if unknown:
        raise FamilyError(f"{family.name} has no knob(s) {', '.join(unknown)}; it has {', '.join(family.knobs)}")
    merged = {**family.knobs, **knobs}
    if merged == family.knobs:
        return family.source
    text = repr(merged)
    if ast.literal_eval(text) != merged:
        raise FamilyError(f"{family.name}: knob values must be plain literals, got {text}")
    lines = family.source.splitlines(keepends=True)
    begin, end = _block(family.source, family.name)
    return "".join(lines[: begin + 1]) + f"KNOBS = {text}\n" + "".join(lines[end:])
