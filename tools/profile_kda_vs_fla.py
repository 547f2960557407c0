"""Where the device time goes, ours against flash-linear-attention's chunk_kda, kernel by kernel
(issue 5: which of our stages loses to fla's corresponding one, and by how much).

    source tools/device_setup.sh
    PYTHONPATH=$KOPT_FLA_PATH:$PYTHONPATH python3 tools/profile_kda_vs_fla.py [--out DIR]
    ... ncu --profile-from-start off --clock-control none --section SpeedOfLight ... \
        python3 tools/profile_kda_vs_fla.py --ncu      # one profiled call of each, headline only

For each case (the headline, B2 T16384, B8 T1024 D64): fresh inputs from the problem, the judge's
median (CUDA events, L2 flushed, host time hidden behind the flush's sleep) for kernels/best/kda.py
and for fla, then the device time of every kernel of one call from the judge's profiler (L2 flushed
before each call, mean of PROFILE_CALLS calls; session 4's JSON came from an earlier version that
also dropped fla's own fill kernels, ~20 µs of its 613). do_bench is not used: it adds fla's ~0.6-1 ms of
host time per call to fla's figure (session 4 found this; see kernels/notes/kda.md).
JSON to OUT/profile_kda_vs_fla.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from pytest_kopt import KERNELS_DIR
from pytest_kopt.gate import load_kernel
from pytest_kopt.judge.profile import profile_kernels
from pytest_kopt.judge.timing import flush_l2, median_us
from pytest_kopt.problems import get_problem

CASES = [
    {"B": 1, "T": 8192, "H": 16, "K": 128, "V": 128, "initial_state": False, "output_final_state": True},
    {"B": 2, "T": 16384, "H": 16, "K": 128, "V": 128, "initial_state": False, "output_final_state": True},
    {"B": 8, "T": 1024, "H": 8, "K": 64, "V": 64, "initial_state": False, "output_final_state": True},
]
PROFILE_CALLS = 10


def kernel_times(fn) -> dict[str, float]:
    """Mean device microseconds per call of each kernel ``fn`` launches, the L2 flushed before each
    call (the judge's profiler; the flush's own int8 memset and its GPU-side wait are left out)."""
    rows = profile_kernels(lambda: (flush_l2("cuda"), fn()), device=torch.device("cuda"), monitor=None, calls=PROFILE_CALLS)
    return {row["name"][:70]: round(row["us"], 1) for row in rows
            if "spin_kernel" not in row["name"] and not ("FillFunctor" in row["name"] and "signed char" in row["name"])}


def implementations(problem):
    fla = [b for b in problem.baselines("cuda") if b.name.startswith("fla")]
    impls = {"ours": load_kernel(KERNELS_DIR / "best" / "kda.py")}
    if fla:
        impls["fla"] = fla[0].fn
    return impls


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--ncu", action="store_true", help="one call of each between cudaProfilerStart/Stop, headline only")
    args = parser.parse_args()
    problem = get_problem("kda")
    impls = implementations(problem)
    results = {"gpu": torch.cuda.get_device_name(), "cases": {}}
    for case in CASES[:1] if args.ncu else CASES:
        label = problem.describe(case)
        x = problem.make_inputs(case, device="cuda", seed=int(time.time()) % 100000)
        row = results["cases"][label] = {}
        for name, fn in impls.items():
            t0 = time.time()
            fn(**x)  # compile / autotune
            torch.cuda.synchronize()
            if args.ncu:
                torch.cuda.profiler.start()
                fn(**x)
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
                print(f"{label} {name}: profiled one call", flush=True)
                continue
            first_s = time.time() - t0
            judge = median_us(lambda: fn(**x), "cuda", rounds=50)
            kernels = kernel_times(lambda: fn(**x))
            row[name] = {"judge_us": round(judge, 1), "kernel_sum_us": round(sum(kernels.values()), 1),
                         "kernels_us": kernels, "first_call_s": round(first_s, 1)}
            print(f"\n{label}  {name}: judge {judge:.1f} us, kernels sum {sum(kernels.values()):.1f} us", flush=True)
            for kname, us in kernels.items():
                print(f"    {us:9.1f}  {kname}", flush=True)
        del x
        torch.cuda.empty_cache()
    if not args.ncu:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "profile_kda_vs_fla.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
