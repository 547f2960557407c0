"""Make Triton's CPU interpreter give right answers, so CPU correctness results mean something.

Three traps were measured with Triton 3.6 on CPU:
- numpy >= 2.3 breaks the interpreter (``range`` over a 0-d array raises TypeError);
- the interpreter's ``tl.dot`` multiplies bf16 operands as raw uint16 bit patterns;
- its float32 -> bf16 cast truncates, where the GPU rounds to nearest even (this nearly
  doubles a kernel's bf16 output error on CPU).

``configure()`` switches the interpreter on when no GPU is present, refuses a numpy that
breaks it, patches ``tl.dot`` to widen bf16 operands to float32 (exact: bf16 is the top
half of a float32) and makes the float32 -> bf16 cast round to nearest even. It must run before any ``@triton.jit`` function is defined, since Triton
picks interpreter or compiler at decoration time.

It also runs each interpreted launch with numpy's floating-point warnings off: a GPU computes
IEEE arithmetic silently (an ``exp2`` of a large masked-off lane is inf, a dot over it inf or
NaN), and numpy's "overflow encountered in matmul" for those lanes was noise in every test run
(about 90 warnings a ``make test``). What a kernel stores is still checked: NaN or Inf in an
output fails the judge and the gate as before.
"""

from __future__ import annotations

import os

import numpy as np


class InterpreterUnusable(RuntimeError):
    """The Triton CPU interpreter would silently compute wrong answers in this environment."""


def gpu_available() -> bool:
    import torch

    return torch.cuda.is_available()


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """bf16 values stored as uint16 bit patterns -> the same values as float32."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns, rounding to nearest even as the GPU does; NaN stays NaN."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


def patch_bf16_cast() -> None:
    """Make float32 -> bf16 casts in the interpreter round to nearest even."""
    from triton import language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.cast_impl, "_kopt_bf16_fixed", False):
        return
    original_cast, original_fp_to_fp = builder.cast_impl, builder.create_fp_to_fp

    def is_f32_to_bf16(src, dst_type) -> bool:
        return src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16

    def cast_impl(self, src, dst_type):
        if is_f32_to_bf16(src, dst_type):
            return interpreter.TensorHandle(float32_to_bf16_bits(src.data), dst_type.scalar)
        return original_cast(self, src, dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if is_f32_to_bf16(src, dst_type) and rounding_mode != interpreter._ir.ROUNDING_MODE.RTZ:
            return interpreter.TensorHandle(float32_to_bf16_bits(src.data), dst_type.scalar)
        return original_fp_to_fp(self, src, dst_type, rounding_mode)

    cast_impl._kopt_bf16_fixed = True
    builder.cast_impl = cast_impl
    builder.create_fp_to_fp = create_fp_to_fp
    # The one-argument casts are lambdas bound to the old cast_impl's name lookup; rebind those
    # that can produce bf16 from float32.
    builder.create_fp_trunc = lambda self, src, dst_type: self.cast_impl(src, dst_type)


def patch_bf16_dot() -> bool:
    """Patch the interpreter's dot to widen bf16 operands; returns True once patched."""
    from triton import language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "_kopt_bf16_fixed", False):
        return True
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16 or b.dtype.scalar == tl.bfloat16:
            a_data = bf16_bits_to_float32(a.data) if a.dtype.scalar == tl.bfloat16 else a.data.astype(np.float32)
            b_data = bf16_bits_to_float32(b.data) if b.dtype.scalar == tl.bfloat16 else b.data.astype(np.float32)
            out = np.matmul(a_data, b_data).astype(d.data.dtype) + d.data
            return interpreter.TensorHandle(out, d.dtype.scalar)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    create_dot._kopt_bf16_fixed = True
    builder.create_dot = create_dot
    return True


def patch_quiet_ieee() -> bool:
    """Run every interpreted launch under ``np.errstate(all="ignore")`` (see the module docstring)."""
    from triton.runtime import interpreter

    executor = interpreter.GridExecutor
    if getattr(executor.__call__, "_kopt_quiet", False):
        return True
    original = executor.__call__

    def call(self, *args, **kwargs):
        with np.errstate(all="ignore"):
            return original(self, *args, **kwargs)

    call._kopt_quiet = True
    executor.__call__ = call
    return True


def configure(force_interpreter: bool | None = None) -> bool:
    """Turn on (and fix) the interpreter when there is no GPU. Returns whether it is on."""
    use_interpreter = (not gpu_available()) if force_interpreter is None else force_interpreter
    if use_interpreter:
        os.environ["TRITON_INTERPRET"] = "1"
    if not interpreter_enabled():
        return False
    major, minor = (int(part) for part in np.__version__.split(".")[:2])
    if (major, minor) >= (2, 3):
        raise InterpreterUnusable(
            f"numpy {np.__version__} breaks Triton's CPU interpreter; install numpy<2.3 "
            "(the Makefile's CPU set-up does this)"
        )
    patch_bf16_dot()
    patch_bf16_cast()
    patch_quiet_ieee()
    return True
