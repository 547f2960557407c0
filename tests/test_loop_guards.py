"""What a user (or a hostile operator) trips on, each reproduced (issue 33): wins that are noise, a
promotion that loses a winner, a best event lost to a kill, budgets and metrics on resume, a full
disk or a read-only run directory, a misspelt problem, a run landing untracked in the repository,
and the set-up commands of the README and the Makefile.

The judge here is kopt_fake_run's ``IncumbentJudge``: it speaks the supervisor's interface
(``metric=``, ``incumbent=``, three figures, an interleaved ratio with its interval).
"""

from __future__ import annotations

import errno
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from kopt_fake_run import FAST, SLOW, FakeJudge, FakeProblem, IncumbentJudge

from pytest_kopt import REPO_ROOT
from pytest_kopt import run as run_module
from pytest_kopt.agents.memory import digest
from pytest_kopt.agents.search import SearchAgent
from pytest_kopt.events import EventLog, read_events
from pytest_kopt.families import parse_family
from pytest_kopt.progress import summary_lines
from pytest_kopt.run import DEFAULT_RESULTS_DIR, Run, RunError, RunOptions, RunStorageError, resolve
from pytest_kopt.runsummary import summarise
from pytest_kopt.tools import Toolbox, candidate_id

TESTS = Path(__file__).resolve().parent
ENVIRONMENT = {"gpu": None, "driver": None, "interpreter": True, "torch": "2.13.0", "triton": "3.6.0", "optuna": None,
               "python": "3.11", "platform": "test", "host": "test", "commit": "0123456789abcdef", "dirty": False}


def fast(**knobs) -> str:
    return parse_family(FAST, "fast").render(knobs)


X = fast(CHUNK=32, num_warps=4, fuse=True)  # 105 us on the fake judge's device time
Y = fast(CHUNK=32, num_warps=8, fuse=True)  # 93 us: faster by its time
Z = fast(CHUNK=32, num_warps=4, fuse=False)  # 112 us: slower by its time


@pytest.fixture(autouse=True)
def same_machine(monkeypatch):
    """Every run here is on a CPU, whatever machine runs the test."""
    monkeypatch.setattr(run_module, "environment", lambda: dict(ENVIRONMENT))


def toolbox(tmp_path: Path, judge, min_gain: float = 0.01) -> Toolbox:
    log = EventLog(tmp_path / "run" / "events.jsonl", "run")
    objective = {"problem": "fake", "baseline_us": 956.0, "min_gain": min_gain, "metric": "eager"}
    return Toolbox(FakeProblem(tmp_path / "problem"), objective, log, tmp_path / "run", 50, evaluate=judge)


def bench(tools: Toolbox, source: str) -> dict:
    cid = tools.call("write_candidate", source=source, strategy="fast")["candidate_id"]
    return tools.call("benchmark", candidate_id=cid)


# ---- a win has to be real --------------------------------------------------------------------
def test_a_candidate_becomes_best_only_when_its_interval_against_the_best_clears_min_gain(tmp_path):
    y, z = candidate_id(Y), candidate_id(Z)
    judge = IncumbentJudge(ratios={y: (1.02, 0.99, 1.05), z: (1.06, 1.04, 1.08)})
    tools = toolbox(tmp_path, judge)
    bench(tools, X)
    assert tools.best["candidate_id"] == candidate_id(X)
    assert judge.asked[-1]["incumbent"] is None and judge.asked[-1]["metric"] == "eager"  # nothing to beat yet
    # faster by 11 % on its own time, but timed beside the best the interval reaches below 1 + min_gain
    result = bench(tools, Y)
    assert judge.asked[-1]["incumbent"] == str((tmp_path / "run" / "candidates" / f"{candidate_id(X)}.py").resolve())
    assert result["incumbent"]["ratio"]["lo"] == 0.99 and tools.best["candidate_id"] == candidate_id(X)
    # slower by its own time (another moment, another figure), but beside the best it clears the bar
    bench(tools, Z)
    assert tools.best["candidate_id"] == z
    assert tools.best["ratio"] == {"incumbent": candidate_id(X), "metric": "eager", "median": 1.06, "lo": 1.04, "hi": 1.08, "rounds": 20}
    verdicts = [e for e in read_events(tools.log.path) if e["kind"] == "verdict"]
    assert verdicts[-1]["incumbent"]["candidate_id"] == candidate_id(X) and verdicts[-1]["figures"]["graph"] == 56.0
    assert verdicts[-1]["isolation"]["level"] == "process" and verdicts[-1]["metric"] == "eager"
    again = toolbox(tmp_path / "again", judge)
    again.restore(read_events(tools.log.path))
    assert again.best == tools.best  # the same rule folds the log on resume
    # the summary table shows the three figures and the interval
    outcome = run_module.Outcome("finished", "budget exhausted", tools.run_dir, tools.budget, tools.budget_used, tools.best)
    table = "\n".join(summary_lines(tools, outcome))
    assert "1.060x [1.040, 1.080]" in table and "eager*" in table and "56.0 us" in table


