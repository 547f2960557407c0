"""The Ray executor (``--kopt-executor=ray``) on a local Ray instance: the same accounting as the local
workers, and the judge's supervisor/runner isolation inside a task.

Ray is the optional extra ``ray``; ``make test`` installs it. Without it these tests are skipped with
that reason (never silently).
"""

from __future__ import annotations

from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]' (make test installs it) to run the Ray executor's tests")

from kopt_fake_run import FakeProblem  # noqa: E402
from test_parallel import check_accounting, max_in_flight, run_loop  # noqa: E402

from pytest_kopt import events as ev  # noqa: E402
from pytest_kopt.executor import RayExecutor  # noqa: E402

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module, started (and stopped) by the executor itself."""
    executor = RayExecutor(2)
    assert executor.started_here and executor.num_gpus == 0
    yield executor
    executor.close()
    assert not ray.is_initialized()


def test_a_run_on_ray_accounts_for_the_budget_as_local_workers_do(tmp_path, local_ray):
    events = run_loop(tmp_path / "run", workers=2, budget=24, executor="ray")
    check_accounting(tmp_path / "run", 24)
    started = events[0]
    assert started["workers"] == 2 and started["executor"]["executor"] == "ray" and started["executor"]["num_gpus_per_task"] == 0
    assert 1 < max_in_flight(events) <= 2
    verdicts = [e for e in events if e["kind"] == ev.VERDICT and e["call"]]
    assert verdicts and all(v["placement"]["executor"] == "ray" and v["placement"]["worker"]["host"] for v in verdicts)
    assert all(v["placement"]["device"] == "cpu" for v in verdicts)  # CPU tasks share the cores: overlaps are contended


def test_the_judge_keeps_its_isolation_inside_a_ray_task(tmp_path, local_ray):
    """A Ray task calls the real judge: its supervisor decides, its runner (another process, isolated as this
    machine allows) imports the candidate; the problem, registered only here, is found by the task too."""
    import judge_toy_problem  # registers judge-toy-axpy in this process only

    from pytest_kopt.judge import evaluate

    local_ray.problem_modules[judge_toy_problem.AXPY.name] = "judge_toy_problem"
    good = TESTS / "hostile" / "good_axpy.py"
    result = local_ray.run(evaluate, judge_toy_problem.AXPY.name, str(good), upto="correctness", timeout_s=300, quick=True)
    assert result["verdict"] == "pass", result["reasons"]
    assert result["isolation"]["level"] in ("uid", "namespace", "process")
    assert result["worker"]["host"] and result["candidate"] == str(good)
    nan = local_ray.run(evaluate, judge_toy_problem.AXPY.name, str(TESTS / "hostile" / "returns_nan.py"), upto="correctness",
                        timeout_s=300, quick=True, hypothesis=False)
    assert nan["verdict"] == "fail" and nan["stage"] == "correctness"


def test_a_fake_problem_needs_no_shared_files(tmp_path, local_ray):
    """The task carries the candidate's and the incumbent's sources: it reads nothing of the run directory."""
    from kopt_fake_run import IncumbentJudge

    problem = FakeProblem(tmp_path / "p")
    result = local_ray.run(IncumbentJudge(), problem.name, str(problem.baseline_candidate_path), upto="benchmark",
                           incumbent=str(problem.baseline_candidate_path))
    assert result["verdict"] == "pass" and result["incumbent"]["ratio"]["median"] == pytest.approx(1.0)
    assert result["candidate"] == str(problem.baseline_candidate_path)
