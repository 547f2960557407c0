"""Hostile: computes once per input address and returns the cached tensor afterwards."""

import torch
import triton
import triton.language as tl

_CACHE = {}


@triton.jit
def _axpy(x_ptr, y_ptr, o_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(o_ptr + offs, (alpha * x + y).to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _noop(x_ptr):
    pass


def kernel(x, y, alpha):
    key = (x.data_ptr(), y.data_ptr(), tuple(x.shape))
    if key in _CACHE:
        _noop[(1,)](x)
        return (_CACHE[key],)
    out = torch.empty_like(x)
    n = x.numel()
    _axpy[(triton.cdiv(n, 128),)](x, y, out, float(alpha), n, BLOCK=128)
    _CACHE[key] = out
    return (out,)