def test_tool_evaluations_leave_out_the_baselines_and_a_profile_after_a_timing_is_not_timed_again(tmp_path):
    """What made a loop's benchmark and profile calls slow on the H200 (fla, the reference and every
    case timed again in each): the baselines are timed once, when the run starts (the objective's
    ``baselines_us``); a profile of a candidate with an uncontended timing only profiles."""
    judge = IncumbentJudge()
    log = EventLog(tmp_path / "run" / "events.jsonl", "run")
    objective = {"problem": "fake", "baseline_us": 956.0, "min_gain": 0.01, "metric": "eager", "baselines_us": {"fla": 700.0}}
    tools = Toolbox(FakeProblem(tmp_path / "problem"), objective, log, tmp_path / "run", 50, evaluate=judge)
    first = bench(tools, X)
    assert judge.asked[-1]["baselines"] is False
    assert first["baselines_us"] == {"fla": 700.0} and first["speedup"] == pytest.approx(700.0 / first["candidate_us"])
    second = bench(tools, Y)  # beside the best: timed with the incumbent, still no baselines
    assert judge.asked[-1]["incumbent"] is not None and judge.asked[-1]["baselines"] is False
    best = dict(tools.best)
    profiled = tools.call("profile", candidate_id=second["candidate_id"])
    assert judge.asked[-1]["timing"] is False and judge.asked[-1]["incumbent"] is None and judge.asked[-1]["upto"] == "profile"
    assert profiled["verdict"] == "pass" and "candidate_us" not in profiled
    assert profiled["timed_before"]["candidate_us"] == second["candidate_us"]
    assert tools.best == best  # a profile without a timing changes nothing about the best
    verdict = [e for e in read_events(tools.log.path) if e["kind"] == "verdict"][-1]
    assert verdict["upto"] == "profile" and verdict["candidate_us"] is None
    # the untimed profile never answers a benchmark; the benchmark it followed does (no new evaluation)
    asked = len(judge.asked)
    again = tools.call("benchmark", candidate_id=second["candidate_id"])
    assert len(judge.asked) == asked and again["cached"] and again["candidate_us"] == second["candidate_us"]
    # a profile of a candidate never timed times it (and beside the best)
    z = tools.call("write_candidate", source=Z, strategy="fast")["candidate_id"]
    tools.call("profile", candidate_id=z)
    assert "timing" not in judge.asked[-1] and judge.asked[-1]["incumbent"] is not None


def test_the_run_start_times_the_baselines(tmp_path):
    """The baseline candidate's evaluation, which fixes the objective (``Toolbox.judge``, as
    ``Run._start`` calls it), keeps the baselines: the run's ``baselines_us`` come from it."""
    judge = IncumbentJudge()
    tools = toolbox(tmp_path, judge)
    baseline = tmp_path / "baseline.py"
    baseline.write_text(X)
    result = tools.judge(baseline, "benchmark")
    assert "baselines" not in judge.asked[-1] and result["timings"]["baselines"] == {"eager": 500.0}


