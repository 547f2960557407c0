"""The chunked KDA family (kernels/families/kda_chunked.py) under the Triton CPU interpreter.

Checked against the problem's float64 recurrence with the problem's own compare (relative RMS,
NaN/Inf fail): hypothesis shapes, edge shapes (T=1, T not a multiple of the chunk, K != V,
K or V = 256), hostile gates (whole-block -1000 resets, long strong-decay runs, g = 0,
per-channel mixtures), every SPACE value and a seeded sample of whole knob combinations, each
rendered the way the search agent renders them (the KNOBS block replaced, the file imported).

The interpreter computes tf32 products in full float32; ``test_tf32_precision_emulated`` rounds
their operands as the tensor cores do, and tools/dev_kda_chunked.py checks on the GPU.
"""

from __future__ import annotations

import contextlib
import json
import math
import random

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.errors import InterpreterError
from family_modules import compile_in_child, import_rendered
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_kopt.families import load_family
from pytest_kopt.gate import load_module
from pytest_kopt.problems import get_problem
from pytest_kopt import KERNELS_DIR

PROBLEM = get_problem("kda")
FAMILY_PATH = KERNELS_DIR / "families" / "kda_chunked.py"
FAMILY = load_family(FAMILY_PATH)


def render(knobs: dict, tmp_path):
    """The family with its KNOBS block replaced, imported as a candidate module."""
    return import_rendered(FAMILY, knobs, tmp_path)


@pytest.fixture(scope="module")
def family():
    return load_module(FAMILY_PATH)


def check(kernel, x, case):
    want = PROBLEM.reference(**x)
    got = kernel(**x)
    errors = PROBLEM.compare(got, want)
    assert all(e.ok for e in errors), [e.reason for e in errors if not e.ok]
    o, final = got
    assert o.dtype == x["v"].dtype and o.shape == x["v"].shape
    if case["output_final_state"]:
        assert final.dtype == torch.float32
    else:
        assert final is None
    return errors


def inputs(case, seed, dtype=torch.bfloat16):
    return PROBLEM.make_inputs(case, device="cpu", seed=seed, dtype=dtype)


def test_family_block_and_space():
    assert set(FAMILY.knobs) == set(FAMILY.space)
    assert all(FAMILY.knobs[k] in v for k, v in FAMILY.space.items()), "defaults lie inside SPACE"


def test_default_matches_reference_on_hypothesis_cases(family):
    @settings(max_examples=8, deadline=None)
    @given(case=PROBLEM.case_strategy("cpu"), seed=st.integers(0, 2**31 - 1))
    def run(case, seed):
        check(family.kernel, inputs(case, seed), case)

    run()


EDGE_CASES = [
    {"B": 1, "T": 1, "H": 1, "K": 16, "V": 16, "initial_state": True, "output_final_state": True},
    {"B": 1, "T": 1, "H": 2, "K": 64, "V": 32, "initial_state": False, "output_final_state": True},
    {"B": 2, "T": 70, "H": 1, "K": 32, "V": 64, "initial_state": True, "output_final_state": True},  # 64 + 6
    {"B": 1, "T": 65, "H": 2, "K": 64, "V": 16, "initial_state": False, "output_final_state": False},
    {"B": 1, "T": 9, "H": 1, "K": 256, "V": 32, "initial_state": True, "output_final_state": True},
    {"B": 1, "T": 9, "H": 1, "K": 16, "V": 256, "initial_state": True, "output_final_state": True, "scale": 0.5},
    {"B": 3, "T": 17, "H": 1, "K": 128, "V": 16, "initial_state": False, "output_final_state": True},
]


@pytest.mark.parametrize("case", EDGE_CASES, ids=PROBLEM.describe)
def test_edge_shapes(family, case):
    check(family.kernel, inputs(case, seed=11), case)


def test_float32_inputs(family):
    case = {"B": 1, "T": 40, "H": 2, "K": 32, "V": 32, "initial_state": True, "output_final_state": True}
    check(family.kernel, inputs(case, seed=3, dtype=torch.float32), case)


def hostile_gates(kind: str, B: int, T: int, H: int, K: int, gen: torch.Generator) -> torch.Tensor:
    """Gates a chunked kernel with a whole-chunk factorisation exp(G_i) * exp(-G_j) gets wrong."""
    mild = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, generator=gen) + 3.0)
    if kind == "resets":  # whole-head resets at sub-chunk starts, inside blocks and at the end
        g = mild.clone()
        for t in (0, 5, 16, 31, 32, 47, T - 1):
            if t < T:
                g[:, t] = -1000.0
        return g
    if kind == "strong_run":  # -10 per step for 40 steps: spans of 150+ inside a 16-block
        g = mild.clone()
        g[:, 8:48] = -10.0 + 0.1 * torch.randn(B, min(T, 48) - 8, H, K, generator=gen)
        return g
    if kind == "zero":  # no decay at all: the delta rule alone
        return torch.zeros(B, T, H, K)
    if kind == "channels":  # each channel its own regime, from -1e-6 to -50 per step, plus -1000s
        scale = torch.logspace(-6, math.log10(50.0), K)
        g = -scale * torch.rand(B, T, H, K, generator=gen)
        g[:, ::7, :, ::3] = -1000.0
        return g
    if kind == "huge":  # far past exp's range: exp(g) is exactly 0 in float32
        g = mild.clone()
        g[:, 3:60:4] = -3.0e4
        return g
    raise ValueError(kind)


HOSTILE = ["resets", "strong_run", "zero", "channels", "huge"]


def hostile_inputs(kind: str, case: dict, seed: int):
    x = inputs(case, seed)
    gen = torch.Generator().manual_seed(seed)
    x["g"] = hostile_gates(kind, case["B"], case["T"], case["H"], case["K"], gen)
    return x


@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_gates_default(family, kind):
    case = {"B": 1, "T": 64, "H": 2, "K": 32, "V": 32, "initial_state": True, "output_final_state": True}
    check(family.kernel, hostile_inputs(kind, case, seed=7), case)


@pytest.mark.parametrize("block_prog", ["row", "chunk"])
def test_hostile_gates_every_recentre(tmp_path, block_prog):
    """Each recentre on hostile gates, in both block-row programs (diag "pairwise" left SPACE after
    run 1 -- 40 % slower on the H200 -- but its code still runs: the guard falls back to it per block)."""
    case = {"B": 1, "T": 48, "H": 1, "K": 32, "V": 16, "initial_state": True, "output_final_state": True}
    for kind, recentre in zip(["channels", "strong_run", "resets"], ["start", "end", "midpoint"]):
        module = render({**FAMILY.knobs, "recentre": recentre, "block_prog": block_prog}, tmp_path)
        check(module.kernel, hostile_inputs(kind, case, seed=13), case)


# values that ``_plan`` serves only together with others (the rest at their defaults)
COMPANIONS = {("solve_warps", 4): {"subst": "rows", "BT": 32}, ("solve_warps", 2): {"subst": "rows", "BT": 32},
              ("scan_warps", 1): {"scan_layout": "vk"},
              ("BT", 64): {"solve_warps": 8}, ("subst", "extract"): {"solve_warps": 8},
              ("kd_sum", "rows"): {"diag_floor": 30}, ("scan_overlap", "pdl"): {"scan_engine": "wgmma_ws"},
              ("scan_overlap", "auto"): {"scan_engine": "wgmma_ws"},
              # the Gluon block rows run on a Hopper GPU only: here the Triton rows of the same configuration run
              **{("rows_engine", v): {"kd_sum": "rows", "diag_floor": 30, "inv_dot": "bf16x3"} for v in ("gluon", "gluon8")},
              ("rows_fold", True): {"rows_engine": "gluon", "kd_sum": "rows", "diag_floor": 30, "inv_dot": "bf16x3"},
              **{("rows_solve", v): {"rows_engine": "gluon", "kd_sum": "rows", "diag_floor": 30, "inv_dot": "bf16x3",
                                     "u_store": "bf16"} for v in (True, "auto")},
              **{("solve_mma", v): {"rows_engine": "gluon", "rows_solve": True, "kd_sum": "rows", "diag_floor": 30,
                                    "inv_dot": "bf16x3", "u_store": "bf16"} for v in ("wgmma", "wgmma_st")}}


