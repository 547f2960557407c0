"""Headline benchmarks of every built-in problem: baselines, the baseline candidate, the best kernel,
each with the three timers of pytest_kopt.judge.timing (the test id ends in the timer):

- ``device``: CUDA events around one call after an L2 flush and a GPU-side wait long enough for
  the host to enqueue the call: the kernels' device time;
- ``eager``: wall clock of ``EAGER_SETS`` calls back to back on different input sets, waited for
  once: what a caller without CUDA graphs pays per call, host time included (``host_us`` beside it: the
  time until the last call returned, per call: what the calls cost the caller's thread);
- ``graph``: the same calls captured in one CUDA graph and replayed (the timer divides by the
  number of calls, so the figure is per call); not capturable is skipped, not failed.
"""

from __future__ import annotations

import os
import time
import zlib
from pathlib import Path

import pytest
import torch

from pytest_kopt import KERNELS_DIR, bench_extra
from pytest_kopt.gate import load_kernel
from pytest_kopt.judge.timing import (
    MAX_GPU_CLOCK_HZ, METRICS, EventClock, capture_graphs, enqueue_seconds, flush_l2, host_window_cycles, is_host_bound, rounds_for,
    sync_perf_counter,
)
from pytest_kopt.problems import get_problem
from pytest_kopt.problems.base import H200_BF16_FLOPS_PER_S, H200_COPY_BYTES_PER_S

PROBLEMS = ("kda", "mla", "mla-prefill", "mla-paged")
DEVICE = "cuda"
SECONDS_PER_BENCHMARK = float(os.environ.get("KOPT_BENCH_SECONDS", 4.0))
# more candidate files to time beside the best: "kda=path.py,mla=other.py" (a dev comparison in one run)
EXTRA = bench_extra.parse(os.environ.get("KOPT_BENCH_EXTRA", ""), PROBLEMS, Path.cwd())  # paths as the run loads them
EAGER_SETS = 8  # input sets per eager or graph round (several times the L2 at the headline shapes)


def implementations(problem_name: str) -> list[tuple[str, int]]:
    """(name, order) of what is timed for a problem; order 0 is the speedup reference."""
    names = ["baseline:" + b.name for b in get_problem(problem_name).baselines(DEVICE if torch.cuda.is_available() else "cpu")]
    names.append("candidate:baseline")
    if (KERNELS_DIR / "best" / f"{problem_name}.py").exists():
        names.append("candidate:best")
    names += [f"candidate:file={path}" for problem, path in EXTRA if problem == problem_name]
    return names


def params():
    for problem_name in PROBLEMS:
        problem = get_problem(problem_name)
        for case in problem.headline_cases:
            for impl in implementations(problem_name):
                for metric in METRICS:
                    yield pytest.param(problem_name, case, impl, metric,
                                       id=f"{problem_name}-{problem.describe(case).replace(' ', '_')}-{impl}-{metric}")


_truth_cache: dict = {}


def check_seed(impl: str) -> int:
    """The seed of an implementation's own inputs for its correctness check. An output it left unwritten would hold
    memory the caching allocator handed back from the test before, which on shared inputs may be another
    implementation's right answer (tools/dev_mla_paged.py passed a file that skipped its merge that way); on inputs of
    its own it is wrong. Never one of the timing sets' seeds (1234 onwards)."""
    return 10_000 + zlib.crc32(impl.encode()) % 1_000_000


def truth(problem, case, inputs, key):
    if key not in _truth_cache:
        _truth_cache.clear()  # one (case, implementation) at a time: headline references are large
        _truth_cache[key] = problem.reference(**inputs)
    return _truth_cache[key]


CLOCK = EventClock(DEVICE)


class PerCall:
    """A pytest-benchmark timer for rounds of ``calls`` calls: synchronised wall clock / calls. A round that calls
    ``returned()`` after its last call also records the host's share: the time from the round's start until that
    call returned (before the wait for the GPU), per call (``host_us``: what the calls cost the caller's thread)."""

    __name__ = "PerCall"

    def __init__(self, calls: int) -> None:
        self.calls = calls
        self.host_seconds: list[float] = []
        self._read_at = 0.0

    def __call__(self) -> float:
        now = sync_perf_counter()
        self._read_at = now
        return now / self.calls

    def returned(self) -> None:
        self.host_seconds.append((time.perf_counter() - self._read_at) / self.calls)