def test_without_the_judges_comparison_the_times_and_min_gain_decide(tmp_path):
    tools = toolbox(tmp_path, IncumbentJudge(incumbent_error="the incumbent failed to compile"))
    bench(tools, X)
    result = bench(tools, Y)
    assert "incumbent" not in result and result["incumbent_error"].startswith("the incumbent failed")
    assert tools.best["candidate_id"] == candidate_id(Y) and "ratio" not in tools.best


# ---- promotion can't lose a winner -------------------------------------------------------------
def promote_run(tmp_path: Path, promote, judge, *, provenance: dict | None, name: str = "run"):
    best_dir = tmp_path / "best"
    best_dir.mkdir(parents=True, exist_ok=True)
    (best_dir / "fake.py").write_text(SLOW)  # the promoted kernel: the slow family at its defaults
    if provenance is not None:
        (best_dir / "fake.json").write_text(json.dumps(provenance))
    problem = FakeProblem(tmp_path / "problem")
    options = RunOptions(problem="fake", budget=10, run_dir=tmp_path / name, promote=promote)
    with Run(options, problem=problem, evaluate=judge, promote_dir=best_dir) as run:
        outcome = run.execute(SearchAgent(problem=problem, profile=False))
    promote_events = [e for e in read_events(tmp_path / name / "events.jsonl") if e["kind"] == "promote"]
    return outcome, best_dir, promote_events, run


def provenance(gpu: str) -> dict:
    return {"problem": "fake", "candidate_id": candidate_id(SLOW), "machine": {"gpu": gpu}, "metric": "device"}


def test_promotion_refuses_a_run_from_another_kind_of_machine(tmp_path):
    outcome, best_dir, events, run = promote_run(tmp_path, "check", IncumbentJudge(), provenance=provenance("NVIDIA H200"))
    assert (best_dir / "fake.py").read_text() == SLOW and outcome.promoted is None
    assert events[-1]["action"] == "refused" and "'NVIDIA H200'" in events[-1]["reason"] and "'cpu'" in events[-1]["reason"]
    assert any(line.startswith("promotion: refused: ") for line in summary_lines(run.tools, outcome))
    # --kopt-promote=force overrides, and writes the provenance
    outcome, best_dir, events, _ = promote_run(tmp_path, "force", IncumbentJudge(), provenance=provenance("NVIDIA H200"), name="forced")
    best = outcome.best["candidate_id"]
    assert outcome.promoted == best_dir / "fake.py" and candidate_id((best_dir / "fake.py").read_text()) == best
    record = json.loads((best_dir / "fake.json").read_text())
    assert record["candidate_id"] == best and record["family"] == "fast" and record["machine"]["gpu"] == "cpu"
    assert set(record) == {"problem", "candidate_id", "family", "knobs", "run", "commit", "machine", "metric", "figures", "promoted_at", "note"}
    assert events[-1]["action"] == "promoted" and "forced" in events[-1]["reason"]


def test_promotion_without_provenance_refuses_unless_forced(tmp_path):
    outcome, best_dir, events, _ = promote_run(tmp_path, True, IncumbentJudge(), provenance=None)
    assert (best_dir / "fake.py").read_text() == SLOW and not (best_dir / "fake.json").exists()
    assert events[-1]["action"] == "refused" and "fake.json is missing" in events[-1]["reason"]


def test_promotion_on_the_same_machine_times_both_and_needs_the_interval_to_clear(tmp_path):
    judge = IncumbentJudge()
    outcome, best_dir, events, _ = promote_run(tmp_path, "check", judge, provenance=provenance("cpu"))
    best = outcome.best["candidate_id"]
    side_by_side = judge.asked[-1]
    assert side_by_side["candidate"] == best and side_by_side["incumbent"] == str((best_dir / "fake.py").resolve())
    assert events[-1]["action"] == "promoted" and events[-1]["ratio"]["lo"] > 1.01
    assert candidate_id((best_dir / "fake.py").read_text()) == best
    record = json.loads((best_dir / "fake.json").read_text())
    assert record["figures"] == {"eager": record["figures"]["eager"], "device": record["figures"]["device"], "graph": record["figures"]["graph"]}
    assert record["metric"] == "eager" and "side by side" in record["note"]
    assert (tmp_path / "run" / events[-1]["result_path"]).is_file()

    class Noisy(IncumbentJudge):  # the promoted file beside the best: within the noise
        def __call__(self, problem_name, candidate_path, **kw):
            result = super().__call__(problem_name, candidate_path, **kw)
            if kw.get("incumbent") and "candidates" not in kw["incumbent"]:
                result["incumbent"]["ratio"].update(median=1.004, lo=0.995, hi=1.012)
            return result

    outcome, best_dir, events, _ = promote_run(tmp_path / "noisy", "check", Noisy(), provenance=provenance("cpu"))
    assert (best_dir / "fake.py").read_text() == SLOW
    assert events[-1]["action"] == "refused" and "not faster than" in events[-1]["reason"] and "0.995" in events[-1]["reason"]


