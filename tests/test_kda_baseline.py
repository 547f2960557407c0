"""The KDA baseline candidate (kernels/families/kda_recurrent.py) is correct under the Triton
interpreter, at its default knobs and at every value its SPACE offers."""

from __future__ import annotations

import pytest
import torch
from family_modules import compile_in_child, import_rendered
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_kopt.families import load_family
from pytest_kopt.gate import load_module
from pytest_kopt.problems import get_problem

PROBLEM = get_problem("kda")
FAMILY_PATH = PROBLEM.baseline_candidate_path
FAMILY = load_family(FAMILY_PATH)  # as the search agent reads it: one marked KNOBS block, literal_eval, no import


def render(knobs: dict, tmp_path):
    """The family rendered with ``knobs`` and imported as a candidate."""
    return import_rendered(FAMILY, knobs, tmp_path)


def check(kernel, case, seed, dtype):
    x = PROBLEM.make_inputs(case, device="cpu", seed=seed, dtype=dtype)
    want = PROBLEM.reference(**x)
    got = kernel(**x)
    errors = PROBLEM.compare(got, want)
    assert all(e.ok for e in errors), [e.reason for e in errors if not e.ok]
    o, final = got
    dtypes = PROBLEM.expected_dtypes(x)
    assert o.dtype == dtypes["o"]
    if case["output_final_state"]:
        assert final.dtype == dtypes["final_state"]
    else:
        assert final is None


@pytest.fixture(scope="module")
def baseline():
    return load_module(FAMILY_PATH)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_baseline_matches_reference(baseline, dtype):
    @settings(max_examples=15, deadline=None)
    @given(case=PROBLEM.case_strategy("cpu"), seed=st.integers(0, 2**31 - 1))
    def run(case, seed):
        check(baseline.kernel, case, seed, dtype)

    run()


@pytest.mark.parametrize(
    "case",
    [
        {"B": 1, "T": 1, "H": 1, "K": 16, "V": 16, "initial_state": True, "output_final_state": True},
        {"B": 3, "T": 5, "H": 2, "K": 64, "V": 16, "initial_state": False, "output_final_state": True, "scale": 1.0},
        {"B": 1, "T": 4, "H": 1, "K": 256, "V": 32, "initial_state": True, "output_final_state": False},
        {"B": 1, "T": 3, "H": 1, "K": 16, "V": 256, "initial_state": True, "output_final_state": True},
    ],
    ids=lambda c: PROBLEM.describe(c),
)
def test_baseline_edge_shapes(baseline, case):
    check(baseline.kernel, case, seed=5, dtype=torch.bfloat16)


def test_every_space_value_renders_and_runs(tmp_path):
    knobs, space = FAMILY.knobs, FAMILY.space
    assert set(knobs) == set(space)
    assert all(knobs[name] in values for name, values in space.items()), "defaults lie inside SPACE"
    case = {"B": 2, "T": 6, "H": 1, "K": 32, "V": 48, "initial_state": True, "output_final_state": True}
    for name, values in space.items():
        for value in values:
            module = render({**knobs, name: value}, tmp_path)
            check(module.kernel, case, seed=hash((name, value)) & 0xFFFF, dtype=torch.float32)


def test_unservable_knobs_and_shapes_raise_value_error(tmp_path):
    knobs = FAMILY.knobs
    x = PROBLEM.make_inputs({"B": 1, "T": 2, "H": 1, "K": 16, "V": 16, "initial_state": False, "output_final_state": False}, device="cpu", seed=0)
    with pytest.raises(ValueError, match="BV"):
        render({**knobs, "BV": 24}, tmp_path).kernel(**x)
    with pytest.raises(ValueError, match="num_warps"):
        render({**knobs, "num_warps": 3}, tmp_path).kernel(**x)
    big_k = PROBLEM.make_inputs({"B": 1, "T": 2, "H": 1, "K": 512, "V": 16, "initial_state": False, "output_final_state": False}, device="cpu", seed=0)
    with pytest.raises(ValueError, match="K=512"):
        render(knobs, tmp_path).kernel(**big_k)


COMPILE_FOR_HOPPER = """
import importlib.util, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

spec = importlib.util.spec_from_file_location("kda_recurrent", sys.argv[1])
family = importlib.util.module_from_spec(spec)
spec.loader.exec_module(family)
fn = family._kda_recurrent_kernel
signature = {name: "i32" for name in fn.arg_names}
signature.update({name: "*bf16" for name in ("q_ptr", "k_ptr", "v_ptr", "beta_ptr", "o_ptr")})
signature.update({"g_ptr": "*fp32", "h0_ptr": "*fp32", "ht_ptr": "*fp32", "scale": "fp32"})
constexprs = {"BK": 128, "BV": family.KNOBS["BV"], "USE_INITIAL_STATE": True, "STORE_FINAL_STATE": True}
signature.update({name: "constexpr" for name in constexprs})
compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                          target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": family.KNOBS["num_warps"], "num_stages": family.KNOBS["num_stages"]})
assert "cvt.rn.bf16" in compiled.asm["ptx"], "o should be stored as bf16 with round-to-nearest"
print("compiled for sm_90")
"""


def test_compiles_for_hopper(tmp_path):
    """The interpreter never compiles: build the default kernel for sm_90 (no GPU needed) so a
    GPU-only compile error shows up on CPU too. In a child process, since the interpreter
    leaves triton.language patched in this one."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    assert "compiled for sm_90" in compile_in_child(COMPILE_FOR_HOPPER, str(FAMILY_PATH), cache_dir=tmp_path / "triton-cache")