def test_every_space_value(tmp_path):
    """Each knob value at least once (the others at their defaults, or the companions it needs),
    on a case with two chunks at BT=32, a short last chunk, K != V and the problem's -1000 resets
    and strong runs (diag and recentre are covered on hostile gates above)."""
    case = {"B": 1, "T": 40, "H": 1, "K": 32, "V": 16, "initial_state": True, "output_final_state": True}
    x = inputs(case, seed=21)
    for name, values in FAMILY.space.items():
        for value in values:
            if value == FAMILY.knobs[name] or name in ("diag", "recentre"):
                continue
            module = render({**FAMILY.knobs, **COMPANIONS.get((name, value), {}), name: value}, tmp_path)
            check(module.kernel, x, case)


def test_sampled_knob_combinations(tmp_path, family):
    """Random whole combinations, as the search agent draws them: each is right, or refused by
    ``_plan`` with a ValueError (a combination known wrong on the GPU). The plan depends on the knobs alone, so the
    family's own module finds the refusals (thousands of draws) and only the accepted ones are rendered."""
    rng = random.Random(2024)
    case = {"B": 1, "T": 37, "H": 1, "K": 32, "V": 64, "initial_state": True, "output_final_state": True}
    ran = 0
    while ran < 4:
        knobs = {name: rng.choice(values) for name, values in FAMILY.space.items()}
        try:
            family._plan(case["K"], case["V"], {**family.KNOBS, **knobs})
        except ValueError:
            continue
        module = render(knobs, tmp_path)
        module._plan(case["K"], case["V"], module.KNOBS)
        check(module.kernel, hostile_inputs(HOSTILE[ran % len(HOSTILE)], case, seed=100 + ran), case)
        ran += 1


def test_sampled_combinations_with_rows(tmp_path, family):
    """Version 4's ``subst="rows"`` (diagonal-block inverses computed in the block rows) in random
    whole combinations, on hostile gates: right, or refused by ``_plan`` (found as above, before rendering)."""
    rng = random.Random(404)
    case = {"B": 1, "T": 45, "H": 1, "K": 32, "V": 32, "initial_state": True, "output_final_state": True}
    ran = 0
    while ran < 3:
        knobs = {**{name: rng.choice(values) for name, values in FAMILY.space.items()}, "subst": "rows"}
        try:
            family._plan(case["K"], case["V"], {**family.KNOBS, **knobs})
        except ValueError:
            continue
        module = render(knobs, tmp_path)
        module._plan(case["K"], case["V"], module.KNOBS)
        check(module.kernel, hostile_inputs(HOSTILE[(ran + 1) % len(HOSTILE)], case, seed=200 + ran), case)
        ran += 1


@pytest.mark.parametrize("kind", HOSTILE)
def test_rows_hostile_gates(tmp_path, kind):
    """subst="rows" with its 4-warp solve on every hostile gate kind (the inverses of blocks whose
    Akk is exactly 0 after a -1000 / -3e4 gate, or large with g = 0)."""
    module = render({**FAMILY.knobs, "subst": "rows", "solve_warps": 4}, tmp_path)
    case = {"B": 1, "T": 64, "H": 2, "K": 32, "V": 32, "initial_state": True, "output_final_state": True}
    check(module.kernel, hostile_inputs(kind, case, seed=17), case)


