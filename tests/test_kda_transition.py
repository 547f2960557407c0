"""Version 10 of the chunked KDA family (CPU interpreter): ``scan_form="transition"``, the state
pass as one product per step.  S_next = gl S - P S + kd^T u with P = kd^T w formed chunk-parallel
by ``_kda_transition_kernel`` before the scan, so that only P S depends on the state.

Checked: the outputs on every hostile gate kind and on edge shapes (with the loop's best knobs
around the new one); P as stored against kd^T w as stored; the scan step alone against a float64
replay of its own arithmetic (tight enough that a wrong P S or kd^T u fails); refusals; and an
sm_90 compile without local-memory spills and with the step's products on the tensor cores."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import torch
from family_modules import compile_in_child

from test_kda_chunked import (COMPILE_FOR_HOPPER, FAMILY, FAMILY_PATH, HOSTILE, PROBLEM, check, hostile_inputs, inputs,
                              render)

from pytest_kopt.gate import load_module

BEST = {"u_store": "bf16", "scan_warps": 4, "out_bv": 64, "off_tile": "tight", "diag_cols": "trans"}
NEW = {"scan_form": "transition"}


def errors_of(module, x, knobs):
    got = module.kda_chunked(x["q"], x["k"], x["v"], x["g"], x["beta"], x.get("scale"), x["initial_state"],
                             x["output_final_state"], knobs)
    return PROBLEM.compare(got, PROBLEM.reference(**x))


@pytest.mark.parametrize("kind", HOSTILE)
def test_transition_hostile_gates(tmp_path, kind):
    """Every hostile gate kind, K != V, a short last chunk, B = 2, at the best knobs (bf16 u) and with
    float32 u and the 8-warp scan: right, and within 1e-3 of the delta form's own error."""
    case = {"B": 2, "T": 77, "H": 1, "K": 32, "V": 64, "initial_state": True, "output_final_state": True}
    x = hostile_inputs(kind, case, seed=101)
    module = render({**FAMILY.knobs, **BEST, **NEW}, tmp_path)
    check(module.kernel, x, case)
    for over in ({}, {"u_store": "fp32", "scan_warps": 8}):
        base = errors_of(module, {**x, "output_final_state": True}, {**FAMILY.knobs, **BEST, **over})
        new = errors_of(module, {**x, "output_final_state": True}, {**FAMILY.knobs, **BEST, **over, **NEW})
        assert all(e.ok for e in new), (kind, over, [e.reason for e in new if not e.ok])
        for b, n in zip(base, new):
            assert n.rel_rms <= b.rel_rms + 1e-3, (kind, over, b.name, b.rel_rms, n.rel_rms)


@pytest.mark.parametrize("case", [
    {"B": 1, "T": 1, "H": 1, "K": 16, "V": 32, "initial_state": True, "output_final_state": True},
    {"B": 2, "T": 45, "H": 1, "K": 32, "V": 16, "initial_state": False, "output_final_state": True},
    {"B": 1, "T": 40, "H": 2, "K": 64, "V": 32, "initial_state": True, "output_final_state": False},
    {"B": 1, "T": 9, "H": 1, "K": 16, "V": 256, "initial_state": True, "output_final_state": True},
    {"B": 1, "T": 33, "H": 1, "K": 256, "V": 32, "initial_state": False, "output_final_state": False},
    {"B": 1, "T": 37, "H": 1, "K": 256, "V": 32, "initial_state": True, "output_final_state": True},
], ids=PROBLEM.describe)
def test_transition_edge_shapes(tmp_path, case):
    """T = 1, T not a multiple of BT, B = 2, K != V both ways (K = 16 V = 256: one P tile; K = 256
    V = 32: 4 x 2 tiles of P and a single pipeline stage), with and without the initial / final state,
    on the problem's own gates."""
    module = render({**FAMILY.knobs, **BEST, **NEW}, tmp_path)
    check(module.kernel, inputs(case, seed=102), case)


@pytest.mark.parametrize("K", [32, 128, 256])
def test_p_is_kd_transpose_w(family, K):
    """P as stored (bf16) is kd^T w of the w and kd the solve stored, chunk by chunk, to bf16 rounding
    (every row and column tile of the transition launch, a short last chunk)."""
    case = {"B": 1, "T": 45, "H": 2, "K": K, "V": 16, "initial_state": False, "output_final_state": True}
    x = hostile_inputs("channels", case, seed=103)
    d = {}
    family.kda_chunked(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, True,
                       {**family.KNOBS, **BEST, **NEW}, debug=d)
    BT, NT = d["BT"], d["NT"]
    p = d["p"]
    assert p.dtype == torch.bfloat16 and tuple(p.shape) == (2, NT, K, K)
    kd = d["kd"].double().reshape(2, NT, BT, K)
    w = d["w"].double().reshape(2, NT, BT, K)
    want = kd.transpose(-1, -2) @ w
    err = (p.double() - want).abs()
    # one bf16 rounding of a float32 sum: within half an ulp of bf16 (2^-9 relative) plus float32 noise
    assert (err <= 2.0 ** -8 * want.abs() + 1e-6 * want.abs().amax()).all(), err.max()
    assert want.abs().amax() > 0.1  # not trivially zero
    # the default leaves no P behind
    d0 = {}
    family.kda_chunked(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, True, family.KNOBS, debug=d0)
    assert d0["p"] is None


