"""MLA decode's host (and device) time beside FlashMLA's, the implementations interleaved round by round (developer
probe, H200).

    python3 tools/probe_mla_host.py OUT_DIR [--file PROBLEM:NAME=PATH ..] [--rounds 60] [--cases B1]
                                            [--timers eager,device] [--device-calls 15]

Host time at B1 moved by tens of microseconds between machines and between one pytest-benchmark test and the next,
so two figures from different tests are not side by side. Here every round times each implementation once, in an
order shuffled every round (``round_orders``), on the same case: one round is ``EAGER_SETS`` calls back to back on as
many input sets (benchmarks/test_headline.py's eager round), timed to the last call's return (``host``: the caller's
thread per call) and to the GPU's end (``eager``: per call, host included). ``--timers device``: each round also
times (or only times) ``--device-calls`` calls on the first input set with the judge's device timer
(``pytest_kopt.judge.timing.median_us``: L2 flushed before each call) and keeps their median. At B128 long-tail
the same file read 1-2 us apart by its place in a one-pass run (session 45), as much as the gaps being measured.
Medians over ``--rounds`` rounds, and ours over FlashMLA's per round (the median of the ratios: > 1 means FlashMLA
is faster), with the 10th and 90th percentiles of those ratios.

Implementations: each ``--file`` for its problem (default: ``kernels/best/mla.py`` and ``kernels/best/mla-paged.py``),
and the problem's FlashMLA baseline where ``flash_mla`` imports. Before timing, each is checked against the float32
reference on fresh inputs (the problem's ``compare``: relative RMS, NaN never passes); a wrong one is reported and
not timed. Then ``micro``: pieces of a host path timed alone in tight loops (mean per call): the two output
allocations, the stream look-up, four ``data_ptr`` calls, a plan key.

Writes OUT_DIR/probe_mla_host.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.test_headline import EAGER_SETS, round_orders  # noqa: E402
from pytest_kopt.gate import load_module  # noqa: E402
from pytest_kopt.judge.timing import median_us  # noqa: E402
from pytest_kopt.problems import get_problem  # noqa: E402


def summarise(samples, flash):
    """``samples[name][timer]``: one figure a round (µs). Per implementation: each timer's median over the rounds, and
    for eager and device time, except FlashMLA's own, the ratio to FlashMLA's figure of the same round: the median of
    those ratios and their 10th and 90th percentiles (a round's ratio, not a ratio of medians, so that what moved both
    within a round cancels). A timer with no figures is left out."""
    rows = {}
    for name, got in samples.items():
        row = rows[name] = {}
        for timer, values in got.items():
            if not values:
                continue
            row[f"{timer}_us"] = statistics.median(values)
            if flash and name != flash and timer != "host":
                ratios = sorted(v / f for v, f in zip(values, samples[flash][timer], strict=True))
                row[f"{timer}_over_flashmla"] = statistics.median(ratios)
                row[f"{timer}_over_flashmla_p10_p90"] = (ratios[len(ratios) // 10], ratios[(9 * len(ratios)) // 10])
    return rows


def eager_round(fn, sets):
    """(host s per call, eager s per call) of one round: every set once, back to back."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for inputs in sets:
        fn(**inputs)
    returned = time.perf_counter()
    torch.cuda.synchronize()
    end = time.perf_counter()
    return (returned - start) / len(sets), (end - start) / len(sets)


