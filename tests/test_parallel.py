"""Several evaluations in flight (``--kopt-workers``): budget accounting, call order, contention, resume.

The loops run against the fake judge of kopt_fake_run.py (its ``spread`` makes evaluations take 1-3x
their delay, so results land out of order); the chaos test kills a child with several calls in flight
at random moments and resumes it; the Ray tests (tests/test_parallel_ray.py) run the same checks on a
local Ray instance.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kopt_fake_run import FAST as FAST_SOURCE
from kopt_fake_run import FakeJudge, FakeProblem

from pytest_kopt import events as ev
from pytest_kopt.agents.search import SearchAgent
from pytest_kopt.events import EventLog, read_events
from pytest_kopt.executor import LocalExecutor
from pytest_kopt.families import parse_family
from pytest_kopt.run import Run, RunOptions
from pytest_kopt.runstate import RunState
from pytest_kopt.tools import Toolbox, candidate_id

DRIVER = Path(__file__).with_name("kopt_fake_run.py")
BUDGET = 40
CHAOS_BUDGET = 60
SEED = int(os.environ.get("KOPT_RESUME_SEED", "20251201"))


def run_loop(run_dir: Path, workers: int, budget: int = BUDGET, delay: float = 0.03, executor: str = "local", resume: bool = False) -> list[dict]:
    problem = FakeProblem(run_dir.parent / "fake-problem", broken=True)
    options = RunOptions(problem="fake", budget=budget, run_dir=run_dir, resume=resume, workers=workers, executor=executor)
    with Run(options, problem=problem, evaluate=FakeJudge(delay, spread=True)) as run:
        outcome = run.execute(SearchAgent(problem=problem, seed=run.options.seed, profile=True))
    assert outcome.status == "finished" and outcome.budget_used == budget
    return read_events(run_dir / "events.jsonl")


def check_accounting(run_dir: Path, budget: int = BUDGET) -> list[dict]:
    """What a finished run must show, however many workers: every call number 1..budget charged exactly
    once, every call issued was answered (or given up in a note, uncharged), results and verdicts agree,
    and the best the run ended with is the one a fold of its log decides."""
    events = read_events(run_dir / "events.jsonl")
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    results = [e["call"] for e in events if e["kind"] == ev.TOOL_RESULT]
    assert sorted(results) == list(range(1, budget + 1)), "each call is charged exactly once"
    issued = {e["call"] for e in events if e["kind"] == ev.TOOL_CALL}
    abandoned = {e["abandoned"] for e in events if e["kind"] == ev.NOTE and "abandoned" in e}
    assert issued <= set(results) | abandoned, "no call issued is lost"
    end = events[-1]
    assert end["kind"] == ev.RUN_FINISHED and end["budget_used"] == budget
    state = RunState.fold(events)
    assert state.budget_used == budget and not state.pending
    assert end["best"]["candidate_id"] == state.best["candidate_id"], "a replay of the log decides the same best"
    # the best changes in call order, each to a verdict that was timed alone
    verdicts = {(e["candidate_id"], e["call"]): e for e in events if e["kind"] == ev.VERDICT}
    bests = [e for e in events if e["kind"] == ev.BEST]
    assert [b["call"] for b in bests] == sorted(b["call"] for b in bests)
    for best in bests:
        assert not verdicts[(best["candidate_id"], best["call"])].get("contended")
    for e in events:  # the evaluation a result reports is the verdict of the same call
        if e["kind"] == ev.TOOL_RESULT and e["tool"] in ("run_tests", "benchmark", "profile") and not e["result"].get("cached") and not e["result"].get("error"):
            assert (e["result"]["candidate_id"], e["call"]) in verdicts
    return events


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_loops_with_several_workers_account_for_the_budget_as_one_does(tmp_path, workers):
    events = run_loop(tmp_path / "run", workers)
    check_accounting(tmp_path / "run")
    started = events[0]
    assert started["workers"] == workers and started["executor"]["executor"] == "local"
    in_flight = max_in_flight(events)
    assert in_flight <= workers
    if workers > 1:
        assert in_flight > 1, "evaluations ran at once"
        landed = [e["call"] for e in events if e["kind"] == ev.TOOL_RESULT]
        assert landed != sorted(landed), "results landed out of call order"
        contended = [e for e in events if e["kind"] == ev.VERDICT and e.get("contended")]
        assert contended and all(e["candidate_us"] is not None for e in contended)
        assert all(e.get("placement", {}).get("device") == "cpu" for e in events if e["kind"] == ev.VERDICT and e["call"])
    else:
        assert not any(e.get("contended") for e in events if e["kind"] == ev.VERDICT)


def max_in_flight(events: list[dict]) -> int:
    """The most evaluations issued and not yet answered at once."""
    open_: set[int] = set()
    most = 0
    for e in events:
        if e["kind"] == ev.TOOL_CALL and e["tool"] in ("run_tests", "benchmark", "profile"):
            open_.add(e["call"])
            most = max(most, len(open_))
        elif e["kind"] == ev.TOOL_RESULT:
            open_.discard(e["call"])
    return most


def test_trials_asked_together_differ(tmp_path):
    """Optuna's ask/tell with the constant liar: a batch of proposals asked before any is told are
    different candidates."""
    problem = FakeProblem(tmp_path / "p")
    agent = SearchAgent(problem=problem, seed=3, profile=False)
    agent.restore([])
    agent.width = 4
    agent._fill()
    cids = [proposal.cid for proposal, _ in agent.outbox]
    assert len(cids) == 4 and len(set(cids)) == 4
    assert all(action.tool == "write_candidate" for _, action in agent.outbox)


# ---- call order -----------------------------------------------------------------------------------
def _verdict(call: int, cid: str, us: float, **extra) -> dict:
    return {"kind": ev.VERDICT, "candidate_id": cid, "upto": "benchmark", "verdict": "pass", "stage": "benchmark",
            "candidate_us": us, "call": call, **extra}


def _events(*pairs) -> list[dict]:
    out = [{"kind": ev.RUN_STARTED, "objective": {"min_gain": 0.01}, "problem": "fake", "budget": 10}]
    out += [dict(e, seq=i + 2) for i, e in enumerate(pairs)]
    return out


def test_the_best_is_decided_in_call_order_not_in_the_order_results_land():
    # A (call 1, 100 us) and B (call 2, 99.5 us: within the 1 % min_gain of A): whichever is weighed first is best
    call = lambda n, tool="benchmark": {"kind": ev.TOOL_CALL, "call": n, "tool": tool, "args": {}}
    result = lambda n: {"kind": ev.TOOL_RESULT, "call": n, "tool": "benchmark", "result": {}}
    landed_late = _events(call(1), call(2), _verdict(2, "b", 99.5), result(2), _verdict(1, "a", 100.0), result(1))
    state = RunState.fold(landed_late)
    assert state.best["candidate_id"] == "a"  # call 1 is weighed before call 2, though its result came later
    waiting = RunState.fold(landed_late[:5])  # B landed, A still in flight: B is not weighed yet
    assert waiting.best is None and waiting.in_flight["call"] == 1
    in_order = _events(call(1), _verdict(1, "a", 100.0), result(1), call(2), _verdict(2, "b", 99.5), result(2))
    assert RunState.fold(in_order).best["candidate_id"] == "a"
    # a call given up on resume (a note says so) holds nothing back
    given_up = _events(call(1), call(2), _verdict(2, "b", 99.5), result(2), {"kind": ev.NOTE, "text": "x", "abandoned": 1})
    assert RunState.fold(given_up).best["candidate_id"] == "b"


def test_a_contended_timing_is_never_the_best():
    contended = _events(_verdict(0, "base", 500.0), _verdict(1, "fast", 100.0, contended=True))
    state = RunState.fold(contended)
    assert state.best["candidate_id"] == "base"
    assert state.candidates["fast"].candidate_us == 100.0  # still shown, flagged, in the history
    alone = _events(_verdict(0, "base", 500.0), _verdict(1, "fast", 100.0, contended=True), _verdict(2, "fast", 104.0))
    state = RunState.fold(alone)
    assert state.best["candidate_id"] == "fast" and state.best["candidate_us"] == 104.0 and state.best["call"] == 2
    assert state.candidates["fast"].fastest["call"] == 2  # an uncontended timing stands for the candidate


class Gate(FakeJudge):
    """A fake judge whose evaluations wait for ``release`` (per candidate), so a test decides the order."""

    def __init__(self):
        super().__init__()
        self.release: dict[str, threading.Event] = {}
        self.kwargs: list[dict] = []

    def __call__(self, problem_name, candidate_path, **kwargs):
        self.kwargs.append(kwargs)
        gate = self.release.setdefault(Path(candidate_path).stem, threading.Event())
        assert gate.wait(20), "the test never released this evaluation"
        return super().__call__(problem_name, candidate_path, **kwargs)


FAST = parse_family(FAST_SOURCE, "fast")


def toolbox(tmp_path: Path, judge, executor, budget: int = 20) -> Toolbox:
    problem = FakeProblem(tmp_path / "problem")
    log = EventLog(tmp_path / "run" / "events.jsonl", "run")
    return Toolbox(problem, {"problem": "fake", "baseline_us": 956.0, "min_gain": 0.01}, log, tmp_path / "run", budget, evaluate=judge, executor=executor)


def test_live_results_out_of_order_give_the_best_a_replay_gives(tmp_path):
    judge = Gate()
    tools = toolbox(tmp_path, judge, LocalExecutor(2, devices=["0", "1"]))
    first = FAST.render({"CHUNK": 64, "num_warps": 8, "fuse": False})  # 148 us
    second = FAST.render({"CHUNK": 64, "num_warps": 8, "fuse": True})  # 141 us: beats the first by more than 1 %
    a, b = (tools.call("write_candidate", source=s)["candidate_id"] for s in (first, second))
    na, nb = tools.submit("benchmark", candidate_id=a), tools.submit("benchmark", candidate_id=b)
    assert (na, nb) == (3, 4) and tools.state.issued == 4 and tools.budget_used == 2
    judge.release.setdefault(b, threading.Event()).set()
    assert tools.next_result()[0] == nb  # b landed first ...
    assert tools.best is None  # ... but waits for call 3, which is still in flight
    judge.release.setdefault(a, threading.Event()).set()
    assert tools.next_result()[0] == na
    assert tools.best["candidate_id"] == b and tools.best["call"] == nb  # a first (call 3), then b beat it
    events = read_events(tools.log.path)
    assert RunState.fold(events).best == tools.best
    assert [(e["candidate_id"], e["call"]) for e in events if e["kind"] == ev.BEST] == [(a, na), (b, nb)]
    # one GPU each, one judge slot pair each (the candidate's runner 2k, the incumbent's 2k + 1)
    assert sorted((k["visible_devices"], k["slot"]) for k in judge.kwargs) == [("0", 0), ("1", 2)]
    verdicts = [e for e in events if e["kind"] == ev.VERDICT]
    assert not any(v.get("contended") for v in verdicts)
    assert {v["placement"]["device"] for v in verdicts} == {"cuda:0", "cuda:1"}


def test_more_workers_than_gpus_share_one_and_are_flagged_contended(tmp_path):
    judge = Gate()
    tools = toolbox(tmp_path, judge, LocalExecutor(2, devices=["5"]))
    one = FAST.render({"CHUNK": 32, "num_warps": 8, "fuse": True})  # 93 us
    two = FAST.render({"CHUNK": 32, "num_warps": 4, "fuse": True})  # 105 us
    a, b = (tools.call("write_candidate", source=s)["candidate_id"] for s in (one, two))
    tools.submit("benchmark", candidate_id=a)
    tools.submit("benchmark", candidate_id=b)
    for cid in (a, b):
        judge.release.setdefault(cid, threading.Event()).set()
    got = [tools.next_result()[2] for _ in range(2)]
    assert all(r["contended"] for r in got) and tools.best is None
    assert [k["visible_devices"] for k in judge.kwargs] == ["5", "5"]
    # asked again, the contended timing is not answered from the cache: the candidate is timed afresh, alone
    again = tools.call("benchmark", candidate_id=a)
    assert not again.get("cached") and not again.get("contended")
    assert tools.best["candidate_id"] == a
    lines = [e for e in read_events(tools.log.path) if e["kind"] == ev.VERDICT]
    assert [bool(v.get("contended")) for v in lines] == [True, True, False]


def test_a_budget_is_never_overdrawn_by_calls_in_flight(tmp_path):
    judge = FakeJudge(0.05)
    tools = toolbox(tmp_path, judge, LocalExecutor(3, devices=[]), budget=4)
    cid = tools.call("write_candidate", source=FAST.render({"CHUNK": 32, "num_warps": 8, "fuse": True}))["candidate_id"]
    for _ in range(3):
        tools.submit("run_tests", candidate_id=cid)
    from pytest_kopt.tools import BudgetExhausted

    with pytest.raises(BudgetExhausted):
        tools.submit("history")
    tools.drain()
    assert tools.budget_used == 4 and tools.calls_left == 0
    assert sorted(e["call"] for e in read_events(tools.log.path) if e["kind"] == ev.TOOL_RESULT) == [1, 2, 3, 4]


# ---- kill -9 with several calls in flight ------------------------------------------------------------
def launch(run_dir: Path, workers: int, delay: float, budget: int = BUDGET) -> subprocess.Popen:
    resume = ["--resume"] if run_dir.exists() else []
    return subprocess.Popen(
        [sys.executable, str(DRIVER), str(run_dir), str(budget), "--delay", str(delay), "--workers", str(workers), "--spread", *resume],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("timed out waiting for the child")


def pending(run_dir: Path) -> list[int]:
    log = run_dir / "events.jsonl"
    return sorted(RunState.fold(read_events(log)).pending) if log.exists() else []


def test_kill_9_with_several_calls_in_flight_loses_and_double_charges_nothing(tmp_path):
    rng = random.Random(SEED)
    run_dir = tmp_path / "run"
    log = run_dir / "events.jsonl"
    kills, several, used = 0, 0, 0
    for _ in range(10):
        before = size(log)
        proc = launch(run_dir, 3, delay=0.12, budget=CHAOS_BUDGET)
        wait_for(lambda: size(log) > before + 1500 or proc.poll() is not None)
        time.sleep(rng.uniform(0.0, 0.5))
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        kills += 1
        flying = pending(run_dir)
        several += len(flying) > 1
        state = RunState.fold(read_events(log))
        assert state.budget_used >= used, "budget went backwards"
        used = state.budget_used
        assert all(n <= CHAOS_BUDGET for n in state.calls)
    print(f"seed {SEED}: {kills} kills, {several} with several calls in flight, {used} calls charged before the last launch")
    assert kills >= 5 and several >= 2, f"the kills did not land with calls in flight (seed {SEED})"
    proc = launch(run_dir, 3, delay=0.0, budget=CHAOS_BUDGET)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    events = check_accounting(run_dir, CHAOS_BUDGET)
    # each resume redid every call its predecessor left in flight, once each, under its own number (a redo
    # killed in flight is redone by the next resume: still charged once, as check_accounting showed)
    sessions: list[tuple[list[int], list[int]]] = []
    for e in events:
        if e["kind"] == ev.RUN_RESUMED:
            sessions.append((e["in_flight_calls"], []))
        elif e["kind"] == ev.TOOL_CALL and e.get("redo"):
            sessions[-1][1].append(e["call"])
    assert sum(len(flying) for flying, _ in sessions) >= 2
    for flying, redone in sessions:
        assert sorted(redone) == flying
    # the search agent rebuilt itself from the log by replaying it, never by the fallback
    assert not any("not written by this agent" in e.get("text", "") for e in events if e["kind"] == ev.NOTE)
    assert (run_dir / "best.py").read_text() == (run_dir / "candidates" / f"{events[-1]['best']['candidate_id']}.py").read_text()
    for e in events:
        if e["kind"] == ev.CANDIDATE:
            assert candidate_id((run_dir / e["path"]).read_text()) == e["candidate_id"]


def test_a_resume_finishes_a_run_killed_with_calls_in_flight_like_one_that_was_not(tmp_path):
    """Killed with several evaluations in flight and resumed with the same workers, the search goes on as
    its log says: the resumed agent's replay of the log matches every call it made."""
    run_dir = tmp_path / "run"
    proc = launch(run_dir, 2, delay=0.3)
    wait_for(lambda: len(pending(run_dir)) >= 2 and sum(1 for e in read_events(run_dir / "events.jsonl") if e["kind"] == ev.TOOL_RESULT) >= 6)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    flying = pending(run_dir)
    assert flying
    proc = launch(run_dir, 2, delay=0.0)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    events = check_accounting(run_dir)
    resumed = next(e for e in events if e["kind"] == ev.RUN_RESUMED)
    assert resumed["in_flight_calls"] == flying
    for n in flying:
        assert [e.get("redo", False) for e in events if e["kind"] == ev.TOOL_CALL and e["call"] == n] == [False, True]



