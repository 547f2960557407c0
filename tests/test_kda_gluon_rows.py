"""rows_engine "gluon" of the chunked KDA family (session 15): both block rows of a chunk in one Gluon program,
``_kda_rows_gluon``.

Gluon has no CPU interpreter, so CI checks what it can here and the H200 checks the rest
(``tools/dev_kda_wgmma.py`` compares its Aqk, Akk and running sums with the Triton rows' and its outputs with
the recurrence; the judge checks every loop evaluation): on the CPU the knob must run the Triton rows of the same
knobs (same outputs, bit for bit), the plan must hold what the kernel is launched with, and the kernel must compile
for sm_90 to what made it fast -- TMA in and out, tf32 wgmma products, the operand buffer shared with q and k
(64 KB at K 128, three programs per SM) and the register cap."""

from __future__ import annotations

import json

import pytest
import torch
from family_modules import compile_in_child
from test_kda_chunked import FAMILY, FAMILY_PATH, PROBLEM, check, render

# the loop's best at the session's start (7671e90b), whose block rows the Gluon rows replace
BEST = {"u_store": "bf16", "scan_warps": 4, "out_bv": 64, "off_tile": "tight", "diag_cols": "trans",
        "scan_engine": "wgmma_ws", "diag_floor": 30, "kd_sum": "rows", "inv_dot": "bf16x3", "solve_warps": 2,
        "solve_maxnreg": 168, "block_warps": 1, "block_maxnreg": "auto", "BK": "auto", "scan_overlap": "auto",
        "pair_elems": "auto"}


@pytest.mark.parametrize("engine, solve, mma", [("gluon", False, "v2"), ("gluon8", False, "v2"), ("gluon", True, "v2"),
                                               ("gluon", True, "wgmma"), ("gluon", True, "wgmma_st")])
def test_gluon_rows_fall_back_to_the_triton_rows_off_hopper(tmp_path, engine, solve, mma):
    """On the CPU the Gluon rows never run: the Triton rows of the same knobs do (and with rows_solve the Triton
    solve, whatever solve_mma says), outputs identical and right."""
    case = {"B": 2, "T": 45, "H": 1, "K": 32, "V": 32, "initial_state": True, "output_final_state": True}
    over = {"rows_engine": engine, "rows_solve": solve, "solve_mma": mma}
    module = render({**FAMILY.knobs, **BEST, **over}, tmp_path)
    x = PROBLEM.make_inputs(case, device="cpu", seed=15)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], None, x["initial_state"], x["output_final_state"])
    got = module.kda_chunked(*args, {**FAMILY.knobs, **BEST, **over})
    want = module.kda_chunked(*args, {**FAMILY.knobs, **BEST})
    for a, b in zip(got, want):
        assert (a is None and b is None) or torch.equal(a, b)
    check(module.kernel, x, case)


