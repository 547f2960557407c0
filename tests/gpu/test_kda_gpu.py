"""The KDA references and the kda_recurrent baseline, natively on a GPU.

The chunked float32 reference is the problem's ground truth at large T (the float64 step-by-step
recurrence is too slow there), so it is held to the float64 recurrence far tighter than a
candidate's tolerance; the recurrent baseline (and flash-linear-attention's chunk_kda, where
installed) are held to the candidate tolerance. Formerly benchmarks/check_kda_gpu.py; its do_bench
timings now come from `pytest benchmarks`.
"""

from __future__ import annotations

import pytest
import torch

from pytest_kopt.kernels.families import kda_recurrent
from pytest_kopt.kernels.reference.kda import chunk_kda_reference, naive_recurrent_kda
from pytest_kopt.problems.base import rel_rms
from pytest_kopt.problems.kda import KDAProblem

PROBLEM = KDAProblem()
TOL = 5e-3  # a candidate's tolerance
REF_TOL = 1e-4  # the chunked reference against the float64 recurrence: far tighter


def case(B, T, H, K, V, h0=False, hT=True, scale=None):
    return {"B": B, "T": T, "H": H, "K": K, "V": V, "initial_state": h0, "output_final_state": hT, "scale": scale}


def errors(got, want) -> dict[str, float]:
    return {name: rel_rms(a, b) for name, a, b in zip(("o", "final_state"), got, want) if b is not None}


def chunked(accum_dtype):
    return lambda **x: chunk_kda_reference(**x, accum_dtype=accum_dtype)


SMALL = [case(1, 1, 1, 16, 16, h0=True), case(2, 257, 3, 64, 256, h0=True, scale=0.5),
         case(3, 1000, 2, 128, 32, hT=False), case(1, 700, 4, 256, 128, h0=True)]


@pytest.mark.parametrize("c", SMALL, ids=PROBLEM.describe)
def test_small_shapes_against_the_float64_recurrence(c: dict, seed: int) -> None:
    x = PROBLEM.make_inputs(c, device="cuda", seed=seed, dtype=torch.bfloat16)
    truth = naive_recurrent_kda(**x)
    reference = errors(chunked(torch.float32)(**x), truth)
    baseline = errors(kda_recurrent.kernel(**x), truth)
    assert all(e <= REF_TOL for e in reference.values()), f"chunked fp32 reference {reference} (seed {seed})"
    assert all(e <= TOL for e in baseline.values()), f"kda_recurrent {baseline} (seed {seed})"


def test_the_chunked_reference_at_headline_widths(seed: int) -> None:
    """T 2048 at K = V = 128: the longest the float64 recurrence affords."""
    x = PROBLEM.make_inputs(case(1, 2048, 16, 128, 128, h0=True), device="cuda", seed=seed)
    truth = naive_recurrent_kda(**x)
    fp32, fp64 = errors(chunked(torch.float32)(**x), truth), errors(chunked(torch.float64)(**x), truth)
    assert all(e <= REF_TOL for e in fp32.values()), f"chunk fp32 {fp32} (seed {seed})"
    assert all(e <= 1e-10 for e in fp64.values()), f"chunk fp64 {fp64} (seed {seed})"


@pytest.fixture(scope="module")
def headline():
    """Inputs at the headline shape and the problem's reference on them (one seed per module)."""
    import random

    seed = random.randrange(2**31)
    x = PROBLEM.make_inputs(PROBLEM.headline_cases[0], device="cuda", seed=seed)
    return x, PROBLEM.reference(**x), seed


def test_the_problem_reference_at_the_headline(headline) -> None:
    x, reference, seed = headline
    exact = errors(reference, chunked(torch.float64)(**x))
    assert all(e <= REF_TOL for e in exact.values()), f"problem reference vs chunk fp64 {exact} (seed {seed})"


def test_the_recurrent_baseline_at_the_headline(headline) -> None:
    x, reference, seed = headline
    found = errors(kda_recurrent.kernel(**x), reference)
    assert all(e <= TOL for e in found.values()), f"kda_recurrent {found} (seed {seed})"


def test_fla_chunk_kda_at_the_headline(headline) -> None:
    pytest.importorskip("fla.ops.kda", reason="flash-linear-attention is not installed (pip install '.[fla]')")
    x, reference, seed = headline
    fla = next(b.fn for b in PROBLEM.baselines("cuda") if b.name == "fla-chunk_kda")
    found = errors(fla(**x), reference)  # the first call autotunes: a minute or so
    assert all(e <= TOL for e in found.values()), f"fla chunk_kda {found} (seed {seed})"
