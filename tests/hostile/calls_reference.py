"""Hostile: returns the project's own reference (KDA) and launches a token Triton kernel."""

import torch
import triton
import triton.language as tl
from kernels.reference.kda import naive_recurrent_kda


@triton.jit
def _touch(x_ptr):
    x = tl.load(x_ptr)
    tl.store(x_ptr, x)


def kernel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
    o, final = naive_recurrent_kda(q, k, v, g, beta, scale, initial_state, output_final_state)
    out = torch.empty_like(v)
    _touch[(1,)](out)
    out.copy_(o)
    return out, final