@pytest.mark.parametrize("BT", [32, 64])
def test_rows_stores_the_diagonal_inverses(family, BT):
    """With subst="rows" the Akk scratch holds, in each diagonal BC x BC block, (I + that block of
    Akk)^-1 as the "extract" run's scratch has it (float64 inverse), the rest of Akk unchanged; and
    the WY factors and read-out tiles agree with "extract" to float32 rounding."""
    case = {"B": 1, "T": 2 * BT - 7, "H": 1, "K": 32, "V": 16, "initial_state": False, "output_final_state": True}
    x = hostile_inputs("channels", case, seed=31)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, True)
    base = {**family.KNOBS, "BT": BT, "solve_warps": 8}  # the 4-warp solve only with "rows" at BT 32
    ref, rows = {}, {}
    o_ref, _ = family.kda_chunked(*args, {**base, "subst": "extract"}, ref)
    o_rows, _ = family.kda_chunked(*args, {**base, "subst": "rows"}, rows)
    BC = base["BC"]
    akk_ref = ref["akk"][0].double().reshape(-1, BT, BT)  # [NT, BT, BT]
    akk_rows = rows["akk"][0].double().reshape(-1, BT, BT)
    lower = (torch.arange(BT)[:, None] // BC) > (torch.arange(BT)[None, :] // BC)
    assert torch.equal(akk_rows[:, lower], akk_ref[:, lower])
    for b in range(BT // BC):
        blk = slice(b * BC, (b + 1) * BC)
        want = torch.linalg.inv(torch.eye(BC, dtype=torch.float64) + akk_ref[:, blk, blk])
        got = akk_rows[:, blk, blk]
        assert (got - want).abs().max() <= 1e-5 * max(1.0, want.abs().max().item()), (got - want).abs().max()
    for name in ("u", "au"):
        assert torch.allclose(rows[name], ref[name], rtol=1e-4, atol=1e-5), name
    for name in ("w", "qd", "kd"):  # bf16: at most a last-bit rounding flip here and there
        diff = (rows[name].float() - ref[name].float()).abs()
        assert diff.max() <= 2 ** -7 * ref[name].float().abs().max(), name
    assert (o_rows.float() - o_ref.float()).abs().max() <= 2 ** -6 * o_ref.float().abs().max()


def tf32_rounding(monkeypatch):
    """Make the interpreter's tf32 products round their float32 operands as the tensor cores do
    (10 explicit mantissa bits; truncated, the worse of truncation and round-to-nearest)."""
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    original = builder.create_dot
    hits = []

    def to_tf32(x):
        return (np.ascontiguousarray(x, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        name = str(input_precision).upper()
        if "TF32" in name and "X3" not in name and a.data.dtype == np.float32 and b.data.dtype == np.float32:
            hits.append(1)
            return interpreter.TensorHandle(np.matmul(to_tf32(a.data), to_tf32(b.data)) + d.data, d.dtype.scalar)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    monkeypatch.setattr(builder, "create_dot", create_dot)
    return hits


@pytest.mark.parametrize("subst,block_prog", [("extract", "row"), ("rows", "row"), ("rows", "chunk")])
def test_tf32_precision_emulated(tmp_path, monkeypatch, subst, block_prog):
    """prec="tf32" with the GPU's tf32 operand rounding emulated: still well inside 5e-3 (the
    interpreter alone computes tf32 products in full float32 and could not see the loss)."""
    hits = tf32_rounding(monkeypatch)
    solve_warps = 4 if subst == "rows" else 8
    module = render({**FAMILY.knobs, "prec": "tf32", "subst": subst, "block_prog": block_prog,
                     "solve_warps": solve_warps}, tmp_path)
    case = {"B": 1, "T": 70, "H": 2, "K": 64, "V": 64, "initial_state": True, "output_final_state": True}
    for x in (inputs(case, seed=10), hostile_inputs("channels", case, seed=10)):
        errors = check(module.kernel, x, case)
        assert all(e.rel_rms < 4e-3 for e in errors), [(e.name, e.rel_rms) for e in errors]
    assert hits, "no tf32 product was emulated"


def test_unservable_shapes_and_knobs_raise_value_error(family):
    x = inputs({"B": 1, "T": 4, "H": 1, "K": 48, "V": 16, "initial_state": False, "output_final_state": False}, seed=0)
    with pytest.raises(ValueError, match="K=48"):
        family.kernel(**x)
    y = inputs({"B": 1, "T": 4, "H": 1, "K": 16, "V": 16, "initial_state": False, "output_final_state": False}, seed=0)
    args = (y["q"], y["k"], y["v"], y["g"], y["beta"], None, None, False)
    with pytest.raises(ValueError, match="BC"):
        family.kda_chunked(*args, {**family.KNOBS, "BC": 8})
    with pytest.raises(ValueError, match="diag"):
        family.kda_chunked(*args, {**family.KNOBS, "diag": "fast"})
    with pytest.raises(ValueError, match="H200"):
        family.kda_chunked(*args, {**family.KNOBS, "solve_warps": 4, "subst": "extract"})
    with pytest.raises(ValueError, match="BT=32"):  # the 4-warp solve only as version 4 at BT 32
        family.kda_chunked(*args, {**family.KNOBS, "solve_warps": 4, "subst": "rows", "BT": 64})
    with pytest.raises(ValueError, match="spill"):  # one- and two-warp scans where they spill
        family.kda_chunked(*args, {**family.KNOBS, "scan_warps": 2, "BT": 64, "solve_warps": 8})
    with pytest.raises(ValueError, match="vk"):
        family.kda_chunked(*args, {**family.KNOBS, "scan_warps": 1, "scan_layout": "kv"})
    with pytest.raises(ValueError, match="chunk"):  # one program per chunk only where it does not spill
        family.kda_chunked(*args, {**family.KNOBS, "block_prog": "chunk", "BT": 64, "solve_warps": 8})
    with pytest.raises(ValueError, match="chunk"):
        family.kda_chunked(*args, {**family.KNOBS, "block_prog": "chunk", "BK": 64})
    with pytest.raises(ValueError, match="chunk"):
        family.kda_chunked(*args, {**family.KNOBS, "block_prog": "chunk", "block_warps": 2})
    # version 6's fused preparation: only BT 32, subst "rows", block_prog "row", 4 warps
    for over in ({"BT": 64, "solve_warps": 8}, {"block_warps": 2}, {"block_warps": 8},
                 {"subst": "extract", "solve_warps": 8}, {"block_prog": "chunk"}):
        with pytest.raises(ValueError, match="fuse_prep"):
            family.kda_chunked(*args, {**family.KNOBS, "fuse_prep": True, **over})


COMPILE_FOR_HOPPER = """
import importlib.util, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

spec = importlib.util.spec_from_file_location("kda_chunked", sys.argv[1])
fam = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fam)
K = V = 128
kn = {**fam.KNOBS, **json.loads(sys.argv[2])}
plan = fam._plan(K, V, kn)
P, B16 = "*fp32", "*bf16"

def build(fn, types, constexprs, warps, stages):
    sig = {n: ("constexpr" if n in constexprs else types.get(n, "i32")) for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if sig[n] not in ("constexpr", "fp32")}
    c = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    assert c.metadata.shared <= 227 * 1024, (fn.__name__, c.metadata.shared)
    return c

AU = B16 if kn["au"] == "bf16" else P
U = B16 if plan["u_bf16"] else P
prep = {"q_ptr": B16, "k_ptr": B16, "v_ptr": B16, "g_ptr": P, "beta_ptr": B16, "w_ptr": B16, "u_ptr": U,
        "kd_ptr": B16, "qd_ptr": B16, "aqk_ptr": B16, "akk_ptr": P, "gl_ptr": P, "au_ptr": AU, "gs_ptr": P, "gt_ptr": P, "flag_ptr": "*i32",
        "scale": "fp32"}
for stage in ([0] if kn["fuse_prep"] else [1, 2]):
    c = build(fam._kda_prep_kernel, prep, dict(K=K, V=V, BT=plan["BT"], BC=plan["BC"], BK=plan["BK"], BKP=plan["BKP"], BVP=plan["BVP"],
          DK=plan["DK"], LOG_NC=plan["LOG_NC"], RECENTRE=plan["RECENTRE"], LIMIT=plan["LIMIT"], MERGE=plan["MERGE"],
          TF32=plan["TF32"], PRE=plan["PRE"], SUBST=plan["SUBST"], LOG_BC=plan["LOG_BC"], HOIST=plan["HOIST"],
          CHUNK=plan["CHUNK"], SB=plan["SB"], LOG_NS=plan["LOG_NS"], DKS=plan["DKS"], STAGE=stage,
          OFFW=plan["OFFW"], DIAG_TRANS=plan["DIAG_TRANS"], FLOOR=plan["FLOOR"], KD_SUM=plan["KD_SUM"], INV=plan["INV"],
          PREFETCH=plan["PREFETCH"]),
          kn["solve_warps"] if stage == 2 else kn["block_warps"], 1 if stage == 1 else plan["solve_stages"])
    if stage != 1 and plan["solve_stages"] > 1:  # version 8: the solve's key / value tiles prefetched
        assert "cp.async" in c.asm["ptx"], "solve_stages > 1 should pipeline the solve's loads"
scan = {"w_ptr": B16, "u_ptr": U, "kd_ptr": B16, "qd_ptr": B16, "aqk_ptr": B16, "gl_ptr": P, "au_ptr": AU, "h0_ptr": P,
        "ht_ptr": P, "o_ptr": B16, "hbuf_ptr": P if plan["split"] else B16, "dbuf_ptr": P}
c = build(fam._kda_scan_kernel, scan, dict(K=K, V=V, BT=plan["BT"], BV=plan["BV"], LAYOUT=plan["layout"],
          FUSE_OUT=plan["fuse"], SPLIT_S=plan["split"], USE_H0=True, STORE_HT=True, PRE=plan["PRE"],
          ), kn["scan_warps"], plan["scan_stages"])
assert "mma" in c.asm["ptx"], "the scan's products should run on the tensor cores"
if len(sys.argv) > 3:  # the scan's PTX and cubin, for callers that inspect them (spills, tensor-core ops)
    open(sys.argv[3] + ".ptx", "w").write(c.asm["ptx"])
    open(sys.argv[3] + ".cubin", "wb").write(c.asm["cubin"])
if not plan["fuse"]:
    out = {"qd_ptr": B16, "aqk_ptr": B16, "hbuf_ptr": P if plan["split"] else B16, "dbuf_ptr": P, "o_ptr": B16, "au_ptr": AU}
    build(fam._kda_out_kernel, out, dict(K=K, V=V, BT=plan["BT"], BV=plan["OUT_BV"], SPLIT_S=plan["split"], PRE=plan["PRE"]),
          kn["out_warps"], 2)
print("compiled for sm_90")
"""


@pytest.mark.parametrize("override", [{}, {"subst": "rows", "scan_warps": 2}, {"block_prog": "chunk", "out_bv": 128},
                                      {"fuse_prep": True, "au": "bf16", "out_bv": 128, "fuse_output": True, "scan_warps": 4},
                                      {"pair": "split"}, {"solve_stages": 3, "u_store": "bf16"},
                                      {"off_tile": "tight", "diag_cols": "trans", "diag_floor": 30, "block_warps": 2,
                                       "kd_sum": "f64"}],
                         ids=["default", "v4_rows_scan_w2", "v5_chunk_out128", "v6_fused_prep_au_bf16", "v7_split",
                              "v8_stages3_u_bf16", "s11_floor_w2_kd_f64"])
def test_default_knobs_compile_for_hopper(override):
    """The default knobs (and version 4's block-row inverses, early solve loads and 2-warp scan)
    compile for sm_90 (no GPU needed) within the shared-memory limit."""
    out = compile_in_child(COMPILE_FOR_HOPPER, str(FAMILY_PATH), json.dumps(override), timeout=600)
    assert "compiled for sm_90" in out


@pytest.mark.parametrize("kind", HOSTILE)
def test_chunk_block_rows_hostile_gates(tmp_path, kind):
    """block_prog="chunk" (version 5: every block row of a chunk in one program, float64 running
    sums, a whole-chunk fast path behind the guard) on every hostile gate kind, K != V, a short last
    chunk, with the wide read-out tile."""
    module = render({**FAMILY.knobs, "block_prog": "chunk", "out_bv": 64}, tmp_path)
    case = {"B": 1, "T": 57, "H": 2, "K": 32, "V": 64, "initial_state": True, "output_final_state": True}
    check(module.kernel, hostile_inputs(kind, case, seed=23), case)


def aqk_akk_float64(x, BT):
    """Aqk (scaled) and Akk (beta-scaled, strictly lower) of every chunk in float64, laid out like
    the family's [B*H, TP, BT] scratch."""
    q, k, g, beta = (x[n].double() for n in ("q", "k", "g", "beta"))
    B, T, H, K = q.shape
    N = -(-T // BT)

    def chunks(t):
        t = t.transpose(1, 2)
        t = torch.cat([t, t.new_zeros(*t.shape[:2], N * BT - T, *t.shape[3:])], dim=2)
        return t.reshape(B, H, N, BT, *t.shape[3:])

    qc, kc, gc, bc = (chunks(t) for t in (q, k, g, beta))
    G = gc.cumsum(3)
    causal = torch.ones(BT, BT, dtype=torch.bool).tril()
    dec = torch.exp((G.unsqueeze(-2) - G.unsqueeze(-3)).masked_fill(~causal[:, :, None], float("-inf")))
    aqk = (qc.unsqueeze(-2) * dec * kc.unsqueeze(-3)).sum(-1) * K ** -0.5
    akk = ((kc.unsqueeze(-2) * dec * kc.unsqueeze(-3)).sum(-1) * bc.unsqueeze(-1)).tril(-1)
    return {"aqk": aqk.reshape(B * H, N * BT, BT), "akk": akk.reshape(B * H, N * BT, BT)}


def raw_scratch(module, args, knobs, want):
    """The Aqk (hi + lo) and Akk a run with ``knobs`` leaves in its scratch (subst "extract", so Akk is raw),
    checked finite, and their largest absolute errors against the float64 ``want``."""
    d = {}
    module.kda_chunked(*args, {**knobs, "subst": "extract", "solve_warps": 8}, debug=d)
    aqk, akk = d["aqk"][0].double() + d["aqk"][1].double(), d["akk"].double()
    assert torch.isfinite(aqk).all() and torch.isfinite(akk).all(), knobs
    return (aqk, akk), [(aqk - want["aqk"]).abs().max().item(), (akk - want["akk"]).abs().max().item()]


@pytest.mark.parametrize("subst", ["extract", "rows"])
def test_chunk_block_rows_match_row_programs(family, subst):
    """block_prog="chunk" writes the scratch "row" writes (Aqk hi + lo, Akk with or without the
    diagonal inverses) to float32 rounding, and is at least as close to the float64 Aqk/Akk on
    -3e4 gates (float64 running sums instead of float32 differences inside a block); T=1 runs."""
    for kind, T in (("huge", 57), ("channels", 57), (None, 64), (None, 1)):
        case = {"B": 1, "T": T, "H": 1, "K": 32, "V": 16, "initial_state": False, "output_final_state": True}
        x = hostile_inputs(kind, case, seed=31) if kind else inputs(case, seed=5)
        args = (x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, True)
        base = {**family.KNOBS, "subst": subst, "solve_warps": 4 if subst == "rows" else 8}
        row, chunk = {}, {}
        o_row, _ = family.kda_chunked(*args, {**base, "block_prog": "row"}, row)
        o_chunk, s_chunk = family.kda_chunked(*args, {**base, "block_prog": "chunk"}, chunk)
        want = aqk_akk_float64(x, 32)
        a_row, a_chunk = (d["aqk"][0].double() + d["aqk"][1].double() for d in (row, chunk))
        err_row = (a_row - want["aqk"]).abs().max().item()
        err_chunk = (a_chunk - want["aqk"]).abs().max().item()
        assert err_chunk <= max(err_row, 1e-6), (kind, err_chunk, err_row)
        assert (chunk["akk"].double() - row["akk"].double()).abs().max() <= 1e-3, kind
        if subst == "extract":  # the raw Akk (the inverses are checked through w, u and o)
            err = (chunk["akk"].double() - want["akk"]).abs().max().item()
            assert err <= 1e-5, (kind, err)
        # (on -3e4 gates "row" itself is ~7e-4 off in Akk, so u moves by up to ~2e-3 there)
        for name in ("u", "au"):
            assert torch.allclose(chunk[name], row[name], rtol=1e-3, atol=3e-3 if kind == "huge" else 1e-3), (kind, name)
        assert (o_chunk.float() - o_row.float()).abs().max() <= 2 ** -6 * max(1e-3, o_row.float().abs().max()), kind
        errors = PROBLEM.compare((o_chunk, s_chunk), PROBLEM.reference(**x))
        assert all(e.ok for e in errors), (kind, [e.reason for e in errors if not e.ok])


# ------------------------------------------------------------------------------------------
# Version 6: the fused preparation (block rows + solve in one program per chunk, BT 32) and
# Aqk u stored in bf16
# ------------------------------------------------------------------------------------------
V6 = {"fuse_prep": True, "au": "bf16", "out_bv": 128}


def test_fused_prep_writes_what_the_two_launches_write(family):
    """fuse_prep=True runs ``_block_row`` for both row blocks and then ``_solve_wy`` in one program:
    the same arithmetic as the two launches, so every intermediate and the outputs are identical
    (hostile gates, K != V, a short last chunk)."""
    case = {"B": 1, "T": 2 * 32 + 9, "H": 2, "K": 32, "V": 16, "initial_state": True, "output_final_state": True}
    x = hostile_inputs("channels", case, seed=61)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], None, x["initial_state"], True)
    two, one = {}, {}
    o_two, s_two = family.kda_chunked(*args, family.KNOBS, two)
    o_one, s_one = family.kda_chunked(*args, {**family.KNOBS, "fuse_prep": True}, one)
    for name in ("w", "u", "kd", "qd", "aqk", "akk", "gl", "au"):
        assert torch.equal(one[name], two[name]), name
    assert torch.equal(o_one, o_two) and torch.equal(s_one, s_two)


def test_au_bf16_rounds_only_au(family):
    """au="bf16" stores Aqk u rounded to bf16 and changes nothing else upstream."""
    case = {"B": 1, "T": 45, "H": 1, "K": 32, "V": 32, "initial_state": False, "output_final_state": True}
    x = inputs(case, seed=62)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, True)
    f32, b16 = {}, {}
    family.kda_chunked(*args, family.KNOBS, f32)
    _, s_b16 = family.kda_chunked(*args, {**family.KNOBS, "au": "bf16"}, b16)
    assert b16["au"].dtype == torch.bfloat16
    assert torch.equal(b16["au"], f32["au"].to(torch.bfloat16))
    for name in ("w", "u", "kd", "qd"):
        assert torch.equal(b16[name], f32[name]), name


@pytest.mark.parametrize("kind", HOSTILE)
def test_v6_hostile_gates(tmp_path, kind):
    """The fused preparation with bf16 au and the 128-wide read-out on every hostile gate kind."""
    module = render({**FAMILY.knobs, **V6}, tmp_path)
    case = {"B": 1, "T": 64, "H": 2, "K": 32, "V": 32, "initial_state": True, "output_final_state": True}
    check(module.kernel, hostile_inputs(kind, case, seed=71), case)


@pytest.mark.parametrize("case", [
    {"B": 1, "T": 1, "H": 1, "K": 16, "V": 16, "initial_state": True, "output_final_state": True},
    {"B": 2, "T": 33, "H": 1, "K": 64, "V": 16, "initial_state": False, "output_final_state": True},
    {"B": 1, "T": 9, "H": 1, "K": 16, "V": 128, "initial_state": True, "output_final_state": False},
], ids=PROBLEM.describe)
def test_v6_edge_shapes(tmp_path, case):
    """T = 1, K != V both ways, a short last chunk, the fused scan read-out (au loaded in bf16)."""
    for over in (V6, {**V6, "fuse_output": True}):
        module = render({**FAMILY.knobs, **over}, tmp_path)
        check(module.kernel, inputs(case, seed=72), case)


def test_v6_hypothesis_shapes(tmp_path):
    module = render({**FAMILY.knobs, **V6}, tmp_path)

    @settings(max_examples=4, deadline=None)
    @given(case=PROBLEM.case_strategy("cpu"), seed=st.integers(0, 2**31 - 1))
    def run(case, seed):
        check(module.kernel, inputs(case, seed), case)

    run()


# version 7: pair "split" -- the pairwise diagonal fallback of the "row" block programs cut exactly
# into 4 x 4 pairwise sub-blocks and factored off-diagonal quarters
SPLIT = {"pair": "split"}


@pytest.mark.parametrize("kind", HOSTILE)
def test_split_pair_hostile_gates(tmp_path, kind):
    """pair "split" on every hostile gate kind, K != V, a short last chunk: right, finite, and its
    raw Aqk / Akk (subst "extract") about as close to the float64 ones as "full"'s (both exact;
    "split" sums each 4 x 4 sub-block from its own start, so it is closer on -3e4 gates)."""
    case = {"B": 1, "T": 45, "H": 2, "K": 64, "V": 16, "initial_state": True, "output_final_state": True}
    x = hostile_inputs(kind, case, seed=81)
    module = render({**FAMILY.knobs, **SPLIT}, tmp_path)
    check(module.kernel, x, case)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], None, x["initial_state"], True)
    want = aqk_akk_float64(x, 32)
    for forced in (False, True):  # forced: every diagonal block takes the fallback (guard limit -1)
        if forced:
            module._GUARD_LIMIT = {name: -1.0 for name in module._GUARD_LIMIT}
        err = {pair: raw_scratch(module, args, {**FAMILY.knobs, "pair": pair}, want)[1] for pair in ("full", "split")}
        assert all(s <= max(2 * f, 1e-5) for s, f in zip(err["split"], err["full"])), (kind, forced, err)
    check(module.kernel, x, case)  # still forced: the split fallback on every block