def test_promotion_refuses_when_the_judge_cannot_time_two_kernels_side_by_side(tmp_path):
    outcome, best_dir, events, _ = promote_run(tmp_path, "check", FakeJudge(), provenance=provenance("cpu"))  # no incumbent in its result
    assert (best_dir / "fake.py").read_text() == SLOW
    assert events[-1]["action"] == "refused" and "could not be timed beside it" in events[-1]["reason"]

    def old_judge(problem_name, candidate_path, *, upto="profile", timeout_s=900.0):  # no incumbent= at all
        return FakeJudge()(problem_name, candidate_path, upto=upto, timeout_s=timeout_s)

    outcome, best_dir, events, _ = promote_run(tmp_path / "old", "check", old_judge, provenance=provenance("cpu"))
    assert (best_dir / "fake.py").read_text() == SLOW
    assert events[-1]["action"] == "refused" and "cannot time two kernels side by side" in events[-1]["reason"]


# ---- a best event lost to a kill is recovered on resume -------------------------------------------
def test_a_best_lost_between_its_verdict_and_its_event_is_written_on_resume(tmp_path):
    problem = FakeProblem(tmp_path / "problem")
    run_dir = tmp_path / "run"
    with Run(RunOptions(problem="fake", budget=12, run_dir=run_dir), problem=problem, evaluate=FakeJudge()) as run:
        run.execute(SearchAgent(problem=problem, profile=False))
    events = read_events(run_dir / "events.jsonl")
    cut = max(i for i, e in enumerate(events) if e["kind"] == "best")  # kill -9 right after this verdict
    lost = events[cut]["candidate_id"]
    assert events[cut - 1]["kind"] == "verdict"
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events[:cut]))
    stale = [e for e in events[:cut] if e["kind"] == "best"][-1]["candidate_id"]
    assert stale != lost
    with Run(RunOptions(problem="fake", budget=12, run_dir=run_dir, resume=True), problem=problem, evaluate=FakeJudge()) as run:
        run.execute(SearchAgent(problem=problem, profile=False))
    events = read_events(run_dir / "events.jsonl")
    resumed = next(i for i, e in enumerate(events) if e["kind"] == "run_resumed")
    assert events[resumed + 1]["kind"] == "best" and events[resumed + 1]["candidate_id"] == lost and events[resumed + 1]["recovered"]
    best_json = json.loads((run_dir / "best.json").read_text())["candidate_id"]
    last_event = [e for e in events if e["kind"] == "best"][-1]["candidate_id"]
    assert best_json == last_event == summarise(run_dir).best_id == digest(events, run_dir).best["candidate_id"]


# ---- budget and metric on resume -------------------------------------------------------------
def started_run(tmp_path: Path, **options) -> Path:
    problem = FakeProblem(tmp_path / "problem")
    run_dir = tmp_path / "run"
    with Run(RunOptions(problem="fake", run_dir=run_dir, **options), problem=problem, evaluate=IncumbentJudge()) as run:
        run.execute(SearchAgent(problem=problem, profile=False))
    return run_dir