def test_gluon_rows_plan_and_where_they_run(tmp_path, monkeypatch):
    """The plan's warpgroups and register cap, and where the kernel runs: a Hopper GPU, K 32-256, bf16 q and k,
    float32 g, strides TMA takes; refused without the configuration of the Triton rows it reproduces."""
    fam = render({**FAMILY.knobs, **BEST, "rows_engine": "gluon"}, tmp_path)
    knobs = {**fam.KNOBS, **BEST, "rows_engine": "gluon"}
    plan = fam._plan(128, 128, knobs)
    assert (plan["ROWS_WG"], plan["ROWS_MAXNREG"]) == (1, 168)
    assert (fam._plan(256, 128, knobs)["ROWS_WG"], fam._plan(256, 128, knobs)["ROWS_MAXNREG"]) == (2, 0)
    assert fam._plan(128, 128, {**knobs, "rows_engine": "gluon8"})["ROWS_MAXNREG"] == 128
    assert fam._plan(128, 128, {**knobs, "block_maxnreg": 0})["ROWS_MAXNREG"] == 0
    # "uncap_k128": the Gluon rows uncapped at K 128 and capped as "auto" below; the Triton rows' cap as "auto"'s
    k128 = {**knobs, "block_maxnreg": "uncap_k128"}
    assert [fam._plan(K, K, k128)["ROWS_MAXNREG"] for K in (128, 64, 32)] == [0, 168, 168]
    assert fam._plan(128, 128, k128)["BLOCK_MAXNREG"] == fam._plan(128, 128, knobs)["BLOCK_MAXNREG"]
    assert fam._plan(128, 128, {**knobs, "rows_engine": "triton"})["ROWS_WG"] == 0
    fold = {**knobs, "rows_fold": True}
    assert fam._plan(128, 128, fold)["ROWS_FOLD"] and not fam._plan(32, 32, fold)["ROWS_FOLD"]
    with pytest.raises(ValueError, match="rows_fold"):
        fam._plan(128, 128, {**fold, "rows_engine": "triton"})
    solve = {**knobs, "rows_solve": True}
    assert fam._plan(128, 128, solve)["ROWS_SOLVE"] is True and fam._plan(128, 128, knobs)["ROWS_SOLVE"] is False
    assert fam._plan(128, 128, {**knobs, "rows_solve": "auto"})["ROWS_SOLVE"] == "auto"
    with pytest.raises(ValueError, match="rows_solve"):
        fam._plan(128, 128, {**knobs, "rows_solve": "auto", "rows_engine": "triton"})
    # solve_mma "wgmma": one warpgroup (rows_engine "gluon"), the rows' product unextracted (no rows_fold)
    wgs = {**solve, "solve_mma": "wgmma"}
    assert fam._plan(128, 128, wgs)["SOLVE_WG"] and not fam._plan(128, 128, solve)["SOLVE_WG"]
    # "wgmma_st": the same solve, its outputs through shared memory
    wst = {**solve, "solve_mma": "wgmma_st"}
    assert fam._plan(128, 128, wst)["SOLVE_WG"] and fam._plan(128, 128, wst)["SOLVE_ST"]
    assert not fam._plan(128, 128, wgs)["SOLVE_ST"]
    for over in ({"rows_engine": "gluon8"}, {"rows_fold": True}):
        for mma in (wgs, wst):
            with pytest.raises(ValueError, match="solve_mma"):
                fam._plan(128, 128, {**mma, **over})
    # it writes the wgmma scan's inputs (readout "pre", u and au in bf16) from the Gluon rows' registers
    for over in ({"rows_engine": "triton"}, {"u_store": "fp32"}, {"au": "fp32"}, {"readout": "aqk"}):
        with pytest.raises(ValueError, match="rows_solve"):
            fam._plan(128, 128, {**solve, **over})
    for over in ({"kd_sum": "f32"}, {"recentre": "start"}, {"inv_dot": "ieee"}, {"prec": "bf16x3"},
                 {"BT": 64, "solve_warps": 8, "off_tile": "chunk"}):
        with pytest.raises(ValueError, match="rows_engine"):
            fam._plan(128, 128, {**knobs, **over})

    class FakeCuda:  # only what _gluon_rows_apply reads
        def __init__(self, dtype=torch.bfloat16, strides=(1 << 20, 2048, 128, 1), ptr=1 << 20):
            self.is_cuda, self.device, self.dtype, self._strides, self._ptr = True, "cuda:0", dtype, strides, ptr

        def stride(self):
            return self._strides

        def element_size(self):
            return torch.empty(0, dtype=self.dtype).element_size()

        def data_ptr(self):
            return self._ptr

    def applies(K, q=None, g=None, kn=knobs):
        q = q or FakeCuda()
        return fam._gluon_rows_apply(q, q, g or FakeCuda(torch.float32), None, K, fam._plan(K, 128, kn))

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert applies(128) and applies(32) and applies(256)
    assert not applies(16)
    assert not applies(128, q=FakeCuda(torch.float16))
    assert not applies(128, g=FakeCuda(torch.bfloat16))
    assert not applies(128, q=FakeCuda(strides=(1 << 20, 2056 + 4, 128, 1)))  # a row stride TMA cannot take
    assert not applies(128, q=FakeCuda(ptr=(1 << 20) + 8))
    assert not applies(128, kn={**knobs, "rows_engine": "triton"})
    cpu = torch.empty(1, 8, 1, 128, dtype=torch.bfloat16)
    assert not fam._gluon_rows_apply(cpu, cpu, cpu.float(), None, 128, plan)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    assert not applies(128)