@pytest.mark.parametrize("case", [
    {"B": 1, "T": 1, "H": 1, "K": 16, "V": 32, "initial_state": True, "output_final_state": True},
    {"B": 1, "T": 19, "H": 1, "K": 32, "V": 128, "initial_state": False, "output_final_state": True},
], ids=PROBLEM.describe)
def test_split_pair_edge_shapes(tmp_path, case):
    """T = 1 and K != V with pair "split", on the problem's own gates (their -1000 resets)."""
    module = render({**FAMILY.knobs, **SPLIT}, tmp_path)
    check(module.kernel, inputs(case, seed=82), case)


def test_split_pair_tf32_emulated(tmp_path, monkeypatch):
    """pair "split" with every diagonal block forced into the fallback (guard limit -1) and the
    GPU's tf32 operand rounding emulated: its factored levels are tf32 products too."""
    hits = tf32_rounding(monkeypatch)
    module = render({**FAMILY.knobs, **SPLIT}, tmp_path)
    module._GUARD_LIMIT = {name: -1.0 for name in module._GUARD_LIMIT}
    case = {"B": 1, "T": 70, "H": 1, "K": 64, "V": 32, "initial_state": True, "output_final_state": True}
    for x in (inputs(case, seed=11), hostile_inputs("channels", case, seed=11),
              hostile_inputs("strong_run", case, seed=11)):
        errors = check(module.kernel, x, case)
        assert all(e.rel_rms < 4e-3 for e in errors), [(e.name, e.rel_rms) for e in errors]
    assert hits, "no tf32 product was emulated"


