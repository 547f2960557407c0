"""The judge's building blocks, in process: the runner's dispatch guard, poison and aliasing
checks, and the one timer (processes and isolation: test_judge_isolation.py)."""

from __future__ import annotations

import time

import pytest
import torch

from pytest_kopt.judge import checks, timing


def test_guard_records_torch_math_but_not_allocation_views_and_copies() -> None:
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with checks.CallGuard() as guard:
        out = torch.empty(8, 8)
        out.copy_(a.t().contiguous().view(64).view(8, 8))
        torch.zeros_like(b).fill_(1.5)
    assert not guard.forbidden
    with checks.CallGuard() as guard:
        torch.mm(a, b)
        getattr(torch, "ein" + "sum")("ij,jk->ik", a, b)
        a.softmax(-1)
    assert "aten.mm" in guard.forbidden and "aten._softmax" in guard.forbidden, guard.forbidden
    assert sum(guard.forbidden.values()) >= 3


def test_fresh_empty_memory_is_poisoned_and_unwritten_elements_are_counted_exactly() -> None:
    with checks.CallGuard() as guard:
        out = torch.empty(5, 7, dtype=torch.bfloat16)
        half = torch.empty(9, dtype=torch.float32)
    assert checks.unwritten(out) == 35 and checks.unwritten(half) == 9
    assert torch.isnan(out.float()).all()  # the pattern is a NaN: unwritten output never passes
    out[1:3].copy_(torch.randn(2, 7))
    half[:4] = torch.rand(4) + 1.0
    assert checks.unwritten(out) == 21 and checks.unwritten(half) == 5
    assert {checks._storage_key(out), checks._storage_key(half)} <= guard.fresh


def test_outputs_from_before_the_call_are_not_fresh() -> None:
    cached = torch.randn(16)
    with checks.CallGuard() as guard:
        view = cached.view(4, 4)
        new = cached.clone()
    assert checks._storage_key(view) not in guard.fresh
    assert checks._storage_key(new) in guard.fresh


def test_overlap_follows_views_and_strides() -> None:
    base = torch.randn(4, 10)
    assert checks.overlaps(base[1], base[1, 3:])
    assert not checks.overlaps(base[0], base[1])
    assert checks.overlaps(base.t(), base[3])
    assert not checks.overlaps(base, torch.randn(4, 10))


def test_inspect_call_names_every_dishonest_thing() -> None:
    x, y = torch.randn(3, 5), torch.randn(3, 5)
    inputs = {"x": x, "y": y}
    before = checks.snapshot_inputs(inputs)
    monitor = checks.LaunchMonitor()  # never installed: zero launches
    with checks.CallGuard() as guard:
        out = torch.empty(3, 5)
        y.add_(1.0)
    reasons = checks.inspect_call(outputs=(out, x[0]), output_names=["out", "x_alias"], inputs=inputs, before=before,
                                  guard=guard, monitor=monitor, expected_dtypes={"out": torch.bfloat16}, device=torch.device("cpu"))
    text = "\n".join(reasons)
    for expected in ("no Triton kernel was launched", "aten.add_", "15 of 15 elements were never written",
                     "output x_alias aliases input x", "not allocated during this call", "dtype torch.float32, expected torch.bfloat16",
                     "input y was modified"):
        assert expected in text, text




def test_one_timer_on_cpu_goes_through_pytest_benchmark() -> None:
    data = torch.randn(1000)
    calls = []
    meta = timing.benchmark(lambda: calls.append(data.sum()), device="cpu", name="sum", group="unit", rounds=4, warmup_rounds=2)
    assert len(calls) == 6 and meta.stats.rounds == 4
    assert 0 < meta.stats.min <= meta.stats.median <= meta.stats.max
    document = timing.benchmark_json([meta.as_dict(include_data=True)], machine_info={}, commit_info={})
    assert document["benchmarks"][0]["stats"]["data"] and document["benchmarks"][0]["group"] == "unit"
    assert timing.timer_for("cpu") is timing.sync_perf_counter


def test_median_without_pytest_benchmark_runs_every_round_after_its_flush() -> None:
    order = []
    us = timing.median_us(lambda: order.append("call"), "cpu", rounds=5, warmup_rounds=2, after_flush=lambda: order.append("flushed"))
    assert order == ["flushed", "call"] * 7 and us > 0


