"""Torch math in a garbage collector's finalizer (red team 8, session 51): a generator suspended inside ``try/finally``
and left in a reference cycle runs its ``finally`` when a collection finds it, on whatever thread allocates then, the
runner's too, outside the fence and the guard. Its kernel does nothing; the finally block, re-armed until it runs
outside the call, writes the outputs. The policy refuses ``yield``; at run time a collection counts as candidate
code (``fence._fence_collections``)."""

import torch
import triton
import triton.language as tl


@triton.jit
def _nothing(o_ptr):
    pass


def _later(out, x, y, alpha, box):
    try:
        yield
    finally:
        try:
            out.copy_(x.float() * alpha + y.float())
        except RuntimeError:
            _arm(out, x, y, alpha, box)  # still inside the fence: plant another cycle for the next collection
            box.append([object() for _ in range(30000)])


def _arm(out, x, y, alpha, box):
    pending = _later(out, x, y, alpha, box)
    next(pending)
    cycle = [pending]
    cycle.append(cycle)


def kernel(x, y, alpha):
    out = torch.empty_like(x)
    _nothing[(1,)](out)
    _arm(out, x, y, alpha, [])
    return (out,)