# ------------------------------------------------------------------------------------------
# Version 8: the solve's loads pipelined (solve_stages; no effect on the interpreter, checked
# for sm_90 above) and the WY factor u stored in bf16 (u_store)
# ------------------------------------------------------------------------------------------
V8 = {"solve_stages": 2, "u_store": "bf16"}


def test_u_store_bf16_rounds_only_u(family):
    """u_store="bf16" stores u rounded to bf16 and changes nothing else the preparation writes (au
    is computed from the float32 u); the outputs stay within the default's error plus a little."""
    case = {"B": 1, "T": 45, "H": 1, "K": 32, "V": 32, "initial_state": True, "output_final_state": True}
    x = hostile_inputs("channels", case, seed=91)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], None, x["initial_state"], True)
    f32, b16 = {}, {}
    got32 = family.kda_chunked(*args, family.KNOBS, f32)
    got16 = family.kda_chunked(*args, {**family.KNOBS, **V8}, b16)
    assert f32["u"].dtype == torch.float32 and b16["u"].dtype == torch.bfloat16
    assert torch.equal(b16["u"], f32["u"].to(torch.bfloat16))
    for name in ("w", "kd", "qd", "au", "aqk", "akk", "gl"):
        assert torch.equal(b16[name], f32[name]), name
    want = PROBLEM.reference(**x)
    e32, e16 = PROBLEM.compare(got32, want), PROBLEM.compare(got16, want)
    assert all(e.ok for e in e16), [e.reason for e in e16 if not e.ok]
    for a, b in zip(e32, e16):
        assert b.rel_rms <= a.rel_rms + 1.5e-3, (a.name, a.rel_rms, b.rel_rms)


@pytest.mark.parametrize("kind", HOSTILE)
def test_v8_hostile_gates(tmp_path, kind):
    """bf16 u with the pipelined solve on every hostile gate kind (exact zeros after -3e4 / -1000
    gates, no decay at all, ...), K != V, a short last chunk: right and within 4e-3."""
    module = render({**FAMILY.knobs, **V8}, tmp_path)
    case = {"B": 1, "T": 45, "H": 2, "K": 32, "V": 64, "initial_state": True, "output_final_state": True}
    errors = check(module.kernel, hostile_inputs(kind, case, seed=92), case)
    assert all(e.rel_rms < 4e-3 for e in errors), [(e.name, e.rel_rms) for e in errors]


