"""What happened in one run, folded out of its event log: the numbers a report is made of.

The log (``RUN_DIR/events.jsonl``) is the truth, so this module only reads it (plus the
judge's result JSON for the best candidate's full figures). It tolerates logs from runs that
crashed or are still going, and events missing optional fields: a report of half a run is
still worth reading.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from . import judge
from .events import read_events

_OWN_FILE = re.compile(r"^[0-9a-f]{12}\.py(?: line \d+)?:\s*")
STAGES = (*judge.STAGES, "judge")  # "judge": the judge itself failed


def _seconds(stamp: Any) -> float | None:
    """An event's ``time`` as epoch seconds (a number or an ISO-8601 string)."""
    if isinstance(stamp, (int, float)):
        return float(stamp)
    if isinstance(stamp, str):
        try:
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


@dataclass
class Candidate:
    """One candidate as the run saw it: where it came from and its latest verdict."""

    candidate_id: str
    strategy: str | None = None
    written_at: int | None = None  # tool call that wrote it
    judged_at: int | None = None  # tool call of its latest verdict
    verdict: str | None = None  # "pass" | "fail" | None (never judged)
    upto: str | None = None
    stage: str | None = None
    reasons: list[str] = field(default_factory=list)
    candidate_us: float | None = None  # its fastest verified time
    speedup: float | None = None  # over the run's baseline candidate (the log's vs_baseline)
    result_path: str | None = None


