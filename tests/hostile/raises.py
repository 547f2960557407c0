"""Hostile (or just broken): raises from the host code."""

import torch
import triton
import triton.language as tl


@triton.jit
def _noop(x_ptr):
    pass


def kernel(x, y, alpha):
    block = {"BLOCK": 128}
    return (block["BLOCKS"],)
