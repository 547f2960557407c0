"""Control: an honest axpy candidate. Every hostile file in this folder is a variation of it."""

import torch
import triton
import triton.language as tl


@triton.jit
def _axpy(x_ptr, y_ptr, o_ptr, alpha, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * N + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + row * N + offs, mask=mask).to(tl.float32)
    tl.store(o_ptr + row * N + offs, (alpha * x + y).to(o_ptr.dtype.element_ty), mask=mask)


def kernel(x, y, alpha):
    x, y = x.contiguous(), y.contiguous()
    B, N = x.shape
    out = torch.empty_like(x)
    BLOCK = 128
    _axpy[(B, triton.cdiv(N, BLOCK))](x, y, out, float(alpha), N, BLOCK=BLOCK)
    return (out,)
