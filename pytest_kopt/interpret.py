"""Make Triton's CPU interpreter give right answers, so CPU correctness results mean something.

Two traps were measured with Triton 3.6 on CPU:
- numpy >= 2.3 breaks the interpreter (``range`` over a 0-d array raises TypeError);
- the interpreter's ``tl.dot`` multiplies bf16 operands as raw uint16 bit patterns.

``configure()`` switches the interpreter on when no GPU is present, refuses a numpy that
breaks it, and patches ``tl.dot`` to widen bf16 operands to float32 (exact: bf16 is the top
half of a float32). It must run before any ``@triton.jit`` function is defined, since Triton
picks interpreter or compiler at decoration time.
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
    return True
