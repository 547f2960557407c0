"""The judge on a GPU: the GPU-only hostile candidates fail for the right reason without poisoning
the evaluation that follows, and both problems' baselines pass in full mode (speedup and roofline
from one run). Formerly benchmarks/check_judge_gpu.py. About 3 minutes on an H200 (fla's
chunk_kda, when installed, autotunes on its first call); `KOPT_GPU_QUICK_BASELINES=1` judges the
baselines in quick mode.

The rows run in order in one module, as the script did: "good-after-crash" is meant to follow the
illegal memory access.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import judge_toy_problem
from pytest_kopt import KERNELS_DIR
from pytest_kopt.judge import evaluate

HOSTILE = Path(__file__).resolve().parent.parent / "hostile"
FAMILIES = KERNELS_DIR / "families"
TOY = judge_toy_problem.AXPY.name
QUICK = {"quick": True, "upto": "correctness", "timeout_s": 300.0}
FULL = {"quick": os.environ.get("KOPT_GPU_QUICK_BASELINES") == "1", "upto": "profile", "timeout_s": 900.0}

ROWS = [  # (label, problem, candidate, evaluate options, expected verdict, a fragment any reason must hold)
    ("side-stream-runtime", TOY, HOSTILE / "side_stream.py", {**QUICK, "static_policy": False}, "fail", ("side stream",)),
    ("side-stream-policy", TOY, HOSTILE / "side_stream.py", QUICK, "fail", ("streams",)),
    ("illegal-address", TOY, HOSTILE / "crashes.py", QUICK, "fail", ("illegal memory access", "CUDA error", "SIGSEGV")),
    ("good-after-crash", TOY, HOSTILE / "good_axpy.py", QUICK, "pass", ()),
    ("mla-baseline", "mla", FAMILIES / "mla_naive.py", FULL, "pass", ()),
    ("kda-baseline", "kda", FAMILIES / "kda_recurrent.py", FULL, "pass", ()),
]


@pytest.mark.parametrize("label,problem,candidate,options,expected,fragments", ROWS, ids=[r[0] for r in ROWS])
def test_the_judge_on_the_gpu(label, problem, candidate, options, expected, fragments) -> None:
    result = evaluate(problem, candidate, **options)
    reasons = " | ".join(result.get("reasons") or [])
    assert result["verdict"] == expected, f"{label}: {result['verdict']} at {result['stage']}: {reasons[:600]}"
    assert not fragments or any(f in reasons for f in fragments), f"{label}: no reason names {fragments}: {reasons[:600]}"
    if expected == "pass" and options is FULL and not FULL["quick"]:
        timings, roofline = result.get("timings") or {}, result.get("roofline") or {}
        assert timings.get("candidate_us") and timings.get("baselines"), f"{label}: not timed beside its baselines: {timings}"
        assert result.get("speedup") and roofline.get("floor_us"), f"{label}: no speedup or roofline: {result.get('speedup')}, {roofline}"
        assert (result.get("profile") or {}).get("kernels"), f"{label}: no profile"
