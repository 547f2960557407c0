"""Static latency analysis of the MLA decode split kernel at B1 Sq1 H64 Skv8192 (issue 6, session 3).

    .venv/bin/python tools/sass_mla.py [--dump DIR]

No GPU: compiles the family's kernels (kernels/families/mla_decode.py, file defaults) offline for
sm_90 with the constexprs and specialisations its launch code uses at B1 (the plan from ``_plan``
with 132 SMs), disassembles them with the cuobjdump that ships inside Triton, splits the SASS into
prologue / main KV loop / epilogue (the loop = the backward branch whose body holds the HGMMAs),
counts instruction classes per region, and evaluates a latency model of one program's serial
chain with the assumptions printed beside it. Results and reading: kernels/notes/mla.md,
"Static latency analysis of B1 decode (session 3)".

    .venv/bin/python tools/sass_mla.py --prefill [--dump DIR]

compiles the prefill TMA kernel's variants (PREFILL_VARIANTS: the promoted kernel and a few knob
changes from it) as launched at the prefill headline and prints registers, stack, shared memory, the
loop's instruction counts, the wgmmas still in flight when the softmax's first exp2 issues, the wgmma
waits and the loop's order (kernels/notes/mla.md, "Version 7 (session 5)").
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAMILY = ROOT / "kernels" / "families" / "mla_decode.py"
B, SQ, H, SKV, N_SMS = 1, 1, 64, 8192, 132


def load_family():
    spec = importlib.util.spec_from_file_location("mla_decode_sass", FAMILY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod._sm_count = lambda index: N_SMS  # the H200's SM count; _plan reads it
    return mod


def build(fn, constexprs, values, num_warps, num_stages):
    """triton.compile for sm_90, specialised as at launch: unit strides are constexpr 1, pointers and
    ints that are multiples of 16 carry tt.divisibility 16 unless the kernel lists them in
    do_not_specialize; ``values`` are the launch's integer arguments."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    no_spec = set(getattr(fn, "do_not_specialize", []) or [])
    no_spec |= {fn.arg_names[i] if isinstance(i, int) else i for i in getattr(fn, "do_not_specialize", []) or []}
    signature, attrs, cx = {}, {}, dict(constexprs)
    for param in fn.params:
        default = param._param.default
        if param.is_constexpr and param.name not in cx and default is not param._param.empty:
            cx[param.name] = default
    for i, name in enumerate(fn.arg_names):
        v = values.get(name)
        if name not in cx and name not in no_spec and isinstance(v, int) and v == 1:
            cx[name] = 1
        if name in cx:
            signature[name] = "constexpr"
        elif name == "qk_scale":
            signature[name] = "fp32"
        elif name in ("q", "kv", "o", "part_o", "lse", "part_lse", "counters", "sink"):
            signature[name] = {"q": "*bf16", "kv": "*bf16", "o": "*bf16", "counters": "*i32"}.get(name, "*fp32")
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "i32"
            if name not in no_spec and isinstance(v, int) and v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=cx, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": num_stages})


def sass_of(compiled, dump: Path | None, name: str) -> list[tuple[int, str]]:
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / f"{name}.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        text = subprocess.run([str(tool), "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout
        res = subprocess.run([str(tool), "-res-usage", str(cubin)], check=True, capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)", res)
    compiled.res = dict(zip(("regs", "stack", "static_smem", "local"), map(int, m.groups()))) if m else {}
    if dump:
        dump.mkdir(parents=True, exist_ok=True)
        (dump / f"{name}.sass").write_text(text)
        (dump / f"{name}.ptx").write_text(compiled.asm["ptx"])
        (dump / f"{name}.ttgir").write_text(compiled.asm["ttgir"])
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            out.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def opcode(ins: str) -> str:
    ins = re.sub(r"^@!?U?P\w+\s+", "", ins)
    return ins.split()[0] if ins else ""


