"""benchmarks/test_headline.py on the CPU: the eager turn on a fake clock (a round's figure is the wall clock per call,
the GPU waited for, and the host's share beside it is the time until the round's last call returned, per call); the
interleaved groups (a case's implementations of one timer timed together, turn by turn in shuffled orders, and each
test's figures handed to pytest-benchmark); and the correctness check's inputs, which are each implementation's own."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

HEADLINE = Path(__file__).resolve().parents[1] / "benchmarks" / "test_headline.py"


def headline():
    """benchmarks/test_headline.py as a fresh module (registered while it runs: its dataclass looks itself up)."""
    spec = importlib.util.spec_from_file_location("headline_benchmarks", HEADLINE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_an_eager_turn_records_the_host_share_per_call(monkeypatch):
    module = headline()
    clock = {"now": 100.0, "gpu_busy_until": 0.0}

    def sync_perf_counter():  # waits for the GPU, as the real one does
        clock["now"] = max(clock["now"], clock["gpu_busy_until"])
        return clock["now"]

    monkeypatch.setattr(module, "sync_perf_counter", sync_perf_counter)
    monkeypatch.setattr(module, "time", types.SimpleNamespace(perf_counter=lambda: clock["now"]))
    work = iter([(0.020, 0.050), (0.080, 0.010)])  # (host, GPU) seconds of each turn's four calls

    def call():
        if call.count % 4 == 0:
            host_s, gpu_s = next(work)
            clock["gpu_busy_until"] = clock["now"] + gpu_s  # the four calls' work, queued
            clock["now"] += host_s  # the four calls, as the caller's thread spends them
        call.count += 1

    call.count = 0
    turn = module.eager_turn([call] * 4)
    figures = [turn()[0] for _ in range(2)]
    assert [host for _, host in figures] == pytest.approx([0.020 / 4, 0.080 / 4])  # the host's part, per call
    assert [seconds for seconds, _ in figures] == pytest.approx([0.050 / 4, 0.080 / 4])  # whichever took longer


def test_a_replay_gives_pytest_benchmark_the_figures_measured_before():
    """pytest-benchmark reads its timer before and after each round of a no-op: the rounds' durations are the figures
    handed over, in order, and the timer is named for the clock that measured them."""
    module = headline()
    figures = [3e-6, 1e-6, 2e-6]
    timer = module.Replay(figures, "EventClock")
    durations = []
    for _ in figures:
        start = timer()
        end = timer()
        durations.append(end - start)
    assert durations == pytest.approx(figures)
    assert timer.__name__ == "EventClock, interleaved"


def test_interleaving_shuffles_turns_keeps_warmup_out_and_isolates_a_failure():
    module = headline()
    log = []

    def turn(name, fail_at=None):
        def run():
            log.append(name)
            if fail_at is not None and log.count(name) == fail_at:
                raise RuntimeError(f"{name} broke")
            return [(float(len(log)), 0.5), (float(len(log)) + 0.25, None)]  # two calls a turn; one without host time
        return run

    timed = module.interleave({"a": turn("a"), "b": turn("b"), "c": turn("c", fail_at=3)}, rounds=20, warmup_rounds=1, seed=7)
    rounds = [log[i:i + 3] for i in range(0, 6, 3)]  # the two rounds before c broke: each has every member once
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds)
    orders = {tuple(name for name in log if name != "c")[i:i + 2] for i in range(6, 30, 2)}
    assert len(orders) == 2  # with c out, a and b still trade places
    assert len(timed["a"].seconds) == 2 * 20 and len(timed["a"].host) == 20  # warm-up round out, host where given
    assert timed["a"].seconds[0] > 3  # the first kept figure is from the second round
    assert isinstance(timed["c"].error, RuntimeError) and log.count("c") == 3
    assert module.round_orders(["x", "y", "z"], 4, seed=1) == module.round_orders(["x", "y", "z"], 4, seed=1)


def test_a_group_is_its_selected_implementations_timed_once(monkeypatch):
    """The first test of (case, timer) times every implementation the session selected for them, together; the
    group's other tests reuse those figures; another case or timer is another group; without interleaving, each
    implementation alone."""
    module = headline()
    from pytest_kopt.problems import get_problem

    problem = get_problem("mla-paged")
    case, other = problem.headline_cases[:2]
    item = lambda impl, c=case, metric="device": types.SimpleNamespace(  # noqa: E731
        callspec=types.SimpleNamespace(params={"problem_name": "mla-paged", "case": c, "impl": impl, "metric": metric}))
    items = [item("baseline:flashmla"), item("candidate:best"), item("candidate:file=x.py"), item("candidate:best", other),
             item("candidate:best", metric="eager"), types.SimpleNamespace()]
    built = []
    monkeypatch.setattr(module, "DEVICE", "cpu")
    monkeypatch.setattr(module, "implementation", lambda problem, name, impl: (0, lambda **inputs: None))
    monkeypatch.setattr(module, "_call_seconds", lambda fn, inputs: 1e-3)
    monkeypatch.setattr(module, "_turn", lambda fn, inputs, sets, metric: (built.append(metric) or (lambda: [(1e-3, 1e-4)]), 7))
    monkeypatch.setattr(module, "SECONDS_PER_BENCHMARK", 0.05)
    module._group.clear()
    group = module.group_figures(items, problem, "mla-paged", case, "device", "candidate:best")
    assert sorted(group) == ["baseline:flashmla", "candidate:best", "candidate:file=x.py"] and built == ["device"] * 3
    assert len(group["candidate:best"].seconds) == 10 and group["candidate:best"].window == 7  # 50 calls / 5 a turn
    assert module.group_figures(items, problem, "mla-paged", case, "device", "baseline:flashmla") is group and len(built) == 3
    assert sorted(module.group_figures(items, problem, "mla-paged", case, "eager", "candidate:best")) == ["candidate:best"]
    monkeypatch.setattr(module, "INTERLEAVE", False)
    assert sorted(module.group_figures(items, problem, "mla-paged", case, "device", "candidate:file=x.py")) == ["candidate:file=x.py"]
    module._group.clear()


def test_an_implementation_that_fails_or_cannot_be_captured_is_reported_by_its_own_test(monkeypatch):
    module = headline()
    from pytest_kopt.problems import get_problem

    problem = get_problem("mla-paged")
    case = problem.headline_cases[0]
    items = [types.SimpleNamespace(callspec=types.SimpleNamespace(params={"problem_name": "mla-paged", "case": case,
                                                                          "impl": impl, "metric": "graph"}))
             for impl in ("baseline:torch", "candidate:best", "candidate:file=broken.py")]

    def fn_of(problem, name, impl):
        if impl.endswith("broken.py"):
            raise ImportError("no kernel")
        return 0, (lambda **inputs: None)

    monkeypatch.setattr(module, "DEVICE", "cpu")
    monkeypatch.setattr(module, "implementation", fn_of)
    monkeypatch.setattr(module, "_call_seconds", lambda fn, inputs: 1e-3)
    turns = {"baseline:torch": "not graph-safe: capture failed", "candidate:best": lambda: [(1e-3, None)]}
    monkeypatch.setattr(module, "_turn", lambda fn, inputs, sets, metric: (turns.pop(next(iter(turns))), None))
    module._group.clear()
    group = module.group_figures(items, problem, "mla-paged", case, "graph", "candidate:best")
    assert group["baseline:torch"].skip.startswith("not graph-safe") and not group["baseline:torch"].seconds
    assert isinstance(group["candidate:file=broken.py"].error, ImportError)
    assert len(group["candidate:best"].seconds) >= 5
    module._group.clear()


def test_each_implementation_is_checked_on_inputs_of_its_own():
    """The correctness check's seed differs between implementations (an output left unwritten then cannot hold another
    implementation's answer to the same inputs) and is never a timing set's (1234 and the eager sets after it)."""
    module = headline()
    impls = ["baseline:flashmla", "baseline:torch-eager", "candidate:baseline", "candidate:best", "candidate:file=x.py"]
    seeds = [module.check_seed(i) for i in impls]
    assert len(set(seeds)) == len(seeds)
    assert all(s >= 10_000 and s not in range(1234, 1234 + module.EAGER_SETS) for s in seeds)
    assert module.check_seed("candidate:best") == module.check_seed("candidate:best")  # the same run to run


def test_the_benchmark_runs_end_to_end_on_the_host_clock(tmp_path):
    """benchmarks/test_headline.py itself, on the CPU with the host's clock standing in for CUDA's (tests/fake_cuda_bench.py):
    each (case, timer) group is timed once with both selected implementations in it, every test reports its own
    implementation's figures under the interleaved timer's name, and pytest-benchmark's JSON holds them."""
    import json
    import os
    import subprocess

    root = Path(__file__).resolve().parents[1]
    groups, out = tmp_path / "groups.jsonl", tmp_path / "bench.json"
    env = {**os.environ, "KOPT_BENCH_SECONDS": "0.01", "TRITON_INTERPRET": "1", "KOPT_FAKE_GROUPS": str(groups),
           "PYTHONPATH": os.pathsep.join([str(root / "tests"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "fake_cuda_bench", "-p", "no:cacheprovider", "-q",
                           "benchmarks/test_headline.py", "-k", "mla-paged and (torch-eager or candidate:best) and not graph",
                           f"--benchmark-json={out}"], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    members = ["baseline:torch-eager-gather-bf16", "candidate:best"]
    assert [json.loads(line) for line in groups.read_text().splitlines()] == [members] * 4  # 2 cases x device, eager
    benches = json.loads(out.read_text())["benchmarks"]
    assert len(benches) == 8
    for bench in benches:
        metric, impl = bench["extra_info"]["metric"], bench["params"]["impl"]
        assert bench["options"]["timer"] == ("EventClock" if metric == "device" else "PerCall") + ", interleaved"
        assert bench["extra_info"]["interleaved_with"] == [m for m in members if m != impl]
        assert bench["stats"]["rounds"] >= 5 and bench["stats"]["median"] > 0 and bench["extra_info"]["host_us"] > 0
