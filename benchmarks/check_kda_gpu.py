"""Check the KDA references and the kda_recurrent baseline on a GPU, and time them.

Run from the repository root on a CUDA machine (the package need not be installed):

    PYTHONPATH=. python3 benchmarks/check_kda_gpu.py [--no-fla]

1. A few hypothesis-like shapes: kda_recurrent and chunk_kda_reference against the float64
   step-by-step recurrence (the ground truth).
2. The chunked reference against the float64 recurrence at T=2048 with headline widths (the
   recurrence is too slow in float64 at T=8192), and float32 against float64 chunking at the
   headline: this is the evidence that the problem's large-T reference is float32-or-better.
3. The headline B1 T8192 H16 K=V=128: kda_recurrent (and fla's chunk_kda if importable)
   against the chunked reference, then median times from triton.testing.do_bench.

Exits non-zero if any check fails. fla runs last: its first call autotunes (a minute or more).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from triton.testing import do_bench

from kernels.families import kda_recurrent
from kernels.reference.kda import chunk_kda_reference, naive_recurrent_kda
from pytest_kopt.problems.base import H200_COPY_BYTES_PER_S, rel_rms
from pytest_kopt.problems.kda import KDAProblem

PROBLEM = KDAProblem()
TOL = 5e-3  # the problem's tolerance for a candidate
REF_TOL = 1e-4  # the chunked reference must be far tighter than a candidate's tolerance
failures: list[str] = []


def case(B, T, H, K, V, h0=False, hT=True, scale=None):
    return {"B": B, "T": T, "H": H, "K": K, "V": V, "initial_state": h0, "output_final_state": hT, "scale": scale}


def report(label, got, want, tol):
    """Print and record the relative RMS error of (o, final_state) against a reference."""
    parts = []
    for name, a, b in zip(("o", "state"), got, want):
        if b is None:
            continue
        err = rel_rms(a, b)
        parts.append(f"{name} {err:.2e}")
        if not err <= tol:
            failures.append(f"{label}: {name} rel RMS {err:.3g} > {tol:g}")
    print(f"  {label:<52} {'  '.join(parts)}  (tol {tol:g})", flush=True)


def chunked(acc):
    return lambda **x: chunk_kda_reference(**x, accum_dtype=acc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-fla", action="store_true", help="skip flash-linear-attention's chunk_kda")
    args = parser.parse_args()
    assert torch.cuda.is_available(), "this script needs a CUDA GPU"
    dev = "cuda"
    start = time.time()
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)

    print("1. small shapes vs the float64 recurrence", flush=True)
    for c in (case(1, 1, 1, 16, 16, h0=True), case(2, 257, 3, 64, 256, h0=True, scale=0.5),
              case(3, 1000, 2, 128, 32, hT=False), case(1, 700, 4, 256, 128, h0=True)):
        x = PROBLEM.make_inputs(c, device=dev, seed=c["T"], dtype=torch.bfloat16)
        truth = naive_recurrent_kda(**x)
        report(f"{PROBLEM.describe(c)} chunk fp32", chunked(torch.float32)(**x), truth, REF_TOL)
        report(f"{PROBLEM.describe(c)} kda_recurrent", kda_recurrent.kernel(**x), truth, TOL)

    print("2. chunked reference vs the float64 recurrence at headline widths", flush=True)
    c = case(1, 2048, 16, 128, 128, h0=True)
    x = PROBLEM.make_inputs(c, device=dev, seed=1)
    truth = naive_recurrent_kda(**x)
    report(f"{PROBLEM.describe(c)} chunk fp32", chunked(torch.float32)(**x), truth, REF_TOL)
    report(f"{PROBLEM.describe(c)} chunk fp64", chunked(torch.float64)(**x), truth, 1e-10)
    del truth

    headline = PROBLEM.headline_cases[0]
    label = PROBLEM.describe(headline)
    print(f"3. headline {label}", flush=True)
    x = PROBLEM.make_inputs(headline, device=dev, seed=0)
    ref64 = chunked(torch.float64)(**x)
    ref = PROBLEM.reference(**x)
    report("problem reference (chunk fp32) vs chunk fp64", ref, ref64, REF_TOL)
    report("kda_recurrent vs problem reference", kda_recurrent.kernel(**x), ref, TOL)
    del ref64

    floor_us = PROBLEM.cost(headline).bytes / H200_COPY_BYTES_PER_S * 1e6
    timings = {
        "torch chunk reference fp32": lambda: chunk_kda_reference(**x),
        "torch chunk reference fp64": lambda: chunk_kda_reference(**x, accum_dtype=torch.float64),
        f"kda_recurrent {kda_recurrent.KNOBS}": lambda: kda_recurrent.kernel(**x),
    }
    if not args.no_fla:
        try:
            import fla.ops.kda  # noqa: F401
        except Exception as exc:  # not installed here
            print(f"  fla chunk_kda not importable: {exc!r}", flush=True)
        else:
            fla = next(b.fn for b in PROBLEM.baselines(dev) if b.name == "fla-chunk_kda")
            t0 = time.time()
            report("fla chunk_kda vs problem reference", fla(**x), ref, TOL)
            print(f"  (fla first call {time.time() - t0:.1f} s)", flush=True)
            timings["fla chunk_kda"] = lambda: fla(**x)
    print(f"  times (median, memory floor {floor_us:.1f} us at {H200_COPY_BYTES_PER_S / 1e12:.2f} TB/s):", flush=True)
    with torch.inference_mode():
        for name, fn in timings.items():
            print(f"    {name:<60} {do_bench(fn, return_mode='median') * 1e3:10.1f} us", flush=True)

    print(f"done in {time.time() - start:.1f} s; {len(failures)} failure(s)")
    for f in failures:
        print(f"  FAIL {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
