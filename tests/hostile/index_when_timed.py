"""Triton when checked, torch indexing when timed (red team, session 50): a gather is torch math too. Indexing a
table of every bfloat16 value's float32 by the bits of x and y, and adding through an overlapping view whose strides
do the arithmetic, computes axpy with no kernel. It tells the calls apart by the judge's NaN pattern in fresh memory,
as torch_when_timed.py does. Refused in every call by the fence (a tensor as an index)."""

import torch
import triton
import triton.language as tl

PATTERN = 0x7FABCDEF  # checks.POISON for four-byte elements


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
        # a wrong answer would be caught by the comparison; the point is only that the indexing runs when timed
        codes = torch.arange(0, 65536, dtype=torch.int32, device=x.device).to(torch.int16)
        return (codes.view(torch.bfloat16)[x.view(torch.int16).to(torch.int64)].to(x.dtype),)
    B, N = x.shape
    out = torch.empty_like(x)
    _axpy[(B, triton.cdiv(N, 128))](x, y, out, float(alpha), N, BLOCK=128)
    return (out,)
