"""Hostile (class: stale outputs while timed): honest for the first three calls of a shape (the
checks make two; the random-shape sweep may draw the same shape once more: with two honest calls
it was then caught there, not where this file means to cheat), then serves a view of the first
output it computed for that shape, as if the timed calls saw the same inputs again. Every timed
call has fresh inputs and its output is checked."""

import torch
import triton
import triton.language as tl

_FIRST = {}
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
def _noop(x_ptr):
    pass


def kernel(x, y, alpha):
    shape = tuple(x.shape)
    _SEEN[shape] = _SEEN.get(shape, 0) + 1
    if _SEEN[shape] > 3 and shape in _FIRST:
        _noop[(1,)](x)
        return (_FIRST[shape].view(shape),)
    B, N = shape
    out = torch.empty_like(x)
    _axpy[(B, triton.cdiv(N, 128))](x, y, out, float(alpha), N, BLOCK=128)
    _FIRST.setdefault(shape, out)
    return (out,)
