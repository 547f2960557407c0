"""Torch math and reads of float data into Python, refused to candidate code in the runner, in every call alike.

The dispatch guard (``checks.CallGuard``) sees every aten op, but only around checked calls: a guard around timed calls
would be timed too. A candidate that can tell the two apart (the guard fills fresh memory with a NaN pattern, which
a four-element probe sees) can compute with torch in timed calls and with Triton in checked ones. Another can read
its inputs' elements with ``float(t)`` and do the math in Python floats, which the guard takes for copies.

The fence is installed once in the runner, before the candidate is imported, and is the same in every call, so there
is nothing to tell apart. It replaces each Python entry point to torch math (Tensor methods and operators and
functions of the ``torch`` module, each outside an allow-list of allocation, views, copies, conversions and metadata)
with one that refuses while candidate code runs, and each way of reading a float tensor's elements into Python
(``float(t)``, ``t.item()``, its repr, ...); element callbacks (``map_``, ``apply_``) and exports (``numpy``,
``tolist``, DLPack) on any tensor; and ``torch.ops`` calls of ops the guard would not allow. Integer tensors may still
be read (a candidate checks its lengths and block table on the host). Below the Python names, every aten op outside
the allow-list gets a kernel of its own in torch's dispatcher that refuses while candidate code runs
(``_fence_dispatcher``): routes to torch that no Python name covers (Tensor's C base class) meet it there.
Candidate code is running while the runner is inside a candidate's import or call (``candidate_running``), and
always on a thread the candidate started. The allowed ops are not wrapped, so they cost nothing more. What the fence
cannot see (torch reached around the Python entry points, which the static policy refuses) the guard still sees in
checked calls.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types
from typing import Any, Callable, Iterator

import torch

from .checks import ALLOWED_OPS

# operators and the aten ops they run
OPERATOR_OPS = {
    "__add__": "add", "__radd__": "add", "__iadd__": "add_", "__sub__": "sub", "__rsub__": "rsub", "__isub__": "sub_",
    "__mul__": "mul", "__rmul__": "mul", "__imul__": "mul_", "__truediv__": "div", "__rtruediv__": "div",
    "__itruediv__": "div_", "__div__": "div", "__rdiv__": "div", "__idiv__": "div_", "__floordiv__": "floor_divide",
    "__rfloordiv__": "floor_divide", "__ifloordiv__": "floor_divide_", "__mod__": "remainder", "__rmod__": "remainder",
    "__imod__": "remainder_", "__pow__": "pow", "__rpow__": "pow", "__ipow__": "pow_", "__matmul__": "matmul",
    "__rmatmul__": "matmul", "__neg__": "neg", "__pos__": "positive", "__abs__": "abs", "__invert__": "bitwise_not",
    "__and__": "bitwise_and", "__rand__": "bitwise_and", "__iand__": "bitwise_and_", "__or__": "bitwise_or",
    "__ror__": "bitwise_or", "__ior__": "bitwise_or_", "__xor__": "bitwise_xor", "__rxor__": "bitwise_xor",
    "__ixor__": "bitwise_xor_", "__lshift__": "bitwise_left_shift", "__rlshift__": "bitwise_left_shift",
    "__ilshift__": "bitwise_left_shift_", "__rshift__": "bitwise_right_shift", "__rrshift__": "bitwise_right_shift",
    "__irshift__": "bitwise_right_shift_", "__eq__": "eq", "__ne__": "ne", "__lt__": "lt", "__le__": "le",
    "__gt__": "gt", "__ge__": "ge",
}
# ways to read a tensor's elements into Python: refused on float (and complex) tensors
ELEMENT_READS = ("__float__", "__int__", "__index__", "__bool__", "__complex__", "__format__", "__repr__", "__str__", "item")
# refused on any tensor: Python callbacks on every element, and exports of the data to other libraries
ALWAYS_REFUSED = ("map_", "map2_", "apply_", "numpy", "tolist", "__array__", "__array_wrap__", "__dlpack__")
# names that are aten ops but only describe a tensor or read no data
METADATA = frozenset({"size", "stride", "dim", "numel", "is_contiguous", "is_floating_point", "is_complex",
                      "storage_offset", "element_size", "is_same_size", "is_nonzero", "is_set_to", "is_pinned", "to",
                      "is_signed", "data_ptr", "nbytes", "itemsize", "untyped_storage", "get_device",
                      # tensors made from Python data: what Python may hold of a float tensor is refused above
                      "tensor", "as_tensor",
                      # copies to a device (``_to_copy``)
                      "cpu", "cuda"})

_harness_thread: int | None = None
_depth = 0
_candidate_file: str | None = None  # the candidate's path as its code objects name it (set before its import)
# builtins that run text as code: refused when the candidate's own code calls them (files are the confinement's: confine.py)
DYNAMIC_CODE = ("exec", "eval", "compile", "breakpoint")
_installed: dict[tuple[Any, str], Any] = {}


class FencedOp(RuntimeError):
    """Candidate code called torch math or read float data into Python."""


def candidate_is_running() -> bool:
    """Whether the caller is candidate code: the runner's thread inside ``candidate_running``, or another thread."""
    return _depth > 0 or threading.get_ident() != _harness_thread


