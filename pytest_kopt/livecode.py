"""Live code only: a candidate with its knob branches folded and its unreachable definitions dropped.

The text is edited at AST positions, so comments, docstrings and the layout of what survives stay as written.

Static values: literals; ``KNOBS["name"]`` and ``KNOBS.get("name"[, default])``, also on a name that is provably
KNOBS (a local assigned ``X = KNOBS`` once, or a parameter that every call in the file passes KNOBS to); locals
assigned once, at their function's top level, from static values; and operators, comparisons, conditional
expressions and a few pure builtins over those.

Folded: ``if`` / ``elif`` statements and conditional expressions whose test is static, and the static operands of
an ``and`` / ``or`` test where dropping them leaves its truth and what it runs unchanged; locals assigned a static
value and then unused; statements after a ``return``, ``raise``, ``break`` or ``continue`` in the same block.
Checks (``if <test>: raise ...`` with no else) stay as written.

Dropped: top-level functions, classes and assignments that nothing reachable from the roots (``kernel`` and a
family's KNOBS, SPACE, TRY_EARLY, REQUIRES) refers to, with the comment block right above each, and imported names
nothing refers to.

A file that writes into KNOBS (or into a name bound to it, or a parameter some call hands it to) is not folded at
all; a file with no top-level ``kernel`` is not pruned; a file that is live code already comes back unchanged.
"""

from __future__ import annotations

import ast
import functools
import io
import operator
import tokenize
from collections import deque
from typing import Any

ROOTS = ("kernel", "KNOBS", "SPACE", "TRY_EARLY", "REQUIRES")
_DYN = object()  # "not static"
_PURE = {"int": int, "float": float, "bool": bool, "str": str, "len": len, "min": min, "max": max, "abs": abs,
         "round": round, "tuple": tuple}
_READERS = {"get", "keys", "items", "values", "copy"}  # dict methods that leave KNOBS as it is
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.LShift: operator.lshift,
           ast.RShift: operator.rshift, ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor}
_CMPOPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
           ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
           ast.Is: operator.is_, ast.IsNot: operator.is_not}