def mean_us(fn, n=2000):
    fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def micro(module, inputs):
    """Pieces of the host path, alone (module: an mla_paged render, inputs: mla-paged's)."""
    q, kv, table, lengths = (inputs[k] for k in ("q", "kv_cache", "block_table", "cache_seqlens"))
    B, Sq, H, _ = q.shape
    ptrs = (q.data_ptr(), kv.data_ptr(), table.data_ptr(), lengths.data_ptr())
    rows = {
        "two allocations (o, lse)": lambda: (torch.empty((B, Sq, H, 512), device=q.device, dtype=q.dtype),
                                             torch.empty((B, H, Sq), device=q.device, dtype=torch.float32)),
        "stream (current_stream(device).cuda_stream)": lambda: torch.cuda.current_stream(q.device).cuda_stream,
        "four data_ptr": lambda: (q.data_ptr(), kv.data_ptr(), table.data_ptr(), lengths.data_ptr()),
        "q.device": lambda: q.device,
    }
    if hasattr(module, "plan_key"):
        rows["plan key"] = lambda: module.plan_key(q, kv, table, lengths, ptrs)
        rows["plan key + plan_for"] = lambda: module.plan_for(q, kv, table, lengths, module.plan_key(q, kv, table, lengths, ptrs))
    return {name: round(mean_us(fn), 2) for name, fn in rows.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--file", action="append", default=[], help="PROBLEM:NAME=PATH (repeatable)")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--cases", default="B1 ", help="substring of the case labels to probe")
    parser.add_argument("--timers", default="eager", help="comma-separated: eager (with host), device")
    parser.add_argument("--device-calls", type=int, default=15, help="device-timed calls per implementation a round")
    args = parser.parse_args()
    timers = set(args.timers.split(","))
    if timers - {"eager", "device"}:
        parser.error(f"--timers takes eager and/or device, got {args.timers!r}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = [(spec.split(":", 1)[0], *spec.split(":", 1)[1].split("=", 1)) for spec in args.file] or [
        ("mla", "best", "kernels/best/mla.py"), ("mla-paged", "best", "kernels/best/mla-paged.py")]
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": args.rounds, "cases": {}, "micro": {}}
    for problem_name in dict.fromkeys(p for p, _, _ in files):
        problem = get_problem(problem_name)
        impls = {name: load_module(ROOT / path) for p, name, path in files if p == problem_name}
        fns = {name: module.kernel for name, module in impls.items()}
        fns.update({f"baseline:{b.name}": b.fn for b in problem.baselines("cuda") if "flash" in b.name.lower()})
        for case in problem.headline_cases:
            label = f"{problem_name} {problem.describe(case)}"
            if args.cases not in label + " ":
                continue
            sets = [problem.make_inputs(case, device="cuda", seed=100 + i) for i in range(EAGER_SETS)]
            row = report["cases"][label] = {}
            live = {}
            for name, fn in fns.items():
                fresh = problem.make_inputs(case, device="cuda", seed=int(time.time_ns() % 2**31))
                errors = problem.compare(fn(**fresh), problem.reference(**fresh))
                row[name] = {"rel_rms": max(e.rel_rms for e in errors), "ok": all(e.ok for e in errors)}
                if row[name]["ok"]:
                    live[name] = fn
                    for inputs in sets:  # warm: compile, plan, scratch
                        fn(**inputs)
            samples = {name: {"host": [], "eager": [], "device": []} for name in live}
            for order in round_orders(list(live), args.rounds, seed=len(report["cases"])):
                for name in order:
                    if "eager" in timers:
                        host, eager = eager_round(live[name], sets)
                        samples[name]["host"].append(host * 1e6)
                        samples[name]["eager"].append(eager * 1e6)
                    if "device" in timers:
                        call = lambda fn=live[name], inputs=sets[0]: fn(**inputs)  # noqa: E731
                        samples[name]["device"].append(median_us(call, "cuda", rounds=args.device_calls, warmup_rounds=1))
            flash = next((n for n in live if n.startswith("baseline:")), None)
            for name, figures in summarise(samples, flash).items():
                row[name].update(figures)
            print(label, json.dumps(row), flush=True)
            (out / "probe_mla_host.json").write_text(json.dumps(report, indent=1))
        if problem_name == "mla-paged" and "eager" in timers:
            case = problem.headline_cases[0]
            inputs = problem.make_inputs(case, device="cuda", seed=1)
            for name, module in impls.items():
                report["micro"][f"{name} {problem.describe(case)}"] = micro(module, inputs)
    (out / "probe_mla_host.json").write_text(json.dumps(report, indent=1))
    nan = float("nan")
    print("\ncase | implementation | host us | eager us | device us | eager / FlashMLA's | device / FlashMLA's "
          "(medians of rounds, p10-p90) | rel_rms")
    for label, row in report["cases"].items():
        for name, r in row.items():
            spread = r.get("device_over_flashmla_p10_p90", (nan, nan))
            print(f"{label} | {name} | {r.get('host_us', nan):.1f} | {r.get('eager_us', nan):.1f} | {r.get('device_us', nan):.1f} | "
                  f"{r.get('eager_over_flashmla', nan):.3f} | {r.get('device_over_flashmla', nan):.3f} ({spread[0]:.3f}-{spread[1]:.3f}) | "
                  f"{r['rel_rms']:.2e}{'' if r['ok'] else ' WRONG'}")
    for name, rows in report["micro"].items():
        print("micro", name, rows)


if __name__ == "__main__":
    main()