@contextlib.contextmanager
def candidate_running() -> Iterator[None]:
    """Around the runner's import of the candidate and every call of it."""
    global _depth
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1


def watch_candidate_file(path: str) -> None:
    """Name the file whose code may not call DYNAMIC_CODE (the runner, before it imports the candidate)."""
    global _candidate_file
    _candidate_file = str(path)


def _fence_dynamic_code() -> None:
    """``exec``, ``eval``, ``compile`` and ``breakpoint``, called by the candidate's own code: refused. The
    policy refuses their names, but a route it does not follow still hands over the function (the seventh red team's
    ``E = enum; E.bltns.exec``); this refuses the call, whatever name reached it. The caller is the Python frame that
    called it (a call through a C function such as ``map`` or ``functools.partial`` has the candidate's frame as its
    caller); Triton, torch and the judge call them from their own files, which pass."""
    import builtins
    import sys

    for name in DYNAMIC_CODE:
        original = getattr(builtins, name)
        _installed[(builtins, name)] = original

        def guarded(*args: Any, _original: Callable = original, _name: str = name, **kwargs: Any) -> Any:
            if _candidate_file is not None and candidate_is_running() and sys._getframe(1).f_code.co_filename == _candidate_file:
                raise FencedOp(f"{_name}(...) called by the candidate: it runs text as code, which the judge refuses (a "
                               "candidate is the code that was checked)")
            return _original(*args, **kwargs)

        setattr(builtins, name, functools.wraps(original)(guarded))


# ops the runner itself runs inside the fence (storing a timed round's outputs), besides the guard's allowed ones
HARNESS_OPS = frozenset({"_foreach_copy_"})
DISPATCH_KEYS = ("AutogradCPU", "AutogradCUDA")
_library: Any = None  # the registrations below last as long as this object


def _fence_dispatcher() -> int:
    """Every aten op a candidate may not run, refused in torch's dispatcher, below every Python name: a kernel of its
    own at the autograd keys of the CPU and CUDA, which refuses while candidate code runs and otherwise runs the op as
    before (below autograd, which the runner never needs). Tensor's C base class, ``torch._C._VariableFunctions`` and
    every other route to an op meet it (the seventh red team reached the base class through ``getattr(T, "mro")`` and
    computed with it in timed calls, beside a kernel that did nothing). The allowed ops are the dispatch guard's
    (``checks.ALLOWED_OPS``); an op that decomposes into others (CompositeImplicitAutograd: ``einsum``, ``to``) is
    left to its parts, as the guard sees it. Allowed ops get no kernel, so they cost nothing more. How many kernels.
    Inference mode skips the autograd keys: ``_fence_inference_mode`` refuses it."""
    global _library
    import warnings

    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    library = torch.library.Library("aten", "IMPL")
    count = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel", once an op
        for qualified in torch._C._dispatch_get_all_op_names():
            if not qualified.startswith("aten::"):
                continue
            name = qualified[len("aten::"):]
            packet, _, overload = name.partition(".")
            if ({packet, packet.rstrip("_")} & (ALLOWED_OPS | HARNESS_OPS) or packet.startswith("sym_")
                    or has_kernel(qualified, "CompositeImplicitAutograd")):
                continue
            try:
                op = getattr(getattr(torch.ops.aten, packet), overload or "default")
            except (AttributeError, RuntimeError):
                continue
            for key in DISPATCH_KEYS:
                try:
                    library.impl(name, _refusing_kernel(op), key)
                    count += 1
                except RuntimeError:
                    pass
    _library = library
    return count


