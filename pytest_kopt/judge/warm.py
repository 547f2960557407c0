"""A cache warmer: one child of a runner that calls the candidate once on each of its shapes, so
that the Triton kernels of the shapes the correctness stage is about to check compile in parallel
(``Runner.do_warm`` starts several), not one shape at a time inside the checked calls.

It runs where its runner runs (its user, its namespaces, its limits, its environment and so its
candidate's Triton cache: the same trust domain, nothing more) and decides nothing: the inputs are
its own random draws, the outputs are dropped, and what it reports is only how long each shape
took and whether it raised. The verdict's checks are the checked calls that follow, on the
supervisor's inputs, through the runner.

    python -m pytest_kopt.judge.warm --candidate FILE --problem REF --problem-module M --problem-class Q
                                     --device cuda --cases JSON
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import secrets
import signal
import time

PR_SET_PDEATHSIG = 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pytest_kopt.judge.warm")
    parser.add_argument("--candidate", required=True)
    parser.add_argument("--problem", required=True)
    parser.add_argument("--problem-module")
    parser.add_argument("--problem-class")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cases", required=True, help="a JSON list of case dicts")
    parser.add_argument("--parent-pid", type=int, default=0)
    args = parser.parse_args(argv)
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # dies with its runner
    if args.parent_pid and os.getppid() != args.parent_pid:
        os._exit(3)
    from .. import interpret

    interpret.configure()  # before any @triton.jit is defined, as in the runner
    import torch

    from .problemref import resolve_problem

    problem = resolve_problem(args.problem, module=args.problem_module, qualname=args.problem_class)
    from . import fence
    from .runner import import_candidate

    fence.install()  # as in the runner: the candidate meets the same torch in its warmers
    with fence.candidate_running():
        kernel = import_candidate(args.candidate).kernel
    report = []
    for case in json.loads(args.cases):
        started = time.perf_counter()
        error = None
        try:
            inputs = problem.make_inputs(case, device=args.device, seed=secrets.randbits(62))
            with fence.candidate_running():
                kernel(**inputs)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
        except BaseException as exc:  # noqa: BLE001 - the checked call will say what is wrong
            error = f"{type(exc).__name__}: {exc}"[:300]
        report.append({"seconds": time.perf_counter() - started, "error": error})
    print(json.dumps(report), flush=True)
    os._exit(0)  # skip interpreter teardown (CUDA, Triton's caches): the report is out


if __name__ == "__main__":
    main()
