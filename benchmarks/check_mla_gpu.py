"""GPU check of the MLA foundation: the naive Triton baseline and eager bf16 PyTorch against the
float32 reference on the headline shapes, with do_bench median times (L2 flushed before each run).

    PYTHONPATH=. python3 benchmarks/check_mla_gpu.py

Needs torch, triton and a CUDA GPU; the package need not be installed. Prefill is checked at
Sq = Skv = 2048 rather than 8192, because the naive kernel is slow there. Exits 1 when the
naive kernel misses a tolerance (eager bf16 is a timed baseline, reported but not judged).
"""

from __future__ import annotations

import sys
import time

import torch
from triton.testing import do_bench

from kernels.families import mla_naive
from kernels.reference.mla import mla_eager_bf16, mla_reference
from pytest_kopt.problems.base import H200_BF16_FLOPS_PER_S, H200_COPY_BYTES_PER_S, rel_rms
from pytest_kopt.problems.mla import MLA, MLA_PREFILL

CASES = [(MLA, case) for case in MLA.headline_cases] + [(MLA_PREFILL, {"B": 1, "Sq": 2048, "H": 64, "Skv": 2048})]
CANDIDATES = [("mla_naive", mla_naive.kernel, True), ("torch-eager-bf16", mla_eager_bf16, False)]


def bench_us(fn, inputs) -> float:
    return do_bench(lambda: fn(**inputs), warmup=10, rep=50, return_mode="median") * 1e3


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to check")
        return 2
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  naive knobs {mla_naive.KNOBS}")
    started = time.perf_counter()
    failed = []
    for problem, case in CASES:
        label = f"{problem.name:11s} {problem.describe(case)}"
        inputs = problem.make_inputs(case, device="cuda", seed=0)
        expected = problem.reference(**inputs)
        torch.cuda.synchronize()
        if case["B"] == 1:  # the float32 reference itself, against float64
            exact = mla_reference(**inputs, accum_dtype=torch.float64)
            print(f"{label}  reference fp32 vs fp64: o {rel_rms(expected[0], exact[0]):.1e} lse {rel_rms(expected[1], exact[1]):.1e}")
        cost = problem.cost(case)
        floor_us = cost.floor_seconds(H200_COPY_BYTES_PER_S, H200_BF16_FLOPS_PER_S) * 1e6
        ref_us = bench_us(problem.reference, inputs)
        print(f"{label}  floor {floor_us:9.1f} us   fp32 reference {ref_us:10.1f} us")
        for name, fn, judged in CANDIDATES:
            outputs = fn(**inputs)
            torch.cuda.synchronize()
            errors = problem.compare(outputs, expected)
            ok = all(e.ok for e in errors)
            if judged and not ok:
                failed.append(f"{label} {name}: " + "; ".join(e.reason for e in errors if not e.ok))
            us = bench_us(fn, inputs)
            errs = " ".join(f"{e.name} {e.rel_rms:.1e}" for e in errors)
            print(f"{label}  {name:17s} {us:10.1f} us  {errs}  {'ok' if ok else 'OVER TOLERANCE'}")
        del inputs, expected
        torch.cuda.empty_cache()
    print(f"done in {time.perf_counter() - started:.0f} s")
    for line in failed:
        print("FAIL", line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
