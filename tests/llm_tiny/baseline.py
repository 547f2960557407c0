"""tiny-axpy baseline candidate: one Triton program per 128 elements."""

import torch
import triton
import triton.language as tl

BLOCK = 128


@triton.jit
def _axpy(x_ptr, y_ptr, o_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(o_ptr + offs, alpha * x + y, mask=mask)


def kernel(x, y, alpha):
    out = torch.empty_like(x)
    n = x.numel()
    _axpy[(triton.cdiv(n, BLOCK),)](x, y, out, alpha, n, BLOCK=BLOCK)
    return (out,)