def test_the_budget_is_the_runs_total_and_plus_n_gives_n_more(tmp_path):
    run_dir = started_run(tmp_path, budget=10)
    assert resolve(RunOptions(problem="fake", run_dir=run_dir, resume=True, budget_more=5)).budget == 15
    assert resolve(RunOptions(problem="fake", run_dir=run_dir, resume=True, budget=12)).budget == 12
    assert resolve(RunOptions(problem="fake", run_dir=run_dir, resume=True)).budget == 10
    with pytest.raises(RunError, match=r"has used 10 already.*--kopt-budget=\+N"):
        resolve(RunOptions(problem="fake", run_dir=run_dir, resume=True, budget=5))
    with pytest.raises(RunError, match="0 or more"):
        resolve(RunOptions(problem="fake", run_dir=tmp_path / "new", budget=-3))
    problem = FakeProblem(tmp_path / "problem")
    with Run(RunOptions(problem="fake", run_dir=run_dir, resume=True, budget_more=4), problem=problem, evaluate=IncumbentJudge()) as run:
        assert run.execute(SearchAgent(problem=problem, profile=False)).budget_used == 14
    # a later resume without --kopt-budget keeps the total it was last given, not the first one
    assert resolve(RunOptions(problem="fake", run_dir=run_dir, resume=True)).budget == 14


def test_the_metric_is_fixed_by_a_new_run_and_kept_by_its_resumes(tmp_path):
    judge = IncumbentJudge()
    problem = FakeProblem(tmp_path / "problem")
    run_dir = tmp_path / "run"
    with Run(RunOptions(problem="fake", budget=6, run_dir=run_dir, metric="device"), problem=problem, evaluate=judge) as run:
        run.execute(SearchAgent(problem=problem, profile=False))
    objective = read_events(run_dir / "events.jsonl")[0]["objective"]
    assert objective["metric"] == "device" and "device time" in objective["score"]
    asked = len(judge.asked)
    with Run(RunOptions(problem="fake", budget=9, run_dir=run_dir, resume=True), problem=problem, evaluate=judge) as run:
        run.execute(SearchAgent(problem=problem, profile=False))
    assert {a["metric"] for a in judge.asked} == {"device"} and len(judge.asked) > asked
    with pytest.raises(RunError, match="keeps its own metric"):
        resolve(RunOptions(problem="fake", run_dir=run_dir, resume=True, metric="eager"))
    assert resolve(RunOptions(problem="fake", run_dir=tmp_path / "new")).metric == "eager"
    with pytest.raises(RunError, match="--kopt-metric must be one of eager, device, graph"):
        resolve(RunOptions(problem="fake", run_dir=tmp_path / "new", metric="wall"))


def test_a_log_from_before_the_metric_was_named_is_device_time(tmp_path):
    run_dir = tmp_path / "old"
    log = EventLog(run_dir / "events.jsonl", run_id="old")
    log.append("run_started", problem="fake", budget=5, agent="search", seed=0,
               objective={"metric": "time of one kernel(...) call on the headline case, in microseconds"})
    log.close()
    assert resolve(RunOptions(problem="fake", run_dir=run_dir, resume=True)).metric == "device"
    with pytest.raises(RunError, match="scored on device time"):
        resolve(RunOptions(problem="fake", run_dir=run_dir, resume=True, metric="eager"))


# ---- a full disk, a read-only run directory ------------------------------------------------------
def test_a_full_disk_stops_the_run_with_a_clear_message_and_it_resumes(tmp_path, monkeypatch):
    import pytest_kopt.tools as tools_module

    real, writes = tools_module.atomic_write, []

    def fills_up(path, data):
        writes.append(path)
        if "evals" in str(path) and len(writes) > 6:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data)

    monkeypatch.setattr(tools_module, "atomic_write", fills_up)
    problem = FakeProblem(tmp_path / "problem")
    run_dir = tmp_path / "run"
    with Run(RunOptions(problem="fake", budget=12, run_dir=run_dir), problem=problem, evaluate=FakeJudge()) as run:
        with pytest.raises(RunStorageError) as info:
            run.execute(SearchAgent(problem=problem, profile=False))
    message = str(info.value)
    assert "cannot be written: No space left on device" in message and "The interruption is in its log" in message
    assert f"--kopt-resume --kopt-run-dir={run_dir}" in message and "\n" not in message
    end = read_events(run_dir / "events.jsonl")[-1]
    assert end["kind"] == "run_interrupted" and "No space left on device" in end["reason"]
    assert not list(run_dir.rglob(".*.tmp"))  # no half-written file left behind
    monkeypatch.setattr(tools_module, "atomic_write", real)  # space freed
    with Run(RunOptions(problem="fake", budget=12, run_dir=run_dir, resume=True), problem=problem, evaluate=FakeJudge()) as run:
        assert run.execute(SearchAgent(problem=problem, profile=False)).budget_used == 12
    results = [e["call"] for e in read_events(run_dir / "events.jsonl") if e["kind"] == "tool_result"]
    assert results == list(range(1, 13))  # the interrupted call was redone, every call charged once


