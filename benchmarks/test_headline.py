"""Headline benchmarks of every built-in problem: baselines, the baseline candidate, the best kernel,
each with the three timers of pytest_kopt.judge.timing (the test id ends in the timer):

- ``device``: CUDA events around one call after an L2 flush and a GPU-side wait long enough for
  the host to enqueue the call: the kernels' device time;
- ``eager``: wall clock of ``EAGER_SETS`` calls back to back on different input sets, waited for
  once: what a caller without CUDA graphs pays per call, host time included (``host_us`` beside it: the
  time until the last call returned, per call: what the calls cost the caller's thread);
- ``graph``: the same calls captured in one CUDA graph and replayed (the timer divides by the
  number of calls, so the figure is per call); not capturable is skipped, not failed.

The implementations of one case and timer are timed interleaved (``KOPT_BENCH_INTERLEAVE=0``: each test on its own,
one after the other): the first of the case's tests times every implementation the run selected, turn by turn in an
order shuffled every turn (``round_orders``) on the same inputs, and each test hands its own implementation's figures
to pytest-benchmark (``Replay``). Timed one after the other, a file's place in the process moved B128 long-tail by
1-2 us (H200, session 46), as much as the gaps being decided; interleaved, a byte-identical copy of a file read within
0.1 us of it. Each test still checks its own implementation's output first.
"""

from __future__ import annotations

import gc
import math
import os
import random
import statistics
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

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
INTERLEAVE = os.environ.get("KOPT_BENCH_INTERLEAVE", "1") != "0"  # the case's implementations timed turn by turn
DEVICE_TURN = 5  # device-timed calls an implementation makes in a row, interleaved, before the next one's turn


def implementations(problem_name: str) -> list[tuple[str, int]]:
    """(name, order) of what is timed for a problem; order 0 is the speedup reference."""
    names = ["baseline:" + b.name for b in get_problem(problem_name).baselines(DEVICE if torch.cuda.is_available() else "cpu")]
    names.append("candidate:baseline")
    if (KERNELS_DIR / "best" / f"{problem_name}.py").exists():
        names.append("candidate:best")
    names += [f"candidate:file={path}" for problem, path in EXTRA if problem == problem_name]
    return names


def params():
    """Every (problem, case, implementation, timer); a case's implementations of one timer in a row, the group that is
    timed interleaved."""
    for problem_name in PROBLEMS:
        problem = get_problem(problem_name)
        for case in problem.headline_cases:
            for metric in METRICS:
                for impl in implementations(problem_name):
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
    """The reference's outputs for an implementation's check inputs, ``key`` (problem, case label, implementation):
    kept while the case's tests run, dropped when the next case starts (headline references are large)."""
    if _truth_cache.get("case") != key[:2]:
        _truth_cache.clear()
        _truth_cache["case"] = key[:2]
    if key not in _truth_cache:
        _truth_cache[key] = problem.reference(**inputs)
    return _truth_cache[key]


_loaded: dict = {}


def implementation(problem, problem_name: str, impl: str) -> tuple[int, Callable[..., Any]]:
    """(order, callable) of ``impl``, loaded once a session: a test and its case's interleaved group call the same
    function (its plans, compiled kernels and scratch)."""
    key = (problem_name, impl)
    if key not in _loaded:
        kind, name = impl.split(":", 1)
        if kind == "baseline":
            _loaded[key] = [(i, b.fn) for i, b in enumerate(problem.baselines(DEVICE)) if b.name == name][0]
        else:
            order = 10 if name == "baseline" else 20
            path = problem.baseline_candidate_path if name == "baseline" else KERNELS_DIR / "best" / f"{problem_name}.py"
            if name.startswith("file="):
                order, path = 30, Path(name[len("file="):])
            _loaded[key] = (order, load_kernel(path))  # a trusted file of this repository: benchmarks time our own files only
    return _loaded[key]


# ---- interleaved groups: a case's implementations of one timer, timed turn by turn ----------------------------------
def round_orders(names: list[str], rounds: int, seed: int = 0) -> list[list[str]]:
    """The order of the implementations in each round: a seeded shuffle, so no implementation always runs right
    after the same other one. Rotating a fixed order (each one first in turn) left every implementation the same
    predecessor, and the one timed right after FlashMLA read 0.3-6 us more a call at 15 of 16 B1 figures, whichever
    file it was (H200, results/h200-2026-12-03d calls 4 and 5: the same files in two listing orders)."""
    rng = random.Random(seed)
    return [rng.sample(names, len(names)) for _ in range(rounds)]