@pytest.mark.parametrize("over", [{"scan_layout": "vk", "fuse_output": True, "scan_warps": 4},
                                  {"readout": "aqk", "fuse_prep": True, "solve_stages": 3}],
                         ids=["vk_fused_readout", "aqk_fused_prep"])
def test_v8_other_paths(tmp_path, over):
    """bf16 u through the scan's other layout with the fused read-out, and through version 2's
    read-out (o = qd S + Aqk delta, au unused) with the one-launch preparation; T = 1 and a short
    last chunk."""
    module = render({**FAMILY.knobs, **V8, **over}, tmp_path)
    for case in ({"B": 1, "T": 1, "H": 1, "K": 16, "V": 32, "initial_state": True, "output_final_state": True},
                 {"B": 2, "T": 37, "H": 1, "K": 64, "V": 16, "initial_state": False, "output_final_state": True}):
        check(module.kernel, inputs(case, seed=93), case)


def test_v8_refused_where_the_solve_spills(family):
    y = inputs({"B": 1, "T": 4, "H": 1, "K": 16, "V": 16, "initial_state": False, "output_final_state": False}, seed=0)
    args = (y["q"], y["k"], y["v"], y["g"], y["beta"], None, None, False)
    for stages in (2, 3):
        with pytest.raises(ValueError, match="solve_stages"):
            family.kda_chunked(*args, {**family.KNOBS, "solve_stages": stages, "BT": 64, "solve_warps": 8})
    with pytest.raises(ValueError, match="solve_stages"):
        family.kda_chunked(*args, {**family.KNOBS, "solve_stages": 4})
    with pytest.raises(ValueError, match="u_store"):
        family.kda_chunked(*args, {**family.KNOBS, "u_store": "fp16"})
    family.kda_chunked(*args, {**family.KNOBS, "solve_stages": 2, "BT": 64, "solve_warps": 8, "solve_maxnreg": 0})


def test_removed_knobs_refused(family):
    """Versions 9-9c (scan_pair, pair_merge) were removed after session 6's H200 run: neither name is a
    knob any more, and a knob dict that still sets one is refused instead of silently timing the default."""
    assert not {"scan_pair", "pair_merge"} & (set(FAMILY.knobs) | set(FAMILY.space))
    y = inputs({"B": 1, "T": 4, "H": 1, "K": 16, "V": 16, "initial_state": False, "output_final_state": False}, seed=0)
    args = (y["q"], y["k"], y["v"], y["g"], y["beta"], None, None, False)
    for over in ({"scan_pair": True}, {"scan_pair": False, "pair_merge": "scan"}, {"pair_merge": "kernel"}):
        with pytest.raises(ValueError, match="unknown knob"):
            family.kda_chunked(*args, {**family.KNOBS, **over})


# ------------------------------------------------------------------------------------------
# Addresses: the interpreter reads and writes wherever a pointer points (it does not bounds-check);
# the GPU faults.  Checked here lane by lane against the tensors passed to each launch.
# ------------------------------------------------------------------------------------------
def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes a (possibly strided) tensor covers: [first, last + 1)."""
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0) if t.numel() else -1
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


@contextlib.contextmanager
def addresses_checked():
    """Under the CPU interpreter, fail (AssertionError, which the interpreter re-raises as its
    InterpreterError; before the access) when an unmasked lane of
    a tl.load / tl.store addresses a byte outside every tensor passed to that launch.  Masked-off lanes
    are not checked: the GPU does not touch them either.  Patches Triton's interpreter: the launch's
    host copies of its tensor arguments (GridExecutor._init_args_hst) and the builder's masked load
    and store, through which every pointer load and store of the interpreter passes."""
    from triton.runtime import interpreter as interp

    launch = {"kernel": "?", "spans": []}
    init, load, store = (interp.GridExecutor._init_args_hst, interp.InterpreterBuilder.create_masked_load,
                         interp.InterpreterBuilder.create_masked_store)

    def init_args(self, args_dev, kwargs):
        args, kw = init(self, args_dev, kwargs)
        launch["kernel"] = getattr(self.fn, "__name__", "?")
        launch["spans"] = [_span(a) for a in [*args, *kw.values()] if isinstance(a, torch.Tensor)]
        return args, kw

    def within(kind, ptrs, mask):
        shape = np.broadcast_shapes(np.shape(ptrs.data), np.shape(mask.data))
        lanes = np.broadcast_to(np.asarray(mask.data).astype(bool), shape)  # masks may arrive as int arrays
        addr = np.broadcast_to(ptrs.data, shape)[lanes].astype(np.uint64)
        size = interp._get_np_dtype(ptrs.get_element_ty()).itemsize
        ok = np.zeros(addr.shape, dtype=bool)
        for lo, hi in launch["spans"]:
            ok |= (addr >= lo) & (addr + size <= hi)
        if not ok.all():
            bad = addr[~ok]
            near = min(launch["spans"], key=lambda sp: min(abs(int(bad[0]) - sp[0]), abs(int(bad[0]) - sp[1])))
            raise AssertionError(f"{launch['kernel']}: {kind} of {bad.size} unmasked lanes outside every tensor "
                                 f"passed (the first at byte {int(bad[0]) - near[0]:+d} of a {near[1] - near[0]}-byte "
                                 "tensor)")

    def checked_load(self, ptrs, mask, other, *rest):
        within("load", ptrs, mask)
        return load(self, ptrs, mask, other, *rest)

    def checked_store(self, ptrs, value, mask, *rest):
        within("store", ptrs, mask)
        return store(self, ptrs, value, mask, *rest)

    interp.GridExecutor._init_args_hst = init_args
    interp.InterpreterBuilder.create_masked_load = checked_load
    interp.InterpreterBuilder.create_masked_store = checked_store
    try:
        yield
    finally:
        interp.GridExecutor._init_args_hst = init
        interp.InterpreterBuilder.create_masked_load = load
        interp.InterpreterBuilder.create_masked_store = store


@triton.jit
def _probe_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, MASKED: tl.constexpr, STORE_PAST: tl.constexpr):
    r = tl.arange(0, BLOCK)
    if MASKED:
        x = tl.load(x_ptr + r, mask=r < n, other=0.0)
    else:
        x = tl.load(x_ptr + r)
    if STORE_PAST:
        tl.store(y_ptr + r + 1, x, mask=r < n)
    else:
        tl.store(y_ptr + r, x, mask=r < n)


def test_address_check_catches_out_of_bounds_lanes():
    """The check itself: masked tails pass; an unmasked load past the end and a masked store one
    element off fail, before they touch memory."""
    x, y = torch.arange(12, dtype=torch.float32), torch.zeros(12)
    with addresses_checked():
        _probe_kernel[(1,)](x, y, 12, BLOCK=16, MASKED=True, STORE_PAST=False)
        assert torch.equal(y, x)
        with pytest.raises((AssertionError, InterpreterError), match="_probe_kernel: load of 4 unmasked lanes"):
            _probe_kernel[(1,)](x, y, 12, BLOCK=16, MASKED=False, STORE_PAST=False)
        with pytest.raises((AssertionError, InterpreterError), match="_probe_kernel: store of 1 unmasked lanes"):
            _probe_kernel[(1,)](x[:11], y[:11], 11, BLOCK=16, MASKED=True, STORE_PAST=True)


@pytest.mark.parametrize("T", [64, 70])
def test_every_address_in_bounds(family, T):
    """Every launch of the default pipeline (preparation, scan, read-out) addresses only its own tensors,
    at an even and an odd chunk count, B = H = 2, final state without an initial one."""
    case = {"B": 2, "T": T, "H": 2, "K": 32, "V": 32, "initial_state": False, "output_final_state": True}
    x = inputs(case, seed=96)
    with addresses_checked():
        got = family.kda_chunked(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, True, family.KNOBS)
    errors = PROBLEM.compare(got, PROBLEM.reference(**x))
    assert all(e.ok for e in errors), [e.reason for e in errors if not e.ok]


def test_requires_matches_what_plan_refuses(family):
    """REQUIRES (what the search agent skips without a tool call) and ``_plan`` (the authority) agree on
    random combinations of SPACE at K = V = 128, and on each rule's own corner."""
    rng = random.Random(6)
    refused = 0
    for _ in range(20000):
        knobs = {**FAMILY.knobs, **{k: rng.choice(v) for k, v in FAMILY.space.items()}}
        declared = FAMILY.refusal(knobs)
        try:
            family._plan(128, 128, knobs)
            planned = None
        except ValueError as exc:
            planned = str(exc)
        assert (declared is None) == (planned is None), (knobs, declared, planned)
        refused += declared is not None
    assert 0 < refused < 20000
    for when, then in FAMILY.requires:  # each rule's trigger with a disallowed companion
        knobs = {**FAMILY.knobs, **{k: (v[0] if isinstance(v, list) else v) for k, v in when.items()}}
        name, allowed = next(iter(then.items()))
        knobs[name] = next(c for c in FAMILY.space[name] if c not in allowed)
        with pytest.raises(ValueError):
            family._plan(128, 128, knobs)


