"""The MLA references and problem definitions: the ground truth must be right before anything
is judged against it."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_kopt.kernels.reference.mla import mla_eager_bf16, mla_reference
from pytest_kopt import KERNELS_DIR
from pytest_kopt.problems import get_problem, register_problem
from pytest_kopt.problems.base import rel_rms
from pytest_kopt.problems.mla import DEEPSEEK_SCALE, MLA, MLA_PREFILL, MLADecode

PROBLEMS = [MLA, MLA_PREFILL]
SETTINGS = settings(max_examples=15, deadline=None)
SEEDS = st.integers(0, 2**31 - 1)
any_cpu_case = st.one_of(MLA.case_strategy("cpu"), MLA_PREFILL.case_strategy("cpu"))


def loop_attention(q, kv, scale):
    """One query and head at a time, in float64: the definition written out."""
    B, Sq, H, _ = q.shape
    Skv = kv.shape[1]
    q64, kv64 = q.double(), kv.double()
    o = torch.zeros(B, Sq, H, 512, dtype=torch.float64)
    lse = torch.zeros(B, H, Sq, dtype=torch.float64)
    for b in range(B):
        for i in range(Sq):
            keys = kv64[b, : i + Skv - Sq + 1]  # bottom-right causal
            for h in range(H):
                s = (keys @ q64[b, i, h]) * scale
                m = s.max()
                total = torch.exp(s - m).sum()
                lse[b, h, i] = m + torch.log(total)
                o[b, i, h] = (torch.exp(s - m) / total) @ keys[:, :512]
    return o, lse


@SETTINGS
@given(case=any_cpu_case, seed=SEEDS)
def test_reference_matches_per_query_loop(case, seed):
    inputs = MLA.make_inputs(case, device="cpu", seed=seed)
    o, lse = mla_reference(**inputs)
    want_o, want_lse = loop_attention(**inputs)
    assert o.dtype == torch.float64 and lse.dtype == torch.float32
    assert rel_rms(o, want_o) < 1e-12
    assert rel_rms(lse, want_lse) < 1e-6  # lse is returned in float32
    # The float32 path (what runs on a GPU) stays close to the float64 one.
    o32, lse32 = mla_reference(**inputs, accum_dtype=torch.float32)
    assert rel_rms(o32, want_o) < 1e-5 and rel_rms(lse32, want_lse) < 1e-6


def test_reference_chunking_is_invisible(monkeypatch):
    """Chunking over queries (needed at Sq = 8192) must not change the answer."""
    import pytest_kopt.kernels.reference.mla as ref

    inputs = MLA_PREFILL.make_inputs({"B": 2, "Sq": 37, "H": 3, "Skv": 37}, device="cpu", seed=5)
    o_whole, lse_whole = mla_reference(**inputs)
    monkeypatch.setattr(ref, "_MAX_SCORES", 2 * 3 * 37 * 5)  # chunks of 5 queries, last one short
    o_chunked, lse_chunked = ref.mla_reference(**inputs)
    assert rel_rms(o_chunked, o_whole) < 1e-14 and rel_rms(lse_chunked, lse_whole) < 1e-7


@SETTINGS
@given(case=any_cpu_case.filter(lambda c: c["Sq"] > 1), seed=SEEDS, data=st.data())
def test_causal_row_ignores_later_keys(case, seed, data):
    case = {**case, "dist": "typical"}  # on logits x 32 the softmax is one-hot and the last row may not move
    inputs = MLA.make_inputs(case, device="cpu", seed=seed)
    q, kv, scale = inputs["q"], inputs["kv"], inputs["scale"]
    Sq, Skv = case["Sq"], case["Skv"]
    i = data.draw(st.integers(0, Sq - 2), label="query")  # not the last: it sees every key
    last_seen = i + Skv - Sq
    changed = kv.clone()
    changed[:, last_seen + 1 :] = torch.randn_like(changed[:, last_seen + 1 :].float()).to(kv.dtype) * 3
    for fn in (mla_reference, mla_eager_bf16):
        o, lse = fn(q, kv, scale)
        o2, lse2 = fn(q, changed, scale)
        assert torch.equal(o[:, i], o2[:, i]) and torch.equal(lse[:, :, i], lse2[:, :, i]), fn.__name__
        # ...while the last query, which sees the changed keys, does change.
        assert not torch.equal(o[:, -1], o2[:, -1]), fn.__name__


@SETTINGS
@given(case=any_cpu_case, seed=SEEDS)
def test_lse_is_natural_logsumexp_of_visible_scores(case, seed):
    inputs = MLA.make_inputs(case, device="cpu", seed=seed)
    q, kv, scale = inputs["q"].double(), inputs["kv"].double(), inputs["scale"]
    Sq, Skv = case["Sq"], case["Skv"]
    scores = torch.einsum("bihd,bjd->bhij", q, kv) * scale
    hidden = torch.arange(Skv)[None, :] > torch.arange(Sq)[:, None] + (Skv - Sq)
    want = torch.logsumexp(scores.masked_fill(hidden, float("-inf")), dim=-1)
    _, lse = mla_reference(**inputs)
    assert rel_rms(lse, want) < 1e-6


@settings(max_examples=10, deadline=None)
@given(Skv=st.integers(1, 70), H=st.sampled_from([1, 2, 16]), seed=SEEDS)
def test_identical_keys_give_closed_form(Skv, H, seed):
    """Skv copies of one row: lse = s + ln(Skv) and o = that row's latent part."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, H, 576, generator=gen, dtype=torch.float64)
    row = torch.randn(1, 1, 576, generator=gen, dtype=torch.float64)
    kv = row.expand(1, Skv, 576).contiguous()
    o, lse = mla_reference(q, kv, DEEPSEEK_SCALE)
    s = (q[0, 0] @ row[0, 0]) * DEEPSEEK_SCALE  # [H]
    assert torch.allclose(lse[0, :, 0].double(), s + math.log(Skv), rtol=1e-6, atol=1e-6)
    assert torch.allclose(o[0, 0], row[0, 0, :512].expand(H, 512), rtol=1e-12, atol=1e-12)