class Replay:
    """A pytest-benchmark timer that hands back figures measured before, one a round: a test of an interleaved group
    gives its implementation's figures to ``benchmark.pedantic`` of a no-op, which reads the timer before and after
    each round. Its name says which clock measured them."""

    def __init__(self, seconds: list[float], clock: str) -> None:
        self.__name__ = f"{clock}, interleaved"
        self._seconds = iter(seconds)
        self._open = False
        self.now = 0.0

    def __call__(self) -> float:
        if self._open:
            self.now += next(self._seconds)
        self._open = not self._open
        return self.now


@dataclass
class Timed:
    """One implementation's figures in its group: seconds per call, one a round; the host's seconds per call beside
    them (eager and device); or why it has none (``skip``: not graph-safe; ``error``: it raised)."""

    seconds: list[float] = field(default_factory=list)
    host: list[float] = field(default_factory=list)
    window: int | None = None
    skip: str | None = None
    error: BaseException | None = None


def interleave(turns: dict[str, Callable[[], list[tuple[float, float | None]]]], rounds: int, warmup_rounds: int,
               seed: int) -> dict[str, Timed]:
    """``rounds`` rounds (after ``warmup_rounds`` not kept) of each implementation's turn, in an order shuffled every
    round. A turn returns its calls' (seconds, host seconds or None). An implementation whose turn raises is out of the
    later rounds, its error kept."""
    timed = {name: Timed() for name in turns}
    for number, order in enumerate(round_orders(list(turns), warmup_rounds + rounds, seed)):
        for name in order:
            if timed[name].error is not None:
                continue
            try:
                figures = turns[name]()
            except Exception as exc:  # noqa: BLE001 - the implementation's test reports it
                timed[name].error = exc
                continue
            if number >= warmup_rounds:
                timed[name].seconds += [seconds for seconds, _ in figures]
                timed[name].host += [host for _, host in figures if host is not None]
    return timed


_group: dict = {}  # the group being timed: {"key": (problem, case label, timer), "timed": {impl: Timed}}


