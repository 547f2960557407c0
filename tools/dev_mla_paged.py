"""MLA decode beside FlashMLA on one GPU in one call: the paged family at ``mla-paged``'s headline
cases and the dense decode at B1 Sq1/Sq2/Sq4, B64, B32 and B1 Skv 131072 (developer script, issues
30 and 31).

    PYTHONPATH=. python3 tools/dev_mla_paged.py OUT_DIR [--only paged|dense] [--cases SUBSTR,..]
                                               [--variants NAME,..] [--file NAME=PATH ..] [--budget-s 1.0]
    PYTHONPATH=. python3 tools/dev_mla_paged.py OUT_DIR --smoke      # CPU interpreter dry run, tiny cases

For every (case, implementation): random inputs of its own (so an output it leaves unwritten cannot
inherit another implementation's right answer), the float32 reference, relative RMS of o and lse
(NaN never passes), then three timings, each a median:
- ``device``: the judge's timer (pytest_kopt.judge.timing.median_us: L2 flushed before every
  call, the GPU held back long enough for the host to enqueue the call), with the host's time per
  call beside it;
- ``eager``: wall clock per call of back-to-back calls, each on the next of several input sets
  (together larger than the L2), host included: what a caller without CUDA graphs pays;
- ``graph``: one CUDA graph of the same back-to-back calls, replayed (device time alone, no host;
  None with the reason when the implementation cannot be captured).
Implementations: our variants (a family rendered with knob overrides, as the search agent renders
it; the dense ``best`` is kernels/best/mla.py), FlashMLA where ``flash_mla`` imports (``flashmla``:
its scheduler metadata made once per lengths tensor and reused, as an engine reuses it across a
step's layers and as the judge times it; ``flashmla+meta``: made again in every call), and eager
PyTorch. Without flash_mla the FlashMLA rows say why and the rest runs.

Writes OUT_DIR/dev_mla_paged.json after every case (a timeout keeps what was measured) and prints a
table last: per case and implementation, the error, the three timings and device-time GB/s, and
each timing over FlashMLA's (> 1: ours is faster).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_kopt.kernels.reference.mla import mla_eager_bf16, mla_paged_eager_bf16  # noqa: E402
from pytest_kopt.families import load_family  # noqa: E402
from pytest_kopt.gate import load_module  # noqa: E402
from pytest_kopt.judge.timing import median_us  # noqa: E402
from pytest_kopt.problems.base import rel_rms  # noqa: E402
from pytest_kopt.problems.mla import MLA, FlashMLA, flashmla_status  # noqa: E402
from pytest_kopt.problems.mla_paged import MLA_PAGED  # noqa: E402

H200_COPY_BYTES_PER_S = 4.25e12
DENSE_CASES = [
    {"B": 1, "Sq": 1, "H": 64, "Skv": 8192}, {"B": 1, "Sq": 2, "H": 64, "Skv": 8192}, {"B": 1, "Sq": 4, "H": 64, "Skv": 8192},
    {"B": 64, "Sq": 1, "H": 64, "Skv": 8192}, {"B": 32, "Sq": 1, "H": 64, "Skv": 8192}, {"B": 1, "Sq": 1, "H": 64, "Skv": 131072},
]
SMOKE_PAGED = [{"B": 2, "Sq": 2, "H": 16, "page_size": 16, "lengths": [37, 20]}, {"B": 3, "Sq": 1, "H": 16, "lengths": [65, 1, 30]}]
SMOKE_DENSE = [{"B": 1, "Sq": 2, "H": 16, "Skv": 64}, {"B": 2, "Sq": 1, "H": 16, "Skv": 40}]

# (name, family, knob overrides); "best" is the promoted dense kernel file itself
PAGED_VARIANTS = {
    "paged": ("mla_paged", {}),  # the family defaults (CONFIG auto, LAUNCH direct)
    "paged-jit": ("mla_paged", {"LAUNCH": "jit"}),  # every call through the JIT entry
    "paged-fused": ("mla_paged", {"MERGE": "fused"}),
    "paged-kernel": ("mla_paged", {"MERGE": "kernel"}),
    "paged-ov0": ("mla_paged", {"OVERHEAD": 0}),
    "paged-wide": ("mla_paged", {"CONFIG": "knobs"}),  # the 64-row TMA tiles at every shape
    "paged-gluon": ("mla_paged", {"ENGINE": "gluon"}),  # the warp-specialised Gluon kernel where it applies
}
BALANCED = {"SCHEDULE": "balanced", "PDL": 2, "num_stages": 4, "MERGERS": 4}  # mla_decode's first TRY_EARLY entry
DENSE_VARIANTS = {
    "best": (None, {}),
    "grid": ("mla_decode", {}),  # the family defaults
    "balanced": ("mla_decode", BALANCED),
    "balanced-direct": ("mla_decode", {**BALANCED, "LAUNCH": "direct"}),
    "balanced-fused-direct": ("mla_decode", {**BALANCED, "MERGE": "fused", "LAUNCH": "direct"}),
}
DEFAULT_VARIANTS = ["paged", "paged-jit", "best", "balanced", "balanced-direct"]


def render(name: str, family: str | None, overrides: dict, out_dir: Path):
    """The implementation's ``kernel``: a family rendered with ``overrides`` under out_dir, or the
    promoted dense kernel."""
    if family is None:
        return load_module(ROOT / "kernels" / "best" / "mla.py").kernel
    path = out_dir / "candidates" / f"{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(load_family(family).render(overrides))
    return load_module(path).kernel


def implementations(kind: str, wanted: list[str], out_dir: Path, files: dict | None = None) -> tuple[dict, dict]:
    """{name: callable} and {name: why it is absent}; ``files`` ({name: path}) adds each file's ``kernel`` (paged
    cases only: e.g. a prototype, or an earlier file)."""
    impls, absent = {}, {}
    table = PAGED_VARIANTS if kind == "paged" else DENSE_VARIANTS
    for name in wanted:
        if name in table:
            family, overrides = table[name]
            impls[name] = render(name, family, overrides, out_dir)
    if kind == "paged":
        for name, path in (files or {}).items():
            impls[name] = load_module(Path(path)).kernel
    flashmla, reason = flashmla_status()
    if flashmla is None:
        absent["flashmla"] = reason
    else:  # per layer (metadata reused, as the judge times it) and with its scheduler kernel in every call
        import flash_mla

        fresh = FlashMLA(flash_mla, fresh_metadata=True)
        impls["flashmla"], impls["flashmla+meta"] = (flashmla.paged, fresh.paged) if kind == "paged" else (flashmla.dense, fresh.dense)
    impls["torch-eager"] = mla_paged_eager_bf16 if kind == "paged" else mla_eager_bf16
    return impls, absent


def input_sets(problem, case: dict, device: str, first_seed: int) -> list[dict]:
    """Enough input sets that cycling through them leaves nothing in the L2 (together >= 160 MB),
    at least 3 and at most 12; on the CPU two."""
    bytes_per_set = problem.cost(case).bytes
    n = 2 if device == "cpu" else max(3, min(12, math.ceil(160e6 / max(bytes_per_set, 1.0))))
    return [problem.make_inputs(case, device=device, seed=first_seed + i) for i in range(n)]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def eager_us(fn, sets: list[dict], device: str, budget_s: float) -> float:
    """Per-call wall clock of back-to-back calls cycling through the input sets."""
    if device == "cpu":  # the interpreter: one pass, a figure of the script's plumbing only
        start = time.perf_counter()
        for s in sets:
            fn(**s)
        return (time.perf_counter() - start) / len(sets) * 1e6
    for s in sets:  # warm: compiles, plans, FlashMLA metadata
        fn(**s)
    sync(device)
    start = time.perf_counter()
    fn(**sets[0])
    sync(device)
    one = time.perf_counter() - start
    n = max(len(sets), min(200, int(budget_s / max(one, 1e-6))))
    runs = []
    for _ in range(3):
        sync(device)
        start = time.perf_counter()
        for i in range(n):
            fn(**sets[i % len(sets)])
        sync(device)
        runs.append((time.perf_counter() - start) / n * 1e6)
    return sorted(runs)[1]


def graph_us(fn, sets: list[dict], device: str) -> tuple[float | None, str]:
    """Device time per call of a CUDA graph of back-to-back calls over the input sets, replayed."""
    if not device.startswith("cuda"):
        return None, "no CUDA graphs on the CPU"
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm on the capture stream: its own scratch and plans
            for s in sets:
                fn(**s)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        calls = max(len(sets), 20 - 20 % len(sets))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for i in range(calls):
                fn(**sets[i % len(sets)])
        graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / calls)
        del graph
        return sorted(times)[2], ""
    except Exception as exc:  # not graph-safe: a figure missing, not a failure
        torch.cuda.synchronize()
        return None, f"{type(exc).__name__}: {str(exc)[:200]}"


def measure(problem, case: dict, impls: dict, device: str, budget_s: float, seed: int) -> dict:
    """Correctness and the three timings of every implementation on one case."""
    label = problem.describe(case)
    cost = problem.cost(case)
    rows = {}
    sets = input_sets(problem, case, device, seed)
    for i, (name, fn) in enumerate(impls.items()):
        row: dict = {}
        try:
            # inputs no other implementation has seen: an output this one leaves unwritten then holds memory the
            # caching allocator handed back from another's call (right for their inputs, wrong for these)
            check_inputs = problem.make_inputs(case, device=device, seed=seed + 1000 * (i + 1))
            expected = problem.reference(**check_inputs)
            out = fn(**check_inputs)
            sync(device)
            o, lse = out
            row["rel_rms_o"] = rel_rms(o, expected[0])
            row["rel_rms_lse"] = rel_rms(lse, expected[1]) if lse.shape == expected[1].shape else math.inf
            row["ok"] = all(math.isfinite(row[k]) and row[k] <= spec.tolerance
                            for k, spec in (("rel_rms_o", problem.outputs[0]), ("rel_rms_lse", problem.outputs[1])))
            if not row["ok"]:
                row["lse_shape"] = list(lse.shape)
            del out, o, lse, check_inputs, expected
            cpu = device == "cpu"
            dev = median_us(lambda: fn(**sets[0]), device, rounds=1 if cpu else 50, warmup_rounds=0 if cpu else 3, with_host=True)
            row["device_us"], row["host_us"] = dev
            row["eager_us"] = eager_us(fn, sets, device, budget_s)
            row["graph_us"], why = graph_us(fn, sets, device)
            if why:
                row["graph_error"] = why
            row["device_GBps"] = cost.bytes / (row["device_us"] * 1e-6) / 1e9
        except Exception as exc:  # one implementation failing on one case is a row, not the end of the run
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            row["traceback"] = traceback.format_exc()[-1500:]
            sync(device)
        rows[name] = row
        shown = {k: (round(v, 2) if isinstance(v, float) and v > 0.01 else v) for k, v in row.items() if k != "traceback"}
        print(f"  {label:50s} {name:24s} {shown}", flush=True)
    return {"case": case, "label": label, "bytes": cost.bytes, "flops": cost.flops,
            "floor_us": cost.bytes / H200_COPY_BYTES_PER_S * 1e6, "rows": rows}


def table(results: list[dict]) -> str:
    lines = [f"{'case':46s} {'impl':22s} {'err o':>8s} {'device':>9s} {'eager':>9s} {'graph':>9s} {'GB/s':>6s}   vs FlashMLA dev/eager/graph"]
    for entry in results:
        flash = entry["rows"].get("flashmla", {})
        for name, row in entry["rows"].items():
            if "error" in row:
                lines.append(f"{entry['label'][:46]:46s} {name:22s} ERROR {row['error'][:70]}")
                continue

            def fmt(v):
                return f"{v:9.1f}" if isinstance(v, (int, float)) and v is not None else f"{'-':>9s}"

            def ratio(key):
                a, b = flash.get(key), row.get(key)
                return f"{a / b:.2f}" if a and b else "-"

            err = f"{row['rel_rms_o']:.1e}" + ("" if row["ok"] else "!")
            lines.append(f"{entry['label'][:46]:46s} {name:22s} {err:>8s} {fmt(row['device_us'])} {fmt(row['eager_us'])} "
                         f"{fmt(row.get('graph_us'))} {row['device_GBps']:6.0f}   {ratio('device_us')}/{ratio('eager_us')}/{ratio('graph_us')}")
    return "\n".join(lines)


def environment(device: str) -> dict:
    import triton

    flashmla, reason = flashmla_status()
    env = {"torch": torch.__version__, "triton": triton.__version__, "device": device, "flashmla": reason or "imports"}
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name()
        try:
            import flash_mla

            env["flashmla_version"] = getattr(flash_mla, "__version__", "?")
        except Exception:  # already described by flashmla_status
            pass
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--only", choices=["paged", "dense"])
    parser.add_argument("--cases", help="comma-separated substrings of case labels to keep")
    parser.add_argument("--variants", help=f"comma-separated ({', '.join([*PAGED_VARIANTS, *DENSE_VARIANTS])}); default "
                                           f"{','.join(DEFAULT_VARIANTS)}")
    parser.add_argument("--file", action="append", default=[], metavar="NAME=PATH",
                        help="also time PATH's kernel(q, kv_cache, block_table, cache_seqlens, scale) at the paged cases")
    parser.add_argument("--budget-s", type=float, default=1.0, help="seconds of back-to-back calls per eager figure")
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny cases: checks the script, not the kernels' speed")
    args = parser.parse_args(argv)
    if args.smoke:
        from pytest_kopt import interpret

        interpret.configure()
    device = "cpu" if args.smoke or not torch.cuda.is_available() else "cuda"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    wanted = args.variants.split(",") if args.variants else DEFAULT_VARIANTS
    unknown = [v for v in wanted if v not in PAGED_VARIANTS and v not in DENSE_VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}")
    if any("=" not in item for item in args.file):
        parser.error(f"--file takes NAME=PATH, got {[item for item in args.file if '=' not in item]}")
    files = dict(item.split("=", 1) for item in args.file)
    plans = []
    if args.only in (None, "paged"):
        plans.append(("paged", MLA_PAGED, SMOKE_PAGED if args.smoke else list(MLA_PAGED.headline_cases)))
    if args.only in (None, "dense"):
        plans.append(("dense", MLA, SMOKE_DENSE if args.smoke else DENSE_CASES))
    report = {"environment": environment(device), "absent": {}, "results": []}
    print(json.dumps(report["environment"]), flush=True)
    out_path = args.out_dir / "dev_mla_paged.json"
    for kind, problem, cases in plans:
        impls, absent = implementations(kind, wanted, args.out_dir, files)
        report["absent"].update(absent)
        for name, why in absent.items():
            print(f"{kind}: {name} skipped: {why}", flush=True)
        for case in cases:
            if args.cases and not any(sub in problem.describe(case) for sub in args.cases.split(",")):
                continue
            entry = measure(problem, case, impls, device, args.budget_s, args.seed)
            entry["problem"] = problem.name
            report["results"].append(entry)
            out_path.write_text(json.dumps(report, indent=1, default=str))
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    print()
    print(table(report["results"]))
    print(f"\nwritten: {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
