"""One GPU call's worth of work for the chunked KDA family: build several knob variants, check
each against the float32 chunked reference (and small shapes against the float64 recurrence),
time each with the judge's timer (``pytest_kopt.judge.timing.median_us``: device time, median, L2
flushed and ~1 ms of host window before each call) next to flash-linear-attention's chunk_kda
(general gates) in the same run, and print a short table.  Details go to $OUT.
Not triton.testing.do_bench: it hides only as much host time as its flush takes, and fla's
0.6-1.3 ms of Python and launches per call made it report fla at 1366-1620 us against ~613 us of
device time (session 4; ours read 877 us both ways).  fla's host time per call is kept beside
(``host_us``).

Run on the device as::

    source tools/device_setup.sh; python3 tools/dev_kda_chunked.py

(carry=[".whl"] with fla-core 0.6.0 in it; see device_setup.sh).  Budget: KDA_DEV_BUDGET_S
(default 280 s, fla's ~90 s first-call autotune included).  On the CPU: KDA_DEV_DRY=1.
With the version-6 list (36 rows) the default 280 s reaches only the first rows: run it with
KDA_DEV_BUDGET_S=450 and a device timeout of 540 s (the device caps one command at 600 s), or
restrict the rows with KDA_DEV_ROWS=v6_out,fuse_nreg128,... (the default row is always kept).

Compilation of the variants happens first, in parallel child processes (``--warm``) that fill
Triton's on-disk cache, so the timed process only loads kernels and fla's long autotuning runs
on a quiet machine.  Every stage checks the clock and skips what no longer fits.  The default
row's per-stage split (block rows, solve, scan, out; profiler, L2 flushed before every call) is
also taken at B2 T16384 H16 (``stages`` in the json).

Profile mode (issue 5: what limits each stage; the static view is ``tools/sass_kda.py``)::

    ncu --profile-from-start off --clock-control none --target-processes all \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
        --section InstructionStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section Occupancy --section LaunchStats -f -o $OUT/kda_ncu \
        python3 tools/dev_kda_chunked.py --ncu
    ncu --import $OUT/kda_ncu.ncu-rep --page details --csv > $OUT/kda_ncu.csv

``--ncu`` compiles and runs the default knobs once per NCU_CASES shape, then one call per shape
between cudaProfilerStart / Stop: the four launches (block rows, solve, scan, out) profiled once
each at the headline, and again at B2 T16384 H16 (its per-stage durations under ncu: gpu__time_duration
in SpeedOfLight; ~40 replay passes per kernel with these sections, a few seconds per kernel).
``--stages`` (no ncu needed) prints only the default's per-stage split at NCU_CASES, with the L2
flushed before every call, median of KDA_DEV_STAGE_REPS (default 10) calls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback

T0 = time.time()
BUDGET_S = float(os.environ.get("KDA_DEV_BUDGET_S", "280"))
OUT = os.environ.get("OUT", "/tmp/kda_dev_out")
os.makedirs(OUT, exist_ok=True)
# KDA_DEV_DRY=1: a dry run of the script's logic on the CPU interpreter with tiny shapes
DRY = os.environ.get("KDA_DEV_DRY") == "1"
DEVICE = "cpu" if DRY else "cuda"

HEADLINE = {"B": 1, "T": 8192, "H": 16, "K": 128, "V": 128, "initial_state": False, "output_final_state": True}
OTHER_SHAPES = [
    {"B": 1, "T": 8192, "H": 96, "K": 128, "V": 128, "initial_state": False, "output_final_state": True},
    {"B": 2, "T": 16384, "H": 16, "K": 128, "V": 128, "initial_state": False, "output_final_state": True},
    {"B": 4, "T": 4096, "H": 64, "K": 128, "V": 128, "initial_state": False, "output_final_state": True},
    {"B": 4, "T": 2048, "H": 16, "K": 128, "V": 128, "initial_state": False, "output_final_state": True},
    {"B": 8, "T": 1024, "H": 8, "K": 64, "V": 64, "initial_state": False, "output_final_state": True},
]
# small shapes checked against the float64 recurrence (GPU precision of the tf32 / bf16 paths)
SMALL = [
    {"B": 2, "T": 100, "H": 3, "K": 64, "V": 32, "initial_state": True, "output_final_state": True},
    {"B": 1, "T": 1, "H": 2, "K": 16, "V": 16, "initial_state": True, "output_final_state": True},
    {"B": 1, "T": 333, "H": 2, "K": 256, "V": 128, "initial_state": True, "output_final_state": True},
]
# knob overrides of the family's defaults; the first is the default itself
if DRY:
    HEADLINE = {**HEADLINE, "T": 70, "H": 2, "K": 32, "V": 32}
    OTHER_SHAPES = [{**OTHER_SHAPES[-1], "B": 1, "T": 40, "H": 1, "K": 16, "V": 16}]
    SMALL = SMALL[:2]
# Defaults (version 4, measured right and fastest in run 5: BT32, tf32, precomputed read-out,
# subst "rows" with the 4-warp solve, 4-warp block rows, 8-warp kv scan; kernels/notes/kda.md).
# Most informative first: the loop stops when the budget runs low.  subst="direct", a 4-warp solve
# other than "rows" at BT=32, block_prog="chunk" at BT=64 / BK=64, and fuse_prep=True outside
# BT=32 / subst "rows" / 4 block warps are refused by _plan.
# Run 6 (kernels/notes/kda.md): the search loop measured version 5 (chunk + out_bv 128) 29-49 %
# slower than the defaults, with no per-stage split; the first rows split it into its parts.
# Version 6 rows (prepared, not run): au="bf16" halves the bytes of Aqk u (written by the solve,
# read by the read-out); fuse_prep=True runs the block rows and the solve of a chunk in one program
# (one launch fewer, the solve's re-reads of q, k, g and the Akk / Aqk scratch hit L1 / L2 instead
# of DRAM), at block_maxnreg 128 (4 programs/SM, 168 B spilled) or 168 (3/SM, no spill);
# block_maxnreg 168 with 2 block warps: 6 block-row programs per SM without spilling.
# Version 7 rows (prepared, not run): pair="split" -- the block rows' pairwise diagonal fallback
# (14 % of the headline's key tiles) cut exactly into 4 x 4 pairwise sub-blocks and two factored
# levels: 16.1 K warp-instructions per block-row program instead of 18.6 K (offline sm_90 SASS), but
# 183 registers (2 programs/SM); with block_maxnreg 128: 16.3 K, 4/SM, 32 B spilled.
VARIANTS = {
    "default": {},
    # version 8 (session 4, prepared): the solve's loads pipelined, u stored in bf16 (TRY_EARLY 4-6)
    "v8_stages2": {"solve_stages": 2},
    "v8_u_bf16": {"u_store": "bf16"},
    "v8": {"solve_stages": 2, "u_store": "bf16"},
    "v8_stages3": {"solve_stages": 3, "u_store": "bf16"},
    # the previous defaults, as controls (the rows below are overrides of today's defaults)
    "v6_defaults": {"pair": "full", "block_maxnreg": 0},
    "v4_defaults": {"pair": "full", "block_maxnreg": 0, "au": "fp32", "out_bv": 0},
    "split_nreg128": {"pair": "split", "block_maxnreg": 128},  # TRY_EARLY 1
    "split": {"pair": "split"},
    "block_nreg128": {"block_maxnreg": 128},  # the control for split_nreg128 (18.3 K inst, 16 B spilled)
    "out128": {"out_bv": 128},
    "chunk": {"block_prog": "chunk"},
    "v5": {"block_prog": "chunk", "out_bv": 128},
    "v6_out": {"au": "bf16", "out_bv": 128},
    "au_bf16": {"au": "bf16"},
    "fused_out_au_w4": {"fuse_output": True, "au": "bf16", "scan_warps": 4},  # TRY_EARLY 2
    "block_w2_nreg168": {"block_warps": 2, "block_maxnreg": 168},
    "fuse_nreg128": {"fuse_prep": True, "block_maxnreg": 128},
    "fuse_nreg168": {"fuse_prep": True, "block_maxnreg": 168},
    "v6": {"fuse_prep": True, "block_maxnreg": 128, "au": "bf16", "out_bv": 128},
    "v6_w2": {"block_warps": 2, "block_maxnreg": 168, "au": "bf16", "out_bv": 128},
    "block_nreg128_w2": {"block_warps": 2, "block_maxnreg": 128},
    "fused_out": {"fuse_output": True},
    "fused_out_au": {"fuse_output": True, "au": "bf16"},
    "fuse_prep": {"fuse_prep": True},
    "out64": {"out_bv": 64},
    "chunk_w8": {"block_prog": "chunk", "block_warps": 8},
    "out128_w8": {"out_bv": 128, "out_warps": 8},
    "scan_w4": {"scan_warps": 4},
    "v5_scan_w4": {"block_prog": "chunk", "out_bv": 128, "scan_warps": 4},
    "chunk_BK16": {"block_prog": "chunk", "BK": 16},
    "BT64_rows_w8": {"BT": 64, "solve_warps": 8},
    "BT64_rows_w8_out128": {"BT": 64, "solve_warps": 8, "out_bv": 128},
    "v3_extract": {"subst": "extract", "solve_warps": 8, "block_warps": 2},
    "scan_w2": {"scan_warps": 2},
    "v2": {"BT": 64, "prec": "bf16x3", "readout": "aqk", "fuse_output": True, "scan_layout": "vk", "subst": "extract",
           "block_warps": 4, "solve_warps": 8, "solve_maxnreg": 0, "scan_warps": 4, "scan_stages": 2},
    "bf16x3": {"prec": "bf16x3"},
    "readout_aqk": {"readout": "aqk"},
    "vk": {"scan_layout": "vk"},
    "solve_nreg0": {"solve_maxnreg": 0},
    "BK16": {"BK": 16},
    "BK64": {"BK": 64},
    "scan_st2": {"scan_stages": 2},
    "start": {"recentre": "start"},
    "chunk_start": {"block_prog": "chunk", "recentre": "start"},
    # session 6: the loop's best (bbf1cbe1) and this session's two block-row knobs on top of it
    "best6": {"u_store": "bf16", "scan_warps": 4, "out_bv": 64},
    "best6_tight": {"u_store": "bf16", "scan_warps": 4, "out_bv": 64, "off_tile": "tight"},
    "best6_trans": {"u_store": "bf16", "scan_warps": 4, "out_bv": 64, "diag_cols": "trans"},
    "best6_tight_trans": {"u_store": "bf16", "scan_warps": 4, "out_bv": 64, "off_tile": "tight", "diag_cols": "trans"},
    "best6_tt_w2": {"u_store": "bf16", "scan_warps": 4, "out_bv": 64, "off_tile": "tight", "diag_cols": "trans",
                    "block_warps": 2, "block_maxnreg": 168},
    "best6_scan_w2": {"u_store": "bf16", "scan_warps": 2, "out_bv": 64},
    # session 9's best6_tt_gscan (the scan in Gluon, K-slices per warp): 513.7 us of scan against 210.2, removed
    # (kernels/notes/kda.md "Session 9"; code in commit a2c815e)
}
# rows also timed at the search loop's other two shapes (B2 T16384 H16, B8 T1024 H8 D64), after
# the default and the fastest headline row: the per-token throughput rows (every stage scales with
# tokens x heads there; the fused read-out trades a slower scan for 268 MB less traffic per
# headline's worth of tokens -- with 4 scan warps (172 regs) two scan programs fit per SM, with 8
# (162 regs x 256 threads) only one, so at B2 T16384 the 8-warp fused scan would run in two waves)
SHAPE_ROWS = ["v8", "v8_stages2", "v8_u_bf16", "v4_defaults"]
SHAPE_ROWS += ["best6", "best6_tight_trans", "best6_tt_w2"]
# KDA_DEV_ROWS=name,name,...: only these rows (the default is always kept first)
if os.environ.get("KDA_DEV_ROWS"):
    _keep = [n.strip() for n in os.environ["KDA_DEV_ROWS"].split(",") if n.strip()]
    VARIANTS = {"default": {}, **{n: VARIANTS[n] for n in _keep if n in VARIANTS}}
if DRY and not os.environ.get("KDA_DEV_ROWS"):
    VARIANTS = {k: VARIANTS[k] for k in ("default", "v8", "v6_defaults", "v5", "fused_out_au_w4", "BT64_rows_w8_out128")}


# --ncu / --stages: the default knobs at these shapes (the headline first; B2 T16384 is the loop's
# large shape, where no per-stage split exists yet); KDA_DEV_NCU_KNOBS='{"au": "bf16"}' overrides knobs
NCU_CASES = [HEADLINE, {**HEADLINE, "B": 2, "T": 16384, "H": 16}]
if DRY:
    NCU_CASES = [HEADLINE]


def left() -> float:
    return BUDGET_S - (time.time() - T0)


def log(*args) -> None:
    print(f"[{time.time() - T0:6.1f}s]", *args, flush=True)


def save(name: str, obj) -> None:
    with open(os.path.join(OUT, name), "w") as f:
        json.dump(obj, f, indent=1, default=str)


def family_and_problem():
    import torch  # noqa: F401

    if DRY:
        from pytest_kopt import interpret

        interpret.configure(True)

    from pytest_kopt.kernels.families import kda_chunked as fam
    from pytest_kopt.problems.kda import KDAProblem

    return fam, KDAProblem()


def run_variant(fam, knobs, x, debug=None):
    return fam.kda_chunked(x["q"], x["k"], x["v"], x["g"], x["beta"], x.get("scale"), x["initial_state"],
                           x["output_final_state"], knobs, debug)


def warm(variant_json: str, cases_json: str) -> None:
    """Child process: compile a variant by running it once per case shape."""
    import torch

    if DRY:
        return
    fam, prob = family_and_problem()
    knobs = {**fam.KNOBS, **json.loads(variant_json)}
    for case in json.loads(cases_json):
        x = prob.make_inputs(case, device=DEVICE, seed=0)
        run_variant(fam, knobs, x)
    if not DRY:
        torch.cuda.synchronize()


def stage_times(fn, reps: int = 10) -> list:
    """Per-kernel device time (us) of one call, in launch order, median over reps calls, each with
    the L2 flushed (256 MB written) before it; rows (name, us).  Empty on the CPU."""
    if DRY:
        fn()
        return []
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    fn()
    torch.cuda.synchronize()
    per_call = []
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(reps):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    events = [e for e in p.events() if "kda" in e.name and e.device_type == DeviceType.CUDA]
    events.sort(key=lambda e: e.time_range.start if e.time_range is not None else 0)
    for e in events:
        t = e.time_range.elapsed_us() if e.time_range is not None else e.device_time_total
        per_call.append((e.name.split("(")[0][-24:], float(t)))
    n = len(per_call) // reps if reps else 0
    rows = []
    for i in range(n):
        ts = sorted(per_call[c * n + i][1] for c in range(reps))
        rows.append((per_call[i][0], round(ts[len(ts) // 2], 1)))
    return rows


STAGE_NAMES = ("block rows", "solve", "scan", "out")


def label_stages(rows: list) -> dict:
    """{stage: us} for the default four-launch pipeline (names by launch order)."""
    names = STAGE_NAMES if len(rows) == 4 else None
    return {names[i] if names else f"{i}:{n}": t for i, (n, t) in enumerate(rows)}


def ncu_mode(stages_only: bool = False) -> int:
    """Under ncu (--profile-from-start off): the default knobs at NCU_CASES, each run once to compile,
    then once between cudaProfilerStart / Stop, so that every launch of one call (block rows, solve,
    scan, out) is profiled exactly once per shape.  stages_only: no profiler range, per-stage
    profiler timings instead (stage_times)."""
    if DRY:
        from pytest_kopt import interpret

        interpret.configure(True)
    import torch

    fam, prob = family_and_problem()
    knobs = {**fam.KNOBS, **json.loads(os.environ.get("KDA_DEV_NCU_KNOBS", "{}"))}
    reps = int(os.environ.get("KDA_DEV_STAGE_REPS", "10"))
    out = {"knobs": knobs, "cases": {}}
    for case in NCU_CASES:
        label = prob.describe(case)
        x = prob.make_inputs(case, device=DEVICE, seed=0)
        run_variant(fam, knobs, x)  # compile + warm
        if not DRY:
            torch.cuda.synchronize()
        if stages_only:
            rows = stage_times(lambda: run_variant(fam, knobs, x), reps)
            out["cases"][label] = {"stages_us": label_stages(rows), "total_us": round(sum(t for _, t in rows), 1)}
            log(label, out["cases"][label])
        else:
            if not DRY:
                torch.cuda.profiler.start()
            run_variant(fam, knobs, x)
            if not DRY:
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
            log(f"ncu target done: default {label}")
        del x
        if not DRY:
            torch.cuda.empty_cache()
    save("dev_kda_stages.json" if stages_only else "dev_kda_ncu_targets.json", out)
    return 0


def warm_case(case: dict) -> dict:
    # same integer specialisations as the timed shapes (T, NT, TP, H divisible by 16), shorter
    return {**case, "B": 1, "T": 2048, "H": 16 if case["H"] % 16 == 0 else case["H"]}


def intermediates_reference(x, BT):
    """w, u, kd, qd, Aqk, Akk, gl of every chunk in float64 (plain PyTorch), laid out like the
    family's [B*H, TP, *] intermediates."""
    import torch

    q, k, v, g, beta = (x[n].double() for n in ("q", "k", "v", "g", "beta"))
    B, T, H, K = q.shape
    scale = K ** -0.5 if x.get("scale") is None else x["scale"]
    N = -(-T // BT)
    pad = N * BT - T

    def chunks(t):
        t = t.transpose(1, 2)
        if pad:
            t = torch.cat([t, t.new_zeros(*t.shape[:2], pad, *t.shape[3:])], dim=2)
        return t.reshape(B, H, N, BT, *t.shape[3:])

    qc, kc, vc, gc, bc = (chunks(t) for t in (q, k, v, g, beta))
    G = gc.cumsum(3)
    causal = torch.ones(BT, BT, dtype=torch.bool, device=q.device).tril()
    dec = torch.exp((G.unsqueeze(-2) - G.unsqueeze(-3)).masked_fill(~causal[:, :, None], float("-inf")))
    aqk = (qc.unsqueeze(-2) * dec * kc.unsqueeze(-3)).sum(-1) * scale
    akk = ((kc.unsqueeze(-2) * dec * kc.unsqueeze(-3)).sum(-1) * bc.unsqueeze(-1)).tril(-1)
    a_wy = torch.linalg.inv(torch.eye(BT, dtype=q.dtype, device=q.device) + akk) * bc.unsqueeze(-2)
    w, u, qd = a_wy @ (kc * torch.exp(G)), a_wy @ vc, qc * scale * torch.exp(G)
    out = {
        "w": w, "u": u,
        "kd": kc * torch.exp(G[..., -1:, :] - G), "qd": qd,
        "aqk": aqk, "akk": akk, "gl": torch.exp(G[..., -1, :]),
        "qd_pre": qd - aqk @ w, "au": aqk @ u,  # readout "pre": qd' = qd - Aqk w, Aqk u
    }
    return {n: t.reshape(B * H, N * BT, -1) if n != "gl" else t.reshape(B * H, N, -1) for n, t in out.items()}


def compare_intermediates(fam, prob, knobs, x):
    import torch

    from pytest_kopt.problems.base import rel_rms

    dbg = {}
    run_variant(fam, knobs, x, dbg)
    want = intermediates_reference(x, dbg["BT"])
    if knobs["subst"] == "rows":
        # the scratch holds (I + Akk_bb)^-1 in each diagonal BC x BC block (version 4)
        BT, BC = dbg["BT"], knobs["BC"]
        akk = want["akk"].reshape(want["akk"].shape[0], -1, BT // BC, BC, BT).clone()
        for b in range(BT // BC):
            blk = akk[:, :, b, :, b * BC:(b + 1) * BC]
            akk[:, :, b, :, b * BC:(b + 1) * BC] = torch.linalg.inv(torch.eye(BC, dtype=blk.dtype, device=blk.device) + blk)
        want["akk"] = akk.reshape(want["akk"].shape)
    got = {n: dbg[n] for n in ("w", "u", "kd", "akk", "gl")}
    got["aqk"] = dbg["aqk"][0].float() + dbg["aqk"][1].float()
    if dbg.get("pre"):
        got["qd_pre"], got["au"] = dbg["qd"], dbg["au"]
    else:
        got["qd"] = dbg["qd"]
    return {n: rel_rms(got[n].float(), want[n]) for n in got}


def hostile(x, seed=3):
    """The problem's inputs with harder gates: -3e4 every 4th step in some heads, -10 runs."""
    g = x["g"].clone()
    g[:, 3::4, ::2] = -3.0e4
    g[:, 100:160, 1::2] = -10.0
    return {**x, "g": g}


def print_table(results, prob, cost) -> None:
    print("\n== headline", prob.describe(HEADLINE), "| byte floor", f"{cost.bytes / 4.25e12 * 1e6:.0f} us", flush=True)
    fla = results["fla"].get(prob.describe(HEADLINE), {})
    fla_us = fla.get("us")
    print(f"{'variant':16s} {'dev us':>8s} {'vs fla':>7s} {'err o':>8s} {'err S':>8s}  kernels (us)")
    for name, row in results["variants"].items():
        if "us" not in row:
            print(f"{name:16s} ERROR {row.get('error', '')[:150]}")
            continue
        sp = f"{fla_us / row['us']:.2f}x" if fla_us else "-"
        ks = " ".join(f"{n[4:-7]}={t}" for n, t in row.get("kernels", []))
        print(f"{name:16s} {row['us']:8.1f} {sp:>7s} {row['err'].get('o', 0):8.2e} {row['err'].get('final_state', 0):8.2e}  {ks}")
    if fla_us:
        print(f"{'fla chunk_kda':16s} {fla_us:8.1f} {'1.00x':>7s} {fla['err'].get('o', 0):8.2e} "
              f"{fla['err'].get('final_state', 0):8.2e}  host {fla.get('host_us', 0):.0f} us/call, "
              f"first call {fla['first_call_s']:.0f}s", flush=True)


def main() -> None:
    if DRY:
        from pytest_kopt import interpret

        interpret.configure(True)  # before triton is imported: jit decorators read it
    import torch
    import triton

    from pytest_kopt.judge.timing import median_us

    results = {"variants": {}, "fla": {}, "shapes": {}, "small": {}, "notes": [],
               "timer": "pytest_kopt.judge.timing.median_us (device us; host_us: host time per call)"}
    dev = "cpu (dry run)" if DRY else torch.cuda.get_device_name()
    results["env"] = {"gpu": dev, "torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0]}
    log("env", results["env"])
    fam, prob = family_and_problem()

    # ---- 1. compile every variant in parallel children --------------------------------
    jobs = []
    todo = [(name, ov, [warm_case(HEADLINE)]) for name, ov in VARIANTS.items()]
    todo += [(f"default-{prob.describe(c)}", {}, [c]) for c in SMALL + [warm_case(OTHER_SHAPES[-1])]]
    # the SHAPE_ROWS at the small-head shape (K = V = 64: its own compile; B2 T16384 reuses the headline's)
    todo += [(f"{n}-{prob.describe(OTHER_SHAPES[-1])}", VARIANTS[n], [warm_case(OTHER_SHAPES[-1])])
             for n in SHAPE_ROWS if n in VARIANTS]
    todo += [(f"{n}-small", VARIANTS[n], SMALL) for n in ("v6", "fused_out_au_w4") if n in VARIANTS]
    for name, ov, cases in todo:
        jobs.append((name, subprocess.Popen([sys.executable, __file__, "--warm", json.dumps(ov), json.dumps(cases)],
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    # ceilings while they compile (they barely touch the GPU)
    try:
        if DRY:
            raise RuntimeError("dry run: no ceilings")
        n = 1 << 28
        a = torch.empty(n, dtype=torch.float32, device="cuda").uniform_()
        b = torch.empty_like(a)
        copy_ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=10, rep=50, return_mode="median")
        m = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        mm_ms = triton.testing.do_bench(lambda: m @ m, warmup=10, rep=50, return_mode="median")
        results["ceilings"] = {"copy_TBps": 2 * n * 4 / copy_ms / 1e9, "bf16_TFLOPs": 2 * 8192**3 / mm_ms / 1e9,
                               "measured_while_compiling": True}
        del a, b, m
    except Exception as err:  # noqa: BLE001
        results["ceilings"] = {"error": repr(err)}
    log("ceilings", results["ceilings"])
    for name, proc in jobs:
        try:
            # KDA_DEV_WARM_S caps the wait (a variant that hangs would otherwise hold the call until left() - 150)
            out, _ = proc.communicate(timeout=max(5.0, min(left() - 150, float(os.environ.get("KDA_DEV_WARM_S", "1e9")))))
            if proc.returncode != 0:
                results["notes"].append(f"warm {name} failed: {out[-1500:]}")
                log(f"warm {name} FAILED:\n{out[-1500:]}")
        except subprocess.TimeoutExpired:
            proc.kill()
            results["notes"].append(f"warm {name} timed out")
            log(f"warm {name} timed out")
    log("compiled")
    save("dev_kda_chunked.json", results)

    from pytest_kopt.kernels.reference.kda import chunk_kda_reference, naive_recurrent_kda

    def errors(got, want):
        return {e.name: e.rel_rms for e in prob.compare(got, want)}

    def bench(fn, with_host=False):
        """Median device time of fn (us) with the judge's flush and host window; with_host: (us, host us).
        50 rounds of (call + ~1.1 ms flush and window): 0.1-0.4 s a figure, do_bench's 25 + 150 ms
        or a little more, which the budget checks below allow for.  One round on the CPU."""
        return median_us(fn, DEVICE, rounds=1 if DRY else 50, warmup_rounds=0 if DRY else 5, with_host=with_host)

    def breakdown(fn):
        """Per-kernel device time of one call, in launch order (us)."""
        if DRY:
            return []
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            fn()
            torch.cuda.synchronize()
        rows = []
        for e in p.events():
            if "kda" not in e.name or e.device_type != DeviceType.CUDA:
                continue
            t = e.time_range.elapsed_us() if e.time_range is not None else e.device_time_total
            rows.append((e.name.split("(")[0][-24:], round(float(t), 1)))
        return rows

    # ---- 2. the variants at the headline ------------------------------------------------
    x = prob.make_inputs(HEADLINE, device=DEVICE, seed=0)
    ref = chunk_kda_reference(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, True, chunk_size=64)
    cost = prob.cost(HEADLINE)
    results["headline_cost"] = {"bytes": cost.bytes, "flops": cost.flops}
    best = None
    for name, ov in VARIANTS.items():
        if left() < 120:
            results["notes"].append(f"variant {name} skipped: out of time")
            continue
        knobs = {**fam.KNOBS, **ov}
        row = {"knobs": ov}
        try:
            got = run_variant(fam, knobs, x)
            row["err"] = errors(got, ref)
            row["us"] = bench(lambda: run_variant(fam, knobs, x))
            row["kernels"] = breakdown(lambda: run_variant(fam, knobs, x))
            ok = all(v <= 5e-3 for v in row["err"].values())
            row["ok"] = ok
            if ok and (best is None or row["us"] < results["variants"][best]["us"]):
                best = name
        except Exception as err:  # noqa: BLE001
            row["error"] = f"{type(err).__name__}: {err}"[:800]
            row["trace"] = traceback.format_exc()[-2000:]
        results["variants"][name] = row
        log(name, {k: v for k, v in row.items() if k != "trace"})
        save("dev_kda_chunked.json", results)

    print_table(results, prob, cost)

    # ---- 3. GPU precision on small shapes (default knobs) vs the float64 recurrence ----
    # (and the version-6 rows: the fused preparation at T = 1 among them -- run 4 saw an illegal
    # memory access there with an older fused preparation at BT 64)
    for case in SMALL:
        try:
            xs = prob.make_inputs(case, device=DEVICE, seed=1)
            want = naive_recurrent_kda(**xs)
            results["small"][prob.describe(case)] = errors(fam.kernel(**xs), want)
            for name in ("v6", "fused_out_au_w4"):
                if name in VARIANTS and left() > 100:
                    got = run_variant(fam, {**fam.KNOBS, **VARIANTS[name]}, xs)
                    results["small"][f"{prob.describe(case)} {name}"] = errors(got, want)
        except Exception as err:  # noqa: BLE001
            results["small"][prob.describe(case)] = f"{type(err).__name__}: {err}"[:500]
    log("small", results["small"])

    # ---- 3b. intermediates vs float64 (which stage is wrong, if any) and hostile gates ---
    results["intermediates"] = {}
    diag_case = warm_case(HEADLINE) if not DRY else HEADLINE
    xd = prob.make_inputs(diag_case, device=DEVICE, seed=5)
    for name in ("default", "v6", "v6_out", "v5", "chunk", "v2", "BT64_rows_w8", "bf16x3"):
        if name not in VARIANTS or left() < 110:
            continue
        try:
            results["intermediates"][name] = compare_intermediates(fam, prob, {**fam.KNOBS, **VARIANTS[name]}, xd)
        except Exception as err:  # noqa: BLE001
            results["intermediates"][name] = f"{type(err).__name__}: {err}"[:500]
    log("intermediates", results["intermediates"])
    try:
        xh = hostile(prob.make_inputs(diag_case, device=DEVICE, seed=6))
        want = naive_recurrent_kda(**xh)
        results["hostile"] = {name: errors(run_variant(fam, {**fam.KNOBS, **VARIANTS[name]}, xh), want)
                              for name in ("default", "v6", "v6_w2", "v5", "chunk_w8", "chunk_start", "v2", "start")
                              if name in VARIANTS}
    except Exception as err:  # noqa: BLE001
        results["hostile"] = f"{type(err).__name__}: {err}"[:500]
    log("hostile", results["hostile"])
    save("dev_kda_chunked.json", results)

    # ---- 4. fla's chunk_kda at the headline (first call autotunes for ~85 s) -----------
    fla_fn = None
    try:
        if DRY:
            raise RuntimeError("dry run: fla not timed")
        bl = [b for b in prob.baselines("cuda") if b.name.startswith("fla")]
        fla_fn = bl[0].fn if bl else None
    except Exception as err:  # noqa: BLE001
        results["notes"].append(f"fla import failed: {err!r}")
    if fla_fn is not None and left() > 100:
        try:
            t = time.time()
            got = fla_fn(**x)
            torch.cuda.synchronize()
            log(f"fla first call {time.time() - t:.1f}s")
            first = time.time() - t
            us, host = bench(lambda: fla_fn(**x), with_host=True)
            results["fla"][prob.describe(HEADLINE)] = {"us": us, "host_us": host, "err": errors(got, ref), "first_call_s": first}
        except Exception as err:  # noqa: BLE001
            results["fla"][prob.describe(HEADLINE)] = {"error": f"{type(err).__name__}: {err}"[:800]}
        log("fla", results["fla"])
        # my best again right after fla (same machine state)
        if best is not None:
            results["variants"][best]["us_after_fla"] = bench(lambda: run_variant(fam, {**fam.KNOBS, **VARIANTS[best]}, x))
    save("dev_kda_chunked.json", results)

    # ---- 5. the best variant (and the default) on fla's other shapes -------------------
    del x, ref
    if not DRY:
        torch.cuda.empty_cache()
    chosen = [("default", {})] + ([(best, VARIANTS[best])] if best not in (None, "default") else [])
    extra = [(n, VARIANTS[n]) for n in SHAPE_ROWS if n in VARIANTS and n != best
             and results["variants"].get(n, {}).get("ok")]
    for case in OTHER_SHAPES:
        if left() < 25:
            results["notes"].append(f"shape {prob.describe(case)} skipped: out of time")
            continue
        label = prob.describe(case)
        entry = {}
        try:
            xs = prob.make_inputs(case, device=DEVICE, seed=0)
            want = chunk_kda_reference(xs["q"], xs["k"], xs["v"], xs["g"], xs["beta"], None, None, True, chunk_size=64)
            loop_shape = (case["B"], case["T"], case["H"]) in ((2, 16384, 16), (8, 1024, 8)) or DRY
            for name, ov in chosen + (extra if loop_shape else []):
                if name != "default" and left() < 30:
                    continue
                knobs = {**fam.KNOBS, **ov}
                entry[name] = {"err": errors(run_variant(fam, knobs, xs), want), "us": bench(lambda: run_variant(fam, knobs, xs))}
                if name == "default" and (case["B"], case["T"], case["H"]) == (2, 16384, 16) or DRY and name == "default":
                    # the per-stage split where the loop measured 3187 us (issue 5): none existed
                    rows = stage_times(lambda: run_variant(fam, knobs, xs), 5)
                    entry[name]["stages"] = label_stages(rows)
                    results.setdefault("stages", {})[label] = entry[name]["stages"]
            if fla_fn is not None and case["H"] == 16 and case["K"] == 128 and left() > 40:
                got = fla_fn(**xs)
                us, host = bench(lambda: fla_fn(**xs), with_host=True)
                entry["fla"] = {"err": errors(got, want), "us": us, "host_us": host}
            del xs, want
            if not DRY:
                torch.cuda.empty_cache()
        except Exception as err:  # noqa: BLE001
            entry["error"] = f"{type(err).__name__}: {err}"[:800]
        results["shapes"][label] = entry
        log(label, entry)
        save("dev_kda_chunked.json", results)

    # ---- table ----------------------------------------------------------------------------
    print_table(results, prob, cost)
    print("small (float64 recurrence):", json.dumps(results["small"]))
    print("intermediates (rel RMS vs float64):", json.dumps(results.get("intermediates", {})))
    print("hostile gates (float64 recurrence):", json.dumps(results.get("hostile", {})))
    for label, entry in results["shapes"].items():
        print(label, json.dumps({k: ({kk: (round(vv, 1) if kk in ("us", "host_us") else vv) for kk, vv in v.items()} if isinstance(v, dict) else v) for k, v in entry.items()}))
    if results.get("stages"):
        print("default per-stage us (L2 flushed, median):", json.dumps(results["stages"]))
    for note in results["notes"]:
        print("note:", note[:300])
    results["wall_s"] = time.time() - T0
    save("dev_kda_chunked.json", results)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--warm":
        warm(sys.argv[2], sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] in ("--ncu", "--stages"):
        sys.exit(ncu_mode(stages_only=sys.argv[1] == "--stages"))
    else:
        main()
