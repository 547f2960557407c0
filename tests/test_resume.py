"""Restart safety with real child processes: kill -9 at random moments, Ctrl-C, and the run lock.

The children run the real loop (Run, Toolbox, SearchAgent, EventLog) against the deterministic
fake judge of kopt_fake_run.py, so an interrupted-and-resumed run must end exactly where an
uninterrupted one does.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kopt_fake_run import main as run_in_process

from pytest_kopt.events import read_events
from pytest_kopt.run import RunLocked, RunOptions, Run

DRIVER = Path(__file__).with_name("kopt_fake_run.py")
BUDGET = 40
SEED = int(os.environ.get("KOPT_RESUME_SEED", "20251129"))
KILLS = 12


def launch(run_dir: Path, *extra: str, delay: float = 0.04, budget: int = BUDGET) -> subprocess.Popen:
    resume = ["--resume"] if run_dir.exists() else []
    return subprocess.Popen(
        [sys.executable, str(DRIVER), str(run_dir), str(budget), "--delay", str(delay), *resume, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def completed(events: list[dict]) -> list[tuple]:
    """(call, tool, candidate) of each call with a result, in order."""
    args = {}
    for e in events:
        if e["kind"] == "tool_call":
            args[e["call"]] = e["args"].get("candidate_id")
    return [(e["call"], e["tool"], args.get(e["call"])) for e in events if e["kind"] == "tool_result"]


def check_invariants(run_dir: Path) -> int:
    """What must hold after any kill; returns the budget used so far."""
    log = run_dir / "events.jsonl"
    if not log.exists():
        return 0
    events = read_events(log)  # raises on damage; tolerates a torn tail
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    results = [e["call"] for e in events if e["kind"] == "tool_result"]
    assert results == list(range(1, len(results) + 1)), "each call is charged exactly once, in order"
    assert len(results) <= BUDGET
    ids = [e["candidate_id"] for e in events if e["kind"] == "candidate"]
    assert len(ids) == len(set(ids)), "no candidate is recorded twice"
    for e in events:
        if e["kind"] == "candidate":
            source = (run_dir / e["path"]).read_bytes()
            assert hashlib.sha256(source).hexdigest()[:12] == e["candidate_id"]
        if e["kind"] == "verdict" and e.get("result_path"):
            assert (run_dir / e["result_path"]).is_file()
    return len(results)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """An uninterrupted run with the same seed and budget."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    assert run_in_process([str(run_dir), str(BUDGET)]) == 0
    events = read_events(run_dir / "events.jsonl")
    return {
        "calls": completed(events),
        "best": next(e for e in reversed(events) if e["kind"] == "run_finished")["best"],
        "candidates": sorted(p.name for p in (run_dir / "candidates").iterdir()),
        "best_py": (run_dir / "best.py").read_text(),
    }


def assert_same_end(run_dir: Path, reference: dict) -> list[dict]:
    events = read_events(run_dir / "events.jsonl")
    assert events[-1]["kind"] == "run_finished" and events[-1]["budget_used"] == BUDGET
    assert completed(events) == reference["calls"]
    best = events[-1]["best"]
    assert (best["candidate_id"], best["candidate_us"]) == (reference["best"]["candidate_id"], reference["best"]["candidate_us"])
    assert sorted(p.name for p in (run_dir / "candidates").iterdir()) == reference["candidates"]
    assert (run_dir / "best.py").read_text() == reference["best_py"]
    assert not (run_dir / "lock").exists()
    return events


@pytest.mark.parametrize("kept", ["run_started", "candidate"])
def test_a_kill_before_the_baseline_verdict_times_it_again_on_resume(tmp_path, reference, kept):
    """kill -9 between ``run_started`` and the baseline candidate's call-0 verdict (after its
    ``candidate`` event, or before it): the resume times the baseline again, uncharged, and the run
    ends as the uninterrupted one (the search agent would otherwise walk the baseline itself)."""
    run_dir = tmp_path / "run"
    assert run_in_process([str(run_dir), str(BUDGET)]) == 0
    lines = (run_dir / "events.jsonl").read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if json.loads(line)["kind"] == kept)
    (run_dir / "events.jsonl").write_text("".join(lines[:cut + 1]))
    for leftover in ("best.py", "best.json"):
        (run_dir / leftover).unlink()
    assert run_in_process([str(run_dir), str(BUDGET), "--resume"]) == 0
    events = assert_same_end(run_dir, reference)
    baseline = events[0]["objective"]["baseline_candidate"]
    assert [e["call"] for e in events if e["kind"] == "verdict" and e["candidate_id"] == baseline][:1] == [0]
    assert sum(e["kind"] == "candidate" and e["candidate_id"] == baseline for e in events) == 1


