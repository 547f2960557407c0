"""Torch math and reads of float data into Python, refused to candidate code in the runner, in every call alike.

The dispatch guard (``checks.CallGuard``) sees every aten op, but only around checked calls: a guard around timed calls
would be timed too. A candidate that can tell the two apart (the guard fills fresh memory with a NaN pattern, which
a four-element probe sees) computed with torch in timed calls and with Triton in checked ones, and passed (red team,
session 49). Another read its inputs' elements with ``float(t)`` and did the math in Python floats, which the guard
takes for copies.

The fence is installed once in the runner, before the candidate is imported, and is the same in every call, so there
is nothing to tell apart. It replaces each Python entry point to a torch op that ``checks.ALLOWED_OPS`` does not list
(Tensor methods and operators, functions of the ``torch`` module) with one that refuses while candidate code runs, and
each way of reading a float tensor's elements into Python (``float(t)``, ``t.item()``, ``t.tolist()``,
``t.numpy()``, ...). Integer tensors may still be read (a candidate checks its lengths and block table on the host).
Candidate code is running while the runner is inside a candidate's import or call (``candidate_running``), and
always on a thread the candidate started. The allowed ops are not wrapped, so they cost nothing more. What the fence
cannot see (torch reached around the Python entry points, which the static policy refuses) the guard still sees in
checked calls.
"""

from __future__ import annotations

import contextlib
import functools
import threading
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
ELEMENT_READS = ("__float__", "__int__", "__index__", "__bool__", "__complex__", "__format__", "__repr__", "__str__",
                 "__array__", "item", "tolist", "numpy")
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


def _aten_name(name: str) -> str | None:
    """The aten op a Python name runs, or None where it is none."""
    if name in OPERATOR_OPS:
        return OPERATOR_OPS[name]
    if name.startswith("_"):
        return None
    base = name[:-1] if name.endswith("_") else name
    return base if hasattr(torch.ops.aten, base) else None


def fenced_names(owner: Any) -> list[str]:
    """The names of ``owner`` (torch.Tensor or the torch module) that run torch math."""
    found = []
    for name in dir(owner):
        aten = _aten_name(name)
        if aten is None or name in METADATA or {name, aten, aten + "_"} & ALLOWED_OPS:
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


def install() -> int:
    """Fence torch's entry points in this process (the runner, before the candidate is imported); how many. The
    calling thread is the harness's: it keeps torch outside ``candidate_running``."""
    global _harness_thread
    if _installed:
        return len(_installed)
    _harness_thread = threading.get_ident()
    for owner, owner_name in ((torch.Tensor, "Tensor"), (torch, "torch")):
        for name in fenced_names(owner):
            original = getattr(owner, name)
            _installed[(owner, name)] = original
            setattr(owner, name, _refusing(owner_name, name, original, floats_only=False))
    for name in ELEMENT_READS:
        original = getattr(torch.Tensor, name, None)
        if original is not None and (torch.Tensor, name) not in _installed:
            _installed[(torch.Tensor, name)] = original
            setattr(torch.Tensor, name, _refusing("Tensor", name, original, floats_only=True))
    return len(_installed)
