"""Where a candidate's time goes, kernel by kernel, and how far it is from the roofline floor.

This is what an agent reads to choose its next move: one slow kernel among several, a kernel
at 5% of memory bandwidth, or a candidate already near the floor (stop tuning, change the
algorithm). On a GPU the breakdown is device time from ``torch.profiler``; on the CPU
interpreter it is host time per Triton launch (indicative only).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .checks import LaunchMonitor


def profile_kernels(fn: Callable[[], Any], *, device: torch.device, monitor: LaunchMonitor, calls: int = 3) -> list[dict]:
    """Per-kernel time per call of ``fn``: ``[{name, us, calls}]``, slowest first."""
    if device.type == "cuda":
        return _gpu_profile(fn, calls)
    monitor.reset()
    for _ in range(calls):
        fn()
    rows = [{"name": name, "us": monitor.host_seconds[name] / calls * 1e6, "calls": count / calls}
            for name, count in monitor.names.items()]
    return sorted(rows, key=lambda row: -row["us"])


def _gpu_profile(fn: Callable[[], Any], calls: int) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        if getattr(event, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        total = getattr(event, "self_device_time_total", None)
        if total is None:  # older torch
            total = getattr(event, "self_cuda_time_total", 0.0)
        if total <= 0:
            continue
        rows.append({"name": event.key, "us": total / calls, "calls": event.count / calls})
    return sorted(rows, key=lambda row: -row["us"])


def roofline(cost: Any, seconds: float, *, bytes_per_s: float, flops_per_s: float) -> dict:
    """Achieved bandwidth and throughput, the floor (bytes / bandwidth, FLOPs / peak) and the
    fraction of it reached (1.0 = at the floor)."""
    floor_s = cost.floor_seconds(bytes_per_s, flops_per_s)
    return {
        "floor_us": floor_s * 1e6,
        "achieved_GBps": cost.bytes / seconds / 1e9 if seconds > 0 else None,
        "achieved_TFLOPs": cost.flops / seconds / 1e12 if seconds > 0 else None,
        "floor_fraction": floor_s / seconds if seconds > 0 else None,
        "bytes": cost.bytes,
        "flops": cost.flops,
        "ceilings": {"bytes_per_s": bytes_per_s, "flops_per_s": flops_per_s},
    }


def measure_ceilings(device: torch.device) -> dict:
    """Copy bandwidth (read + write) and bf16 matmul peak measured on this GPU, with the timer
    every figure uses. Takes well under a second on an H200."""
    from .timing import benchmark

    n = 256 * 1024 * 1024  # bytes per buffer
    src = torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    copy = benchmark(lambda: dst.copy_(src), device=device, name="copy", group="ceilings", rounds=20, warmup_rounds=3)
    size = 8192
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    mm = benchmark(lambda: a @ b, device=device, name="matmul", group="ceilings", rounds=10, warmup_rounds=3)
    return {
        "bytes_per_s": 2 * n / copy.stats.median,
        "flops_per_s": 2 * size**3 / mm.stats.median,
    }
