"""The Toolbox: one unit of budget per call, every call logged, evaluations cached, best tracked."""

from __future__ import annotations

from pathlib import Path

import pytest
from kopt_fake_run import FAST, SLOW, FakeJudge, FakeProblem

from pytest_kopt.events import EventLog, read_events
from pytest_kopt.families import parse_family
from pytest_kopt.tools import SCHEMAS, BudgetExhausted, Toolbox, candidate_id

GOOD = parse_family(FAST, "fast").render({"CHUNK": 32, "num_warps": 8, "fuse": True})  # 93 us
BAD = parse_family(FAST, "fast").render({"CHUNK": 128, "num_warps": 2})  # fails correctness


def make(tmp_path, budget=20, judge=None):
    problem = FakeProblem(tmp_path / "problem")
    log = EventLog(tmp_path / "run" / "events.jsonl", "run")
    judge = judge or FakeJudge()
    tools = Toolbox(problem, {"problem": "fake", "baseline_us": 956.0}, log, tmp_path / "run", budget, evaluate=judge)
    return tools, judge


def calls_and_results(path):
    events = read_events(path)
    return [e for e in events if e["kind"] == "tool_call"], [e for e in events if e["kind"] == "tool_result"]


def test_every_call_costs_one_unit_and_is_logged_as_a_pair(tmp_path):
    tools, _ = make(tmp_path)
    cid = tools.call("write_candidate", source=GOOD, notes="try", strategy="fast")["candidate_id"]
    assert cid == candidate_id(GOOD)
    tools.call("run_tests", candidate_id=cid)
    tools.call("benchmark", candidate_id=cid)
    tools.call("show_problem")
    tools.call("history")
    assert tools.budget_used == 5 and tools.budget_left == 15
    calls, results = calls_and_results(tools.log.path)
    assert [c["call"] for c in calls] == [r["call"] for r in results] == [1, 2, 3, 4, 5]
    assert [c["tool"] for c in calls] == ["write_candidate", "run_tests", "benchmark", "show_problem", "history"]
    # sources never go into the log, only their ids (the file is in candidates/)
    assert "source" not in calls[0]["args"] and calls[0]["args"]["candidate_id"] == cid
    assert (tools.run_dir / "candidates" / f"{cid}.py").read_text() == GOOD


@pytest.mark.parametrize(
    "tool, args, message",
    [
        ("compile_everything", {}, "unknown tool"),
        ("run_tests", {}, "needs argument"),
        ("run_tests", {"candidate_id": 5}, "must be string"),
        ("run_tests", {"candidate_id": "abc", "fast": True}, "takes no argument"),
        ("benchmark", {"candidate_id": "ffffffffffff"}, "unknown candidate_id"),
        ("write_candidate", {"source": "   "}, "empty"),
        ("write_candidate", {"source": GOOD, "parent": "nope-not-an-id"}, "unknown candidate_id"),
    ],
)
def test_bad_calls_answer_an_error_and_still_cost_one(tmp_path, tool, args, message):
    tools, judge = make(tmp_path)
    result = tools.call(tool, **args)
    assert message in result["error"]
    assert tools.budget_used == 1 and judge.calls == []
    _, results = calls_and_results(tools.log.path)
    assert results[0]["result"]["error"] == result["error"]


def test_budget_exhausted_refuses_without_logging(tmp_path):
    tools, _ = make(tmp_path, budget=2)
    tools.call("show_problem")
    tools.call("show_reference")
    size = tools.log.path.stat().st_size
    with pytest.raises(BudgetExhausted):
        tools.call("history")
    assert tools.budget_used == 2 and tools.log.path.stat().st_size == size


def test_evaluations_are_cached_but_still_charged(tmp_path):
    tools, judge = make(tmp_path)
    cid = tools.call("write_candidate", source=GOOD)["candidate_id"]
    first = tools.call("benchmark", candidate_id=cid)
    again = tools.call("benchmark", candidate_id=cid)
    tests = tools.call("run_tests", candidate_id=cid)  # an earlier stage: answered by the benchmark
    assert judge.calls == [(cid, "benchmark")]
    assert not first["cached"] and again["cached"] and tests["cached"]
    assert again["candidate_us"] == first["candidate_us"] == 93.0
    assert tools.budget_used == 4
    tools.call("profile", candidate_id=cid)  # a later stage needs the judge again
    assert judge.calls[-1] == (cid, "profile")