_COMPILE = r"""
import importlib.util, json, subprocess, sys, tempfile
from pathlib import Path
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

spec = importlib.util.spec_from_file_location("kda_rows_sm90", sys.argv[1])
fam = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fam)
gl = fam.gl
ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


def desc(shape, dtype, bits):  # a host descriptor argument, typed as Triton's launcher types it
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=len(shape))
    return f"tensordesc<{dtype}{shape},{layout!r}>"


out = {}
# two warpgroups (gluon8, and K 256) through K 256's compile; rows_fold at K 128; rows_solve (flagged for a scan
# beside it) at K 128 and 64, with the mma_v2 solve and the wgmma one (solve_mma), its outputs stored directly or
# through shared memory ("wgmma_st")
for K, WG, maxnreg, FOLD, SOLVE, WGS, WST in (
        (128, 1, 168, False, False, False, False), (64, 1, 168, False, False, False, False),
        (32, 1, 168, False, False, False, False), (256, 2, 0, False, False, False, False),
        (128, 1, 168, True, False, False, False), (128, 1, 168, False, True, False, False),
        (64, 1, 168, False, True, False, False), (128, 1, 168, False, True, True, False),
        (64, 1, 168, False, True, True, False), (128, 1, 168, False, True, True, True),
        (64, 1, 168, False, True, True, True)):
    BT = 32
    sig = {"q_desc": desc([1, BT, 1, K], "bf16", 16), "k_desc": desc([1, BT, 1, K], "bf16", 16),
           "g_desc": desc([1, BT, 1, K], "fp32", 32), "gs_desc": desc([BT, K], "fp32", 32), "g_ptr": "*fp32",
           "beta_ptr": "*bf16", "aqk_ptr": "*bf16", "akk_ptr": "*fp32", "gt_ptr": "*fp32", "scale": "fp32",
           "T": "i32", "TP": "i32", "NT": "i32", "H": "i32", "lo_off": "i32"}
    sig.update({n: "i32" for n in ("s_gb", "s_gt", "s_gh", "s_bb", "s_bt", "s_bh")})
    sig.update({n: "constexpr" for n in ("K", "BT", "FLOOR", "LIMIT", "WR", "WG", "FOLD", "V", "SOLVE", "FLAG", "WGS", "WST")})
    # the value tile's descriptor (solve_mma "wgmma"), swizzled as the host makes it
    sig["v_desc"] = (f"tensordesc<bf16[1, {BT}, 1, {K}],{gl.NVMMASharedLayout.get_default_for([1, BT, 1, K], gl.bfloat16)!r}>"
                     if WGS else "constexpr")
    sig.update({"v_ptr": "*bf16", "s_vb": "i32", "s_vt": "i32", "s_vh": "i32", "w_ptr": "*bf16", "kd_ptr": "*bf16",
                "qd_ptr": "*bf16", "u_ptr": "*bf16", "au_ptr": "*bf16", "gl_ptr": "*fp32", "flag_ptr": "*i32"})
    cx = {"K": K, "BT": BT, "FLOOR": -30.0, "LIMIT": 120.0 if FOLD else 160.0, "WR": 4 * WG * 32 // K, "WG": WG, "FOLD": FOLD,
          "V": K, "SOLVE": SOLVE, "FLAG": SOLVE, "WGS": WGS, "WST": WST, **({} if WGS else {"v_desc": None})}
    opts = {"num_warps": 4 * WG, **({"maxnreg": maxnreg} if maxnreg else {})}
    # pointers 16-byte aligned, as the launcher specialises torch's allocations
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fam._kda_rows_gluon.arg_names)
             if sig.get(n, "").startswith("*")}
    c = triton.compile(GluonASTSource(fam._kda_rows_gluon, sig, constexprs=cx, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=opts)
    ptx = c.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "k.ptx").write_text(ptx)
        notes = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(Path(tmp) / "k.ptx"), "-o", str(Path(tmp) / "k.cubin")],
                               capture_output=True, text=True).stderr
    regs = int(notes.split("Used ")[1].split(" registers")[0])
    out[f"K{K} WG{WG} cap{maxnreg}" + (" fold" if FOLD else "") + (" solve" if SOLVE else "") + (" wgmma" if WGS else "") + (" st" if WST else "")] = {
        "shared": c.metadata.shared, "regs": regs, "cap": maxnreg or 255,
        "tma_loads": ptx.count("cp.async.bulk.tensor.4d.shared::cluster.global"),
        "tma_stores": ptx.count("cp.async.bulk.tensor.2d.global.shared::cta"),
        "wgmma_tf32": ptx.count("wgmma.mma_async.sync.aligned") if ".tf32" in ptx else 0,
        "wgmma_n64": ptx.count("wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32"),
        "mma_bf16": ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"), "notes": notes[-300:],
        "wgmma_bf16": ptx.count("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16"),
        "wgmma_bf16_out": ptx.count(f"wgmma.mma_async.sync.aligned.m64n{K}k16.f32.bf16.bf16"),
        "flag_release": ptx.count("atom.global.gpu.release.exch"),
        # global stores of 16 bytes and of 4 (the direct stores of bf16 pairs from an accumulator)
        "st_v4": ptx.count("st.global.v4.b32"), "st_b32": ptx.count("st.global.b32"),
        # the running sums' store, its wait, and what lies between them in program order
        "store_at": ptx.find("cp.async.bulk.tensor.2d.global.shared::cta"), "wait_at": ptx.find("cp.async.bulk.wait_group"),
        "first_wgmma_at": ptx.find("wgmma.mma_async"),
        "shared_writes_before_wait": ptx[ptx.find("cp.async.bulk.tensor.2d.global.shared::cta"):
                                         ptx.find("cp.async.bulk.wait_group")].count("st.shared")}
print(json.dumps(out))
"""