CLASSES = [  # (label, regex on the opcode): first match wins
    ("HGMMA", r"^HGMMA"), ("HMMA", r"^HMMA"), ("WG.ARRIVE", r"^WARPGROUP\.ARRIVE"), ("WG.DEPBAR(wait)", r"^WARPGROUP\.DEPBAR"),
    ("WARPSYNC", r"^WARPSYNC"), ("BAR.SYNC", r"^BAR"), ("LDGSTS(cp.async)", r"^LDGSTS"), ("LDGDEPBAR", r"^LDGDEPBAR"),
    ("DEPBAR(cp.async wait)", r"^DEPBAR"), ("UTMALDG(TMA)", r"^UTMA"), ("SYNCS(mbarrier)", r"^SYNCS"), ("LDG", r"^LDG"),
    ("STG", r"^STG"), ("RED/ATOM", r"^(RED|ATOM)"), ("LDSM", r"^LDSM"), ("LDS", r"^LDS"), ("STS", r"^STS"), ("STSM", r"^STSM"),
    ("MUFU.EX2", r"^MUFU\.EX2"), ("MUFU other", r"^MUFU"), ("SHFL", r"^SHFL"), ("FMUL", r"^FMUL"), ("FFMA", r"^FFMA"),
    ("FADD", r"^FADD"), ("FMNMX", r"^FMNMX"), ("F2F/F2FP(cvt)", r"^F2F"), ("FENCE", r"^FENCE"), ("MEMBAR", r"^MEMBAR"),
    ("ACQBULK/PREEXIT(PDL)", r"^(ACQBULK|PREEXIT)"), ("BRA", r"^BRA"), ("EXIT", r"^EXIT"),
    ("int/addr/other", r"."),
]


def classify(ins: str) -> str:
    op = opcode(ins)
    for label, rx in CLASSES:
        if re.match(rx, op):
            return label
    return "int/addr/other"


def regions(sass):
    """(prologue, loop, epilogue) instruction lists: the loop is the backward branch whose body has
    the most HGMMA/HMMA (ties: the longest) and no EXIT. Out-of-line code placed after the last EXIT
    (mbarrier try-wait retries) is counted in the epilogue column although it runs inside the loop."""
    index = {addr: i for i, (addr, _) in enumerate(sass)}
    best = None
    for i, (addr, ins) in enumerate(sass):
        m = re.search(r"\bBRA\b.*?`?\(?\.?L?_?x?_?(0x[0-9a-f]+)", ins)
        if not m or "BRA" not in opcode(ins):
            continue
        target = int(m.group(1), 16)
        if target >= addr or target not in index:
            continue
        body = sass[index[target]:i + 1]
        if any(opcode(x) == "EXIT" for _, x in body):  # an out-of-line wait's retry jumping back: not the loop
            continue
        mma = sum(1 for _, x in body if opcode(x).startswith(("HGMMA", "HMMA")))
        key = (mma, len(body))
        if best is None or key > best[0]:
            best = (key, index[target], i)
    if best is None:
        return sass, [], []
    _, a, b = best
    return sass[:a], sass[a:b + 1], sass[b + 1:]


def counts(instrs):
    c = collections.Counter(classify(x) for _, x in instrs)
    shapes = collections.Counter(re.match(r"(HGMMA\.\w+|HMMA\.\w+)", opcode(x)).group(1) for _, x in instrs
                                 if opcode(x).startswith(("HGMMA", "HMMA")))
    c["total"] = len(instrs)
    return c, shapes


