"""Static limiter analysis of the chunked KDA family on sm_90, without a GPU (issue 5).

    .venv/bin/python tools/sass_kda.py [--knobs '{"au": "bf16"}'] [--B 1 --T 8192 --H 16 --K 128 --V 128]
                                           [--measured '{"rows": 334.9, "solve": 172.4, "scan": 228.1, "out": 142.1}']
                                           [--json out.json] [--dump DIR]

For each of the four kernels of the default (unfused) pipeline -- block rows (the first
``_kda_prep_kernel`` launch, STAGE 1), solve (STAGE 2), scan, out -- at the given knobs and shape:

1. compile for sm_90 exactly as the launch would (the family's ``_plan`` and its constexprs; every
   integer argument specialised the way Triton's launcher does: 1 -> constexpr, multiples of 16 ->
   divisibility 16; pointers 16-byte aligned), through ``triton.compile(..., GPUTarget("cuda", 90, 32))``;
2. disassemble the cubin with the nvdisasm Triton ships (line info on), find the loops (backward
   branches) and weight every instruction by how often one program executes it: the trip counts of
   its enclosing loops (from the shape: key tiles, chunks, ...) times the probability of its
   run-time branch (block rows: ``bi > 0`` half the programs; the pairwise diagonal fallback on the
   measured fraction of (block, key tile) pairs -- computed here from the problem's own gates);
3. count per program: MUFU (ex2 etc.), tensor-core ops (HMMA / HGMMA and their shapes, FLOPs),
   FP32 pipe ops (FFMA / FADD / FMUL / FMNMX / FSETP / FSEL ...), integer / conversion ops, global
   and shared loads and stores (instructions and bytes), barriers, shuffles, and all instructions;
4. occupancy (programs per SM from registers, shared memory and warps), waves, and per resource a
   lower bound on the stage's time = (total work of the grid) / (the H200's per-SM rate x SMs x
   clock), with the latency-bound "issue per warp" view next to it.

Assumed H200 (SXM, sm_90) rates, per SM per clock (the sources are named in RATES below).
What this cannot see: dynamic stalls (memory latency, dependencies, barriers), L1/L2 hit rates,
bank conflicts.  Those are what ``tools/dev_kda_chunked.py --ncu`` measures on the GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# ---- the H200's per-SM throughputs (per clock) and clocks ------------------------------------
RATES = {
    # 132 SMs, 1.98 GHz max boost: H100/H200 SXM datasheet / whitepaper (the H200 is the H100 SXM die);
    # under load the H200 holds ~1.75-1.98 GHz -- the bounds use 1.98 (the most optimistic)
    "sms": 132, "clock_ghz": 1.98,
    # FP32: 128 lanes per SM -> 4 warp-instructions per clock (Hopper whitepaper, SM diagram: 32 FP32
    # units per SM sub-partition); FFMA/FADD/FMUL/FSETP/FMNMX/FSEL all issue to it
    "fp32_warp_inst_per_clk": 4.0,
    # MUFU (ex2, rcp, lg2 ...): 16 lanes per SM -> 0.5 warp-instruction per clock (CUDA C programming
    # guide, arithmetic instruction throughput table, cc 9.0: 16 results/clk/SM for exp2/log2/rcp/rsqrt)
    "mufu_warp_inst_per_clk": 0.5,
    # integer (IMAD/IADD3/LOP3/SHF/ISETP...): 64 lanes/SM for IMAD, 64-128 for the rest (programming
    # guide table): take 2 warp-instructions / clk for the whole integer class (conservative mix)
    "int_warp_inst_per_clk": 2.0,
    # conversions F2F / F2FP / I2F...: 16 lanes/SM for 32-bit type conversions (programming guide);
    # F2FP.BF16.F32.PACK_AB (two values) is on the FMA-lite path on sm_90 and is treated as FP32 here
    "cvt_warp_inst_per_clk": 0.5,
    # warp shuffle: 32 results/clk/SM (programming guide table, cc 9.0) -> 1 warp-instruction / clk
    "shfl_warp_inst_per_clk": 1.0,
    # one warp-instruction issued per clock per sub-partition: 4 per SM (whitepaper: 4 schedulers)
    "issue_warp_inst_per_clk": 4.0,
    # tensor cores, dense: bf16/fp16 989 TFLOP/s, tf32 495 at 1.83 GHz boost x 132 SMs (H100 SXM
    # datasheet) -> 4096 bf16 FLOP/clk/SM (1024 per sub-partition), tf32 half.  mma.sync (HMMA) on
    # Hopper reaches at most ~half to two thirds of the wgmma rate in microbenchmarks (e.g. Luo et al.
    # 2024, "Benchmarking and dissecting the Nvidia Hopper GPU architecture"): take 0.5 for HMMA
    "tc_bf16_flop_per_clk": 4096.0, "tc_tf32_flop_per_clk": 2048.0, "hmma_fraction": 0.5,
    # DRAM: 4.8 TB/s datasheet, ~4.0-4.25 TB/s copy measured (KINDS.md / dev runs): use 4.0
    "dram_TBps": 4.0,
    # shared memory: 32 banks x 4 B -> 128 B/clk/SM when conflict-free (HOPPER.md; programming guide);
    # bank conflicts only lower it.  Counted: LDS/LDSM/STS/LDGSTS/local bytes as 32 lanes x width
    "smem_B_per_clk": 128.0,
    # LSU: one global/shared memory warp-instruction per clock per SM (address generation; 4 sub-
    # partitions share the MIO queue) -- an approximate figure, not a datasheet one
    "lsu_warp_inst_per_clk": 1.0,
    # limits per SM (CUDA occupancy calculator, cc 9.0)
    "regs_per_sm": 65536, "max_warps": 64, "max_ctas": 32, "smem_per_sm": 228 * 1024, "smem_per_cta_reserved": 1024,
}

BIN = None
for cand in (ROOT / ".venv/lib").glob("python*/site-packages/triton/backends/nvidia/bin"):
    BIN = cand


# ---- compile ----------------------------------------------------------------------------------
def _spec(value):
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend

    return native_specialize_impl(CUDABackend, value, False, True, True)


def compile_kernel(fn, args: dict, constexprs: dict, warps: int, stages: int, maxnreg: int | None = None):
    """args: name -> pointer type string ('*bf16') or a Python int / float (the launch value)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, attrs, consts = {}, {}, dict(constexprs)
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
            continue
        v = args[name]
        if isinstance(v, str):  # a pointer: torch allocations are 16-byte aligned
            sig[name] = v
            attrs[(i,)] = [["tt.divisibility", 16]]
            continue
        ty, key = _spec(v)
        if ty == "constexpr":
            sig[name] = "constexpr"
            consts[name] = v
            continue
        sig[name] = ty
        if key == "D":
            attrs[(i,)] = [["tt.divisibility", 16]]
    opts = {"num_warps": warps, "num_stages": stages}
    if maxnreg:
        opts["maxnreg"] = maxnreg
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=opts)