def group_figures(items, problem, problem_name: str, case: dict, metric: str, impl: str) -> dict[str, Timed]:
    """Every selected implementation of (case, timer) timed interleaved, once, by the first of the group's tests to
    ask (``items``: the session's tests, the group's members among them); without INTERLEAVE, ``impl`` alone."""
    label = problem.describe(case)
    key = (problem_name, label, metric) if INTERLEAVE else (problem_name, label, metric, impl)
    if _group.get("key") == key:
        return _group["timed"]
    _group.clear()  # the last group's graphs and inputs go
    members = [item.callspec.params["impl"] for item in items if hasattr(item, "callspec")
               and item.callspec.params.get("problem_name") == problem_name and item.callspec.params.get("metric") == metric
               and isinstance(item.callspec.params.get("case"), dict) and problem.describe(item.callspec.params["case"]) == label]
    members = members if INTERLEAVE and impl in members else [impl]
    inputs = problem.make_inputs(case, device=DEVICE, seed=1234)
    sets = [inputs] + ([problem.make_inputs(case, device=DEVICE, seed=1235 + i) for i in range(EAGER_SETS - 1)]
                       if metric != "device" else [])
    turns, timed, call_seconds = {}, {}, []
    for member in dict.fromkeys(members):
        try:
            _, fn = implementation(problem, problem_name, member)
            fn(**inputs)  # compile and autotune stay out of the figures
            call_seconds.append(_call_seconds(fn, inputs))
            turn, window = _turn(fn, inputs, sets, metric)
        except Exception as exc:  # noqa: BLE001 - its own test reports it
            timed[member] = Timed(error=exc)
            continue
        if isinstance(turn, str):
            timed[member] = Timed(skip=turn)
            continue
        turns[member] = turn
        timed[member] = Timed(window=window)
    # SECONDS_PER_BENCHMARK a member, as when each test timed itself: calls enough for that at the members' mean time
    calls = rounds_for(statistics.mean(call_seconds or [0.0]), budget_s=SECONDS_PER_BENCHMARK, lo=5, hi=200)
    rounds = math.ceil(calls / DEVICE_TURN) if metric == "device" else max(5, calls // EAGER_SETS)
    collect = gc.isenabled()
    gc.disable()  # no collection inside a timed call
    try:
        measured = interleave(turns, rounds, warmup_rounds=1, seed=zlib.crc32(repr(key).encode()))
    finally:
        if collect:
            gc.enable()
    for member, figures in measured.items():
        figures.window = timed[member].window
        timed[member] = figures
    _group.update(key=key, timed=timed)
    return timed


def _call_seconds(fn, inputs) -> float:
    """One call's device time (CUDA events around it): what sizes the rounds."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn(**inputs)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _turn(fn, inputs, sets, metric):
    """(a turn of ``fn`` on the metric's clock, or why it cannot be timed; the GPU's wait for the host after a flush)."""
    if metric == "device":
        window = host_window_cycles(enqueue_seconds(lambda: fn(**inputs), DEVICE))  # the GPU waits this long for the host
        return device_turn(lambda: fn(**inputs), window, EventClock(DEVICE)), window  # a clock of its own: a turn that
        # raises leaves only its own clock half read
    calls = [lambda s=s: fn(**s) for s in sets]
    if metric == "eager":
        return eager_turn(calls), None
    graphs, why = capture_graphs([lambda: [c() for c in calls]], DEVICE)
    if graphs is None:
        return f"not graph-safe: {why}", None
    return graph_turn(graphs[0][0].replay, len(calls)), None


def device_turn(call, window, clock):
    """DEVICE_TURN calls, each after an L2 flush and a GPU-side wait of ``window`` cycles (the host's time to enqueue
    it), between the events of ``clock`` (EventClock): (device seconds, host seconds in the call) of each."""
    def turn():
        figures = []
        for _ in range(DEVICE_TURN):
            flush_l2(DEVICE, window)
            began = clock()
            call()
            figures.append((clock() - began, clock.host_times[-1]))
        return figures

    return turn


def eager_turn(calls):
    """The calls back to back, waited for once: (seconds per call until the GPU is done, seconds per call until the
    last call returned: what the calls cost the caller's thread)."""
    def turn():
        began = sync_perf_counter()
        for call in calls:
            call()
        returned = time.perf_counter()
        return [((sync_perf_counter() - began) / len(calls), (returned - began) / len(calls))]

    return turn


def graph_turn(replay, calls: int):
    """One replay of a graph of ``calls`` calls, waited for: seconds per call."""
    def turn():
        began = sync_perf_counter()
        replay()
        return [((sync_perf_counter() - began) / calls, None)]

    return turn


@pytest.mark.parametrize("problem_name,case,impl,metric", list(params()))
def test_headline(benchmark, request, problem_name, case, impl, metric):
    """The implementation's output checked on inputs of its own, then its figures from its group (``group_figures``)
    given to pytest-benchmark."""
    problem = get_problem(problem_name)
    label = problem.describe(case)
    kind, name = impl.split(":", 1)
    order, fn = implementation(problem, problem_name, impl)
    check_inputs = problem.make_inputs(case, device=DEVICE, seed=check_seed(impl))
    outputs = fn(**check_inputs)
    torch.cuda.synchronize()
    errors = problem.compare(outputs, truth(problem, case, check_inputs, (problem_name, label, impl)))
    del outputs, check_inputs
    worst = max(e.rel_rms for e in errors)
    if kind == "candidate":
        failed = [e.reason for e in errors if not e.ok]
        assert not failed, f"{impl} is wrong on {label}: {failed}"

    cost = problem.cost(case)
    benchmark.group = f"{problem_name} {label} [{metric}]"
    benchmark.extra_info.update(
        impl=name, kind=kind, order=order, case=label, rel_rms=worst, metric=metric,
        floor_us=cost.floor_seconds(H200_COPY_BYTES_PER_S, H200_BF16_FLOPS_PER_S) * 1e6,
        bytes=cost.bytes, flops=cost.flops, gpu=torch.cuda.get_device_name(),
    )
    if metric != "device":
        benchmark.extra_info["calls_per_round"] = EAGER_SETS
    group = group_figures(request.session.items, problem, problem_name, case, metric, impl)
    mine = group[impl]
    if mine.error is not None:
        raise mine.error
    if mine.skip is not None:
        pytest.skip(f"{impl} is {mine.skip}")
    benchmark._timer = Replay(mine.seconds, "EventClock" if metric == "device" else "PerCall")
    benchmark.pedantic(lambda: None, rounds=len(mine.seconds))
    benchmark.extra_info["interleaved_with"] = sorted(m for m, timed in group.items() if m != impl and timed.seconds)
    if mine.host:
        benchmark.extra_info["host_us"] = statistics.median(mine.host) * 1e6  # the caller's thread per call
    if metric == "device":
        benchmark.extra_info["host_window_us"] = mine.window / MAX_GPU_CLOCK_HZ * 1e6
        benchmark.extra_info["host_bound"] = is_host_bound(statistics.median(mine.host), mine.window)