# session 11: diag_floor -- a guarded diagonal block sees its gates raised to at least -diag_floor
FLOOR = {"diag_floor": 30, "off_tile": "tight", "diag_cols": "trans"}


@pytest.mark.parametrize("kind", HOSTILE)
def test_diag_floor_hostile_gates(tmp_path, kind):
    """diag_floor 30 on every hostile gate kind: the outputs pass, and the raw Aqk / Akk stay as close
    to the float64 ones as without the floor (a decay it changes is below e^-30 either way). On the
    resets the scratch differs from the unfloored one: those blocks now take the factored path."""
    case = {"B": 1, "T": 45, "H": 2, "K": 64, "V": 16, "initial_state": True, "output_final_state": True}
    x = hostile_inputs(kind, case, seed=83)
    module = render({**FAMILY.knobs, **FLOOR}, tmp_path)
    check(module.kernel, x, case)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], None, x["initial_state"], True)
    want = aqk_akk_float64(x, 32)
    raw, err = {}, {}
    for floor in (0, 30):
        raw[floor], err[floor] = raw_scratch(module, args, {**FAMILY.knobs, **FLOOR, "diag_floor": floor}, want)
    assert all(f <= max(2 * n, 1e-5) for f, n in zip(err[30], err[0])), (kind, err)
    if kind == "resets":
        assert not all(torch.equal(a, b) for a, b in zip(raw[0], raw[30])), "the floor changed no block's path"


def test_diag_floor_on_the_problems_gates(tmp_path):
    """The problem's own gates (resets, strong runs) at a length with several chunks, bf16, K != V."""
    case = {"B": 2, "T": 100, "H": 2, "K": 32, "V": 64, "initial_state": False, "output_final_state": True}
    module = render({**FAMILY.knobs, **FLOOR}, tmp_path)
    check(module.kernel, inputs(case, seed=17), case)


# session 11: kd_sum "f64" -- the solve's kd decay from the forward tile's float64 running sum; session 12: "f32",
# the same in float32 on gates floored at -30; session 13: "rows", f32's sums formed and stored by the block rows
@pytest.mark.parametrize("kd_sum", ["f64", "f32", "rows"])
@pytest.mark.parametrize("kind", HOSTILE)
def test_kd_sum_hostile_gates(tmp_path, kind, kd_sum):
    """kd_sum "f64" / "f32" / "rows" on every hostile gate kind, with a short last chunk: the outputs pass, and kd, qd, w and
    gl stay within one bf16 step of the largest element of the row-reversed form's (f64 sums the same gates exactly
    enough; f32's floor changes only decays below e^-30, its total-minus-prefix difference by ~1e-4 relative)."""
    case = {"B": 1, "T": 45, "H": 2, "K": 64, "V": 16, "initial_state": True, "output_final_state": True}
    x = hostile_inputs(kind, case, seed=85)
    knobs = {**FAMILY.knobs, **FLOOR, "kd_sum": kd_sum}
    module = render(knobs, tmp_path)
    check(module.kernel, x, case)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], None, x["initial_state"], True)
    tiles = {}
    for form in ("reversed", kd_sum):
        d = {}
        module.kda_chunked(*args, {**knobs, "kd_sum": form}, debug=d)
        tiles[form] = {name: d[name].float() for name in ("kd", "qd", "w", "gl")}
    for name, want in tiles["reversed"].items():
        got = tiles[kd_sum][name]
        assert torch.isfinite(got).all(), name
        # f32's floor: where every decay is below e^-30 (a whole head reset) the reversed form has exact zeros and f32
        # values below e^-30 times the inputs' size (q, k unit rows: ~1e-13), so it gets that much absolute slack
        slack = 1e-12 if kd_sum in ("f32", "rows") else 0.0
        assert (got - want).abs().max().item() <= 2.0 ** -8 * max(want.abs().max().item(), 1e-30) + slack, (kind, name)


# session 12: inv_dot -- the block rows' diagonal-block inverses by tensor-core products instead of float32 FMA
def test_inv_dot_tensor_core_inverse(tmp_path):
    """inv_dot "bf16x3": the outputs pass on the problem's and on hostile gates, and the stored inverses (I + L)^-1
    are within 2^-10 of the float32 FMA ones, relative to their largest off-diagonal entry (A is rounded to bf16,
    2^-9 relative, before the solve uses it; one bf16 product fails this)."""
    inv_dot = "bf16x3"
    case = {"B": 1, "T": 70, "H": 2, "K": 64, "V": 32, "initial_state": True, "output_final_state": True}
    knobs = {**FAMILY.knobs, **FLOOR, "inv_dot": inv_dot}
    module = render(knobs, tmp_path)
    cases = (inputs(case, seed=12), hostile_inputs("resets", case, seed=12), hostile_inputs("channels", case, seed=12))
    for x in cases:
        errors = check(module.kernel, x, case)
        assert all(e.rel_rms < 4e-3 for e in errors), [(e.name, e.rel_rms) for e in errors]
        args = (x["q"], x["k"], x["v"], x["g"], x["beta"], None, x["initial_state"], True)
        scratch = {}
        for form in ("ieee", inv_dot):
            d = {}
            module.kda_chunked(*args, {**knobs, "inv_dot": form}, debug=d)
            scratch[form] = d["akk"].float()
        BT, BC = knobs["BT"], knobs["BC"]
        rows = torch.arange(scratch["ieee"].shape[1])
        cols = torch.arange(BT)[None, :]
        # the diagonal blocks' strictly lower entries (their diagonal is exactly 1 in every form)
        diag = ((rows[:, None] % BT) // BC == cols // BC) & (rows[:, None] % BT > cols)
        want = torch.where(diag, scratch["ieee"], 0.0)
        got = torch.where(diag, scratch[inv_dot], 0.0)
        assert torch.isfinite(got).all()
        assert (got - want).abs().max() <= 2.0 ** -10 * want.abs().max(), ((got - want).abs().max(), want.abs().max())


# session 13: row_prefetch -- the block rows issue the next key tile's g, q, k loads before this tile's work
@pytest.mark.parametrize("BK", [16, 32])
def test_row_prefetch_changes_only_when_loads_issue(tmp_path, BK):
    """With the next key tile prefetched, every block-row output (Aqk, Akk with the stored inverses) is bit-identical
    to the plain loads' on hostile gates with a short last chunk, and the outputs pass; the last tile's prefetch
    (past K) is masked off."""
    case = {"B": 1, "T": 45, "H": 2, "K": 64, "V": 16, "initial_state": True, "output_final_state": True}
    x = hostile_inputs("resets", case, seed=31)
    knobs = {**FAMILY.knobs, **FLOOR, "BK": BK, "subst": "rows", "row_prefetch": True}
    module = render(knobs, tmp_path)
    check(module.kernel, x, case)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], None, x["initial_state"], True)
    tiles = {}
    for prefetch in (False, True):
        d = {}
        module.kda_chunked(*args, {**knobs, "row_prefetch": prefetch}, debug=d)
        tiles[prefetch] = d
    assert torch.isfinite(tiles[True]["akk"]).all()
    for name in ("aqk", "akk", "w", "kd"):
        assert torch.equal(tiles[True][name], tiles[False][name]), name


