"""Hostile: defines a Triton kernel it never uses and does the math with torch operators,
which no static check can tell apart from arithmetic on Python numbers."""

import torch
import triton
import triton.language as tl


@triton.jit
def _unused(x_ptr):
    pass


def kernel(x, y, alpha):
    return (alpha * x + y,)
