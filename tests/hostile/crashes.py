"""Hostile: loads through a wild pointer. On the CPU interpreter this segfaults the process;
on a GPU it is an illegal memory access."""

import torch
import triton
import triton.language as tl


@triton.jit
def _wild(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs + 1_000_000_000_000)
    tl.store(o_ptr + offs, v, mask=offs < n)


def kernel(x, y, alpha):
    out = torch.empty_like(x)
    _wild[(1,)](x, out, x.numel(), BLOCK=128)
    return (out,)