@pytest.mark.parametrize("problem_name,case,impl,metric", list(params()))
@pytest.mark.benchmark(disable_gc=True)
def test_headline(benchmark, problem_name, case, impl, metric):
    problem = get_problem(problem_name)
    label = problem.describe(case)
    inputs = problem.make_inputs(case, device=DEVICE, seed=1234)
    kind, name = impl.split(":", 1)
    if kind == "baseline":
        order, fn = [(i, b.fn) for i, b in enumerate(problem.baselines(DEVICE)) if b.name == name][0]
    else:
        order = 10 if name == "baseline" else 20
        path = problem.baseline_candidate_path if name == "baseline" else KERNELS_DIR / "best" / f"{problem_name}.py"
        if name.startswith("file="):
            order, path = 30, Path(name[len("file="):])
        fn = load_kernel(path)  # a trusted file of this repository: benchmarks time our own files only

    fn(**inputs)  # warm-up call: compile and autotune stay out of the figure
    check_inputs = problem.make_inputs(case, device=DEVICE, seed=check_seed(impl))
    outputs = fn(**check_inputs)
    torch.cuda.synchronize()
    errors = problem.compare(outputs, truth(problem, case, check_inputs, (problem_name, label, impl)))
    del outputs, check_inputs
    worst = max(e.rel_rms for e in errors)
    if kind == "candidate":
        failed = [e.reason for e in errors if not e.ok]
        assert not failed, f"{impl} is wrong on {label}: {failed}"

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn(**inputs)
    end.record()
    end.synchronize()
    rounds = rounds_for(start.elapsed_time(end) / 1e3, budget_s=SECONDS_PER_BENCHMARK, lo=5, hi=200)

    cost = problem.cost(case)
    benchmark.group = f"{problem_name} {label} [{metric}]"
    benchmark.extra_info.update(
        impl=name, kind=kind, order=order, case=label, rel_rms=worst, metric=metric,
        floor_us=cost.floor_seconds(H200_COPY_BYTES_PER_S, H200_BF16_FLOPS_PER_S) * 1e6,
        bytes=cost.bytes, flops=cost.flops, gpu=torch.cuda.get_device_name(),
    )
    if metric != "device":
        sets = [inputs] + [problem.make_inputs(case, device=DEVICE, seed=1235 + i) for i in range(EAGER_SETS - 1)]
        calls = [lambda s=s: fn(**s) for s in sets]
        timer = benchmark._timer = PerCall(len(calls))
        if metric == "eager":
            eager_rounds = max(5, rounds // len(calls))
            benchmark.pedantic(lambda: ([c() for c in calls], timer.returned()), rounds=eager_rounds, warmup_rounds=1)
            host = sorted(timer.host_seconds[-eager_rounds:])  # the warm-up round first
            benchmark.extra_info["host_us"] = host[len(host) // 2] * 1e6  # back to back: the caller's thread per call
        else:
            graphs, why = capture_graphs([lambda: [c() for c in calls]], DEVICE)
            if graphs is None:
                pytest.skip(f"{impl} is not graph-safe: {why}")
            benchmark.pedantic(graphs[0][0].replay, rounds=max(5, rounds // len(calls)), warmup_rounds=1)
        benchmark.extra_info["calls_per_round"] = len(calls)
        return
    benchmark._timer = CLOCK
    window = host_window_cycles(enqueue_seconds(lambda: fn(**inputs), DEVICE))  # the GPU waits this long for the host
    benchmark.pedantic(lambda: fn(**inputs), setup=lambda: flush_l2(DEVICE, window), rounds=rounds, warmup_rounds=3)
    host = sorted(CLOCK.host_times[-rounds:])
    benchmark.extra_info["host_us"] = host[len(host) // 2] * 1e6  # device time is the figure; host time beside it
    benchmark.extra_info["host_window_us"] = window / MAX_GPU_CLOCK_HZ * 1e6
    benchmark.extra_info["host_bound"] = is_host_bound(host[len(host) // 2], window)
