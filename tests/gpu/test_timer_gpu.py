"""The judge's timer on a GPU: its figure is the call's device time, and the host's time is recorded
beside it rather than in it. Formerly benchmarks/check_timer_gpu.py, which printed the same rows
beside `triton.testing.do_bench` (that comparison is kept, printed: `pytest tests/gpu -s`).

A call that busy-waits 800 µs on the host before one small copy must read near the copy's time
(the H200 read 7.8 µs at every padding in session 2, results/h200-2026-11-29b), with host_us
covering the wait. The bounds are wide: this checks what the figure measures, not how fast anything is.
"""

from __future__ import annotations

import time

import pytest
import torch

from pytest_kopt.judge import timing


def busy(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(1 << 20, device="cuda")  # 4 MB: a few microseconds of copying


def median_us(fn, name: str) -> tuple[float, float]:
    meta = timing.benchmark(fn, device="cuda", name=name, group="timer", rounds=50, warmup_rounds=3)
    return meta.stats.median * 1e6, float(meta.extra_info.get("host_us", float("nan")))


@pytest.mark.parametrize("host_us", [100.0, 300.0, 800.0])
def test_host_time_stays_out_of_the_device_figure(x: torch.Tensor, host_us: float) -> None:
    import triton

    bare, _ = median_us(lambda: x.mul(2.0), "copy")
    padded, recorded_host = median_us(lambda: (busy(host_us), x.mul(2.0)), f"host {host_us:.0f} us + copy")
    do_bench = triton.testing.do_bench(lambda: (busy(host_us), x.mul(2.0)), warmup=25, rep=100, return_mode="median") * 1e3
    print(f"host {host_us:.0f} us + copy: timer {padded:.2f} us (bare copy {bare:.2f}), host_us {recorded_host:.1f}, do_bench {do_bench:.2f} us")
    assert padded < bare + 0.25 * host_us, f"the figure {padded:.1f} us took in the host's {host_us:.0f} us (bare copy {bare:.1f} us)"
    assert recorded_host >= 0.9 * host_us, f"host_us {recorded_host:.1f} does not cover the host's {host_us:.0f} us"
