"""Static policy: what a candidate file may contain, decided from its AST before anything runs.

Cheap and explicit, so the reason names the line. It is only the first gate: names can be
computed at run time, which is why the child also watches what actually runs (checks.py).

Rules (each violation is one reason, "line N: ..."):
- imports only from ALLOWED_IMPORTS; kernel libraries, the project's own code and process or
  loader machinery are refused by name, with a reason saying why;
- host code (outside ``@triton.jit`` functions) calls no torch math: the names in
  TORCH_COMPUTE are refused on anything but ``math`` and ``triton``/``triton.language``, and
  so is the ``@`` operator;
- no dynamic code or reflection: eval/exec/compile/open/__import__/globals/vars/setattr,
  ``getattr`` with a computed name, dunder attributes (also as strings), private torch attributes,
  class patterns in ``match`` (they read attributes by name), attribute or index fields in
  ``str.format`` templates, classes made by ``type(name, bases, dict)``;
- the file is UTF-8: an encoding declaration naming anything else is refused (Python would run text
  other than the text checked here);
- no patching: nothing may be assigned to or deleted from an imported module's attributes;
- no streams, CUDA graphs or torch.compile: work must run on the caller's stream, as Triton;
- at least one ``@triton.jit`` function and a module-level ``kernel`` function.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import enum
import functools
import inspect
import re
import string
import threading
import types
import typing
from dataclasses import dataclass, field

import torch

ALLOWED_IMPORTS = frozenset({
    "__future__", "math", "typing", "functools", "dataclasses", "itertools", "enum",
    "torch", "triton", "triton.language",
    "triton.tools.tensor_descriptor",  # Triton's host-side TMA descriptor (a dataclass; no kernels)
    # Gluon, Triton's own lower-level dialect (explicit layouts, shared memory, wgmma, TMA, mbarriers)
    "triton.experimental.gluon", "triton.experimental.gluon.language", "triton.experimental.gluon.language.nvidia.hopper",
    "triton.experimental.gluon.nvidia.hopper",
})
# Submodules of an allowed package that are refused anyway (runtime internals, torch-based tools).
REFUSED_SUBMODULES = ("triton.runtime", "triton.compiler", "triton.testing", "triton.tools", "triton.backends",
                      "triton.knobs", "torch.utils", "torch.nn", "torch.linalg", "torch.fft", "torch.ops",
                      "torch.library", "torch.compiler", "torch._")

KERNEL_LIBRARIES = frozenset({
    "fla", "flash_linear_attention", "flash_attn", "flash_attn_interface", "flashinfer", "xformers",
    "flash_mla", "deep_gemm", "cutlass", "cuda", "tilelang", "thunderkittens", "apex", "transformer_engine",
    "liger_kernel", "sgl_kernel", "vllm", "flashattn", "cupy", "numba", "jax", "tensorflow", "tvm",
})
PROJECT_MODULES = frozenset({"pytest_kopt", "kernels", "tests", "benchmarks", "tools"})
MACHINERY = frozenset({
    "importlib", "ctypes", "cffi", "subprocess", "os", "sys", "socket", "multiprocessing", "threading",
    "concurrent", "asyncio", "shutil", "pathlib", "pickle", "marshal", "builtins", "gc", "inspect", "signal",
    "runpy", "code", "codeop", "types", "urllib", "http", "requests", "io", "tempfile", "mmap", "resource",
    "faulthandler", "atexit", "weakref", "numpy", "scipy", "pytest", "hypothesis", "time",
})

# Math a candidate must do in Triton. Refused as attribute names on anything except math/triton.
TORCH_COMPUTE = frozenset({
    "matmul", "mm", "bmm", "baddbmm", "addmm", "addbmm", "addmv", "addr", "mv", "einsum", "tensordot", "inner",
    "outer", "dot", "vdot", "kron", "chain_matmul", "linear", "bilinear", "softmax", "log_softmax", "softmin",
    "scaled_dot_product_attention", "multi_head_attention_forward", "cumsum", "cumprod", "cummax", "cummin",
    "logcumsumexp", "logsumexp", "exp", "exp2", "expm1", "log", "log2", "log1p", "sigmoid", "logsigmoid", "tanh",
    "relu", "silu", "gelu", "softplus", "norm", "normalize", "rms_norm", "layer_norm", "group_norm", "sum",
    "nansum", "mean", "prod", "var", "std", "amax", "amin", "sqrt", "rsqrt", "reciprocal", "pow", "square",
    "mul", "mul_", "div", "div_", "add", "add_", "sub", "sub_", "addcmul", "addcdiv", "lerp", "where",
    "triu", "tril", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "baddbmm_",
    "scatter", "scatter_add", "index_add", "gather", "segment_reduce", "sort", "topk", "cross", "diff",
    "fft", "linalg", "special", "nn", "functional", "numpy", "from_numpy", "tolist",
})
# Escape hatches around the judge: other compilers and loaders, streams and graphs (work the
# caller's stream would not wait for), launch hooks, reflection helpers that take names as strings.
RUNTIME_HOOKS = frozenset({
    "compile", "jit", "ops", "library", "load_inline", "cpp_extension", "load", "save", "hub", "package",
    "distributed", "multiprocessing", "profiler", "autograd", "Stream", "stream", "set_stream", "ExternalStream",
    "CUDAGraph", "graph", "graphs", "record_stream", "wait_stream", "knobs", "runtime", "add_pre_run_hook",
    "pre_run_hooks", "launch_enter_hook", "launch_exit_hook", "attrgetter", "methodcaller", "testing",
    # they evaluate strings as code: annotations turned into forward references (a string bound to a name and used as
    # an annotation is no literal the policy can read)
    "get_type_hints", "ForwardRef", "singledispatch", "singledispatchmethod", "register",
    # they read and store attributes named by data (``update_wrapper(dst, src, assigned=("_C",))`` is getattr and
    # setattr with a computed name), or make classes whose methods are named by data (``namespace={"__d" + "el__": f}``)
    "update_wrapper", "wraps", "make_dataclass",
    # frame and code objects reach the judge's own variables
    "f_back", "f_locals", "f_globals", "f_builtins", "f_code", "tb_frame", "tb_next", "gi_frame", "gi_code",
    "cr_frame", "cr_code", "ag_frame", "co_code", "co_consts",
})
# Allowed modules re-export the rest of Python (torch.sys, typing.sys, dataclasses.inspect,
# dataclasses.builtins, triton.compiler.compiler.time, typing.operator): an attribute with one of
# these names is refused on anything, so the chain stops at its first link.
MACHINERY_ATTRIBUTES = MACHINERY | frozenset({
    "modules", "operator", "compiler", "traceback", "linecache", "warnings", "posix", "nt", "_os", "_sys", "spec",
    "loader", "_bootstrap", "__loader__", "__spec__", "utils", "jit_functions",
})

REFUSED_BUILTINS = frozenset({
    "__import__", "eval", "exec", "compile", "open", "globals", "locals", "vars", "setattr", "delattr",
    "breakpoint", "input", "exit", "quit", "__builtins__", "help", "memoryview",
})
REFUSED_METHODS = frozenset({"__torch_function__", "__torch_dispatch__", "__del__", "__getattr__", "__getattribute__"})
ALLOWED_DUNDERS = frozenset({"__name__", "__doc__", "__init__", "__post_init__", "__class_getitem__"})
NEUTRAL_BASES = ("math", "triton", "triton.language")  # compute names are fine on these
# ways around the runner's fence (fence.py) to torch's methods or a tensor's data: Tensor's C base class (through
# ``mro``; ``super`` with arguments is refused too), per-element Python callbacks, the raw storage
FENCE_ESCAPES = frozenset({"mro", "map_", "map2_", "apply_", "storage", "untyped_storage", "typed_storage"})
KERNEL_MODULES = ("triton", "math")  # all a @triton.jit body may name of the file's imports
# torch's submodules re-export its functions as they were before the runner's fence (torch.distributions reaches
# torch.nn.functional): a candidate may use torch.cuda alone
TORCH_SUBMODULES = frozenset(name for name in dir(torch) if not name.startswith("_")
                             and isinstance(getattr(torch, name, None), types.ModuleType))
ALLOWED_TORCH_SUBMODULES = frozenset({"cuda"})
# modules an attribute chain may pass through, whatever it is called on the way (enum.bltns is builtins,
# triton.language.extra.pkgutil is pkgutil, torch.cuda.torch.sparse is torch.sparse): the allowed imports, the
# packages above them, Triton's and Gluon's language packages and torch.cuda
CHAIN_MODULE_PREFIXES = ("triton.language", "triton.experimental.gluon")
TENSOR_METHODS = frozenset(name for name in dir(torch.Tensor) if callable(getattr(torch.Tensor, name, None)))
# PEP 263: an encoding declaration in the first two lines decides how Python decodes the file
CODING = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")
UTF8_NAMES = frozenset({"utf-8", "utf8", "utf_8", "u8", "utf-8-sig", "utf_8_sig"})
DUNDER = re.compile(r"^__\w+__$")


@dataclass
class PolicyReport:
    """The verdict of the static policy: ok when there is nothing in ``reasons``."""

    reasons: list[str] = field(default_factory=list)
    jit_functions: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.reasons


def _root(module: str) -> str:
    return module.split(".")[0]


def _is_neutral(module: str | None) -> bool:
    return module is not None and any(module == b or module.startswith(b + ".") for b in NEUTRAL_BASES)


def _refused_submodule(module: str) -> bool:
    if any(module == ok or module.startswith(ok + ".") for ok in ALLOWED_IMPORTS if "." in ok):
        return False
    return any(module == refused or module.startswith(refused if refused.endswith("_") else refused + ".")
               for refused in REFUSED_SUBMODULES)


def _import_reason(module: str) -> str | None:
    root = _root(module)
    if root in KERNEL_LIBRARIES:
        return f"imports {module}: third-party kernel libraries are not allowed (the kernel must be yours, in Triton)"
    if root in PROJECT_MODULES:
        return f"imports {module}: the project's own references and harness are off limits to a candidate"
    if root in MACHINERY:
        return f"imports {module}: process, loader and reflection machinery is not allowed"
    if _refused_submodule(module):
        return f"imports {module}: only torch (allocation and views) and triton/triton.language are allowed"
    if module in ALLOWED_IMPORTS or (root == "triton" and module.startswith("triton.language.")):
        return None
    return f"imports {module}: not in the allow-list ({', '.join(sorted(ALLOWED_IMPORTS - {'__future__'}))})"


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _is_jit_decorator(node: ast.AST, aliases: dict[str, str]) -> bool:
    if isinstance(node, ast.Call):
        node = node.func
    dotted = _dotted(node)
    if dotted is None:
        return False
    head, _, rest = dotted.partition(".")
    full = aliases.get(head, head) + ("." + rest if rest else "")
    return full in ("triton.jit", "triton.runtime.jit.jit", "triton.experimental.gluon.jit")


def _is_triton_decorated(node: ast.AST, aliases: dict[str, str]) -> bool:
    """autotune/heuristics wrap a jit function; count the function as jit when one is present."""
    return any(_is_jit_decorator(d, aliases) for d in getattr(node, "decorator_list", ()))


class _Checker(ast.NodeVisitor):
    def __init__(self) -> None:
        self.report = PolicyReport()
        self.aliases: dict[str, str] = {}  # local name -> module it names (import torch as th -> th: torch)
        self.jit_depth = 0
        self.has_kernel = False
        self.checked_calls: set[int] = set()  # getattr/hasattr names seen as direct calls
        self.derived: set[str] = set()  # names bound to something reached from an import (T = torch.Tensor)
        self.annotation_depth = 0  # inside an annotation, where a string is code
        self.chain_heads: set[int] = set()  # nodes that are the object of an attribute (``x`` in ``x.y``)
        self.enum_classes: set[str] = set()  # the file's classes derived from an Enum (their call can make a class)
        self.scopes: list[set[str]] = []  # the names each enclosing function (or comprehension) binds for itself
        self.fields_read: set[int] = set()  # comprehension clauses whose fields were read by their scope's visitor
        self.class_depth = 0

    def visit_Module(self, node: ast.Module) -> None:
        self.mark_chain_heads(node)
        self.generic_visit(node)

    def mark_chain_heads(self, tree: ast.AST) -> None:
        """Remember which nodes an attribute is read from: a module may be named there and nowhere else."""
        self.chain_heads.update(id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute))

    def refuse(self, node: ast.AST, text: str) -> None:
        self.report.reasons.append(f"line {getattr(node, 'lineno', '?')}: {text}")

    # ---- imports --------------------------------------------------------------------
    def _refuse_nested_import(self, node: ast.AST) -> None:
        """Imports belong at the file's top level: one inside a function or a class binds a module in a scope whose
        names the module-as-value rule takes for the function's own (the eighth red team's ``import enum as E; M = E``
        inside a function)."""
        if self.scopes or self.class_depth:
            self.refuse(node, "imports are allowed at the top level of the file only, not inside a function or a class")

    def _refuse_dunder_alias(self, node: ast.AST, names: list[ast.alias]) -> None:
        for alias in names:
            bound = alias.asname or alias.name.split(".")[0]
            if DUNDER.match(bound) or bound == "kernel":
                self.refuse(node, f"importing as {bound} is not allowed: it binds a special name")

    def visit_Import(self, node: ast.Import) -> None:
        self._refuse_nested_import(node)
        self._refuse_dunder_alias(node, node.names)
        for alias in node.names:
            reason = _import_reason(alias.name)
            if reason:
                self.refuse(node, reason)
            local = alias.asname or _root(alias.name)
            self.aliases[local] = alias.name if alias.asname else _root(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self._refuse_nested_import(node)
        self._refuse_dunder_alias(node, node.names)
        if node.level:
            self.refuse(node, "relative imports are not allowed: a candidate is one self-contained file")
            return
        module = node.module or ""
        reason = _import_reason(module)
        # ``from triton.experimental import gluon`` imports the allowed submodule, not its parent's names
        if reason and node.names and all(f"{module}.{alias.name}" in ALLOWED_IMPORTS for alias in node.names):
            reason = None
        for alias in node.names:
            if reason is None and alias.name != "*":
                neutral = _is_neutral(module)
                if _refused_submodule(f"{module}.{alias.name}"):
                    reason = _import_reason(f"{module}.{alias.name}")
                elif alias.name in TORCH_COMPUTE and not neutral:
                    reason = f"imports {alias.name} from {module}: torch math is not allowed, do it in Triton"
                elif alias.name in RUNTIME_HOOKS and not (neutral and alias.name == "jit"):
                    reason = f"imports {alias.name} from {module}: other compilers, loaders, streams and hooks are not allowed"
                elif alias.name in REFUSED_BUILTINS or alias.name.startswith("_"):
                    reason = f"imports {alias.name}: dynamic code, reflection and private names are not allowed"
                elif alias.name in MACHINERY_ATTRIBUTES and alias.name != "jit":
                    reason = (f"imports {alias.name} from {module}: modules re-exported by allowed ones (sys, os, inspect, ...) "
                              "are machinery too")
                elif module == "torch" and alias.name in TORCH_SUBMODULES and alias.name not in ALLOWED_TORCH_SUBMODULES:
                    reason = (f"imports {alias.name} from torch: torch's submodules other than torch.cuda are not allowed (they "
                              "re-export torch's functions)")
            if alias.name == "*":
                reason = reason or f"from {module} import *: import names explicitly"
            self.aliases[alias.asname or alias.name] = f"{module}.{alias.name}"
        if reason:
            self.refuse(node, reason)

    # ---- functions ------------------------------------------------------------------
    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node.name in REFUSED_METHODS:
            self.refuse(node, f"defining {node.name} is not allowed: a tensor subclass could answer the judge's checks with anything")
        is_jit = _is_triton_decorated(node, self.aliases)
        if is_jit:
            self.report.jit_functions.append(node.name)
        if node.name == "kernel" and self.jit_depth == 0 and node.col_offset == 0:
            self.has_kernel = True
        # every field but the body as written outside the kernel (decorators, arguments, the return annotation, type
        # parameters), then the body: a field left out is code the policy never reads (``def f() -> exec(...)``)
        for field, value in ast.iter_fields(node):
            if field == "body":
                continue
            if field == "returns" and value is not None:
                self._visit_annotation(value)
            else:
                for child in value if isinstance(value, list) else [value]:
                    if isinstance(child, ast.AST):
                        self.visit(child)
        self.jit_depth += is_jit
        self.scopes.append(_local_names(node))
        for stmt in node.body:
            self.visit(stmt)
        self.scopes.pop()
        self.jit_depth -= is_jit

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.visit(node.args)  # its defaults run in the enclosing scope
        self.scopes.append(_local_names(node))
        self.visit(node.body)
        self.scopes.pop()

    def _visit_comprehension_scope(self, node: ast.AST) -> None:
        """A comprehension is a scope of its own for its targets; its first iterable runs in the enclosing one."""
        generators = node.generators  # type: ignore[attr-defined]
        self.visit(generators[0].iter)
        self.scopes.append({name for g in generators for name in _bound_names(g.target)})
        for i, g in enumerate(generators):
            self.visit(g.target)
            if i:
                self.visit(g.iter)
            for condition in g.ifs:
                self.visit(condition)
            self.fields_read.add(id(g))
            self.visit(g)
        for field in ("elt", "key", "value"):
            if getattr(node, field, None) is not None:
                self.visit(getattr(node, field))
        self.scopes.pop()

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _visit_comprehension_scope

    def visit_arg(self, node: ast.arg) -> None:
        if node.annotation is not None:
            self._visit_annotation(node.annotation)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.visit(node.target)
        self._visit_annotation(node.annotation)
        if node.value is not None:
            self.visit(node.value)

    def _visit_annotation(self, node: ast.AST) -> None:
        """An annotation is code, and so is a string in it: typing turns the string into a forward reference that
        ``get_type_hints`` evaluates in the file's globals (``def f(a: "exec(...)")``)."""
        self.annotation_depth += 1
        self.visit(node)
        self.annotation_depth -= 1

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._refuse_suspended(node, f"async def {node.name}")
        self.visit_FunctionDef(node)  # type: ignore[arg-type]

    # ---- names and attributes --------------------------------------------------------
    def visit_Name(self, node: ast.Name) -> None:
        imported = node.id in self.aliases and _root(self.aliases[node.id]) not in KERNEL_MODULES
        if self.jit_depth and (imported or node.id in self.derived):
            # a jit body is host Python too (``fn.fn``, the interpreter): nothing but Triton and math in it
            self.refuse(node, f"{node.id} inside a @triton.jit kernel: only triton and math may be named there")
        elif node.id in REFUSED_BUILTINS:
            self.refuse(node, f"{node.id} is not allowed: no dynamic code, files or reflection")
        elif node.id in ("getattr", "hasattr") and id(node) not in self.checked_calls:
            self.refuse(node, f"{node.id} may only be called directly, with the attribute name written out")
        elif not isinstance(node.ctx, ast.Load) and DUNDER.match(node.id) and node.id not in ALLOWED_DUNDERS:
            # ``__del__ = f`` in a class body is ``def __del__``; ``__getattr__ = f`` at the top level answers the
            # runner's look-up of a name the file deleted (the ninth red team's finalizer and module hook)
            self.refuse(node, f"binding {node.id} is not allowed: special methods and module hooks are internals")
        elif not isinstance(node.ctx, ast.Load) and node.id == "kernel" and not self.scopes and not self.class_depth:
            self.refuse(node, "kernel may only be defined once, by def at the top level (rebound or deleted, the runner "
                              "would look it up through whatever answers for the module)")
        elif (isinstance(node.ctx, ast.Load) and node.id in self.aliases and id(node) not in self.chain_heads
              and not any(node.id in scope for scope in self.scopes)
              and isinstance(self._imported_object(node), types.ModuleType)):
            self.refuse(node, self._module_as_value(node.id))
        self.generic_visit(node)

    def _imported_object(self, node: ast.AST) -> object:
        """The object a name or attribute chain rooted at an import is, followed on the real objects; ``_UNRESOLVED``
        where it is not rooted at an import or does not resolve all the way."""
        dotted = _dotted(node)
        head = dotted.split(".")[0] if dotted else None
        if head not in self.aliases:
            return _UNRESOLVED
        path = self.aliases[head].split(".") + dotted.split(".")[1:]
        seen = _resolve(tuple(path))
        return seen[-1][1] if seen and seen[-1][0] == len(path) else _UNRESOLVED

    @staticmethod
    def _module_as_value(label: str) -> str:
        return (f"the module {label} is used as a value: a module may only be named to read an attribute of it "
                f"({label}.name); bound to another name, passed or stored, the policy cannot follow where it leads "
                "(E = enum; E.bltns.exec is exec)")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if not isinstance(node.ctx, ast.Load):  # every store and delete: assignments, for and with targets, ...
            self._check_target(node)
        name = node.attr
        base = _dotted(node.value)
        full_base = None
        if base is not None:
            head, _, rest = base.partition(".")
            full_base = self.aliases.get(head, head) + ("." + rest if rest else "")
        before = len(self.report.reasons)
        if name.startswith("__") and name.endswith("__") and name not in ALLOWED_DUNDERS:
            self.refuse(node, f"attribute {name} is not allowed: no reflection on internals")
        elif name in MACHINERY_ATTRIBUTES and name != "jit":
            self.refuse(node, f"attribute {name} is not allowed: modules re-exported by allowed ones (sys, os, inspect, ...) are machinery too")
        elif name in FENCE_ESCAPES:
            self.refuse(node, f"attribute {name} is not allowed: it reaches torch's methods or a tensor's data around the judge's fence")
        elif name.startswith("_") and name not in ALLOWED_DUNDERS and self._private_refused(base, full_base):
            self.refuse(node, f"{full_base or ast.unparse(node.value)}.{name}: private internals are not allowed")
        elif self.jit_depth == 0:
            label = f"{base}.{name}" if base else name
            neutral = _is_neutral(full_base)
            if name in TORCH_COMPUTE and not neutral:
                self.refuse(node, f"{label}: torch math is not allowed in host code; do the math in a @triton.jit kernel")
            elif name in RUNTIME_HOOKS and not (neutral and name == "jit"):
                self.refuse(node, f"{label}: other compilers, loaders, streams, graphs and launch hooks are not allowed")
        if len(self.report.reasons) == before:  # what no name above caught: where the chain really leads
            reached = self._chain_reaches(node)
            if reached:
                self.refuse(node, reached)
        if (len(self.report.reasons) == before and isinstance(node.ctx, ast.Load) and id(node) not in self.chain_heads
                and isinstance(self._imported_object(node), types.ModuleType)):
            self.refuse(node, self._module_as_value(_dotted(node)))
        if len(self.report.reasons) == before or not isinstance(node.value, (ast.Attribute, ast.Name)):
            self.generic_visit(node)  # after a refusal, the rest of a.b.c would only repeat it

    def _chain_reaches(self, node: ast.Attribute) -> str | None:
        """What an attribute chain rooted at an import resolves to, where that is refused whatever its name: a module
        outside the allowed ones, or one of the refused builtins (exec, open, getattr, ...). The chain is followed on
        the real objects, in this (trusted) process: a deny-list of names missed ``enum.bltns.exec`` and
        ``triton.language.extra.pkgutil.resolve_name``."""
        dotted = _dotted(node)
        head = dotted.split(".")[0] if dotted else None
        if head is None or head not in self.aliases:
            return None
        module_parts, attributes = self.aliases[head].split("."), dotted.split(".")[1:]
        for depth, value in _resolve(tuple(module_parts + attributes)):
            label = ".".join([head, *attributes[:max(0, depth - len(module_parts))]])
            if isinstance(value, types.ModuleType) and not _allowed_module(value.__name__):
                return f"{label} is the module {value.__name__}, which a candidate may not use (allowed: torch, torch.cuda, triton, math, ...)"
            if any(value is builtin for builtin in _REFUSED_BUILTIN_OBJECTS):
                return f"{label} is the builtin {getattr(value, '__name__', value)}: no dynamic code, files or reflection"
        return None

    def _private_refused(self, base: str | None, full_base: str | None) -> bool:
        """A private attribute is refused on an import or a name bound to one (``T = torch; T._C``), anywhere; in host
        code also on anything but ``self`` and ``cls`` (a kernel body may use Gluon's private helpers on its own
        values)."""
        root = base.split(".")[0] if base else None
        if root is not None and (root in self.derived or (full_base is not None and _root(full_base) in (
                "torch", "triton", "typing", "functools", "dataclasses", "itertools", "enum", "math"))):
            return True
        # host code: a private name of the object itself only (``self._plan``), not further down a chain
        # (``self.m._C``: whatever was stored on self, an import included)
        return self.jit_depth == 0 and base not in ("self", "cls")

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("getattr", "hasattr"):
            self.checked_calls.add(id(func))
            if len(node.args) < 2 or not (isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                self.refuse(node, f"{func.id} with a computed attribute name is not allowed (write the attribute out)")
            else:
                # the same rules as ``obj.attr`` written out (a narrower list of its own let ``getattr(T, "mro")`` by)
                attribute = ast.copy_location(ast.Attribute(value=node.args[0], attr=node.args[1].value, ctx=ast.Load()), node)
                self.chain_heads.add(id(node.args[0]))
                before = len(self.report.reasons)
                self.visit_Attribute(attribute)
                if len(self.report.reasons) > before:
                    self.refuse(node, f"{func.id}(..., {node.args[1].value!r}) is not allowed: it reads what "
                                      f"{ast.unparse(attribute)} would")
        if (isinstance(func, ast.Attribute) and func.attr == "__init__" and not _is_super_call(func.value)
                and not (node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "self")):
            # ``Hooks.__init__(x, f)`` with a dataclass stores Hooks' fields on x, where the policy sees no store (the
            # tenth red team set ``x.detach`` on an input that way)
            self.refuse(node, "calling a class's __init__ on anything but self is not allowed: it stores attributes the "
                              "policy cannot see")
        if self._makes_enum(node):
            self.refuse(node, "an Enum's functional API (Enum(name, names, ...)) is not allowed: it makes a class whose "
                              "attributes are named by data")
        self.generic_visit(node)

        if isinstance(func, ast.Name) and func.id == "super" and (node.args or node.keywords):
            self.refuse(node, "super(...) with arguments is not allowed: it reaches a class's bases (Tensor's C base class)")
        if isinstance(func, ast.Name) and func.id == "type" and len(node.args) + len(node.keywords) != 1:
            self.refuse(node, "type(name, bases, dict) is not allowed: it makes classes the checks above never see")
        if isinstance(func, ast.Attribute) and func.attr in ("format", "format_map"):
            template = func.value.value if isinstance(func.value, ast.Constant) and isinstance(func.value.value, str) else None
            if template is None:
                self.refuse(node, f".{func.attr} of a computed template is not allowed (its fields can read attributes); use an f-string")
            elif _format_reaches(template):
                self.refuse(node, f"a format field that reads an attribute or an item ({template!r}) is not allowed; use an f-string")

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult) and self.jit_depth == 0:
            self.refuse(node, "the @ operator (torch matmul) is not allowed in host code; use tl.dot in a kernel")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.op, ast.MatMult) and self.jit_depth == 0:
            self.refuse(node, "the @= operator (torch matmul) is not allowed in host code")
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if _is_reference(node.value) and self._reaches_import(node.value):
            self.derived |= {name for target in node.targets for name in _bound_names(target)}
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        if _is_reference(node.iter) and self._reaches_import(node.iter):
            self.derived |= set(_bound_names(node.target))  # for T in (torch.Tensor,): T.x = ... is an assignment too
        self.generic_visit(node)

    visit_AsyncFor = visit_For  # type: ignore[assignment]

    def visit_comprehension(self, node: ast.comprehension) -> None:
        if _is_reference(node.iter) and self._reaches_import(node.iter):
            self.derived |= set(_bound_names(node.target))
        if id(node) not in self.fields_read:  # its fields were read in its scope's order
            self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if any(self._reaches_import(base) for base in node.bases):
            self.derived.add(node.name)
        if any(self._is_enum_class(base) for base in node.bases):
            self.enum_classes.add(node.name)
        self.class_depth += 1
        self.generic_visit(node)
        self.class_depth -= 1

    def _is_enum_class(self, node: ast.AST) -> bool:
        """Whether an expression names an Enum class: of the enum module (through an import) or of this file."""
        if isinstance(node, ast.Name) and node.id in self.enum_classes:
            return True
        found = self._imported_object(node)
        return isinstance(found, type) and issubclass(found, enum.Enum)

    def _makes_enum(self, node: ast.Call) -> bool:
        """``Enum("Name", names)``: a class made from data (``names`` may name a method ``__del__``)."""
        return self._is_enum_class(node.func) and (len(node.args) >= 2 or any(
            k.arg in ("names", "module", "qualname", "type", "start", "boundary") for k in node.keywords))

    def visit_Global(self, node: ast.Global) -> None:
        if "kernel" in node.names:
            self.refuse(node, "global kernel is not allowed: kernel is defined once, by def at the top level")

    # ---- code the interpreter runs when it chooses -------------------------------------
    def _refuse_suspended(self, node: ast.AST, what: str) -> None:
        self.refuse(node, f"{what} is not allowed: a generator or coroutine left suspended runs its cleanup (finally, "
                          "with, except) when the garbage collector finds it, at a moment the judge chooses, as its own "
                          "code (the eighth red team computed there)")

    def visit_Yield(self, node: ast.Yield) -> None:
        self._refuse_suspended(node, "yield")
        self.generic_visit(node)

    def visit_YieldFrom(self, node: ast.YieldFrom) -> None:
        self._refuse_suspended(node, "yield from")
        self.generic_visit(node)

    def visit_Await(self, node: ast.Await) -> None:
        self._refuse_suspended(node, "await")
        self.generic_visit(node)

    def _reaches_import(self, node: ast.AST) -> bool:
        """Whether an expression names an import (other than triton and math) or a name bound to one."""
        return any(isinstance(n, ast.Name) and (n.id in self.derived or (n.id in self.aliases and _root(self.aliases[n.id])
                                                                            not in KERNEL_MODULES)) for n in ast.walk(node))

    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        self.refuse(node, "class patterns in match are not allowed: they read attributes by name")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if not isinstance(node.value, str):
            return
        if DUNDER.match(node.value) and node.value not in ALLOWED_DUNDERS:
            self.refuse(node, f"the string {node.value!r} is not allowed: dunder names are internals, also as strings")
            return
        if not self.annotation_depth:
            return
        try:
            expression = ast.parse(node.value.strip(), mode="eval")
        except (SyntaxError, ValueError):
            self.refuse(node, f"the annotation {node.value[:80]!r} is not an expression: a string annotation is code")
            return
        for inner in ast.walk(expression):
            ast.copy_location(inner, node)
        self.mark_chain_heads(expression)
        before = len(self.report.reasons)
        self.visit(expression)
        if len(self.report.reasons) > before:
            self.refuse(node, f"the annotation {node.value[:80]!r} is code typing may evaluate: it is checked as code, "
                              "and that code is not allowed")

    def _check_target(self, target: ast.Attribute) -> None:
        """An attribute stored or deleted, by any statement (assignment, ``for``, ``with``, a comprehension, ``del``)."""
        # only ``name.attribute = ...`` on the file's own objects: not on an import or anything bound to one, not
        # through a chain or an item, not a dunder and not a name a tensor has (it would shadow a method the
        # harness calls on an output)
        base = target.value
        dotted = _dotted(base)
        label = f"{dotted or ast.unparse(base)}.{target.attr}"
        root = dotted.split(".")[0] if dotted else None
        if root is not None and (root in self.aliases or root in self.derived):
            self.refuse(target, f"assigning to {label}: patching modules or their classes is not allowed")
        elif not isinstance(base, ast.Name):
            self.refuse(target, f"assigning to {label}: only an attribute of a name of this file's may be assigned")
        elif target.attr.startswith("__") or target.attr in TENSOR_METHODS:
            self.refuse(target, f"assigning to {label}: {target.attr} is a tensor's or an object's own (patching is not allowed)")


