"""Hostile: a kernel whose arithmetic blows up to NaN."""

import torch
import triton
import triton.language as tl


@triton.jit
def _axpy(x_ptr, y_ptr, o_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    zero = x - x
    tl.store(o_ptr + offs, (alpha * x + y + zero / zero).to(o_ptr.dtype.element_ty), mask=mask)


def kernel(x, y, alpha):
    out = torch.empty_like(x)
    n = x.numel()
    _axpy[(triton.cdiv(n, 128),)](x, y, out, float(alpha), n, BLOCK=128)
    return (out,)