def test_a_log_that_cannot_be_written_stops_the_run_without_a_second_traceback(tmp_path, monkeypatch):
    problem = FakeProblem(tmp_path / "problem")
    run_dir = tmp_path / "run"
    real = EventLog.append

    def full(self, kind, **fields):
        if self.seq >= 12:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        return real(self, kind, **fields)

    monkeypatch.setattr(EventLog, "append", full)
    with Run(RunOptions(problem="fake", budget=12, run_dir=run_dir), problem=problem, evaluate=FakeJudge()) as run:
        with pytest.raises(RunStorageError, match="No space left on device") as info:
            run.execute(SearchAgent(problem=problem, profile=False))
    assert "The interruption is in its log" not in str(info.value) and run.outcome.logged is False


def test_a_read_only_run_directory_is_one_clear_error(tmp_path, monkeypatch):
    def read_only(self):
        raise OSError(errno.EROFS, "Read-only file system", str(self.path))

    monkeypatch.setattr(run_module.RunLock, "acquire", read_only)
    run = Run(RunOptions(problem="fake", budget=5, run_dir=tmp_path / "run"), problem=FakeProblem(tmp_path / "p"), evaluate=FakeJudge())
    with pytest.raises(RunStorageError, match="cannot be written: Read-only file system") as info:
        run.__enter__()
    assert "--kopt-resume" in str(info.value)


# ---- through pytest: one line each, and where new runs land --------------------------------------
CONFTEST = f'''
import sys
sys.path.insert(0, {str(TESTS)!r})
import pytest
from kopt_fake_run import FakeJudge, FakeProblem


@pytest.fixture(scope="session")
def kopt_problem(tmp_path_factory):
    return FakeProblem(tmp_path_factory.mktemp("fake"))


@pytest.fixture(scope="session")
def kopt_evaluate():
    return FakeJudge()
'''

DISK_FILLS_UP = '''
import errno
import pytest_kopt.tools as tools_module

_real, _writes = tools_module.atomic_write, []


def _fills_up(path, data):
    _writes.append(path)
    if "evals" in str(path) and len(_writes) > 6:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    return _real(path, data)


tools_module.atomic_write = _fills_up
'''


def pytest_run(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args, message", [
    (["--kopt-budget=-3"], "--kopt-budget must be 0 or more tool calls, got -3"),
    (["--kopt-budget=many"], "--kopt-budget must be a whole number"),
    (["--kopt-metric=wall"], "--kopt-metric must be one of eager, device, graph"),
])
def test_bad_loop_options_are_one_line_usage_errors(tmp_path, args, message):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    done = pytest_run(tmp_path, "--kopt-optimize=fake", f"--kopt-run-dir={tmp_path / 'run'}", *args)
    assert done.returncode == 4 and message in done.stderr and "Traceback" not in done.stdout + done.stderr
    assert not (tmp_path / "run").exists()


def test_an_unknown_problem_is_one_line_not_a_traceback(tmp_path):
    done = pytest_run(tmp_path, "--kopt-optimize=nope", f"--kopt-run-dir={tmp_path / 'run'}")
    text = done.stdout + done.stderr
    (line,) = [line for line in text.splitlines() if "unknown problem 'nope'; known: " in line]
    listed = line.split("known: ")[1].rstrip(" !").split(", ")
    assert done.returncode == 4 and listed == sorted(listed) and {"kda", "mla", "mla-paged", "mla-prefill"} <= set(listed)
    assert "Traceback" not in text and 'File "' not in text and len(text.splitlines()) < 15
    assert not (tmp_path / "run").exists()


