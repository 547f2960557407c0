"""One call each of the promoted ``mla-paged`` kernel and FlashMLA at the cases where ours trails (B32 Sq4, B64 Sq1,
B1 Sq4) between cudaProfilerStart / Stop, for Nsight Compute (issue 31: what limits ENGINE "gluon" beside FlashMLA):

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section WarpStateStats ... \\
        python3 tools/profile_mla_paged.py [--cases "B32 Sq4,B64 Sq1"]

Inputs are made and every implementation called once (compiled, warmed) before the profiled calls. FlashMLA's rows
are skipped with the reason where ``flash_mla`` does not import.
"""

from __future__ import annotations

import argparse

import torch

from pytest_kopt import KERNELS_DIR
from pytest_kopt.gate import load_kernel
from pytest_kopt.problems.mla import flashmla_status
from pytest_kopt.problems.mla_paged import MLA_PAGED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="B32 Sq4,B64 Sq1,B1 Sq4", help="comma-separated substrings of case labels")
    args = parser.parse_args(argv)
    wanted = [w.strip() for w in args.cases.split(",") if w.strip()]
    cases = [c for c in MLA_PAGED.headline_cases if any(w in MLA_PAGED.describe(c) for w in wanted)]
    impls = {"best": load_kernel(KERNELS_DIR / "best" / "mla-paged.py")}
    flashmla, reason = flashmla_status()
    if flashmla is None:
        print(f"FlashMLA skipped: {reason}")
    else:
        impls["flashmla"] = flashmla.paged
    for case in cases:
        x = MLA_PAGED.make_inputs(case, device="cuda", seed=7)
        for fn in impls.values():
            fn(**x)  # compile, plan, metadata
        torch.cuda.synchronize()
        for name, fn in impls.items():
            torch.cuda.profiler.start()
            fn(**x)
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            print(f"{MLA_PAGED.describe(case)} {name}: profiled one call", flush=True)
        del x
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