def test_parallel_judges_are_pinned_one_gpu_each_and_die_with_the_loop(tmp_path):
    """Two real evaluations in flight (the toy problem, a candidate that never returns): each has its own
    supervisor and runner, on its own judge slot (runner scratch s0-, s2-), its supervisor sees only its
    GPU; kill -9 of the loop takes all four processes with it."""
    from test_judge_isolation import HOSTILE, TESTS, _alive, _processes

    script = tmp_path / "loop.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(TESTS)!r})\n"
        "import judge_toy_problem\n"
        "from pytest_kopt.executor import LocalExecutor\n"
        "from pytest_kopt.judge import evaluate\n"
        "ex = LocalExecutor(2, devices=['0', '1'])\n"
        "for _ in range(2):\n"
        f"    ex.submit(evaluate, judge_toy_problem.AXPY.name, {str(HOSTILE / 'hangs.py')!r}, dict(quick=True, upto='correctness', timeout_s=600))\n"
        "time.sleep(600)\n")
    loop = subprocess.Popen([sys.executable, str(script)], start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        supervisors, runners = [], []
        while time.monotonic() < deadline:
            supervisors = _processes(f"kopt-eval-{loop.pid}-")
            slots = {slot: pid for s in supervisors for slot in (0, 2) for pid in _processes(f"s{slot}-{s}-")}
            runners = list(slots.values())
            if len(supervisors) == 2 and len(runners) >= 2 and all(_alive(p) for p in runners):
                break
            time.sleep(0.5)
        assert len(supervisors) == 2 and set(slots) == {0, 2}, "the two evaluations never reached their runners, one slot each"
        seen = set()
        for pid in supervisors:
            env = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in item)
            seen.add(env.get("CUDA_VISIBLE_DEVICES"))
        assert seen == {"0", "1"}
        time.sleep(1)
        os.kill(loop.pid, signal.SIGKILL)
        loop.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(p) for p in supervisors + runners):
            time.sleep(0.2)
        assert not [p for p in supervisors + runners if _alive(p)], "a judge process outlived its loop"
    finally:
        if loop.poll() is None:
            os.killpg(loop.pid, signal.SIGKILL)


