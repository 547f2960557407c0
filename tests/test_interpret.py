"""The CPU interpreter fixes: without them every bf16 correctness result on CI is meaningless."""

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from pytest_kopt import interpret

pytestmark = pytest.mark.skipif(not interpret.interpreter_enabled(), reason="checks the CPU interpreter")


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], tl.dot(a, b))


@triton.jit
def _cast_kernel(x_ptr, implicit_ptr, explicit_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    x = tl.load(x_ptr + r)
    tl.store(implicit_ptr + r, x)
    tl.store(explicit_ptr + r, x.to(tl.bfloat16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_dot_matches_float32_matmul(dtype):
    a = torch.randn(16, 32).to(dtype)
    b = torch.randn(32, 16).to(dtype)
    c = torch.empty(16, 16)
    _dot_kernel[(1,)](a, b, c, M=16, N=16, K=32)
    want = a.double() @ b.double()
    assert ((c.double() - want).norm() / want.norm()).item() < 1e-5


def test_float32_to_bf16_rounds_to_nearest_even():
    x = torch.randn(4096) * 10
    x[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0])
    implicit = torch.empty(4096, dtype=torch.bfloat16)
    explicit = torch.empty_like(implicit)
    _cast_kernel[(1,)](x, implicit, explicit, N=4096)
    want = x.to(torch.bfloat16)  # torch rounds to nearest even, as the GPU does
    for got in (implicit, explicit):
        assert torch.isnan(got[0])
        assert torch.equal(got[1:], want[1:])


def test_rounding_helper_on_ties():
    # 1 + 2**-8 lies exactly between two bf16 values: ties go to the even one (1.0).
    values = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8)], dtype=np.float32)
    got = interpret.bf16_bits_to_float32(interpret.float32_to_bf16_bits(values))
    assert got.tolist() == [1.0, 1 + 2**-6, -1.0]


def test_numpy_that_breaks_the_interpreter_is_refused(monkeypatch):
    monkeypatch.setattr(np, "__version__", "2.3.0")
    with pytest.raises(interpret.InterpreterUnusable, match="numpy<2.3"):
        interpret.configure(force_interpreter=True)


@triton.jit
def _overflow_kernel(x_ptr, out_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    x = tl.load(x_ptr + r[:, None] * N + r[None, :])
    big = tl.exp2(x)  # 2**200 overflows float32: inf, as on a GPU
    tl.store(out_ptr + r[:, None] * N + r[None, :], tl.dot(big, big - big))  # inf * 0 and inf - inf: NaN


def test_ieee_overflow_is_silent_as_on_a_gpu_and_still_visible_in_the_output():
    """numpy's floating-point warnings inside an interpreted launch were noise in every test run;
    the launch computes inf and NaN as a GPU does, and the output shows them."""
    import warnings

    x = torch.full((16, 16), 200.0)
    out = torch.empty(16, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any RuntimeWarning fails the test
        _overflow_kernel[(1,)](x, out, N=16)
    assert torch.isnan(out).all()


@triton.jit
def _scaled(x, factor):  # a device function of this module (it sees ``tl``)
    return x * factor


@triton.jit
def _pick_max(a, b):
    return tl.maximum(a, b)


@triton.jit
def _nested_calls_kernel(x_ptr, out_ptr, N: tl.constexpr, STEPS: tl.constexpr):
    """Device calls inside a loop: tl.sum, tl.max, tl.cumsum, tl.zeros, tl.reduce with a combine function of this
    module, and a helper of this module."""
    row = tl.program_id(0)
    r = tl.arange(0, N)
    acc = tl.zeros([N], dtype=tl.float32)
    for step in range(STEPS):
        x = tl.load(x_ptr + (row * STEPS + step) * N + r)
        acc += _scaled(x, 0.5) + tl.sum(x, axis=0) - tl.max(x, axis=0) + tl.reduce(x, 0, _pick_max)
        acc += tl.cumsum(x, axis=0)
    tl.store(out_ptr + row * N + r, acc)


def test_the_interpreter_patches_the_language_once_per_launch_with_the_same_results(monkeypatch):
    """``interpret.patch_lang_once_per_launch`` (installed by ``configure``) leaves out only the repeated patches of
    a launch: the same outputs, bit for bit, as Triton's own interpreter, with one ``_patch_lang`` per launch and
    per set of language modules instead of one per device call."""
    from triton.runtime import interpreter

    assert interpret.patch_lang_once_per_launch() and getattr(interpreter._patch_lang, "_kopt_once_per_launch", False)
    fast_patch, fast_launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    patches = []  # one entry per _patch_lang that does the work: each ends with the tensor descriptors' builtins
    patch_builtin = interpreter._patch_builtin

    def counted(pkg, builder, scope):
        if pkg is tl.core.tensor_descriptor_base:
            patches.append(pkg)
        return patch_builtin(pkg, builder, scope)

    x = torch.randn(3, 4, 16)
    want = sum(0.5 * x[:, s].double() + x[:, s].double().sum(-1, keepdim=True) + x[:, s].double().cumsum(-1) for s in range(4))

    def run() -> tuple[torch.Tensor, int]:
        patches.clear()
        out = torch.empty(3, 16)
        with monkeypatch.context() as m:
            m.setattr(interpreter, "_patch_builtin", counted)
            _nested_calls_kernel[(3,)](x, out, N=16, STEPS=4)
            _nested_calls_kernel[(3,)](x, out, N=16, STEPS=4)  # a second launch starts afresh
        return out, len(patches)

    with monkeypatch.context() as m:  # Triton's own interpreter
        m.setattr(interpreter, "_patch_lang", fast_patch.__wrapped__)
        m.setattr(interpreter.GridExecutor, "__call__", fast_launch.__wrapped__)
        theirs, their_patches = run()
    assert interpreter._patch_lang is fast_patch and interpreter.GridExecutor.__call__ is fast_launch
    ours, our_patches = run()
    assert torch.equal(theirs, ours)
    assert ((ours.double() - want).norm() / want.norm()).item() < 1e-5
    # Triton: a patch per launch and per device call (3 programs x 4 steps x tl.sum, tl.max, tl.cumsum, ...)
    assert their_patches > 2 * 3 * 4 * 3, their_patches
    # once per launch: the launch's own, and one for the first device call of Triton's standard library (it sees
    # tl.core, not tl)
    assert our_patches == 2 * 2, (our_patches, their_patches)