class SweepRecorder(FakeJudge):
    """A FakeJudge that also records whether each evaluation asked for the random-shape sweep."""

    def __init__(self):
        super().__init__()
        self.sweeps: list[tuple[str, bool]] = []

    def __call__(self, problem_name, candidate_path, *, upto="profile", timeout_s=900.0, **kwargs):
        self.sweeps.append((upto, kwargs.get("hypothesis", True)))
        return super().__call__(problem_name, candidate_path, upto=upto, timeout_s=timeout_s)


def test_only_a_file_that_passed_correctness_skips_the_random_shapes(tmp_path):
    tools, judge = make(tmp_path, judge=SweepRecorder())
    good = tools.call("write_candidate", source=GOOD, strategy="fast")["candidate_id"]
    bad = tools.call("write_candidate", source=BAD, strategy="fast")["candidate_id"]
    tools.call("benchmark", candidate_id=good)  # first evaluation of this file: swept
    tools.call("profile", candidate_id=good)  # passed before: explicit cases only
    tools.call("run_tests", candidate_id=bad)  # fails correctness
    tools.call("profile", candidate_id=bad)  # answered by the cached failure, no judge call
    other = tools.call("write_candidate", source=parse_family(FAST, "fast").render({"CHUNK": 64, "num_warps": 4, "fuse": False}))["candidate_id"]
    tools.call("run_tests", candidate_id=other)
    tools.call("benchmark", candidate_id=other)
    assert judge.sweeps == [("benchmark", True), ("profile", False), ("correctness", True), ("correctness", True), ("benchmark", False)]


def test_a_judge_without_the_keyword_is_never_passed_it(tmp_path):
    seen = []

    def plain_judge(problem_name, candidate_path, *, upto, timeout_s):
        seen.append(upto)
        return FakeJudge()(problem_name, candidate_path, upto=upto, timeout_s=timeout_s)

    tools, _ = make(tmp_path, judge=plain_judge)
    good = tools.call("write_candidate", source=GOOD, strategy="fast")["candidate_id"]
    assert tools.call("run_tests", candidate_id=good)["verdict"] == "pass"
    assert tools.call("benchmark", candidate_id=good)["verdict"] == "pass"
    assert seen == ["correctness", "benchmark"]


def test_a_failure_answers_every_later_stage(tmp_path):
    tools, judge = make(tmp_path)
    cid = tools.call("write_candidate", source=BAD)["candidate_id"]
    tests = tools.call("run_tests", candidate_id=cid)
    bench = tools.call("benchmark", candidate_id=cid)
    assert tests["verdict"] == bench["verdict"] == "fail" and tests["stage"] == "correctness"
    assert bench["cached"] and len(judge.calls) == 1
    assert tests["errors"][0]["ok"] is False
    assert tools.best is None


def test_a_crashing_judge_is_a_failed_verdict_and_not_cached(tmp_path):
    def broken(*args, **kwargs):
        raise RuntimeError("sandbox exploded")

    tools, _ = make(tmp_path, judge=broken)
    cid = tools.call("write_candidate", source=GOOD)["candidate_id"]
    for _ in range(2):
        result = tools.call("run_tests", candidate_id=cid)
        assert result["verdict"] == "fail" and result["stage"] == "judge"
        assert "sandbox exploded" in result["reasons"][0] and not result["cached"]
    verdicts = [e for e in read_events(tools.log.path) if e["kind"] == "verdict"]
    assert len(verdicts) == 2 and verdicts[0]["result_path"] is None


def test_best_so_far_changes_only_on_improvement(tmp_path):
    tools, _ = make(tmp_path)
    slow = tools.call("write_candidate", source=SLOW)["candidate_id"]
    fast = tools.call("write_candidate", source=GOOD)["candidate_id"]
    tools.call("benchmark", candidate_id=slow)
    tools.call("benchmark", candidate_id=fast)
    tools.call("benchmark", candidate_id=slow)
    bests = [e for e in read_events(tools.log.path) if e["kind"] == "best"]
    assert [b["candidate_id"] for b in bests] == [slow, fast]
    assert tools.best["candidate_id"] == fast and tools.best["vs_baseline"] == pytest.approx(956.0 / 93.0)
    assert tools.best["call"] == 4
    rows = {r["candidate_id"]: r for r in tools.history()}
    assert rows[fast]["candidate_us"] == 93.0 and rows[slow]["verdict"] == "pass"


