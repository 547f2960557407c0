"""Hostile: accumulates into y in place (saving an allocation) and returns a copy of it."""

import torch
import triton
import triton.language as tl


@triton.jit
def _axpy_inplace(x_ptr, y_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + offs, (alpha * x + y).to(y_ptr.dtype.element_ty), mask=mask)


def kernel(x, y, alpha):
    n = x.numel()
    _axpy_inplace[(triton.cdiv(n, 128),)](x, y, float(alpha), n, BLOCK=128)
    return (y.clone(),)