@dataclass
class RunSummary:
    run_dir: Path
    run_id: str
    problem: str | None = None
    agent: Any = None
    seed: Any = None
    objective: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)
    budget: int | None = None
    budget_used: int = 0
    status: str = "in progress"  # "finished", "interrupted" or "in progress"
    status_reason: str | None = None
    running_s: float | None = None  # time the run ran, summed over its sessions (a stop-to-resume gap left out)
    resumes: int = 0
    candidates: dict[str, Candidate] = field(default_factory=dict)
    # (call, best speedup, candidate id); speedups are over the run's baseline candidate, the
    # objective's baseline_us, when the log has them (vs_baseline), else the judge's first baseline
    progress: list[tuple[int, float, str]] = field(default_factory=list)
    best_id: str | None = None
    best_us: float | None = None
    best_speedup: float | None = None
    baseline_us: float | None = None  # what speedups are measured against
    best_result: dict | None = None  # the judge's full result JSON for the best candidate
    tool_seconds: dict[str, list[float]] = field(default_factory=dict)  # tool -> wall seconds of each of its calls
    retracted: dict[str, str] = field(default_factory=dict)  # candidate id -> why it may not be best

    @property
    def label(self) -> str:
        agent = self.agent.get("name") if isinstance(self.agent, dict) else self.agent
        parts = [self.run_id, self.problem, agent]
        return " · ".join(str(p) for p in parts if p)

    @property
    def device(self) -> str | None:
        """Where the best candidate was timed (the judge's word), else the run's GPU."""
        return (self.best_result or {}).get("device") or self.environment.get("gpu")

    @property
    def on_interpreter(self) -> bool:
        """Timed on Triton's CPU interpreter: times are indicative only, the roofline does not apply."""
        return bool(self.environment.get("interpreter")) or "interpreter" in str(self.device or "")

    def counts_by_verdict(self) -> dict[str, int]:
        counts = {"pass": 0, "fail": 0, "not judged": 0}
        for cand in self.candidates.values():
            counts[cand.verdict or "not judged"] = counts.get(cand.verdict or "not judged", 0) + 1
        return counts

    def failures_by_stage(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for cand in self.candidates.values():
            if cand.verdict == "fail":
                stage = cand.stage or "unknown"
                counts[stage] = counts.get(stage, 0) + 1
        order = {s: i for i, s in enumerate(STAGES)}
        return dict(sorted(counts.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))

    def failures_by_reason(self) -> list[tuple[str, str, int]]:
        """(stage, reason, count), most common first. A reason is the judge's first line for it."""
        counts: dict[tuple[str, str], int] = {}
        for cand in self.candidates.values():
            if cand.verdict == "fail":
                reason = (cand.reasons[0] if cand.reasons else "no reason given").strip().splitlines()[0]
                reason = _OWN_FILE.sub("", reason)  # "<id>.py line 12: " would make every reason unique
                key = (cand.stage or "unknown", reason)
                counts[key] = counts.get(key, 0) + 1
        return sorted(((s, r, n) for (s, r), n in counts.items()), key=lambda t: (-t[2], t[0], t[1]))


def summarise(run_dir: Path | str) -> RunSummary:
    """Fold ``run_dir/events.jsonl`` into a RunSummary."""
    run_dir = Path(run_dir)
    events = read_events(run_dir / "events.jsonl")
    summary = RunSummary(run_dir=run_dir, run_id=run_dir.name)
    call = 0
    charged: set[int] = set()
    stamps: list[float] = []
    sessions: list[float] = []  # running time of each finished session (start or resume to its last event)
    session_start = 0.0
    for event in events:
        kind = event.get("kind")
        summary.run_id = event.get("run_id") or summary.run_id
        stamp = _seconds(event.get("time"))
        if stamp is not None:
            if kind == "run_resumed" and stamps:  # close the session before this resume
                sessions.append(stamps[-1] - session_start)
            if kind == "run_resumed" or not stamps:
                session_start = stamp
            stamps.append(stamp)
        if kind == "run_started":
            summary.problem = event.get("problem", summary.problem)
            summary.objective = event.get("objective") or {}
            summary.baseline_us = _number(summary.objective.get("baseline_us"))
            summary.environment = event.get("environment") or {}
            summary.budget = event.get("budget", summary.budget)
            summary.agent = event.get("agent", summary.agent)
            summary.seed = event.get("seed", summary.seed)
        elif kind == "run_resumed":
            summary.budget = event.get("budget", summary.budget)  # a resume may extend the budget
            summary.resumes += 1
            summary.status, summary.status_reason = "in progress", None
        elif kind == "tool_call":
            call = int(event.get("call") or call + 1)
        elif kind == "tool_result":  # a call is charged once it has its result (an in-flight one is redone on resume)
            charged.add(int(event.get("call") or call))
            summary.budget_used = max(summary.budget_used, len(charged))
            seconds = _number(event.get("duration_s"))
            if seconds is not None and event.get("tool"):
                summary.tool_seconds.setdefault(str(event["tool"]), []).append(seconds)
        elif kind == "candidate":
            cid = event.get("candidate_id")
            if cid:
                cand = summary.candidates.setdefault(cid, Candidate(cid))
                cand.strategy = event.get("strategy", cand.strategy)
                at = event.get("call")
                cand.written_at = cand.written_at if cand.written_at is not None else int(at if isinstance(at, int) else call)
        elif kind == "verdict":
            _apply_verdict(summary, event, event.get("call") if isinstance(event.get("call"), int) else call)
        elif kind == "best":
            speedup = _speedup(event)
            at = event.get("call") if isinstance(event.get("call"), int) else call
            if speedup is not None:
                summary.progress.append((at, speedup, event.get("candidate_id", "")))
            summary.best_id = event.get("candidate_id", summary.best_id)
            summary.best_us = _number(event.get("candidate_us")) or summary.best_us
            summary.best_speedup = speedup if speedup is not None else summary.best_speedup
        elif kind == "retract":  # no longer a best: its steps leave the progress line (the next best event follows)
            cid = event.get("candidate_id")
            summary.progress = [p for p in summary.progress if p[2] != cid]
            summary.retracted[cid] = str(event.get("reason", ""))
        elif kind in ("run_finished", "run_interrupted"):
            summary.status = "finished" if kind == "run_finished" else "interrupted"
            summary.status_reason = event.get("reason")
            summary.budget = event.get("budget", summary.budget)
            used = event.get("budget_used")
            if isinstance(used, int):
                summary.budget_used = max(summary.budget_used, used)
    if stamps:
        summary.running_s = sum(sessions) + stamps[-1] - session_start
    if not summary.progress:  # an agent that logs no `best` events: take the running best of the verdicts
        _progress_from_verdicts(summary)
    summary.best_result = _load_best_result(summary)
    return summary


def _speedup(event: dict) -> float | None:
    """Over the run's baseline candidate when logged (vs_baseline), else over the judge's first baseline."""
    vs_baseline = _number(event.get("vs_baseline"))
    return vs_baseline if vs_baseline is not None else _number(event.get("speedup"))


def _apply_verdict(summary: RunSummary, event: dict, call: int) -> None:
    cid = event.get("candidate_id")
    if not cid:
        return
    cand = summary.candidates.setdefault(cid, Candidate(cid, written_at=call))
    cand.judged_at = call
    cand.verdict = event.get("verdict")
    cand.upto = event.get("upto", cand.upto)
    cand.stage = event.get("stage")
    cand.reasons = list(event.get("reasons") or [])
    cand.result_path = event.get("result_path") or cand.result_path
    us, speedup = _number(event.get("candidate_us")), _speedup(event)
    if cand.verdict == "pass" and us is not None and (cand.candidate_us is None or us < cand.candidate_us):
        cand.candidate_us, cand.speedup = us, speedup
    if us is not None and speedup is not None and summary.baseline_us is None:
        summary.baseline_us = us * speedup  # speedup = baseline_us / candidate_us


def _progress_from_verdicts(summary: RunSummary) -> None:
    best = None
    for cand in sorted(summary.candidates.values(), key=lambda c: c.judged_at or 0):
        if cand.verdict == "pass" and cand.speedup is not None and (best is None or cand.speedup > best.speedup):
            best = cand
            summary.progress.append((cand.judged_at or 0, cand.speedup, cand.candidate_id))
    if best is not None:
        summary.best_id, summary.best_us, summary.best_speedup = best.candidate_id, best.candidate_us, best.speedup


def _load_best_result(summary: RunSummary) -> dict | None:
    """The judge's result JSON for the best candidate, the deepest stage it reached."""
    if not summary.best_id:
        return None
    paths = []
    cand = summary.candidates.get(summary.best_id)
    if cand and cand.result_path:
        path = Path(cand.result_path)
        paths.append(path if path.is_absolute() else summary.run_dir / path)
    rank = {s: i for i, s in enumerate(STAGES)}
    found = sorted((summary.run_dir / "evals").glob(f"{summary.best_id}-*.json"),
                   key=lambda p: -rank.get(p.stem.rsplit("-", 1)[-1], -1))
    paths.extend(found)
    paths.append(summary.run_dir / "best.json")
    for path in paths:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("evaluation"), dict):  # best.json wraps the result
            data = data["evaluation"]
        if isinstance(data, dict) and data.get("candidate_id", summary.best_id) == summary.best_id and "timings" in data:
            return data
    return None
