"""tools/probe_kda_host.py, the H200 probe of where a chunked KDA call's host time goes: its report on the CPU
interpreter (--smoke: every section that needs no GPU, the replica of the family's call checked against the call
itself), and its copy of Triton 3.6's descriptor argument conversion checked against Triton's own."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

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
    assert set(report["skipped"]) == {"launch_breakdown", "direct"}
    whole = report["whole"]
    assert whole["n"] == 4 and 0 < whole["median_us"] <= whole["p90_us"]
    steps = report["steps"]
    for name in ["key", "plan_lookup", "empty_o", "empty_final", "desc_base_set", *(f"{n}/total" for n in launches)]:
        assert steps[name]["n"] == 4 and steps[name]["median_us"] > 0, name
    # the launches are nearly all of a call on the interpreter: the pieces add up to the replica's total
    parts = sum(steps[name]["median_us"] for name in steps if name != "total" and name.count("/") <= 1
                and (name.endswith("/total") or "/" not in name))
    assert 0.8 * steps["total"]["median_us"] < parts < 1.2 * steps["total"]["median_us"]
    wrapped = report["wrapped"]
    assert all(wrapped[name]["n"] == 4 for name in launches) and wrapped["whole"]["n"] == 4
    assert report["micro_us"]["key (replica of kernel's)"] > 0
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