def size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def test_kill_9_at_random_moments_then_resume_ends_like_an_uninterrupted_run(tmp_path, reference):
    rng = random.Random(SEED)
    run_dir = tmp_path / "run"
    log = run_dir / "events.jsonl"
    used, kills, torn = 0, 0, 0
    for _ in range(KILLS):
        before = size(log)
        proc = launch(run_dir, delay=0.15)
        if rng.random() < 0.25:  # anywhere, start-up and set-up included
            time.sleep(rng.uniform(0.0, 0.6))
        else:  # somewhere in the work, once the child has written to the log
            wait_for(lambda: size(log) > before or proc.poll() is not None)
            time.sleep(rng.uniform(0.0, 0.5))
        if proc.poll() is not None:  # finished before its kill came
            break
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        kills += 1
        now = check_invariants(run_dir)
        assert now >= used, "budget went backwards"
        used = now
        if kills % 4 == 0 and log.exists():  # and now and then a torn last line
            if log.read_bytes().endswith(b"\n"):  # else it lengthens a tail no launch has repaired yet
                torn += 1
            with open(log, "ab") as fp:
                fp.write(b'{"seq":999999,"time":"2025-01-01T00:00:00.0')
    print(f"seed {SEED}: {kills} kills, {torn} torn tails, {used} calls done before the last launch")
    assert kills >= KILLS // 2, f"only {kills} kills landed before the run finished (seed {SEED})"
    proc = launch(run_dir, delay=0.0)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    events = assert_same_end(run_dir, reference)
    resumed = [e for e in events if e["kind"] == "run_resumed"]
    # every torn tail was cut off and recorded, in the same atomic step (a kill between a repair
    # and its record would lose the record)
    assert sum(1 for e in events if e["kind"] == "log_repaired") == torn
    redone = {e["call"] for e in events if e["kind"] == "tool_call" and e.get("redo")}
    # a call in flight at a kill is redone under its number, unless it was a write_candidate killed
    # before its source was stored: that one is said so in a note and made afresh, uncharged
    unstored = {int(m.group(1)) for e in events if e["kind"] == "note"
                for m in [re.match(r"in-flight call (\d+) \(write_candidate\) could not be redone", e.get("text", ""))] if m}
    assert all(r["in_flight"] is None or r["in_flight"] in redone | unstored for r in resumed)