# session 13: BK and block_maxnreg "auto" -- the block rows' key tile and register cap chosen by K
def test_block_row_tile_auto_follows_k(family):
    """"auto" gives 16-wide key tiles capped at 168 registers at K 128 (and wider), a3380400's 32-wide uncapped ones
    below; an explicit cap is kept whatever the tile."""
    kn = {**FAMILY.knobs, "BK": "auto", "block_maxnreg": "auto"}
    assert (family._plan(128, 128, kn)["BK"], family._plan(128, 128, kn)["BLOCK_MAXNREG"]) == (16, 168)
    assert (family._plan(256, 64, kn)["BK"], family._plan(256, 64, kn)["BLOCK_MAXNREG"]) == (16, 168)
    assert (family._plan(64, 64, kn)["BK"], family._plan(64, 64, kn)["BLOCK_MAXNREG"]) == (32, 0)
    assert family._plan(16, 32, kn)["BK"] == 16  # never wider than K
    assert family._plan(64, 64, {**kn, "block_maxnreg": 128})["BLOCK_MAXNREG"] == 128


# session 14: scan_overlap "pdl" -- the scan launched first and the solve beside it, each chunk flagged once stored
OVERLAP = {**FLOOR, "kd_sum": "rows", "scan_engine": "wgmma_ws", "scan_overlap": "pdl"}


@pytest.mark.parametrize("overlap", ["pdl", "auto"])
def test_scan_overlap_solve_flags_every_chunk(tmp_path, overlap):
    """On the CPU the Gluon scan that waits for the flags cannot run (tests/test_kda_wgmma.py compiles it), but the
    solve still runs on its chunk-major (B*H, NT) grid and flags each chunk: every flag set exactly once, and the
    outputs and intermediates bit-identical to scan_overlap "off"'s, on resets with a short last chunk and B > 1."""
    case = {"B": 2, "T": 45, "H": 2, "K": 32, "V": 16, "initial_state": True, "output_final_state": True}
    x = hostile_inputs("resets", case, seed=91)
    knobs = {**FAMILY.knobs, **OVERLAP, "scan_overlap": overlap}
    module = render(knobs, tmp_path)
    check(module.kernel, x, case)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], None, x["initial_state"], True)
    runs = {}
    for value in ("off", overlap):
        d = {}
        runs[value] = (module.kda_chunked(*args, {**knobs, "scan_overlap": value}, debug=d), d)
    (o_on, s_on), d_on = runs[overlap]
    (o_off, s_off), d_off = runs["off"]
    assert torch.equal(o_on, o_off) and torch.equal(s_on, s_off)
    for name in ("w", "u", "kd", "qd", "gl", "au"):
        assert torch.equal(d_on[name], d_off[name]), name
    assert d_off["flags"] is None and not d_on["scan_beside_solve"]
    assert d_on["flags"].tolist() == [1] * (2 * 2 * d_on["NT"])


def test_scan_beside_solve_only_where_every_scan_program_fits(family):
    """The scan runs first only with the warp-specialised Gluon scan (the one whose loader waits) and only while all its
    programs (one per SM) fit with 16 SMs left: the solve launches only once every scan program runs, so a scan
    program left waiting for an SM would wait for the solve forever. _plan refuses the knob where nothing could wait."""
    kn = {**family.KNOBS, **OVERLAP}
    assert family._scan_beside_solve(True, kn, 32, 132)
    assert family._scan_beside_solve(True, kn, 116, 132) and not family._scan_beside_solve(True, kn, 117, 132)
    assert not family._scan_beside_solve(False, kn, 32, 132)  # the Triton scan ran: nothing waits for the flags
    assert not family._scan_beside_solve(True, {**kn, "scan_overlap": "off"}, 32, 132)
    assert not family._scan_beside_solve(True, {**kn, "scan_engine": "wgmma"}, 32, 132)
    # "auto": only where the scan's chain is the longer stage, at most a quarter as many programs as SMs (the headline's
    # 32 on the H200's 132), not B2 T16384 H16's or B8 T1024 H8's 64
    auto = {**kn, "scan_overlap": "auto"}
    assert family._scan_beside_solve(True, auto, 33, 132) and not family._scan_beside_solve(True, auto, 34, 132)
    assert not family._scan_beside_solve(False, auto, 32, 132)
    for value in ("pdl", "auto"):
        for refused in ({"scan_engine": "wgmma"}, {"scan_engine": "triton"}, {"fuse_prep": True, "block_warps": 4}):
            with pytest.raises(ValueError, match="scan_overlap"):
                family._plan(128, 128, {**kn, "scan_overlap": value, **refused})


# session 14: pair_elems -- the pairwise fallback's tile sized by the block rows' warps
def test_pair_elems_narrower_channel_steps_stay_exact(tmp_path):
    """At 512 elements (pair_elems "auto" with 1-warp rows) the fallback takes 8 channels per step instead of 32: with
    every diagonal block forced onto the fallback, on huge gates, its raw Aqk / Akk stay as close to the float64 ones
    as at 2048, and the outputs pass."""
    case = {"B": 1, "T": 45, "H": 2, "K": 64, "V": 16, "initial_state": True, "output_final_state": True}
    x = hostile_inputs("huge", case, seed=92)
    knobs = {**FAMILY.knobs, **SPLIT, "block_warps": 1, "pair_elems": "auto"}
    module = render(knobs, tmp_path)
    assert module._plan(64, 16, knobs)["DKS"] == 8 and module._plan(64, 16, {**knobs, "pair_elems": 2048})["DKS"] == 32
    assert module._plan(64, 16, {**knobs, "block_warps": 4})["DKS"] == 32  # "auto" at 4 warps: the old 2048
    module._GUARD_LIMIT = {name: -1.0 for name in module._GUARD_LIMIT}
    check(module.kernel, x, case)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], None, x["initial_state"], True)
    want = aqk_akk_float64(x, 32)
    err = {pe: raw_scratch(module, args, {**knobs, "subst": "extract", "pair_elems": pe}, want)[1] for pe in (2048, 512)}
    assert all(n <= max(2 * w, 1e-5) for n, w in zip(err[512], err[2048])), err
