"""tools/probe_kda_host.py, the H200 probe of where a chunked KDA call's host time goes: its report on the CPU
interpreter (--smoke: every section that needs no GPU, the replica of the family's call checked against the call
itself), its copy of Triton 3.6's descriptor argument conversion checked against Triton's own, and its launch of a
compiled kernel (the launcher called whole, as host.py does, or taken apart) checked against Triton's launcher."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from types import SimpleNamespace

import pytest
import torch

TOOL = Path(__file__).resolve().parents[1] / "tools" / "probe_kda_host.py"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("probe_kda_host", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help_exits_cleanly(tool, capsys):
    with pytest.raises(SystemExit) as exit_info:
        tool.main(["--help"])
    assert exit_info.value.code == 0 and "--smoke" in capsys.readouterr().out


def test_smoke_run_times_the_steps_and_writes_the_report(tool, tmp_path, capsys):
    assert tool.main([str(tmp_path), "--smoke", "--calls", "4", "--burst", "2", "--profile-calls", "2",
                      "--micro-reps", "10"]) == 0
    report = json.loads((tmp_path / "probe_kda_host.json").read_text())
    assert (tmp_path / "kda_candidate.py").exists() and report["case"] == "B1 T32 H1 K16 V16 +hT"
    assert report["key_replica_matches"] and report["replica_matches"]["equal"]
    # the CPU interpreter's Triton path: four launches, each timed whole (nothing compiled to take apart)
    launches = [entry["name"] for entry in report["plan"]["launches"]]
    assert launches == ["launch0:_kda_rows_kernel", "launch1:_kda_solve_kernel", "launch2:_kda_scan_kernel",
                        "launch3:_kda_out_kernel"]
    assert set(report["skipped"]) == {"launch_breakdown", "direct"} and "launcher_apart" not in report
    whole = report["whole"]
    assert whole["n"] == 4 and 0 < whole["median_us"] <= whole["p90_us"]
    steps = report["steps"]
    assert "flags_zero" not in steps  # the host zeroes no flags between calls
    for name in ["stream", "key", "plan_lookup", "empty_o", "empty_final", "desc_base_set",
                 *(f"{n}/total" for n in launches)]:
        assert steps[name]["n"] == 4 and steps[name]["median_us"] > 0, name
    # the launches are nearly all of a call on the interpreter: the pieces add up to the replica's total
    parts = sum(steps[name]["median_us"] for name in steps if name != "total" and name.count("/") <= 1
                and (name.endswith("/total") or "/" not in name))
    assert 0.8 * steps["total"]["median_us"] < parts < 1.2 * steps["total"]["median_us"]
    wrapped = report["wrapped"]
    assert all(wrapped[name]["n"] == 4 for name in launches) and wrapped["whole"]["n"] == 4
    assert report["micro_us"]["stream + key (replica of kernel's)"] > 0 and report["micro_us"]["plan cache get"] > 0
    profile = (tmp_path / "cprofile.txt").read_text()
    assert "kda_candidate.py" in profile and "(kernel)" in profile
    assert report["cprofile"]["top_by_own_time"]
    out = capsys.readouterr().out
    assert "whole kernel(**inputs)" in out and out.rstrip().endswith("cprofile.txt")


def test_argument_conversion_matches_tritons(tool):
    """The probe times Triton's per-launch descriptor conversion through its own copy of wrap_handle_tensordesc's
    loop (over the closure it finds on the launcher): on the same arguments it must hand the C launcher exactly
    what Triton's does. Without TMA metadata (no GPU here) a descriptor expands to base, shape and strides."""
    from triton.backends.nvidia.driver import make_tensordesc_arg, wrap_handle_tensordesc
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    signature = {"a_desc": "tensordesc<bf16[32, 64]>", "n": "i32", "x_ptr": "*fp32", "BLOCK": "constexpr",
                 "b_desc": "tensordesc<bf16[16, 64]>"}
    seen = []
    inner = wrap_handle_tensordesc(lambda *args: seen.append(args), signature, None)
    c_launch, indices, meta = tool.launcher_parts(inner)
    assert indices == {0, 4} and meta == [None, None]
    a, b = torch.zeros(64, 64, dtype=torch.bfloat16), torch.zeros(32, 128, dtype=torch.bfloat16)
    layout = gl.NVMMASharedLayout.get_default_for([32, 64], gl.bfloat16)
    args = [TensorDescriptor.from_tensor(a, [32, 64], layout), 7, torch.zeros(4), 64,
            TensorDescriptor(b, [32, 64], [128, 1], [16, 64], layout)]
    head = list(range(13))
    inner(*head, *args)
    timings = []
    ours = head + tool.convert_args(args, indices, meta, make_tensordesc_arg, timings, list(signature))
    c_launch(*ours)
    assert len(seen) == 2 and len(seen[0]) == len(seen[1]) == 13 + 2 * 10 + 3
    assert all(x is y or x == y for x, y in zip(*seen))
    assert [name for name, _ in timings] == ["desc a_desc", "desc b_desc"]
    # a launcher without descriptor arguments is the C function itself
    plain = wrap_handle_tensordesc(print, {"n": "i32"}, None)
    assert tool.launcher_parts(plain) == (print, frozenset(), [])


def test_launch_whole_and_apart_hand_the_c_launcher_the_same(tool):
    """A compiled launch as host.py holds it (``kernel`` = (run, function, packed_metadata), a per-call tensor slot,
    a descriptor): the probe's launcher called whole goes through Triton's own CudaLauncher.__call__ (on a stub
    instance), taken apart through the probe's copy of it; both must hand the C launcher the same arguments."""
    from triton.backends.nvidia.driver import CudaLauncher, wrap_handle_tensordesc
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    seen = []
    signature = {"a_desc": "tensordesc<bf16[32, 64]>", "x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32"}
    run = CudaLauncher.__new__(CudaLauncher)  # no compiled launcher: the C function records its arguments
    run.launch = wrap_handle_tensordesc(lambda *args: seen.append(args), signature, None)
    run.num_ctas, run.launch_cooperative_grid, run.launch_pdl = 1, False, False
    run.global_scratch_size = run.profile_scratch_size = 0
    run.global_scratch_align = run.profile_scratch_align = 1
    layout = gl.NVMMASharedLayout.get_default_for([32, 64], gl.bfloat16)
    desc = TensorDescriptor.from_tensor(torch.zeros(64, 64, dtype=torch.bfloat16), [32, 64], layout)
    launch = SimpleNamespace(fn=SimpleNamespace(arg_names=list(signature)), kernel=(run, "function", "packed"),
                             grid=(3, 2, 1), args=[desc, None, 0x1000, 5], slots=[(1, "x")])
    parts = tool.Parts(launch)
    x, acc = torch.zeros(4), tool.Samples()
    parts.run({"x": x}, 77, acc, "L", apart=False)
    parts.run({"x": x}, 77, acc, "L", apart=True)
    assert len(seen) == 2 and len(seen[0]) == len(seen[1]) == 13 + 10 + 3
    assert all(a is b or a == b for a, b in zip(*seen))
    assert seen[0][:13] == (3, 2, 1, 77, "function", False, False, None, None, "packed", None, None, None)
    assert seen[0][23] is x and seen[0][24] == 0x1000 and launch.args[1] is None  # the slot filled, then cleared
    assert list(acc) == ["L/total", "L/slots", "L/run", "L/scratch", "L/convert_args", "L/convert_args/desc a_desc",
                         "L/c_launch"]
    assert all(len(v) == (2 if k in ("L/total", "L/slots") else 1) for k, v in acc.items())