# ----- latency model: assumptions (ns unless noted); see the notes for their sources ------------
CLK_GHZ = 1.98  # H200 SM clock under load (device/KINDS.md: 1980 MHz read just after matrix products)
A = {
    "launch_gap_us": (1.5, 2.5),  # judge start event -> first CTA, per launch (run 5: judge - kernels = ~5 us for 2 launches)
    "ramp_us": (0.3, 0.5),  # CTA dispatch of one wave of 128 programs
    "dram_ns": (600.0, 800.0),  # cold DRAM round trip (TLB refill after the 256 MB flush included)
    "l2_ns": (200.0, 300.0),  # L2 hit round trip
    "dram_TBps": 4.25,  # measured copy bandwidth, read + write (shared/anchors; dev_mla re-measures 4.22-4.25)
    "l2_TBps": (7.0, 5.5),  # L2 -> SM aggregate (assumed; ~5.5 TB/s measured on an H100 PCIe, 114 SMs at lower clock)
}
# cycles one warp spends per instruction of a class, one warp per scheduler (4 warps, 1 CTA per SM),
# (low, high): assumptions, not measurements
CYC = {
    "HGMMA": (20, 24),  # HGMMA.64x16x16: A 2 KB + B 0.5 KB from smem at ~128 B/clk; chained on one accumulator
    "WG.DEPBAR(wait)": (60, 120),  # drain of a wgmma chain
    "HMMA": (8, 16),  # HMMA.16816 bf16: 8 cycles at a sub-core's tensor rate, 16 if mma.sync runs at half rate
    "BAR.SYNC": (40, 80),  # barrier + the smem store->load exchange around it
    "MUFU.EX2": (8, 8),  # quarter-rate pipe: a warp instruction every 8 cycles
    "SHFL": (10, 30),  # reduction trees: 5 dependent levels of ~30-cycle shuffles, partly overlapped
    "LDSM": (4, 8), "LDS": (4, 30), "STS": (4, 8), "LDGSTS(cp.async)": (4, 8), "LDG": (4, 8), "STG": (4, 8),
    "DEPBAR(cp.async wait)": (0, 0), "LDGDEPBAR": (1, 1),
    "other": (1, 2),  # integer/address/FP ALU: 1 if the scheduler finds an independent instruction, ~2 on average in chains
}


def cycles(c, which):
    tot = 0.0
    for lab, n in c.items():
        if lab == "total":
            continue
        tot += n * CYC.get(lab, CYC["other"])[which]
    return tot


