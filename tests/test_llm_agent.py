"""The LLM agent against a scripted chat-completions server on 127.0.0.1, through the real
openai client: a working session, misbehaving models and endpoints, compaction, kill and
resume, replay, and ``kopt memory``.

Most tests use a fast fake judge (the Toolbox takes an injectable evaluator): a candidate's
source says what the fake judge makes of it (``# fake: us=120``, ``compile-error``, ``wrong``,
``hang``). The end-to-end tests at the bottom run pytest itself with the real judge.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fake_openai_server import Error, FakeOpenAI, Hang, Reply, call, candidate_id
from pytest_kopt import cli
from pytest_kopt.agents import make_agent
from pytest_kopt.agents.llm import CONTINUE, NUDGE, EndpointError, EndpointUnavailable, LLMAgent
from pytest_kopt.agents.memory import build_memory
from pytest_kopt.agents.replay import ReplayAgent
from pytest_kopt.events import EventLog, read_events
from pytest_kopt.problems import get_problem
from pytest_kopt.tools import MAX_SOURCE_CHARS, BudgetExhausted, Toolbox

REPO = Path(__file__).resolve().parents[1]
SECRET = "sk-test-7Hq2-not-a-real-key-31337"


# ---- a fast fake judge ------------------------------------------------------------------
def fake_evaluate(problem_name: str, candidate_path: str, *, upto: str = "profile", **_: object) -> dict:
    """Reads ``# fake: MODE`` from the candidate; what a real judge would say about it."""
    source = Path(candidate_path).read_text()
    mode = (re.search(r"# fake: (\S+)", source) or [None, "us=100"])[1]
    head = {"problem": problem_name, "candidate": candidate_path, "candidate_id": Path(candidate_path).stem, "device": "cpu", "duration_s": 0.01}
    if mode == "hang" and os.environ.get("KOPT_FAKE_HANG") == "1":
        time.sleep(60)  # killed long before this ends
    if mode == "compile-error":
        return {**head, "verdict": "fail", "stage": "compile", "reasons": ["CompilationError at 12:8: 'tl.dott' is not defined"]}
    if mode == "wrong":
        err = {"case": {"B": 1, "T": 3, "H": 1, "K": 16, "V": 16}, "output": "o", "rel_rms": 0.31, "tolerance": 5e-3, "ok": False}
        return {**head, "verdict": "fail", "stage": "correctness", "errors": [err], "reasons": ["o: relative RMS error 0.31 > tolerance 0.005 at B1 T3 H1 K16 V16 (minimal failing shape)"]}
    us = float(mode.split("=")[1]) if mode.startswith("us=") else 300.0
    if upto == "correctness":
        return {**head, "verdict": "pass", "stage": "correctness", "reasons": [], "errors": []}
    result = {
        **head, "verdict": "pass", "stage": upto, "reasons": [], "errors": [],
        "timings": {"case": "B1 T8192 H16 K128 V128", "candidate_us": us, "baselines": {"kda_recurrent": 1000.0}, "reference_us": 5000.0, "compile_s": 0.1},
        "speedup": 1000.0 / us,
        "roofline": {"floor_us": 50.0, "achieved_GBps": 1.0, "achieved_TFLOPs": 0.1, "floor_fraction": 50.0 / us},
    }
    if upto == "profile":
        result["profile"] = {"kernels": [{"name": "_kda_fwd_kernel", "us": us * 0.8, "calls": 1}, {"name": "_kda_prep", "us": us * 0.2, "calls": 1}]}
    return result


def source(tag: str, mode: str) -> str:
    return f"# candidate {tag}\n# fake: {mode}\nimport triton\n\n\ndef kernel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):\n    return None, None\n"


BROKEN, V1, V2 = source("v0", "compile-error"), source("v1", "us=500"), source("v2", "us=250")


def objective() -> dict:
    return {**get_problem("kda").summary(), "baseline_us": 1000.0, "floor_us": 50.0}


def toolbox(run_dir: Path, budget: int = 100) -> Toolbox:
    log = EventLog(run_dir / "events.jsonl", run_id=run_dir.name)
    tools = Toolbox(get_problem("kda"), objective(), log, run_dir, budget, evaluate=fake_evaluate)
    tools.restore(read_events(log.path))
    return tools


def agent(server: FakeOpenAI | str, **kw: object) -> LLMAgent:
    base_url = server if isinstance(server, str) else server.base_url
    settings = dict(model="fake-model", base_url=base_url, max_retries=1, pause_s=0.01, max_pauses=2, request_timeout=10)
    settings.update(kw)
    return LLMAgent(**settings)


def drive(a: LLMAgent | ReplayAgent, tools: Toolbox, steps: int = 60) -> str:
    """The loop, minus its bookkeeping: act until the agent or the budget stops."""
    for _ in range(steps):
        try:
            if not a.act(tools):
                return "done"
        except BudgetExhausted:
            return "budget"
    raise AssertionError(f"the agent did not stop within {steps} steps")


def events_of(run_dir: Path, kind: str) -> list[dict]:
    return [e for e in read_events(run_dir / "events.jsonl") if e["kind"] == kind]


