"""Hostile (class: a random-shape sweep that runs out of time): right everywhere, but every shape
other than the smoke case's stalls for 10 seconds, so a sweep with a time budget (here about 20 s:
the test gives the evaluation 55 s, the sweep stops 30 s before the supervisor's deadline) sees
one or two examples before its budget ends. Too few shapes judged is a failure, never a pass."""

import time

import torch
import triton
import triton.language as tl


@triton.jit
def _axpy(x_ptr, y_ptr, o_ptr, alpha, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * N + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + row * N + offs, mask=mask).to(tl.float32)
    tl.store(o_ptr + row * N + offs, (alpha * x + y).to(o_ptr.dtype.element_ty), mask=mask)


def kernel(x, y, alpha):
    B, N = x.shape
    if (B, N) != (2, 100):
        time.sleep(10)
    out = torch.empty_like(x)
    _axpy[(B, triton.cdiv(N, 128))](x, y, out, float(alpha), N, BLOCK=128)
    return (out,)