class TimedJudge:
    """Passes every candidate, timed by its source text."""

    def __init__(self, times: dict[str, float]):
        self.times = times

    def __call__(self, problem_name, candidate_path, *, upto="profile", **_):
        us = self.times[Path(candidate_path).read_text()]
        return {"verdict": "pass", "stage": "benchmark", "reasons": [], "timings": {"case": "c", "candidate_us": us}}


@pytest.mark.parametrize("min_gain, expected", [(0.01, ["a = 1", "a = 4"]), (None, ["a = 1", "a = 2", "a = 3", "a = 4"])])
def test_a_new_best_must_beat_the_old_by_the_objectives_min_gain(tmp_path, min_gain, expected):
    # 100 -> 99.5 (-0.5 %) -> 99.0 (-1.0 %, not more than 1 % below 100) -> 98.0: with min_gain 0.01 only the
    # last replaces the first; an objective without the field (runs logged before it) takes every improvement
    times = {"a = 1": 100.0, "a = 2": 99.5, "a = 3": 99.0, "a = 4": 98.0}
    objective = {"problem": "fake", "baseline_us": 956.0, **({"min_gain": min_gain} if min_gain is not None else {})}
    log = EventLog(tmp_path / "run" / "events.jsonl", "run")
    judge = TimedJudge(times)
    tools = Toolbox(FakeProblem(tmp_path / "problem"), objective, log, tmp_path / "run", 20, evaluate=judge)
    ids = {}
    for source in times:
        ids[source] = tools.call("write_candidate", source=source)["candidate_id"]
        tools.call("benchmark", candidate_id=ids[source])
    bests = [e["candidate_id"] for e in read_events(log.path) if e["kind"] == "best"]
    assert bests == [ids[s] for s in expected]
    # the same rule rebuilds the same best from the log
    log.close()
    again = Toolbox(tools.problem, tools.objective, EventLog(log.path, "run"), tools.run_dir, 20, evaluate=judge)
    again.restore(read_events(log.path))
    assert again.best == tools.best and again.best["candidate_id"] == ids[expected[-1]]


def test_ids_resolve_from_unique_prefixes(tmp_path):
    tools, _ = make(tmp_path)
    cid = tools.call("write_candidate", source=GOOD)["candidate_id"]
    assert tools.call("show_candidate", candidate_id=cid[:6])["source"] == GOOD
    assert "unknown" in tools.call("show_candidate", candidate_id=cid[:3])["error"]


def test_restore_rebuilds_budget_candidates_cache_and_best(tmp_path):
    tools, judge = make(tmp_path)
    cid = tools.call("write_candidate", source=GOOD)["candidate_id"]
    tools.call("benchmark", candidate_id=cid)
    tools.call("show_reference")
    tools.log.close()
    log = EventLog(tools.log.path, "run")
    again = Toolbox(tools.problem, tools.objective, log, tools.run_dir, 20, evaluate=judge)
    again.restore(read_events(log.path))
    assert again.budget_used == 3 and again.in_flight is None
    assert again.best == tools.best and list(again.candidates) == [cid]
    assert again.call("run_tests", candidate_id=cid)["cached"]
    assert again.budget_used == 4 and len(judge.calls) == 1


def test_a_call_in_flight_at_a_crash_is_redone_once_under_its_number(tmp_path):
    class Interrupting(FakeJudge):
        def __call__(self, *args, **kwargs):
            if not self.calls:
                self.calls.append(("interrupted", ""))
                raise KeyboardInterrupt
            return super().__call__(*args, **kwargs)

    judge = Interrupting()
    tools, _ = make(tmp_path, judge=judge)
    cid = tools.call("write_candidate", source=GOOD)["candidate_id"]
    with pytest.raises(KeyboardInterrupt):
        tools.call("benchmark", candidate_id=cid)
    assert tools.budget_used == 1  # not charged: it has no result
    tools.log.close()
    log = EventLog(tools.log.path, "run")
    again = Toolbox(tools.problem, tools.objective, log, tools.run_dir, 20, evaluate=judge)
    again.restore(read_events(log.path))
    assert again.budget_used == 1 and again.in_flight["call"] == 2
    redone = again.redo_in_flight()
    assert redone["verdict"] == "pass" and again.budget_used == 2
    calls, results = calls_and_results(log.path)
    assert [c["call"] for c in calls] == [1, 2, 2] and calls[-1]["redo"] is True
    assert [r["call"] for r in results] == [1, 2]
    assert again.call("history")["budget_used"] == 3


