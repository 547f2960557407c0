"""benchmarks/test_headline.py on the CPU: the eager timer on a fake clock (a round's figure is the wall clock per call,
the GPU waited for, and the host's share beside it is the time until the round's last call returned, per call), and
the correctness check's inputs, which are each implementation's own."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import pytest

HEADLINE = Path(__file__).resolve().parents[1] / "benchmarks" / "test_headline.py"


def test_eager_rounds_record_the_host_share_per_call(monkeypatch):
    spec = importlib.util.spec_from_file_location("headline_benchmarks", HEADLINE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    clock = {"now": 100.0, "gpu_busy_until": 0.0}

    def sync_perf_counter():  # waits for the GPU, as the real one does
        clock["now"] = max(clock["now"], clock["gpu_busy_until"])
        return clock["now"]

    monkeypatch.setattr(module, "sync_perf_counter", sync_perf_counter)
    monkeypatch.setattr(module, "time", types.SimpleNamespace(perf_counter=lambda: clock["now"]))
    timer = module.PerCall(4)
    figures = []
    for host_s, gpu_s in ((0.020, 0.050), (0.080, 0.010)):
        start = timer()
        clock["gpu_busy_until"] = clock["now"] + gpu_s  # the four calls' work, queued
        clock["now"] += host_s  # the four calls, as the caller's thread spends them
        timer.returned()
        figures.append(timer() - start)
    assert timer.host_seconds == pytest.approx([0.020 / 4, 0.080 / 4])  # the host's part, per call
    assert figures == pytest.approx([0.050 / 4, 0.080 / 4])  # the round: whichever of host and GPU took longer


def test_each_implementation_is_checked_on_inputs_of_its_own():
    """The correctness check's seed differs between implementations (an output left unwritten then cannot hold another
    implementation's answer to the same inputs) and is never a timing set's (1234 and the eager sets after it)."""
    spec = importlib.util.spec_from_file_location("headline_benchmarks", HEADLINE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    impls = ["baseline:flashmla", "baseline:torch-eager", "candidate:baseline", "candidate:best", "candidate:file=x.py"]
    seeds = [module.check_seed(i) for i in impls]
    assert len(set(seeds)) == len(seeds)
    assert all(s >= 10_000 and s not in range(1234, 1234 + module.EAGER_SETS) for s in seeds)
    assert module.check_seed("candidate:best") == module.check_seed("candidate:best")  # the same run to run
