"""Triton when checked, Tensor's C base class when timed (red team, session 50, reached there through
functools.update_wrapper): the fence cannot change the base class's methods, an immutable type. With the policy
on, the private name is refused; with it off, the runner refuses a timed call that launches no Triton kernel."""

import torch
import triton
import triton.language as tl

PATTERN = 0x7FABCDEF  # checks.POISON for four-byte elements
BASE = torch._C.TensorBase


@triton.jit
def _axpy(x_ptr, y_ptr, o_ptr, alpha, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * N + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + row * N + offs, mask=mask).to(tl.float32)
    tl.store(o_ptr + row * N + offs, (alpha * x + y).to(o_ptr.dtype.element_ty), mask=mask)


def _checked() -> bool:
    probe = torch.empty(4, dtype=torch.int32)
    seen = int(probe[0]) == PATTERN
    probe.fill_(0)
    return seen


def kernel(x, y, alpha):
    if not _checked():
        return (BASE.add(BASE.mul(x.float(), alpha), y.float()).to(x.dtype),)
    B, N = x.shape
    out = torch.empty_like(x)
    _axpy[(B, triton.cdiv(N, 128))](x, y, out, float(alpha), N, BLOCK=128)
    return (out,)
