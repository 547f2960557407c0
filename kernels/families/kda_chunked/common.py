"""Shared device math: exp as one ex2, and products that need more than bf16's 8 significant bits."""

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _exp(x):
    """e^x as one ex2.approx.ftz on the GPU (``tl.exp`` adds a guard for subnormal results: five instructions, not
    two); every decay here is a normal number or negligible below e^-87, so flushing subnormals changes nothing."""
    return tl.exp2(x * _LOG2E)


@gluon.jit
def _gl_exp(x):
    """``_exp`` for the Gluon kernels."""
    return gl.exp2(x * 1.4426950408889634)


@triton.jit
def _split(x):
    """x ~= hi + lo with both halves bf16 (about 16 significant bits together)."""
    hi = x.to(tl.bfloat16)
    lo = (x - hi.to(tl.float32)).to(tl.bfloat16)
    return hi, lo


@triton.jit
def _dot3(a, b, acc):
    """acc + a @ b with float32 operands as bf16 hi/lo pairs: three bf16 tensor-core products
    (hi*hi + hi*lo + lo*hi), about 16 significant bits, no tf32 involved."""
    a_hi, a_lo = _split(a)
    b_hi, b_lo = _split(b)
    acc = tl.dot(a_hi, b_hi, acc)
    acc = tl.dot(a_hi, b_lo, acc)
    return tl.dot(a_lo, b_hi, acc)


@triton.jit
def _dot_tf32(a, b, acc):
    """acc + a @ b for float32 operands as one tf32 tensor-core product (10 explicit mantissa bits per operand)."""
    return tl.dot(a, b, acc, input_precision="tf32")
