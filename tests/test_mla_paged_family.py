"""The ``mla-paged`` families on the CPU interpreter: kernels/families/mla_paged/ (the tuned
family) and mla_paged_naive.py (the baseline candidate), rendered as the search agent renders them.

Every case is checked against the problem's float64 reference with the problem's tolerances, on
inputs as an allocator leaves them (NaN in every slot no sequence owns). The scheduler is checked
twice: a Python mirror of its arithmetic (every tile of every sequence in exactly one piece, the
partial slots distinct, the parts balanced) and the kernel's own record of it (MERGE "kernel"
writes each sequence's first part and piece count) against that mirror. The kernels are also
compiled for sm_90 (no GPU needed): wgmma, shared memory, and tile loops that read no table entry.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from family_modules import CANDIDATE_IMPORTS, compile_in_child, import_rendered, imported_modules
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_kopt.families import load_family
from pytest_kopt.problems.base import rel_rms
from pytest_kopt.problems.mla_paged import MLA_PAGED, case_lengths

FAMILY = load_family("mla_paged")
NAIVE = load_family("mla_paged_naive")
SEEDS = st.integers(0, 2**31 - 1)
SMALL = {"CONFIG": "knobs", "BLOCK_H": 16, "BLOCK_N": 16, "KEYS_AS_M": True, "QK_SPLIT": False, "num_warps": 4, "KV_LOAD": "pointer"}

_RENDERED: dict = {}


def render(knobs: dict, tmp_dir, family=FAMILY):
    key = (family.name, tuple(sorted(knobs.items())))
    if key not in _RENDERED:
        _RENDERED[key] = import_rendered(family, knobs, tmp_dir)
    return _RENDERED[key]


@pytest.fixture(scope="module")
def tmp_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("mla_paged")


def check(kernel, case, seed, dtype=torch.bfloat16):
    inputs = MLA_PAGED.make_inputs(case, device="cpu", seed=seed, dtype=dtype)
    o, lse = kernel(**inputs)
    assert o.dtype == dtype and lse.dtype == torch.float32
    errors = MLA_PAGED.compare((o, lse), MLA_PAGED.reference(**inputs))
    assert all(e.ok for e in errors), (case, [e.reason for e in errors if not e.ok])
    return inputs, (o, lse)


def with_sms(module, n_sms):
    """The family planned for a device of ``n_sms`` SMs (more parts: more pieces and merges)."""
    module._sm_count = lambda index: n_sms
    module._PLANS.clear()
    return module


# ---- the scheduler, written out -----------------------------------------------------------------
def schedule(lengths, Sq, block_n, overhead, parts):
    """The kernel's work line in Python: {(part, b): (t0, t1, slot)} and per sequence (first part,
    pieces, first_odd). A lone sequence's fixed cost is left out, as the Triton tiles leave it out."""
    lengths = [n if n >= Sq else Sq for n in lengths]
    overhead = overhead if len(lengths) > 1 else 0
    tiles = [-(-n // block_n) for n in lengths]
    cost = [t + overhead for t in tiles]
    starts = [sum(cost[:b]) for b in range(len(cost))]
    total = sum(cost)
    per = -(-total // parts)
    pieces, record = {}, {}
    for b, (start, t) in enumerate(zip(starts, tiles)):
        first = (start + overhead) // per
        record[b] = (first, (start + overhead + t - 1) // per - first + 1, int(start > first * per))
    for p in range(parts):
        u0, u1 = p * per, min((p + 1) * per, total)
        for b, (start, t) in enumerate(zip(starts, tiles)):
            t0, t1 = max(u0 - start - overhead, 0), min(u1 - start - overhead, t)
            if t1 > t0:
                first, _, odd = record[b]
                pieces[(p, b)] = (t0, t1, 2 * p + (odd if p == first else 0))
    return pieces, record, per


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=40), block_n=st.sampled_from([16, 64]),
       overhead=st.sampled_from([0, 2, 5, 20]), parts=st.integers(1, 140))
def test_schedule_covers_every_tile_once_and_balances_parts(lengths, block_n, overhead, parts):
    pieces, record, per = schedule(lengths, 1, block_n, overhead, parts)
    for b, n in enumerate(lengths):
        spans = sorted((t0, t1) for (p, bb), (t0, t1, _) in pieces.items() if bb == b)
        assert spans[0][0] == 0 and spans[-1][1] == -(-n // block_n)
        assert all(a[1] == c[0] for a, c in zip(spans, spans[1:]))  # contiguous, no overlap, no gap
        first, count, _ = record[b]
        assert count == len(spans) and {p for (p, bb) in pieces if bb == b} == set(range(first, first + count))
    split = [slot for (p, b), (_, _, slot) in pieces.items() if record[b][1] > 1]
    assert len(split) == len(set(split)) and all(0 <= s < 2 * parts for s in split)  # distinct partial slots
    for p in range(parts):  # a part's work: at most its share of the line plus one piece's overhead
        mine = [(b, t1 - t0) for (pp, b), (t0, t1, _) in pieces.items() if pp == p]
        assert sum(t for _, t in mine) + overhead * len(mine) <= per + overhead


def test_long_sequences_are_cut_where_short_ones_are_not():
    """Token balance: at B128 with the headline's long-tailed lengths on 132 parts, the 32k-token
    sequences are cut into several pieces, every sequence into no more than its tokens call for, and
    no part gets more than its share."""
    lengths = case_lengths(MLA_PAGED.headline_cases[4])
    pieces, record, per = schedule(lengths, 1, 64, 5, 132)
    longest = max(range(len(lengths)), key=lambda b: lengths[b])
    assert record[longest][1] >= 4
    for b, n in enumerate(lengths):  # cut by tokens: never into more pieces than its share of parts, plus one
        assert record[b][1] <= -(-(-(-n // 64) + 5) // per) + 1
    loads = [sum(t1 - t0 + 5 for (pp, _), (t0, t1, _) in pieces.items() if pp == p) for p in range(132)]
    assert max(loads) <= per + 5 and sum(loads) / len(loads) > 0.8 * per


def gluon_schedule(lengths, Sq, overhead, parts):
    """ENGINE "gluon"'s schedule in Python (gluon_ws.py ``_g_schedule`` / ``_g_piece``): the work line above, except
    where every sequence has one length and 2 <= B <= parts: each sequence in k = min(parts // B, tiles) equal pieces,
    piece j of sequence b in part b * k + j, its partial (if any) in slot 2 * part."""
    B = len(lengths)
    n = [x if x >= Sq else Sq for x in lengths]
    tiles = -(-n[0] // 64)
    k = min(parts // B, tiles)
    if len(set(n)) != 1 or B < 2 or k < 1:
        return schedule(lengths, Sq, 64, overhead, parts)[:2]
    pieces = {(b * k + j, b): ((j * tiles) // k, ((j + 1) * tiles) // k, 2 * (b * k + j)) for b in range(B) for j in range(k)}
    return pieces, {b: (b * k, k, 0) for b in range(B)}


@settings(max_examples=100, deadline=None)
@given(B=st.integers(1, 40), length=st.integers(1, 20000), parts=st.integers(1, 140), overhead=st.sampled_from([0, 5]))
def test_gluon_packs_equal_lengths_one_piece_a_part(B, length, parts, overhead):
    """Equal lengths: every tile in exactly one piece, no part with two pieces, slots distinct and where the merge
    kernel looks for them (2 * (first part + k), first_odd 0), no sequence in more pieces than parts // B."""
    pieces, record = gluon_schedule([length] * B, 1, overhead, parts)
    packed = 2 <= B <= parts
    for b in range(B):
        spans = sorted((t0, t1) for (p, bb), (t0, t1, _) in pieces.items() if bb == b)
        assert spans[0][0] == 0 and spans[-1][1] == -(-length // 64) and all(a[1] == c[0] for a, c in zip(spans, spans[1:]))
        first, count, odd = record[b]
        assert count == len(spans) and all(t1 > t0 for t0, t1 in spans)
        slots = sorted(slot for (p, bb), (_, _, slot) in pieces.items() if bb == b)
        assert slots == sorted(2 * (first + i) + (odd if i == 0 else 0) for i in range(count))
        if packed:
            assert count == min(parts // B, -(-length // 64))
    if packed:
        assert len({p for p, _ in pieces}) == len(pieces)  # one piece a part
    split = [slot for (p, b), (_, _, slot) in pieces.items() if record[b][1] > 1]
    assert len(split) == len(set(split)) and all(0 <= s < 2 * parts for s in split)


def test_gluon_packing_at_the_headline():
    """B32 Sq4 (33 parts a row block): every sequence whole, nothing to merge; B64 (132 parts): two pieces each,
    where the work line cuts most sequences in three."""
    pieces, record = gluon_schedule([8192] * 32, 4, 5, 33)
    assert all(count == 1 for _, count, _ in record.values()) and len(pieces) == 32
    pieces, record = gluon_schedule([8192] * 64, 1, 5, 132)
    assert all(count == 2 for _, count, _ in record.values()) and len(pieces) == 128
    _, line = schedule([8192] * 64, 1, 64, 5, 132)[:2]
    assert sum(count for _, count, _ in line.values()) > 2.5 * 64


# ---- the contract -------------------------------------------------------------------------------
@pytest.mark.parametrize("family", [FAMILY, NAIVE], ids=lambda f: f.name)
def test_family_file_follows_the_contract(family):
    assert set(family.knobs) == set(family.space)
    assert all(family.knobs[k] in family.space[k] for k in family.knobs)
    assert all(k in family.space and v in family.space[k] for entry in family.try_early for k, v in entry.items())
    assert imported_modules(family.source) <= CANDIDATE_IMPORTS
    files = sorted(family.path.glob("*.py")) if family.path.is_dir() else [family.path]
    assert all(len(f.read_text().splitlines()) <= 900 for f in files)  # a file to hold in one's head (a folder: each stage)


# ---- correctness ----------------------------------------------------------------------------------
@settings(max_examples=6, deadline=None)
@given(case=MLA_PAGED.case_strategy("cpu"), seed=SEEDS)
def test_default_knobs_match_reference(tmp_dir, case, seed):
    check(render({}, tmp_dir).kernel, case, seed)


@settings(max_examples=3, deadline=None)
@given(case=MLA_PAGED.case_strategy("cpu"), seed=SEEDS, merge=st.sampled_from(["fused", "kernel"]), overhead=st.sampled_from([0, 2]),
       n_sms=st.sampled_from([3, 16]))
def test_split_sequences_merge_right(tmp_dir, case, seed, merge, overhead, n_sms):
    """Many parts over few tiles: most sequences split; both merges. The second call reuses the
    scratch, so the fused merge must have left its counters at zero."""
    module = with_sms(render({**SMALL, "MERGE": merge, "OVERHEAD": overhead}, tmp_dir), n_sms)
    check(module.kernel, case, seed)
    check(module.kernel, case, seed + 1)
    counters = next(iter(next(iter(module._PLANS.values()))["scratch"].values()))[0][2]
    assert not counters.any()


def test_the_merge_kernel_folds_pieces_over_several_chunks(tmp_dir):
    """A sequence in more pieces than the merge kernel loads at once: its chunks are folded with a running max (the
    lse and partials of one chunk loaded together), and the result is the reference's."""
    module = with_sms(render({**SMALL, "MERGE": "kernel", "OVERHEAD": 0}, tmp_dir), 12)
    kept = module.MERGE_ELEMS
    module.MERGE_ELEMS = 128  # two pieces a chunk (the fewest it loads)
    try:
        case = {"B": 2, "Sq": 1, "H": 2, "page_size": 16, "lengths": [400, 37]}  # 25 + 3 tiles over 12 parts
        check(module.kernel, case, seed=5)
        plan = next(iter(module._PLANS.values()))
        meta = next(iter(plan["scratch"].values()))[0][3].view(-1, 4)
        assert meta[0, 1] > plan["merge_constexprs"]["CHUNK"]
    finally:
        module.MERGE_ELEMS = kept
        module._PLANS.clear()


def test_the_kernel_schedules_as_written_out(tmp_dir):
    """MERGE "kernel" records each sequence's first part and piece count: they are the mirror's."""
    module = with_sms(render({**SMALL, "MERGE": "kernel", "OVERHEAD": 2}, tmp_dir), 12)
    case = {"B": 4, "Sq": 2, "H": 2, "page_size": 16, "lengths": [3, 70, 18, 41]}
    check(module.kernel, case, seed=3)
    plan = next(iter(module._PLANS.values()))
    parts = plan["grid"][1]
    meta = next(iter(plan["scratch"].values()))[0][3].view(-1, 4)
    _, record, _ = schedule(case["lengths"], 2, 16, 2, parts)
    assert [tuple(meta[b, :3].tolist()) for b in range(4)] == [record[b] for b in range(4)]
    assert max(count for _, count, _ in record.values()) > 1 and not meta[:, 3].any()


def test_a_lone_sequence_is_cut_into_equal_pieces(tmp_dir):
    """One sequence: its fixed cost left out of the line, every part gets cdiv(tiles, parts) tiles or none; with the
    fixed cost in, the first part would hold the overhead and one tile while the others held six."""
    module = with_sms(render({**SMALL, "MERGE": "kernel", "OVERHEAD": 5}, tmp_dir), 12)
    case = {"B": 1, "Sq": 1, "H": 4, "page_size": 16, "lengths": [700]}  # 44 tiles of 16 keys
    check(module.kernel, case, seed=4)
    plan = next(iter(module._PLANS.values()))
    parts = plan["grid"][1]
    meta = next(iter(plan["scratch"].values()))[0][3].view(-1, 4)
    pieces, record, per = schedule(case["lengths"], 1, 16, 5, parts)
    assert tuple(meta[0, :3].tolist()) == record[0] and per == -(-44 // parts)
    assert sorted({t1 - t0 for t0, t1, _ in pieces.values()})[-1] == per and record[0][1] == -(-44 // per)


@settings(max_examples=3, deadline=None)
@given(case=MLA_PAGED.case_strategy("cpu"), seed=SEEDS, keys_as_m=st.booleans(), qk_split=st.booleans(), n_sms=st.sampled_from([2, 8]))
def test_tma_tiles_and_the_masked_last_tile(tmp_dir, case, seed, keys_as_m, qk_split, n_sms):
    """KV_LOAD "tma": whole tiles by descriptors, a sequence's partial last tile (NaN past its end)
    by masked pointers; both score orientations, the split score dots on 8 warps."""
    knobs = {**SMALL, "KV_LOAD": "tma", "KEYS_AS_M": keys_as_m, "QK_SPLIT": qk_split, "num_warps": 8 if qk_split else 4}
    module = with_sms(render(knobs, tmp_dir), n_sms)
    case = {k: v for k, v in case.items() if k != "shared_pages"}
    check(module.kernel, {**case, "page_size": 16}, seed)
    assert next(iter(module._PLANS.values()))["tma"]


def test_every_space_value(tmp_dir):
    """Each knob value away from a small base config, one at a time (values that change nothing on
    the interpreter, or only a scheduler constant between ones that are run, are rendered only)."""
    base = {**FAMILY.knobs, **SMALL}
    case = {"B": 2, "Sq": 3, "H": 3, "page_size": 16, "lengths": [45, 7]}  # a partial tile and page for every BLOCK_N
    check(render(base, tmp_dir).kernel, case, seed=0)
    for name, values in FAMILY.space.items():
        for value in values:
            knobs = {**base, name: value}
            if value == base[name]:
                continue
            if name in ("num_warps", "num_stages", "PDL", "LAUNCH") or (name == "OVERHEAD" and value not in (0, max(values))):
                render(knobs, tmp_dir)  # GPU-only, or no effect on the interpreter's arithmetic: renders and imports
                continue
            check(render(knobs, tmp_dir).kernel, case, seed=len(str(value)))


def test_random_knob_combinations(tmp_dir):
    rng = random.Random("mla_paged")
    case = {"B": 3, "Sq": 1, "H": 4, "page_size": 4, "lengths": [29, 5, 12], "shared_pages": 1}
    for i in range(3):
        combo = {name: rng.choice(values) for name, values in FAMILY.space.items()}
        try:
            module = render(combo, tmp_dir)
            check(module.kernel, case, seed=i)
        except ValueError as exc:  # a combination the family refuses says why, naming a knob
            assert any(k in str(exc) for k in FAMILY.space), exc


@pytest.mark.parametrize("family", [FAMILY, NAIVE], ids=lambda f: f.name)
def test_float32_inputs_are_exact(tmp_dir, family):
    """No bf16 rounding to hide behind: a wrong mask edge, a dropped key or a wrong page shows far
    above 1e-5."""
    module = with_sms(render({**SMALL, "MERGE": "fused"} if family is FAMILY else {}, tmp_dir, family), 5) if family is FAMILY \
        else render({}, tmp_dir, family)
    for case in ({"B": 2, "Sq": 3, "H": 2, "page_size": 4, "lengths": [35, 9]}, {"B": 1, "Sq": 1, "H": 3, "page_size": 16, "lengths": [17]}):
        inputs = MLA_PAGED.make_inputs(case, device="cpu", seed=11, dtype=torch.float32)
        o, lse = module.kernel(**inputs)
        want_o, want_lse = MLA_PAGED.reference(**inputs)
        assert o.dtype == torch.float32
        assert rel_rms(o, want_o) < 1e-5 and rel_rms(lse, want_lse) < 1e-6, (case, rel_rms(o, want_o), rel_rms(lse, want_lse))


@pytest.mark.parametrize("family", [FAMILY, NAIVE], ids=lambda f: f.name)
def test_strided_views(tmp_dir, family):
    """q a view of a wider buffer, kv_cache pages with a gap between them (no descriptor can take
    it: the pointer path), the block table a column slice of a wider one."""
    module = render({**SMALL, "KV_LOAD": "tma"} if family is FAMILY else {}, tmp_dir, family)
    inputs = MLA_PAGED.make_inputs({"B": 2, "Sq": 2, "H": 3, "page_size": 16, "lengths": [40, 23]}, device="cpu", seed=2)
    n_pages = inputs["kv_cache"].shape[0]
    q = torch.zeros(2, 2, 3, 640, dtype=torch.bfloat16)[..., :576]
    q.copy_(inputs["q"])
    kv = torch.full((n_pages, 17, 576), float("nan"), dtype=torch.bfloat16)[:, :16]
    kv.copy_(inputs["kv_cache"])
    table = torch.full((2, 9), -1, dtype=torch.int32)[:, 2:2 + inputs["block_table"].shape[1]]
    table.copy_(inputs["block_table"])
    assert not q.is_contiguous() and not kv.is_contiguous() and not table.is_contiguous()
    strided = {**inputs, "q": q, "kv_cache": kv, "block_table": table}
    if family is FAMILY:
        module._PLANS.clear()  # the module is shared with other tests: the one plan left is this call's
    errors = MLA_PAGED.compare(module.kernel(**strided), MLA_PAGED.reference(**inputs))
    assert all(e.ok for e in errors), [e.reason for e in errors if not e.ok]
    if family is FAMILY:
        (plan,) = module._PLANS.values()
        assert not plan["tma"]


BAD = {
    "length beyond the table": (lambda i: {**i, "cache_seqlens": i["cache_seqlens"] + 10_000}, "max_pages"),
    "length below Sq": (lambda i: {**i, "cache_seqlens": torch.ones_like(i["cache_seqlens"])}, "Sq=2"),
    "int64 lengths": (lambda i: {**i, "cache_seqlens": i["cache_seqlens"].long()}, "cache_seqlens must be"),
    "int64 table": (lambda i: {**i, "block_table": i["block_table"].long()}, "block_table must be int32"),
    "float32 cache": (lambda i: {**i, "kv_cache": i["kv_cache"].float()}, "dtype"),
    "512-wide cache": (lambda i: {**i, "kv_cache": i["kv_cache"][..., :512]}, "kv_cache must be"),
    "3-d q": (lambda i: {**i, "q": i["q"][0]}, "q must be"),
    "table of another batch": (lambda i: {**i, "block_table": i["block_table"][:1]}, "block_table must be"),
}


@pytest.mark.parametrize("family", [FAMILY, NAIVE], ids=lambda f: f.name)
def test_bad_inputs_raise_a_clear_value_error(tmp_dir, family):
    module = render({}, tmp_dir, family)
    inputs = MLA_PAGED.make_inputs({"B": 2, "Sq": 2, "H": 1, "page_size": 4, "lengths": [9, 6]}, device="cpu", seed=0)
    module.kernel(**inputs)  # a plan for the good shapes exists: a bad call must still be caught
    for bad, (spoil, message) in BAD.items():
        with pytest.raises(ValueError, match=message):
            module.kernel(**spoil(inputs))


@pytest.mark.parametrize("family", [FAMILY, NAIVE], ids=lambda f: f.name)
def test_unchecked_bad_length_reads_nothing_outside_and_says_nan(tmp_dir, family):
    """On a GPU a cached shape's lengths are not re-read on the host; the kernel then clamps a
    length outside [Sq, max_pages * page_size] and writes NaN for that sequence alone."""
    module = render({**SMALL, "MERGE": "fused"} if family is FAMILY else {}, tmp_dir, family)
    inputs = MLA_PAGED.make_inputs({"B": 3, "Sq": 2, "H": 2, "page_size": 4, "lengths": [9, 14, 30]}, device="cpu", seed=4)
    want_o, want_lse = MLA_PAGED.reference(**inputs)
    saved = module._check_lengths
    module._check_lengths = lambda *args: None
    try:
        for bad in (10_000, 1):
            lengths = inputs["cache_seqlens"].clone()
            lengths[1] = bad
            o, lse = module.kernel(**{**inputs, "cache_seqlens": lengths})
            assert o[1].isnan().all() and lse[1].isnan().all()
            for b in (0, 2):
                assert rel_rms(o[b], want_o[b]) < 5e-3 and rel_rms(lse[b], want_lse[b]) < 5e-4
    finally:
        module._check_lengths = saved


def test_unservable_knobs_raise_value_error(tmp_dir):
    inputs = MLA_PAGED.make_inputs(MLA_PAGED.smoke_case, device="cpu", seed=0)
    for bad in ({"BLOCK_N": 24}, {"BLOCK_H": 8}, {"MERGE": "atomic"}, {"KV_LOAD": "descriptor"}, {"OVERHEAD": -1}, {"PDL": 3},
                {"LAUNCH": "graph"}, {"PARTIAL_DTYPE": "float16"}, {"WAVES": 3}):
        module = render({**SMALL, **bad}, tmp_dir)
        with pytest.raises(ValueError, match=next(iter(bad))):
            module.kernel(**inputs)


def test_plan_is_reused_and_direct_launch_values_follow_the_signature(tmp_dir):
    module = render({}, tmp_dir)
    module._PLANS.clear()
    for seed in (0, 1):
        module.kernel(**MLA_PAGED.make_inputs(MLA_PAGED.smoke_case, device="cpu", seed=seed))
    assert len(module._PLANS) == 1
    plan = next(iter(module._PLANS.values()))
    names = module._mla_paged_fwd.arg_names
    runtime = len(names) - len(plan["constexprs"])
    assert names[runtime:] == list(plan["constexprs"]) and plan["constexpr_values"] == list(plan["constexprs"].values())
    assert not plan["direct"] and plan["compiled"] is None  # the interpreter always goes through the JIT entry
    # a compiled kernel's launcher reads grid[0], grid[1] and grid[2]: a 2-element grid raised
    # IndexError on the H200's first direct launch, which the interpreter never makes
    assert len(plan["grid"]) == 3 and len(plan["merge_grid"]) == 3


# ---- ENGINE "gluon" on a pretend H200 ---------------------------------------------------------------
class _FakeCuda(torch.Tensor):
    @property
    def is_cuda(self):
        return True


class _FakeJIT:
    """Stands in for a kernel's JIT entry (``fn[grid](...)``) and for the compiled kernel it returns: records what each
    launch was handed (and the descriptors' bases at that moment)."""

    def __init__(self, real, log, name):
        self.arg_names, self.log, self.name = real.arg_names, log, name

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            bases = [a.base for a in args if hasattr(a, "block_shape")]
            self.log.append((self.name, "jit", grid, args, kwargs, bases))
            return _FakeCompiled(self.log, self.name)
        return launch


class _FakeCompiled:
    """A compiled kernel: its launcher (grid, stream, function handle, metadata, launch metadata and the two hooks,
    then the arguments), function handle and metadata."""

    function, packed_metadata = "function", "metadata"

    def __init__(self, log, name):
        self.log, self.name = log, name

    def run(self, gx, gy, gz, stream, function, metadata, launch_metadata, enter_hook, exit_hook, *args):
        assert (function, metadata, launch_metadata, enter_hook, exit_hook) == ("function", "metadata", None, None, None)
        bases = [a.base for a in args if hasattr(a, "block_shape")]
        self.log.append((self.name, "compiled", (gx, gy, gz), args, {"stream": stream}, bases))


def _gluon_on_a_pretend_h200(tmp_dir, monkeypatch, capability=9, engine="gluon", **knobs):
    module = render({"ENGINE": engine, **knobs}, tmp_dir)
    module._PLANS.clear()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (capability, 0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": 5})())
    monkeypatch.setattr(module, "_sm_count", lambda index: 132)
    log = []
    for fn, name in (("_mla_paged_ws", "ws"), ("_mla_paged_pair", "pair")):  # a render keeps those its knobs reach
        if hasattr(module, fn):
            monkeypatch.setattr(module, fn, _FakeJIT(getattr(module, fn), log, name))
    monkeypatch.setattr(module, "_mla_paged_merge", _FakeJIT(module._mla_paged_merge, log, "merge"))
    monkeypatch.setattr(module, "_mla_paged_fwd", _FakeJIT(module._mla_paged_fwd, log, "triton"))
    if hasattr(module, "_mla_paged_combine"):
        monkeypatch.setattr(module, "_mla_paged_combine", _FakeJIT(module._mla_paged_combine, log, "combine"))
    return module, log


def _fake_cuda_inputs(case, seed):
    x = MLA_PAGED.make_inputs(case, device="cpu", seed=seed)
    return {k: torch.Tensor._make_subclass(_FakeCuda, v) if isinstance(v, torch.Tensor) else v for k, v in x.items()}


def test_gluon_engine_plan_descriptors_and_direct_launches(tmp_dir, monkeypatch):
    """Where it applies, one plan: grid (64-row blocks, SMs / blocks), the merge kernel after it; the four descriptors
    built once and pointed at each call's q and cache only while it launches; the second call launches the first
    call's compiled kernels with every constexpr in signature order; misaligned lengths go through the JIT again."""
    module, log = _gluon_on_a_pretend_h200(tmp_dir, monkeypatch)
    name = "ws"
    case = {"B": 3, "Sq": 2, "H": 64, "lengths": [300, 64, 129]}
    first, second = _fake_cuda_inputs(case, 0), _fake_cuda_inputs(case, 1)
    module.kernel(**first)
    plan = next(iter(module._PLANS.values()))
    assert plan["engine"] == "gluon" and plan["grid"] == (2, 66, 1) and plan["merge_grid"][2] == 3
    assert [(fn, how) for fn, how, *_ in log] == [(name, "jit"), ("merge", "jit")]
    _, _, grid, args, kwargs, bases = log[0]
    assert grid == plan["grid"] and kwargs == {**plan["constexprs"], "num_warps": 4}
    assert [b is first["q"] for b in bases[:2]] == [True, True] and [b is first["kv_cache"] for b in bases[2:]] == [True, True]
    assert [d.block_shape for d in plan["descs"]] == [[64, 256], [64, 64], [64, 256], [64, 64]]
    assert all(d.base is None for d in plan["descs"])  # no caller's tensor held between calls
    assert log[1][4]["PDL"] == 0 and "launch_pdl" not in log[1][4]  # a plain launch (gluon_ws.py says why)
    descs = plan["descs"]
    module.kernel(**second)
    assert len(module._PLANS) == 1 and plan["descs"] is descs
    assert [(fn, how) for fn, how, *_ in log[2:]] == [(name, "compiled"), ("merge", "compiled")]
    _, _, grid, args, kwargs, bases = log[2]
    names = plan["gluon_fn"].arg_names
    assert len(args) == len(names) and list(args[len(names) - len(plan["constexprs"]):]) == list(plan["constexprs"].values())
    assert bases[0] is second["q"] and bases[2] is second["kv_cache"] and kwargs == {"stream": 5}
    assert all(type(a) is int for a in args[4:11])  # table, lengths, o, lse and the scratch by address
    third = _fake_cuda_inputs(case, 2)
    third["cache_seqlens"] = torch.Tensor._make_subclass(_FakeCuda, torch.cat([torch.zeros(1, dtype=torch.int32), third["cache_seqlens"]])[1:])
    module.kernel(**third)
    assert [(fn, how) for fn, how, *_ in log[4:]] == [(name, "jit"), ("merge", "jit")]


@pytest.mark.parametrize("rows", [4, 8])
def test_merge_rows_launches_the_combine_on_the_lengths(tmp_dir, monkeypatch, rows):
    """MERGE_ROWS where the batch's rows fill the GPU: the merge kernel is the combine, grid (sequences, row groups) of
    a warp a row, handed the lengths (not the main kernel's record) and the main kernel's schedule (OVERHEAD, parts,
    the PDL it is launched with); the direct launch passes the same values by address. A batch of fewer rows keeps the
    row-per-program merge kernel."""
    module, log = _gluon_on_a_pretend_h200(tmp_dir, monkeypatch, MERGE_ROWS=rows, GLUON_PDL=1, OVERHEAD=4)
    case = {"B": 9, "Sq": 1, "H": 64, "lengths": [300, 64, 129, 1, 4000, 77, 900, 65, 2048]}  # 576 rows
    first, second = _fake_cuda_inputs(case, 0), _fake_cuda_inputs(case, 1)
    module.kernel(**first)
    module.kernel(**second)
    plan = next(iter(module._PLANS.values()))
    assert [(fn, how) for fn, how, *_ in log] == [("ws", "jit"), ("combine", "jit"), ("ws", "compiled"), ("combine", "compiled")]
    (_, _, grid, jit_args, kwargs, _), (_, _, direct_grid, direct_args, _, _) = log[1], log[3]
    assert grid == direct_grid == (9, 64 // rows, 1) == plan["merge_grid"]
    assert kwargs == {"OVH": 4, "B_P2": 16, "ROWS": rows, "DN": 512, "PDL": 1, "num_warps": rows, "num_stages": 2, "launch_pdl": True}
    names = module._mla_paged_combine.arg_names
    jit = dict(zip(names, jit_args))
    assert jit["lens"] is first["cache_seqlens"] and (jit["Sq"], jit["H"], jit["B"], jit["n_parts"]) == (1, 64, 9, plan["grid"][1])
    assert jit["capacity"] == first["block_table"].shape[1] * 64
    direct = dict(zip(names, direct_args))
    assert direct["lens"] == second["cache_seqlens"].data_ptr() and direct_args[len(names) - 5:] == (4, 16, rows, 512, 1)
    log.clear()
    module.kernel(**_fake_cuda_inputs({"B": 2, "Sq": 2, "H": 64, "lengths": [3000, 64]}, 2))  # 256 rows
    assert [fn for fn, *_ in log] == ["ws", "merge"]


def test_gluon_engine_with_descriptors_made_on_the_device(tmp_dir, monkeypatch):
    """TMA_DESC "device": the launches get q and the cache where the descriptors were (tensors through the JIT,
    addresses to the compiled kernel), the row counts the kernel makes them with, and Triton's allocator is set for the global scratch they are written to; no host
    descriptor is made."""
    module = render({"ENGINE": "gluon", "TMA_DESC": "device"}, tmp_dir)
    module._PLANS.clear()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": 5})())
    monkeypatch.setattr(module, "_sm_count", lambda index: 132)
    allocators = []
    monkeypatch.setattr(module.triton, "set_allocator", allocators.append)
    log = []
    monkeypatch.setattr(module, "_mla_paged_ws", _FakeJIT(module._mla_paged_ws, log, "ws"))
    monkeypatch.setattr(module, "_mla_paged_merge", _FakeJIT(module._mla_paged_merge, log, "merge"))
    case = {"B": 3, "Sq": 2, "H": 64, "lengths": [300, 64, 129]}
    first, second = _fake_cuda_inputs(case, 0), _fake_cuda_inputs(case, 1)
    module.kernel(**first)
    module.kernel(**second)
    plan = next(iter(module._PLANS.values()))
    assert plan["constexprs"]["DEVICE_DESC"] is True and plan["descs"] == () and allocators == [module._descriptor_scratch] * 2
    assert [(fn, how) for fn, how, *_ in log] == [("ws", "jit"), ("merge", "jit"), ("ws", "compiled"), ("merge", "compiled")]
    (_, _, _, jit_args, _, _), (_, _, _, direct_args, _, _) = log[0], log[2]
    assert jit_args[0] is jit_args[1] is first["q"] and jit_args[2] is jit_args[3] is first["kv_cache"]
    assert direct_args[:4] == (second["q"].data_ptr(),) * 2 + (second["kv_cache"].data_ptr(),) * 2  # addresses: no data_ptr call left to the launcher
    for args, inputs in ((jit_args, first), (direct_args, second)):
        names = module._mla_paged_ws.arg_names
        assert args[names.index("n_q_rows")] == 3 * 2 * 64 and args[names.index("n_kv_rows")] == inputs["kv_cache"].shape[0] * 64


def test_direct_launches_pass_addresses_and_plans_are_bounded(tmp_dir, monkeypatch):
    """The Triton tiles launched directly get every pointer as an integer (this call's inputs and outputs, the plan's
    scratch); a new shape past PLANS_KEPT drops the oldest plan, so a cache growing a token a call keeps no more."""
    module, log = _gluon_on_a_pretend_h200(tmp_dir, monkeypatch, engine="triton")
    case = {"B": 2, "Sq": 1, "H": 64, "lengths": [100, 64]}
    first, second = _fake_cuda_inputs(case, 0), _fake_cuda_inputs(case, 1)
    module.kernel(**first)
    module.kernel(**second)
    plan = next(iter(module._PLANS.values()))
    (_, how, _, args, _, _), scratch = log[2], next(iter(plan["scratch"].values()))
    assert how == "compiled" and args[:4] == tuple(second[k].data_ptr() for k in ("q", "kv_cache", "block_table", "cache_seqlens"))
    assert all(type(a) is int for a in args[:10]) and args[6:10] == tuple(t.data_ptr() for t in scratch[0]) == scratch[1]
    for extra in range(module.PLANS_KEPT + 2):
        module.kernel(**_fake_cuda_inputs({"B": 1, "Sq": 1, "H": 64, "lengths": [64 * (extra + 1)]}, extra))  # a page more each
    assert len(module._PLANS) == module.PLANS_KEPT and plan not in module._PLANS.values()


@pytest.mark.parametrize("pair, case, kernel", [
    (1, {"B": 32, "Sq": 4, "H": 64, "Skv": 128}, "pair"),  # 128 programs of one piece each: FlashMLA's schedule
    (1, {"B": 16, "Sq": 4, "H": 64, "Skv": 128}, "ws"),  # 64 programs: the parts split each sequence
    (1, {"B": 64, "Sq": 1, "H": 64, "Skv": 128}, "ws"),  # one row block a sequence
    (1, {"B": 1, "Sq": 4, "H": 64, "Skv": 128}, "ws"),
    (2, {"B": 1, "Sq": 4, "H": 64, "Skv": 128}, "pair"),  # PAIR 2: always (the GPU tests' setting)
    (0, {"B": 32, "Sq": 4, "H": 64, "Skv": 128}, "ws"),
])
def test_pair_schedule_where_every_program_has_one_long_piece(tmp_dir, monkeypatch, pair, case, kernel):
    """PAIR 1 takes FlashMLA's schedule (gluon_pair.py) only where a sequence has at least PAIR_FROM_ROWS rows and its
    row blocks over the batch fill half the SMs or more (B32 Sq4 on the H200: 128 programs, one whole sequence
    each), where it was measured faster; elsewhere the loader form. Same arguments and grid either way."""
    module, log = _gluon_on_a_pretend_h200(tmp_dir, monkeypatch, PAIR=pair)
    module.kernel(**_fake_cuda_inputs(case, 0))
    plan = next(iter(module._PLANS.values()))
    assert log[0][0] == kernel and plan["engine"] == "gluon"
    assert plan["grid"] == (case["Sq"] * 64 // 64, 132 // case["Sq"], 1)
    # a render keeps only the kernels its knobs can reach; PAIR 1 chooses by shape, so it keeps both, called alike
    assert hasattr(module, "_mla_paged_ws") == (pair != 2) and hasattr(module, "_mla_paged_pair") == (pair != 0)
    if pair == 1:
        assert module._mla_paged_pair.arg_names == module._mla_paged_ws.arg_names


@pytest.mark.parametrize("capability, case", [
    (8, {"B": 2, "Sq": 1, "H": 64, "lengths": [100, 64]}),  # not Hopper
    (9, {"B": 2, "Sq": 1, "H": 16, "lengths": [100, 64]}),  # 16 rows a sequence: not a 64-row block
    (9, {"B": 2, "Sq": 1, "H": 64, "page_size": 16, "lengths": [100, 64]}),  # pages of 16 tokens
    (9, {"B": 1, "Sq": 1, "H": 64, "lengths": [100]}),  # CONFIG "auto"'s narrow regime: the Triton narrow tiles
])
def test_gluon_engine_leaves_what_it_cannot_take_to_triton(tmp_dir, monkeypatch, capability, case):
    module, log = _gluon_on_a_pretend_h200(tmp_dir, monkeypatch, capability)
    module.kernel(**_fake_cuda_inputs(case, 0))
    assert next(iter(module._PLANS.values()))["engine"] == "triton" and log[0][0] == "triton"


# ---- sm_90 ----------------------------------------------------------------------------------------
_SM90_SCRIPT = r"""
import importlib.util, json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

spec = importlib.util.spec_from_file_location("mla_paged_sm90", sys.argv[1])
fam = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fam)
PTR = {"q": "*bf16", "kv": "*bf16", "table": "*i32", "lens": "*i32", "o": "*bf16", "lse": "*fp32", "part_o": "*fp32",
       "part_lse": "*fp32", "counters": "*i32", "meta": "*i32"}
ALIGNED = {"stride_qb", "stride_qs", "stride_qh", "stride_kp", "stride_ks", "n_rows"}  # multiples of 16 at the headline


def build(fn, constexprs, warps, stages):
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in PTR:
            sig[name], attrs[(i,)] = PTR[name], [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32" if name == "qk_scale" else "i32"
            if name in ALIGNED:
                attrs[(i,)] = [["tt.divisibility", 16]]
    c = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps, "num_stages": stages})
    ir = c.asm["ttgir"]
    loops = ir.split("scf.for")[1:]
    buffers = [int(n) for n in re.findall(r"local_alloc : \(\) -> !ttg.memdesc<(\d+)x64x256xbf16", ir)]
    return {"shared": c.metadata.shared, "wgmma": "wgmma" in c.asm["ptx"], "kv_buffers": min(buffers) if buffers else 0,
            "tma": ir.count("ttng.async_tma_copy_global_to_local")}


out = {}
for regime, merge in (("narrow", 2), ("wide", 1)):  # each regime with one of the merges (a compile costs ~15 s)
        t = fam.REGIMES[regime]
        ce = dict(BLOCK_H=t["BLOCK_H"], BLOCK_N=t["BLOCK_N"], PAGE=64, KEYS_AS_M=t["KEYS_AS_M"], VALUES_AS_M=t["VALUES_AS_M"],
                  QK_SPLIT=t["QK_SPLIT"] and t["num_warps"] == 8, TMA=t["KV_LOAD"] == "tma", MERGE=merge, OVERHEAD=5, B_P2=128,
                  PAGE_CHUNK=fam.PAGE_CHUNK, MERGE_W=max(16, min(512, fam.FUSED_MERGE_ELEMS // t["BLOCK_H"])), DN=512, DR=64,
                  PDL=1 if merge == 1 else 0)
        out[f"{regime}-merge{merge}"] = build(fam._mla_paged_fwd, ce, t["num_warps"], t["num_stages"])
out["merge-kernel"] = build(fam._mla_paged_merge, dict(BLOCK_V=64, CHUNK=64, DN=512, PDL=1), fam.MERGE_WARPS, 2)
print(json.dumps(out))
"""


def _family_file(tmp_path):
    """The family joined into one file (its folder as a candidate holds it), for a child process to import."""
    path = tmp_path / "mla_paged_family.py"
    path.write_text(FAMILY.source)
    return str(path)


def test_compiles_for_hopper(tmp_path):
    """Both regimes of CONFIG "auto" (one with each merge) compiled for sm_90 (no GPU): wgmma, within
    the shared memory of one CTA, and the KV tiles multi-buffered (a page number read from the
    table inside a tile loop would hold the pipeliner to one buffer); the wide regime by TMA."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    import json

    result = json.loads(compile_in_child(_SM90_SCRIPT, _family_file(tmp_path)).strip().splitlines()[-1])
    merge = result.pop("merge-kernel")
    assert merge["shared"] <= 232448
    for name, info in result.items():
        assert info["wgmma"], name
        assert info["shared"] <= 232448, (name, info["shared"])
        assert info["kv_buffers"] >= 2, (name, info)
        assert (info["tma"] > 0) == name.startswith("wide"), (name, info)


# what the Gluon compile scripts share: the rendered family and tools/compare_kda_ptx.py (argv 1 and 2) loaded, and
# ``ptxas_notes``, ptxas's -v report of a PTX text for sm_90a
_SM90_PRELUDE = r"""
import importlib.util, json, subprocess, sys, tempfile, types
from pathlib import Path
import torch, triton

def load(path):
    spec = importlib.util.spec_from_file_location(Path(path).stem + "_sm90", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

def ptxas_notes(ptx):
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "k.ptx").write_text(ptx)
        return subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(Path(tmp) / "k.ptx"), "-o", str(Path(tmp) / "k.cubin")],
                              capture_output=True, text=True).stderr

fam, tool = load(sys.argv[1]), load(sys.argv[2])
"""

_GLUON_SM90_SCRIPT = _SM90_PRELUDE + r"""
fn, Sq, device_desc, grid_merge = getattr(fam, sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "device", sys.argv[6] == "grid"
B, H, pages = 64, 64, 8192
q = torch.empty(B, Sq, H, 576, dtype=torch.bfloat16)
kv = torch.empty(pages, 64, 576, dtype=torch.bfloat16)
q_n, q_r, kv_n, kv_r = (q, q, kv, kv) if device_desc else fam._gluon_descriptors(q, kv)
i32 = lambda n: torch.empty(n, dtype=torch.int32)
args = dict(q_n=q_n, q_r=q_r, kv_n=kv_n, kv_r=kv_r, table=i32(B * 128), lens=i32(B), o=torch.empty(16, dtype=torch.bfloat16),
            lse=torch.empty(16), part_o=torch.empty(16), part_lse=torch.empty(16), meta=i32(16), sync=i32(2), stride_tb=128, B=B,
            Sq=Sq, H=H, capacity=8192, qk_scale=0.1, n_q_rows=B * Sq * H, n_kv_rows=pages * 64, PAGE=64, OVH=5, B_P2=64, DN=512,
            DEVICE_DESC=device_desc, GRID_MERGE=grid_merge, PDL=not grid_merge)
options = dict(num_warps=4, **({"launch_cooperative_grid": True} if grid_merge else {}))
kernel, _ = tool.compile_launch(types.SimpleNamespace(fn=fn, args=args, options=options))
ptx = kernel.asm["ptx"]
print(json.dumps({"ptx": ptx, "notes": ptxas_notes(ptx), "shared": kernel.metadata.shared, "cooperative": kernel.metadata.launch_cooperative_grid}))
"""


@pytest.mark.parametrize("sq, merge", [(4, "kernel"), (4, "grid")])
def test_pair_engine_compiles_for_hopper(tmp_path, sq, merge):
    """PAIR's kernel (``_mla_paged_pair``) compiled for sm_90 (no GPU): two warpgroups and no loader warp (the
    worker's budget 240, none of 40); per warpgroup the score product of its first tile and of the next in each of the
    two pair loops (pairs without the mask's test, then those that may need it: three 36-step chains of m64n64k16),
    and its half of P V six times (its own P from registers, the other's from shared memory, in both loops and after
    them); no product serialised by ptxas, no spill of the operands' descriptors (held across the loop, 36 of them
    spilled ~800 bytes), the hand-overs on named barriers, and every rescale of O one a warp can skip."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    import json
    import re

    tool = Path(__file__).resolve().parents[1] / "tools" / "compare_kda_ptx.py"
    out = json.loads(compile_in_child(_GLUON_SM90_SCRIPT, _family_file(tmp_path), str(tool), "_mla_paged_pair", str(sq), "host",
                                      merge, cache_dir=tmp_path).strip().splitlines()[-1])
    ptx, notes = out["ptx"], out["notes"]
    assert out["cooperative"] == (merge == "grid")
    assert "240" in set(re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+);", ptx))
    assert "40" not in set(re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+);", ptx))
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16") == 2 * 3 * 36
    a_operands = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16\s*\{[^}]*\},\s*(\{|%rd)", ptx)
    assert (a_operands.count("{"), a_operands.count("%rd")) == (24, 24), a_operands
    assert not re.search(r"C75\d\d", notes), notes
    assert 200_000 < out["shared"] <= 232448 and "Used " in notes
    assert int(re.search(r"(\d+) bytes spill stores", notes).group(1)) <= 64, notes
    # the hand-overs (each max, each P): named barriers 8-11 of both warpgroups' 256 threads, each published by one
    # warpgroup (bar.arrive) and awaited by the other (bar.sync), not mbarriers behind a partition barrier
    handed = set(re.findall(r"bar\.arrive\s+(\d+), 256;", ptx))
    assert handed == set(re.findall(r"bar\.sync\s+(\d+), 256;", ptx)) == {"8", "9", "10", "11"}, handed
    # three rescales of O a pair (warpgroup 0's two, warpgroup 1's one) in each of the three places a pair runs: a vote
    # over the warp, then one branch around all of a thread's 128 multiplies
    assert ptx.count("vote.sync.any.pred") == ptx.count("@!p bra.uni SKIP;") == 3 * 3, ptx.count("vote.sync.any.pred")


@pytest.mark.parametrize("fn, sq, desc, merge", [("_mla_paged_ws", 1, "host", "kernel"), ("_mla_paged_ws", 4, "host", "kernel"),
                                                 ("_mla_paged_ws", 4, "device", "kernel"), ("_mla_paged_ws", 4, "host", "grid")])
def test_gluon_engine_compiles_for_hopper(tmp_path, fn, sq, desc, merge):
    """ENGINE "gluon"'s kernel compiled for sm_90 as launched at B64 Sq1 and Sq4 (no GPU): three
    partitions with their register budgets (the warpgroups 232, the loader 40), scores [64 x 64] and P V [64 x 256] on
    wgmma, every tile by TMA, and shared memory within one block's (one program per SM; q's 72 KB and two 72 KB tiles
    fill it). TMA_DESC "device": the four descriptors written by the kernel (tensormap stores and their fence)."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    import json
    import re

    tool = Path(__file__).resolve().parents[1] / "tools" / "compare_kda_ptx.py"
    out = json.loads(compile_in_child(_GLUON_SM90_SCRIPT, _family_file(tmp_path), str(tool), fn, str(sq), desc, merge,
                                      cache_dir=tmp_path).strip().splitlines()[-1])
    ptx, notes = out["ptx"], out["notes"]
    # GRID_MERGE: a cooperative launch, one thread of each warpgroup arriving (acq_rel) and waiting (acquire loads)
    assert out["cooperative"] == (merge == "grid")
    assert ("atom.global.gpu.acq_rel.add" in ptx and "ld.global.gpu.acquire" in ptx) == (merge == "grid")
    assert ("griddepcontrol.launch_dependents" in ptx) == (merge == "kernel")  # GLUON_PDL: the merge kernel let go early
    assert ("tensormap.replace" in ptx or "fence.proxy.tensormap" in ptx) == (desc == "device")
    assert {"232", "40"} <= set(re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+);", ptx))
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16") > 0
    # P V: warpgroup 0's half takes P from registers (A as four registers), warpgroup 1's from shared memory (A as a
    # descriptor), four k-steps of 16 keys each, with no product serialised by ptxas (C7513)
    a_operands = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16\s*\{[^}]*\},\s*(\{|%rd)", ptx)
    assert (a_operands.count("{"), a_operands.count("%rd")) == (4, 4), a_operands
    assert "C7513" not in notes, notes
    assert ptx.count("cp.async.bulk.tensor.2d.shared::cluster.global") >= 6  # q's three boxes, each tile's three
    assert 200_000 < out["shared"] <= 232448 and "C7515" not in notes and "Used " in notes
    # a partial tile's rows are zeroed eight at a time: the whole [64, 256] tile at once held 128 values a thread in
    # warpgroup 0's tile loop, which spilled ~43 loads and stores a tile (228 bytes in all); what is left (at most a
    # few words, outside the tile loops) is the per-piece code's
    assert int(re.search(r"(\d+) bytes spill stores", notes).group(1)) <= (64 if merge == "kernel" else 320), notes


_COMBINE_SM90_SCRIPT = _SM90_PRELUDE + r"""
rows = int(sys.argv[3])
i32 = lambda n: torch.empty(n, dtype=torch.int32)
args = dict(part_o=torch.empty(16), part_lse=torch.empty(16), o=torch.empty(16, dtype=torch.bfloat16), lse=torch.empty(16),
            lens=i32(128), Sq=1, H=64, B=128, capacity=32768, n_parts=132, OVH=4, B_P2=128, ROWS=rows, DN=512, PDL=1)
kernel, _ = tool.compile_launch(types.SimpleNamespace(fn=fam._mla_paged_combine, args=args, options=dict(num_warps=rows)))
ptx = kernel.asm["ptx"]
print(json.dumps({"ptx": ptx, "notes": ptxas_notes(ptx), "shared": kernel.metadata.shared}))
"""


@pytest.mark.parametrize("rows", [4, 8])
def test_the_combine_compiles_for_hopper(tmp_path, rows):
    """MERGE_ROWS's merge kernel compiled for sm_90 as launched at B128 (no GPU): no reduction crosses a warp (no shared
    memory, no barrier: every warp holds the whole batch's lengths and its own row), the wait for the main kernel
    behind the branch that ends a whole sequence's program (which only the first program takes, so that the kernel
    never ends before the main kernel), each partial row read 16 bytes a lane, and few enough
    registers (no spill) that a wave of programs covers B128's split rows."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    import json
    import re

    tool = Path(__file__).resolve().parents[1] / "tools" / "compare_kda_ptx.py"
    module = render({"ENGINE": "gluon", "MERGE_ROWS": rows}, tmp_path)
    out = json.loads(compile_in_child(_COMBINE_SM90_SCRIPT, module.__file__, str(tool), str(rows), cache_dir=tmp_path)
                     .strip().splitlines()[-1])
    ptx, notes = out["ptx"], out["notes"]
    assert out["shared"] == 0 and "bar.sync" not in ptx and "st.shared" not in ptx
    body = ptx[ptx.index("{"):]
    assert body.index("bra") < body.index("griddepcontrol.wait")  # whole sequences leave before the wait
    assert ptx.count("griddepcontrol.wait") == 2 and "ld.global.v4.b32" in ptx  # a split sequence's, the first program's
    assert int(re.search(r"Used (\d+) registers", notes).group(1)) <= 64 and "0 bytes spill stores" in notes, notes
