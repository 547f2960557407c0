"""Where one MLA decode call's device time goes, kernel by kernel, beside FlashMLA's (developer probe, H200).

    python3 tools/timeline_mla_paged.py OUT_DIR [--file NAME=PATH ..] [--cases "B1 Sq4,B128"] [--calls 30]

For each ``mla-paged`` headline case whose label contains one of ``--cases``: every implementation (each ``--file``'s
``kernel``, default ``kernels/best/mla-paged.py``, and FlashMLA where ``flash_mla`` imports) is checked against the
float32 reference on fresh inputs (relative RMS; a wrong one is reported and not timed), warmed, then called
``--calls`` times back to back (each call on the next of four input sets, so no call finds its cache in L2 from the
call before) under ``torch.profiler``. From the CUDA kernel records: each kernel's median duration, and per call the
span from its first kernel's start to its last kernel's end and the gaps between its kernels (launch latency and
tails, which device-time figures include and kernel durations do not).

Writes OUT_DIR/timeline_mla_paged.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_kopt.gate import load_module  # noqa: E402
from pytest_kopt.problems.mla import flashmla_status  # noqa: E402
from pytest_kopt.problems.mla_paged import MLA_PAGED  # noqa: E402

SETS = 4


def calls_of(events, n_calls):
    """The kernel records split into ``n_calls`` equal consecutive groups (every call launches the same kernels)."""
    kernels = sorted(events, key=lambda e: e["start"])
    per = len(kernels) // n_calls
    return [kernels[i * per:(i + 1) * per] for i in range(n_calls)] if per else []


def measure(fn, sets, n_calls):
    for inputs in sets:
        fn(**inputs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(n_calls):
            fn(**sets[i % len(sets)])
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:  # the trace is read once, then removed
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        records = json.loads(trace.read_text())["traceEvents"]
    events = [{"name": e["name"], "start": float(e["ts"]), "end": float(e["ts"]) + float(e["dur"])}
              for e in records if e.get("cat") == "kernel"]
    groups = calls_of(events, n_calls)
    if not groups:
        return {"error": f"{len(events)} kernel records for {n_calls} calls"}
    names = [k["name"][:60] for k in groups[0]]
    durations = {f"{i}:{name}": statistics.median(g[i]["end"] - g[i]["start"] for g in groups) for i, name in enumerate(names)}
    spans = [g[-1]["end"] - g[0]["start"] for g in groups]
    gaps = [statistics.median(g[i + 1]["start"] - g[i]["end"] for g in groups) for i in range(len(names) - 1)]
    return {"kernels_us": durations, "span_us": statistics.median(spans), "gaps_us": gaps}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--file", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--cases", default="B1 Sq4,B128")
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    files = dict(item.split("=", 1) for item in args.file) or {"best": str(ROOT / "kernels" / "best" / "mla-paged.py")}
    impls = {name: load_module(Path(path)).kernel for name, path in files.items()}
    flashmla, reason = flashmla_status()
    if flashmla is None:
        print(f"flashmla skipped: {reason}", flush=True)
    else:
        impls["flashmla"] = flashmla.paged
    report = {}
    for case in MLA_PAGED.headline_cases:
        label = MLA_PAGED.describe(case)
        if not any(sub in label for sub in args.cases.split(",")):
            continue
        sets = [MLA_PAGED.make_inputs(case, device="cuda", seed=100 + i) for i in range(SETS)]
        report[label] = {}
        for name, fn in impls.items():
            fresh = MLA_PAGED.make_inputs(case, device="cuda", seed=7)
            errors = MLA_PAGED.compare(fn(**fresh), MLA_PAGED.reference(**fresh))
            if not all(e.ok for e in errors):
                report[label][name] = {"error": f"wrong: rel_rms {[e.rel_rms for e in errors]}"}
                continue
            report[label][name] = measure(fn, sets, args.calls)
            print(label, name, json.dumps(report[label][name]), flush=True)
        (args.out / "timeline_mla_paged.json").write_text(json.dumps(report, indent=1))
        del sets
        torch.cuda.empty_cache()
    print("\ncase | implementation | span us (first kernel's start to last's end) | kernels us | gaps us")
    for label, rows in report.items():
        for name, r in rows.items():
            if "error" in r:
                print(f"{label} | {name} | {r['error']}")
            else:
                ks = ", ".join(f"{k.split(':', 1)[1][:24]} {v:.1f}" for k, v in r["kernels_us"].items())
                print(f"{label} | {name} | {r['span_us']:.1f} | {ks} | {', '.join(f'{g:.1f}' for g in r['gaps_us'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
