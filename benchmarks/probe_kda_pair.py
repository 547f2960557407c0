"""Probe KDA's paired scan (``scan_pair``) on a GPU: which settings crash, and how fast the pipeline is
where it runs (developer script; the family refuses the knob since the H200 crash of session 5, and
this script lifts that refusal in its own process only).  The pair step is version 9b (the family's
``_SCAN_PAIR_FORM``, recorded in each result): built from the one-chunk step's 32-row products only,
replacing version 9's 64-row step that read shared memory past its allocation on the H200.

    PYTHONPATH=. python3 benchmarks/probe_kda_pair.py            # every setting, each in a child process
    PROBE_SETTINGS=pair,pair_kmerge PYTHONPATH=. python3 benchmarks/probe_kda_pair.py   # a subset
    PROBE_CRASH_ONLY=1 compute-sanitizer python3 benchmarks/probe_kda_pair.py --one NAME
                                      # one setting, the crash shape only, untimed: to locate a fault

Each setting runs in its own process (an illegal memory access poisons the CUDA context): it checks o
and the final state against the default knobs on fresh inputs (relative RMS) at the shape that crashed
(B1 T2048 H8 K=V=64) and at the headline, then times both (the judge's clock, median device µs).

At the headline it also records the device time of every kernel of one call, for the setting and for the
default (the judge's profiler, ``pytest_kopt.judge.profile.profile_kernels``, L2 flushed before each call,
as benchmarks/profile_kda_vs_fla.py does; the block rows and the solve share ``_kda_prep_kernel``'s name
and are summed): the scan's own time is the question.  Version 9c's settings (``pair_merge="kernel"``,
``pair_kmerge*``) run the pair merge as its own launch before the scan (``_kda_pair_merge_kernel``), so
the scan row is the pair chain alone and the merge row its price (kernels/notes/kda.md "Version 9c").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SETTINGS = {
    "pair": {"scan_pair": True},
    "pair_stages1": {"scan_pair": True, "scan_stages": 1},
    "pair_stages2": {"scan_pair": True, "scan_stages": 2},
    "pair_w4": {"scan_pair": True, "scan_warps": 4},
    "pair_v8": {"scan_pair": True, "solve_stages": 2, "u_store": "bf16"},
    "pair_u_bf16": {"scan_pair": True, "u_store": "bf16"},  # against the default, which may adopt u bf16
    # version 9c: the merge once per (pair, head) in its own launch, the scan's pair step only the chain
    "pair_kmerge": {"scan_pair": True, "pair_merge": "kernel"},
    "pair_kmerge_u_bf16": {"scan_pair": True, "pair_merge": "kernel", "u_store": "bf16"},
    "pair_kmerge_w4": {"scan_pair": True, "pair_merge": "kernel", "scan_warps": 4},
}
PROFILE_CALLS = 10


def kernel_times(fn) -> dict:
    """Mean device µs per call of each kernel ``fn`` launches, the L2 flushed before each call (the judge's
    profiler, as benchmarks/profile_kda_vs_fla.py's kernel_times; the flush's own memset left out)."""
    import torch

    from pytest_kopt.judge.profile import profile_kernels
    from pytest_kopt.judge.timing import flush_l2

    rows = profile_kernels(lambda: (flush_l2("cuda"), fn()), device=torch.device("cuda"), monitor=None,
                           calls=PROFILE_CALLS)
    return {row["name"].split("(")[0][:40]: round(row["us"], 1) for row in rows
            if "kda" in row["name"] or "scan" in row["name"]}
CRASH_CASE = {"B": 1, "T": 2048, "H": 8, "K": 64, "V": 64, "initial_state": False, "output_final_state": True}
HEADLINE = {"B": 1, "T": 8192, "H": 16, "K": 128, "V": 128, "initial_state": False, "output_final_state": True}


def rel_rms(a, b) -> float:
    a, b = a.double(), b.double()
    return float(((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30)).item())


def one(name: str) -> dict:
    """Run one setting in this process; returns errors against the default and device times."""
    import torch

    from kernels.families import kda_chunked as fam
    from pytest_kopt.judge.timing import median_us
    from pytest_kopt.problems.kda import KDAProblem

    fam._SCAN_PAIR_REFUSED = False
    prob = KDAProblem()
    form = getattr(fam, "_SCAN_PAIR_FORM", "9")
    if SETTINGS[name].get("pair_merge") == "kernel":  # version 9c: 9b's chain, the merge in its own launch
        form = "9c"
    result = {"knobs": SETTINGS[name], "pair_form": form}
    cases = (("crash_case", CRASH_CASE),) if os.environ.get("PROBE_CRASH_ONLY") else (("crash_case", CRASH_CASE), ("headline", HEADLINE))
    for label, case in cases:
        x = prob.make_inputs(case, device="cuda", seed=1)

        def call(knobs):
            return fam.kda_chunked(x["q"], x["k"], x["v"], x["g"], x["beta"], x.get("scale"), x["initial_state"],
                                   x["output_final_state"], {**fam.KNOBS, **knobs}, None)

        o_ref, s_ref = call({})
        o, s = call(SETTINGS[name])
        torch.cuda.synchronize()
        err = {"o": rel_rms(o, o_ref), "final_state": rel_rms(s, s_ref)}
        result[label] = {"err_vs_default": err}
        if not os.environ.get("PROBE_CRASH_ONLY"):
            result[label]["us"] = round(median_us(lambda: call(SETTINGS[name]), "cuda", rounds=30), 1)
            result[label]["default_us"] = round(median_us(lambda: call({}), "cuda", rounds=30), 1)
            rest = {k: v for k, v in SETTINGS[name].items() if k not in ("scan_pair", "pair_merge")}
            if rest:  # the same knobs without the paired scan: the pair step's own effect
                result[label]["without_pair_us"] = round(median_us(lambda: call(rest), "cuda", rounds=30), 1)
            if label == "headline":  # per kernel: the scan's own time (and version 9c's merge launch)
                result[label]["kernels_us"] = kernel_times(lambda: call(SETTINGS[name]))
                result[label]["default_kernels_us"] = kernel_times(lambda: call({}))
    return result


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        print(json.dumps(one(sys.argv[2])), flush=True)
        return 0
    table = {}
    # PROBE_SETTINGS=pair,pair_kmerge: a subset (to split the run under a per-command time limit)
    chosen = [n for n in os.environ.get("PROBE_SETTINGS", "").split(",") if n] or list(SETTINGS)
    for name in chosen:
        proc = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True, timeout=240)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode == 0 and lines:
            table[name] = json.loads(lines[-1])
        else:
            table[name] = {"failed": (proc.stderr or proc.stdout)[-600:]}
        print(name, json.dumps(table[name]), flush=True)
    summary(table)
    return 0


def summary(table: dict) -> None:
    print("\nsetting          crash-case err o   headline err o   headline us (default us; same knobs without the pair)")
    for name, r in table.items():
        if "failed" in r:
            print(f"{name:16s} FAILED: {r['failed'].strip().splitlines()[-1][:90]}")
            continue
        c, h = r["crash_case"], r["headline"]
        print(f"{name:16s} {c['err_vs_default']['o']:.2e}           {h['err_vs_default']['o']:.2e}         "
              f"{h['us']:.1f} ({h['default_us']:.1f}; {h.get('without_pair_us', h['default_us']):.1f})")
    print("\nheadline, device µs per kernel (setting / default; prep = block rows + solve)")
    short = {"_kda_prep_kernel": "prep", "_kda_pair_merge_kernel": "merge", "_kda_scan_kernel": "scan",
             "_kda_out_kernel": "out"}
    for name, r in table.items():
        if "failed" in r or "kernels_us" not in r.get("headline", {}):
            continue
        got, base = r["headline"]["kernels_us"], r["headline"]["default_kernels_us"]
        cells = [f"{short.get(k, k)} {got.get(k, 0.0):.1f}/{base.get(k, 0.0):.1f}" for k in
                 sorted(set(got) | set(base), key=lambda k: list(short).index(k) if k in short else 9)]
        print(f"{name:20s} " + "  ".join(cells))


if __name__ == "__main__":
    sys.exit(main())
