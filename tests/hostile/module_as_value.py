"""A module bound to another name (red team 7, session 51): the policy followed attribute chains only from an import's
own name, so ``E = enum`` made ``E.bltns.exec`` the builtin exec, and the text it ran was never checked. With the
policy on, the module used as a value is refused; with it off, the runner refuses exec called by the candidate."""

import enum

import torch
import triton
import triton.language as tl

E = enum
E.bltns.exec("def _torch_axpy(x, y, alpha):\n    return (alpha * x.float() + y.float()).to(x.dtype)\n")


@triton.jit
def _touch(o_ptr):
    pass


def kernel(x, y, alpha):
    out = _torch_axpy(x, y, alpha)  # noqa: F821 - defined by the exec'd text
    _touch[(1,)](out)
    return (out,)