def test_an_in_flight_write_is_redone_from_the_stored_source(tmp_path):
    tools, judge = make(tmp_path)
    cid = candidate_id(GOOD)
    (tools.run_dir / "candidates").mkdir(parents=True)
    (tools.run_dir / "candidates" / f"{cid}.py").write_text(GOOD)
    tools.log.append("tool_call", call=1, tool="write_candidate", args={"candidate_id": cid, "notes": "n"})
    again = Toolbox(tools.problem, tools.objective, tools.log, tools.run_dir, 20, evaluate=judge)
    again.restore(read_events(tools.log.path))
    assert again.redo_in_flight() == {"candidate_id": cid, "new": True}
    assert again.budget_used == 1 and list(again.candidates) == [cid]


def test_schemas_cover_every_tool():
    assert set(SCHEMAS) == {"write_candidate", "run_tests", "benchmark", "profile", "show_reference", "show_problem", "show_candidate", "history"}
    for schema in SCHEMAS.values():
        assert schema["type"] == "object" and schema["description"]


def test_the_history_tool_shows_the_latest_and_the_fastest_of_a_long_run(tmp_path):
    tools, _ = make(tmp_path, budget=200)
    fam = parse_family(SLOW, "slow")
    first = tools.call("write_candidate", source=GOOD)["candidate_id"]
    tools.call("benchmark", candidate_id=first)  # the fastest, and the oldest
    for i in range(60):
        tools.call("write_candidate", source=fam.render({"BLOCK": 16}) + f"# variant {i}\n")
    out = tools.call("history")
    ids = [r["candidate_id"] for r in out["rows"]]
    assert out["candidates"] == 61 and len(ids) == 41 and out["omitted"] == 20
    assert first in ids and ids[-1] == tools.history()[-1]["candidate_id"]


def test_a_retracted_candidate_is_never_best_again_live_or_on_resume(tmp_path):
    times = {"a = 1": 100.0, "a = 2": 90.0, "a = 3": 95.0}
    log = EventLog(tmp_path / "run" / "events.jsonl", "run")
    judge = TimedJudge(times)
    objective = {"problem": "fake", "baseline_us": 956.0, "min_gain": 0.01}
    tools = Toolbox(FakeProblem(tmp_path / "problem"), objective, log, tmp_path / "run", 20, evaluate=judge)
    ids = {}
    for source in ("a = 1", "a = 2"):
        ids[source] = tools.call("write_candidate", source=source)["candidate_id"]
        tools.call("benchmark", candidate_id=ids[source])
    assert tools.best["candidate_id"] == ids["a = 2"]
    used = tools.budget_used
    # the best falls back to the fastest of the rest, logged as a best event after the retraction; free of charge
    after = tools.retract(ids["a = 2"][:8], "failed the tolerance at K 32 on a later draw")
    assert after["candidate_id"] == ids["a = 1"] and after["candidate_us"] == 100.0 and tools.budget_used == used
    tail = [e["kind"] for e in read_events(log.path)][-2:]
    assert tail == ["retract", "best"]
    # a re-timing of the retracted one never makes it best again; a real improvement on the rest does
    assert tools.call("benchmark", candidate_id=ids["a = 2"])["cached"]
    assert tools.best["candidate_id"] == ids["a = 1"]
    ids["a = 3"] = tools.call("write_candidate", source="a = 3")["candidate_id"]
    tools.call("benchmark", candidate_id=ids["a = 3"])
    assert tools.best["candidate_id"] == ids["a = 3"]
    # refused: no reason, unknown, already retracted, never passed a timed verdict
    with pytest.raises(ValueError, match="reason"):
        tools.retract(ids["a = 1"], "  ")
    with pytest.raises(ValueError, match="unknown"):
        tools.retract("ffffffffffff", "x")
    with pytest.raises(ValueError, match="already retracted"):
        tools.retract(ids["a = 2"], "again")
    unjudged = tools.call("write_candidate", source="a = 4")["candidate_id"]
    with pytest.raises(ValueError, match="no passing timed verdict"):
        tools.retract(unjudged, "x")
    # the same best and the same retraction rebuilt from the log
    log.close()
    again = Toolbox(tools.problem, objective, EventLog(log.path, "run"), tools.run_dir, 20, evaluate=judge)
    again.restore(read_events(log.path))
    assert again.best == tools.best and set(again.retracted) == {ids["a = 2"]}
