"""scan_engine "wgmma" of the chunked KDA family (session 10): the state pass and the read-out as one
Gluon kernel for Hopper, ``_kda_scan_wgmma`` (and "wgmma_ws", its warp-specialised form).

Gluon has no CPU interpreter, so CI checks two things here and the H200 checks the rest
(``tools/dev_kda_wgmma.py``, and the judge in every loop evaluation): on the CPU the knob must fall
back to the Triton scan of the other knobs (same outputs, bit for bit), and the kernel must compile for
sm_90 to what made it fast -- the state never leaving registers (no spills), no wgmma serialised by
ptxas, 20 wgmma and two waits on the state's chain per chunk step, and a ring that fits the H200's
shared memory."""

from __future__ import annotations

import json

import pytest
import torch
from family_modules import compile_in_child
from test_kda_chunked import FAMILY, FAMILY_PATH, PROBLEM, check, render

PROMOTED = {"u_store": "bf16", "scan_warps": 4, "out_bv": 64, "off_tile": "tight", "diag_cols": "trans"}


@pytest.mark.parametrize("case", [
    {"B": 2, "T": 37, "H": 1, "K": 32, "V": 64, "initial_state": True, "output_final_state": True},
    {"B": 1, "T": 1, "H": 2, "K": 16, "V": 32, "initial_state": False, "output_final_state": True},
], ids=PROBLEM.describe)
@pytest.mark.parametrize("engine", ["wgmma", "wgmma_ws"])
def test_wgmma_engine_falls_back_to_the_triton_scan_off_hopper(tmp_path, case, engine):
    """On the CPU (and any GPU but Hopper) "wgmma" and "wgmma_ws" must run the Triton scan their other
    knobs select: outputs identical to the "triton" engine's, and right against the problem's reference."""
    module = render({**FAMILY.knobs, **PROMOTED, "scan_engine": engine}, tmp_path)
    x = PROBLEM.make_inputs(case, device="cpu", seed=11)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], None, x["initial_state"], x["output_final_state"])
    got = module.kda_chunked(*args, {**FAMILY.knobs, **PROMOTED, "scan_engine": engine})
    want = module.kda_chunked(*args, {**FAMILY.knobs, **PROMOTED, "scan_engine": "triton"})
    for a, b in zip(got, want):
        assert (a is None and b is None) or torch.equal(a, b)
    check(module.kernel, x, case)


def test_wgmma_engine_applies_only_where_its_kernel_serves(tmp_path, monkeypatch):
    """Where the Gluon kernel runs is a function of the shape and knobs alone (plus a Hopper GPU): the
    scan form it implements, K 32/64/128, V a multiple of 64, BT 32; a CPU tensor never."""
    fam = render({**FAMILY.knobs, **PROMOTED, "scan_engine": "wgmma"}, tmp_path)

    class FakeCuda:  # only what _wgmma_scan_applies reads
        is_cuda = True
        device = "cuda:0"

    def applies(K, V, kn, tensor=None):
        return fam._wgmma_scan_applies(FakeCuda() if tensor is None else tensor, K, V, fam._plan(K, V, kn), kn)

    knobs = {**fam.KNOBS, **PROMOTED, "scan_engine": "wgmma"}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert applies(128, 128, knobs) and applies(32, 64, knobs)
    refused = [(16, 64, {}), (256, 128, {}), (128, 32, {}), (128, 128, {"BT": 64, "solve_warps": 8, "off_tile": "chunk"}),
               (128, 128, {"u_store": "fp32"}), (128, 128, {"au": "fp32"}), (128, 128, {"readout": "aqk"})]
    for K, V, over in refused:
        assert not applies(K, V, {**knobs, **over}), (K, V, over)
    assert not applies(128, 128, knobs, tensor=torch.empty(1))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert not applies(128, 128, knobs)


def test_scan_bv_picks_two_warpgroups_only_where_they_serve(tmp_path):
    """scan_bv: 128 needs V a multiple of 128; "auto" takes it only where 64-wide programs would outnumber the
    SMs (one program per SM), e.g. B1 T8192 H96 on the H200's 132 SMs but not the headline's 16 heads; the
    ring is lowered until the program fits sm_90's shared memory."""
    fam = render({**FAMILY.knobs, **PROMOTED, "scan_engine": "wgmma_ws", "scan_bv": "auto"}, tmp_path)
    assert fam._wgmma_scan_bv(128, 16, 128, 132) == 128
    assert fam._wgmma_scan_bv(128, 16, 64, 132) == 64  # V 64: one warpgroup covers it
    assert fam._wgmma_scan_bv(64, 96, 128, 132) == 64
    assert fam._wgmma_scan_bv("auto", 96, 128, 132) == 128  # 192 programs at 64
    assert fam._wgmma_scan_bv("auto", 16, 128, 132) == 64  # 32 programs at 64
    assert fam._wgmma_scan_bv("auto", 66, 128, 132) == 64 and fam._wgmma_scan_bv("auto", 67, 128, 132) == 128
    assert fam._wgmma_scan_ring(5, 128, 32, 64) == 5  # 174 KB at ring 4, 215 KB at 5
    assert fam._wgmma_scan_ring(5, 128, 32, 128) == 4 and fam._wgmma_scan_ring(3, 128, 32, 128) == 3
    assert fam._wgmma_scan_ring(5, 64, 32, 128) == 5
    with pytest.raises(ValueError, match="scan_bv"):
        fam._plan(128, 128, {**fam.KNOBS, "scan_bv": 256})


