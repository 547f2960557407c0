"""One call of each promoted MLA kernel between cudaProfilerStart / Stop, for Nsight Compute (issue 6: what limits
the kernels the loops promoted; issue 31: the paged decode beside FlashMLA):

    ncu --profile-from-start off --clock-control none --section SpeedOfLight ... python3 tools/profile_mla.py
    ncu ... python3 tools/profile_mla.py --paged [--cases "B32 Sq4,B64 Sq1"] [--file PATH]

Default: decode B1 and B64 and the causal prefill at 8192. ``--paged``: the promoted ``mla-paged`` kernel and
FlashMLA (where ``flash_mla`` imports; else its rows are skipped with the reason) at the ``mla-paged`` headline
cases whose labels contain one of ``--cases``; ``--file``: a candidate file of ``mla-paged`` profiled in place of
the promoted kernel (ncu's ``-k`` then picks its kernel by name). Every implementation is called once (compiled, planned, warmed)
before its profiled call.
"""

from __future__ import annotations

import argparse

import torch

from pytest_kopt import KERNELS_DIR
from pytest_kopt.gate import load_kernel
from pytest_kopt.problems import get_problem
from pytest_kopt.problems.mla import flashmla_status

CASES = [
    ("mla", {"B": 1, "Sq": 1, "H": 64, "Skv": 8192}),
    ("mla", {"B": 64, "Sq": 1, "H": 64, "Skv": 8192}),
    ("mla-prefill", {"B": 1, "Sq": 8192, "H": 64, "Skv": 8192}),
]


def profile(problem, case, impls: dict) -> None:
    """Each implementation once to warm it, then once more between profiler start and stop."""
    x = problem.make_inputs(case, device="cuda", seed=7)
    for fn in impls.values():
        fn(**x)
    torch.cuda.synchronize()
    for name, fn in impls.items():
        torch.cuda.profiler.start()
        fn(**x)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print(f"{problem.name} {problem.describe(case)} {name}: profiled one call", flush=True)
    del x
    torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paged", action="store_true", help="mla-paged's promoted kernel and FlashMLA")
    parser.add_argument("--cases", default="B32 Sq4,B64 Sq1,B1 Sq4", help="with --paged: substrings of case labels")
    parser.add_argument("--file", help="with --paged: a candidate file profiled in place of the promoted kernel")
    args = parser.parse_args(argv)
    if not args.paged:
        for name, case in CASES:
            profile(get_problem(name), case, {"best": load_kernel(KERNELS_DIR / "best" / f"{name}.py")})
        return 0
    paged = get_problem("mla-paged")
    impls = {"file": load_kernel(args.file)} if args.file else {"best": load_kernel(KERNELS_DIR / "best" / "mla-paged.py")}
    flashmla, reason = flashmla_status()
    if flashmla is None:
        print(f"FlashMLA skipped: {reason}")
    else:
        impls["flashmla"] = flashmla.paged
    wanted = [w.strip() for w in args.cases.split(",") if w.strip()]
    for case in paged.headline_cases:
        if any(w in paged.describe(case) for w in wanted):
            profile(paged, case, impls)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
