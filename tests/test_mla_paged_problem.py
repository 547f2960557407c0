"""The ``mla-paged`` problem: its reference, its inputs (as an allocator leaves them), its cost
model, its cases, and the FlashMLA baseline's plumbing (against a stand-in ``flash_mla`` module
that checks the layout it is handed and answers with the reference)."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_kopt.kernels.reference.mla import check_paged, gather_sequence, length_groups, mla_paged_eager_bf16, mla_paged_reference
from pytest_kopt import KERNELS_DIR
from pytest_kopt.problems import get_problem
from pytest_kopt.problems import mla as mla_problem
from pytest_kopt.problems.base import rel_rms
from pytest_kopt.problems.mla import MLA
from pytest_kopt.problems.mla_paged import MLA_PAGED, case_lengths

SEEDS = st.integers(0, 2**31 - 1)


def loop_attention_paged(q, kv_cache, block_table, cache_seqlens, scale):
    """The definition written out in float64, one (sequence, query, head) at a time, each key row
    looked up through the block table by hand."""
    B, Sq, H, _ = q.shape
    ps = kv_cache.shape[1]
    o = torch.zeros(B, Sq, H, 512, dtype=torch.float64)
    lse = torch.zeros(B, H, Sq, dtype=torch.float64)
    for b in range(B):
        n = int(cache_seqlens[b])
        rows = torch.stack([kv_cache[int(block_table[b, j // ps]), j % ps] for j in range(n)]).double()
        for i in range(Sq):
            keys = rows[: i + n - Sq + 1]
            for h in range(H):
                s = (keys @ q[b, i, h].double()) * scale
                lse[b, h, i] = torch.logsumexp(s, 0)
                o[b, i, h] = torch.softmax(s, 0) @ keys[:, :512]
    return o, lse


@settings(max_examples=12, deadline=None)
@given(case=MLA_PAGED.case_strategy("cpu"), seed=SEEDS)
def test_reference_matches_the_definition(case, seed):
    inputs = MLA_PAGED.make_inputs(case, device="cpu", seed=seed)
    o, lse = MLA_PAGED.reference(**inputs)
    want_o, want_lse = loop_attention_paged(**inputs)
    assert o.dtype == torch.float64 and lse.dtype == torch.float32
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()  # the NaN slots are never read
    assert rel_rms(o, want_o) < 1e-12 and rel_rms(lse, want_lse) < 1e-6


@pytest.mark.parametrize("lengths", [[5, 9, 5, 9, 2], [7, 7, 7], [3, 12, 12, 3, 12], [40, 37, 44, 2, 39, 41], [9, 10, 11, 12]])
def test_reference_batches_sequences_of_near_lengths_right(lengths):
    """Sequences of one length, or of near lengths, go through the reference in one batch, interleaved with others
    (a shorter one padded with zero rows): each still gets its own pages, queries and causal limit (against the
    definition, in float64)."""
    case = {"B": len(lengths), "Sq": 2, "H": 2, "page_size": 4, "lengths": lengths}
    inputs = MLA_PAGED.make_inputs(case, device="cpu", seed=len(lengths))
    o, lse = MLA_PAGED.reference(**inputs)
    want_o, want_lse = loop_attention_paged(**inputs)
    assert rel_rms(o, want_o) < 1e-12 and rel_rms(lse, want_lse) < 1e-6


@settings(max_examples=8, deadline=None)
@given(case=MLA.case_strategy("cpu"), seed=SEEDS, page_size=st.sampled_from([1, 3, 16, 64]))
def test_reference_agrees_with_the_dense_problem(case, seed, page_size):
    """Every sequence of one length, pages in order: the paged truth is ``mla``'s truth."""
    dense = MLA.make_inputs(case, device="cpu", seed=seed)
    B, Skv = case["B"], case["Skv"]
    pages = -(-Skv // page_size)
    kv_cache = torch.zeros(B * pages * page_size, 576, dtype=dense["kv"].dtype)
    kv_cache.view(B, pages * page_size, 576)[:, :Skv] = dense["kv"]
    table = torch.arange(B * pages, dtype=torch.int32).view(B, pages)
    lengths = torch.full((B,), Skv, dtype=torch.int32)
    o, lse = mla_paged_reference(dense["q"], kv_cache.view(-1, page_size, 576), table, lengths, dense["scale"])
    want_o, want_lse = MLA.reference(**dense)
    assert rel_rms(o, want_o) < 1e-12 and rel_rms(lse, want_lse) < 1e-7


def permute_pages(inputs, seed):
    """The same logical cache with its pages moved: kv_cache's pages shuffled, the table renamed."""
    n = inputs["kv_cache"].shape[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    moved = torch.empty_like(inputs["kv_cache"])
    moved[perm] = inputs["kv_cache"]
    return {**inputs, "kv_cache": moved, "block_table": perm.to(torch.int32)[inputs["block_table"].long()]}


@settings(max_examples=6, deadline=None)
@given(case=MLA_PAGED.case_strategy("cpu"), seed=SEEDS)
def test_reference_depends_on_the_tokens_not_where_they_sit(case, seed):
    inputs = MLA_PAGED.make_inputs(case, device="cpu", seed=seed)
    o, lse = MLA_PAGED.reference(**inputs)
    o2, lse2 = MLA_PAGED.reference(**permute_pages(inputs, seed + 1))
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


def test_make_inputs_is_seeded_and_looks_like_an_allocator_left_it():
    case = {"B": 3, "Sq": 2, "H": 4, "page_size": 16, "lengths": [40, 16, 70], "shared_pages": 1, "table_slack": 2}
    a, b, c = (MLA_PAGED.make_inputs(case, device="cpu", seed=s) for s in (5, 5, 6))
    assert set(a) == {"q", "kv_cache", "block_table", "cache_seqlens", "scale"}
    for key in ("q", "block_table", "cache_seqlens"):
        assert torch.equal(a[key], b[key])
    assert torch.equal(a["kv_cache"].isnan(), b["kv_cache"].isnan()) and torch.equal(a["kv_cache"].nan_to_num(), b["kv_cache"].nan_to_num())
    assert not torch.equal(a["block_table"], c["block_table"])  # the page order follows the seed...
    assert a["kv_cache"].shape == c["kv_cache"].shape and a["block_table"].shape == c["block_table"].shape  # ...the shapes do not
    assert a["cache_seqlens"].tolist() == [40, 16, 70] and a["cache_seqlens"].dtype == a["block_table"].dtype == torch.int32
    table, kv = a["block_table"], a["kv_cache"]
    assert table.shape == (3, 5 + 2) and kv.shape[1:] == (16, 576)
    assert len({int(table[b, 0]) for b in range(3)}) == 1  # the shared prefix page
    own = [set(table[b, 1: -(-n // 16)].tolist()) for b, n in enumerate([40, 16, 70])]
    assert sum(map(len, own)) == len(set().union(*own)) and int(table[0, 0]) not in set().union(*own)
    used = torch.zeros(kv.shape[:2], dtype=torch.bool)
    for b, n in enumerate([40, 16, 70]):
        for j in range(n):
            used[int(table[b, j // 16]), j % 16] = True
        assert kv[table[b, -(-n // 16):].long()].isnan().all()  # entries past the last page point at NaN
    assert torch.equal(kv.isnan().any(-1), ~used) and torch.equal(kv.isnan().all(-1), ~used)
    assert (a["q"].float().std() - 1).abs() < 0.05
    q32 = MLA_PAGED.make_inputs({**case, "q_scale": 32.0}, device="cpu", seed=5)["q"]
    assert (q32.float().std() / a["q"].float().std() - 32).abs() < 0.5


def test_make_inputs_rejects_impossible_cases():
    with pytest.raises(ValueError, match="Sq <= every length"):
        MLA_PAGED.make_inputs({"B": 2, "Sq": 3, "H": 1, "lengths": [5, 2]}, device="cpu", seed=0)
    with pytest.raises(ValueError, match="shared pages"):
        MLA_PAGED.make_inputs({"B": 2, "Sq": 1, "H": 1, "page_size": 4, "lengths": [5, 9], "shared_pages": 2}, device="cpu", seed=0)
    with pytest.raises(ValueError, match="lengths for B"):
        MLA_PAGED.make_inputs({"B": 2, "Sq": 1, "H": 1, "lengths": [5]}, device="cpu", seed=0)
    with pytest.raises(ValueError, match="distribution"):
        case_lengths({"B": 2, "Sq": 1, "H": 1, "dist": "uniform", "Skv": 9})


BAD_INPUTS = {
    "length beyond the table": (lambda i: {**i, "cache_seqlens": i["cache_seqlens"] + 10_000}, "max_pages"),
    "length below Sq": (lambda i: {**i, "cache_seqlens": torch.ones_like(i["cache_seqlens"])}, "Sq=2"),
    "int64 lengths": (lambda i: {**i, "cache_seqlens": i["cache_seqlens"].long()}, "cache_seqlens must be int32"),
    "int64 table": (lambda i: {**i, "block_table": i["block_table"].long()}, "block_table must be int32"),
    "float32 cache": (lambda i: {**i, "kv_cache": i["kv_cache"].float()}, "dtypes differ"),
    "512-wide cache": (lambda i: {**i, "kv_cache": i["kv_cache"][..., :512]}, "kv_cache must be"),
    "3-d q": (lambda i: {**i, "q": i["q"][0]}, "q must be"),
    "table of another batch": (lambda i: {**i, "block_table": i["block_table"][:1]}, "block_table must be"),
    "page outside the cache": (lambda i: {**i, "block_table": i["block_table"] + 1000}, "outside kv_cache"),
}


@pytest.mark.parametrize("bad", BAD_INPUTS, ids=str)
def test_reference_rejects_bad_inputs_clearly(bad):
    spoil, message = BAD_INPUTS[bad]
    inputs = spoil(MLA_PAGED.make_inputs(MLA_PAGED.smoke_case, device="cpu", seed=0))
    with pytest.raises(ValueError, match=message):
        MLA_PAGED.reference(**inputs)


def test_gather_sequence_cuts_at_the_length():
    kv = torch.arange(4 * 3 * 576, dtype=torch.float32).view(4, 3, 576)
    rows = gather_sequence(kv, torch.tensor([2, 0, 3], dtype=torch.int32), 5)
    assert torch.equal(rows, torch.cat([kv[2], kv[0, :2]]))


@settings(max_examples=6, deadline=None)
@given(case=MLA_PAGED.case_strategy("cpu"), seed=SEEDS)
def test_eager_gather_baseline_is_close_and_finite(case, seed):
    """The eager PyTorch path zeroes the rows past each length, so the NaN slots never reach o. Its
    scores are bf16, rounded before scaling: their absolute error grows with the logits, so on
    q x 32 (the stress draw) o is only within ~4 % (measured up to 4.2 % over 60 draws)."""
    inputs = MLA_PAGED.make_inputs(case, device="cpu", seed=seed)
    o, lse = mla_paged_eager_bf16(**inputs)
    want_o, want_lse = MLA_PAGED.reference(**inputs)
    assert o.dtype == torch.bfloat16 and lse.dtype == torch.float32 and o.shape == want_o.shape and lse.shape == want_lse.shape
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    o_bound = 2e-2 if float(case.get("q_scale", 1.0)) <= 1.0 else 8e-2
    assert rel_rms(o, want_o) < o_bound and rel_rms(lse, want_lse) < 5e-3  # bf16 scores and weights


def test_cost_of_equal_lengths_is_the_dense_cost_plus_the_table():
    for case in MLA.headline_cases:
        dense, paged = MLA.cost(case), MLA_PAGED.cost(case)
        assert paged.flops == dense.flops
        assert paged.bytes == dense.bytes + 4 * case["B"] * (-(-case["Skv"] // 64)) + 4 * case["B"]


@settings(max_examples=20, deadline=None)
@given(case=MLA_PAGED.case_strategy("cpu"))
def test_cost_counts_each_sequence_s_visible_keys(case):
    lengths, Sq, H = case_lengths(case), case["Sq"], case["H"]
    visible = sum(int((torch.arange(n)[None, :] <= torch.arange(Sq)[:, None] + (n - Sq)).sum()) for n in lengths)
    assert MLA_PAGED.cost(case).flops == 2 * 1088 * H * visible


@settings(max_examples=60, deadline=None)
@given(data=st.data(), device=st.sampled_from(["cpu", "cuda"]))
def test_case_strategies_stay_in_bounds(data, device):
    case = data.draw(MLA_PAGED.case_strategy(device))
    lengths = case_lengths(case)
    assert min(lengths) >= case["Sq"] >= 1 and len(lengths) == case["B"]
    assert case.get("shared_pages", 0) * case["page_size"] <= min(lengths)
    if device == "cpu":
        assert case["B"] * case["H"] * case["Sq"] <= 128 and max(lengths) <= 70
    MLA_PAGED.describe(case)


def test_problem_metadata():
    assert get_problem("mla-paged") is MLA_PAGED
    labels = [MLA_PAGED.describe(c) for c in MLA_PAGED.headline_cases]
    assert labels[:4] == ["B1 Sq1 H64 Skv8192", "B1 Sq2 H64 Skv8192", "B1 Sq4 H64 Skv8192", "B64 Sq1 H64 Skv8192"]
    assert labels[4].startswith("B128 Sq1 H64 len512-32768 longtail s0") and labels[5] == "B32 Sq4 H64 Skv8192"
    assert labels[6:] == ["B32 Sq1 H64 Skv8192", "B1 Sq1 H64 Skv131072"]
    timed = [labels[i] for i in MLA_PAGED.timed_headline]
    assert "B32 Sq1 H64 Skv8192" not in timed and "B1 Sq1 H64 Skv131072" not in timed and len(timed) == 5
    lengths = case_lengths(MLA_PAGED.headline_cases[4])
    assert min(lengths) == 512 and max(lengths) == 32768 and len(set(lengths)) > 64  # long-tailed, unequal
    assert MLA_PAGED.families == ("mla_paged_naive", "mla_paged")
    assert MLA_PAGED.baseline_candidate_path == KERNELS_DIR / "families" / "mla_paged_naive.py"
    assert [b.name for b in MLA_PAGED.baselines("cpu")] == ["torch-eager-gather-bf16"]
    assert [(o.name, o.tolerance) for o in MLA_PAGED.outputs] == [("o", 5e-3), ("lse", 5e-4)]
    inputs = MLA_PAGED.make_inputs(MLA_PAGED.smoke_case, device="cpu", seed=0)
    assert MLA_PAGED.expected_dtypes(inputs) == {"o": torch.bfloat16, "lse": torch.float32}
    assert check_paged(inputs["q"], inputs["kv_cache"], inputs["block_table"], inputs["cache_seqlens"]) == (2, 2, 16, 16)


# ---- FlashMLA, through a stand-in module ------------------------------------------------------
class _Meta:
    def __init__(self):
        self.uses = 0


def _stand_in(legacy: bool = True, calls: list | None = None) -> types.ModuleType:
    """A ``flash_mla`` with sgl-flash-mla 1.0.0's signature that checks FlashMLA's layout and
    answers with the reference (so the plumbing, not FlashMLA, is what is tested)."""
    module = types.ModuleType("flash_mla")
    module.has_legacy = lambda: legacy
    module.get_mla_metadata = lambda *a, **k: (_Meta(), None)

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits=None,
                               softmax_scale=None, causal=False, is_fp8_kvcache=None, use_legacy=False):
        assert use_legacy and head_dim_v == 512 and num_splits is None and isinstance(tile_scheduler_metadata, _Meta)
        assert k_cache.dim() == 4 and k_cache.shape[1:] == (64, 1, 576) and block_table.dtype == cache_seqlens.dtype == torch.int32
        assert causal == (q.shape[1] > 1)
        tile_scheduler_metadata.uses += 1
        if calls is not None:
            calls.append(tile_scheduler_metadata)
        o, lse = mla_paged_reference(q, k_cache[:, :, 0], block_table, cache_seqlens, softmax_scale, accum_dtype=torch.float32)
        return o.to(q.dtype), lse

    module.flash_mla_with_kvcache = flash_mla_with_kvcache
    return module


@pytest.fixture
def fake_flash_mla(monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "flash_mla", _stand_in(calls=calls))
    mla_problem.flashmla_status.cache_clear()
    yield calls
    mla_problem.flashmla_status.cache_clear()


def test_flashmla_is_the_first_baseline_where_it_imports(fake_flash_mla):
    assert [b.name for b in MLA.baselines("cuda")] == ["flashmla", "torch-eager-bf16", "torch-fp32-reference"]
    assert [b.name for b in MLA_PAGED.baselines("cuda")] == ["flashmla", "torch-eager-gather-bf16"]
    assert [b.name for b in MLA.baselines("cpu")] == ["torch-eager-bf16", "torch-fp32-reference"]  # a GPU baseline only
    assert [b.name for b in get_problem("mla-prefill").baselines("cuda")] == ["torch-eager-bf16", "torch-fp32-reference"]


def test_flashmla_paged_takes_the_problem_s_layout_as_it_is(fake_flash_mla):
    flashmla = mla_problem.flashmla_status()[0]
    case = {"B": 2, "Sq": 2, "H": 2, "lengths": [70, 130]}
    inputs = MLA_PAGED.make_inputs(case, device="cpu", seed=3)
    errors = MLA_PAGED.compare(flashmla.paged(**inputs), MLA_PAGED.reference(**inputs))
    assert all(e.rel_rms < 5e-3 for e in errors), errors
    flashmla.paged(**inputs)
    assert fake_flash_mla[0] is fake_flash_mla[1]  # the same lengths tensor: the scheduler metadata is reused (per layer)
    flashmla.paged(**{**inputs, "cache_seqlens": inputs["cache_seqlens"].clone()})  # another lengths tensor: made again
    assert fake_flash_mla[2] is not fake_flash_mla[1]
    fresh = mla_problem.FlashMLA(sys.modules["flash_mla"], fresh_metadata=True)
    fresh.paged(**inputs)
    fresh.paged(**inputs)
    assert fake_flash_mla[3] is not fake_flash_mla[4]
    with pytest.raises(ValueError, match="pages of 64"):
        flashmla.paged(**MLA_PAGED.make_inputs(MLA_PAGED.smoke_case, device="cpu", seed=0))


def test_flashmla_dense_reads_the_contiguous_cache_as_pages(fake_flash_mla):
    flashmla = mla_problem.flashmla_status()[0]
    case = {"B": 2, "Sq": 3, "H": 2, "Skv": 128}
    inputs = MLA.make_inputs(case, device="cpu", seed=4)
    errors = MLA.compare(flashmla.dense(**inputs), MLA.reference(**inputs))
    assert all(e.rel_rms < 5e-3 for e in errors), errors
    flashmla.dense(**MLA.make_inputs(case, device="cpu", seed=5))
    assert fake_flash_mla[0] is fake_flash_mla[1]  # one shape, one (cached) table and lengths: one metadata
    with pytest.raises(ValueError, match="multiple"):
        flashmla.dense(**MLA.make_inputs({"B": 1, "Sq": 1, "H": 2, "Skv": 100}, device="cpu", seed=0))


@pytest.mark.parametrize("module", [None, "no-legacy"])
def test_flashmla_that_cannot_run_is_skipped_with_a_reason(monkeypatch, module):
    monkeypatch.setitem(sys.modules, "flash_mla", None if module is None else _stand_in(legacy=False))
    mla_problem.flashmla_status.cache_clear()
    try:
        flashmla, reason = mla_problem.flashmla_status()
        assert flashmla is None and ("--no-deps" in reason if module is None else "legacy" in reason)
        assert [b.name for b in MLA_PAGED.baselines("cuda")] == ["torch-eager-gather-bf16"]
        assert [b.name for b in MLA.baselines("cuda")] == ["torch-eager-bf16", "torch-fp32-reference"]
    finally:
        mla_problem.flashmla_status.cache_clear()


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 5000), min_size=1, max_size=200), ratio=st.sampled_from([1.0, 1.25, 2.0]))
def test_length_groups_cover_every_sequence_once_within_the_padding_bound(lengths, ratio):
    groups = length_groups(lengths, ratio)
    assert sorted(b for g in groups for b in g) == list(range(len(lengths)))
    for g in groups:
        assert len(g) * max(lengths[b] for b in g) <= ratio * sum(lengths[b] for b in g) + 1e-9
    for value in set(lengths):  # one length, one batch
        assert len({i for i, g in enumerate(groups) for b in g if lengths[b] == value}) == 1
