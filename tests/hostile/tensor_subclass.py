"""Hostile: returns a tensor subclass whose torch functions all answer "zero", so a harness that
measures the error with torch arithmetic on the output sees none (needs the static policy
switched off: defining __torch_function__ is refused)."""

import torch
import triton
import triton.language as tl


class Agreeable(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        result = super().__torch_function__(func, types, args, kwargs or {})
        if isinstance(result, torch.Tensor) and result.is_floating_point():
            return result.as_subclass(torch.Tensor).zero_().as_subclass(cls)
        return result


@triton.jit
def _noop(x_ptr):
    pass


def kernel(x, y, alpha):
    out = torch.zeros_like(x)
    _noop[(1,)](out)
    return (out.as_subclass(Agreeable),)