def _refusing_kernel(op: Any) -> Callable:
    below_autograd = torch._C._AutoDispatchBelowAutograd
    label = str(op)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        if candidate_is_running():
            raise FencedOp(f"{label} is torch math: a candidate's math runs in Triton kernels (refused in torch's dispatcher, "
                           "in every call alike)")
        with below_autograd():
            return op(*args, **kwargs)

    return kernel


def _fence_inference_mode() -> None:
    """``torch.inference_mode`` takes the autograd keys out of dispatch, and with them ``_fence_dispatcher``'s kernels:
    refused to candidate code."""
    from torch.autograd.grad_mode import inference_mode

    original = inference_mode.__enter__
    _installed[(inference_mode, "__enter__")] = original

    def enter(self: Any) -> Any:
        if candidate_is_running():
            raise FencedOp("torch.inference_mode is not allowed to a candidate: it switches off the judge's checks in "
                           "torch's dispatcher")
        return original(self)

    inference_mode.__enter__ = functools.wraps(original)(enter)


def _fence_collections() -> None:
    """The garbage collector runs finalizers (a suspended generator's ``finally``) on whatever thread allocates when it
    starts, the harness's too: everything a collection runs counts as candidate code (the eighth red team computed
    with torch in a finalizer that ran just after a checked call, outside the fence and the guard)."""
    import gc

    def during(phase: str, info: dict) -> None:
        global _depth
        _depth += 1 if phase == "start" else -1

    gc.callbacks.append(during)


def _aten_name(name: str) -> str | None:
    """The aten op a Python name runs, or None where it is none."""
    if name in OPERATOR_OPS:
        return OPERATOR_OPS[name]
    if name.startswith("_"):
        return None
    base = name[:-1] if name.endswith("_") else name
    return base if hasattr(torch.ops.aten, base) else None


# functions of the torch module a candidate may call (everything else public and callable there is fenced: math,
# but also torch.unique, torch.vmap, torch.load, torch.compile, from_numpy, ...): allocation, views, joins, metadata
TORCH_FUNCTIONS = frozenset({
    "arange", "as_strided", "as_tensor", "cat", "chunk", "clone", "constant_pad_nd", "detach", "empty", "empty_like",
    "empty_permuted", "empty_strided", "flatten", "full", "full_like", "get_default_device", "get_default_dtype",
    "get_device", "is_complex", "is_floating_point", "is_nonzero", "is_same_size", "is_signed", "is_storage", "is_tensor",
    "is_inference_mode_enabled", "movedim", "narrow", "numel", "ones", "ones_like", "permute", "reshape", "resolve_conj",
    "resolve_neg", "scalar_tensor", "select", "split", "split_with_sizes", "squeeze", "stack", "t", "tensor",
    "transpose", "typename", "unbind", "unflatten", "unsqueeze", "zeros", "zeros_like", "zero_",
})


# Tensor methods a candidate (and Triton's launch path, and the guard) may call: conversions and what describes a
# tensor, besides the ops of ALLOWED_OPS and METADATA
ALLOWED_TENSOR_METHODS = frozenset({
    "cpu", "cuda", "to", "type", "float", "half", "bfloat16", "double", "int", "long", "short", "char", "byte", "bool",
    "view_as", "reshape_as", "expand_as", "new_tensor", "nelement", "requires_grad_", "pin_memory", "is_shared",
    "dim_order", "untyped_storage", "is_inference", "is_leaf",
})