def test_a_full_disk_through_pytest_is_one_line_with_the_command_that_continues(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST + DISK_FILLS_UP)
    run_dir = tmp_path / "run"
    done = pytest_run(tmp_path, "--kopt-optimize=fake", "--kopt-budget=12", f"--kopt-run-dir={run_dir}")
    text = done.stdout + done.stderr
    assert done.returncode == 1 and "cannot be written: No space left on device" in text
    assert f"continue with: {shlex.quote(sys.executable)} -m pytest --kopt-optimize=fake --kopt-resume --kopt-run-dir={run_dir}" in text
    assert "Traceback" not in text and 'File "' not in text
    assert read_events(run_dir / "events.jsonl")[-1]["kind"] == "run_interrupted"


def test_new_runs_land_in_a_gitignored_folder(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    done = pytest_run(tmp_path, "--kopt-optimize=fake", "--kopt-budget=2")
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = (tmp_path / DEFAULT_RESULTS_DIR).iterdir()
    assert (run_dir / "events.jsonl").is_file() and run_dir.name.startswith("fake-")
    default = resolve(RunOptions(problem="kda", results_dir=REPO_ROOT / DEFAULT_RESULTS_DIR)).run_dir
    ignored = subprocess.run(["git", "check-ignore", "-q", str(default / "events.jsonl")], cwd=REPO_ROOT)
    assert ignored.returncode == 0, f"{default} is not gitignored"


# ---- the README's and the Makefile's set-up ---------------------------------------------------------
def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def test_the_readme_commands_exist_as_typed():
    """Every command in the README's set-up, loop and reports sections is a make target, the venv's
    activation, or a pytest/kopt command whose subcommand and options exist; the venv is activated
    (once) before the first of those."""
    from pytest_kopt.cli import SUBCOMMANDS

    readme = (REPO_ROOT / "README.md").read_text()
    makefile = (REPO_ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z]+):", makefile, re.M))
    options = set(re.findall(r'addoption\(\s*"(--kopt-[a-z-]+)"', (REPO_ROOT / "pytest_kopt" / "plugin.py").read_text()))
    options |= {"--" + name.replace("_", "-") for name in re.findall(r'"(kopt_[a-z_]+)": \(', (REPO_ROOT / "pytest_kopt" / "plugin.py").read_text())}
    sections = [_section(readme, t) for t in ("Set-up", "The loop", "Reports")]
    commands = [line.split("#")[0].strip() for s in sections for block in re.findall(r"```\n(.*?)```", s, re.S) for line in block.splitlines()]
    commands = [c for c in commands if c]
    activated = commands.index(". .venv/bin/activate")
    assert all(c.split()[0] == "make" for c in commands[:activated])
    for command in commands:
        word, *rest = command.split()
        if word == "make":
            assert rest[0] in targets, command
        elif word == "kopt":
            assert rest[0] in SUBCOMMANDS, command
        elif word == "pytest":
            assert {arg.split("=")[0] for arg in rest if arg.startswith("--kopt")} <= options, command
        else:
            assert command == ". .venv/bin/activate", command
    setup = _section(readme, "Set-up")
    assert "TORCH_INDEX=https://download.pytorch.org/whl/cpu" in setup
    assert "**total**" in _section(readme, "The loop") and "--kopt-budget=+200" in _section(readme, "The loop")


def test_the_makefile_takes_pytorchs_cpu_wheel_index_as_an_option(tmp_path):
    def dry(*extra: str) -> str:
        done = subprocess.run(["make", "-n", "-B", "install", f"VENV={tmp_path / 'v'}", *extra], cwd=REPO_ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    with_index = dry("TORCH_INDEX=https://download.pytorch.org/whl/cpu")
    assert re.search(r'pip install --quiet --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"', with_index)
    assert "--index-url" not in dry()
    resume = subprocess.run(["make", "-n", "resume", "RUN=results/local/kda-x", "MORE=7"], cwd=REPO_ROOT, capture_output=True, text=True).stdout
    assert "--kopt-optimize=kda --kopt-resume --kopt-run-dir=results/local/kda-x --kopt-budget=+7" in resume
