"""The loop end to end through pytest: ``pytest --kopt-optimize=P --kopt-budget=N``.

Two worlds: the fake judge and problem of kopt_fake_run.py (swapped in through a conftest, as a
user would), and the real judge on the CPU interpreter with the kda problem.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from kopt_fake_run import FakeJudge, FakeProblem

from pytest_kopt import REPO_ROOT
from pytest_kopt.events import read_events
from pytest_kopt.run import Run, RunOptions

TESTS = Path(__file__).resolve().parent

CONFTEST = f'''
import sys
sys.path.insert(0, {str(TESTS)!r})
import pytest
from kopt_fake_run import FakeJudge, FakeProblem


@pytest.fixture(scope="session")
def kopt_problem(tmp_path_factory):
    return FakeProblem(tmp_path_factory.mktemp("fake"), broken=True)


@pytest.fixture(scope="session")
def kopt_evaluate():
    return FakeJudge()
'''


def pytest_run(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd, capture_output=True, text=True, timeout=timeout,
    )


def test_pytest_command_runs_resumes_and_refuses(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    run_dir = tmp_path / "run"
    done = pytest_run(tmp_path, "--kopt-optimize=fake", "--kopt-budget=10", f"--kopt-run-dir={run_dir}", "--kopt-seed=3")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    # one line per tool call, shown although pytest captures output, then the summary table
    for n in range(1, 11):
        assert f"[{n:>2}/10] " in out
    assert "timing the baseline candidate" in out and "kopt optimize" in out and "best:" in out
    events = read_events(run_dir / "events.jsonl")
    started = events[0]
    assert started["kind"] == "run_started" and started["seed"] == 3 and started["agent"] == "search"
    assert started["objective"]["baseline_us"] == 956.0 and set(started["environment"]) >= {"gpu", "driver", "torch", "triton", "python", "commit"}
    assert events[-1]["kind"] == "run_finished" and events[-1]["budget_used"] == 10
    best = json.loads((run_dir / "best.json").read_text())
    assert best["candidate_id"] == events[-1]["best"]["candidate_id"] and best["evaluation"]["verdict"] == "pass"
    assert not (run_dir / "lock").exists()

    again = pytest_run(tmp_path, "--kopt-optimize=fake", f"--kopt-run-dir={run_dir}")
    assert again.returncode == 4 and "--kopt-resume" in again.stderr

    # the hint the run printed is a command that works as typed: here, 4 calls more
    (hint,) = [line for line in out.splitlines() if line.startswith("continue: ")]
    assert hint.endswith(" --kopt-budget=+N")
    command = shlex.split(hint[len("continue: "):].replace("--kopt-budget=+N", "--kopt-budget=+4"))
    more = subprocess.run([*command, "-p", "no:cacheprovider"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert more.returncode == 0, more.stdout + more.stderr
    assert "resumed run" in more.stdout and "[14/14] " in more.stdout
    events = read_events(run_dir / "events.jsonl")
    resumed = next(e for e in events if e["kind"] == "run_resumed")
    assert resumed["budget_used"] == 10 and resumed["seed"] == 3 and resumed["agent"] == "search"
    assert events[-1]["kind"] == "run_finished" and events[-1]["budget_used"] == 14
    # every change of best beat the one before by the objective's min_gain (the default, 1 %)
    assert events[0]["objective"]["min_gain"] == 0.01
    bests = [e["candidate_us"] for e in events if e["kind"] == "best"]
    assert len(bests) >= 2 and all(new < old * 0.99 for old, new in zip(bests, bests[1:]))


@pytest.mark.parametrize("value", ["1.5", "-0.1", "one percent"])
def test_a_bad_min_gain_is_a_usage_error(tmp_path, value):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    done = pytest_run(tmp_path, "--kopt-optimize=fake", f"--kopt-min-gain={value}", f"--kopt-run-dir={tmp_path / 'run'}")
    assert done.returncode == 4 and "--kopt-min-gain must be" in done.stderr
    assert not (tmp_path / "run" / "events.jsonl").exists()


def test_a_conftest_agent_replaces_the_search_agent(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST + textwrap.dedent('''
        from pytest_kopt.agents.base import Agent


        class Reader(Agent):
            name = "reader"

            def restore(self, events):
                self.done = False

            def act(self, tools):
                if self.done:
                    return False
                tools.call("show_problem")
                self.done = True
                return True


        @pytest.fixture
        def kopt_agent():
            return Reader()
    '''))
    done = pytest_run(tmp_path, "--kopt-optimize=fake", "--kopt-budget=5", f"--kopt-run-dir={tmp_path / 'run'}")
    assert done.returncode == 0, done.stdout + done.stderr  # the baseline is verified, so a best exists
    events = read_events(tmp_path / "run" / "events.jsonl")
    assert [e["tool"] for e in events if e["kind"] == "tool_call"] == ["show_problem"]
    assert "nothing left to try" in events[-1]["reason"]


def test_promote_copies_the_best_and_a_run_without_a_verified_best_fails(tmp_path):
    problem = FakeProblem(tmp_path / "p")
    options = RunOptions(problem="fake", budget=12, run_dir=tmp_path / "run", promote=True)
    from pytest_kopt.agents.search import SearchAgent

    with Run(options, problem=problem, evaluate=FakeJudge(), promote_dir=tmp_path / "best") as run:
        outcome = run.execute(SearchAgent(problem=problem, profile=False))
    assert outcome.ok and outcome.promoted == tmp_path / "best" / "fake.py"
    assert outcome.promoted.read_text() == (tmp_path / "run" / "best.py").read_text()

    class StopsAfter(SearchAgent):  # Ctrl-C (a device job's time limit) after ten tool calls
        def act(self, tools):
            if tools.budget_used >= 10:
                raise KeyboardInterrupt
            return super().act(tools)

    options = RunOptions(problem="fake", budget=40, run_dir=tmp_path / "stopped", promote=True)
    with pytest.raises(KeyboardInterrupt):
        with Run(options, problem=problem, evaluate=FakeJudge(), promote_dir=tmp_path / "best3") as run:
            run.execute(StopsAfter(problem=problem, profile=False))
    assert run.outcome.status == "interrupted" and run.outcome.promoted == tmp_path / "best3" / "fake.py"
    assert run.outcome.promoted.read_text() == (tmp_path / "stopped" / "best.py").read_text()

    def failing(*args, **kwargs):
        return {"verdict": "fail", "stage": "correctness", "reasons": ["wrong"]}

    options = RunOptions(problem="fake", budget=6, run_dir=tmp_path / "bad", promote=True)
    with Run(options, problem=problem, evaluate=failing, promote_dir=tmp_path / "best2") as run:
        outcome = run.execute(SearchAgent(problem=problem, profile=False))
    assert outcome.status == "finished" and outcome.best is None and not outcome.ok
    assert run.tools.objective["baseline_us"] is None and not (tmp_path / "bad" / "best.py").exists()
    assert not (tmp_path / "best2").exists()


def test_resume_refuses_a_run_whose_objective_was_timed_on_other_cases(tmp_path):
    """Goal conditioning: the objective fixed at the start (here timed on "fake B1") must be what
    a resumed run is timed on; a problem that now times other cases needs a new run."""
    from pytest_kopt.agents.search import SearchAgent
    from pytest_kopt.run import RunError

    problem = FakeProblem(tmp_path / "p")
    problem.timed_label = lambda device: "fake B1"
    with Run(RunOptions(problem="fake", budget=4, run_dir=tmp_path / "run"), problem=problem, evaluate=FakeJudge()) as run:
        run.execute(SearchAgent(problem=problem, profile=False))
    resume = RunOptions(problem="fake", budget=8, run_dir=tmp_path / "run", resume=True)
    with Run(resume, problem=problem, evaluate=FakeJudge()) as run:  # same objective: resumes
        assert run.execute(SearchAgent(problem=problem, profile=False)).budget_used == 8
    problem.timed_label = lambda device: "geomean of fake B1 | fake B64"
    with pytest.raises(RunError, match="start a new run"):
        Run(RunOptions(problem="fake", budget=12, run_dir=tmp_path / "run", resume=True), problem=problem, evaluate=FakeJudge()).__enter__()
    # ... unless no call is left to time: then it resumes anywhere (to retract, promote or report)
    with Run(RunOptions(problem="fake", budget=8, run_dir=tmp_path / "run", resume=True), problem=problem, evaluate=FakeJudge()) as run:
        assert run.execute(SearchAgent(problem=problem, profile=False)).budget_used == 8
    # the refusal released the run's lock (else RunLocked here), and a problem object without
    # timed_label (not a Problem subclass) is not checked
    with Run(resume, problem=FakeProblem(tmp_path / "p"), evaluate=FakeJudge()) as run:
        assert run.resumed


def test_main_command_with_the_real_judge_on_the_interpreter(tmp_path):
    """``pytest --kopt-optimize=kda --kopt-budget=N`` as the README runs it (tiny budget: each
    judge evaluation on the CPU interpreter takes tens of seconds)."""
    run_dir = tmp_path / "run"
    done = pytest_run(REPO_ROOT, "--kopt-optimize=kda", "--kopt-budget=4", f"--kopt-run-dir={run_dir}", timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    events = read_events(run_dir / "events.jsonl")
    objective = events[0]["objective"]
    assert objective["problem"] == "kda" and objective["baseline_verdict"] == "pass" and objective["baseline_us"] > 0
    assert [e["tool"] for e in events if e["kind"] == "tool_result"][:3] == ["write_candidate", "run_tests", "benchmark"]
    best = json.loads((run_dir / "best.json").read_text())
    assert best["candidate_id"] == objective["baseline_candidate"] or best["vs_baseline"] >= 1.0
    assert best["evaluation"]["timings"]["candidate_us"] > 0
    assert (run_dir / "best.py").read_text() == (run_dir / "candidates" / f"{best['candidate_id']}.py").read_text()
    assert not (run_dir / "lock").exists()
    # committable: sources, results and the log only
    assert {p.name for p in run_dir.iterdir()} <= {"events.jsonl", "candidates", "evals", "best.py", "best.json"}


FLAKY_AGENT = '''
from pytest_kopt.agents.base import Agent


class Offline(RuntimeError):
    resumable = {resumable}


class Flaky(Agent):
    name = "flaky"

    def restore(self, events):
        pass

    def act(self, tools):
        tools.call("show_problem")
        raise Offline("the endpoint is down\\nfor now")


@pytest.fixture
def kopt_agent():
    return Flaky()
'''


@pytest.mark.parametrize("resumable", [True, False])
def test_a_resumable_agent_error_fails_in_one_line(tmp_path, resumable):
    (tmp_path / "conftest.py").write_text(CONFTEST + FLAKY_AGENT.format(resumable=resumable))
    run_dir = tmp_path / "run"
    done = pytest_run(tmp_path, "--kopt-optimize=fake", "--kopt-budget=5", f"--kopt-run-dir={run_dir}")
    assert done.returncode == 1, done.stdout + done.stderr
    end = read_events(run_dir / "events.jsonl")[-1]
    assert end["kind"] == "run_interrupted" and end["reason"] == "Offline: the endpoint is down\nfor now" and end["budget_used"] == 1
    hint = f"the endpoint is down for now; continue with: {shlex.quote(sys.executable)} -m pytest --kopt-optimize=fake --kopt-resume --kopt-run-dir={run_dir}"
    if resumable:  # the message alone, no traceback
        assert hint in done.stdout and "raise Offline" not in done.stdout and "another exception occurred" not in done.stdout
    else:  # any other error keeps its traceback
        assert hint not in done.stdout and "raise Offline" in done.stdout
