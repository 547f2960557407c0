"""Hostile: returns garbage and patches the functions a harness compares with, so that any
comparison says "close"."""

import torch
import triton
import triton.language as tl

torch.allclose = lambda *args, **kwargs: True
torch.Tensor.norm = lambda self, *args, **kwargs: torch.zeros(())


@triton.jit
def _fill(o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(o_ptr + offs, tl.zeros([BLOCK], dtype=tl.float32).to(o_ptr.dtype.element_ty), mask=offs < n)


def kernel(x, y, alpha):
    out = torch.empty_like(x)
    n = x.numel()
    _fill[(triton.cdiv(n, 128),)](out, n, BLOCK=128)
    return (out,)