@pytest.mark.parametrize("u_dtype", [torch.bfloat16, torch.float32])
def test_scan_step_replayed_in_float64(family, u_dtype):
    """The transition scan alone, on random P, kd, u, gl: its per-chunk states and final state equal a
    float64 replay of S_next = gl S + kd^T u - P bf16(S) (the kernel's own roundings: S to bf16 in P S,
    float32 u as bf16 hi + lo in kd^T u) to float32 accuracy.  A wrong or missing part of P S or of
    kd^T u (e.g. u's lo half) moves the result by ~1e-3 relative and fails."""
    gen = torch.Generator().manual_seed(104)
    BH, NT, BT, K, V = 2, 4, 32, 32, 32
    TP = NT * BT
    kd = (torch.randn(BH, TP, K, generator=gen) * 0.3).to(torch.bfloat16)
    w = (torch.randn(BH, TP, K, generator=gen) * 0.3).to(torch.bfloat16)
    p = (kd.double().reshape(BH, NT, BT, K).transpose(-1, -2) @ w.double().reshape(BH, NT, BT, K)).to(torch.bfloat16)
    u = (torch.randn(BH, TP, V, generator=gen)).to(u_dtype)
    gl = torch.rand(BH, NT, K, generator=gen) * 0.5 + 0.5
    h0 = torch.randn(BH, K, V, generator=gen)
    ht = torch.empty(BH, K, V)
    hbuf = torch.empty(BH, NT, K, V, dtype=torch.bfloat16)
    o = torch.empty(1, TP, BH, V, dtype=torch.bfloat16)
    family._kda_scan_kernel[(V // 16, BH)](
        w, u, kd, w, w, gl, u, h0, ht, o, hbuf, o, p,
        TP, TP, NT, BH, 0, o.stride(0), o.stride(1), o.stride(2),
        K=K, V=V, BT=BT, BV=16, LAYOUT=0, FUSE_OUT=False, SPLIT_S=False, USE_H0=True, STORE_HT=True, PRE=True,
        TRANS=True)
    S = h0.double()
    if u_dtype == torch.float32:
        u_hi = u.to(torch.bfloat16)
        u_used = u_hi.double() + (u - u_hi.float()).to(torch.bfloat16).double()
    else:
        u_used = u.double()
    for n in range(NT):
        rows = slice(n * BT, (n + 1) * BT)
        assert torch.equal(hbuf[:, n], S.float().to(torch.bfloat16)) or \
            (hbuf[:, n].double() - S).abs().max() <= 2.0 ** -8 * S.abs().max(), n
        b = kd[:, rows].double().transpose(-1, -2) @ u_used[:, rows]
        S = S * gl[:, n, :, None].double() + b - p[:, n].double() @ S.float().to(torch.bfloat16).double()
    rel = (ht.double() - S).norm() / S.norm()
    assert rel < 2e-5, rel.item()


def test_transition_refused_outside_its_layout(family):
    """Served only with readout "pre", scan_layout "kv" and the separate read-out; the default is "delta"."""
    assert family.KNOBS["scan_form"] == "delta"
    for over in ({"readout": "aqk"}, {"scan_layout": "vk"}, {"fuse_output": True}):
        with pytest.raises(ValueError, match="scan_form='transition'"):
            family._plan(32, 32, {**family.KNOBS, **NEW, **over})
    plan = family._plan(128, 128, {**family.KNOBS, **BEST, **NEW})
    assert plan["TRANS"] and plan["PR"] == 64 and plan["PC"] == 128
    assert not family._plan(128, 128, family.KNOBS)["TRANS"]
    # at K = 256 P alone is 128 KB a stage: the scan falls back to one stage
    assert family._plan(256, 32, {**family.KNOBS, **BEST, **NEW})["scan_stages"] == 1


@pytest.fixture(scope="module")
def family():
    return load_module(FAMILY_PATH)


def _nvidia_bin() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


@pytest.mark.parametrize("warps", [4, 8])
def test_transition_compiles_for_hopper_without_spills(tmp_path, warps):
    """The best knobs with scan_form "transition" (4- and 8-warp scans) compile for sm_90 (no GPU):
    the transition launch too, the scan without local memory (no ld.local in its PTX, no LDL / STL in
    its SASS) and with its products on the tensor cores."""
    override = {**BEST, **NEW, "scan_warps": warps}
    out = compile_in_child(COMPILE_FOR_HOPPER, str(FAMILY_PATH), json.dumps(override), str(tmp_path / "scan"),
                           timeout=600)
    assert "compiled for sm_90" in out
    ptx = (tmp_path / "scan.ptx").read_text()
    assert "ld.local" not in ptx and "st.local" not in ptx
    assert re.search(r"\bmma\.sync|wgmma", ptx), "the scan's products should run on the tensor cores"
    sass = subprocess.run([str(_nvidia_bin() / "nvdisasm"), "-c", str(tmp_path / "scan.cubin")],
                          capture_output=True, text=True, check=True).stdout
    assert not re.search(r"\b(LDL|STL)\b", sass), "the transition scan spills registers on sm_90"
    assert re.search(r"\bH(G)?MMA\b", sass)