@SETTINGS
@given(case=any_cpu_case, seed=SEEDS)
def test_eager_bf16_is_close_to_reference(case, seed):
    inputs = MLA.make_inputs({**case, "dist": "typical"}, device="cpu", seed=seed)  # bf16 scores lose more on scaled logits
    o, lse = mla_eager_bf16(**inputs)
    want_o, want_lse = mla_reference(**inputs)
    assert o.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert o.shape == want_o.shape and lse.shape == want_lse.shape
    # Scores rounded to bf16 before the softmax cost it ~5e-3 on o and up to ~3e-3 on lse.
    assert rel_rms(o, want_o) < 2e-2
    assert rel_rms(lse, want_lse) < 1e-2


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.name)
def test_compare_accepts_bf16_rounding_and_rejects_damage(problem):
    case = {"B": 2, "Sq": 3, "H": 2, "Skv": 3 if problem is MLA_PREFILL else 40}
    expected = problem.reference(**problem.make_inputs(case, device="cpu", seed=11))
    o, lse = expected
    assert all(e.ok for e in problem.compare((o.bfloat16(), lse.float()), expected))

    def errors(outputs):
        return {e.name: e for e in problem.compare(outputs, expected)}

    nan_o = o.bfloat16().clone()
    nan_o[1, 2, 1, 7] = float("nan")
    assert not errors((nan_o, lse))["o"].ok and "NaN" in errors((nan_o, lse))["o"].reason
    inf_lse = lse.clone()
    inf_lse[0, 0, 0] = float("inf")
    assert not errors((o, inf_lse))["lse"].ok
    gen = torch.Generator().manual_seed(3)
    noisy_o = o * (1 + 0.02 * torch.randn(o.shape, generator=gen, dtype=o.dtype))
    assert not errors((noisy_o, lse))["o"].ok
    assert not errors((o, lse + 0.01 * lse.abs().mean()))["lse"].ok  # a 1% shift of the normaliser
    assert not errors((o, lse.transpose(1, 2)))["lse"].ok  # [B, Sq, H] instead of [B, H, Sq]
    assert not errors((o[..., :256], lse))["o"].ok
    assert not all(e.ok for e in problem.compare((o,), expected))


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.name)
def test_make_inputs_is_seeded_and_realistic(problem):
    case = {"B": 1, "Sq": 4, "H": 8, "Skv": 4} if problem is MLA_PREFILL else {"B": 1, "Sq": 4, "H": 8, "Skv": 4096}
    a = problem.make_inputs(case, device="cpu", seed=1)
    b = problem.make_inputs(case, device="cpu", seed=1)
    c = problem.make_inputs(case, device="cpu", seed=2)
    assert set(a) == {"q", "kv", "scale"} and isinstance(a["scale"], float)
    assert a["scale"] == pytest.approx(1 / math.sqrt(192))
    assert a["q"].shape == (1, 4, 8, 576) and a["kv"].shape == (1, case["Skv"], 576)
    assert a["q"].dtype == a["kv"].dtype == torch.bfloat16
    assert torch.equal(a["q"], b["q"]) and torch.equal(a["kv"], b["kv"])
    assert not torch.equal(a["q"], c["q"]) and not torch.equal(a["kv"], c["kv"])
    assert problem.make_inputs(case, device="cpu", seed=1, dtype=torch.float32)["q"].dtype == torch.float32
    if problem is MLA:
        # Over 4096 keys the softmax is neither flat (max weight >> 1/Skv) nor one-hot.
        q, kv = a["q"].double(), a["kv"].double()
        probs = torch.softmax(torch.einsum("bihd,bjd->bhij", q, kv) * a["scale"], dim=-1)
        top = probs.amax(dim=-1)
        assert (top > 20 / 4096).all() and (top < 0.5).all()


