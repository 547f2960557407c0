"""The embedded search agent: learns from verdicts, never stops on a bad candidate, resumes exactly."""

from __future__ import annotations

from kopt_fake_run import FakeJudge, FakeProblem

from pytest_kopt.agents import agent_class, make_agent
from pytest_kopt.agents.search import SearchAgent
from pytest_kopt.events import read_events
from pytest_kopt.families import parse_family
from pytest_kopt.run import Run, RunOptions
from pytest_kopt.tools import candidate_id

TINY = '''# kopt:knobs-begin
KNOBS = {"BLOCK": 32, "num_warps": 4}
# kopt:knobs-end
SPACE = {"BLOCK": [16, 32], "num_warps": [4, 8]}
'''


def run(tmp_path, budget, *, seed=0, problem=None, name="run", agent=None, resume=False):
    problem = problem or FakeProblem(tmp_path / "problem", broken=True)
    options = RunOptions(problem="fake", budget=budget, run_dir=tmp_path / name, seed=seed, resume=resume)
    with Run(options, problem=problem, evaluate=FakeJudge()) as r:
        agent = agent or SearchAgent(problem=problem, seed=r.options.seed, profile=True)
        outcome = r.execute(agent)
    return outcome, read_events(tmp_path / name / "events.jsonl"), agent


def calls(events):
    return [(e["call"], e["tool"], e["args"].get("candidate_id")) for e in events if e["kind"] == "tool_call"]


def test_factory_builds_the_search_agent_by_name(tmp_path):
    problem = FakeProblem(tmp_path / "p")
    agent = make_agent("search", problem=problem, seed=3, model="ignored", replay_path=None)
    assert isinstance(agent, SearchAgent) and agent.seed == 3
    assert agent_class("search") is SearchAgent


def test_starts_from_the_baseline_the_loop_timed_and_beats_it(tmp_path):
    """The loop times the baseline candidate before the agent starts (call 0): the agent takes that
    verdict as the baseline's outcome and spends its first calls on the next candidate."""
    outcome, events, agent = run(tmp_path, 40)
    baseline = next(e for e in events if e["kind"] == "run_started")["objective"]["baseline_candidate"]
    first = calls(events)[:3]
    assert [c[1] for c in first] == ["write_candidate", "run_tests", "benchmark"] and len({c[2] for c in first}) == 1
    assert baseline not in {c[2] for c in calls(events)}  # never re-written, re-tested or re-timed
    assert agent.tried[baseline] == 956.0  # but the sampler knows its time
    assert outcome.status == "finished" and outcome.budget_used == 40
    assert outcome.best["candidate_id"] != baseline and outcome.best["vs_baseline"] > 5
    assert (tmp_path / "run" / "best.py").read_text() == (tmp_path / "run" / "candidates" / f"{outcome.best['candidate_id']}.py").read_text()


def test_bad_candidates_teach_it_and_never_stop_it(tmp_path):
    outcome, events, agent = run(tmp_path, 80, seed=4)
    failed = {e["candidate_id"] for e in events if e["kind"] == "verdict" and e["verdict"] == "fail"}
    strategies = {e["candidate_id"]: e["strategy"] for e in events if e["kind"] == "candidate"}
    assert failed, "the fake space has failing candidates; the search should meet some"
    assert any(strategies[c] == "broken" for c in failed)
    assert outcome.budget_used == 80  # kept going after every failure
    told = {cid: value for cid, value in agent.tried.items()}
    assert all(told[c] >= 1e29 for c in failed)  # failures were told to the sampler as bad
    # after its random start-up trials, TPE proposes the failing family less than uniformly would
    late = [strategies[e["candidate_id"]] for e in events if e["kind"] == "candidate"][8:]
    assert late.count("broken") < len(late) / 3


def test_each_candidate_is_written_once_and_the_search_stops_when_the_space_is_exhausted(tmp_path):
    problem = FakeProblem(tmp_path / "problem")
    (tmp_path / "tiny.py").write_text(TINY)
    problem.baseline_candidate_path = tmp_path / "tiny.py"
    problem.families = (str(tmp_path / "tiny.py"),)
    outcome, events, _ = run(tmp_path, 200, problem=problem)
    written = [e["candidate_id"] for e in events if e["kind"] == "candidate"]
    assert len(written) == len(set(written)) == 4
    writes = [c[2] for c in calls(events) if c[1] == "write_candidate"]
    baseline = written[0]  # recorded by the loop, which timed it: never written again by a tool call
    assert len(writes) == 3 and set(writes) | {baseline} == set(written)  # no candidate is written twice
    assert outcome.status == "finished" and "nothing left" in outcome.reason and outcome.budget_used < 200


def test_restore_replays_the_log_into_the_same_next_decision(tmp_path):
    problem = FakeProblem(tmp_path / "problem", broken=True)
    _, events, original = run(tmp_path, 23, problem=problem)
    fresh = SearchAgent(problem=problem, seed=0, profile=True)
    fresh.restore(events)
    assert not any("rebuilt" in n for n in fresh.notes)  # replayed, not rebuilt
    for _ in range(10):  # the next decisions agree (results fed identically to both)
        a, b = original.next_action(), fresh.next_action()
        assert (a.tool, a.candidate()) == (b.tool, b.candidate())
        result = {"candidate_id": a.candidate(), "new": True} if a.tool == "write_candidate" else {"verdict": "pass", "candidate_us": 500.0}
        original.observe(a, result)
        fresh.observe(b, result)