def fenced_names(owner: Any) -> list[str]:
    """The names of ``owner`` that run torch math. On the torch module every public function but TORCH_FUNCTIONS; on
    torch.Tensor every public method but the allowed ops, METADATA and ALLOWED_TENSOR_METHODS (Tensor.lu is Python
    that calls a private function: an allow-list, not a list of ops), and the operators of OPERATOR_OPS."""
    if owner is torch:
        return [name for name in dir(torch) if not name.startswith("_") and name not in TORCH_FUNCTIONS
                and callable(getattr(torch, name, None)) and not isinstance(getattr(torch, name), (type, types.ModuleType))]
    found = []
    for name in dir(owner):
        if name.startswith("_"):
            aten = OPERATOR_OPS.get(name)
            if aten is None or {aten, aten + "_"} & ALLOWED_OPS:
                continue  # other dunders are Python's machinery (and ELEMENT_READS, fenced for floats only)
        elif name in METADATA or name in ALLOWED_TENSOR_METHODS or name in ELEMENT_READS or {
                name, name.rstrip("_")} & ALLOWED_OPS:
            continue
        value = getattr(owner, name, None)
        if callable(value) and not isinstance(value, type):
            found.append(name)
    return found


def _refusing(owner_name: str, name: str, original: Callable, *, floats_only: bool) -> Callable:
    label = f"{owner_name}.{name}"

    @functools.wraps(original)
    def fenced(*args: Any, **kwargs: Any) -> Any:
        if candidate_is_running() and (not floats_only or _is_float(args[0] if args else None)):
            what = "reads a float tensor's elements into Python" if floats_only else "is torch math"
            raise FencedOp(f"{label} {what}: a candidate's math runs in Triton kernels (the judge refuses it in every call)")
        return original(*args, **kwargs)

    return fenced


def _is_float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())


def _fence(owner: Any, owner_name: str, name: str, *, floats_only: bool) -> None:
    original = getattr(owner, name, None)
    if original is None or (owner, name) in _installed:
        return
    _installed[(owner, name)] = original
    setattr(owner, name, _refusing(owner_name, name, original, floats_only=floats_only))


def _op_name(op: Any) -> str:
    """The aten name of an OpOverload or OpOverloadPacket (``aten::mul.Tensor`` -> ``mul``)."""
    return str(getattr(op, "_qualified_op_name", None) or getattr(op, "name", lambda: "")()).split("::")[-1].split(".")[0]


def _fence_ops() -> None:
    """``torch.ops.aten.X(...)``: refused to candidate code for every op the guard would not allow (the dispatch
    guard's own calls of allowed ops, inside a checked call, pass)."""
    from torch._ops import OpOverload, OpOverloadPacket

    for cls in (OpOverload, OpOverloadPacket):
        original = cls.__call__
        _installed[(cls, "__call__")] = original

        def call(self: Any, *args: Any, _original: Callable = original, **kwargs: Any) -> Any:
            if candidate_is_running():
                name = _op_name(self)
                if name not in ALLOWED_OPS and name.rstrip("_") not in ALLOWED_OPS:
                    raise FencedOp(f"torch.ops {name} is torch math: a candidate's math runs in Triton kernels (the judge "
                                   "refuses it in every call)")
            return _original(self, *args, **kwargs)

        cls.__call__ = call


def _basic_index(index: Any) -> bool:
    """Whether ``t[index]`` is basic indexing (a view: ints, slices of ints, None, Ellipsis); a tensor or a sequence
    in it makes it a gather or a scatter, which is torch math (a lookup table, or offset arithmetic through an
    overlapping view)."""
    parts = index if isinstance(index, tuple) else (index,)
    return all(part is None or part is Ellipsis or (isinstance(part, int) and not isinstance(part, torch.Tensor))
               or (isinstance(part, slice) and all(b is None or isinstance(b, int) for b in (part.start, part.stop, part.step)))
               for part in parts)


def _fence_indexing() -> None:
    """``t[index]`` and ``t[index] = value``: refused to candidate code unless the index is basic (the fifth red team
    timed a file that did all its math with tensor indices)."""
    for name in ("__getitem__", "__setitem__"):
        original = getattr(torch.Tensor, name)
        _installed[(torch.Tensor, name)] = original

        def indexed(self: Any, index: Any, *value: Any, _original: Callable = original, _name: str = name) -> Any:
            if candidate_is_running() and not _basic_index(index):
                raise FencedOp(f"Tensor.{_name} with a tensor or a sequence as index is torch math (a gather or a scatter): "
                               "a candidate's math runs in Triton kernels (the judge refuses it in every call)")
            return _original(self, index, *value)

        setattr(torch.Tensor, name, functools.wraps(original)(indexed))