_UNOPS = {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_SCOPES = (*_FUNCS, ast.ClassDef, ast.Lambda)


def _children(node: ast.AST, _node=ast.AST) -> list[ast.AST]:
    """``list(ast.iter_child_nodes(node))``, in the same order, without its two nested generators (the passes walk
    every tree several times over: a fifth of their time went to iterating)."""
    out = []
    for name in node._fields:
        try:
            field = getattr(node, name)
        except AttributeError:
            continue
        if isinstance(field, _node):
            out.append(field)
        elif isinstance(field, list):
            for item in field:
                if isinstance(item, _node):
                    out.append(item)
    return out


def _walk(node: ast.AST):
    """``ast.walk(node)``: the same nodes in the same (breadth-first) order, through ``_children``."""
    todo = deque([node])
    while todo:
        node = todo.popleft()
        todo.extend(_children(node))
        yield node


def live(source: str, roots: tuple[str, ...] = ROOTS) -> str:
    """``source`` with its knob branches folded and what the roots do not reach dropped (see the module doc)."""
    text = source
    if _knobs(ast.parse(text)) is not None:
        while True:
            edited = _fold_statements(text) or _fold_expressions(text) or _drop_dead_locals(text)
            if edited is None:
                break
            text = edited
    pruned = _prune(text, roots)
    return pruned if pruned is not None else text


# ---- static values ----------------------------------------------------------------------------------------------
def _knobs(tree: ast.Module) -> dict | None:
    """The literal KNOBS of a file that never assigns into it, else None (nothing is folded)."""
    value = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["KNOBS"]:
            if value is not None:
                return None  # bound twice
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
    return value if isinstance(value, dict) else None


def _bindings(fn: ast.AST) -> dict[str, int]:
    """How many times each name is bound in a function's own scope (parameters included; nested scopes not)."""
    counts: dict[str, int] = {}

    def bind(name: str, times: int = 1) -> None:
        counts[name] = counts.get(name, 0) + times

    args = fn.args
    for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if a is not None:
            bind(a.arg)

    def visit(node: ast.AST) -> None:
        for child in _children(node):
            if isinstance(child, _SCOPES):
                if not isinstance(child, ast.Lambda):
                    bind(child.name)
                for deco in getattr(child, "decorator_list", []):
                    visit(deco)
                continue
            if isinstance(child, ast.Name) and not isinstance(child.ctx, ast.Load):
                bind(child.id)
            elif isinstance(child, (ast.Global, ast.Nonlocal)):
                for name in child.names:
                    bind(name, 2)  # not a local constant
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                for alias in child.names:
                    bind((alias.asname or alias.name).split(".")[0])
            elif isinstance(child, ast.ExceptHandler) and child.name:
                bind(child.name)
            visit(child)

    for stmt in fn.body:
        if isinstance(stmt, _SCOPES):
            bind(stmt.name)
            for deco in stmt.decorator_list:
                visit(deco)
        else:
            visit(ast.Module(body=[stmt], type_ignores=[]))
    return counts


class _Static:
    """Static evaluation over one parsed file: which names are KNOBS, which locals are constants."""

    def __init__(self, tree: ast.Module, knobs: dict):
        self.knobs = knobs
        self.module_names = {n for n, c in _module_bindings(tree).items() if c}
        self.nodes: list[tuple[ast.AST, ast.AST | None]] = []  # every node, with the function whose scope holds it
        self.scope_of: dict[int, ast.AST | None] = {}
        stack: list[tuple[ast.AST, ast.AST | None]] = [(tree, None)]
        while stack:
            node, fn = stack.pop()
            for child in _children(node):
                self.nodes.append((child, fn))
                self.scope_of[id(child)] = fn
                stack.append((child, child if isinstance(child, _FUNCS) else fn))
        self.funcs = [n for n, _ in self.nodes if isinstance(n, _FUNCS)]
        self.binds = {id(f): _bindings(f) for f in self.funcs}
        self.aliases: dict[int, set[str]] = {id(f): set() for f in self.funcs}  # names bound to KNOBS per function
        self.consts: dict[int, dict[str, tuple[int, Any]]] = {id(f): {} for f in self.funcs}
        self._find_parameter_aliases(tree)
        for f in self.funcs:
            self._find_locals(f)
        self.mutated = self._knobs_mutated(tree)

    def scope(self, node: ast.AST) -> ast.AST | None:
        return self.scope_of.get(id(node))

    def _is_knobs(self, node: ast.AST, fn: ast.AST | None) -> bool:
        if not isinstance(node, ast.Name):
            return False
        if fn is None:
            return node.id == "KNOBS"
        if node.id in self.aliases[id(fn)]:
            return True
        return node.id == "KNOBS" and node.id not in self.binds[id(fn)]

    def _find_parameter_aliases(self, tree: ast.Module) -> None:
        """A top-level function's parameter is KNOBS when every call in the file passes KNOBS (or an alias) to it and
        the function is not otherwise referred to (handed out, it could be called with anything)."""
        top = {n.name: n for n in tree.body if isinstance(n, _FUNCS)}
        calls: dict[str, list[ast.Call]] = {name: [] for name in top}
        other_uses: set[str] = set()
        call_funcs = set()
        for node, _ in self.nodes:
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in top:
                calls[node.func.id].append(node)
                call_funcs.add(id(node.func))
        for node, _ in self.nodes:
            if isinstance(node, ast.Name) and node.id in top and id(node) not in call_funcs:
                other_uses.add(node.id)
        for f in self.funcs:
            self._find_local_aliases(f)
        changed = True
        while changed:
            changed = False
            for name, fn in top.items():
                if name in other_uses or not calls[name]:
                    continue
                params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
                for i, param in enumerate(params):
                    if param in self.aliases[id(fn)] or self.binds[id(fn)].get(param, 0) != 1:
                        continue
                    passed = []
                    for call in calls[name]:
                        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
                            passed.append(None)
                            continue
                        arg = call.args[i] if i < len(call.args) else next(
                            (k.value for k in call.keywords if k.arg == param), None)
                        passed.append(arg if arg is not None and self._is_knobs(arg, self.scope(call)) else None)
                    if all(a is not None for a in passed):
                        self.aliases[id(fn)].add(param)
                        changed = True
                        for f in self.funcs:
                            self._find_local_aliases(f)

    def _find_local_aliases(self, fn: ast.AST) -> None:
        for stmt in fn.body:
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                    and self.binds[id(fn)].get(stmt.targets[0].id) == 1 and self._is_knobs(stmt.value, fn)):
                self.aliases[id(fn)].add(stmt.targets[0].id)

    def _find_locals(self, fn: ast.AST) -> None:
        """Locals bound once, by a top-level statement of their function, to a static value that cannot change."""
        binds = self.binds[id(fn)]
        for stmt in fn.body:
            if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
                continue
            target, value = stmt.targets[0], stmt.value
            pairs = [(target, value)]
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
                pairs = list(zip(target.elts, value.elts))
            for t, v in pairs:
                if isinstance(t, ast.Name) and binds.get(t.id) == 1 and t.id not in self.aliases[id(fn)]:
                    got = self.value(v, fn)
                    if _immutable(got):  # a list or dict could change under the name
                        self.consts[id(fn)][t.id] = (stmt.end_lineno, got)

    def _knobs_mutated(self, tree: ast.Module) -> bool:
        """Whether anything may write into KNOBS: an assignment into it or a name bound to it (or a parameter some
        call hands it to), a method that is not a reader, or a function rebinding it as a global."""
        top = {n.name: n for n in tree.body if isinstance(n, _FUNCS)}
        handed: dict[int, set[str]] = {id(f): set() for f in self.funcs}  # parameters some call passes KNOBS to
        for node, _ in self.nodes:
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in top:
                fn = top[node.func.id]
                params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]]
                passed = list(zip(params, node.args)) + [(k.arg, k.value) for k in node.keywords if k.arg]
                handed[id(fn)] |= {p for p, a in passed if self._is_knobs(a, self.scope(node))}
            if isinstance(node, ast.Global) and "KNOBS" in node.names:
                return True

        def writable(target: ast.AST, fn) -> bool:
            return self._is_knobs(target, fn) or (fn is not None and isinstance(target, ast.Name)
                                                   and target.id in handed[id(fn)])

        for node, fn in self.nodes:
            if isinstance(node, (ast.Subscript, ast.Attribute)) and not isinstance(node.ctx, ast.Load):
                if writable(node.value, fn):
                    return True
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr not in _READERS:
                if writable(node.func.value, fn):
                    return True
            if isinstance(node, ast.AugAssign) and writable(node.target, fn):
                return True
        return False

    def value(self, node: ast.AST, fn: ast.AST | None) -> Any:
        """The value of an expression in function fn (None: module level), or _DYN."""
        try:
            return self._value(node, fn)
        except Exception:  # noqa: BLE001 - whatever raises here would raise at run time: not static
            return _DYN

    def _value(self, node: ast.AST, fn: ast.AST | None) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if self._is_knobs(node, fn):
                return self.knobs
            if fn is not None and node.id in self.consts[id(fn)]:
                line, value = self.consts[id(fn)][node.id]
                return value if node.lineno > line else _DYN
            return _DYN
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = [self._value(e, fn) for e in node.elts]
            if any(i is _DYN for i in items) or any(isinstance(e, ast.Starred) for e in node.elts):
                return _DYN
            return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
        if isinstance(node, ast.Subscript):
            base, index = self._value(node.value, fn), self._value(node.slice, fn)
            if base is _DYN or index is _DYN or not isinstance(base, (dict, tuple, list, str)):
                return _DYN
            return base[index]
        if isinstance(node, ast.Call):
            return self._call(node, fn)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            a, b = self._value(node.left, fn), self._value(node.right, fn)
            if a is _DYN or b is _DYN or not all(isinstance(x, (int, float, str, bool)) for x in (a, b)):
                return _DYN
            if isinstance(node.op, (ast.Pow, ast.LShift)) and abs(b) > 64:
                return _DYN
            return _BINOPS[type(node.op)](a, b)
        if isinstance(node, ast.UnaryOp):
            a = self._value(node.operand, fn)
            return _DYN if a is _DYN else _UNOPS[type(node.op)](a)
        if isinstance(node, ast.Compare):
            left = self._value(node.left, fn)
            if left is _DYN:
                return _DYN
            for op, right_node in zip(node.ops, node.comparators):
                right = self._value(right_node, fn)
                if right is _DYN:
                    return _DYN
                if not _CMPOPS[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.BoolOp):
            items = [self._value(v, fn) for v in node.values]
            if any(i is _DYN for i in items):
                return _DYN
            for item in items[:-1]:
                if bool(item) != isinstance(node.op, ast.And):
                    return item
            return items[-1]
        if isinstance(node, ast.IfExp):
            test = self._value(node.test, fn)
            return _DYN if test is _DYN else self._value(node.body if test else node.orelse, fn)
        return _DYN

    def _call(self, node: ast.Call, fn: ast.AST | None) -> Any:
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            return _DYN
        args = [self._value(a, fn) for a in node.args]
        if any(a is _DYN for a in args):
            return _DYN
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "get" and len(args) in (1, 2):
            base = self._value(func.value, fn)
            return base.get(*args) if isinstance(base, dict) else _DYN
        if isinstance(func, ast.Name) and func.id in _PURE and func.id not in self.module_names:
            if fn is None or func.id not in self.binds[id(fn)]:
                return _PURE[func.id](*args)
        return _DYN

    def test(self, node: ast.AST, fn: ast.AST | None, text: "_Text") -> tuple[str, Any]:
        """A test's truth: ("static", bool), ("rewrite", text without the static operands), or ("keep", None)."""
        got = self.value(node, fn)
        if got is not _DYN:
            try:
                return "static", bool(got)
            except Exception:  # noqa: BLE001
                return "keep", None
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            kind, inner = self.test(node.operand, fn, text)
            return ("rewrite", f"not ({inner})") if kind == "rewrite" else ("keep", None)
        if not isinstance(node, ast.BoolOp):
            return "keep", None
        is_and = isinstance(node.op, ast.And)
        kept, changed, dynamic_seen = [], False, False
        for operand in node.values:
            kind, result = self.test(operand, fn, text)
            if kind == "static":
                if result == is_and:  # truthy in an "and", falsy in an "or": drop it
                    changed = True
                    continue
                if not dynamic_seen:
                    return "static", result
                return "keep", None  # it decides, but only after operands that must still run
            dynamic_seen = True
            if kind == "rewrite":
                changed = True
                kept.append(f"({result})")
            else:
                seg = text.segment(operand)
                kept.append(f"({seg})" if isinstance(operand, (ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr)) else seg)
        if not kept:
            return "static", is_and
        if not changed:
            return "keep", None
        return "rewrite", (" and " if is_and else " or ").join(kept)


