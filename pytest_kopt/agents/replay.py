"""The replay agent: re-issue a recorded run's candidates and evaluations, in order, with no
endpoint. It is how a run is reproduced on another machine or Triton version: the same
sources go through this machine's judge, and where a verdict differs from the recording a
``note`` event says so.

Replayed: every ``write_candidate``, ``run_tests``, ``benchmark`` and ``profile`` call that
succeeded in the recording (the show/history calls change nothing and are skipped). A
candidate's source comes from the recorded run's ``candidates/<id>.py``, else the path in its
``candidate`` event, else the model's own ``write_candidate`` arguments in its ``llm_response``
events, so a lone ``events.jsonl`` of an LLM run is enough.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import runstore
from .. import events as ev
from ..events import read_events
from ..judge import candidate_id
from ..runstate import RunState
from .base import Agent

REPLAYED = ("write_candidate", "run_tests", "benchmark", "profile")


@dataclass
class Step:
    """One recorded call to re-issue, with what it gave then."""

    tool: str
    candidate_id: str
    recorded: dict = field(default_factory=dict)
    source: str | None = None  # write_candidate only
    notes: str = ""
    parent: str | None = None
    strategy: str | None = None
    knobs: Any = None


def _sources_in_replies(events: list[dict]) -> dict[str, str]:
    """Candidate sources the model sent in its write_candidate calls, by candidate id."""
    found: dict[str, str] = {}
    for event in events:
        if event.get("kind") != ev.LLM_RESPONSE:
            continue
        for call in (event.get("message") or {}).get("tool_calls") or []:
            fn = call.get("function") or {}
            if fn.get("name") != "write_candidate":
                continue
            try:
                args = json.loads(fn.get("arguments") or "")
            except (TypeError, ValueError):
                continue
            if isinstance(args, dict) and isinstance(args.get("source"), str):
                found[candidate_id(args["source"])] = args["source"]
    return found


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def load_steps(events_path: str | Path) -> list[Step]:
    """The replayable calls of a recorded run, in order; raises if a candidate's source is lost."""
    events_path = Path(events_path)
    if events_path.is_dir():
        events_path = events_path / "events.jsonl"
    run_dir = events_path.parent
    events = read_events(events_path)
    state = RunState.fold(events)
    from_replies: dict[str, str] | None = None
    steps: list[Step] = []
    missing: list[str] = []
    for tool, args, result in state.completed_calls():
        if tool not in REPLAYED:
            continue
        result = result if isinstance(result, dict) else {}
        if result.get("error"):
            continue  # a rejected call changed nothing
        cid = result.get("candidate_id") or args.get("candidate_id")
        if not cid:
            continue
        step = Step(tool, cid, recorded=result)
        if step.tool == "write_candidate":
            cand = state.candidates.get(cid)
            step.notes = (cand.notes if cand else "") or args.get("notes") or ""
            if cand is not None:
                step.parent, step.strategy, step.knobs = cand.parent, cand.strategy, cand.knobs
            step.source = _read(run_dir / "candidates" / f"{cid}.py")
            if step.source is None and cand is not None and cand.path:
                p = Path(cand.path)
                step.source = _read(p if p.is_absolute() else run_dir / p) or _read(p)
            if step.source is None:
                if from_replies is None:
                    from_replies = _sources_in_replies(events)
                step.source = from_replies.get(cid)
            if step.source is None:
                missing.append(cid)
        steps.append(step)
    if missing:
        raise ValueError(f"{events_path}: no source for candidate(s) {', '.join(missing)} (looked in {run_dir / 'candidates'}, the candidate events and the model's replies)")
    return steps


class ReplayAgent(Agent):
    """Re-issues the recorded calls one per ``act``; stops when the recording is used up."""

    name = "replay"

    def __init__(self, *, replay_path: str | Path | None = None):
        if not replay_path:
            raise ValueError("the replay agent needs a recorded run: --kopt-replay=RUN_DIR/events.jsonl")
        self.replay_path = Path(replay_path)
        with runstore.readable(self.replay_path) as path:  # a packed run is read unpacked to a temporary dir
            self.steps = load_steps(path)
        self.position = 0
        self._in_flight = False

    def restore(self, events: list[dict]) -> None:
        """Skip the recorded calls this run has already completed."""
        state = RunState.fold(events)
        self.position = self._completed(state)
        self._in_flight = any(call.get("tool") in REPLAYED for n, call in state.calls.items() if n not in state.answered)

    @staticmethod
    def _completed(state: RunState) -> int:
        return sum(1 for tool, _, _ in state.completed_calls() if tool in REPLAYED)

    def act(self, tools: Any) -> bool:
        if self._in_flight:  # the loop may have redone the interrupted call since restore()
            self._in_flight = False
            self.position = self._completed(RunState.from_log(tools.log.path))
        if self.position >= len(self.steps):
            return False
        step = self.steps[self.position]
        if step.tool == "write_candidate":
            # a parent this run never saw (say, another machine's baseline) would reject the write
            parent = step.parent if step.parent in tools.candidates else None
            result = tools.call(
                "write_candidate", source=step.source, notes=step.notes, parent=parent,
                strategy=step.strategy, knobs=step.knobs,
            )
        else:
            result = tools.call(step.tool, candidate_id=step.candidate_id)
        self.position += 1
        difference = self._difference(step, result if isinstance(result, dict) else {})
        if difference:
            tools.log.append(ev.NOTE, text=f"replay of {step.tool}({step.candidate_id}): {difference}")
        return True

    @staticmethod
    def _difference(step: Step, result: dict) -> str:
        if result.get("error"):
            return f"now an error: {result['error']}"
        if step.tool == "write_candidate":
            got = result.get("candidate_id")
            return f"stored as {got}, recorded as {step.candidate_id}" if got != step.candidate_id else ""
        then, now = step.recorded.get("verdict"), result.get("verdict")
        if then is not None and now is not None and then != now:
            return f"recorded {then}, now {now} ({'; '.join(map(str, result.get('reasons') or []))[:300]})"
        return ""