def install() -> int:
    """Fence torch's entry points in this process (the runner, before the candidate is imported); how many. The
    calling thread is the harness's: it keeps torch outside ``candidate_running``. Tensor's C base class holds the
    same methods and cannot be changed (an immutable type): the policy refuses the ways to it (``mro``, ``super``
    with arguments, dunders), and the ops they run meet ``_fence_dispatcher``'s kernels."""
    global _harness_thread
    if _installed:
        return len(_installed)
    _harness_thread = threading.get_ident()
    for owner, owner_name in ((torch.Tensor, "Tensor"), (torch, "torch")):
        for name in fenced_names(owner):
            _fence(owner, owner_name, name, floats_only=False)
    for name in ALWAYS_REFUSED:
        _fence(torch.Tensor, "Tensor", name, floats_only=False)
    for name in ELEMENT_READS:
        _fence(torch.Tensor, "Tensor", name, floats_only=True)
    _fence_indexing()
    _fence_dynamic_code()
    _fence_inference_mode()
    _fence_collections()
    _fence_ops()
    _fence_reexports()
    return len(_installed) + _fence_dispatcher()


def _fence_reexports() -> int:
    """The same functions where other modules keep them under their own names (``torch.nn.functional.conv_tbc`` is
    the object ``torch.conv_tbc`` was, reachable through ``torch.distributions``): every module
    attribute that is a fenced original becomes its fenced form. How many were replaced."""
    import sys

    fenced = {id(original): (original, getattr(owner, name)) for (owner, name), original in _installed.items()
              if owner is torch or owner is torch.Tensor}
    replaced = 0
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict) or module is torch:
            continue
        for name, value in list(namespace.items()):
            found = fenced.get(id(value))
            if found is not None and found[0] is value:
                try:
                    setattr(module, name, found[1])
                    replaced += 1
                except (AttributeError, TypeError):
                    pass
    return replaced


# ---- audit: torch and the judge's own modules as the runner left them, before the candidate --------------------------
CLASSES = ("torch.Tensor", "OpOverload", "OpOverloadPacket")
JUDGE_MODULES = ("pytest_kopt.judge.runner", "pytest_kopt.judge.checks", "pytest_kopt.judge.fence", "pytest_kopt.judge.arena",
                 "pytest_kopt.judge.channel", "pytest_kopt.judge.timing")


def _watched() -> list[tuple[str, dict]]:
    import sys

    from torch._ops import OpOverload, OpOverloadPacket

    import builtins

    spaces = [("builtins", vars(builtins)), ("torch", vars(torch)), ("torch.Tensor", vars(torch.Tensor)), ("torch.cuda", vars(torch.cuda)),
              ("OpOverload", vars(OpOverload)), ("OpOverloadPacket", vars(OpOverloadPacket))]
    return spaces + [(name, vars(sys.modules[name])) for name in JUDGE_MODULES if name in sys.modules]


def snapshot() -> dict[tuple[str, str], int]:
    """What each watched namespace holds, by identity: builtins, torch, Tensor, torch.cuda, the op classes and the judge's
    modules in the runner (taken after ``install``, before the candidate is imported); public names and dunders
    (private ones hold state that changes by itself: ``torch.cuda._initialized``)."""
    return {(label, name): id(value) for label, space in _watched() for name, value in list(space.items())
            if not name.startswith("_") or (name.startswith("__") and name.endswith("__"))}  # private state changes


def changes(before: dict[tuple[str, str], int]) -> list[str]:
    """The watched names the candidate replaced or deleted since ``before``, and names added to a watched class (names
    added to a module are ignored: torch adds submodules as they are first used). Advisory, as every check in the candidate's process, and for what the
    policy misses: a candidate that replaces a method the harness calls runs its code as the harness."""
    now = snapshot()
    replaced = {f"{label}.{name}" for (label, name), ident in before.items() if now.get((label, name)) != ident}
    if _depth != 0 or _harness_thread != threading.get_ident() or (_installed and _library is None):
        replaced.add("pytest_kopt.judge.fence's own state (whether candidate code runs)")
    # on a class an added name shadows what its base holds (torch.Tensor.data_ptr lives on TensorBase)
    added = {f"{label}.{name}" for (label, name) in now.keys() - before.keys() if label in CLASSES}
    return sorted(replaced | added)