def test_gluon_rows_compile_for_hopper(tmp_path):
    pytest.importorskip("triton.backends.nvidia.compiler")
    result = json.loads(compile_in_child(_COMPILE, str(FAMILY_PATH), cache_dir=tmp_path / "cache").strip().splitlines()[-1])
    for name, info in result.items():
        K = int(name.split()[0][1:])
        wst = name.endswith(" st")
        wgs = name.endswith("wgmma") or wst
        solve = name.endswith("solve") or wgs
        # q, k and g by three TMA boxes (and v by a fourth with the wgmma solve), the running sums out by one (no
        # per-element loads of the chunk); with rows_solve nothing of the rows leaves, and one release flags the chunk
        # once the scan's inputs are written
        assert info["tma_loads"] == 3 + wgs and info["tma_stores"] == (0 if solve else 1), (name, info)
        assert info["flag_release"] == int(solve), (name, info)
        # the products: tf32 warpgroup products, and the inverse's bf16 tensor-core products: 18 mma_v2, or with
        # the wgmma solve seven stacked steps of three products (four doubling, two merging, Aqk A) and the outputs'
        # four and two (two k16 instructions each), no mma_v2 at all
        assert info["wgmma_tf32"] > 0 and (info["mma_bf16"] == 0) == wgs, (name, info)
        if wgs:
            assert info["wgmma_bf16"] == 7 * 3 * 2 and info["wgmma_bf16_out"] == (4 + 2) * 2, (name, info)
        # "wgmma_st": the two stacked [2 BT, K] bf16 output tiles leave as 16-byte stores, 2 * 64 K / (16 * 128)
        # per thread, and none as bf16 pairs
        if wst:
            assert info["st_v4"] == K // 8 and info["st_b32"] < result[name[:-3]]["st_b32"], (name, info)
        assert info["regs"] <= info["cap"], (name, info["notes"])
        # q and k land inside the products' [2 BT, K] float32 operand buffer: that, the [BT, K] column operand and g's
        # box (16 BT K bytes in all), the mbarrier and at most 2 KB of the compiler's scratch (at K 128 and 4 warps:
        # 64 KB, three programs per SM; q and k in buffers of their own would make it 80 KB and two)
        # (rows_solve: k exp(G) in bf16 beside them, 2 BT K bytes more; q exp(G) scale goes in g's buffer, and with the
        # wgmma solve v's tile in the column operand's)
        assert info["shared"] <= 16 * 32 * K + (2 * 32 * K if solve else 0) + 2048 + 64, (name, info["shared"])
        # the running sums' store has read g's buffer before anything writes shared memory again: the compiler may
        # place its scratch in that buffer once the store is issued (H200, session 16: inf at the headline when the
        # wait came at the program's end)
        if not solve:
            assert 0 <= info["store_at"] < info["wait_at"] < info["first_wgmma_at"], (name, info)
            assert info["shared_writes_before_wait"] == 0, (name, info)
        # rows_fold: the guarded path's one product of N 2 BT (g's box inside its column operand: the same 64 KB)
        assert (info["wgmma_n64"] > 0) == name.endswith("fold"), (name, info)
    assert result["K128 WG1 cap168"]["shared"] * 3 <= 232448
    # the solve's products: w, Aqk w (two), u and Aqk u (three) beside the rows' inverse; still three programs per SM
    assert result["K128 WG1 cap168 solve"]["mma_bf16"] > result["K128 WG1 cap168"]["mma_bf16"]
    assert result["K128 WG1 cap168 solve"]["shared"] * 3 <= 232448
    assert result["K128 WG1 cap168 solve wgmma"]["shared"] * 3 <= 232448
    # the staged stores reuse the rows' operand buffer: no more shared memory than the direct ones
    for K in (128, 64):
        assert result[f"K{K} WG1 cap168 solve wgmma st"]["shared"] == result[f"K{K} WG1 cap168 solve wgmma"]["shared"]