def _immutable(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_immutable(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def _module_bindings(tree: ast.Module) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in tree.body:
        names: list[str] = []
        if isinstance(node, (*_FUNCS, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [(a.asname or a.name).split(".")[0] for a in node.names]
        else:
            names = [n.id for n in _walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)]
        for name in names:
            counts[name] = counts.get(name, 0) + 1
    return counts


# ---- text and its edits ----------------------------------------------------------------------------------------
class _Text:
    """A source's lines, with AST positions (byte columns) turned into character offsets."""

    def __init__(self, source: str):
        self.source = source
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    @functools.cached_property
    def _tokens(self) -> tuple[set[int], list[tuple[int, int]]]:
        """Tokenized when first needed (a pass that edits no header and shifts no line never needs it)."""
        in_string: set[int] = set()  # 1-based lines that begin inside a multi-line string
        colons: list[tuple[int, int]] = []  # (line, column) of every ':' operator
        for tok in tokenize.generate_tokens(io.StringIO(self.source).readline):
            if tok.type == tokenize.OP and tok.string == ":":
                colons.append(tok.start)
            if tok.start[0] < tok.end[0] and tok.type in (tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", -1)):
                in_string.update(range(tok.start[0] + 1, tok.end[0] + 1))
        return in_string, colons

    @property
    def in_string(self) -> set[int]:
        return self._tokens[0]

    @property
    def colons(self) -> list[tuple[int, int]]:
        return self._tokens[1]

    def col(self, lineno: int, byte_col: int) -> int:
        return len(self.lines[lineno - 1].encode()[:byte_col].decode())

    def offset(self, lineno: int, byte_col: int) -> int:
        return self.starts[lineno - 1] + self.col(lineno, byte_col)

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def segment(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.source[start:end]

    def indent(self, lineno: int) -> str:
        line = self.lines[lineno - 1]
        return line[: len(line) - len(line.lstrip(" \t"))]

    def header_end(self, test: ast.AST) -> int:
        """The line of the ':' that ends a compound statement's header, after its test."""
        after = (test.end_lineno, self.col(test.end_lineno, test.end_col_offset))
        return next(line for line, col in self.colons if (line, col) >= after)

    def keyword_line(self, first: int, last: int, col: int, words: tuple[str, ...]) -> int | None:
        for lineno in range(first, last + 1):
            line = self.lines[lineno - 1]
            if len(self.indent(lineno)) == col and line.lstrip().startswith(words) and lineno not in self.in_string:
                return lineno
        return None


class _Edits:
    """Line deletions, dedents and replacements (one pass's), applied at once; blank lines tidied where lines went."""

    def __init__(self, text: _Text):
        self.text = text
        self.deleted: set[int] = set()
        self.dedent: dict[int, int] = {}
        self.replaced: dict[int, str] = {}

    def delete(self, first: int, last: int) -> None:
        self.deleted.update(range(first, last + 1))

    def shift(self, first: int, last: int, by: int) -> None:
        for lineno in range(first, last + 1):
            if lineno not in self.text.in_string:
                self.dedent[lineno] = self.dedent.get(lineno, 0) + by

    def apply(self) -> str | None:
        if not (self.deleted or self.dedent or self.replaced):
            return None
        out: list[str] = []
        touched: list[int] = []
        for lineno, line in enumerate(self.text.lines, start=1):
            if lineno in self.deleted:
                if not touched or touched[-1] != len(out):
                    touched.append(len(out))
                continue
            line = self.replaced.get(lineno, line)
            cut = self.dedent.get(lineno, 0)
            if cut and line.strip():
                lead = len(line) - len(line.lstrip(" "))
                line = line[min(cut, lead):]
            out.append(line)
        return "".join(_tidy(out, touched))


def _tidy(lines: list[str], touched: list[int]) -> list[str]:
    """Where lines were deleted, no more blank lines than PEP 8 puts there (two before top-level code, else one),
    and none at the end of the file."""
    drop: set[int] = set()
    for at in touched:
        lo = at
        while lo > 0 and not lines[lo - 1].strip():
            lo -= 1
        hi = at
        while hi < len(lines) and not lines[hi].strip():
            hi += 1
        if hi == len(lines):
            drop.update(range(lo, hi))
            continue
        keep = 2 if not lines[hi][:1].isspace() else 1
        if lo == 0 or lines[lo - 1].rstrip().endswith(":"):
            keep = 0
        drop.update(range(lo + keep, hi))
    return [line for i, line in enumerate(lines) if i not in drop]


# ---- passes ------------------------------------------------------------------------------------------------------
_PREPARED: dict[str, Any] = {}


def _prepare(source: str):
    """The tree, its static analysis and its text, for a source that may be folded (None otherwise); the last one
    made is kept, since the passes that change nothing see the same source again."""
    if source not in _PREPARED:
        _PREPARED.clear()
        _PREPARED[source] = _analyse(source)
    return _PREPARED[source]


def _analyse(source: str):
    tree = ast.parse(source)
    knobs = _knobs(tree)
    static = _Static(tree, knobs) if knobs is not None else None
    if static is None or static.mutated:
        return None
    return tree, static, _Text(source)


def _fold_statements(source: str) -> str | None:
    """One pass: every ``if`` / ``elif`` whose test is static, at any depth (nested edits compose: deletions win,
    dedents add up)."""
    ready = _prepare(source)
    if ready is None:
        return None
    tree, static, text = ready
    edits = _Edits(text)

    def block(stmts: list, fn) -> None:
        gone = []
        for i, stmt in enumerate(stmts):
            gone.append(statement(stmt, fn))
            if isinstance(stmt, (ast.Return, ast.Raise, ast.Break, ast.Continue)) and i + 1 < len(stmts):
                edits.delete(stmts[i + 1].lineno, stmts[-1].end_lineno)  # never reached
                break
        if gone and all(gone):  # the block would be empty: its last statement becomes ``pass``
            last = stmts[-1]
            edits.deleted.discard(last.lineno)
            edits.replaced[last.lineno] = text.indent(last.lineno) + "pass\n"

    def statement(stmt: ast.stmt, fn) -> bool:
        """Fold what is static in one statement; whether nothing of it is left."""
        if _is_guard(stmt):
            return False
        if isinstance(stmt, ast.If) and not _single_line(stmt):
            kind, value = static.test(stmt.test, fn, text)
            if kind == "static":
                gone = _fold_if(stmt, value, edits, text)
                if value:
                    block(stmt.body, fn)
                elif stmt.orelse and not _is_elif(stmt, text):
                    block(stmt.orelse, fn)
                return gone
            block(stmt.body, fn)
            node = stmt
            while _is_elif(node, text):
                elif_node = node.orelse[0]
                kind, value = static.test(elif_node.test, fn, text) if not _single_line(elif_node) else ("keep", None)
                if kind == "static" and value:  # the chain's else from here on
                    _elif_to_else(elif_node, edits, text)
                    block(elif_node.body, fn)
                    return False
                if kind == "static":  # this elif goes; the next one (or the else) follows the previous body
                    else_line = _else_line(elif_node, text)
                    edits.delete(elif_node.lineno, (else_line - 1) if else_line else elif_node.end_lineno)
                else:
                    block(elif_node.body, fn)
                node = elif_node
            if node.orelse:
                block(node.orelse, fn)
            return False
        scope = stmt if isinstance(stmt, _FUNCS) else (None if isinstance(stmt, ast.ClassDef) else fn)
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                block(inner, scope)
        for handler in getattr(stmt, "handlers", []) or []:
            block(handler.body, scope)
        return False

    block(tree.body, None)
    return edits.apply()


def _is_guard(node: ast.stmt) -> bool:
    """``if <test>: raise ...`` with no else: a check of the knobs (or the inputs) that stays as written."""
    return isinstance(node, ast.If) and not node.orelse and len(node.body) == 1 and isinstance(node.body[0], ast.Raise)


def _single_line(node: ast.If) -> bool:
    return node.body[0].lineno == node.lineno


def _is_elif(node: ast.If, text: _Text) -> bool:
    orelse = node.orelse
    return (len(orelse) == 1 and isinstance(orelse[0], ast.If)
            and text.lines[orelse[0].lineno - 1].lstrip().startswith("elif"))


def _else_line(node: ast.If, text: _Text) -> int | None:
    if not node.orelse:
        return None
    col = len(text.indent(node.lineno))
    return text.keyword_line(node.body[-1].end_lineno + 1, node.orelse[0].lineno, col, ("else", "elif"))


def _fold_if(node: ast.If, value: bool, edits: _Edits, text: _Text) -> bool:
    """Keep the branch a static test takes; returns whether nothing of the statement is left."""
    header_end = text.header_end(node.test)
    else_line = _else_line(node, text)
    body_last = (else_line - 1) if else_line else node.end_lineno
    depth = len(text.indent(node.lineno))
    if value:
        edits.delete(node.lineno, header_end)
        edits.shift(header_end + 1, body_last, len(text.indent(node.body[0].lineno)) - depth)
        if else_line:
            edits.delete(else_line, node.end_lineno)
        return False
    edits.delete(node.lineno, body_last)
    if not else_line:
        return True
    if _is_elif(node, text):  # the first elif becomes the chain's if (folded in the next pass if static)
        line = text.lines[else_line - 1]
        edits.replaced[else_line] = line[:depth] + "if" + line[depth + 4:]
        return False
    edits.delete(else_line, else_line)
    edits.shift(else_line + 1, node.end_lineno, len(text.indent(node.orelse[0].lineno)) - depth)
    return False


def _elif_to_else(node: ast.If, edits: _Edits, text: _Text) -> None:
    """An elif whose test is always true: its header becomes ``else:``, and what follows its body goes."""
    edits.replaced[node.lineno] = text.indent(node.lineno) + "else:\n"
    edits.delete(node.lineno + 1, text.header_end(node.test))
    else_line = _else_line(node, text)
    if else_line:
        edits.delete(else_line, node.end_lineno)


def _fold_expressions(source: str) -> str | None:
    """One pass: tests left with static operands, and conditional expressions whose test is static."""
    ready = _prepare(source)
    if ready is None:
        return None
    tree, static, text = ready
    spans: list[tuple[int, int, str]] = []

    def visit(node: ast.AST, fn) -> None:
        for child in _children(node):
            scope = child if isinstance(child, _FUNCS) else fn
            if isinstance(child, ast.If) and not _is_guard(child):
                kind, rewritten = static.test(child.test, fn, text)
                if kind == "rewrite":
                    new = f"({rewritten})" if "\n" in rewritten else rewritten
                    spans.append((*text.span(child.test), new))
                    for stmt in [*child.body, *child.orelse]:
                        visit_stmt(stmt, fn)
                    continue
            if isinstance(child, ast.IfExp):
                kind, test = static.test(child.test, fn, text)
                if kind == "static":
                    branch = child.body if test else child.orelse
                    seg = text.segment(branch)
                    start, end = text.span(child)
                    if isinstance(branch, (ast.Lambda, ast.NamedExpr)):
                        seg = f"({seg})"
                    elif isinstance(branch, (ast.Constant, ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
                        if source[start - 1:start] == "(" and source[end:end + 1] == ")":  # (x if c else y) -> x
                            start, end = start - 1, end + 1
                    spans.append((start, end, seg))
                    continue
                if kind == "rewrite":
                    spans.append((*text.span(child.test), f"({test})" if "\n" in test else test))
                    visit(ast.Module(body=[ast.Expr(child.body), ast.Expr(child.orelse)], type_ignores=[]), fn)
                    continue
            visit(child, scope)

    def visit_stmt(stmt: ast.AST, fn) -> None:
        visit(ast.Module(body=[stmt], type_ignores=[]), stmt if isinstance(stmt, _FUNCS) else fn)

    visit(tree, None)
    if not spans:
        return None
    out = source
    for start, end, new in sorted(spans, reverse=True):
        out = out[:start] + new + out[end:]
    return out


def _drop_dead_locals(source: str) -> str | None:
    """Locals assigned a static value (or KNOBS) at their function's top level and never read."""
    ready = _prepare(source)
    if ready is None:
        return None
    tree, static, text = ready
    edits = _Edits(text)
    for fn in static.funcs:
        loads = {n.id for n in _walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        dead = []
        for stmt in fn.body:
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                    and stmt.targets[0].id not in loads and static.binds[id(fn)].get(stmt.targets[0].id) == 1
                    and (static.value(stmt.value, fn) is not _DYN or static._is_knobs(stmt.value, fn))):
                dead.append(stmt)
        if dead and len(dead) < len(fn.body):
            for stmt in dead:
                edits.delete(stmt.lineno, stmt.end_lineno)
    return edits.apply()


# ---- pruning -----------------------------------------------------------------------------------------------------
def _names(node: ast.AST) -> set[str]:
    """Names a statement reads (an augmented assignment or a ``del`` reads its target too)."""
    return {n.id for n in _walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)} | {
        n.target.id for n in _walk(node) if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)}


def _prune(source: str, roots: tuple[str, ...]) -> str | None:
    """Drop what the roots do not reach; None when nothing goes."""
    tree = ast.parse(source)
    defines: dict[int, set[str]] = {}
    for i, node in enumerate(tree.body):
        if isinstance(node, (*_FUNCS, ast.ClassDef)):
            defines[i] = {node.name}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and all(
                isinstance(n, (ast.Name, ast.Tuple)) for n in (node.targets if isinstance(node, ast.Assign) else [node.target])):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defines[i] = {n.id for t in targets for n in _walk(t) if isinstance(n, ast.Name)}
    if not any("kernel" in names for names in defines.values()):
        return None
    imports = {i for i, node in enumerate(tree.body) if isinstance(node, (ast.Import, ast.ImportFrom))}
    docstring = 0 if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.Constant) else None
    kept = {i for i in range(len(tree.body)) if i not in defines and i not in imports and i != docstring}
    kept |= {i for i, names in defines.items() if names & set(roots)}
    reads = [_names(node) for node in tree.body]
    used: set[str] = set()
    grew = True
    while grew:
        used = set().union(*(reads[i] for i in kept)) if kept else set()
        more = {i for i, names in defines.items() if names & used} - kept
        grew = bool(more)
        kept |= more
    text = _Text(source)
    edits = _Edits(text)
    for i, node in enumerate(tree.body):
        if i in defines and i not in kept:
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
            while first > 1 and text.lines[first - 2].startswith("#"):
                first -= 1
            edits.delete(first, node.end_lineno)
        elif i in imports:
            _prune_import(node, used, edits, text)
    return edits.apply()


def _prune_import(node: ast.AST, used: set[str], edits: _Edits, text: _Text) -> None:
    if isinstance(node, ast.ImportFrom) and node.module == "__future__":
        return
    names = [a for a in node.names if (a.asname or a.name).split(".")[0] in used]
    if len(names) == len(node.names):
        return
    edits.delete(node.lineno, node.end_lineno)
    if names:
        edits.deleted.discard(node.lineno)
        edits.replaced[node.lineno] = _import_text(node, names)


def _import_text(node: ast.AST, names: list[ast.alias], width: int = 120) -> str:
    parts = [a.name + (f" as {a.asname}" if a.asname else "") for a in names]
    if isinstance(node, ast.Import):
        return f"import {', '.join(parts)}\n"
    head = f"from {'.' * node.level}{node.module or ''} import "
    line = head + ", ".join(parts)
    if len(line) <= width:
        return line + "\n"
    return head + "(\n" + "".join(f"    {p},\n" for p in parts) + ")\n"
