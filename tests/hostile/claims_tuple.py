"""An output that says it is a tuple (red team 7, session 51): its metaclass answers ``==`` with True, so the runner's
``type(outputs) in (tuple, list)`` took it for one and listed it after the call, outside the fence and the dispatch
guard, where its ``__iter__`` computed with torch. Its kernel writes zeros. The runner now checks the type by identity,
and lists the outputs inside the fence."""

import torch
import triton
import triton.language as tl


@triton.jit
def _zeros(o_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(o_ptr + offs, tl.zeros([BLOCK], dtype=tl.float32).to(o_ptr.dtype.element_ty), mask=offs < N)


class Claims(type):
    def __eq__(cls, other):
        return True

    def __hash__(cls):
        return 1


class Outputs(metaclass=Claims):
    def __init__(self, out, x, y, alpha):
        self.out, self.x, self.y, self.alpha = out, x, y, alpha

    def __iter__(self):
        self.out.copy_(self.alpha * self.x.float() + self.y.float())
        return iter([self.out])


def kernel(x, y, alpha):
    out = torch.empty_like(x)
    _zeros[(triton.cdiv(out.numel(), 256),)](out, out.numel(), BLOCK=256)
    return Outputs(out, x, y, alpha)