def model(plan, split_counts, merge_counts, kv_bytes, part_bytes):
    """(label, low us, high us) rows: the serial chain of one program of the split kernel (one wave:
    every program runs the same chain at the same time), the bandwidth terms it must also cover,
    and the merge kernel. The judge's figure = launch gaps + split kernel + merge."""
    progs = plan["grid"][0] * plan["grid"][1] * plan["grid"][2]
    tiles = plan["blocks_per_split"]
    us = lambda cyc: cyc / CLK_GHZ / 1e3  # noqa: E731
    pro, loop, epi = (split_counts[k][0] for k in ("prologue", "loop", "epilogue"))
    rows = []
    lo_hi = lambda f: (f(0), f(1))  # noqa: E731
    rows.append(("split: CTA ramp (one wave)", *A["ramp_us"]))
    rows.append((f"split: prologue issue ({pro['total']} instr/warp: q loads, 2 tiles of cp.async addresses)", *lo_hi(lambda w: us(cycles(pro, w)))))
    rows.append(("split: q + first KV tile, cold DRAM round trip (not hidden: nothing else to do)", *(x / 1e3 for x in A["dram_ns"])))
    t_loop = lo_hi(lambda w: us(cycles(loop, w)))
    rows.append((f"split: loop body chain per tile ({loop['total']} instr/warp)", *t_loop))
    bytes_tile = plan["block_n"] * 1152
    l2 = tuple(bytes_tile * progs / (bw * 1e12) * 1e6 for bw in A["l2_TBps"])
    rows.append((f"split: per tile L2->SM ({progs} programs x {bytes_tile // 1024} KB, 4 row blocks re-read)", *l2))
    dram = kv_bytes / tiles / (A["dram_TBps"] * 1e12) * 1e6
    rows.append((f"split: per tile DRAM ({kv_bytes / tiles / 1e6:.2f} MB; x2 if misses write back the flush's dirty lines)", dram, 2 * dram))
    per_tile = (max(t_loop[0], l2[0], dram), max(t_loop[1], l2[1], 2 * dram))
    rows.append((f"split: {tiles} tiles x max(chain, L2, DRAM) (3 stages: loads overlap the chain)", tiles * per_tile[0], tiles * per_tile[1]))
    t_epi = lo_hi(lambda w: us(cycles(epi, w)))
    rows.append((f"split: epilogue issue ({epi['total']} instr/warp)", *t_epi))
    wr = part_bytes / (A["dram_TBps"] * 1e12) * 1e6
    rows.append((f"split: partial stores drain ({part_bytes / 1e6:.1f} MB; L2 latency .. DRAM rate with write-back)", A["l2_ns"][0] / 1e3, A["l2_ns"][1] / 1e3 + wr))
    split_lo = sum(r[1] for r in rows if r[0].startswith("split:") and "per tile" not in r[0] or "tiles x" in r[0])
    split_hi = sum(r[2] for r in rows if r[0].startswith("split:") and "per tile" not in r[0] or "tiles x" in r[0])
    rows.append(("SPLIT KERNEL (sum; profiler measured 13.0)", split_lo, split_hi))
    mc = merge_counts["all"][0]
    m = (A["ramp_us"][0] + 2 * A["l2_ns"][0] / 1e3 + us(cycles(mc, 0)),
         A["ramp_us"][1] + 3 * A["l2_ns"][1] / 1e3 + part_bytes / (A["l2_TBps"][1] * 1e12) * 1e6 + us(cycles(mc, 1)))
    rows.append((f"MERGE (ramp + 2-3 dependent L2 round trips + {part_bytes / 1e6:.1f} MB + {mc['total']} instr; measured 3.4)", *m))
    rows.append(("launch gaps (2 launches, PDL 1; measured judge - kernels ~4-5)", A["launch_gap_us"][0] * 1.5, A["launch_gap_us"][1] * 2))
    rows.append(("JUDGE (model; measured 21.2-22.4)", split_lo + m[0] + A["launch_gap_us"][0] * 1.5, split_hi + m[1] + A["launch_gap_us"][1] * 2))
    return rows


WSPLIT = {"CONFIG": "knobs", "BLOCK_H": 64, "BLOCK_N": 64, "KEYS_AS_M": False, "num_warps": 8, "num_stages": 2, "KV_LOAD": "tma", "QK_SPLIT": True}
# (label, knob overrides on the family file's KNOBS, measured split-kernel us at B1 Sq1 from the profiler, where)
VARIANTS = [
    ("auto (default)", {}, 13.0, "run 5/6"),
    ("narrow 64 splits", {"NUM_SPLITS": 64}, 17.1, "run 3"),
    ("n16w8-split", {"CONFIG": "knobs", "BLOCK_H": 16, "BLOCK_N": 64, "KEYS_AS_M": True, "num_warps": 8, "num_stages": 2,
                     "KV_LOAD": "tma", "QK_SPLIT": True}, 17.7, "run 6"),
    ("wide-split (32 splits)", WSPLIT, 24.0, "run 5"),
    ("split-S64-bf16", {**WSPLIT, "NUM_SPLITS": 64, "PARTIAL_DTYPE": "bfloat16"}, 16.0, "run 5"),
    ("split-S128-bf16", {**WSPLIT, "NUM_SPLITS": 128, "PARTIAL_DTYPE": "bfloat16"}, 13.4, "run 5"),
]


