"""A pytest plugin that runs benchmarks/test_headline.py on the CPU as if on a GPU, for its end-to-end test in
tests/test_benchmark_timers.py: `mla-paged`'s headline cases become two small ones, and the module's CUDA events,
device clock and synchronisation become the host's clock, so the whole path (checks, interleaved groups, the figures
handed to pytest-benchmark, its JSON) runs on the interpreter. Each interleaved group's members are appended to the
file KOPT_FAKE_GROUPS names, one line a group."""

from __future__ import annotations

import json
import os
import sys
import time
import types

import pytest
import torch


def pytest_configure(config):
    from pytest_kopt.problems import get_problem

    problem = get_problem("mla-paged")
    type(problem).headline_cases = (problem.smoke_case, {"B": 3, "Sq": 1, "H": 16, "page_size": 16, "lengths": [5, 40, 17]})


class HostEvent:
    """torch.cuda.Event on the host's clock."""

    def __init__(self, enable_timing=True):
        self.at = 0.0

    def record(self, *args):
        self.at = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.at - self.at) * 1e3


class HostClock:
    """pytest_kopt.judge.timing.EventClock's protocol (start and end reads, ``host_times``) on the host's clock."""

    def __init__(self, device):
        self.host_times, self.now, self._start = [], 0.0, None

    def __call__(self):
        now = time.perf_counter()
        if self._start is None:
            self._start = now
            return self.now
        self.host_times.append(now - self._start)
        self.now += now - self._start
        self._start = None
        return self.now


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    for item in items:  # benchmarks/conftest.py skips them without a GPU
        item.own_markers = [m for m in item.own_markers if m.name != "skip"]
    module = next(m for name, m in sys.modules.items() if name.split(".")[-1] == "test_headline")
    module.DEVICE = "cpu"
    module.EventClock = HostClock
    module.torch = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=HostEvent, synchronize=lambda: None,
                                                                    get_device_name=lambda: "host clock"))
    interleave = module.interleave

    def logged(turns, *args, **kwargs):
        with open(os.environ["KOPT_FAKE_GROUPS"], "a", encoding="utf-8") as log:
            log.write(json.dumps(sorted(turns)) + "\n")
        return interleave(turns, *args, **kwargs)

    module.interleave = logged
