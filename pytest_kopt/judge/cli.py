"""Judge one candidate: policy, compile, honesty checks, correctness, benchmark, profile.

    kopt eval --problem PROBLEM CANDIDATE.py [--json OUT.json] [--quick] [--upto STAGE] [--metric eager|device|graph]
              [--incumbent OTHER.py] [--timeout S] [--seed N] [--benchmark-json PATH]

Exit status 0 only when the candidate passes every stage up to ``--upto``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from . import STAGES, evaluate, summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("candidate", help="candidate file defining kernel(...), or a family folder (judged at its defaults)")
    parser.add_argument("--problem", required=True, help="problem name (kda, mla, mla-prefill, ...) or package.module:attribute")
    parser.add_argument("--json", dest="json_out", help="write the result JSON here")
    parser.add_argument("--quick", action="store_true", help="few random shapes, no profile")
    parser.add_argument("--upto", default=None, choices=STAGES, help="last stage to run (default: profile; benchmark with --quick)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before the evaluation is killed (default 900)")
    parser.add_argument("--seed", type=int, default=None, help="reproducible hidden input seeds (default: fresh secret seeds)")
    parser.add_argument("--benchmark-json", help="also save the timings as pytest-benchmark JSON here")
    parser.add_argument("--metric", default="eager", choices=("eager", "device", "graph"),
                        help="the figure the speedup uses (default eager: back-to-back calls, host time included)")
    parser.add_argument("--incumbent", help="another candidate timed beside this one, round by round (prints the ratio)")


def candidate_file(path: str, tmp: Path) -> str:
    """``path`` itself, or for a family folder (kernels/families/<name>/) its candidate at the default knobs, rendered
    into ``tmp`` as one file (a candidate is one file)."""
    folder = Path(path)
    if not folder.is_dir():
        return path
    from ..families import FamilyError, load_family

    try:
        family = load_family(folder)
    except (FamilyError, OSError) as exc:
        raise SystemExit(f"kopt eval: {path} is a folder but not a family ({exc}); name a candidate file") from None
    out = tmp / f"{family.name}.py"
    out.write_text(family.render({}))
    return str(out)


def run(args: argparse.Namespace) -> int:
    if os.getcwd() not in sys.path:  # as ``python -m`` does: a module:attribute problem may live here
        sys.path.insert(0, os.getcwd())
    upto = args.upto or ("benchmark" if args.quick else "profile")
    with tempfile.TemporaryDirectory(prefix="kopt-eval-") as tmp:
        candidate = candidate_file(args.candidate, Path(tmp))
        result = evaluate(args.problem, candidate, upto=upto, quick=args.quick, timeout_s=args.timeout,
                          seed=args.seed, metric=args.metric, incumbent=args.incumbent)
    if candidate != args.candidate:  # name the folder, not the rendered file (gone with its temporary folder)
        result["candidate"] = f"{args.candidate} (the family at its defaults)"
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(result, indent=1, default=str))
    print(summary(result))
    if args.benchmark_json and result.get("benchmarks"):
        from .timing import benchmark_json

        path = Path(args.benchmark_json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(benchmark_json(result["benchmarks"]), indent=1))
        print(f"pytest-benchmark JSON: {path}")
    return 0 if result.get("verdict") == "pass" else 1
