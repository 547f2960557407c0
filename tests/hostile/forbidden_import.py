"""Hostile: hands the work to a third-party kernel library."""

import torch
import triton
import triton.language as tl
from flash_attn import flash_attn_func  # noqa: F401


@triton.jit
def _noop(x_ptr):
    pass


def kernel(x, y, alpha):
    return (flash_attn_func(x, y, alpha),)
