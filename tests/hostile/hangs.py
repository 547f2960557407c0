"""Hostile: never returns."""

import torch
import triton
import triton.language as tl


@triton.jit
def _noop(x_ptr):
    pass


def kernel(x, y, alpha):
    spins = 0
    while True:
        spins += 1