def test_a_log_from_another_seed_rebuilds_the_sampler_and_repeats_nothing(tmp_path):
    problem = FakeProblem(tmp_path / "problem", broken=True)
    _, events, _ = run(tmp_path, 30, seed=1, problem=problem)
    outcome, events, agent = run(tmp_path, 60, seed=2, problem=problem, resume=True)
    notes = [e["text"] for e in events if e["kind"] == "note"]
    assert any("rebuilt" in n for n in notes)
    written = [e["candidate_id"] for e in events if e["kind"] == "candidate"]
    assert len(written) == len(set(written))
    writes = [c[2] for c in calls(events) if c[1] == "write_candidate"]
    assert len(writes) - len(set(writes)) <= 1  # at most the unfinished candidate is picked up again
    assert outcome.budget_used == 60


def test_rendered_candidates_are_ordinary_files_with_their_knobs(tmp_path):
    _, events, _ = run(tmp_path, 15)
    for e in (e for e in events if e["kind"] == "candidate" and e["strategy"] in ("slow", "fast")):
        source = (tmp_path / "run" / e["path"]).read_text()
        assert parse_family(source, e["strategy"]).knobs == e["knobs"]


def test_every_family_is_tried_at_its_defaults_right_after_the_baseline(tmp_path):
    problem = FakeProblem(tmp_path / "p")
    _, events, agent = run(tmp_path, 12, problem=problem)
    written = [e for e in events if e["kind"] == "candidate"]
    baseline = next(e for e in events if e["kind"] == "run_started")["objective"]["baseline_candidate"]
    others = [f for f in agent.families.values() if f is not agent.baseline_family]
    assert written[0]["candidate_id"] == baseline
    defaults = {candidate_id(f.render(f.knobs)) for f in others}
    assert {e["candidate_id"] for e in written[1:1 + len(others)]} == defaults


def test_a_family_far_slower_than_the_best_is_not_run_again(tmp_path, monkeypatch):
    from pytest_kopt.agents import search

    def strategies(name):
        _, events, _ = run(tmp_path, 60, problem=FakeProblem(tmp_path / name), name=name)
        return [e["strategy"] for e in events if e["kind"] == "candidate"]

    monkeypatch.setattr(search, "DOMINATED", 1e9)
    assert "slow" in strategies("control")[2:]  # without the rule TPE comes back to the slow family
    monkeypatch.setattr(search, "DOMINATED", 2.0)  # fake times: slow ~1000 us, fast ~100-200 us
    pruned = strategies("pruned")
    assert pruned[:2] == ["slow", "fast"] and len(pruned) > 8
    assert "slow" not in pruned[2:]


def test_try_early_settings_are_measured_right_after_the_defaults(tmp_path):
    problem = FakeProblem(tmp_path / "p")
    fast = tmp_path / "p" / "fast.py"
    fast.write_text(fast.read_text().replace("\n\n\ndef kernel", '\nTRY_EARLY = [{"CHUNK": 16}, {"fuse": True, "num_warps": 8}]\n\n\ndef kernel'))
    _, events, agent = run(tmp_path, 20, problem=problem)
    family = agent.families["fast"]
    early = [candidate_id(family.render({**family.knobs, **t})) for t in family.try_early]
    written = [e["candidate_id"] for e in events if e["kind"] == "candidate"]
    assert len(early) == 2 and written[2:4] == early  # baseline, fast's defaults, then its TRY_EARLY in order


def test_candidates_of_an_edited_family_file_still_teach_the_sampler(tmp_path):
    """After a family file is edited between sessions no logged candidate id matches a render of it.
    The rebuilt sampler still learns every finished candidate's outcome (fast, slow and refused
    regions), but none counts as tried or as the best: the same knobs may be timed again."""
    problem = FakeProblem(tmp_path / "problem", broken=True)
    _, events, _ = run(tmp_path, 30, problem=problem)
    finished = {e["candidate_id"] for e in events if e["kind"] == "verdict"}
    for name in ("fast.py", "slow.py", "broken.py"):  # an edit that changes every rendered id
        path = tmp_path / "problem" / name
        path.write_text(path.read_text() + "\n# edited after the first session\n")
    agent = SearchAgent(problem=problem, seed=0, profile=True)  # (a new FakeProblem would rewrite the files)
    agent.restore(events)
    assert any("earlier version of their family file" in n for n in agent.notes)
    learned = [t for t in agent.study.trials if t.state.name == "COMPLETE"]
    logged = {e["candidate_id"]: e for e in events if e["kind"] == "candidate" and e["strategy"] != "baseline"}
    told = [cid for cid in logged if cid in finished]
    assert len(learned) >= len(told) - 1 > 0  # every finished non-baseline candidate (the baseline file is not a family)
    assert not set(logged) & set(agent.tried) and agent.best is None
    values = sorted(t.value for t in learned)
    assert values[0] < 1e29 and values[-1] >= 1e29  # both timed and refused outcomes were learned


def test_combinations_the_family_refuses_cost_no_tool_call(tmp_path):
    """A family's REQUIRES: the agent tells the sampler the penalty itself and never writes such a
    candidate, so the budget goes to combinations the family can serve."""
    problem = FakeProblem(tmp_path / "problem")
    (tmp_path / "tiny.py").write_text(TINY + 'REQUIRES = [({"num_warps": 8}, {"BLOCK": [16]})]\n')
    problem.baseline_candidate_path = tmp_path / "tiny.py"
    problem.families = (str(tmp_path / "tiny.py"),)
    outcome, events, agent = run(tmp_path, 200, problem=problem)
    written = [e["knobs"] for e in events if e["kind"] == "candidate"]
    assert {"BLOCK": 32, "num_warps": 8} not in written
    assert len(written) == 3  # the four combinations less the refused one
    assert outcome.status == "finished" and "nothing left" in outcome.reason
