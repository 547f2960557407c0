"""The chunked KDA family's host on a pretend Hopper GPU (capability 9.0, tensors that say ``is_cuda``), its
launches recorded instead of run: which kernels run where, with which grids and options, and that a call after
the first builds nothing (no plan, no descriptor) but writes its own tensors into the launches. What those kernels
compile to is tests/test_kda_gluon_prep.py's and test_kda_gluon_scan.py's; tools/compare_kda_ptx.py compares all
of it with the promoted kernel's."""

from __future__ import annotations

import types

import pytest
import torch
from test_kda_chunked import render

SMS = 8  # a small pretend GPU, so that small shapes take every decision the H200's 132 SMs take at fla's shapes


class FakeCuda(torch.Tensor):
    @property
    def is_cuda(self):
        return True


class Recorder:
    """Stands in for the family's ``_Launch``: what a plan would launch, and what each call hands it."""

    made: list["Recorder"] = []

    def __init__(self, fn, grid, args, options, roles, gpu):
        self.name, self.grid, self.args, self.options, self.roles, self.gpu = fn.__name__, grid, args, options, roles, gpu
        self.calls = []
        Recorder.made.append(self)

    def __call__(self, values, stream):
        call = {name: values[role] for name, role in self.roles.items()}
        call["stream"] = stream
        call.update({name: ("base", arg.base) for name, arg in self.args.items() if hasattr(arg, "block_shape")})
        self.calls.append(call)


@pytest.fixture()
def hopper(tmp_path, monkeypatch):
    module = render({}, tmp_path)
    Recorder.made = []
    monkeypatch.setattr(module, "_Launch", Recorder)
    capability = {"major": 9}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (capability["major"], 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: types.SimpleNamespace(multi_processor_count=SMS))
    stream = {"id": 7}
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=stream["id"]))
    module.capability, module.stream = capability, stream
    return module


