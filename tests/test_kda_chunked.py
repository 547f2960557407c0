"""The chunked KDA family (kernels/families/kda_chunked/) rendered as the search agent renders it, on the Triton CPU
interpreter: the Triton kernels of its fallback path end to end, their intermediates against float64, and the
host's plans (cached per kind of call, outputs fresh every call).

Checked against the problem's float64 recurrence with the problem's own compare (relative RMS, NaN/Inf fail):
hypothesis shapes, edge shapes (T=1, T not a multiple of the chunk, K != V, K or V = 256), hostile gates
(whole-block -1000 resets, long strong-decay runs, g = 0, per-channel mixtures, -3e4). The interpreter computes tf32
products in full float32; ``test_tf32_precision_emulated`` rounds their operands as the tensor cores do. The Gluon
kernels cannot run here: tests/test_kda_gluon_prep.py and test_kda_gluon_scan.py compile them for sm_90, and
test_kda_hopper_host.py runs the host on a pretend H200.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from family_modules import import_rendered
from hypothesis import given, settings
from hypothesis import strategies as st
from triton.runtime.errors import InterpreterError

from pytest_kopt import KERNELS_DIR
from pytest_kopt.families import load_family
from pytest_kopt.problems import get_problem

PROBLEM = get_problem("kda")
FAMILY_PATH = KERNELS_DIR / "families" / "kda_chunked"
FAMILY = load_family(FAMILY_PATH)


def render(knobs: dict, directory):
    """The family rendered with ``knobs`` (the others at their defaults), imported as a candidate module."""
    return import_rendered(FAMILY, knobs, directory)


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    return render({}, tmp_path_factory.mktemp("kda_chunked"))


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


def test_family_knobs():
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
    if kind == "resets":  # whole-head resets at block starts, inside blocks and at the end
        g = mild.clone()
        for t in (0, 5, 16, 31, 32, 47, T - 1):
            if t < T:
                g[:, t] = -1000.0
        return g
    if kind == "strong_run":  # -10 per step for 40 steps: spans of 150+ inside a 16-row block
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
def test_hostile_gates(family, kind):
    case = {"B": 1, "T": 64, "H": 2, "K": 32, "V": 32, "initial_state": True, "output_final_state": True}
    check(family.kernel, hostile_inputs(kind, case, seed=7), case)


# ---- intermediates against float64 --------------------------------------------------------------------------------
def intermediates_float64(x, BT=32, BC=16, floor=-30.0):
    """Every chunk's Aqk (scaled), the block rows' Akk (beta-scaled, strictly lower; each diagonal block replaced by
    the inverse of I + that block), w, u, kd, qd, Aqk u and gl, in float64 and laid out as the family's [B*H, TP, *]
    buffers; gates floored as the family floors them (a decay through a gate below -30 is below e^-30 either way)."""
    q, k, v, g, beta = (x[n].double() for n in ("q", "k", "v", "g", "beta"))
    B, T, H, K = q.shape
    N = -(-T // BT)
    scale = x.get("scale") or K ** -0.5

    def chunks(t):
        t = t.transpose(1, 2)
        t = torch.cat([t, t.new_zeros(*t.shape[:2], N * BT - T, *t.shape[3:])], dim=2)
        return t.reshape(B, H, N, BT, *t.shape[3:])

    qc, kc, vc, gc, bc = (chunks(t) for t in (q, k, v, g.clamp(min=floor), beta))
    G = gc.cumsum(3)
    causal = torch.ones(BT, BT, dtype=torch.bool).tril()
    dec = torch.exp((G.unsqueeze(-2) - G.unsqueeze(-3)).masked_fill(~causal[:, :, None], float("-inf")))
    aqk = (qc.unsqueeze(-2) * dec * kc.unsqueeze(-3)).sum(-1) * scale
    akk = ((kc.unsqueeze(-2) * dec * kc.unsqueeze(-3)).sum(-1) * bc.unsqueeze(-1)).tril(-1)
    eye = torch.eye(BT, dtype=torch.float64)
    a = torch.linalg.inv(eye + akk) * bc.unsqueeze(-2)
    w = a @ (kc * G.exp())
    u = a @ vc
    last = G[..., -1:, :]
    out = {"aqk": aqk, "w": w, "u": u, "kd": kc * (last - G).exp(), "qd": qc * G.exp() * scale - aqk @ w,
           "au": aqk @ u, "gl": last.exp().squeeze(-2)}
    stored = akk.clone()
    for b in range(0, BT, BC):
        stored[..., b:b + BC, b:b + BC] = torch.linalg.inv(eye[:BC, :BC] + akk[..., b:b + BC, b:b + BC])
    out["akk"] = stored
    return {n: t.reshape(B * H, N, *t.shape[3:]) if n == "gl" else t.reshape(B * H, N * BT, t.shape[-1])
            for n, t in out.items()}


def plan_buffers(module):
    """The intermediates of the module's most recent call (its plan's, rewritten by every call)."""
    bufs = dict(next(reversed(module._PLANS.values())).bufs)
    bufs["aqk"] = bufs["aqk"][0].double() + bufs["aqk"][1].double()
    return {n: t.double() for n, t in bufs.items()}


# bf16 storage: half an ulp of 2^-8 relative, a few roundings deep; float32 ones (Aqk hi + lo, Akk, gl) far closer
BOUNDS = {"aqk": 2e-6, "akk": 2e-5, "gl": 1e-6, "w": 2 ** -7, "u": 2 ** -7, "kd": 2 ** -8, "qd": 2 ** -7, "au": 2 ** -7}


def assert_intermediates(module, x):
    got, want = plan_buffers(module), intermediates_float64(x)
    for name, bound in BOUNDS.items():
        assert torch.isfinite(got[name]).all(), name
        err = (got[name] - want[name]).abs().max().item()
        assert err <= bound * max(1.0, want[name].abs().max().item()), (name, err)


@pytest.mark.parametrize("kind", [None, *HOSTILE])
def test_intermediates_match_float64(family, kind):
    """Aqk, Akk with its diagonal blocks inverted, the WY factors and the scan's tiles of every chunk, on the problem's
    gates and every hostile kind, K != V and a short last chunk."""
    case = {"B": 1, "T": 45, "H": 2, "K": 64, "V": 32, "initial_state": True, "output_final_state": True}
    x = hostile_inputs(kind, case, seed=21) if kind else inputs(case, seed=21)
    check(family.kernel, x, case)
    assert_intermediates(family, x)


@pytest.mark.parametrize("kind", ["resets", "huge", "channels"])
def test_exact_split_on_every_diagonal_block(tmp_path, kind):
    """With the guard never passing, every diagonal block takes the exact split (``_diag_split``): the same
    intermediates and right outputs."""
    module = render({}, tmp_path)
    module.LIMIT = -1.0  # read when a plan is made
    case = {"B": 1, "T": 40, "H": 1, "K": 32, "V": 16, "initial_state": False, "output_final_state": True}
    x = hostile_inputs(kind, case, seed=22)
    check(module.kernel, x, case)
    assert_intermediates(module, x)


# ---- tf32 as the tensor cores round it ----------------------------------------------------------------------------
def tf32_rounding(monkeypatch):
    """Make the interpreter's tf32 products round their float32 operands as the tensor cores do
    (10 explicit mantissa bits; truncated, the worse of truncation and round-to-nearest)."""
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


def test_tf32_precision_emulated(tmp_path, monkeypatch):
    """With the GPU's tf32 operand rounding, still well inside 5e-3 on the problem's and channel-wise gates."""
    hits = tf32_rounding(monkeypatch)
    module = render({}, tmp_path)
    case = {"B": 1, "T": 70, "H": 2, "K": 64, "V": 64, "initial_state": True, "output_final_state": True}
    for x in (inputs(case, seed=10), hostile_inputs("channels", case, seed=10)):
        errors = check(module.kernel, x, case)
        assert all(e.rel_rms < 4e-3 for e in errors), [(e.name, e.rel_rms) for e in errors]
    assert hits, "no tf32 product was emulated"


# ---- the host: plans, fresh outputs, refusals ---------------------------------------------------------------------
def test_a_plan_serves_every_call_of_its_kind_with_outputs_of_their_own(tmp_path):
    """One plan per kind of call (shape, dtypes, strides, alignment, states), the four most recent kept; every call
    returns freshly allocated outputs, right for its own inputs (new data at the same addresses too)."""
    module = render({}, tmp_path)
    case = {"B": 1, "T": 20, "H": 2, "K": 16, "V": 16, "initial_state": False, "output_final_state": True}
    x, y = inputs(case, seed=1), inputs(case, seed=2)
    first = check(module.kernel, x, case)
    plan = next(iter(module._PLANS.values()))
    o1, s1 = module.kernel(**x)
    for name in ("q", "k", "v", "g", "beta"):
        x[name].copy_(y[name])
    o2, s2 = module.kernel(**x)
    assert len(module._PLANS) == 1 and next(iter(module._PLANS.values())) is plan
    assert all(launch.args[i] is None for launch in plan.launches for i, _ in launch.slots)  # no caller tensor kept
    assert o1.data_ptr() != o2.data_ptr() and s1.data_ptr() != s2.data_ptr()
    assert not torch.equal(o1, o2)
    errors = PROBLEM.compare((o2, s2), PROBLEM.reference(**y))
    assert all(e.ok for e in errors) and first
    # other kinds of call: another plan each
    z = inputs({**case, "T": 9}, seed=3)
    check(module.kernel, z, {**case, "T": 9})
    strided = {**inputs(case, seed=4)}
    strided["q"] = torch.empty(1, 20, 2, 32, dtype=torch.bfloat16)[..., :16].copy_(strided["q"])
    check(module.kernel, strided, case)
    shifted = {**inputs(case, seed=5)}
    shifted["beta"] = torch.empty(1 * 20 * 2 + 1, dtype=torch.bfloat16)[1:].view(1, 20, 2).copy_(shifted["beta"])
    check(module.kernel, shifted, case)
    assert len(module._PLANS) == 4
    check(module.kernel, inputs({**case, "initial_state": True}, seed=6), {**case, "initial_state": True})
    assert len(module._PLANS) == module.PLANS_KEPT == 4 and plan not in module._PLANS.values()


def test_unservable_shapes_raise_value_error(family):
    x = inputs({"B": 1, "T": 4, "H": 1, "K": 48, "V": 16, "initial_state": False, "output_final_state": False}, seed=0)
    with pytest.raises(ValueError, match="K=48"):
        family.kernel(**x)
    y = inputs({"B": 1, "T": 4, "H": 1, "K": 16, "V": 16, "initial_state": True, "output_final_state": False}, seed=0)
    with pytest.raises(ValueError, match="share the shape"):
        family.kernel(**{**y, "k": y["k"][:, :3]})
    with pytest.raises(ValueError, match="beta"):
        family.kernel(**{**y, "beta": y["beta"][:, :3]})
    with pytest.raises(ValueError, match="contiguous along its last"):
        family.kernel(**{**y, "q": torch.zeros(1, 4, 1, 32, dtype=torch.bfloat16)[..., ::2]})
    with pytest.raises(ValueError, match="initial_state"):
        family.kernel(**{**y, "initial_state": y["initial_state"].transpose(2, 3)})
    with pytest.raises(ValueError, match="beta is on meta"):
        family.kernel(**{**y, "beta": y["beta"].to("meta")})
    empty = {**y, **{n: y[n][:, :0] for n in ("q", "k", "v", "g", "beta")}, "initial_state": None}
    o, final = family.kernel(**empty)
    assert o.shape == (1, 0, 1, 16) and final is None
    with pytest.raises(ValueError, match="T must be positive"):
        family.kernel(**{**empty, "output_final_state": True})


def test_launch_knob_picks_the_compiled_kernel_or_the_jit_entry(tmp_path):
    """A launch on a GPU compiles and loads its kernel when the plan is made; launch "compiled" then calls that
    kernel's launcher straight, on the stream the call names, with the arguments in the kernel's order (the plan's
    own tensors as addresses, the caller's as they are) and no launch metadata or hooks; "jit" goes through the JIT
    entry every call."""
    calls = []
    plan_buffer = torch.zeros(4)

    class Kernel:  # what Triton's CompiledKernel offers: the launcher (loaded), the function handle, the metadata
        function, packed_metadata = "F", "M"

        @staticmethod
        def run(*args):
            calls.append(("compiled", *args))

    class Fn:
        arg_names = ["a_ptr", "b_ptr", "n", "BLOCK"]
        __name__ = "fake"

        def warmup(self, *args, grid, **options):
            calls.append(("warmup", grid, args, options))
            return Kernel()

        def __getitem__(self, grid):
            return lambda *args, **options: calls.append(("jit", grid, args, options))

    caller = [torch.ones(2), torch.ones(3)]
    for launch in ("compiled", "jit"):
        module = render({"launch": launch}, tmp_path)
        calls.clear()
        args = {"a_ptr": caller[0], "b_ptr": plan_buffer, "n": 7, "BLOCK": 16}
        run = module._Launch(Fn(), (3, 1), args, {"num_warps": 2}, {"a_ptr": "x"}, True)
        run({"x": caller[0]}, 99)
        run({"x": caller[1]}, 98)
        assert calls[0] == ("warmup", (3, 1, 1), (caller[0], plan_buffer, 7, 16), {"num_warps": 2})
        if launch == "compiled":
            address = plan_buffer.data_ptr()
            assert calls[1:] == [("compiled", 3, 1, 1, 99, "F", "M", None, None, None, caller[0], address, 7, 16),
                                 ("compiled", 3, 1, 1, 98, "F", "M", None, None, None, caller[1], address, 7, 16)]
        else:
            assert calls[1:] == [("jit", (3, 1, 1), (caller[0], plan_buffer, 7, 16), {"num_warps": 2}),
                                 ("jit", (3, 1, 1), (caller[1], plan_buffer, 7, 16), {"num_warps": 2})]
        assert run.args[0] is None  # no tensor of the caller's held between calls
        calls.clear()
        module._Launch(Fn(), (1,), {"a_ptr": "A", "b_ptr": "B", "n": 1, "BLOCK": 16}, {}, {}, False)({}, None)
        assert calls == [("jit", (1, 1, 1), ("A", "B", 1, 16), {})]  # the CPU interpreter: no warmup, the JIT entry


# ---- addresses: the interpreter does not bounds-check; the GPU faults --------------------------------------------
def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes a (possibly strided) tensor covers: [first, last + 1)."""
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0) if t.numel() else -1
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


@contextlib.contextmanager
def addresses_checked():
    """Under the CPU interpreter, fail (before the access) when an unmasked lane of a tl.load / tl.store addresses a
    byte outside every tensor passed to that launch; masked-off lanes are not checked (the GPU does not touch them
    either). Patches the interpreter's launch (its host copies of the tensor arguments) and its masked loads and
    stores, through which every pointer access passes."""
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
def test_every_address_in_bounds(tmp_path, T):
    """Every launch (block rows, solve, scan, read-out) addresses only its own tensors, at an even and an odd chunk
    count, B = H = 2, K != V, a final state without an initial one."""
    module = render({}, tmp_path)
    case = {"B": 2, "T": T, "H": 2, "K": 32, "V": 64, "initial_state": False, "output_final_state": True}
    x = inputs(case, seed=96)
    with addresses_checked():
        got = module.kernel(**x)
    errors = PROBLEM.compare(got, PROBLEM.reference(**x))
    assert all(e.ok for e in errors), [e.reason for e in errors if not e.ok]
