"""One call of each promoted MLA kernel (decode B1 and B64, causal prefill 8192) between
cudaProfilerStart / Stop, for Nsight Compute (issue 6: what limits the kernels the loops promoted):

    ncu --profile-from-start off --clock-control none --section SpeedOfLight ... \
        python3 tools/profile_mla.py
"""

from __future__ import annotations

import torch

from pytest_kopt import KERNELS_DIR
from pytest_kopt.gate import load_kernel
from pytest_kopt.problems import get_problem

CASES = [
    ("mla", {"B": 1, "Sq": 1, "H": 64, "Skv": 8192}),
    ("mla", {"B": 64, "Sq": 1, "H": 64, "Skv": 8192}),
    ("mla-prefill", {"B": 1, "Sq": 8192, "H": 64, "Skv": 8192}),
]


def main() -> int:
    for name, case in CASES:
        problem = get_problem(name)
        fn = load_kernel(KERNELS_DIR / "best" / f"{name}.py")
        x = problem.make_inputs(case, device="cuda", seed=7)
        fn(**x)  # compile
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        fn(**x)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print(f"{name} {problem.describe(case)}: profiled one call", flush=True)
        del x
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
