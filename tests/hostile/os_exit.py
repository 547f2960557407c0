"""Hostile: leaves the process from under the judge (needs the static policy switched off)."""

import os

import torch
import triton
import triton.language as tl


@triton.jit
def _noop(x_ptr):
    pass


def kernel(x, y, alpha):
    os._exit(0)