def build_all(fam, knobs: dict, shape: dict) -> dict:
    """The four launches of the unfused pipeline: name -> (compiled, grid programs, warps)."""
    B, T, H, K, V = (shape[n] for n in ("B", "T", "H", "K", "V"))
    kn = {**fam.KNOBS, **knobs}
    if kn["fuse_prep"] or kn["fuse_output"]:
        raise SystemExit("sass_kda.py covers the four-launch pipeline (fuse_prep / fuse_output False)")
    plan = fam._plan(K, V, kn)
    BT = plan["BT"]
    NT = -(-T // BT)
    TP = NT * BT
    BH = B * H
    P, B16 = "*fp32", "*bf16"
    AU = B16 if kn["au"] == "bf16" else P
    U = B16 if plan.get("u_bf16") else P  # version 8's u_store
    qs = (T * H * K, H * K, K)
    vs = (T * H * V, H * V, V)
    bs = (T * H, H, 1)
    prep = {"q_ptr": B16, "k_ptr": B16, "v_ptr": B16, "g_ptr": P, "beta_ptr": B16, "w_ptr": B16, "u_ptr": U,
            "kd_ptr": B16, "qd_ptr": B16, "aqk_ptr": B16, "akk_ptr": P, "gl_ptr": P, "au_ptr": AU, "gs_ptr": P, "gt_ptr": P, "flag_ptr": "*i32",
            "scale": float(K ** -0.5), "T": T, "TP": TP, "NT": NT, "H": H, "lo_off": BH * TP * BT}
    for pre, st in (("q", qs), ("k", qs), ("v", vs), ("g", qs), ("b", bs)):
        prep.update({f"s_{pre}b": st[0], f"s_{pre}t": st[1], f"s_{pre}h": st[2]})
    pmeta = dict(K=K, V=V, BT=BT, BC=plan["BC"], BK=plan["BK"], BKP=plan["BKP"], BVP=plan["BVP"], DK=plan["DK"],
                 LOG_NC=plan["LOG_NC"], RECENTRE=plan["RECENTRE"], LIMIT=plan["LIMIT"], MERGE=plan["MERGE"],
                 TF32=plan["TF32"], PRE=plan["PRE"], SUBST=plan["SUBST"], LOG_BC=plan["LOG_BC"], HOIST=plan["HOIST"],
                 CHUNK=plan["CHUNK"], SB=plan["SB"], LOG_NS=plan["LOG_NS"], DKS=plan["DKS"],
                 OFFW=plan["OFFW"], DIAG_TRANS=plan["DIAG_TRANS"], FLOOR=plan["FLOOR"], KD_SUM=plan["KD_SUM"], INV=plan["INV"],
                 PREFETCH=plan["PREFETCH"])
    rows_grid = (NT if plan["CHUNK"] else NT * (BT // plan["BC"])) * BH
    out = {}
    out["rows"] = (compile_kernel(fam._kda_prep_kernel, prep, {**pmeta, "STAGE": 1, "FLAG": False}, kn["block_warps"], 1,
                                  plan.get("BLOCK_MAXNREG", kn["block_maxnreg"]) or None), rows_grid, kn["block_warps"])
    out["solve"] = (compile_kernel(fam._kda_prep_kernel, prep, {**pmeta, "STAGE": 2, "FLAG": plan["FLAG"]}, kn["solve_warps"],
                                   plan.get("solve_stages", 1),
                                   kn["solve_maxnreg"] or None), NT * BH, kn["solve_warps"])
    split = plan["split"]
    common = {"T": T, "TP": TP, "NT": NT, "H": H, "lo_off": BH * TP * BT, "s_ob": vs[0], "s_ot": vs[1], "s_oh": vs[2]}
    scan = {"w_ptr": B16, "u_ptr": U, "kd_ptr": B16, "qd_ptr": B16, "aqk_ptr": B16, "gl_ptr": P, "au_ptr": AU,
            "h0_ptr": B16, "ht_ptr": P, "o_ptr": B16, "hbuf_ptr": P if split else B16, "dbuf_ptr": P,
            **common}
    BV = plan["BV"]
    out["scan"] = (compile_kernel(fam._kda_scan_kernel, scan,
                                  dict(K=K, V=V, BT=BT, BV=BV, LAYOUT=plan["layout"], FUSE_OUT=False, SPLIT_S=split,
                                       USE_H0=False, STORE_HT=True, PRE=plan["PRE"]),
                                  kn["scan_warps"], plan["scan_stages"]), -(-V // BV) * BH, kn["scan_warps"])
    OBV = plan["OUT_BV"]
    o_args = {"qd_ptr": B16, "aqk_ptr": B16, "hbuf_ptr": P if split else B16, "dbuf_ptr": P, "o_ptr": B16,
              "au_ptr": AU, **common}
    out["out"] = (compile_kernel(fam._kda_out_kernel, o_args,
                                 dict(K=K, V=V, BT=BT, BV=OBV, SPLIT_S=split, PRE=plan["PRE"]), kn["out_warps"], 2),
                  NT * -(-V // OBV) * BH, kn["out_warps"])
    return {"plan": plan, "knobs": kn, "NT": NT, "kernels": out}


# ---- SASS -------------------------------------------------------------------------------------
def disassemble(cubin: bytes, workdir: Path, name: str) -> tuple[list[dict], dict]:
    """Instructions [{addr, op, text, pred, line}] with the Python source line (nvdisasm -g) of
    each, and the addresses of the branch labels."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"{name}.cubin"
    path.write_bytes(cubin)
    txt = subprocess.run([str(BIN / "nvdisasm"), "-c", "-g", str(path)], capture_output=True, text=True,
                         check=True).stdout
    (workdir / f"{name}.sass").write_text(txt)
    insts, labels, pending, line = [], {}, [], None
    for raw in txt.splitlines():
        s = raw.strip()
        m = re.match(r"^(\.L_x_\d+):", s)
        if m:
            pending.append(m.group(1))
            continue
        if s.startswith("//##"):
            m = re.search(r"line (\d+)", s)
            line = int(m.group(1)) if m else line
            continue
        m = re.match(r"^/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*$", s)
        if not m:
            continue
        addr = int(m.group(1), 16)
        for lab in pending:
            labels[lab] = addr
        pending = []
        body = m.group(2).rstrip(" ;")
        pred = ""
        if body.startswith("@"):
            pred, body = body.split(None, 1)
        insts.append({"addr": addr, "op": body.split()[0], "text": body, "pred": pred, "line": line})
    return insts, labels


def weights(insts: list[dict], labels: dict, loop_trips: dict, branch_prob: dict,
            tags: list | None = None) -> list[float]:
    """How many times one warp of one program executes each instruction.  loop_trips: source line
    of a loop's backward branch -> trip count; branch_prob: source line of a forward conditional
    branch -> probability that the code it jumps over runs (an if / else pair -- the if-region ending
    in an unconditional forward branch -- gets 1 - p for the else side).  Unlisted forward branches
    (masked stores, reduction ladders: a few instructions each) are counted as executed.  tags, if
    given, receives per instruction the innermost annotated region ("if L" / "else L" / "loop L")."""
    w = [1.0] * len(insts)
    tag = ["top"] * len(insts)
    idx = {ins["addr"]: i for i, ins in enumerate(insts)}

    def target(ins):
        m = re.search(r"(\.L_x_\d+)", ins["text"])
        return labels.get(m.group(1)) if m else None

    for i, ins in enumerate(insts):
        if not ins["op"].startswith("BRA"):
            continue
        tgt = target(ins)
        if tgt is None:
            continue
        if tgt <= ins["addr"] and ins["line"] in loop_trips:  # a loop: [tgt, branch]
            for j in range(idx[tgt], i + 1):
                w[j] *= loop_trips[ins["line"]]
                tag[j] = f"loop {ins['line']}" if tag[j] == "top" else tag[j]
        elif tgt > ins["addr"] and ins["pred"] and ins["line"] in branch_prob:
            p = branch_prob[ins["line"]]
            j_end = idx[tgt]
            for j in range(i + 1, j_end):
                w[j] *= p
                tag[j] = f"if {ins['line']}"
            last = insts[j_end - 1]
            if last["op"].startswith("BRA") and not last["pred"]:
                else_end = target(last)
                if else_end is not None and else_end > tgt:
                    for j in range(j_end, idx[else_end]):
                        w[j] *= 1.0 - p
                        tag[j] = f"else {ins['line']}"
    if tags is not None:
        tags[:] = tag
    return w


def classify(op: str, text: str):
    """(class, bytes per thread for memory ops)."""
    base = op.split(".")[0]
    width = 4
    m = re.search(r"\.(8|16|32|64|128)\b", op)
    if m:
        width = int(m.group(1)) // 8
    if op.startswith(("LDG", "LDGSTS")):
        return ("ldgsts" if base == "LDGSTS" else "ldg"), width
    if base == "STG":
        return "stg", width
    if base in ("LDS", "LDSM"):
        if base == "LDSM":  # ldmatrix: .x1/.x2/.x4 of 8x8 b16 tiles -> 16 B per thread per x
            n = re.search(r"\.M88\.(\d)", op)
            return "lds", 4 * int(n.group(1)) if n else 16
        return "lds", width
    if base in ("STS", "STSM"):
        return "sts", width
    if base in ("LDL", "STL"):
        return "local", width
    if base == "MUFU":
        return "mufu", 0
    if base in ("HMMA", "HGMMA", "IMMA", "DMMA"):
        return "mma", 0
    if base in ("FFMA", "FADD", "FMUL", "FMNMX", "FSETP", "FSEL", "FSET", "FSWZADD", "FCHK", "FRND"):
        return "fp32", 0
    if base in ("DADD", "DMUL", "DFMA", "DSETP"):
        return "fp64", 0
    if base in ("F2F", "F2I", "I2F", "F2FP", "I2FP", "F2IP"):
        return ("fp32" if base == "F2FP" else "cvt"), 0
    if base in ("SHFL",):
        return "shfl", 0
    if base in ("BAR", "BSYNC", "BSSY", "WARPSYNC", "DEPBAR", "SYNCS", "MEMBAR", "ARRIVES", "WARPGROUP"):
        return "sync", 0
    if base in ("IMAD", "IADD3", "LOP3", "SHF", "ISETP", "LEA", "IABS", "IMNMX", "SEL", "PRMT", "POPC", "FLO",
                "BREV", "IMUL", "SGXT", "LEA", "VIMNMX", "PLOP3", "P2R", "R2P", "IDP"):
        return "int", 0
    if base in ("MOV", "S2R", "S2UR", "CS2R", "R2UR", "UMOV", "ULDC", "UIADD3", "ULOP3", "USHF", "UISETP",
                "ULEA", "UIMAD", "USEL", "UPRMT", "UFLO", "UPOPC", "UBMSK", "USGXT", "ELECT", "VOTE", "VOTEU"):
        return "move", 0
    if base in ("BRA", "EXIT", "RET", "CALL", "BMOV", "NOP", "YIELD", "BREAK", "JMP", "BPT"):
        return "ctrl", 0
    return "other", 0


def mma_flops(op: str, text: str) -> tuple[int, str]:
    """FLOPs per warp-instruction and the shape label of an HMMA / HGMMA."""
    if op.startswith("HMMA"):
        # HMMA.16816.F32.BF16 / HMMA.1684.F32.TF32 / HMMA.1688.F32.TF32: m16 n8 k(16|4|8)
        mm = re.match(r"HMMA\.(16)(8)(\d+)\.(\S+)", op)
        if mm:
            kk = int(mm.group(3))
            return 2 * 16 * 8 * kk, f"m16n8k{kk}.{mm.group(4)}"
    if op.startswith("HGMMA"):
        mm = re.match(r"HGMMA\.(\d+)x(\d+)x(\d+)\.(\S+)", op)
        if mm:
            # one warpgroup instruction, issued by each of its 4 warps: FLOPs counted per warp
            return 2 * int(mm.group(1)) * int(mm.group(2)) * int(mm.group(3)) // 4, f"m{mm.group(1)}n{mm.group(2)}k{mm.group(3)}.{mm.group(4)}"
    if op.startswith("DMMA"):
        return 2 * 8 * 8 * 4, "dmma.884"
    return 0, op


# ---- what one program executes ------------------------------------------------------------------
def source_line(src: list[str], func: str, pattern: str) -> int:
    """1-based line of the first line matching pattern inside def func (the family's own source)."""
    start = next(i for i, s in enumerate(src) if s.startswith(f"def {func}("))
    for i in range(start, len(src)):
        if re.search(pattern, src[i]):
            return i + 1
    raise LookupError(f"{pattern!r} not in {func}")


def pairwise_fraction(shape: dict, plan: dict, seed: int = 0) -> float:
    """Fraction of (row block, key tile) pairs of the problem's inputs whose diagonal block goes
    pairwise in ``_block_row`` (span over the block, first row's gate left out, > LIMIT; gates raised to
    FLOOR first where ``diag_floor`` is on)."""
    from pytest_kopt.problems.kda import KDAProblem

    case = {**shape, "initial_state": False, "output_final_state": True}
    g = KDAProblem().make_inputs(case, device="cpu", seed=seed)["g"]  # [B, T, H, K] float32
    B, T, H, K = g.shape
    BC, BK = plan["BC"], plan["BK"]
    if plan["LIMIT"] < 0:
        return 1.0
    nb = T // BC
    if plan.get("FLOOR", 0.0) < 0:  # diag_floor: the guard sees the gates raised to at least FLOOR
        g = g.clamp(min=plan["FLOOR"])
    gb = g[:, : nb * BC].reshape(B, nb, BC, H, K)[:, :, 1:].sum(2)  # [B, nb, H, K], rows 1.. of each block
    span = (-gb).reshape(B, nb, H, K // BK, BK).amax(-1)
    return float((span > plan["LIMIT"]).double().mean())


def profile(insts, w, warps: int, tags: list | None = None) -> dict:
    """Per program: warp-instructions by class, tensor-core FLOPs and shapes, memory bytes."""
    cls = Counter()
    static = Counter()
    mufu = Counter()
    mma = Counter()
    flops = {"bf16": 0.0, "tf32": 0.0, "fp32": 0.0}
    nbytes = Counter()
    region = Counter()
    region_mufu = Counter()
    for n, (ins, wt) in enumerate(zip(insts, w)):
        if tags:
            region[tags[n]] += wt * warps
            if ins["op"].startswith("MUFU"):
                region_mufu[tags[n]] += wt * warps
        c, width = classify(ins["op"], ins["text"])
        cls[c] += wt * warps
        static[c] += 1
        if c == "mufu":
            mufu[ins["op"]] += wt * warps
        if c == "mma":
            f, shape = mma_flops(ins["op"], ins["text"])
            mma[shape] += wt * warps
            kind = "tf32" if "TF32" in ins["op"] else "bf16" if ("BF16" in ins["op"] or "F16" in ins["op"]) else "fp32"
            flops[kind] += f * wt * warps
        if c in ("ldg", "ldgsts", "stg", "lds", "sts", "local"):
            nbytes[c] += width * 32 * wt * warps
        if ins["op"].startswith("BAR"):
            cls["bar"] += wt * warps
        cls["all"] += wt * warps
    return {"inst": dict(cls), "static": dict(static), "mufu": dict(mufu), "mma": dict(mma), "flops": flops,
            "bytes": dict(nbytes), "n_static": len(insts), "regions": dict(region), "region_mufu": dict(region_mufu)}


def resources(cubin_path: Path) -> dict:
    txt = subprocess.run([str(BIN / "cuobjdump"), "-res-usage", str(cubin_path)], capture_output=True, text=True,
                         check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", txt)
    return {"regs": int(m.group(1)), "stack": int(m.group(2))}


def occupancy(regs: int, smem: int, warps: int) -> int:
    r = RATES
    per_warp = math.ceil(regs * 32 / 256) * 256
    by_regs = r["regs_per_sm"] // (per_warp * warps)
    by_smem = r["smem_per_sm"] // (smem + r["smem_per_cta_reserved"]) if smem else r["max_ctas"]
    return max(0, min(by_regs, by_smem, r["max_warps"] // warps, r["max_ctas"]))


def dram_bytes(stage: str, shape: dict, plan: dict, kn: dict) -> float:
    """Unique DRAM bytes of a stage (each tensor read / written once; L2 absorbs re-reads)."""
    B, T, H, K, V = (shape[n] for n in ("B", "T", "H", "K", "V"))
    BT = plan["BT"]
    n = B * H * (-(-T // BT))  # chunk-heads
    au = 2 if kn["au"] == "bf16" else 4
    u = 2 if kn.get("u_store") == "bf16" else 4
    if stage == "rows":  # q, k bf16, g fp32, beta; Aqk hi + lo, Akk fp32
        return n * (BT * K * 8 + BT * 2 + BT * BT * (4 + 4))
    if stage == "solve":  # q, k, v, g, beta, Akk, Aqk; w, kd, qd bf16, u (fp32 or bf16), au, gl
        return n * (BT * K * 8 + BT * V * 2 + BT * 2 + BT * BT * 8 + BT * K * 6 + BT * V * (u + au) + K * 4)
    if stage == "scan":  # w, kd, u, gl; per-chunk state (bf16) written, final state
        return n * (BT * K * 4 + BT * V * u + K * 4 + K * V * 2) + B * H * K * V * 4
    if stage == "out":  # qd, state, au; o
        return n * (BT * K * 2 + K * V * 2 + BT * V * au + BT * V * 2)
    return 0.0


def bounds(prof: dict, programs: int, per_sm: int, warps: int) -> dict:
    """Lower bounds (us) on the stage's time, one per resource, from the whole grid's work."""
    r = RATES
    clk = r["sms"] * r["clock_ghz"] * 1e3  # SM-clocks per us, all SMs
    i = prof["inst"]
    tot = lambda c: i.get(c, 0.0) * programs
    b = {
        "mufu": tot("mufu") / r["mufu_warp_inst_per_clk"] / clk,
        "fp32": tot("fp32") / r["fp32_warp_inst_per_clk"] / clk,
        "int": tot("int") / r["int_warp_inst_per_clk"] / clk,
        "cvt": tot("cvt") / r["cvt_warp_inst_per_clk"] / clk,
        "shfl": tot("shfl") / r["shfl_warp_inst_per_clk"] / clk,
        "issue": tot("all") / r["issue_warp_inst_per_clk"] / clk,
        "lsu": (tot("ldg") + tot("ldgsts") + tot("stg") + tot("lds") + tot("sts") + tot("local"))
        / r["lsu_warp_inst_per_clk"] / clk,
        "smem_bw": sum(prof["bytes"].get(c, 0.0) for c in ("lds", "sts", "ldgsts", "local")) * programs
        / r["smem_B_per_clk"] / clk,
        "tensor": (prof["flops"]["bf16"] / r["tc_bf16_flop_per_clk"] + prof["flops"]["tf32"] / r["tc_tf32_flop_per_clk"]
                   + prof["flops"]["fp32"] / (r["fp32_warp_inst_per_clk"] * 64)) * programs
        / (r["hmma_fraction"] if any(k.startswith("m16n8") for k in prof["mma"]) else 1.0) / clk,
    }
    # the waves: programs run per_sm at a time on each SM
    used = min(r["sms"], programs) if per_sm else 0
    b["waves"] = programs / (used * per_sm) if used else float("inf")
    return b


STAGES = ("rows", "solve", "scan", "out")


def analyse(knobs: dict, shape: dict, workdir: Path, measured: dict | None = None) -> dict:
    from pytest_kopt.kernels.families import kda_chunked as fam

    built = build_all(fam, knobs, shape)
    plan, kn = built["plan"], built["knobs"]
    src = Path(fam.__file__).read_text().splitlines()
    K, V = shape["K"], shape["V"]
    p_pair = pairwise_fraction(shape, plan)
    nc = plan["BT"] // plan["BC"]
    rules = {
        "rows": ({source_line(src, "_block_row", r"for ks in range\(0, K, BK\)"): K // plan["BK"],
                  # the pairwise fallback's channel loop: _diag_split's with pair="split" (BK // DKS trips)
                  (source_line(src, "_diag_split", r"for c0 in range\(0, BK, DK\)") if kn.get("pair") == "split"
                   else source_line(src, "_diag_pairwise", r"for c0 in range\(0, BK, DK\)")):
                      plan["BK"] // (plan["DKS"] if kn.get("pair") == "split" else plan["DK"])},
                 {source_line(src, "_block_row", r"if bi > 0:"): (nc - 1) / nc,
                  source_line(src, "_block_row", r"if span <= LIMIT:"): 1.0 - p_pair}),
        "solve": ({source_line(src, "_solve_wy", r"for ks in range\(0, K, BK\)"): -(-K // plan["BKP"]),
                   source_line(src, "_solve_wy", r"for vs in range\(0, V, BVP\)"): -(-V // plan["BVP"])}, {}),
        "scan": ({source_line(src, "_kda_scan_kernel",
                              r"for n in range\(NT\)"): built["NT"]}, {}),
        "out": ({}, {}),
    }
    res = {"knobs": {k: kn[k] for k in sorted(kn)}, "shape": shape, "pairwise_fraction": p_pair, "stages": {}}
    for st in STAGES:
        if st not in built["kernels"]:
            continue
        comp, programs, warps = built["kernels"][st]
        insts, labels = disassemble(comp.asm["cubin"], workdir, st)
        loop_trips, branch_prob = rules[st]
        found = {ins["line"] for ins in insts if ins["op"].startswith("BRA")}
        missing = [ln for ln in list(loop_trips) + list(branch_prob) if ln not in found]
        tags: list = []
        w = weights(insts, labels, loop_trips, branch_prob, tags)
        prof = profile(insts, w, warps, tags)
        ru = resources(workdir / f"{st}.cubin")
        smem = comp.metadata.shared
        per_sm = occupancy(ru["regs"], smem, warps)
        bd = bounds(prof, programs, per_sm, warps)
        bd["dram"] = dram_bytes(st, shape, plan, kn) / (RATES["dram_TBps"] * 1e6)
        entry = {"programs": programs, "warps": warps, "regs": ru["regs"], "stack": ru["stack"], "smem": smem,
                 "per_sm": per_sm, "resident_warps_per_sm": per_sm * warps, "profile": prof, "bounds_us": bd,
                 "dram_MB": dram_bytes(st, shape, plan, kn) / 1e6, "rules_not_found": missing}
        if measured and st in measured:
            m_us = measured[st]
            entry["measured_us"] = m_us
            waves = bd["waves"]
            entry["us_per_wave"] = m_us / math.ceil(waves) if waves < 1 else m_us / waves
            # issue slots actually used: all warp-instructions of the grid over (SMs x 4 x clocks)
            clk = RATES["sms"] * RATES["clock_ghz"] * 1e3
            entry["issue_utilisation"] = prof["inst"]["all"] * programs / (4 * clk * m_us)
            # cycles between two instructions of one warp (latency per instruction, in the stage)
            per_warp_insts = prof["inst"]["all"] / warps
            entry["cycles_per_warp_inst"] = (m_us * RATES["clock_ghz"] * 1e3 / max(waves, 1.0)) / per_warp_insts
        res["stages"][st] = entry
    return res


def table(res: dict) -> str:
    rows = []
    hdr = ("stage", "progs", "warps", "regs", "smem KB", "per SM", "waves", "MUFU/prog", "HMMA/prog", "FP32/prog",
           "all inst/prog", "LDG KB/prog", "STG KB/prog", "BAR/prog")
    rows.append(hdr)
    for st, e in res["stages"].items():
        i, by = e["profile"]["inst"], e["profile"]["bytes"]
        rows.append((st, e["programs"], e["warps"], e["regs"], f"{e['smem'] / 1024:.0f}", e["per_sm"],
                     f"{e['bounds_us']['waves']:.2f}", f"{i.get('mufu', 0):.0f}", f"{i.get('mma', 0):.0f}",
                     f"{i.get('fp32', 0):.0f}", f"{i.get('all', 0):.0f}",
                     f"{(by.get('ldg', 0) + by.get('ldgsts', 0)) / 1024:.1f}", f"{by.get('stg', 0) / 1024:.1f}",
                     f"{i.get('bar', 0):.0f}"))
    out = ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    out.insert(1, "|" + "---|" * len(hdr))
    out.append("")
    hdr2 = ("stage", "measured", "MUFU", "FP32", "INT", "CVT", "SHFL", "tensor", "LSU inst", "smem bw", "issue", "DRAM",
            "issue util", "clk/warp-inst")
    out.append("| " + " | ".join(hdr2) + " |")
    out.append("|" + "---|" * len(hdr2))
    for st, e in res["stages"].items():
        b = e["bounds_us"]
        out.append("| " + " | ".join([st, f"{e.get('measured_us', float('nan')):.1f}"]
                                     + [f"{b[k]:.1f}" for k in ("mufu", "fp32", "int", "cvt", "shfl", "tensor", "lsu", "smem_bw",
                                                                 "issue", "dram")]
                                     + [f"{e.get('issue_utilisation', float('nan')):.2f}",
                                        f"{e.get('cycles_per_warp_inst', float('nan')):.1f}"]) + " |")
    out.append("")
    for st, e in res["stages"].items():
        p = e["profile"]
        out.append(f"{st}: mma {json.dumps({k: round(v) for k, v in p['mma'].items()})} "
                   f"mufu {json.dumps({k: round(v) for k, v in p['mufu'].items()})} "
                   f"flops/prog {json.dumps({k: round(v) for k, v in p['flops'].items()})} "
                   f"bytes/prog {json.dumps({k: round(v) for k, v in p['bytes'].items()})} "
                   f"shfl {p['inst'].get('shfl', 0):.0f} int {p['inst'].get('int', 0):.0f} "
                   f"stack {e['stack']} B, static {p['n_static']} inst, DRAM {e['dram_MB']:.0f} MB; "
                   f"warp-inst by region (line = the branch's source line) "
                   f"{json.dumps({k: round(v) for k, v in p['regions'].items()})}"
                   + (f", rules not found {e['rules_not_found']}" if e["rules_not_found"] else ""))
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--knobs", default="{}", help="JSON knob overrides on the family's KNOBS")
    for n, d in (("B", 1), ("T", 8192), ("H", 16), ("K", 128), ("V", 128)):
        ap.add_argument(f"--{n}", type=int, default=d)
    ap.add_argument("--measured", default=json.dumps({"rows": 334.9, "solve": 172.4, "scan": 228.1, "out": 142.1}),
                    help="measured per-stage us (JSON); the default: run 5's do_bench split at the headline")
    ap.add_argument("--json", help="write the full result here")
    ap.add_argument("--dump", default="/tmp/sass_kda", help="cubins and SASS go here")
    a = ap.parse_args()
    shape = {"B": a.B, "T": a.T, "H": a.H, "K": a.K, "V": a.V}
    res = analyse(json.loads(a.knobs), shape, Path(a.dump), json.loads(a.measured) if a.measured else None)
    res["rates"] = RATES
    print(f"shape {shape} knobs {a.knobs}; pairwise diagonal fraction {res['pairwise_fraction']:.3f}")
    print(table(res))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
