"""Why the judge's runner times a B1 decode's eager calls slower than one process does: the runner's differences,
one at a time, in fresh processes (developer probe, H200; tools/README.md, open H200 check 2).

    python3 tools/probe_runner_path.py [--problem mla] [--candidate FILE.py] [--slots 67] [--rounds 20] [--out FILE.json]

Each variant runs in a process of its own (the launch monitor patches Triton for good): the promoted kernel (or
``--candidate``) and the problem's FlashMLA baseline at B1 Sq1, ``--slots`` input sets called back to back (a judge
round: one call per slot), ``--rounds`` rounds, per call in µs (median): ``host`` until the last call returned,
``eager`` until the GPU finished. Variants:

- ``plain``: the inputs as the problem makes them;
- ``arena``: the same inputs copied into one of the judge's GPU arenas (``cuMemCreate`` memory) and handed over as
  the runner hands them, strided views of the arena's bytes;
- ``monitor``: the judge's launch monitor installed before the kernel is imported, as every runner does, and
  disabled while timing, as the runner's batch does;
- ``monitor+arena``: both;
- ``second-context``: ``plain`` with another process holding a CUDA context on the same GPU, idle (the supervisor's,
  beside a runner).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("plain", "arena", "monitor", "monitor+arena", "second-context")


def child(args) -> dict:
    sys.path.insert(0, str(ROOT))
    import torch

    from pytest_kopt.judge.checks import LaunchMonitor
    from pytest_kopt.problems import get_problem

    holder = None
    if args.variant == "second-context":
        holder = subprocess.Popen([sys.executable, "-c", "import sys, time, torch; torch.zeros(1, device='cuda'); "
                                   "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(600)"],
                                  stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "ready"
    monitor = None
    if "monitor" in args.variant:
        monitor = LaunchMonitor()
        monitor.install()
    from pytest_kopt.gate import load_module

    problem = get_problem(args.problem)
    case = {"B": 1, "Sq": 1, "H": 64, "Skv": 8192}
    sets = [problem.make_inputs(case, device="cuda", seed=50 + i) for i in range(args.slots)]
    if "arena" in args.variant:
        from pytest_kopt.judge.arena import Arena, Layout

        layout = Layout(1)
        specs = [{k: layout.place(tuple(v.shape), v.dtype) for k, v in s.items() if isinstance(v, torch.Tensor)} for s in sets]
        arena = Arena.create(1, layout.nbytes, "cuda")
        moved = []
        for s, spec in zip(sets, specs):
            views = {k: arena.view(spec[k]) for k in spec}
            for k, view in views.items():
                view.copy_(s[k])
            moved.append({**s, **views})
        sets = moved
    fns = {"candidate": load_module(Path(args.candidate)).kernel}
    fns.update({b.name: b.fn for b in problem.baselines("cuda") if "flash" in b.name})
    out = {}
    for name, fn in fns.items():
        for s in sets:
            fn(**s)
        torch.cuda.synchronize()
        if monitor is not None:
            monitor.enabled = False
        hosts, eagers = [], []
        for _ in range(args.rounds):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for s in sets:
                fn(**s)
            returned = time.perf_counter()
            torch.cuda.synchronize()
            end = time.perf_counter()
            hosts.append((returned - start) / len(sets) * 1e6)
            eagers.append((end - start) / len(sets) * 1e6)
        out[name] = {"host_us": round(statistics.median(hosts), 1), "eager_us": round(statistics.median(eagers), 1)}
    if holder is not None:
        holder.kill()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", default="mla")
    parser.add_argument("--candidate", default=None)
    parser.add_argument("--slots", type=int, default=67)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # a child's
    args = parser.parse_args()
    args.candidate = args.candidate or str(ROOT / "kernels" / "best" / f"{args.problem}.py")
    if args.variant:
        print(json.dumps(child(args)))
        return
    rows = {}
    for _ in range(2):  # each variant twice, in turn: machine drift shows as a difference between the passes
        for variant in VARIANTS:
            cmd = [sys.executable, __file__, "--variant", variant, "--problem", args.problem, "--candidate", args.candidate,
                   "--slots", str(args.slots), "--rounds", str(args.rounds)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            result = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {"error": done.stderr[-1500:]}
            rows.setdefault(variant, []).append(result)
            print(variant, json.dumps(result), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