def _allowed_module(name: str) -> bool:
    return (name in ALLOWED_IMPORTS or name == "torch.cuda" or name.startswith(CHAIN_MODULE_PREFIXES)
            or any(allowed.startswith(name + ".") for allowed in ALLOWED_IMPORTS))


_REFUSED_BUILTIN_OBJECTS = tuple(getattr(builtins, name) for name in sorted(REFUSED_BUILTINS | {"getattr", "hasattr"})
                                 if hasattr(builtins, name)) + (builtins,) + (
    # the allowed modules' functions that evaluate strings (annotations) as code, however they are reached
    typing.get_type_hints, typing.ForwardRef, functools.singledispatch, functools.singledispatchmethod,
    # and those that read and store attributes named by data, or make a class from data
    functools.update_wrapper, functools.wraps, dataclasses.make_dataclass)


@functools.lru_cache(maxsize=4096)
def _resolve(path: tuple[str, ...]) -> tuple[tuple[int, object], ...]:
    """The objects an import path followed by attributes passes through, as (length of the path so far, object), as far
    as it resolves; empty where its start cannot be imported."""
    import importlib

    value, start = None, 0
    for k in range(len(path), 0, -1):
        try:
            value, start = importlib.import_module(".".join(path[:k])), k
            break
        except Exception:  # noqa: BLE001 - not a module: shorter prefixes are tried
            continue
    if value is None:
        return ()
    seen = [(start, value)]
    for k in range(start, len(path)):
        try:
            value = getattr(value, path[k]) if isinstance(value, types.ModuleType) else inspect.getattr_static(value, path[k])
        except Exception:  # noqa: BLE001 - an attribute that is not there (or not yet): the chain ends
            break
        seen.append((k + 1, value))
    return tuple(seen)


