"""Device probe: where the promoted kernels' host time goes, and FlashMLA beside MLA decode.

    python3 tools/probe_host_time.py [--out DIR]

For each case: host time of one call (no sync), eager per-call time of 50 back-to-back calls on
4 rotating input sets, CUDA-graph replay per call, and a cProfile of 20 calls (top functions by
own time) written to DIR/<case>.prof.txt. A developer probe, not a benchmark of record.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import json
import pstats
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def three(fn_for, sets, n=50):
    """(host us of one call, eager us per call, graph us per call or None)."""
    for s in sets:
        fn_for(s)()
    torch.cuda.synchronize()
    hosts = []
    for i in range(20):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn_for(sets[i % len(sets)])()
        hosts.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    hosts.sort()
    eager = []
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for i in range(n):
            fn_for(sets[i % len(sets)])()
        torch.cuda.synchronize()
        eager.append((time.perf_counter() - t) / n)
    graph = None
    try:
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn_for(sets[0])()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for i in range(20):
                fn_for(sets[i % len(sets)])()
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(5):
                g.replay()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t) / 100)
        graph = min(times) * 1e6
    except Exception as exc:  # noqa: BLE001
        graph = f"not capturable: {type(exc).__name__}: {str(exc)[:200]}"
    return hosts[len(hosts) // 2] * 1e6, min(eager) * 1e6, graph


def profile(fn, path, calls=20):
    fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    stream = io.StringIO()
    pstats.Stats(prof, stream=stream).sort_stats("tottime").print_stats(25)
    path.write_text(stream.getvalue())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/probe")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import sys

    sys.path.insert(0, str(ROOT))
    from pytest_kopt.problems import get_problem

    rows = {}
    kda = get_problem("kda")
    best_kda = load(ROOT / "kernels/best/kda.py", "best_kda")
    for case in (kda.headline_cases[0], kda.headline_cases[5]):
        sets = [kda.make_inputs(case, device="cuda", seed=i) for i in range(4)]
        label = f"kda {kda.describe(case)}"
        rows[label] = three(lambda s: (lambda: best_kda.kernel(**s)), sets)
        profile(lambda: best_kda.kernel(**sets[0]), out / f"kda_B{case['B']}_T{case['T']}.prof.txt")
        print(label, rows[label], flush=True)

    mla = get_problem("mla")
    best_mla = load(ROOT / "kernels/best/mla.py", "best_mla")
    try:
        from flash_mla import flash_mla_with_kvcache, get_mla_metadata
    except Exception as exc:  # noqa: BLE001
        flash_mla_with_kvcache = None
        print("flash_mla unavailable:", exc)
    for case in ({"B": 1, "Sq": 1, "H": 64, "Skv": 8192}, {"B": 1, "Sq": 4, "H": 64, "Skv": 8192}, {"B": 64, "Sq": 1, "H": 64, "Skv": 8192}):
        sets = [mla.make_inputs(case, device="cuda", seed=i) for i in range(4)]
        label = f"mla {mla.describe(case)}"
        rows[label] = three(lambda s: (lambda: best_mla.kernel(**s)), sets)
        profile(lambda: best_mla.kernel(**sets[0]), out / f"mla_B{case['B']}_Sq{case['Sq']}.prof.txt")
        print(label, rows[label], flush=True)
        if flash_mla_with_kvcache is not None:
            B, Sq, Skv = case["B"], case["Sq"], case["Skv"]
            table = torch.arange(B * Skv // 64, dtype=torch.int32, device="cuda").view(B, -1)
            seqlens = torch.full((B,), Skv, dtype=torch.int32, device="cuda")
            meta = get_mla_metadata()[0]

            def fm(s):
                return lambda: flash_mla_with_kvcache(s["q"], s["kv"].view(-1, 64, 1, 576), table, seqlens, 512, meta, None,
                                                      softmax_scale=s["scale"], causal=Sq > 1, use_legacy=True)
            try:
                rows[label + " flashmla"] = three(fm, sets)
            except Exception as exc:  # noqa: BLE001
                rows[label + " flashmla"] = str(exc)[:300]
            print(label, "flashmla", rows[label + " flashmla"], flush=True)
    (out / "host_time.json").write_text(json.dumps(rows, indent=1))
    print("\ncase | host us | eager us | graph us")
    for k, v in rows.items():
        print(k, "|", v)


if __name__ == "__main__":
    main()
