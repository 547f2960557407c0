"""Check the project's timer on a GPU against ``triton.testing.do_bench``.

Two questions, one short table:
  1. A call that spends host time before its one small kernel (busy-waits of 0 to 800 us, as a
     call with many Triton launches would): does ``timing.benchmark`` report the kernel's device
     time, with the host time beside it in ``host_us``? do_bench hides only as much host time
     as its own flush takes.
  2. Calls with no host overhead (a matmul, a copy): do both timers agree?

    PYTHONPATH=. python3 benchmarks/check_timer_gpu.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import triton  # noqa: E402

from pytest_kopt.judge import timing  # noqa: E402


def busy(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 1
    x = torch.randn(1 << 20, device="cuda")  # 4 MB: a few microseconds of copying
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    big = torch.randn(1 << 28, device="cuda", dtype=torch.bfloat16)  # 512 MB
    cases = [(f"host {h:.0f} us + small copy", (lambda h=h: (busy(h), x.mul(2.0)))) for h in (0, 100, 300, 800)]
    cases += [("matmul 4096 bf16", lambda: a @ a), ("copy 512 MB", lambda: big.mul(2.0))]
    print(f"{'call':28s} {'timing.benchmark us':>20s} {'host_us':>9s} {'do_bench us':>12s}")
    for name, fn in cases:
        meta = timing.benchmark(fn, device="cuda", name=name, group="timer", rounds=50, warmup_rounds=3)
        ours = meta.stats.median * 1e6
        theirs = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
        print(f"{name:28s} {ours:20.2f} {meta.extra_info.get('host_us', float('nan')):9.1f} {theirs:12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