_UNRESOLVED = object()  # what a chain the policy cannot follow to its end names


def _is_super_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def _is_reference(node: ast.AST) -> bool:
    """Whether an expression is a name, an attribute chain or a tuple of them: it refers to an existing object (a
    module, a class), where a call makes a new one."""
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_is_reference(e) for e in node.elts)
    return isinstance(node, ast.Name) or (isinstance(node, ast.Attribute) and _is_reference(node.value))


def _local_names(node: ast.AST) -> set[str]:
    """The names a function (or lambda) binds in its own scope, as Python decides it: its parameters and every name it
    stores, defines or catches anywhere in its body (not one it imports: that is the module, and refused there anyway), outside nested scopes (a comprehension's own targets are
    its own, but what ``:=`` binds in one is the function's), less those it declares ``global`` or ``nonlocal``."""
    arguments = node.args  # type: ignore[attr-defined]
    names = {a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)}
    names |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None}
    declared: set[str] = set()
    body = node.body if isinstance(node.body, list) else [node.body]  # type: ignore[attr-defined]
    pending = list(body)
    while pending:
        child = pending.pop()
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(child.name)
            pending.extend(child.decorator_list)  # they run here; the rest of the definition is a scope of its own
            continue
        if isinstance(child, ast.Lambda):
            continue
        if isinstance(child, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            names |= {n.target.id for n in ast.walk(child) if isinstance(n, ast.NamedExpr) and isinstance(n.target, ast.Name)}
            continue
        if isinstance(child, ast.Name) and not isinstance(child.ctx, ast.Load):
            names.add(child.id)
        elif isinstance(child, (ast.Global, ast.Nonlocal)):
            declared |= set(child.names)
        elif isinstance(child, ast.ExceptHandler) and child.name:
            names.add(child.name)
        elif isinstance(child, (ast.MatchAs, ast.MatchStar)) and child.name:
            names.add(child.name)
        elif isinstance(child, ast.MatchMapping) and child.rest:
            names.add(child.rest)
        pending.extend(ast.iter_child_nodes(child))
    return names - declared


def _bound_names(target: ast.AST) -> list[str]:
    """The names an assignment target binds (not those inside an attribute or item it assigns)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for e in target.elts for name in _bound_names(e)]
    if isinstance(target, ast.Starred):
        return _bound_names(target.value)
    return []


# CPython 3.11.7 (this project's Python) checks the AST builder's recursion depth with state shared across threads: two
# threads parsing at once can fail with "SystemError: AST constructor recursion depth mismatch" (a fresh-clone CI run,
# session 15: tests/test_judge_hostile.py evaluates from a thread pool). One parse at a time.
_PARSE_LOCK = threading.Lock()


def _format_reaches(template: str) -> bool:
    """Whether a ``str.format`` template has a field, also one nested in a format spec, that reads an attribute or an
    item (``{0.x}``, ``{a[k]}``), or is not valid (then it is not clear what format would read)."""
    try:
        parts = list(string.Formatter().parse(template))
        names = [name for _, name, _, _ in parts if name is not None]
        for _, _, spec, _ in parts:
            names += [name for _, name, _, _ in string.Formatter().parse(spec or "") if name is not None]
    except ValueError:
        return True
    return any("." in name or "[" in name for name in names)


def declared_encoding(source: str) -> str | None:
    """The encoding a PEP 263 declaration in the first two lines names, or None."""
    for line in source.encode("utf-8", "surrogatepass").splitlines()[:2]:
        match = CODING.match(line)
        if match:
            return match.group(1).decode("ascii", "replace").lower()
        if line.strip() and not line.lstrip().startswith(b"#"):
            break  # only a comment line may come before the declaration's line
    return None


def check_source(source: str, filename: str = "<candidate>") -> PolicyReport:
    """Apply the policy to a candidate's source text."""
    encoding = declared_encoding(source)
    if encoding is not None and encoding.replace("_", "-") not in UTF8_NAMES:
        return PolicyReport([f"line 1-2: the file declares the encoding {encoding!r}: a candidate is UTF-8 (Python would run "
                             "other text than the text checked)"])
    try:
        with _PARSE_LOCK:
            tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        return PolicyReport([f"line {exc.lineno}: syntax error: {exc.msg}"])
    checker = _Checker()
    checker.visit(tree)
    report = checker.report
    if not report.jit_functions:
        report.reasons.append("no @triton.jit function is defined: the math must be done in a Triton kernel in this file")
    if not checker.has_kernel:
        report.reasons.append("no module-level kernel(...) function: the judge calls kernel(...) with the reference's keywords")
    return report
