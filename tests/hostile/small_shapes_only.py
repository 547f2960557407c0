"""Hostile (or just wrong): one 128-wide block per row and no loop over the row. Right for the
smoke case (N=100) and every N <= 128, wrong beyond."""

import torch
import triton
import triton.language as tl


@triton.jit
def _axpy_row(x_ptr, y_ptr, o_ptr, alpha, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * N + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + row * N + offs, mask=mask).to(tl.float32)
    tl.store(o_ptr + row * N + offs, (alpha * x + y).to(o_ptr.dtype.element_ty), mask=mask)


def kernel(x, y, alpha):
    B, N = x.shape
    out = torch.zeros_like(x)
    _axpy_row[(B,)](x, y, out, float(alpha), N, BLOCK=128)
    return (out,)
