"""Hostile: right while it is being checked, fast and wrong once the same shape comes back
again and again (as it does when it is timed): it drops the "+ y"."""

import torch
import triton
import triton.language as tl

_SEEN = {}


@triton.jit
def _axpy(x_ptr, y_ptr, o_ptr, alpha, n, ADD_Y: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    out = alpha * tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    if ADD_Y:
        out += tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(o_ptr + offs, out.to(o_ptr.dtype.element_ty), mask=mask)


def kernel(x, y, alpha):
    shape = tuple(x.shape)
    _SEEN[shape] = _SEEN.get(shape, 0) + 1
    out = torch.empty_like(x)
    n = x.numel()
    _axpy[(triton.cdiv(n, 128),)](x, y, out, float(alpha), n, ADD_Y=_SEEN[shape] <= 2, BLOCK=128)
    return (out,)
