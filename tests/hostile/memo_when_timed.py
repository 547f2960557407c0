"""Hostile (class: memoised outputs while timed): keeps every output keyed by a fingerprint of
its inputs (the bits of a few elements, read through an integer view, and the scale). A fingerprint seen before is served from the memo
without computing; once a shape has been seen twice it assumes the timed calls cycle through
inputs it has seen and serves the latest memo entry. Fresh inputs every timed call: no hit is
ever right, and every timed output is checked."""

import torch
import triton
import triton.language as tl

_MEMO = {}
_LATEST = {}
_SEEN = {}


@triton.jit
def _axpy(x_ptr, y_ptr, o_ptr, alpha, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * N + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + row * N + offs, mask=mask).to(tl.float32)
    tl.store(o_ptr + row * N + offs, (alpha * x + y).to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _copy(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


def kernel(x, y, alpha):
    shape = tuple(x.shape)
    key = (shape, int(x.view(torch.int16)[0, 0]), int(y.view(torch.int16)[0, -1]), float(alpha))
    _SEEN[shape] = _SEEN.get(shape, 0) + 1
    hit = _MEMO.get(key)
    if hit is None and _SEEN[shape] > 2:
        hit = _LATEST.get(shape)
    out = torch.empty_like(x)
    if hit is not None:
        _copy[(triton.cdiv(out.numel(), 128),)](hit, out, out.numel(), BLOCK=128)
        return (out,)
    B, N = shape
    _axpy[(B, triton.cdiv(N, 128))](x, y, out, float(alpha), N, BLOCK=128)
    _MEMO[key] = _LATEST[shape] = out.clone()
    return (out,)
