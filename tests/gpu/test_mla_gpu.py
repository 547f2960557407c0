"""The MLA foundation natively on a GPU: the float32 reference against float64, and the naive
Triton baseline against the reference at the headline shapes (prefill at Sq = Skv = 2048: the
naive kernel is slow at 8192). Eager bf16 PyTorch is a timed baseline, so only its outputs'
finiteness is checked. Formerly benchmarks/check_mla_gpu.py; timings come from `pytest benchmarks`.
"""

from __future__ import annotations

import pytest
import torch

from pytest_kopt.kernels.families import mla_naive
from pytest_kopt.kernels.reference.mla import mla_eager_bf16, mla_reference
from pytest_kopt.problems.base import rel_rms
from pytest_kopt.problems.mla import MLA, MLA_PREFILL

CASES = [(MLA, c) for c in MLA.headline_cases] + [(MLA_PREFILL, {"B": 1, "Sq": 2048, "H": 64, "Skv": 2048})]
IDS = [f"{p.name}-{p.describe(c).replace(' ', '_')}" for p, c in CASES]


@pytest.mark.parametrize("problem,case", CASES, ids=IDS)
def test_the_naive_baseline_matches_the_reference(problem, case: dict, seed: int) -> None:
    inputs = problem.make_inputs(case, device="cuda", seed=seed)
    expected = problem.reference(**inputs)
    failed = [e.reason for e in problem.compare(mla_naive.kernel(**inputs), expected) if not e.ok]
    assert not failed, f"mla_naive {problem.describe(case)} (seed {seed}): {failed}"
    eager = mla_eager_bf16(**inputs)
    assert all(torch.isfinite(t).all() for t in eager), "eager bf16 produced non-finite outputs"


@pytest.mark.parametrize("problem,case", [c for c in CASES if c[1]["B"] == 1], ids=[i for i, c in zip(IDS, CASES) if c[1]["B"] == 1])
def test_the_float32_reference_against_float64(problem, case: dict, seed: int) -> None:
    """The H200 read o 5-8e-7 and lse 4-5e-8 (results/h200-2026-11-29, check-mla.log)."""
    inputs = problem.make_inputs(case, device="cuda", seed=seed)
    fp32, fp64 = mla_reference(**inputs), mla_reference(**inputs, accum_dtype=torch.float64)
    o, lse = rel_rms(fp32[0], fp64[0]), rel_rms(fp32[1], fp64[1])
    assert o <= 1e-5 and lse <= 1e-6, f"fp32 reference vs fp64: o {o:.1e}, lse {lse:.1e} (seed {seed})"
