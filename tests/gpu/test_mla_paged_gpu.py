"""The ``mla_paged`` family's Hopper engine on the GPU: ENGINE "gluon" against the problem's float32 reference, where it
applies (H 64, pages of 64 or 128 tokens; B1 Sq1 over a short cache stays on the Triton tiles), on the shapes that stress
its hand-offs between the loader and the two warpgroups: a piece of one tile, odd and even tile counts, partial last
tiles, lengths equal to Sq, unequal lengths that split and merge, equal lengths packed in equal pieces, and softmaxes
made nearly one-hot or flat. ENGINES names the knob settings to check (a new engine or form joins it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_kopt.families import load_family
from pytest_kopt.problems.mla_paged import MLA_PAGED

FAMILY = load_family("mla_paged")
ENGINES = {"gluon": {"ENGINE": "gluon"}, "gluon-grid-merge": {"ENGINE": "gluon", "GRID_MERGE": 2},
           "gluon-pdl": {"ENGINE": "gluon", "GLUON_PDL": 1}, "gluon-pair": {"ENGINE": "gluon", "PAIR": 2},
           "gluon-pair-grid-merge": {"ENGINE": "gluon", "PAIR": 2, "GRID_MERGE": 1, "GLUON_PDL": 1},
           # bfloat16 partials: every piece's rows staged through shared memory (gluon_ws.py, _g_store_staged)
           "gluon-bf16-parts": {"ENGINE": "gluon", "PARTIAL_DTYPE": "bfloat16", "GLUON_PDL": 1},
           "gluon-bf16-parts-grid-merge": {"ENGINE": "gluon", "PARTIAL_DTYPE": "bfloat16", "GRID_MERGE": 2},
           "gluon-pair-bf16-parts": {"ENGINE": "gluon", "PAIR": 2, "PARTIAL_DTYPE": "bfloat16", "GRID_MERGE": 1},
           # bfloat16 partials where the grid merges them (B * R <= 256), float32 for the merge kernel
           "gluon-auto-parts": {"ENGINE": "gluon", "PARTIAL_DTYPE": "auto", "GRID_MERGE": 1, "GLUON_PDL": 1, "PAIR": 1},
           # the merge kernel as FlashMLA's combine: a warp a row, whole sequences' programs ending before the wait
           "gluon-combine": {"ENGINE": "gluon", "GLUON_PDL": 1, "MERGE_ROWS": 8},
           "gluon-combine-4": {"ENGINE": "gluon", "MERGE_ROWS": 4},
           # the promoted knobs, whatever they are now
           "best": json.loads((Path(__file__).resolve().parents[2] / "kernels" / "best" / "mla-paged.json").read_text())["knobs"]}
EDGE_CASES = [
    {"B": 1, "Sq": 1, "H": 64, "lengths": [64]},  # one tile
    {"B": 1, "Sq": 4, "H": 64, "lengths": [130]},  # three tiles, the last partial
    {"B": 2, "Sq": 2, "H": 64, "lengths": [2, 191]},  # a length of Sq; three tiles
    {"B": 3, "Sq": 4, "H": 64, "lengths": [256, 4, 255]},  # four whole tiles; a length of Sq; four, the last partial
    {"B": 5, "Sq": 1, "H": 64, "lengths": [8192, 1, 63, 65, 4097]},  # split and merged
    {"B": 32, "Sq": 4, "H": 64, "Skv": 1000},  # equal lengths, packed
    {"B": 4, "Sq": 2, "H": 64, "Skv": 3000, "page_size": 128, "q_scale": 32.0},
    {"B": 2, "Sq": 4, "H": 64, "lengths": [777, 5000], "q_scale": 0.01},
]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    from family_modules import import_rendered

    folder = tmp_path_factory.mktemp("mla_paged_gpu")
    return {engine: import_rendered(FAMILY, knobs, folder).kernel for engine, knobs in ENGINES.items()}


def check(kernel, case: dict, seed: int) -> None:
    inputs = MLA_PAGED.make_inputs(case, device="cuda", seed=seed)
    for _ in range(2):  # the first call plans and compiles, the second launches the compiled kernel directly
        out = kernel(**inputs)
    errors = MLA_PAGED.compare(out, MLA_PAGED.reference(**inputs))
    assert all(e.ok for e in errors), (case, seed, [e.reason for e in errors if not e.ok])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", EDGE_CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items() if k != "lengths"))
def test_the_hopper_engines_match_the_reference(kernels, engine, case, seed):
    check(kernels[engine], case, seed)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_length_past_the_table_poisons_only_its_sequence(kernels, engine, seed):
    """A planned shape called again with one length past its table (the lengths are checked on the first call only):
    that sequence's rows are NaN, whichever kernel writes them, and the others still match the reference."""
    case = {"B": 5, "Sq": 2, "H": 64, "lengths": [8192, 2, 63, 4097, 65]}  # 128 rows: the Gluon kernels where they apply
    inputs = MLA_PAGED.make_inputs(case, device="cuda", seed=seed)
    kernel = kernels[engine]
    kernel(**inputs)
    o_ref, lse_ref = MLA_PAGED.reference(**inputs)
    lens = inputs["cache_seqlens"].clone()
    lens[3] = inputs["block_table"].shape[1] * inputs["kv_cache"].shape[1] + 1
    o, lse = kernel(**dict(inputs, cache_seqlens=lens))
    assert torch.isnan(o[3].float()).all() and torch.isnan(lse[3]).all()
    keep = [0, 1, 2, 4]
    errors = MLA_PAGED.compare((o[keep], lse[keep]), (o_ref[keep], lse_ref[keep]))
    assert all(e.ok for e in errors), (seed, [e.reason for e in errors if not e.ok])


@pytest.mark.parametrize("engine", ENGINES)
def test_one_plan_called_with_new_lengths_each_time(kernels, engine, seed):
    """One planned shape called five times, the lengths drawn anew each time (what a serving step does): every call
    matches the reference, so what the kernels count across the grid (GRID_MERGE's barrier) and record per sequence
    for the merge kernel is each call's own, not left from the last."""
    gen = torch.Generator().manual_seed(seed)
    case = {"B": 24, "Sq": 1, "H": 64, "lengths": [4096] * 24}
    inputs = MLA_PAGED.make_inputs(case, device="cuda", seed=seed)
    kernel = kernels[engine]
    for _ in range(5):
        lens = torch.randint(1, 4097, (24,), generator=gen, dtype=torch.int32)
        call = dict(inputs, cache_seqlens=lens.to("cuda"))
        errors = MLA_PAGED.compare(kernel(**call), MLA_PAGED.reference(**call))
        assert all(e.ok for e in errors), (seed, lens.tolist(), [e.reason for e in errors if not e.ok])


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_the_hopper_engines_on_drawn_lengths(kernels, engine, data):
    """Lengths drawn at random (Sq to 3000 tokens each, Sq 1, 2 or 4, up to 40 sequences), each engine on its own draws
    (``-k best`` checks the promoted knobs alone)."""
    sq = data.draw(st.sampled_from([1, 2, 4]))
    lengths = data.draw(st.lists(st.integers(sq, 3000), min_size=1, max_size=40))
    case = {"B": len(lengths), "Sq": sq, "H": 64, "lengths": lengths}
    check(kernels[engine], case, data.draw(st.integers(0, 2**31 - 1)))
