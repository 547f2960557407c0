"""Probe KDA's paired scan (``scan_pair``) on a GPU: which settings crash, and how fast the pipeline is
where it runs (developer script; the family refuses the knob since the H200 crash of session 5, and
this script lifts that refusal in its own process only).  The pair step is version 9b (the family's
``_SCAN_PAIR_FORM``, recorded in each result): built from the one-chunk step's 32-row products only,
replacing version 9's 64-row step that read shared memory past its allocation on the H200.

    PYTHONPATH=. python3 benchmarks/probe_kda_pair.py            # every setting, each in a child process
    PROBE_CRASH_ONLY=1 compute-sanitizer python3 benchmarks/probe_kda_pair.py --one NAME
                                      # one setting, the crash shape only, untimed: to locate a fault

Each setting runs in its own process (an illegal memory access poisons the CUDA context): it checks o
and the final state against the default knobs on fresh inputs (relative RMS) at the shape that crashed
(B1 T2048 H8 K=V=64) and at the headline, then times both (the judge's clock, median device µs).
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
}
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
    result = {"knobs": SETTINGS[name], "pair_form": getattr(fam, "_SCAN_PAIR_FORM", "9")}
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
            rest = {k: v for k, v in SETTINGS[name].items() if k != "scan_pair"}
            if rest:  # the same knobs without the paired scan: the pair step's own effect
                result[label]["without_pair_us"] = round(median_us(lambda: call(rest), "cuda", rounds=30), 1)
    return result


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        print(json.dumps(one(sys.argv[2])), flush=True)
        return 0
    table = {}
    for name in SETTINGS:
        proc = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True, timeout=240)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode == 0 and lines:
            table[name] = json.loads(lines[-1])
        else:
            table[name] = {"failed": (proc.stderr or proc.stdout)[-600:]}
        print(name, json.dumps(table[name]), flush=True)
    print("\nsetting          crash-case err o   headline err o   headline us (default us; same knobs without the pair)")
    for name, r in table.items():
        if "failed" in r:
            print(f"{name:16s} FAILED: {r['failed'].strip().splitlines()[-1][:90]}")
            continue
        c, h = r["crash_case"], r["headline"]
        print(f"{name:16s} {c['err_vs_default']['o']:.2e}           {h['err_vs_default']['o']:.2e}         "
              f"{h['us']:.1f} ({h['default_us']:.1f}; {h.get('without_pair_us', h['default_us']):.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