def test_host_window_covers_the_call_and_is_capped() -> None:
    assert timing.host_window_cycles(0.0) == timing.HOST_WINDOW_CYCLES  # never below the default ~1 ms
    assert timing.host_window_cycles(0.004) == int(1.5 * 0.004 * timing.MAX_GPU_CLOCK_HZ)  # grows with the call
    assert timing.host_window_cycles(0.013) == int(1.5 * 0.013 * timing.MAX_GPU_CLOCK_HZ)  # 19.5 ms: still waited for
    assert timing.host_window_cycles(0.045) == timing.HOST_WINDOW_CYCLES  # hopelessly host-bound: not waited for
    assert timing.is_host_bound(0.045, timing.host_window_cycles(0.045))
    # 1.3 ms of host time (fla's chunk_kda at B8 T1024) outlasts the default wait, not its own window
    assert timing.is_host_bound(0.0013, timing.HOST_WINDOW_CYCLES)
    assert not timing.is_host_bound(0.0013, timing.host_window_cycles(0.0013))


def test_enqueue_seconds_times_the_host_side_on_an_idle_gpu(monkeypatch) -> None:
    syncs = []
    monkeypatch.setattr(timing, "_synchronize", lambda: syncs.append(1))
    calls = []
    seconds = timing.enqueue_seconds(lambda: (calls.append(1), time.sleep(0.003)), "cuda", calls=2)
    assert seconds >= 0.003 and len(calls) == 2 and len(syncs) == 3  # drained before each call and after
    cpu_calls = []
    assert timing.enqueue_seconds(lambda: cpu_calls.append(1), "cpu") == 0.0 and not cpu_calls  # no interpreter call


def test_rounds_are_clamped() -> None:
    assert timing.rounds_for(1e-6, budget_s=1.0, lo=5, hi=200) == 200
    assert timing.rounds_for(10.0, budget_s=1.0, lo=5, hi=200) == 5
    assert timing.rounds_for(0.01, budget_s=1.0, lo=5, hi=200) == 100


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_event_clock_measures_device_time() -> None:
    a = torch.randn(4096, 4096, device="cuda")
    meta = timing.benchmark(lambda: a @ a, device="cuda", name="mm", group="unit", rounds=5, warmup_rounds=2)
    host = timing.benchmark(lambda: None, device="cuda", name="noop", group="unit", rounds=5)
    assert meta.stats.median > 10 * host.stats.median  # device time of a real matmul, not launch time


