"""Device probe: why the judge's runner times a decode slower than the benchmark does (tools/README.md,
open H200 check 2). The promoted kernel in one process, timed the way the judge's rounds are shaped, one
difference at a time:

- ``same``: one input set, n calls back to back (what the benchmark's graph figure sees)
- ``slots``: n input sets in turn, back to back (a judge round: every call on its own slot)
- ``gaps``: ``slots`` with the GPU idle ~2 ms before each round (the supervisor checks between rounds)
- ``stopped``: ``slots`` with this process stopped (SIGSTOP, by a child, for ~2 ms) before each round, as the
  supervisor stops its runner between requests: a core that starts each round cold shows here
- ``long``: ``stopped`` with rounds 10x longer (the n sets 10 times): what a cold start costs per call
- ``monitor``: ``gaps`` with the judge's launch monitor installed (as in every runner)

Eager (n calls, then a sync) and graph (one CUDA graph of the n calls, replayed) per call, µs, the
median of rounds; n as the judge's rounds had it (its timelines). A developer probe, not a benchmark of record.

    python3 tools/probe_round_shape.py [--problem mla|mla-paged] [--candidate FILE.py] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import torch

from pytest_kopt.problems import get_problem

ROOT = Path(__file__).resolve().parents[1]
CASES = {  # n: calls a judge round made on the H200 (session 22 for mla, 25 for mla-paged)
    "mla": ({"B": 1, "Sq": 1, "H": 64, "Skv": 8192, "n": 60}, {"B": 64, "Sq": 1, "H": 64, "Skv": 8192, "n": 13}),
    "mla-paged": ({"B": 1, "Sq": 1, "H": 64, "Skv": 8192, "n": 48}, {"B": 1, "Sq": 4, "H": 64, "Skv": 8192, "n": 47},
                  {"B": 64, "Sq": 1, "H": 64, "Skv": 8192, "n": 8}),
}
ROUNDS = 15
GAP_S = 0.002
LONG = 10  # ``long``: rounds this many times longer


def stop_briefly() -> None:
    """This process stopped for ~GAP_S by a child (SIGSTOP, then SIGCONT), as the judge's supervisor stops its runner."""
    child = subprocess.Popen(["sh", "-c", f"kill -STOP {os.getpid()}; sleep {GAP_S}; kill -CONT {os.getpid()}"])
    child.wait()


def load(path: Path):
    spec = importlib.util.spec_from_file_location("candidate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def per_call_us(kernel, sets: list[dict], mode: str, gap: bool | str) -> float:
    """Median over rounds of (round wall time / calls), the round ending in a sync; ``gap``: False, True (sleep) or
    "stop" (stopped) before each round."""
    graph = None
    if mode == "graph":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                for s in sets:
                    kernel(**s)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for s in sets:
                kernel(**s)
    times = []
    for _ in range(ROUNDS):
        torch.cuda.synchronize()
        if gap == "stop":
            stop_briefly()
        elif gap:
            time.sleep(GAP_S)
        start = time.perf_counter()
        if graph is not None:
            graph.replay()
        else:
            for s in sets:
                kernel(**s)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / len(sets) * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--problem", choices=sorted(CASES), default="mla")
    parser.add_argument("--candidate", type=Path, help="default: kernels/best/<problem>.py")
    args = parser.parse_args()
    problem = get_problem(args.problem)
    kernel = load(args.candidate or ROOT / "kernels" / "best" / f"{args.problem}.py").kernel
    inputs = []
    for case in CASES[args.problem]:
        shape = {k: v for k, v in case.items() if k != "n"}
        one = problem.make_inputs(shape, device="cuda", seed=1)
        many = [problem.make_inputs(shape, device="cuda", seed=10 + i) for i in range(case["n"])]
        for s in many + [one]:
            kernel(**s)
        inputs.append((shape, one, many))
    torch.cuda.synchronize()
    rows = []
    for shape, one, many in inputs:
        n = len(many)
        row = {"case": shape, "n": n}
        variants = {"same": ([one] * n, False), "slots": (many, False), "gaps": (many, True), "stopped": (many, "stop"),
                    "long": (many * LONG, "stop")}
        for name, (sets, gap) in variants.items():
            for mode in ("eager", "graph"):
                row[f"{name}/{mode}"] = round(per_call_us(kernel, sets, mode, gap), 1)
        rows.append(row)
    from pytest_kopt.judge.checks import LaunchMonitor

    LaunchMonitor().install()  # from here on every launch goes through the judge's wrappers
    for row, (shape, one, many) in zip(rows, inputs):
        for mode in ("eager", "graph"):
            row[f"monitor/{mode}"] = round(per_call_us(kernel, many, mode, True), 1)
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
