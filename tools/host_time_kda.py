"""Host and eager time of KDA candidates at fla's six shapes, on a GPU (run it on the H200).

    python tools/host_time_kda.py [OLD.py ...] [--calls N]

For kernels/best/kda.py (and each file given) and each of the problem's six headline shapes, after two warm-up
calls per input set:

- host us: the Python time of one call, the GPU left to run behind it (20 back-to-back calls after a synchronize,
  well inside the launch queue, so that nothing waits for the GPU);
- eager us: the per-call time of N back-to-back calls rotating 4 input sets, synchronized once at the end (what a
  caller without CUDA graphs pays per call: the larger of host and device time, and their overlap);
- graph us: one replay of a CUDA graph of 10 calls (rotating the input sets), divided by 10; "-" where the capture
  fails (the candidate is then not graph-safe).

Each figure is the median of 5 repetitions. Rows print as they are measured; --json writes them to a file too.
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

from pytest_kopt.gate import load_module  # noqa: E402
from pytest_kopt.problems import get_problem  # noqa: E402

PROBLEM = get_problem("kda")
SETS = 4


def median_us(samples):
    return statistics.median(samples) * 1e6


def host_us(kernel, inputs, calls=20, repeats=5):
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(calls):
            kernel(**inputs[i % SETS])
        samples.append((time.perf_counter() - start) / calls)
        torch.cuda.synchronize()
    return median_us(samples)


def eager_us(kernel, inputs, calls, repeats=5):
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(calls):
            kernel(**inputs[i % SETS])
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / calls)
    return median_us(samples)


def graph_us(kernel, inputs, per_graph=10, repeats=5):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on the capture's side of things, as torch asks
        for i in range(SETS):
            kernel(**inputs[i])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for i in range(per_graph):
                kernel(**inputs[i % SETS])
    except Exception as exc:  # noqa: BLE001 - a candidate that cannot be captured is reported, not fatal
        print(f"    capture failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    graph.replay()
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / per_graph)
    return median_us(samples)


def measure(path: Path, calls: int) -> list[dict]:
    module = load_module(path)
    rows = []
    for case in PROBLEM.headline_cases:
        inputs = [PROBLEM.make_inputs(case, device="cuda", seed=seed) for seed in range(SETS)]
        for x in inputs:  # compile, plan, warm up
            module.kernel(**x)
            module.kernel(**x)
        row = {"file": str(path), "case": PROBLEM.describe(case), "host_us": host_us(module.kernel, inputs),
               "eager_us": eager_us(module.kernel, inputs, calls), "graph_us": graph_us(module.kernel, inputs)}
        graph = "-" if row["graph_us"] is None else f"{row['graph_us']:8.1f}"
        print(f"{path.name:28s} {row['case']:32s} host {row['host_us']:8.1f}  eager {row['eager_us']:8.1f}  "
              f"graph {graph}", flush=True)
        rows.append(row)
        del inputs
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="other candidate files to time beside kernels/best/kda.py")
    parser.add_argument("--calls", type=int, default=100, help="back-to-back calls per eager sample")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    rows = []
    for path in [ROOT / "kernels" / "best" / "kda.py", *args.files]:
        rows += measure(path, args.calls)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
