"""Check the judge on a GPU: both baselines pass in full mode (speedup and roofline from one
run), and the GPU-only hostile candidates fail for the right reason without poisoning the
evaluation that follows.

Run from the repository root on a CUDA machine (the package need not be installed; hypothesis
and pytest-benchmark must be):

    PYTHONPATH=. python3 benchmarks/check_judge_gpu.py [--quick-baselines] [--only NAME ...]

Rows, in order (the hostile ones are quick):
  side-stream (runtime)   tests/hostile/side_stream.py with the static policy off: the launch
                          on a private stream is caught at run time
  side-stream (policy)    the same file with the policy on: refused before it runs
  illegal-address         tests/hostile/crashes.py (a wild load): an illegal memory access,
                          reported, and the process that saw it is gone
  good-after-crash        tests/hostile/good_axpy.py right after: passes
  mla baseline            kernels/families/mla_naive.py, full mode
  kda baseline            kernels/families/kda_recurrent.py, full mode (flash-linear-attention's
                          chunk_kda, when installed, autotunes on its first call: a minute or so)

Exits 1 if any row is not as expected. Expect about 3 minutes in all on an H200.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the toy problem the hostile candidates are written for

import judge_toy_problem  # noqa: E402
from pytest_kopt.judge import evaluate  # noqa: E402

HOSTILE = REPO / "tests" / "hostile"
FAMILIES = REPO / "kernels" / "families"
TOY = judge_toy_problem.AXPY.name


def rows(quick_baselines: bool) -> list[tuple[str, str, Path, dict, str, tuple[str, ...]]]:
    """(label, problem, candidate, evaluate options, expected verdict, fragments any reason must hold)."""
    quick = {"quick": True, "upto": "correctness", "timeout_s": 300.0}
    full = {"quick": quick_baselines, "upto": "profile", "timeout_s": 900.0}
    return [
        ("side-stream (runtime)", TOY, HOSTILE / "side_stream.py", {**quick, "static_policy": False}, "fail", ("side stream",)),
        ("side-stream (policy)", TOY, HOSTILE / "side_stream.py", quick, "fail", ("streams",)),
        ("illegal-address", TOY, HOSTILE / "crashes.py", quick, "fail", ("illegal memory access", "CUDA error", "SIGSEGV")),
        ("good-after-crash", TOY, HOSTILE / "good_axpy.py", quick, "pass", ()),
        ("mla baseline", "mla", FAMILIES / "mla_naive.py", full, "pass", ()),
        ("kda baseline", "kda", FAMILIES / "kda_recurrent.py", full, "pass", ()),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick-baselines", action="store_true", help="judge the baselines in quick mode (no profile)")
    parser.add_argument("--only", nargs="*", help="run only rows whose label starts with one of these")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU: this check is for the H200 (the CPU runs tests/test_judge_*.py)")
        return 1
    failures = 0
    table = []
    start_all = time.monotonic()
    for label, problem, candidate, options, expected, fragments in rows(args.quick_baselines):
        if args.only and not any(label.startswith(prefix) for prefix in args.only):
            continue
        result = evaluate(problem, candidate, **options)
        reasons = " | ".join(result.get("reasons") or [])
        ok = result["verdict"] == expected and (not fragments or any(f in reasons for f in fragments))
        failures += not ok
        timings = result.get("timings") or {}
        roof = result.get("roofline") or {}
        table.append((label, expected, result["verdict"], result["stage"], result["duration_s"], timings, result.get("speedup"), roof, ok, reasons, result))
        print(f"[{time.monotonic() - start_all:6.1f}s] {label}: {result['verdict']} at {result['stage']} ({'as expected' if ok else 'NOT AS EXPECTED'})", flush=True)

    print()
    print(f"{'row':24s} {'expect':6s} {'got':5s} {'stage':12s} {'secs':>6s} {'case':26s} {'cand us':>10s} {'baseline':>26s} {'speedup':>8s} {'floor us':>9s} {'GB/s':>8s} {'TFLOP/s':>8s}  ok")
    for label, expected, verdict, stage, secs, timings, speedup, roof, ok, reasons, result in table:
        base = timings.get("baseline")
        base_text = f"{base} {timings['baselines'][base]:.1f}" if base else ""
        print(f"{label:24s} {expected:6s} {verdict:5s} {stage:12s} {secs:6.1f} {str(timings.get('case', '')):26s} "
              f"{_num(timings.get('candidate_us'), 10, 1)} {base_text:>26s} {_num(speedup, 8, 3)} {_num(roof.get('floor_us'), 9, 2)} "
              f"{_num(roof.get('achieved_GBps'), 8, 1)} {_num(roof.get('achieved_TFLOPs'), 8, 3)}  {'yes' if ok else 'NO'}")
    print()
    for label, expected, verdict, stage, secs, timings, speedup, roof, ok, reasons, result in table:
        if reasons:
            print(f"{label}: {reasons[:400]}")
        kernels = (result.get("profile") or {}).get("kernels") or []
        if kernels:
            print(f"{label} profile: " + ", ".join(f"{k['name']} {k['us']:.1f} us x{k['calls']:g}" for k in kernels[:4]))
        if timings.get("baselines"):
            print(f"{label} timings: {timings['baselines']} reference {timings.get('reference_us')} compile_s {timings.get('compile_s')} "
                  f"ceilings {(roof.get('ceilings') or {})}")
    print(f"\n{len(table) - failures}/{len(table)} rows as expected in {time.monotonic() - start_all:.0f} s")
    return 1 if failures else 0


def _num(value, width: int, digits: int) -> str:
    return f"{value:{width}.{digits}f}" if isinstance(value, (int, float)) else " " * (width - 1) + "-"


if __name__ == "__main__":
    sys.exit(main())
