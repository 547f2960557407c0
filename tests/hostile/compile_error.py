"""Broken: tl.arange needs a power-of-two length; the compiler's message must reach the author."""

import torch
import triton
import triton.language as tl


@triton.jit
def _axpy(x_ptr, y_ptr, o_ptr, alpha, n):
    offs = tl.arange(0, 100)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(o_ptr + offs, alpha * x + y, mask=mask)


def kernel(x, y, alpha):
    out = torch.empty_like(x)
    _axpy[(1,)](x, y, out, float(alpha), x.numel())
    return (out,)