def wait_for(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("timed out waiting for the child")


def last_event(run_dir: Path) -> dict | None:
    try:
        events = read_events(run_dir / "events.jsonl")
    except FileNotFoundError:
        return None
    return events[-1] if events else None


def test_an_evaluation_killed_in_flight_is_redone_and_charged_once(tmp_path, reference):
    run_dir = tmp_path / "run"
    proc = launch(run_dir, delay=0.4, budget=BUDGET)
    wait_for(lambda: (e := last_event(run_dir)) is not None and e["kind"] == "tool_call" and e["tool"] == "benchmark" and e["call"] > 3)
    in_flight = last_event(run_dir)["call"]
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert (run_dir / "lock").exists()  # left behind by kill -9, but no longer held
    proc = launch(run_dir, delay=0.0)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    events = assert_same_end(run_dir, reference)
    resumed = next(e for e in events if e["kind"] == "run_resumed")
    assert resumed["in_flight"] == in_flight and resumed["budget_used"] == in_flight - 1
    attempts = [e for e in events if e["kind"] == "tool_call" and e["call"] == in_flight]
    assert len(attempts) == 2 and attempts[1]["redo"] is True
    assert sum(1 for e in events if e["kind"] == "tool_result" and e["call"] == in_flight) == 1


def test_temp_files_of_a_writer_killed_before_its_rename_are_removed_on_resume(tmp_path, reference):
    run_dir = tmp_path / "run"
    proc = launch(run_dir, delay=0.2, budget=BUDGET)
    wait_for(lambda: (e := last_event(run_dir)) is not None and e["kind"] == "tool_call" and e["call"] > 3)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    # What atomic_write leaves when killed between its write and its rename.
    left = [run_dir / "candidates" / ".0123456789ab.py.999.tmp", run_dir / "evals" / ".0123456789ab-benchmark.json.999.tmp", run_dir / ".best.py.999.tmp"]
    for path in left:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half written")
    proc = launch(run_dir, delay=0.0)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert_same_end(run_dir, reference)  # the candidates/ listing equals the uninterrupted run's
    assert not any(path.exists() for path in left)


@pytest.mark.parametrize("sig, word", [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")])
def test_ctrl_c_or_sigterm_stops_cleanly_and_resumes(tmp_path, reference, sig, word):
    run_dir = tmp_path / "run"
    proc = launch(run_dir, delay=0.15)
    wait_for(lambda: sum(1 for e in read_events(run_dir / "events.jsonl") if e["kind"] == "tool_result") >= 6 if (run_dir / "events.jsonl").exists() else False)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted" in out
    events = read_events(run_dir / "events.jsonl")
    end = events[-1]
    assert end["kind"] == "run_interrupted" and word in end["reason"]
    assert end["budget_used"] == sum(1 for e in events if e["kind"] == "tool_result")
    assert not (run_dir / "lock").exists()
    assert (run_dir / "best.py").exists() and (run_dir / "best.json").exists()
    proc = launch(run_dir, delay=0.0)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert_same_end(run_dir, reference)


def test_a_second_process_cannot_open_a_locked_run(tmp_path):
    run_dir = tmp_path / "run"
    # slow evaluations (killed below): the run must outlast a second process's start-up on a loaded machine (at
    # 0.3 s it could finish first, and nothing was locked any more)
    proc = launch(run_dir, delay=1.0)
    try:
        wait_for(lambda: (e := last_event(run_dir)) is not None and e["kind"] == "tool_call")
        other = launch(run_dir, delay=0.0)
        out, err = other.communicate(timeout=60)
        assert other.returncode != 0
        assert "being written by another process" in err and f"pid {proc.pid}" in err
        from kopt_fake_run import FakeJudge, FakeProblem

        options = RunOptions(problem="fake", budget=BUDGET, run_dir=run_dir, resume=True)
        with pytest.raises(RunLocked):
            with Run(options, problem=FakeProblem(tmp_path / "p"), evaluate=FakeJudge()):
                pass
        assert not any(e["kind"] == "run_resumed" for e in read_events(run_dir / "events.jsonl"))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()


def test_a_new_run_refuses_a_directory_that_holds_one(tmp_path):
    run_dir = tmp_path / "run"
    assert run_in_process([str(run_dir), "5"]) == 0
    from pytest_kopt.run import RunError, resolve

    with pytest.raises(RunError, match="--kopt-resume"):
        resolve(RunOptions(problem="fake", run_dir=run_dir))
    with pytest.raises(RunError, match="not 'kda'"):
        resolve(RunOptions(problem="kda", run_dir=run_dir, resume=True))
    resolved = resolve(RunOptions(problem="fake", run_dir=run_dir, resume=True))
    assert resolved.budget == 5 and resolved.seed == 0 and resolved.agent == "search"
    fresh = resolve(RunOptions(problem="fake", run_dir=tmp_path / "not-yet", resume=True, seed=7))
    assert fresh.started is None and fresh.budget == 100 and fresh.seed == 7  # --kopt-resume starts it


def test_resume_takes_the_settings_its_agent_last_ran_with(tmp_path):
    from pytest_kopt.events import EventLog
    from pytest_kopt.run import resolve

    run_dir = tmp_path / "run"
    log = EventLog(run_dir / "events.jsonl", run_id="run")
    log.append("run_started", problem="fake", budget=10, agent="openai", agent_settings={"model": "a"}, seed=0)
    log.append("run_resumed", budget_used=3, agent="openai", agent_settings={"model": "b"}, seed=0)
    log.append("run_resumed", budget_used=5, agent="search", agent_settings={}, seed=0)
    log.close()
    assert resolve(RunOptions(problem="fake", run_dir=run_dir, resume=True)).agent_settings == {"model": "b"}
    assert resolve(RunOptions(problem="fake", run_dir=run_dir, resume=True, agent="search")).agent_settings == {}
    assert resolve(RunOptions(problem="fake", run_dir=run_dir, resume=True, agent="replay")).agent_settings is None
    given = resolve(RunOptions(problem="fake", run_dir=run_dir, resume=True, agent_settings={"model": "c"}))
    assert given.agent_settings == {"model": "c"}
    assert resolve(RunOptions(problem="fake", run_dir=tmp_path / "new")).agent_settings is None


def test_a_resume_can_retract_the_best_and_promote_the_next(tmp_path):
    """--kopt-retract on resume: the best is rebuilt without the candidate, best.py / best.json and the promoted
    file follow it, the search agent resumes against the new best, and the report names the retraction."""
    from kopt_fake_run import FakeJudge, FakeProblem

    from pytest_kopt.agents.search import SearchAgent
    from pytest_kopt.run import RunError, resolve
    from pytest_kopt.runsummary import summarise

    run_dir = tmp_path / "run"
    assert run_in_process([str(run_dir), "12"]) == 0
    events = read_events(run_dir / "events.jsonl")
    first = [e for e in events if e["kind"] == "best"][-1]["candidate_id"]
    problem = FakeProblem(tmp_path / "fake-problem", broken=True)
    options = RunOptions(problem="fake", budget=12, run_dir=run_dir, resume=True, promote=True,
                         retract=(first, "wrong on shapes the judge did not draw"))
    promoted = tmp_path / "best"
    with Run(options, problem=problem, evaluate=FakeJudge(0.0), promote_dir=promoted) as run:
        outcome = run.execute(SearchAgent(problem=problem, seed=run.options.seed, profile=True))
    assert outcome.best is not None and outcome.best["candidate_id"] != first
    events = read_events(run_dir / "events.jsonl")
    retract = next(e for e in events if e["kind"] == "retract")
    assert retract["candidate_id"] == first and retract["was_best"]
    assert json.loads((run_dir / "best.json").read_text())["candidate_id"] == outcome.best["candidate_id"]
    assert (promoted / "fake.py").read_text() == (run_dir / "candidates" / f"{outcome.best['candidate_id']}.py").read_text()
    summary = summarise(run_dir)
    assert summary.retracted == {first: "wrong on shapes the judge did not draw"}
    assert all(cid != first for _, _, cid in summary.progress)
    with pytest.raises(RunError, match="--kopt-resume"):
        resolve(RunOptions(problem="fake", run_dir=run_dir, retract=(first, "x")))