def fake_inputs(B, T, H, K, V, dtype=torch.bfloat16, h0=False, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def mk(*shape, dt=dtype):
        return torch.Tensor._make_subclass(FakeCuda, torch.randn(*shape, generator=gen).to(dt))

    return dict(q=mk(B, T, H, K), k=mk(B, T, H, K), v=mk(B, T, H, V), g=-mk(B, T, H, K, dt=torch.float32).abs(),
                beta=mk(B, T, H), initial_state=mk(B, H, K, V, dt=torch.float32) if h0 else None,
                output_final_state=True)


TRITON_PATH = ["_kda_rows_kernel", "_kda_solve_kernel", "_kda_scan_kernel", "_kda_out_kernel"]


@pytest.mark.parametrize("shape, dtype, launches", [
    # the scan has at most SMS / 4 programs: it runs first, the preparation beside it (the headline on the H200)
    ((1, 64, 1, 128, 128), torch.bfloat16, ["_kda_scan_wgmma_ws", "_kda_prep_gluon"]),
    ((1, 64, 4, 128, 128), torch.bfloat16, ["_kda_prep_gluon", "_kda_scan_wgmma_ws"]),
    ((1, 64, 8, 128, 128), torch.bfloat16, ["_kda_prep_gluon", "_kda_scan_wgmma_ws"]),  # two warpgroups per scan program
    ((1, 40, 4, 64, 64), torch.bfloat16, ["_kda_prep_gluon", "_kda_scan_wgmma_ws"]),
    ((1, 40, 1, 32, 128), torch.bfloat16, ["_kda_scan_wgmma_ws", "_kda_prep_gluon"]),
    ((1, 40, 2, 256, 64), torch.bfloat16, TRITON_PATH),  # the Gluon scan holds K <= 128
    ((1, 40, 2, 32, 32), torch.bfloat16, TRITON_PATH),  # V not a multiple of 64
    ((1, 40, 2, 16, 64), torch.bfloat16, TRITON_PATH),
    ((1, 40, 2, 64, 64), torch.float32, TRITON_PATH),  # o in float32: not the scan's TMA store
])
def test_where_each_kernel_runs(hopper, shape, dtype, launches):
    hopper.kernel(**fake_inputs(*shape, dtype=dtype))
    made = next(reversed(hopper._PLANS.values())).launches  # in launch order
    assert [r.name for r in made] == launches and len(Recorder.made) == len(made)
    assert all(r.gpu for r in made) and all(len(r.calls) == 1 for r in made)
    B, T, H, K, V = shape
    NT, BH = -(-T // 32), B * H
    by_name = {r.name: r for r in made}
    if "_kda_prep_gluon" in by_name:
        prep, scan = by_name["_kda_prep_gluon"], by_name["_kda_scan_wgmma_ws"]
        beside = launches[0] == "_kda_scan_wgmma_ws"
        bv = 128 if V % 128 == 0 and BH * V // 64 > SMS else 64
        assert scan.grid == (V // bv, BH) and scan.options == {"num_warps": bv // 16}
        assert scan.args["BV"] == bv and scan.args["NS"] == 4 and scan.args["WAIT"] == beside
        assert prep.grid == ((BH, NT) if beside else (NT, BH)) and prep.args["FLAG"] == beside
        # uncapped at K 128 (two programs per SM), 168 registers below
        assert prep.options == {"num_warps": 4, "launch_pdl": beside, **({"maxnreg": 168} if K < 128 else {})}
        assert prep.args["WR"] == 128 // K and prep.args["LIMIT"] == 160.0 and prep.args["FLOOR"] == -30.0
        assert prep.args["flag_ptr"] is scan.args["flag_ptr"]  # the flags beside; else an unused stand-in
        assert (prep.args["flag_ptr"].dtype == torch.int32) == beside
        assert prep.args["q_desc"].block_shape == [1, 32, 1, K] and prep.args["v_desc"].block_shape == [1, 32, 1, V]
        assert scan.args["o_desc"].shape == [B, T, H * V] and scan.args["o_desc"].block_shape == [1, 32, bv]
    else:
        rows, solve, scan, out = made
        bk = min(64, K)
        assert rows.grid == (2 * NT, BH) and rows.args["BK"] == bk and rows.args["DKS"] == 8
        assert rows.options == {"num_warps": 8, "num_stages": 1, **({"maxnreg": 168} if bk == 16 else {})}
        assert solve.grid == (NT, BH) and solve.options == {"num_warps": 2, "num_stages": 1, "maxnreg": 168}
        assert scan.grid == (-(-V // min(16, V)), BH) and scan.options == {"num_warps": 2, "num_stages": 3}
        assert out.grid == (NT, -(-V // min(V, 64)), BH) and out.options == {"num_warps": 4, "num_stages": 2}


@pytest.mark.parametrize("beside_knob, shape, bv, beside", [
    ("quarter", (1, 64, 2, 128, 128), 64, False),  # four 64-wide programs: more than SMS / 4
    ("wide", (1, 64, 2, 128, 128), 128, True),  # two 128-wide programs: beside (B2 T16384 H16 on the H200)
    ("wide", (1, 64, 1, 128, 128), 64, True),  # beside at 64 already: unchanged
    ("wide", (1, 64, 3, 128, 128), 64, False),  # three 128-wide programs would still be more than SMS / 4
    ("wide", (1, 40, 4, 64, 64), 64, False),  # V 64: no 128-wide program
])
def test_the_beside_knob_picks_the_scan_width(hopper, tmp_path, monkeypatch, beside_knob, shape, bv, beside):
    module = render({"beside": beside_knob}, tmp_path)
    monkeypatch.setattr(module, "_Launch", Recorder)
    module.kernel(**fake_inputs(*shape))
    made = next(reversed(module._PLANS.values())).launches
    names = [r.name for r in made]
    assert names == (["_kda_scan_wgmma_ws", "_kda_prep_gluon"] if beside else ["_kda_prep_gluon", "_kda_scan_wgmma_ws"])
    scan, prep = made if beside else made[::-1]
    B, T, H, K, V = shape
    assert scan.grid == (V // bv, B * H) and scan.options == {"num_warps": bv // 16} and scan.args["BV"] == bv
    assert scan.args["WAIT"] == beside and prep.args["FLAG"] == beside and prep.options["launch_pdl"] == beside
    assert scan.args["ua_desc"].block_shape[-1] == bv and scan.args["o_desc"].block_shape == [1, 32, bv]


def test_other_gpus_and_misaligned_inputs_take_the_triton_path(hopper):
    x = fake_inputs(1, 64, 1, 128, 128)
    x["q"] = torch.Tensor._make_subclass(FakeCuda, torch.empty(1 * 64 * 128 + 4, dtype=torch.bfloat16)[4:].view(1, 64, 1, 128))
    hopper.kernel(**x)  # q 8 bytes off 16: no TMA descriptor takes it; the Gluon scan still does
    assert [r.name for r in next(reversed(hopper._PLANS.values())).launches] == TRITON_PATH[:2] + ["_kda_scan_wgmma_ws"]
    hopper.capability["major"] = 10
    hopper.kernel(**fake_inputs(1, 64, 1, 128, 128))
    assert [r.name for r in next(reversed(hopper._PLANS.values())).launches] == TRITON_PATH


def test_a_call_after_the_first_builds_nothing(hopper, monkeypatch):
    """The second call of a kind: no plan, no descriptor, no launch set up again; its own tensors in every
    argument slot and descriptor, fresh outputs, the caller's stream; the flags (and the generation behind them,
    which the GPU moves on) untouched by the host; another stream gets a plan of its own."""
    built = []
    real = hopper.GluonDescriptor

    def counted(*args, **kwargs):
        built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(hopper, "GluonDescriptor", counted)
    first = fake_inputs(1, 64, 1, 64, 64, h0=True, seed=1)
    o1, _ = hopper.kernel(**first)
    plan = next(iter(hopper._PLANS.values()))
    made, descriptors = list(plan.launches), len(built)
    assert [r.name for r in made] == ["_kda_scan_wgmma_ws", "_kda_prep_gluon"] and descriptors == 8
    assert plan.flags.shape == (2 * 1 + 2,) and not plan.flags.any()  # two chunks, the generation, the ticket
    plan.flags.fill_(5)
    second = fake_inputs(1, 64, 1, 64, 64, h0=True, seed=2)
    o, final = hopper.kernel(**second)
    assert Recorder.made == [made[1], made[0]] and len(built) == descriptors and len(hopper._PLANS) == 1
    assert (plan.flags == 5).all()
    assert all(r.calls[-1]["stream"] == 7 for r in made)
    scan, prep = made
    assert prep.calls[-1]["g_ptr"] is second["g"] and prep.calls[-1]["beta_ptr"] is second["beta"]
    assert prep.calls[-1]["scale"] == 64 ** -0.5
    assert scan.calls[-1]["h0_ptr"] is second["initial_state"] and scan.calls[-1]["ht_ptr"] is final
    for name, tensor in (("q_desc", second["q"]), ("k_desc", second["k"]), ("g_desc", second["g"]), ("v_desc", second["v"])):
        assert prep.calls[-1][name][1] is tensor, name
        assert prep.args[name].base is None  # let go of after the call
    assert scan.calls[-1]["o_desc"][1] is o and o is not o1 and o.data_ptr() != o1.data_ptr()
    hopper.stream["id"] = 8
    hopper.kernel(**second)
    assert len(hopper._PLANS) == 2 and len(Recorder.made) == 4
