"""scan_overlap "pdl" failed on the H200 with "unspecified launch failure" (session 14, call 2): which part fails.
Each variant runs in its own process (a trap ends the CUDA context), at one small shape, and prints one line.

    source tools/device_setup.sh; python3 tools/debug_overlap.py      # on the H200
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

ROOT = Path(__file__).resolve().parents[1]


@gluon.jit
def _nopoll(flags_ptr, n0, NT, G: gl.constexpr):
    pass


@gluon.jit
def _sleepy(flags_ptr, n0, NT, G: gl.constexpr):
    offs = n0 + gl.arange(0, G, layout=gl.BlockedLayout([1], [32], [1], [0]))
    done = gl.min(gl.load(flags_ptr + offs, mask=offs < NT, other=1, volatile=True), axis=0)
    while done == 0:
        gl.inline_asm_elementwise("nanosleep.u32 500; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        done = gl.min(gl.load(flags_ptr + offs, mask=offs < NT, other=1, volatile=True), axis=0)
    gl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tfence.proxy.async.global; // $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


VARIANTS = ["flags_preset_no_solve", "solve_then_waiting_scan", "overlap", "overlap_big"]
# call 5: where the time goes beside the scan, at the headline (timeline of one call; median of the event timer).
# Call 5 ran these with the per-chunk wait of commit 0a49b07 (one flag load and both fences per chunk); the functions
# above take the grouped wait's arguments. (Call 6's run of this list failed: these two lines had been deleted.)
TIMELINE = ["t_off", "t_overlap", "t_swap_only", "t_overlap_nopoll", "t_overlap_sleep"]


def child(variant: str) -> dict:
    import torch

    sys.path.insert(0, str(ROOT))
    from pytest_kopt.kernels.reference.kda import naive_recurrent_kda
    from pytest_kopt.gate import load_module
    from pytest_kopt.problems.kda import KDAProblem

    fam = load_module(ROOT / "kernels" / "families" / "kda_chunked.py")
    prob = KDAProblem()
    case = {"B": 2, "T": 100, "H": 3, "K": 64, "V": 64, "initial_state": True, "output_final_state": True}
    if variant == "overlap_big":
        case = {"B": 1, "T": 8192, "H": 16, "K": 128, "V": 128, "initial_state": False, "output_final_state": True}
    x = prob.make_inputs(case, device="cuda", seed=1)
    kn = {**fam.KNOBS, "u_store": "bf16", "scan_warps": 4, "out_bv": 64, "off_tile": "tight", "diag_cols": "trans",
          "scan_engine": "wgmma_ws", "scan_overlap": "pdl"}
    dbg: dict = {}
    real_launch = fam._wgmma_scan_launch
    info: dict = {"variant": variant}
    if variant in ("flags_preset_no_solve", "solve_then_waiting_scan"):
        fam._scan_beside_solve = lambda *a: False

        def launch(*a, **kw):  # the scan with WAIT, after the solve (or with every flag set by hand)
            flags = dbg["flags"]
            if variant == "flags_preset_no_solve":
                flags.fill_(1)
            torch.cuda.synchronize()
            info["flags_before_scan"] = int(flags.sum())
            return real_launch(*a, **kw, flags=flags)

        fam._wgmma_scan_launch = launch
    try:
        got = fam.kda_chunked(x["q"], x["k"], x["v"], x["g"], x["beta"], None, x["initial_state"],
                              x["output_final_state"], kn, debug=dbg)
        torch.cuda.synchronize()
        info["beside"] = dbg.get("scan_beside_solve")
        info["flags_after"] = int(dbg["flags"].sum()) if dbg.get("flags") is not None else None
        info["flags_n"] = int(dbg["flags"].numel()) if dbg.get("flags") is not None else None
        if case["T"] <= 1000:
            want = naive_recurrent_kda(**x)
            info["err"] = {e.name: float(f"{e.rel_rms:.3e}") for e in prob.compare(got, want)}
    except Exception as err:  # noqa: BLE001
        info["error"] = f"{type(err).__name__}: {err}"[:300]
    return info


def timeline(variant: str) -> dict:
    """The headline with the promoted knobs; "t_overlap_nopoll" times the scan beside the solve without waiting for the
    flags (its outputs are wrong: timing only), "t_overlap_sleep" polls with a 0.5 us sleep between polls."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, str(ROOT))
    from pytest_kopt.gate import load_module
    from pytest_kopt.judge.timing import median_us
    from pytest_kopt.problems.kda import KDAProblem

    fam = load_module(ROOT / "kernels" / "families" / "kda_chunked.py")
    if variant == "t_overlap_nopoll":
        fam._ws_wait_chunks = _nopoll
    if variant == "t_overlap_sleep":
        fam._ws_wait_chunks = _sleepy
    if variant == "t_swap_only":
        fam._scan_beside_solve = lambda *a: False
    prob = KDAProblem()
    case = {"B": 1, "T": 8192, "H": 16, "K": 128, "V": 128, "initial_state": False, "output_final_state": True}
    x = prob.make_inputs(case, device="cuda", seed=0)
    # 581efeab's knobs (call 5 took them from the TRY_EARLY of its day; pair_elems stays at its default 2048)
    kn = {**fam.KNOBS, **fam.TRY_EARLY[0], "pair_elems": 2048, "scan_overlap": "off" if variant == "t_off" else "pdl"}

    def call():
        return fam.kda_chunked(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, True, kn)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    us = median_us(call, "cuda", rounds=30, warmup_rounds=3)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    ev = [e for e in prof.events() if e.device_type == DeviceType.CUDA and "kda" in e.name]
    t0 = min(e.time_range.start for e in ev)
    spans = [(e.name.split("(")[0][-18:], round(e.time_range.start - t0, 1), round(e.time_range.end - t0, 1)) for e in ev]
    return {"variant": variant, "us": round(us, 1), "spans": spans}


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(timeline(sys.argv[2]) if sys.argv[2].startswith("t_") else child(sys.argv[2])))
        return 0
    rows = []
    for v in (TIMELINE if "--timeline" in sys.argv else VARIANTS):
        try:
            p = subprocess.run([sys.executable, __file__, "--child", v], capture_output=True, text=True, timeout=90, check=False)
            line = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else json.dumps({"variant": v, "stderr": p.stderr[-400:]})
        except subprocess.TimeoutExpired:
            line = json.dumps({"variant": v, "error": "timeout 90 s"})
        print(line, flush=True)
        rows.append(json.loads(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
