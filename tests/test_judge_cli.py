"""The judge's two front doors: ``kopt eval`` and ``pytest --kopt-problem/--kopt-candidate``.
Exit status 0 only on a pass; the result JSON and pytest-benchmark JSON are written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import judge_toy_problem
from pytest_kopt.cli import main

TESTS = Path(__file__).resolve().parent
HOSTILE = TESTS / "hostile"
TOY_REF = "judge_toy_problem:AXPY"  # module:attribute, importable because tests/ is on sys.path


def test_kopt_eval_passes_an_honest_candidate_and_saves_both_jsons(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    out, bench = tmp_path / "result.json", tmp_path / "bench.json"
    trace = tmp_path / "trace.log"
    monkeypatch.setenv("KOPT_JUDGE_TRACE", str(trace))
    code = main(["eval", "--problem", TOY_REF, str(HOSTILE / "good_axpy.py"), "--quick", "--upto", "benchmark",
                 "--json", str(out), "--benchmark-json", str(bench)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert printed.startswith("PASS at benchmark  judge-toy-axpy")
    result = json.loads(out.read_text())
    assert result["verdict"] == "pass" and result["problem"] == judge_toy_problem.AXPY.name
    assert result["timings"]["candidate_us"] > 0
    saved = json.loads(bench.read_text())
    assert {"machine_info", "commit_info", "benchmarks", "datetime", "version"} <= set(saved)
    names = [b["name"] for b in saved["benchmarks"]]
    assert {n.split("[")[0] for n in names} == {"candidate", "torch-eager", "reference"}
    assert "candidate[eager]" in names  # every figure is named by its timer mode
    candidate = saved["benchmarks"][0]
    assert candidate["stats"]["median"] * 1e6 == pytest.approx(result["timings"]["candidate_us"])
    assert len(candidate["stats"]["data"]) == candidate["stats"]["rounds"] >= 2
    # KOPT_JUDGE_TRACE: a line per stage, checked call and timed case, in order
    lines = trace.read_text().splitlines()
    stages = [line.split("] stage ")[1] for line in lines if "] stage " in line]
    assert stages == ["compile", "correctness", "benchmark"], lines
    assert f"evaluation of candidate {result['candidate_id']}" in lines[0]
    assert any("] timed " in line for line in lines) and any("] checked call " in line for line in lines)


@pytest.fixture(scope="module")
def quick_profile() -> dict:
    """One quick evaluation up to the profile, read by two tests."""
    from pytest_kopt.judge import evaluate

    return evaluate(TOY_REF, HOSTILE / "good_axpy.py", quick=True, upto="profile")


def test_quick_mode_stops_before_the_profile_unless_the_profile_is_asked_for(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                               quick_profile: dict) -> None:
    """The loop's profile calls judge in quick mode with upto="profile": they must get a profile
    (quick trims shapes and rounds, not stages); ``kopt eval --quick`` alone stops at benchmark."""
    asked = quick_profile
    assert asked["verdict"] == "pass" and asked["stage"] == "profile" and asked["profile"]["kernels"]
    out = tmp_path / "quick.json"
    assert main(["eval", "--problem", TOY_REF, str(HOSTILE / "good_axpy.py"), "--quick", "--json", str(out)]) == 0
    default = json.loads(out.read_text())
    assert default["stage"] == "benchmark" and default["profile"] is None


def test_the_result_says_where_the_childs_time_went(quick_profile: dict) -> None:
    """Per stage and per kind of work, so a slow loop can be read off its evals (session 4: ~30 s
    per judge call on the H200 with no breakdown)."""
    result = quick_profile
    seconds = result["seconds"]
    stages = {key for key in seconds if key.startswith("stage:")}
    assert stages == {"stage:compile", "stage:correctness", "stage:benchmark", "stage:profile"}
    for part in ("inputs", "reference", "checked_calls", "hypothesis", "timing:candidate", "timing:baselines"):
        assert seconds[part] > 0, part
    assert sum(seconds[s] for s in stages) <= result["child_duration_s"] + 1e-3
    assert seconds["timing:candidate"] + seconds["timing:baselines"] <= seconds["stage:benchmark"] + 1e-3


def test_a_file_that_passed_the_sweep_can_be_judged_on_its_explicit_cases_alone() -> None:
    """hypothesis=False leaves out only the random shapes: the explicit cases still run, and a
    candidate that is wrong on them still fails."""
    from pytest_kopt.judge import evaluate

    swept = evaluate(TOY_REF, HOSTILE / "good_axpy.py", quick=True, upto="correctness")
    assert swept["verdict"] == "pass" and swept["correctness"]["hypothesis_examples"] > 0
    assert "hypothesis" in swept["seconds"]
    unswept = evaluate(TOY_REF, HOSTILE / "good_axpy.py", quick=True, upto="correctness", hypothesis=False)
    assert unswept["verdict"] == "pass" and unswept["correctness"]["hypothesis_examples"] == 0
    assert unswept["correctness"]["hypothesis_skipped"] and "hypothesis" not in unswept["seconds"]
    assert unswept["correctness"]["explicit_cases"] == swept["correctness"]["explicit_cases"]
    wrong = evaluate(TOY_REF, HOSTILE / "returns_nan.py", quick=True, upto="correctness", hypothesis=False)
    assert wrong["verdict"] == "fail" and wrong["stage"] == "correctness"


def test_several_timed_cases_give_geometric_means_and_keep_each_case() -> None:
    from pytest_kopt.judge import evaluate

    result = evaluate("judge_toy_problem:AXPY_TWO", HOSTILE / "good_axpy.py", quick=True, upto="benchmark")
    assert result["verdict"] == "pass", result["reasons"]
    timings = result["timings"]
    cases = timings["cases"]
    assert [c["case"] for c in cases] == ["B2 N100", "B1 N700"] and timings["case"] == "geomean of B2 N100 | B1 N700"
    product = cases[0]["candidate_us"] * cases[1]["candidate_us"]
    assert timings["candidate_us"] == pytest.approx(product ** 0.5)
    eager = (cases[0]["baselines"]["torch-eager"] * cases[1]["baselines"]["torch-eager"]) ** 0.5
    assert timings["baselines"]["torch-eager"] == pytest.approx(eager)
    assert result["speedup"] == pytest.approx(eager / timings["candidate_us"])
    assert len(result["roofline"]["cases"]) == 2
    assert {b["extra_info"]["case"]["N"] for b in result["benchmarks"]} == {100, 700}  # every case timed and saved


def test_kopt_eval_fails_with_the_reason_and_exit_status_1(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "result.json"
    code = main(["eval", "--problem", "kda", str(HOSTILE / "calls_reference.py"), "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 1
    assert "FAIL at policy" in printed and "kernels.reference.kda" in printed
    result = json.loads(out.read_text())
    assert (result["verdict"], result["stage"]) == ("fail", "policy")
    assert result["candidate"].endswith("calls_reference.py") and len(result["candidate_id"]) == 12


def test_unknown_problem_is_a_failure_not_a_crash(capsys: pytest.CaptureFixture) -> None:
    assert main(["eval", "--problem", "no-such-problem", str(HOSTILE / "good_axpy.py")]) == 1
    assert "unknown problem 'no-such-problem'" in capsys.readouterr().out


def _pytest(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_pytest_route_items_per_stage_and_pytest_benchmark_json(tmp_path: Path) -> None:
    bench, out = tmp_path / "bench.json", tmp_path / "result.json"
    run = _pytest(f"--kopt-problem={TOY_REF}", f"--kopt-candidate={HOSTILE / 'good_axpy.py'}", "--kopt-quick",
                  f"--kopt-json={out}", f"--benchmark-json={bench}", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    for stage in ("policy", "compile", "correctness", "benchmark"):
        assert f"PASSED ::kopt[{TOY_REF}:good_axpy.py]::{stage}" in run.stdout, run.stdout
    assert "4 passed" in run.stdout and "kopt judge" in run.stdout
    assert json.loads(out.read_text())["verdict"] == "pass"
    names = [b["name"] for b in json.loads(bench.read_text())["benchmarks"]]
    assert {n.split("[")[0] for n in names} == {"candidate", "torch-eager", "reference"} and "candidate[eager]" in names


def test_pytest_route_fails_at_the_stage_and_skips_the_rest(tmp_path: Path) -> None:
    run = _pytest("--kopt-problem=kda", f"--kopt-candidate={HOSTILE / 'forbidden_import.py'}", cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "policy failed" in run.stdout and "third-party kernel libraries" in run.stdout
    assert "1 failed, 4 skipped" in run.stdout, run.stdout


def test_the_loops_cheaper_evaluations_leave_out_the_baselines_or_the_timing(tmp_path: Path) -> None:
    """``baselines=False``: the candidate timed, the baselines and the reference not (the loop timed
    them when its run started); ``timing=False`` with ``upto="profile"``: a profile, no timing."""
    from pytest_kopt.judge import evaluate

    timed = evaluate(TOY_REF, HOSTILE / "good_axpy.py", quick=True, upto="benchmark", baselines=False)
    assert timed["verdict"] == "pass" and timed["timings"]["candidate_us"] > 0
    assert timed["timings"]["baselines"] == {} and timed["timings"]["reference_us"] is None and timed["speedup"] is None
    assert {b["name"].split("[")[0] for b in timed["benchmarks"]} == {"candidate"}
    assert any("baselines not timed" in n for n in timed["notes"])
    profiled = evaluate(TOY_REF, HOSTILE / "good_axpy.py", quick=True, upto="profile", timing=False, hypothesis=False)
    assert profiled["verdict"] == "pass" and profiled["stage"] == "profile"
    assert profiled["timings"] is None and profiled["profile"]["kernels"]
    assert "stage:benchmark" not in profiled["seconds"]


def test_the_warmers_compile_ahead_every_shape_the_correctness_stage_then_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """KOPT_WARM_WORKERS (on by default on a GPU only): the runner's warmers call the candidate on
    the explicit cases and on the sweep's shapes, planned by a dry run of the sweep with its secret
    seed, before the checked calls; the verdict still comes from the checked calls alone."""
    from pytest_kopt.judge import evaluate

    trace = tmp_path / "trace.log"
    monkeypatch.setenv("KOPT_WARM_WORKERS", "2")
    monkeypatch.setenv("KOPT_JUDGE_TRACE", str(trace))
    result = evaluate(TOY_REF, HOSTILE / "good_axpy.py", quick=True, upto="correctness")
    assert result["verdict"] == "pass", result["reasons"]
    warm = result["warm"]
    assert warm["workers"] == 2 and warm["failed"] == 0
    checked = [line.split("] checked call ")[1].split(":")[0] for line in trace.read_text().splitlines() if "] checked call " in line]
    swept = checked[-result["correctness"]["hypothesis_examples"]:]
    assert swept and set(swept) <= set(warm["shapes"])  # the dry run planned the shapes the sweep drew
    # a candidate wrong past N = 128 still fails on its checked calls: warming judged nothing
    wrong = evaluate(TOY_REF, HOSTILE / "small_shapes_only.py", quick=True, upto="correctness", seed=5)
    assert wrong["verdict"] == "fail" and wrong["stage"] == "correctness", wrong["reasons"]
    assert wrong["warm"]["failed"] == 0  # its warm calls raised nothing: they are not checked
    # a malformed setting is said, not a traceback (on the CPU the default is no warmers)
    monkeypatch.setenv("KOPT_WARM_WORKERS", "four")
    told = evaluate(TOY_REF, HOSTILE / "good_axpy.py", quick=True, upto="correctness")
    assert told["verdict"] == "pass" and "warm" not in told
    assert any("KOPT_WARM_WORKERS='four' is not a whole number" in n for n in told["notes"])



def test_a_family_folder_is_judged_as_its_rendered_defaults(tmp_path: Path) -> None:
    """``kopt eval`` on a family folder judges the one-file candidate its defaults render to; a folder that is not a
    family is refused with a message, never judged."""
    from pytest_kopt.families import load_family
    from pytest_kopt.judge import candidate_id
    from pytest_kopt.judge.cli import candidate_file

    family = load_family("mla_paged")
    rendered = Path(candidate_file(str(family.path), tmp_path))
    assert rendered.parent == tmp_path and rendered.read_text() == family.render({})
    assert candidate_file(str(HOSTILE / "good_axpy.py"), tmp_path) == str(HOSTILE / "good_axpy.py")
    (tmp_path / "plain").mkdir()
    with pytest.raises(SystemExit, match="not a family"):
        candidate_file(str(tmp_path / "plain"), tmp_path)
    out = tmp_path / "result.json"
    assert main(["eval", "--problem", "mla-paged", str(family.path), "--quick", "--upto", "compile", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["candidate"].startswith(str(family.path)) and result["candidate_id"] == candidate_id(family.render({}))
