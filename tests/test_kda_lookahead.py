"""Version 11 of the chunked KDA family (CPU interpreter): ``scan_form="lookahead"``, the state pass
that forms the next chunk's delta from this chunk's state and delta, so that a step's products do not
wait for each other.

Checked: the outputs on every hostile gate kind and on edge shapes (with the loop's best knobs around
the new one); the scan alone against a float64 replay of its own arithmetic (tight enough that a
missing term or a chunk off by one fails); refusals; and an sm_90 compile without local-memory spills
and with the step's products on the tensor cores."""

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
NEW = {"scan_form": "lookahead"}


def errors_of(module, x, knobs):
    got = module.kda_chunked(x["q"], x["k"], x["v"], x["g"], x["beta"], x.get("scale"), x["initial_state"],
                             x["output_final_state"], knobs)
    return PROBLEM.compare(got, PROBLEM.reference(**x))


@pytest.mark.parametrize("kind", HOSTILE)
def test_lookahead_hostile_gates(tmp_path, kind):
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
def test_lookahead_edge_shapes(tmp_path, case):
    """T = 1 (one chunk: the lookahead's loads of the next chunk all masked), T not a multiple of BT,
    B = 2, K != V both ways, with and without the initial / final state, on the problem's own gates."""
    module = render({**FAMILY.knobs, **BEST, **NEW}, tmp_path)
    check(module.kernel, inputs(case, seed=102), case)


@pytest.mark.parametrize("u_dtype", [torch.bfloat16, torch.float32])
def test_scan_step_replayed_in_float64(family, u_dtype):
    """The lookahead scan alone, on random w, kd, u, gl: its per-chunk states and final state equal a
    float64 replay of its own arithmetic (T = gl S rounded to bf16 in w T, C = w_{n+1} kd_n^T rounded to
    bf16, delta as bf16 hi + lo) to float32 accuracy, and the delta form's states to the bf16 roundings'
    accuracy.  A missing C delta term or a chunk off by one moves the states by far more and fails."""
    gen = torch.Generator().manual_seed(104)
    BH, NT, BT, K, V = 2, 5, 32, 32, 32
    TP = NT * BT
    kd = (torch.randn(BH, TP, K, generator=gen) * 0.3).to(torch.bfloat16)
    w = (torch.randn(BH, TP, K, generator=gen) * 0.3).to(torch.bfloat16)
    u = (torch.randn(BH, TP, V, generator=gen)).to(u_dtype)
    gl = torch.rand(BH, NT, K, generator=gen) * 0.5 + 0.5
    h0 = torch.randn(BH, K, V, generator=gen)
    ht = torch.empty(BH, K, V)
    hbuf = torch.empty(BH, NT, K, V, dtype=torch.bfloat16)
    o = torch.empty(1, TP, BH, V, dtype=torch.bfloat16)
    family._kda_scan_kernel[(V // 16, BH)](
        w, u, kd, w, w, gl, u, h0, ht, o, hbuf, o,
        TP, TP, NT, BH, 0, o.stride(0), o.stride(1), o.stride(2),
        K=K, V=V, BT=BT, BV=16, LAYOUT=0, FUSE_OUT=False, SPLIT_S=False, USE_H0=True, STORE_HT=True, PRE=True,
        LOOK=True)

    def bf(x):
        return x.float().to(torch.bfloat16).double()

    def split(x):
        hi = x.float().to(torch.bfloat16)
        return hi.double() + (x.float() - hi.float()).to(torch.bfloat16).double()

    W, KD, U = w.double().reshape(BH, NT, BT, K), kd.double().reshape(BH, NT, BT, K), u.double().reshape(BH, NT, BT, V)
    S = h0.double()
    d = U[:, 0] - W[:, 0] @ bf(S)
    exact = h0.double()  # the delta form in float64: no rounding of the state anywhere
    for n in range(NT):
        assert (hbuf[:, n].double() - S).abs().max() <= 2.0 ** -8 * S.abs().max(), n
        assert (S - exact).norm() / exact.norm() < 2e-2, n  # the roundings only: a wrong step is O(1)
        T = S * gl[:, n, :, None].double()
        exact = exact * gl[:, n, :, None].double() + KD[:, n].transpose(-1, -2) @ (U[:, n] - W[:, n] @ exact)
        S_next = T + KD[:, n].transpose(-1, -2) @ split(d)
        if n + 1 < NT:
            C = bf(W[:, n + 1] @ KD[:, n].transpose(-1, -2))
            d = U[:, n + 1] - W[:, n + 1] @ bf(T) - C @ split(d)
        S = S_next
    rel = (ht.double() - S).norm() / S.norm()
    assert rel < 2e-5, rel.item()
    assert (ht.double() - exact).norm() / exact.norm() < 2e-2


def test_lookahead_refused_outside_its_layout(family):
    """Served only with readout "pre", scan_layout "kv" and the separate read-out; the default is "delta"."""
    assert family.KNOBS["scan_form"] == "delta"
    for over in ({"readout": "aqk"}, {"scan_layout": "vk"}, {"fuse_output": True}):
        with pytest.raises(ValueError, match="scan_form='lookahead'"):
            family._plan(32, 32, {**family.KNOBS, **NEW, **over})
    assert family._plan(128, 128, {**family.KNOBS, **BEST, **NEW})["LOOK"]
    assert not family._plan(128, 128, family.KNOBS)["LOOK"]
    with pytest.raises(ValueError, match="not one of"):
        family._plan(32, 32, {**family.KNOBS, "scan_form": "transition"})  # version 10, removed


@pytest.fixture(scope="module")
def family():
    return load_module(FAMILY_PATH)


def _nvidia_bin() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


@pytest.mark.parametrize("warps", [4, 8])
def test_lookahead_compiles_for_hopper_without_spills(tmp_path, warps):
    """The best knobs with scan_form "lookahead" (4- and 8-warp scans) compile for sm_90 (no GPU): the
    scan without local memory (no ld.local in its PTX, no LDL / STL in its SASS) and with its products
    on the tensor cores."""
    override = {**BEST, **NEW, "scan_warps": warps}
    out = compile_in_child(COMPILE_FOR_HOPPER, str(FAMILY_PATH), json.dumps(override), str(tmp_path / "scan"),
                           timeout=600)
    assert "compiled for sm_90" in out
    ptx = (tmp_path / "scan.ptx").read_text()
    assert "ld.local" not in ptx and "st.local" not in ptx
    assert re.search(r"\bmma\.sync|wgmma", ptx), "the scan's products should run on the tensor cores"
    sass = subprocess.run([str(_nvidia_bin() / "nvdisasm"), "-c", str(tmp_path / "scan.cubin")],
                          capture_output=True, text=True, check=True).stdout
    assert not re.search(r"\b(LDL|STL)\b", sass), "the lookahead scan spills registers on sm_90"
    assert re.search(r"\bH(G)?MMA\b", sass)