def analyze(mod, overrides, dump=None, tag="split"):
    knobs = {**mod.KNOBS, **overrides}
    plan = mod._plan(knobs, B, SQ, H, SKV, 0)
    fn = mod._mla_decode_tma if plan["tma"] else mod._mla_decode_partial
    values = dict(stride_qb=SQ * H * 576, stride_qs=H * 576, stride_qh=576, stride_qd=1, stride_kb=SKV * 576, stride_kn=576,
                  stride_kd=1, Sq=SQ, H=H, Skv=SKV, n_splits=plan["splits"], blocks_per_split=plan["blocks_per_split"],
                  n_mergers=plan["n_mergers"])
    cx = dict(BLOCK_H=plan["block_h"], BLOCK_N=plan["block_n"], KEYS_AS_M=plan["keys_as_m"], VALUES_AS_M=plan["values_as_m"],
              MODE=plan["mode"], MERGERS=plan["mergers"], S_P2=plan["s_p2"], CHUNK=plan["chunk"], TAU=plan["tau"],
              DN=512, DR=64, PDL=plan["pdl"])
    if plan["tma"]:
        cx["QK_SPLIT"] = plan["qk_split"]
    compiled = build(fn, cx, values, plan["num_warps"], plan["num_stages"])
    pro, loop, epi = regions(sass_of(compiled, dump, tag))
    return plan, compiled, {"prologue": counts(pro), "loop": counts(loop), "epilogue": counts(epi)}, loop


PREFILL = ROOT / "kernels" / "families" / "mla_prefill.py"
P_SQ = P_SKV = 8192  # the prefill headline: B1 Sq = Skv = 8192 H64
# (label, knob overrides on mla_prefill.py's KNOBS): the promoted kernel is KNOBS + HEADS_PER_TILE 64
PREFILL_VARIANTS = [
    ("promoted (HT64)", {"HEADS_PER_TILE": 64}),
    ("family default (HT16)", {}),
    ("HT64 ROWSUM reduce", {"HEADS_PER_TILE": 64, "ROWSUM": "reduce"}),
    ("HT64 BN32", {"HEADS_PER_TILE": 64, "BLOCK_N": 32}),
    ("HT64 TAU8", {"HEADS_PER_TILE": 64, "RESCALE_TAU": 8}),
]