_COMPILE = r"""
import importlib.util, json, re, subprocess, sys, tempfile
from pathlib import Path
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

spec = importlib.util.spec_from_file_location("kda_wgmma_sm90", sys.argv[1])
fam = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fam)
gl = fam.gl
ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


def desc(shape, dtype="bf16", layout=None):  # a host descriptor argument, typed as Triton's launcher types it
    layout = layout or gl.NVMMASharedLayout.get_default_for(shape, gl.bfloat16)
    return f"tensordesc<{dtype}{shape},{layout!r}>"


out = {}
runs = [("_kda_scan_wgmma", K, NS, 64, False) for K, NS in ((128, 5), (128, 3), (32, 4))]  # the deepest ring must still fit
runs += [("_kda_scan_wgmma_ws", K, NS, 64, False) for K, NS in ((128, 5), (32, 4))]
# scan_bv 128: two compute warpgroups; the launch lowers the ring to what fits (4 at K 128)
runs += [("_kda_scan_wgmma_ws", K, fam._wgmma_scan_ring(5, K, 32, 128), 128, False) for K in (128, 64)]
# scan_overlap "pdl": the loader waits for the solve's flag of each chunk
runs += [("_kda_scan_wgmma_ws", 128, 4, 64, True)]
for name, K, NS, BV, WAIT in runs:
    BT = 32
    sig = {"wkq_desc": desc([4, BT, K]), "ua_desc": desc([2, BT, BV]),
           "g_desc": desc([1, K], "fp32", gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)),
           "o_desc": desc([1, BT, BV]), "h0_ptr": "*fp32", "ht_ptr": "*fp32", "TP": "i32", "NT": "i32", "H": "i32",
           "K": "constexpr", "V": "constexpr", "BT": "constexpr", "BV": "constexpr", "NS": "constexpr",
           "USE_H0": "constexpr", "STORE_HT": "constexpr"}
    cx = {"K": K, "V": 128, "BT": BT, "BV": BV, "NS": NS, "USE_H0": True, "STORE_HT": True}
    if name.endswith("_ws"):
        sig.update(flag_ptr="*i32", WAIT="constexpr")
        cx["WAIT"] = WAIT
    c = triton.compile(GluonASTSource(getattr(fam, name), sig, constexprs=cx), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": BV // 16})
    ptx = c.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "k.ptx").write_text(ptx)
        notes = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(Path(tmp) / "k.ptx"), "-o", str(Path(tmp) / "k.cubin")],
                               capture_output=True, text=True).stderr
    out[f"{name} K{K} ring {NS} BV{BV}" + (" wait" if WAIT else "")] = {
              "shared": c.metadata.shared, "waits": ptx.count("wgmma.wait_group"), "wgmma": ptx.count("wgmma.mma_async"),
              "launch_dependents": ptx.count("griddepcontrol.launch_dependents"), "acquire": ptx.count("fence.acq_rel.gpu"),
              "proxy_fence": ptx.count("fence.proxy.async.global"), "volatile": ptx.count("ld.volatile.global"),
              "serialised": "C7515" in notes, "spills": "0 bytes spill stores, 0 bytes spill loads" not in notes,
              # the compute partition hands a stage back (and o over) with one thread's arrive: only after a barrier of
              # all its warps -- both warpgroups at BV 128
              "barrier_arrives": len(re.findall(rf"bar\.sync\s+0, {BV * 2};\s+(?://[^\n]*\s+)?@%p\d+ mbarrier\.arrive\.shared::cta", ptx)),
              "notes": notes[-400:]}
print(json.dumps(out))
"""


def test_wgmma_scan_compiles_for_hopper_without_spills_or_serialised_wgmma(tmp_path):
    pytest.importorskip("triton.backends.nvidia.compiler")
    result = json.loads(compile_in_child(_COMPILE, str(FAMILY_PATH), cache_dir=tmp_path / "cache").strip().splitlines()[-1])
    for K, info in result.items():
        assert not info["serialised"], (K, info["notes"])
        assert not info["spills"], (K, info["notes"])
        # per chunk step: S^T w^T and S^T qd^T (K / 16 each), the update (BT / 16 for delta's hi and lo halves);
        # three waits (w's product, the read-out's, the update) and none elsewhere
        k = int(K.split()[1][1:])
        assert info["wgmma"] == 2 * k // 16 + 2 * 32 // 16, (K, info["wgmma"])
        assert info["waits"] == 3, (K, info["waits"])
        assert info["shared"] <= 232448, (K, info["shared"])
        if "_ws " in K:  # the empty and o_ready hand-overs
            assert info["barrier_arrives"] == 2, (K, info["barrier_arrives"])
        # scan_overlap "pdl": the solve launched at once, each chunk's flag polled with a strong load and an acquire
        # fence, and the proxy fence before the TMA loads; nothing of it without WAIT
        waits_for_solve = K.endswith(" wait")
        assert info["launch_dependents"] == int(waits_for_solve), (K, info)
        assert (info["acquire"] >= 1 and info["proxy_fence"] >= 1 and info["volatile"] >= 1) == waits_for_solve, (K, info)