def tool_messages(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


SESSION = [
    Reply([call("show_problem")]),
    Reply([call("write_candidate", source=BROKEN, notes="v0: one program per head")], content="A first kernel."),
    Reply([call("run_tests", candidate_id=candidate_id(BROKEN))]),
    Reply([call("write_candidate", source=V1, notes="v1: fix tl.dot typo", parent=candidate_id(BROKEN)), call("run_tests", candidate_id=candidate_id(V1))]),
    Reply([call("benchmark", candidate_id=candidate_id(V1))]),
    Reply([call("write_candidate", source=V2, notes="v2: BV=64, predict 2x", parent=candidate_id(V1)), call("benchmark", candidate_id=candidate_id(V2))]),
    Reply([call("profile", candidate_id=candidate_id(V2))]),
    Reply([call("history")]),
    Reply(content="I think this is as fast as it gets."),
    Reply(content="Done."),
    Reply(content="Done, really."),
]


# ---- a working session --------------------------------------------------------------------

def kill_during_run_tests(proc: subprocess.Popen, run_dir: Path, *, timeout_s: float) -> None:
    """SIGKILL the process group once the log shows a run_tests call (the fake judge hangs in it)."""
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            log = run_dir / "events.jsonl"
            if log.exists() and any(e["kind"] == "tool_call" and e["tool"] == "run_tests" for e in read_events(log)):
                break
            time.sleep(0.1)
        assert proc.poll() is None, "the process ended before the in-flight call"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

def test_scripted_session_fix_benchmark_improve(tmp_path: Path) -> None:
    tools = toolbox(tmp_path)
    with FakeOpenAI(SESSION) as server:
        a = agent(server)
        a.restore([])
        assert drive(a, tools) == "done"
    bodies = [r["body"] for r in server.requests]
    assert len(bodies) == len(SESSION)

    # the objective, the rules and the current best head every request
    for body in bodies:
        system = body["messages"][0]
        assert system["role"] == "system"
        assert "Problem: kda" in system["content"] and "Triton only" in system["content"]
        assert "baseline_us: 1000.0" in system["content"]
    assert "Current best: none yet" in bodies[4]["messages"][0]["content"]
    assert f"Current best: {candidate_id(V1)}, 500.0 us" in bodies[5]["messages"][0]["content"]
    assert f"Current best: {candidate_id(V2)}, 250.0 us" in bodies[-1]["messages"][0]["content"]

    # tool specs come from the Toolbox, minus the search agent's arguments
    specs = {t["function"]["name"]: t["function"] for t in bodies[0]["tools"]}
    assert set(specs) == set(Toolbox.SCHEMAS)
    assert set(specs["write_candidate"]["parameters"]["properties"]) == {"source", "notes", "parent"}

    # the compile error reached the model; a reply without a tool call got a nudge
    assert any("tl.dott" in m for m in tool_messages(bodies[3]))
    assert bodies[9]["messages"][-1] == {"role": "user", "content": NUDGE}

    assert tools.best["candidate_id"] == candidate_id(V2)
    assert tools.budget_used == 10
    cands = events_of(tmp_path, "candidate")
    assert [c["candidate_id"] for c in cands] == [candidate_id(s) for s in (BROKEN, V1, V2)]
    assert {c["strategy"] for c in cands} == {"llm"}
    assert cands[2]["notes"] == "v2: BV=64, predict 2x" and cands[2]["parent"] == candidate_id(V1)

    requests, responses = events_of(tmp_path, "llm_request"), events_of(tmp_path, "llm_response")
    assert len(requests) == len(responses) == len(SESSION)
    assert all(r["usage"]["prompt_tokens"] > 0 and r["usage"]["completion_tokens"] > 0 for r in responses)
    logged = [r["system"] for r in requests if r["system"] is not None]  # logged when it changes
    assert requests[0]["system"] is not None and len(logged) < len(requests)
    assert all(x != y for x, y in zip(logged, logged[1:]))


# ---- misbehaving models -------------------------------------------------------------------
def test_malformed_and_hostile_tool_calls_get_errors_not_crashes(tmp_path: Path) -> None:
    script = [
        Reply([("write_candidate", '{"source": "x", notes: oops')]),
        Reply([("run_tests", "[1, 2]")]),
        Reply([call("run_tests", candidate_id="deadbeef0000")]),
        Reply([call("write_candidate", source="#" * (MAX_SOURCE_CHARS + 1))]),
        Reply([call("frobnicate", x=1)]),
        Reply([call("run_tests")]),
        Reply([call("write_candidate", source=V1), call("benchmark", candidate_id=candidate_id(V1))]),
    ]
    tools = toolbox(tmp_path)
    with FakeOpenAI(script) as server:
        a = agent(server)
        a.restore([])
        assert drive(a, tools) == "done"
    # what the model got back, in the request after each of its replies
    replies = [r["body"]["messages"][-1]["content"] for r in server.requests[1:]]
    assert "not valid JSON" in replies[0]
    assert "must be a JSON object" in replies[1]
    assert "unknown candidate_id 'deadbeef0000'" in replies[2]
    # 200k characters overflow a small model's context: the memory carries the error across
    assert f"the limit is {MAX_SOURCE_CHARS}" in replies[3] and "## Last tool results" in replies[3]
    assert "unknown tool 'frobnicate'" in replies[4]
    assert "needs argument(s) candidate_id" in replies[5]
    assert tools.best["candidate_id"] == candidate_id(V1)  # and the session went on working
    # every call cost one, the two unparseable ones too: they ran nothing and are logged as calls with their error
    assert tools.budget_used == 8
    calls, results = events_of(tmp_path, "tool_call"), events_of(tmp_path, "tool_result")
    assert [e["tool"] for e in calls[:2]] == ["write_candidate", "run_tests"]
    assert "not valid JSON" in calls[0]["rejected"] and calls[0]["args"]["raw"].startswith('{"source": "x"')
    assert "must be a JSON object" in results[1]["result"]["error"]


def test_malformed_replies_in_a_row_stop_the_run_as_a_failure_not_a_success(tmp_path: Path) -> None:
    """Each malformed call costs one; ``max_malformed`` replies in a row of them end the run with a
    resumable error and a run_interrupted event that says why (the loop then exits non-zero)."""
    from pytest_kopt.agents.llm import ModelMisbehaving
    from pytest_kopt.run import Run, RunOptions

    garbage = [Reply([("write_candidate", '{"source": "x", notes: oops')]), Reply([("history", "[1]")]),
               Reply([("run_tests", "not json at all"), ("benchmark", "{")])]
    with FakeOpenAI([Reply([call("show_problem")])] + garbage) as server:
        options = RunOptions(problem="kda", budget=20, run_dir=tmp_path / "run")
        with Run(options, problem=get_problem("kda"), evaluate=fake_evaluate) as run:
            with pytest.raises(ModelMisbehaving, match="3 replies in a row") as info:
                run.execute(agent(server, max_malformed=3))
    assert info.value.resumable
    events = read_events(tmp_path / "run" / "events.jsonl")
    end = events[-1]
    assert end["kind"] == "run_interrupted" and "malformed" in end["reason"] and end["budget_used"] == 5
    assert [e.get("rejected") is not None for e in events if e["kind"] == "tool_call"] == [False, True, True, True, True]
    assert run.outcome.status == "interrupted" and not run.outcome.ok


def test_a_text_reply_breaks_a_malformed_streak(tmp_path: Path) -> None:
    tools = toolbox(tmp_path)
    script = [Reply([("history", "[1]")]), Reply(content="thinking"), Reply([("history", "[1]")]), Reply([call("history")])]
    with FakeOpenAI(script) as server:
        a = agent(server, max_malformed=2, max_idle_turns=5)
        a.restore([])
        for _ in range(4):
            assert a.act(tools)
    assert tools.budget_used == 3


def test_the_key_is_scrubbed_from_everything_a_run_keeps_and_its_replay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model (or a server) that echoes the bearer key into a candidate, its notes and its text: the key
    reaches no file of the run (log, candidates, evaluations), no later request, no compaction memory, and
    no file of a replay of the run."""
    monkeypatch.setenv("KOPT_TEST_KEY", SECRET)
    leaky = source("leak", "us=400").replace("import triton", f"import triton  # {SECRET}")
    leaky_scrubbed = leaky.replace(SECRET, "***")
    script = [
        Reply([call("write_candidate", source=leaky, notes=f"key is {SECRET}"), call("benchmark", candidate_id=candidate_id(leaky_scrubbed))],
              content=f"my key: {SECRET}"),
        Reply([call("history")]),
        Reply([call("show_candidate", candidate_id=candidate_id(leaky_scrubbed))]),
    ] + long_session(2)
    recorded = tmp_path / "recorded"
    tools = toolbox(recorded)
    with FakeOpenAI(script) as server:
        a = agent(server, api_key_env="KOPT_TEST_KEY", context_tokens=1500, max_idle_turns=1)
        a.restore([])
        drive(a, tools)
    assert events_of(recorded, "compaction")  # the memory was built and sent
    assert tools.best is not None and (recorded / "candidates" / f"{candidate_id(leaky_scrubbed)}.py").is_file()
    assert_secret_nowhere(recorded)
    for request in server.requests[1:]:  # the first request precedes any reply
        assert SECRET not in json.dumps(request["body"])
    replayed = tmp_path / "replayed"
    r = ReplayAgent(replay_path=recorded / "events.jsonl")
    r.restore([])
    drive(r, toolbox(replayed))
    assert events_of(replayed, "candidate") and not events_of(replayed, "note")
    assert_secret_nowhere(replayed)


def test_the_system_message_states_the_objective_as_a_geometric_mean_over_the_timed_cases() -> None:
    from pytest_kopt.agents.llm import render_objective
    from pytest_kopt.run import objective_text

    case = "geomean of B1 T8192 H16 K128 V128 +hT | B2 T16384 H16 K128 V128 +hT | B8 T1024 H8 K64 V64 +hT"
    text = render_objective({**objective(), "metric": "eager", "score": objective_text("eager", True), "case": case}, None, 0, 100)
    assert "geometric mean over the timed cases" in text and "eager time" in text and f"Timed on: {case}" in text
    assert "headline shape;" not in text and "THE target" not in text


def test_a_context_budget_smaller_than_the_memory_is_warned_about_once(tmp_path: Path) -> None:
    tools = toolbox(tmp_path)
    with FakeOpenAI(long_session(4)) as server:
        a = agent(server, context_tokens=200, max_idle_turns=1)
        a.restore([])
        drive(a, tools)
    assert len(events_of(tmp_path, "compaction")) >= 2
    warnings = [e["text"] for e in events_of(tmp_path, "note") if "context budget" in e["text"]]
    assert len(warnings) == 1 and "(200 tokens) is smaller than" in warnings[0] and "--kopt-context-tokens" in warnings[0]


def test_quirky_server_replies_are_normalized(tmp_path: Path) -> None:
    """Arguments sent as a JSON object instead of its text, and tool calls without ids."""
    tools = toolbox(tmp_path)
    with FakeOpenAI([Reply([call("write_candidate", source=V1), call("run_tests", candidate_id=candidate_id(V1))], quirky=True),
                     Reply([call("history")])]) as server:
        a = agent(server)
        a.restore([])
        assert a.act(tools) and a.act(tools)
    assert tools.budget_used == 3
    sent = server.requests[1]["body"]["messages"]
    assistant = next(m for m in sent if m["role"] == "assistant")
    ids = [c["id"] for c in assistant["tool_calls"]]
    assert len(set(ids)) == 2 and all(ids)
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"])["source"] == V1
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == ids


def test_replies_without_tool_calls_are_nudged_then_the_agent_stops(tmp_path: Path) -> None:
    tools = toolbox(tmp_path)
    with FakeOpenAI([Reply(content="Let me think."), Reply([call("history")]), Reply(content="Hmm.")]) as server:
        a = agent(server, max_idle_turns=2)
        a.restore([])
        assert drive(a, tools) == "done"
    assert len(server.requests) == 4  # the idle counter was reset by the history call
    assert [m["content"] for m in server.requests[1]["body"]["messages"] if m["role"] == "user"][-1] == NUDGE
    assert tools.budget_used == 1
    assert "without a usable tool call" in events_of(tmp_path, "note")[-1]["text"]


# ---- misbehaving endpoints ----------------------------------------------------------------
def test_rate_limit_and_server_error_are_retried(tmp_path: Path) -> None:
    fast = {"retry-after-ms": "20"}
    script = [Error(429, fast), Reply([call("show_problem")]), Error(500, fast), Error(503, fast), Reply([call("history")])]
    tools = toolbox(tmp_path)
    with FakeOpenAI(script) as server:
        a = agent(server, max_retries=1)  # the client retries once, then the agent pauses once
        a.restore([])
        assert a.act(tools) and a.act(tools)
    assert len(server.requests) == 5 and server.remaining == 0
    assert tools.budget_used == 2
    errors = [e for e in events_of(tmp_path, "llm_response") if e.get("error")]
    assert [e["status"] for e in errors] == [503]  # only what the client gave up on is logged


def test_a_hung_request_times_out_and_is_retried(tmp_path: Path) -> None:
    tools = toolbox(tmp_path)
    with FakeOpenAI([Hang(4.0), Reply([call("show_problem")])]) as server:
        a = agent(server, request_timeout=1.0, max_retries=0)
        a.restore([])
        assert a.act(tools)
    assert tools.budget_used == 1
    errors = [e for e in events_of(tmp_path, "llm_response") if e.get("error")]
    assert len(errors) == 1 and "Timeout" in errors[0]["error"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dead_endpoint_stops_resumably_and_nothing_is_lost(tmp_path: Path) -> None:
    tools = toolbox(tmp_path)
    dead = agent(f"http://127.0.0.1:{free_port()}/v1", max_retries=0, pause_s=0.01, max_pauses=2)
    dead.restore([])
    with pytest.raises(EndpointUnavailable, match="can be resumed"):
        dead.act(tools)
    assert len([e for e in events_of(tmp_path, "llm_response") if e.get("error")]) == 3
    assert tools.budget_used == 0

    # the endpoint comes back; a new process picks up the same conversation
    tools = toolbox(tmp_path)
    with FakeOpenAI([Reply([call("show_problem")])]) as server:
        again = agent(server)
        again.restore(read_events(tmp_path / "events.jsonl"))
        assert again.act(tools)
    users = [m for m in server.requests[0]["body"]["messages"] if m["role"] == "user"]
    assert len(users) == 1  # the opening message, once: nothing duplicated, nothing lost
    assert tools.budget_used == 1


def test_persistent_server_errors_end_in_endpoint_unavailable(tmp_path: Path) -> None:
    tools = toolbox(tmp_path)
    with FakeOpenAI([Error(500)] * 3) as server:
        a = agent(server, max_retries=0, max_pauses=2)
        a.restore([])
        with pytest.raises(EndpointUnavailable):
            a.act(tools)
    assert len(server.requests) == 3


def test_context_length_error_compacts_and_retries_once(tmp_path: Path) -> None:
    too_long = Error(400, message="This model's maximum context length is 32768 tokens. However, you requested 40211 tokens.")
    tools = toolbox(tmp_path)
    with FakeOpenAI([Reply([call("show_problem")]), too_long, Reply([call("history")]), Reply([call("history")]), too_long, too_long]) as server:
        a = agent(server)
        a.restore([])
        assert a.act(tools) and a.act(tools)
        assert [c["reason"] for c in events_of(tmp_path, "compaction")] == ["context length error"]
        assert len(server.requests[2]["body"]["messages"]) == 2  # the objective and the memory
        assert a.act(tools)
        with pytest.raises(EndpointError, match="maximum context length"):  # compacted already: give up
            a.act(tools)
    assert tools.budget_used == 3


def test_an_endpoint_that_refuses_the_seed_is_asked_without_it(tmp_path: Path) -> None:
    tools = toolbox(tmp_path)
    with FakeOpenAI([Error(400, message="Unrecognized request argument supplied: seed"), Reply([call("show_problem")])]) as server:
        a = agent(server, seed=7)
        a.restore([])
        assert a.act(tools)
    assert [r["body"].get("seed") for r in server.requests] == [7, None]
    assert tools.budget_used == 1


def test_rejected_key_is_not_retried_and_never_logged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KOPT_TEST_KEY", SECRET)
    tools = toolbox(tmp_path)
    with FakeOpenAI([Error(401, message=f"Incorrect API key provided: {SECRET}")]) as server:
        a = agent(server, api_key_env="KOPT_TEST_KEY")
        a.restore([])
        with pytest.raises(EndpointError, match="check the model name and API key") as info:
            a.act(tools)
    assert len(server.requests) == 1
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"  # it was used ...
    assert SECRET not in str(info.value)
    for path in tmp_path.rglob("*"):  # ... and written nowhere
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path


def test_a_key_in_a_variable_the_judge_would_not_strip_leaves_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KOPT_LLM_CRED_X", SECRET)  # not named like a secret: the sandbox would pass it on
    monkeypatch.setenv("MY_OPENAI_KEY", SECRET)  # named like one: the sandbox strips it, so it may stay
    tools = toolbox(tmp_path)
    with FakeOpenAI([Reply([call("history")]), Reply([call("history")])]) as server:
        for name in ("KOPT_LLM_CRED_X", "MY_OPENAI_KEY"):
            a = agent(server, api_key_env=name)
            a.restore([])
            a.act(tools)
    assert "KOPT_LLM_CRED_X" not in os.environ and os.environ["MY_OPENAI_KEY"] == SECRET
    assert [r["headers"]["authorization"] for r in server.requests] == [f"Bearer {SECRET}"] * 2


def test_missing_model_or_key_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("KOPT_NO_SUCH_KEY", raising=False)
    with pytest.raises(ValueError, match="--kopt-model"):
        LLMAgent(model="", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match=r"\$KOPT_NO_SUCH_KEY"):
        LLMAgent(model="m", api_key_env="KOPT_NO_SUCH_KEY")
    # a self-hosted server needs no key
    assert LLMAgent(model="m", base_url="http://127.0.0.1:9/v1", api_key_env="KOPT_NO_SUCH_KEY").base_url.startswith("http://127.0.0.1")


def test_the_factory_builds_the_llm_agent_from_loop_settings() -> None:
    settings = dict(problem=get_problem("kda"), seed=3, base_url="http://127.0.0.1:9/v1", api_key_env="OPENAI_API_KEY",
                    context_tokens="0", request_timeout="42", replay_path=None, run_dir=None)
    a = make_agent("openai", model="openai/gpt-4o-2024-08-06", **settings)
    assert isinstance(a, LLMAgent) and a.seed == 3
    assert a._client.timeout == 42.0
    # the per-model default: a hosted model's window, a self-hosted one's likely 32k
    assert a.context_tokens == 76_000
    assert make_agent("openai", model="Qwen/Qwen2.5-Coder-32B-Instruct", **settings).context_tokens == 20_000
    assert make_agent("openai", model="Qwen/Qwen2.5-Coder-32B-Instruct", **{**settings, "context_tokens": "50000"}).context_tokens == 50_000


# ---- compaction, memory, kill and resume ---------------------------------------------------
def long_session(n: int) -> list[Reply]:
    """Candidates that get faster (with a failure every third), each written then benchmarked."""
    script = []
    for i in range(n):
        src = source(f"s{i}", "wrong" if i % 3 == 2 else f"us={900 - 50 * i}")
        script.append(Reply([call("write_candidate", source=src, notes=f"idea {i}: unroll by {2 ** i}")], content=f"Plan {i}."))
        script.append(Reply([call("benchmark", candidate_id=candidate_id(src))]))
    return script


def test_compaction_replaces_the_conversation_with_the_logged_memory(tmp_path: Path) -> None:
    tools = toolbox(tmp_path)
    with FakeOpenAI(long_session(6) + [Reply([call("history")])]) as server:
        a = agent(server, context_tokens=1500, max_idle_turns=1)
        a.restore([])
        assert drive(a, tools) == "done"
    compactions = events_of(tmp_path, "compaction")
    assert compactions and all(c["source"] == "log" for c in compactions)
    memory = compactions[-1]["memory"]
    best = tools.best["candidate_id"]
    assert f"{best}: 700.0 us" in memory and "# candidate s4" in memory  # the best and its source
    assert "idea 2: unroll by 4" in memory and "FAILED at correctness" in memory  # tried, and why it failed
    # the request right after a compaction: the objective, then the memory, nothing else
    after = next(r["body"] for r in server.requests if any(memory in (m.get("content") or "") for m in r["body"]["messages"]))
    assert after["messages"][0]["role"] == "system" and "Problem: kda" in after["messages"][0]["content"]
    assert after["messages"][1]["content"].startswith(memory)
    assert len(after["messages"]) == 2
    # deterministic: the same log gives the same memory
    events = read_events(tmp_path / "events.jsonl")
    upto = [e for e in events if e["seq"] < compactions[-1]["seq"]]
    assert build_memory(upto, tmp_path) == memory


def test_restore_rebuilds_the_same_conversation(tmp_path: Path) -> None:
    tools = toolbox(tmp_path)
    with FakeOpenAI(long_session(4)) as server:
        a = agent(server, context_tokens=1300)
        a.restore([])
        for _ in range(7):
            a.act(tools)
        b = agent(server, context_tokens=1300)
        b.restore(read_events(tmp_path / "events.jsonl"))
    assert events_of(tmp_path, "compaction")
    assert b.messages == a.messages
    assert b._idle == a._idle and b._pending == a._pending


def test_a_crash_right_after_compaction_resumes_from_the_memory(tmp_path: Path) -> None:
    tools = toolbox(tmp_path)
    with FakeOpenAI(long_session(3)) as server:
        a = agent(server, context_tokens=1000)
        a.restore([])
        while not events_of(tmp_path, "compaction"):
            a.act(tools)
    events = read_events(tmp_path / "events.jsonl")
    cut = next(i for i, e in enumerate(events) if e["kind"] == "compaction") + 1
    b = agent("http://127.0.0.1:9/v1", context_tokens=1000)
    b.restore(events[:cut])  # the process died before the next request
    assert b.messages == [{"role": "user", "content": events[cut - 1]["memory"] + CONTINUE}]
    assert b._pending == [] and b._idle == 0


RESUME_DRIVER = """
import sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from test_llm_agent import agent, drive, toolbox
tools = toolbox(Path({run_dir!r}))
a = agent({base_url!r}, context_tokens=1300, max_idle_turns=1)
a.restore([])
drive(a, tools)
"""


def test_kill_and_resume_keeps_memory_and_budget(tmp_path: Path) -> None:
    """kill -9 while a run_tests is in flight, resume in a fresh process (this one): the model
    sees exactly the conversation an uninterrupted run shows it, and no call is charged twice."""
    slow = source("h", "hang")  # the judge hangs on it in the killed process only
    script = long_session(3) + [
        Reply([call("write_candidate", source=slow, notes="risky"), call("run_tests", candidate_id=candidate_id(slow))]),
        Reply([call("benchmark", candidate_id=candidate_id(slow))]),
    ]
    with FakeOpenAI(script) as server:  # the uninterrupted run
        tools = toolbox(tmp_path / "a" / "run")
        a = agent(server, context_tokens=1300, max_idle_turns=1)
        a.restore([])
        assert drive(a, tools) == "done"
    uninterrupted = [r["body"]["messages"] for r in server.requests]

    run_dir = tmp_path / "b" / "run"
    with FakeOpenAI(script) as server:
        driver = RESUME_DRIVER.format(tests=str(Path(__file__).parent), run_dir=str(run_dir), base_url=server.base_url)
        proc = subprocess.Popen([sys.executable, "-c", driver], cwd=REPO, env={**os.environ, "KOPT_FAKE_HANG": "1"}, start_new_session=True)
        kill_during_run_tests(proc, run_dir, timeout_s=60)
        before = read_events(run_dir / "events.jsonl")
        assert any(e["kind"] == "compaction" for e in before)  # the memory is part of what must survive
        in_flight = [e for e in before if e["kind"] == "tool_call"][-1]
        assert in_flight["tool"] == "run_tests" and not any(e["kind"] == "tool_result" and e["call"] == in_flight["call"] for e in before)

        # resume, as the loop does: the toolbox redoes the in-flight call, the agent rebuilds itself
        tools = toolbox(run_dir)
        assert tools.budget_used == in_flight["call"] - 1
        tools.redo_in_flight()
        a = agent(server, context_tokens=1300, max_idle_turns=1)
        a.restore(before)
        assert drive(a, tools) == "done"
    assert [r["body"]["messages"] for r in server.requests] == uninterrupted

    results = [e for e in read_events(run_dir / "events.jsonl") if e["kind"] == "tool_result"]
    assert sorted(e["call"] for e in results) == list(range(1, len(results) + 1))  # every unit charged once
    assert tools.budget_used == len(results) == in_flight["call"] + 1


# ---- kopt memory and replay ------------------------------------------------------------------
def test_kopt_memory_prints_the_run_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tools = toolbox(tmp_path)
    with FakeOpenAI(SESSION) as server:
        a = agent(server)
        a.restore([])
        drive(a, tools)
    assert cli.main(["memory", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{candidate_id(V2)}: 250.0 us, 4.00x" in out and "# candidate v2" in out
    assert "_kda_fwd_kernel 200.0 us (80%" in out  # what the profiler said
    assert "compile: CompilationError at 12:8" in out
    assert cli.main(["memory", str(tmp_path), "--recorded"]) == 1  # never compacted
    assert "not been compacted" in capsys.readouterr().err


def test_replay_reissues_the_recorded_candidates(tmp_path: Path) -> None:
    recorded = tmp_path / "recorded"
    tools = toolbox(recorded)
    with FakeOpenAI(SESSION) as server:
        a = agent(server)
        a.restore([])
        drive(a, tools)
    # only the log travels: sources come from the model's replies in it
    lone = tmp_path / "elsewhere" / "events.jsonl"
    lone.parent.mkdir()
    lone.write_bytes((recorded / "events.jsonl").read_bytes())
    replay_dir = tmp_path / "replayed"
    tools = toolbox(replay_dir)
    r = make_agent("replay", replay_path=str(lone), problem=get_problem("kda"), seed=0, model="")
    assert isinstance(r, ReplayAgent)
    r.restore([])
    assert drive(r, tools) == "done"
    then = [(e["candidate_id"], e["upto"], e["verdict"]) for e in events_of(recorded, "verdict")]
    now = [(e["candidate_id"], e["upto"], e["verdict"]) for e in events_of(replay_dir, "verdict")]
    assert now == then
    assert tools.best["candidate_id"] == candidate_id(V2)
    assert not events_of(replay_dir, "note")  # nothing differed
    assert not events_of(replay_dir, "llm_request")  # and no endpoint was involved


# ---- end to end: pytest --kopt-optimize --kopt-agent=openai ---------------------------------
TESTS = Path(__file__).resolve().parent
TINY_BASE = (TESTS / "llm_tiny" / "baseline.py").read_text()


def kopt_pytest(cwd: Path, *args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """``pytest --kopt-optimize ...`` in a fresh process, with a key in its environment."""
    full_env = {**os.environ, "OPENAI_API_KEY": SECRET, "KOPT_LLM_RETRIES": "0", "KOPT_LLM_PAUSE_S": "0.01", "KOPT_LLM_PAUSES": "1", **(env or {})}
    full_env.pop("OPENAI_BASE_URL", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args]
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def assert_secret_nowhere(*places: Path | str) -> None:
    for place in places:
        if isinstance(place, Path):
            for path in [place] if place.is_file() else place.rglob("*"):
                if path.is_file():
                    assert SECRET not in path.read_text(errors="replace"), path
        else:
            assert SECRET not in place


def test_end_to_end_session_with_the_real_judge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The plugin, the real openai client and the real judge (CPU interpreter) on a tiny problem:
    write, test, fix a compile error, benchmark, improve."""
    (tmp_path / "conftest.py").write_text(f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport llm_tiny.problem  # registers tiny-axpy\n")
    broken = TINY_BASE.replace("BLOCK = 128", "BLOCK = 256").replace("tl.load(y_ptr", "tl.lod(y_ptr")
    fixed = TINY_BASE.replace("BLOCK = 128", "BLOCK = 256")
    bigger = TINY_BASE.replace("BLOCK = 128", "BLOCK = 1024")
    ids = {name: candidate_id(s) for name, s in (("broken", broken), ("fixed", fixed), ("bigger", bigger))}
    script = [
        Reply([call("write_candidate", source=broken, notes="BLOCK=256"), call("run_tests", candidate_id=ids["broken"])]),
        Reply([call("write_candidate", source=fixed, notes="fix tl.lod typo", parent=ids["broken"]), call("benchmark", candidate_id=ids["fixed"])]),
        Reply([call("write_candidate", source=bigger, notes="BLOCK=1024: 4x fewer programs", parent=ids["fixed"]), call("benchmark", candidate_id=ids["bigger"])]),
    ] + [Reply(content="That is all I have.")] * 3
    run_dir = tmp_path / "run"
    with FakeOpenAI(script) as server:
        proc = kopt_pytest(tmp_path, "--kopt-optimize=tiny-axpy", "--kopt-budget=20", f"--kopt-run-dir={run_dir}",
                           "--kopt-agent=openai", "--kopt-model=fake-coder", f"--kopt-base-url={server.base_url}")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert server.remaining == 0

    events = read_events(run_dir / "events.jsonl")
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished" and events[0]["agent"] == "openai"
    verdicts = {(e["candidate_id"], e["upto"]): e for e in events if e["kind"] == "verdict"}
    compile_failure = verdicts[(ids["broken"], "correctness")]
    assert compile_failure["verdict"] == "fail" and compile_failure["stage"] == "compile"
    assert "lod" in " ".join(compile_failure["reasons"])
    assert any("lod" in m for m in tool_messages(server.requests[1]["body"]))  # the model saw why
    for name in ("fixed", "bigger"):
        assert verdicts[(ids[name], "benchmark")]["verdict"] == "pass" and verdicts[(ids[name], "benchmark")]["candidate_us"] > 0
    best = events[-1]["best"]["candidate_id"]
    assert f"Current best: {best}" in server.requests[-1]["body"]["messages"][0]["content"]
    assert events[-1]["budget_used"] == 6
    assert [e["kind"] for e in events].count("llm_request") == len(script)

    # the key was sent to the endpoint and written nowhere
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"
    assert_secret_nowhere(run_dir, output)

    assert cli.main(["memory", str(run_dir)]) == 0
    memory = capsys.readouterr().out
    best_section = memory.split("## Strategies")[0]
    assert f"## Best so far\n{best}:" in best_section and "tl.lod(y_ptr" not in best_section  # a working source
    assert "FAILED at compile" in memory


FAKE_JUDGE_CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import pytest
from test_llm_agent import fake_evaluate


@pytest.fixture(scope="session")
def kopt_evaluate():
    return fake_evaluate
"""


def test_end_to_end_kill_dead_endpoint_resume_and_replay(tmp_path: Path) -> None:
    """Through pytest (fake judge): kill -9 mid-evaluation; resuming against a dead endpoint stops
    resumably; resuming against a live one continues the conversation and the budget; then the
    run is replayed with no endpoint."""
    (tmp_path / "conftest.py").write_text(FAKE_JUDGE_CONFTEST)
    slow = source("h", "hang")
    script = long_session(2) + [
        Reply([call("write_candidate", source=slow, notes="risky"), call("run_tests", candidate_id=candidate_id(slow))]),
        Reply([call("benchmark", candidate_id=candidate_id(slow))]),
    ] + [Reply(content="Nothing more.")] * 3
    run_dir = tmp_path / "run"
    common = ["--kopt-optimize=kda", f"--kopt-run-dir={run_dir}", "--kopt-agent=openai", "--kopt-model=fake-coder"]
    with FakeOpenAI(script) as server:
        env = {**os.environ, "OPENAI_API_KEY": SECRET, "KOPT_FAKE_HANG": "1"}
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *common, "--kopt-budget=30", f"--kopt-base-url={server.base_url}"]
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        kill_during_run_tests(proc, run_dir, timeout_s=120)
        before = read_events(run_dir / "events.jsonl")
        seen = len(server.requests)
        in_flight = [e for e in before if e["kind"] == "tool_call"][-1]["call"]

        dead = kopt_pytest(tmp_path, *common, "--kopt-resume", f"--kopt-base-url=http://127.0.0.1:{free_port()}/v1")
        assert dead.returncode == 1
        hint = f"can be resumed; continue with: {shlex.quote(sys.executable)} -m pytest --kopt-optimize=kda --kopt-resume --kopt-run-dir={run_dir}"
        assert hint in dead.stdout  # one line, no traceback, and the command that continues it
        assert "EndpointUnavailable" not in dead.stdout.split("= kopt optimize =")[0]
        stopped = read_events(run_dir / "events.jsonl")[-1]
        assert stopped["kind"] == "run_interrupted" and "can be resumed" in stopped["reason"]
        assert stopped["budget_used"] == in_flight  # the in-flight call was redone and charged once

        live = kopt_pytest(tmp_path, *common, "--kopt-resume", f"--kopt-base-url={server.base_url}")
        assert live.returncode == 0, (live.stdout + live.stderr)[-3000:]
    events = read_events(run_dir / "events.jsonl")
    assert events[-1]["kind"] == "run_finished"
    results = [e["call"] for e in events if e["kind"] == "tool_result"]
    assert sorted(results) == list(range(1, len(results) + 1)) == list(range(1, in_flight + 2))
    # the conversation carried on: the first request after the restarts extends the last one before
    last_before, first_after = server.requests[seen - 1]["body"]["messages"], server.requests[seen]["body"]["messages"]
    assert first_after[1 : len(last_before)] == last_before[1:]
    assert [m["role"] for m in first_after[len(last_before):]] == ["assistant", "tool", "tool"]
    assert_secret_nowhere(run_dir)

    replayed = tmp_path / "replayed"
    proc = kopt_pytest(tmp_path, "--kopt-optimize=kda", f"--kopt-run-dir={replayed}", "--kopt-agent=replay",
                       f"--kopt-replay={run_dir / 'events.jsonl'}", "--kopt-budget=30")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    verdicts = lambda d: [(e["candidate_id"], e["upto"], e["verdict"]) for e in read_events(d / "events.jsonl") if e["kind"] == "verdict"]  # noqa: E731
    assert verdicts(replayed) == verdicts(run_dir)
    assert not [e for e in read_events(replayed / "events.jsonl") if e["kind"] in ("note", "llm_request")]


def test_resume_reuses_the_recorded_agent_settings_but_never_the_key(tmp_path: Path) -> None:
    """run_started records the agent's settings with the key variable's name only; --kopt-resume
    without --kopt-agent/--kopt-model/--kopt-base-url reuses them; the command line still wins."""
    (tmp_path / "conftest.py").write_text(FAKE_JUDGE_CONFTEST)
    run_dir = tmp_path / "run"
    keys = {"OPENAI_API_KEY": "", "MY_LLM_KEY": SECRET}  # only the recorded variable name finds the key
    run = ["--kopt-optimize=kda", f"--kopt-run-dir={run_dir}"]
    with FakeOpenAI([Reply([call("show_problem")]), Reply([call("history")]), Reply([call("show_problem")])]) as server:
        base_url = server.base_url
        first = kopt_pytest(tmp_path, *run, "--kopt-budget=1", "--kopt-agent=openai", "--kopt-model=fake-coder",
                            f"--kopt-base-url={server.base_url}", "--kopt-api-key-env=MY_LLM_KEY", "--kopt-context-tokens=50000", env=keys)
        assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
        again = kopt_pytest(tmp_path, *run, "--kopt-resume", "--kopt-budget=2", env=keys)
        assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
        other = kopt_pytest(tmp_path, *run, "--kopt-resume", "--kopt-budget=3", "--kopt-model=other-coder", "--kopt-request-timeout=30", env=keys)
        assert other.returncode == 0, (other.stdout + other.stderr)[-3000:]
    assert [r["body"]["model"] for r in server.requests] == ["fake-coder", "fake-coder", "other-coder"]
    assert {r["headers"]["authorization"] for r in server.requests} == {f"Bearer {SECRET}"}
    events = read_events(run_dir / "events.jsonl")
    recorded = [(e["kind"], e["agent"], e["agent_settings"]) for e in events if e["kind"] in ("run_started", "run_resumed")]
    settings = {"model": "fake-coder", "base_url": base_url, "api_key_env": "MY_LLM_KEY", "context_tokens": 50000, "request_timeout": 600.0}
    assert recorded == [
        ("run_started", "openai", settings),
        ("run_resumed", "openai", settings),
        ("run_resumed", "openai", {**settings, "model": "other-coder", "request_timeout": 30.0}),
    ]
    assert events[-1]["kind"] == "run_finished" and events[-1]["budget_used"] == 3
    assert SECRET not in (run_dir / "events.jsonl").read_text()
    assert_secret_nowhere(run_dir, *(p.stdout + p.stderr for p in (first, again, other)))


def test_the_retry_variables_are_documented() -> None:
    names = set(re.findall(r'"(KOPT_LLM_[A-Z_]+)"', (REPO / "pytest_kopt" / "agents" / "llm.py").read_text()))
    assert names == {"KOPT_LLM_RETRIES", "KOPT_LLM_PAUSE_S", "KOPT_LLM_PAUSES"}
    docs = (REPO / "docs" / "llm-agent.md").read_text()
    from pytest_kopt.plugin import INI_OPTIONS

    assert all(f"`{name}`" in docs and name in INI_OPTIONS["kopt_request_timeout"][0] for name in names)


def test_replay_resumes_where_it_stopped_and_notes_differences(tmp_path: Path) -> None:
    recorded = tmp_path / "recorded"
    tools = toolbox(recorded)
    with FakeOpenAI(SESSION) as server:
        a = agent(server)
        a.restore([])
        drive(a, tools)

    replay_dir = tmp_path / "replayed"
    tools = toolbox(replay_dir)
    first = ReplayAgent(replay_path=recorded)
    first.restore([])
    assert first.act(tools) and first.act(tools)  # then the process stops

    def stricter(problem_name: str, candidate_path: str, **kw: object) -> dict:  # this "machine" rejects v2
        if "# candidate v2" in Path(candidate_path).read_text():
            return {"verdict": "fail", "stage": "correctness", "reasons": ["o: relative RMS error 0.2 > tolerance 0.005"], "errors": []}
        return fake_evaluate(problem_name, candidate_path, **kw)

    log = EventLog(replay_dir / "events.jsonl", run_id="replayed")
    tools = Toolbox(get_problem("kda"), objective(), log, replay_dir, 100, evaluate=stricter)
    events = read_events(log.path)
    tools.restore(events)
    second = ReplayAgent(replay_path=recorded / "events.jsonl")
    second.restore(events)
    assert second.position == 2
    assert drive(second, tools) == "done"
    calls = [(e["tool"], e["args"].get("candidate_id")) for e in events_of(replay_dir, "tool_call")]
    assert calls == [(s.tool, s.candidate_id) for s in second.steps]  # each recorded call once, in order
    notes = [e["text"] for e in events_of(replay_dir, "note")]
    assert notes and all(candidate_id(V2) in n and "recorded pass, now fail" in n for n in notes)
    assert tools.best["candidate_id"] == candidate_id(V1)


def test_replay_refuses_a_log_whose_sources_are_lost(tmp_path: Path) -> None:
    tools = toolbox(tmp_path)
    tools.call("write_candidate", source=V1, strategy="kda_recurrent")  # not an LLM run: no replies hold it
    (tmp_path / "candidates" / f"{candidate_id(V1)}.py").unlink()
    with pytest.raises(ValueError, match=f"no source for candidate.*{candidate_id(V1)}"):
        ReplayAgent(replay_path=tmp_path / "events.jsonl")