def load_prefill():
    spec = importlib.util.spec_from_file_location("mla_prefill_sass", PREFILL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def analyze_prefill(mod, overrides, dump=None, tag="prefill"):
    """``_mla_prefill_tma`` compiled as launched at the headline (bf16, contiguous, 132 SMs), with
    the constexprs kernel() passes."""
    k = {**mod.KNOBS, **overrides}
    hpt = min(int(k["HEADS_PER_TILE"]), 64)
    values = dict(stride_qb=P_SQ * 64 * 576, stride_qs=64 * 576, stride_qh=576, stride_qd=1, stride_kb=P_SKV * 576, stride_kn=576,
                  stride_ob=P_SQ * 64 * 512, stride_os=64 * 512, stride_oh=512, stride_od=1, stride_lb=64 * P_SQ, stride_lh=P_SQ,
                  stride_ls=1, Sq=P_SQ, H=64, Skv=P_SKV, n_hgroups=-(-64 // hpt))
    cx = dict(BLOCK_M=k["BLOCK_M"], BLOCK_N=k["BLOCK_N"], HEADS_PER_TILE=hpt, UNMASKED_LOOP=k["UNMASKED_LOOP"], KEYS_AS_M=k["KEYS_AS_M"],
              TAU=float(k["RESCALE_TAU"]), DN=512, DR=64, QK_SPLIT=k["QK_SPLIT"], DEFER_SUM=k["ROWSUM"] == "defer")
    compiled = build(mod._mla_prefill_tma, cx, values, k["num_warps"], k["num_stages"])
    sass = sass_of(compiled, dump, tag)
    pro, loop, epi = regions(sass)
    return compiled, counts(loop), loop


def loop_order(loop, keep=None):
    """The loop body as runs of the kept instruction classes, and its wgmma waits."""
    keep = keep or {"HGMMA", "WG.DEPBAR(wait)", "BAR.SYNC", "MUFU.EX2", "UTMALDG(TMA)", "SYNCS(mbarrier)", "STS", "LDS"}
    compact = []
    for _, x in loop:
        c = classify(x)
        if c not in keep:
            continue
        if compact and compact[-1][0] == c:
            compact[-1][1] += 1
        else:
            compact.append([c, 1])
    waits = [re.sub(r"\s+", " ", x) for _, x in loop if opcode(x).startswith("WARPGROUP.DEPBAR")]
    return compact, waits


def prefill_main(dump) -> int:
    mod = load_prefill()
    print(f"prefill _mla_prefill_tma at B1 Sq{P_SQ} Skv{P_SKV} H64, sm_90 offline; loop = per warp per key tile")
    print(f"{'variant':26s} {'regs':>4s} {'stack':>5s} {'smem B':>7s} {'loop':>5s} {'HGMMA':>5s} {'EX2':>4s} {'BAR':>4s} {'STL/LDL':>7s}  "
          "HGMMA in flight at the first MUFU.EX2 / waits")
    for label, ov in PREFILL_VARIANTS:
        try:
            c, (lc, shapes), loop = analyze_prefill(mod, ov, dump, "prefill-" + re.sub(r"\W+", "-", label))
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"{label:26s} compile failed: {type(exc).__name__}: {str(exc)[:160]}")
            continue
        compact, waits = loop_order(loop)
        first_ex2 = next((i for i, (_, x) in enumerate(loop) if classify(x) == "MUFU.EX2"), len(loop))
        before = 0  # HGMMAs issued and not yet waited on when the softmax's first exp2 issues
        for _, x in loop[:first_ex2]:
            if classify(x) == "HGMMA":
                before += 1
            elif classify(x) == "WG.DEPBAR(wait)":
                m = re.search(r"0x([0-9a-f]+)", x)
                before = min(before, int(m.group(1), 16) if m else 0)
        spills = sum(1 for _, x in loop if opcode(x).startswith(("STL", "LDL")))
        print(f"{label:26s} {c.res.get('regs', 0):4d} {c.res.get('stack', 0):5d} {c.metadata.shared:7d} {lc['total']:5d} "
              f"{lc.get('HGMMA', 0):5d} {lc.get('MUFU.EX2', 0):4d} {lc.get('BAR.SYNC', 0):4d} {spills:7d}  {before} / "
              + "; ".join(w.split(" ", 1)[-1] for w in waits))
        print("    " + " -> ".join(f"{s}x{n}" for s, n in compact))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", help="write the SASS and PTX here")
    ap.add_argument("--ladder", action="store_true", help="also compile tools/ladder_mla_decode.py's rungs (sm_90, per-rung counts)")
    ap.add_argument("--prefill", action="store_true", help="only the prefill TMA kernel's variants (PREFILL_VARIANTS): resources, loop order, waits")
    args = ap.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    if args.prefill:
        return prefill_main(Path(args.dump) if args.dump else None)
    mod = load_family()
    dump = Path(args.dump) if args.dump else None
    if args.ladder:
        ladder_counts(dump)
    plan, split, sc, loop = analyze(mod, {}, dump, "split")
    progs = plan["grid"][0] * plan["grid"][1] * plan["grid"][2]
    print(f"plan at B{B} Sq{SQ} H{H} Skv{SKV} ({N_SMS} SMs): grid {plan['grid']} = {progs} programs, "
          f"{plan['splits']} splits x {plan['blocks_per_split']} tiles of {plan['block_n']} keys, BLOCK_H {plan['block_h']}, "
          f"keys_as_m {plan['keys_as_m']}, {plan['num_warps']} warps, {plan['num_stages']} stages, tma {plan['tma']}, "
          f"pdl {plan['pdl']}, mode {plan['mode']}; merge grid {plan['merge_grid']} BLOCK_V {plan['merge_bv']}")
    merge = build(mod._mla_decode_merge, dict(S_P2=plan["s_p2"], SPLIT_CHUNK=plan["merge_chunk"], BLOCK_V=plan["merge_bv"], DN=512,
                                              PDL=plan["pdl"]), dict(H=H, R=SQ * H, n_splits=plan["splits"]), 4, 2)
    m_sass = sass_of(merge, dump, "merge")
    mc = {"all": counts(m_sass)}
    print(f"split kernel: {split.res}, {split.metadata.shared} B smem (Triton); merge: {merge.res}, {merge.metadata.shared} B smem")
    labels = [lab for lab, _ in CLASSES] + ["total"]
    print(f"\nSASS instructions per warp (static; the loop body runs once per {plan['block_n']}-key tile, "
          f"{plan['blocks_per_split']}x per program)")
    print(f"{'class':24s} {'prologue':>9s} {'loop':>6s} {'epilogue':>9s} {'merge':>6s}")
    for lab in labels:
        row = [sc["prologue"][0].get(lab, 0), sc["loop"][0].get(lab, 0), sc["epilogue"][0].get(lab, 0), mc["all"][0].get(lab, 0)]
        if any(row):
            print(f"{lab:24s} {row[0]:9d} {row[1]:6d} {row[2]:9d} {row[3]:6d}")
    for name, (_, shapes) in list(sc.items()) + list(mc.items()):
        if shapes:
            print(f"  MMA shapes in {name}: {dict(shapes)}")
    # the loop's ordering: where the waits sit relative to loads and MMAs
    seq = [classify(x) for _, x in loop]
    keep = {"HGMMA", "HMMA", "WG.DEPBAR(wait)", "BAR.SYNC", "LDGSTS(cp.async)", "DEPBAR(cp.async wait)", "LDGDEPBAR", "MUFU.EX2", "LDSM", "STS", "LDS",
            "UTMALDG(TMA)", "SYNCS(mbarrier)"}
    compact = []
    for s in seq:
        if s not in keep:
            continue
        if compact and compact[-1][0] == s:
            compact[-1][1] += 1
        else:
            compact.append([s, 1])
    print("\nloop order (runs of kept classes):")
    print("  " + " -> ".join(f"{s}x{n}" for s, n in compact))
    waits = [x for _, x in loop if opcode(x).startswith(("DEPBAR", "WARPGROUP.DEPBAR"))]
    print("  waits: " + "; ".join(waits))

    kv_bytes = B * SKV * 576 * 2
    part_bytes = B * plan["splits"] * SQ * H * 512 * (4 if "32" in str(plan["part_dtype"]) else 2)
    print(f"\nlatency model of the default (assumptions: {A}, cycles per instruction class {CYC}, clock {CLK_GHZ} GHz)")
    print(f"  {'component':100s} {'low':>6s} {'high':>6s} us")
    for label, lo, hi in model(plan, sc, mc, kv_bytes, part_bytes):
        print(f"  {label:100s} {lo:6.2f} {hi:6.2f}")

    # Fit across the measured variants: kernel time = F + waves * serial instructions per warp * CPI / clock,
    # F = CTA ramp + one cold DRAM round trip + the partial write's drain (fixed, FIXED_US). The CPI each
    # variant implies says whether one "cycles per instruction of one warp" explains them all.
    print(f"\nper-variant fit: split kernel us = {FIXED_US} + waves x (prologue + tiles x loop + epilogue) x CPI / {CLK_GHZ} GHz")
    print(f"{'variant':24s} {'grid':>11s} {'w':>2s} {'regs':>4s} {'smem KB':>7s} {'waves':>5s} {'pro':>5s} {'loop':>5s} {'tiles':>5s} "
          f"{'epi':>5s} {'serial':>6s} {'HGMMA/HMMA per tile':>20s} {'chain lo-hi us':>14s} {'meas us':>7s} {'CPI':>5s}  source")
    for label, ov, meas, src in VARIANTS:
        try:
            p, c, cc, _ = analyze(mod, ov)
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"{label:24s} compile failed: {type(exc).__name__}: {str(exc)[:100]}")
            continue
        n = p["grid"][0] * p["grid"][1] * p["grid"][2]
        per_sm = max(1, 232448 // max(1, c.metadata.shared), 1)
        per_sm = min(per_sm, 65536 // max(1, c.res.get("regs", 1) * 32 * p["num_warps"]))
        waves = -(-n // (N_SMS * max(1, per_sm)))
        serial = cc["prologue"][0]["total"] + p["blocks_per_split"] * cc["loop"][0]["total"] + cc["epilogue"][0]["total"]
        cpi = (meas - FIXED_US) * 1e3 * CLK_GHZ / (waves * serial)
        mma = f"{cc['loop'][0].get('HGMMA', 0)}/{cc['loop'][0].get('HMMA', 0)}"
        # the per-class chain of one warp (no bandwidth terms) + ramp + one cold DRAM round trip
        ch = [A["ramp_us"][w] + A["dram_ns"][w] / 1e3 + waves * (cycles(cc["prologue"][0], w) + p["blocks_per_split"] * cycles(cc["loop"][0], w)
                                                              + cycles(cc["epilogue"][0], w)) / CLK_GHZ / 1e3 for w in (0, 1)]
        print(f"{label:24s} {str(p['grid']):>11s} {p['num_warps']:2d} {c.res.get('regs', 0):4d} {c.metadata.shared / 1024:7.0f} {waves:5d} "
              f"{cc['prologue'][0]['total']:5d} {cc['loop'][0]['total']:5d} {p['blocks_per_split']:5d} {cc['epilogue'][0]['total']:5d} "
              f"{serial:6d} {mma:>20s} {ch[0]:6.1f}-{ch[1]:<7.1f} {meas:7.1f} {cpi:5.2f}  {src}")
    return 0


def ladder_counts(dump):
    """The ladder's split kernel per rung and geometry, compiled for sm_90 as it is launched at B1."""
    spec = importlib.util.spec_from_file_location("ladder_mla_decode", ROOT / "tools" / "ladder_mla_decode.py")
    sys.path.insert(0, str(ROOT))
    lad = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lad)
    print(f"{'ladder kernel':22s} {'regs':>4s} {'local':>5s} {'smem':>7s} {'pro':>5s} {'loop':>5s} {'epi':>5s} {'HGMMA/HMMA/LDGSTS per tile':>27s}")
    for gname, geo in lad.GEOMETRIES.items():
        n_blocks = SKV // geo["block_n"]
        bps = min(geo["tiles"], n_blocks)
        splits = -(-n_blocks // bps)
        for stage in range(5):
            cx = dict(STAGE=stage, BLOCK_H=geo["block_h"], BLOCK_N=geo["block_n"], KEYS_AS_M=geo["keys_as_m"], DN=512, DR=64, PDL=1)
            values = dict(flag=0, stride_kn=576, H=H, Skv=SKV, n_splits=splits, blocks_per_split=bps)
            try:
                c = build(lad._ladder_split, cx, values, geo["num_warps"], geo["stages_at"].get(stage, geo["num_stages"]))
            except Exception as exc:  # noqa: BLE001
                print(f"{gname:6s} stage {stage}: compile failed: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            pro, loop, epi = regions(sass_of(c, dump, f"ladder-{gname}-{stage}"))
            lc = counts(loop)[0]
            print(f"{gname + ' stage ' + str(stage):22s} {c.res.get('regs', 0):4d} {c.res.get('local', 0):5d} {c.metadata.shared:7d} "
                  f"{len(pro):5d} {len(loop):5d} {len(epi):5d} "
                  f"{str(lc.get('HGMMA', 0)) + '/' + str(lc.get('HMMA', 0)) + '/' + str(lc.get('LDGSTS(cp.async)', 0)):>27s}")


FIXED_US = 1.8  # CTA ramp 0.5 + one cold DRAM round trip 0.7 + partial write drain 0.6 (assumed)


if __name__ == "__main__":
    sys.exit(main())