def test_launches_are_counted_at_each_launcher_s_c_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the monitor counts where every launch ends: the C entry each launcher holds (``self.launch``), wrapped
    as the launcher is made; a launch through the launcher's ``__call__`` and one that calls ``.run.launch``
    straight (past ``__call__``) are each counted once, and one on another stream is named."""
    pytest.importorskip("triton.backends.nvidia.driver")
    from triton.backends.nvidia import driver
    from triton.runtime import jit

    calls = []

    class FakeLauncher:  # CudaLauncher's shape: __init__ sets the C entry, __call__ ends in it
        def __init__(self, src, metadata):
            self.launch = lambda gx, gy, gz, stream, function, *rest: calls.append(stream)

        def __call__(self, gx, gy, gz, stream, function, *args):
            self.launch(gx, gy, gz, stream, function, False, False, None, None, *args)

    stream = type("Stream", (), {"cuda_stream": 7})()
    monkeypatch.setattr(driver, "CudaLauncher", FakeLauncher)
    monkeypatch.setattr(jit.JITFunction, "run", jit.JITFunction.run)  # restored after: install() wraps it
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    monitor = checks.LaunchMonitor()
    monitor.install()
    launcher = FakeLauncher("src", "metadata")
    monitor.expected_stream = stream
    launcher(1, 1, 1, 7, "function", 1.0)
    launcher.launch(1, 1, 1, 7, "function", False, False, None, None, 1.0)  # past __call__
    assert monitor.launches == 2 and calls == [7, 7] and monitor.side_stream == []
    launcher.launch(1, 1, 1, 9, "function", False, False, None, None, 1.0)  # another stream, past __call__
    assert monitor.launches == 3 and monitor.side_stream == ["a compiled kernel"]
    monitor.enabled = False  # timed calls: nothing counted
    launcher(1, 1, 1, 9, "function")
    assert monitor.launches == 3 and calls == [7, 7, 9, 9]


def test_device_time_is_used_only_where_a_graph_figure_can_check_it() -> None:
    """The device metric is the runner's report: without a CUDA graph of the candidate's (nothing of the
    supervisor's to check it against) the eager figure decides, as for the graph metric (red team, session 49: a
    non-capturable candidate reporting 1 ns a call was taken at its word)."""
    from pytest_kopt.judge.bench import effective_metric

    modes = ["eager", "device", "graph"]
    assert effective_metric("device", modes, graph_safe=True) == "device"
    assert effective_metric("device", ["eager", "device"], graph_safe=False) == "eager"
    assert effective_metric("graph", ["eager", "device"], graph_safe=False) == "eager"
    assert effective_metric("eager", ["eager", "device"], graph_safe=False) == "eager"


def test_incumbent_ratios_count_a_device_report_for_no_less_than_its_graph_floor() -> None:
    """Per-round incumbent ratios use each side's device rounds raised to GRAPH_MARGIN x its own graph figure, so a
    runner reporting less than that gains nothing over one reporting exactly that."""
    from pytest_kopt.judge.bench import round_ratios
    from pytest_kopt.judge.rounds import GRAPH_MARGIN, Series

    liar, honest = Series(), Series()
    liar.rounds["graph"] = [100e-6] * 3
    liar.rounds["device"] = [1e-9, 2e-9, 1e-9]
    honest.rounds["graph"] = [100e-6] * 3
    honest.rounds["device"] = [105e-6, 104e-6, 106e-6]
    ratios = round_ratios(liar, honest, "device")
    assert ratios == pytest.approx([d / (GRAPH_MARGIN * 100e-6) for d in honest.rounds["device"]])
    assert max(ratios) < 1.2
    assert round_ratios(liar, honest, "graph") == pytest.approx([1.0, 1.0, 1.0])  # the supervisor's clock, as measured


FENCE_PROBE = r'''
import json, threading, torch
from pytest_kopt.judge import fence

def outcome(fn):
    try:
        fn()
        return "ok"
    except fence.FencedOp:
        return "fenced"

x, lengths = torch.ones(4), torch.tensor([3, 5], dtype=torch.int32)
fence.install()
found = {"harness math": outcome(lambda: (x * 2).sum()), "harness base class": outcome(lambda: torch.Tensor.mro()[1].mul(x, 2.0))}
with fence.candidate_running():
    for name, fn in {
        "operator": lambda: x * 2, "in-place operator": lambda: x.clone().__iadd__(1), "method": lambda: x.exp(),
        "function": lambda: torch.where(x > 0, x, x), "float read": lambda: float(x[0]), "item": lambda: x[0].item(),
        "tolist": lambda: x.tolist(), "repr": lambda: repr(x),
        "int read": lambda: int(lengths[1]), "allocation and views": lambda: torch.empty(2, 3).view(3, 2).t(),
        "copies and fills": lambda: (torch.empty(4).copy_(x), torch.empty(4).fill_(1.0), torch.empty(2).zero_()),
        "conversions": lambda: (x.float(), x.to(torch.bfloat16), x.cpu(), lengths.cpu()),
        "metadata": lambda: (x.shape, x.stride(), x.dim(), x.numel(), x.is_contiguous(), x.data_ptr()),
        "basic indexing": lambda: (x[1:3], x[None, ...], x[-1:], x.view(2, 2)[:, 0], x.clone().__setitem__(slice(0, 2), 0.0)),
        "tensor index": lambda: x[lengths.long() - 3], "list index": lambda: x[[0, 2]],
        "tensor index store": lambda: x.clone().__setitem__(lengths.long() - 3, 1.0),
        # below every Python name: torch's dispatcher (Tensor's C base class, the C function table)
        "base class": lambda: torch.Tensor.mro()[1].mul(x, 2.0), "C functions": lambda: torch._C._VariableFunctions.exp(x),
        "integer math": lambda: lengths.mul(2), "inference mode": lambda: torch.inference_mode().__enter__(),
    }.items():
        found[name] = outcome(fn)
def suspended(box):  # a generator's finally, run by the garbage collector on the harness's thread
    try:
        yield
    finally:
        box["collected"] = outcome(lambda: x * 2)

box = {}
pending = suspended(box); next(pending); cycle = [pending]; cycle.append(cycle); del pending, cycle
import gc; gc.collect()
found["math in a collection"] = box.get("collected", "not collected")
thread = {}
worker = threading.Thread(target=lambda: thread.update(math=outcome(lambda: x * 2)))
worker.start(); worker.join()
found["math on another thread"] = thread["math"]
print(json.dumps(found))
'''


def test_the_fence_refuses_torch_math_and_float_reads_to_candidate_code_alone() -> None:
    """fence.py in a process of its own (it changes torch for the whole process): inside a candidate's import or call,
    and on any thread but the harness's, torch math and reads of float data into Python raise; integer reads (a
    candidate's lengths), allocation, views, copies, conversions and metadata do not; the harness's own math outside
    the candidate's calls is untouched. Below the Python names, torch's dispatcher refuses the same ops (Tensor's C base
    class, which no Python wrapper changes), and inference mode, which would skip that, is refused."""
    import json
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", FENCE_PROBE], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    fenced = {"operator", "in-place operator", "method", "function", "float read", "item", "tolist", "repr",
              "math on another thread", "tensor index", "list index", "tensor index store", "base class", "C functions",
              "integer math", "inference mode", "math in a collection"}
    assert {name for name, what in found.items() if what == "fenced"} == fenced, found
