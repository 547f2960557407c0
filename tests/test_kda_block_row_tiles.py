"""Session 6's block-row knobs of the chunked KDA family (CPU interpreter): ``off_tile="tight"``
(the off-diagonal tile only as wide as the columns a block row can see) and ``diag_cols="trans"``
(the guarded diagonal's column factor transposed from registers instead of loaded again).

Both change how the block rows form Aqk / Akk, not what they are, so the scratch they write must
stay as close to the float64 matrices as the default's, on every hostile gate kind and with short
chunks; and the outputs must pass the problem's check."""

from __future__ import annotations

import json

import pytest
import torch
from family_modules import compile_in_child

from test_kda_chunked import (COMPILE_FOR_HOPPER, FAMILY, FAMILY_PATH, HOSTILE, PROBLEM, aqk_akk_float64, check, hostile_inputs, inputs,
                              render, tf32_rounding)

from pytest_kopt.gate import load_module

NEW = {"off_tile": "tight", "diag_cols": "trans"}


def scratch_errors(module, x, knobs):
    """Max abs error of the raw Aqk (hi + lo) and Akk (subst "extract": no inverses stored) against float64."""
    d = {}
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], None, x["initial_state"], True)
    module.kda_chunked(*args, {**knobs, "subst": "extract", "solve_warps": 8}, debug=d)
    aqk = d["aqk"][0].double() + d["aqk"][1].double()
    assert torch.isfinite(aqk).all() and torch.isfinite(d["akk"]).all()
    want = aqk_akk_float64(x, knobs["BT"])
    return (aqk - want["aqk"]).abs().max().item(), (d["akk"].double() - want["akk"]).abs().max().item()


@pytest.mark.parametrize("kind", HOSTILE)
def test_new_block_row_tiles_hostile_gates(tmp_path, kind):
    """Each knob alone and both together: outputs right on every hostile gate kind (K != V, a short
    last chunk, B = 2), and the raw Aqk / Akk within 2x of the default's error against float64
    (the same exact factorisation; only tile shapes and where the column factor comes from move)."""
    case = {"B": 2, "T": 45, "H": 1, "K": 64, "V": 16, "initial_state": True, "output_final_state": True}
    x = hostile_inputs(kind, case, seed=91)
    module = render({**FAMILY.knobs, **NEW}, tmp_path)
    check(module.kernel, x, case)
    base = scratch_errors(module, x, FAMILY.knobs)
    for knobs in ({"off_tile": "tight"}, {"diag_cols": "trans"}, NEW):
        err = scratch_errors(module, x, {**FAMILY.knobs, **knobs})
        assert all(e <= max(2 * b, 1e-5) for e, b in zip(err, base)), (kind, knobs, err, base)


@pytest.mark.parametrize("case", [
    {"B": 1, "T": 1, "H": 1, "K": 16, "V": 32, "initial_state": True, "output_final_state": True},
    {"B": 1, "T": 17, "H": 2, "K": 32, "V": 128, "initial_state": False, "output_final_state": False},
    {"B": 1, "T": 96, "H": 1, "K": 128, "V": 32, "initial_state": False, "output_final_state": True},
], ids=PROBLEM.describe)
def test_new_block_row_tiles_edge_shapes(tmp_path, case):
    """T = 1 (no second block row), a chunk cut inside its second block row, K = 128 (four key
    tiles), on the problem's own gates, with this session's best knobs around the two new ones."""
    best = {"u_store": "bf16", "scan_warps": 4, "out_bv": 64}
    module = render({**FAMILY.knobs, **best, **NEW}, tmp_path)
    check(module.kernel, inputs(case, seed=92), case)


def test_new_block_row_tiles_two_warps(tmp_path):
    """The 2-warp block rows at 168 registers (a TRY_EARLY entry) with both knobs, hostile gates."""
    case = {"B": 1, "T": 70, "H": 1, "K": 32, "V": 32, "initial_state": True, "output_final_state": True}
    module = render({**FAMILY.knobs, **NEW, "block_warps": 2, "block_maxnreg": 168}, tmp_path)
    for kind in ("resets", "strong_run"):
        check(module.kernel, hostile_inputs(kind, case, seed=93), case)


def test_new_block_row_tiles_tf32_emulated(tmp_path, monkeypatch):
    """With the GPU's tf32 operand rounding emulated, on the problem's inputs and channel-wise gates."""
    hits = tf32_rounding(monkeypatch)
    module = render({**FAMILY.knobs, **NEW}, tmp_path)
    case = {"B": 1, "T": 70, "H": 1, "K": 64, "V": 32, "initial_state": True, "output_final_state": True}
    for x in (inputs(case, seed=94), hostile_inputs("channels", case, seed=94)):
        check(module.kernel, x, case)
    assert hits, "the tf32 emulation was never applied"


def test_tight_tile_refused_where_it_has_no_width():
    """off_tile="tight" needs BT - BC to be a tl.arange width; block_prog "chunk" has no row tile."""
    fam = load_module(FAMILY_PATH)
    with pytest.raises(ValueError, match="off_tile"):
        fam._plan(32, 32, {**fam.KNOBS, "off_tile": "tight", "BT": 64, "solve_warps": 8})
    with pytest.raises(ValueError, match="off_tile"):
        fam._plan(32, 32, {**fam.KNOBS, "off_tile": "tight", "block_prog": "chunk"})
    assert fam._plan(32, 32, {**fam.KNOBS, "off_tile": "tight"})["OFFW"] == 16
    assert fam._plan(32, 32, fam.KNOBS)["OFFW"] == 32


def test_new_block_row_tiles_compile_for_hopper():
    """Both knobs, with the 2-warp block rows at 168 registers, compile for sm_90 (no GPU needed)."""
    override = {**NEW, "u_store": "bf16", "scan_warps": 4, "out_bv": 64, "block_warps": 2, "block_maxnreg": 168}
    out = compile_in_child(COMPILE_FOR_HOPPER, str(FAMILY_PATH), json.dumps(override), timeout=600)
    assert "compiled for sm_90" in out