def test_make_inputs_rejects_impossible_cases():
    with pytest.raises(ValueError, match="Sq <= Skv"):
        MLA.make_inputs({"B": 1, "Sq": 5, "H": 1, "Skv": 4}, device="cpu", seed=0)
    with pytest.raises(ValueError, match="Sq == Skv"):
        MLA_PREFILL.make_inputs({"B": 1, "Sq": 2, "H": 1, "Skv": 4}, device="cpu", seed=0)


@settings(max_examples=50, deadline=None)
@given(data=st.data(), device=st.sampled_from(["cpu", "cuda"]), problem=st.sampled_from(PROBLEMS))
def test_case_strategies_stay_in_bounds(data, device, problem):
    case = data.draw(problem.case_strategy(device))
    assert set(case) == {"B", "Sq", "H", "Skv", "dist"} and 1 <= case["Sq"] <= case["Skv"]
    assert case["dist"] in ("typical",) + problem.stress
    if problem is MLA_PREFILL:
        assert case["Sq"] == case["Skv"]
    else:
        assert case["Sq"] <= 16
    if device == "cpu":
        assert case["H"] in (1, 2, 16) and case["B"] <= 2 and case["Skv"] <= 70
        assert case["B"] * case["H"] * case["Sq"] <= 128
    else:
        assert case["H"] in (16, 32, 64, 128) and case["Skv"] <= 4096


@settings(max_examples=20, deadline=None)
@given(case=any_cpu_case)
def test_cost_counts_only_visible_keys(case):
    B, Sq, H, Skv = case["B"], case["Sq"], case["H"], case["Skv"]
    visible = int((torch.arange(Skv)[None, :] <= torch.arange(Sq)[:, None] + (Skv - Sq)).sum())
    cost = MLA.cost(case)
    assert cost.flops == 2 * (576 + 512) * B * H * visible
    assert cost.bytes == 2 * (B * Sq * H * 576 + B * Skv * 576 + B * Sq * H * 512) + 4 * B * H * Sq


def test_headline_costs_match_measured_anchors():
    """The figures in shared/anchors/h200-baselines-1.json (bytes there leave out the 256 B of lse)."""
    decode = MLA.cost(MLA.headline_cases[0])
    assert decode.flops == 1_140_850_688 and decode.bytes == 9_576_448 + 64 * 4
    prefill = MLA_PREFILL.cost(MLA_PREFILL.headline_cases[0])
    # The anchor counts S*S/2 visible pairs; the exact count is S*(S+1)/2.
    assert prefill.flops == 2 * 1088 * 64 * (8192 * 8193 // 2)
    assert prefill.flops == pytest.approx(4_672_924_418_048, rel=2e-4)


def test_problem_metadata():
    assert [MLA.describe(c) for c in MLA.headline_cases] == [
        "B1 Sq1 H64 Skv8192", "B1 Sq2 H64 Skv8192", "B1 Sq4 H64 Skv8192", "B64 Sq1 H64 Skv8192", "B32 Sq1 H64 Skv8192",
        "B1 Sq1 H64 Skv131072"]
    assert MLA.timed_headline == (0, 3)
    assert [MLA_PREFILL.describe(c) for c in MLA_PREFILL.headline_cases] == ["B1 Sq8192 H64 Skv8192"]
    assert MLA.families == ("mla_naive", "mla_decode", "mla_decode_paged") and MLA_PREFILL.families == ("mla_naive", "mla_prefill")
    for problem in PROBLEMS:
        assert [b.name for b in problem.baselines("cpu")] == ["torch-eager-bf16", "torch-fp32-reference"]
        assert problem.baseline_candidate_path == KERNELS_DIR / "families" / "mla_naive.py"
        assert problem.reference_path == KERNELS_DIR / "reference" / "mla.py"
        assert problem.baseline_candidate_path.is_file() and problem.reference_path.is_file()
        assert [(o.name, o.tolerance) for o in problem.outputs] == [("o", 5e-3), ("lse", 5e-4)]
        smoke = problem.smoke_case
        assert 1 <= smoke["Sq"] <= smoke["Skv"] and smoke["B"] * smoke["H"] * smoke["Sq"] <= 64
        inputs = problem.make_inputs(smoke, device="cpu", seed=0)
        assert problem.expected_dtypes(inputs) == {"o": torch.bfloat16, "lse": torch.float32}
        summary = problem.summary()
        assert summary["problem"] == problem.name and summary["headline"][0] == problem.describe(problem.headline_cases[0])


def test_problems_are_registered():
    assert get_problem("mla") is MLA and get_problem("mla-prefill") is MLA_PREFILL
    with pytest.raises(ValueError, match="already registered"):
        register_problem(MLADecode())