def test_the_llm_agent_issues_the_calls_of_a_reply_together(tmp_path):
    """Three benchmarks in one reply run at once, each one call of the budget, answered in the reply's order;
    the system message says evaluations run in parallel and what a contended time means."""
    from fake_openai_server import FakeOpenAI, Reply, call
    from test_llm_agent import agent, fake_evaluate, objective, source

    from pytest_kopt.problems import get_problem

    def slow(problem, path, **kw):
        time.sleep(0.3)
        return fake_evaluate(problem, path, **kw)

    sources = [source(f"p{i}", f"us={400 - 50 * i}") for i in range(3)]
    ids = [candidate_id(s) for s in sources]
    script = [Reply([call("write_candidate", source=s) for s in sources]),
              Reply([call("benchmark", candidate_id=c) for c in ids]),
              Reply([call("history")])]
    run_dir = tmp_path / "run"
    log = EventLog(run_dir / "events.jsonl", run_id="run")
    tools = Toolbox(get_problem("kda"), objective(), log, run_dir, 7, evaluate=slow, executor=LocalExecutor(3, devices=[]))
    with FakeOpenAI(script) as server:
        llm = agent(server)
        llm.restore([])
        while tools.calls_left:
            llm.act(tools)
        bodies = [r["body"] for r in server.requests]
    events = read_events(log.path)
    assert max_in_flight(events) == 3
    kinds = [(e["kind"], e.get("call")) for e in events if e["kind"] in (ev.TOOL_CALL, ev.TOOL_RESULT) and e["call"] in (4, 5, 6)]
    assert kinds[:3] == [(ev.TOOL_CALL, 4), (ev.TOOL_CALL, 5), (ev.TOOL_CALL, 6)]  # all issued before any result
    assert "Up to 3 evaluations run at once" in bodies[1]["messages"][0]["content"]
    answered = [m for m in bodies[2]["messages"] if m["role"] == "tool"][-3:]
    reply = next(m for m in bodies[2]["messages"] if m["role"] == "assistant" and "benchmark" in json.dumps(m))
    assert [m["tool_call_id"] for m in answered] == [c["id"] for c in reply["tool_calls"]]
    assert [json.loads(m["content"])["candidate_id"] for m in answered] == ids
    assert all(json.loads(m["content"]).get("contended") for m in answered)  # three at once on one CPU
    assert tools.budget_used == 7 and tools.best is None  # contended timings are not a best
