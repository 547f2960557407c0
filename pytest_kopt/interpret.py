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

And it skips work the interpreter repeats for nothing inside a launch (``patch_lang_once_per_launch``):
the same arithmetic, bit for bit, in about two thirds of the time on the KDA kernels.
"""

from __future__ import annotations

import inspect
import os
import threading

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


def patch_lang_once_per_launch() -> bool:
    """Inside one interpreted launch, patch ``triton.language`` once per set of language modules.

    Triton 3.6's interpreter calls ``_patch_lang(fn)`` at every launch (``GridExecutor``: the
    scope it returns is restored when the launch ends) and again at every call of a device
    function (``InterpretedFunction.__call__``: ``tl.sum``, ``tl.cumsum``, ``tl.zeros``, a
    family's helpers, in every program and loop step), where the returned scope is dropped
    unrestored. That second patch wraps the builtins of the ``tl`` / ``tl.core`` modules the
    function sees (those wrapped already are no longer builtins and are left alone) and sets the
    same handful of attributes again to equivalent fresh functions; nothing undoes it before the
    launch ends. So once a set of language modules has been patched during a launch, patching it
    again in that launch changes nothing but the time spent (``inspect.getmembers`` over the
    language modules: a third of a KDA recurrence's interpreted time). A device call inside a
    launch skips the patch when its modules were patched earlier in the same launch; launches
    themselves, a device call outside any launch, a first call with other modules and a function
    that sees no language module (the interpreter's assertion) go through Triton's
    ``_patch_lang`` as before. Returns True once installed."""
    from triton import language as tl
    from triton.runtime import interpreter

    if getattr(interpreter._patch_lang, "_kopt_once_per_launch", False):
        return True
    patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    state = threading.local()  # per thread: its current launch's function, and the module sets patched in it

    def modules(fn) -> frozenset:
        """The language modules ``_patch_lang(fn)`` patches (the same test as Triton's)."""
        return frozenset(id(value) for value in fn.__globals__.values() if inspect.ismodule(value) and value in [tl, tl.core])

    def once_per_launch(fn):
        launched, patched = getattr(state, "fn", None), getattr(state, "patched", None)
        if launched is None:  # a call outside any launch: as Triton does it
            return patch_lang(fn)
        if patched is None:  # nothing patched yet in this launch
            scope = patch_lang(fn)
            if fn is launched:  # the launch's own patch (restored when the launch ends)
                state.patched = {modules(fn)}
            return scope
        langs = modules(fn)
        if langs and langs in patched:
            return interpreter._LangPatchScope()  # an empty scope: the device call drops it, as it drops a full one
        scope = patch_lang(fn)
        patched.add(langs)
        return scope

    def launch_in_scope(self, *args, **kwargs):
        outer = getattr(state, "fn", None), getattr(state, "patched", None)
        state.fn, state.patched = self.fn, None
        try:
            return launch(self, *args, **kwargs)
        finally:
            state.fn, state.patched = outer

    once_per_launch._kopt_once_per_launch = True
    once_per_launch.__wrapped__ = patch_lang
    launch_in_scope.__dict__.update(launch.__dict__)  # patch_quiet_ieee's mark: the launch is still quiet
    launch_in_scope.__wrapped__ = launch
    interpreter._patch_lang = once_per_launch
    interpreter.GridExecutor.__call__ = launch_in_scope
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
    patch_lang_once_per_launch()
    return True
