"""Hostile: launches a kernel that does nothing and returns torch.empty_like memory, hoping
it still holds the reference's freed answer."""

import torch
import triton
import triton.language as tl


@triton.jit
def _noop(x_ptr, N):
    pass


def kernel(x, y, alpha):
    out = torch.empty_like(x)
    _noop[(1,)](out, x.numel())
    return (out,)
