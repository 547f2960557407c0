"""The state of a run, folded once out of its event log: what every reader of a log needs.

The toolbox (budget, candidates, evaluation cache, best, the call in flight), the report's
summary (``runsummary``), an LLM agent's compacted memory (``agents.memory``), the search
agent's restore and the replay agent all read this one fold, so they cannot disagree about what
a log says: one rule for which verdict makes a new best (``beats``), one record per candidate
(``Attempt``), one rule for what a tool call is charged.

The live toolbox applies each event it logs to its ``RunState`` as it goes, and a resumed run
folds the whole log into a fresh one: the same function decides both ways. Logs written by
older versions (no ``min_gain`` in the objective, no ``incumbent`` interval in a verdict, a
verdict without ``call``) fold with the rule those versions used.

Best so far. A passing, timed verdict of a candidate not retracted replaces the best when

- it carries the judge's interleaved comparison with the current best (``incumbent``, logged
  from ``evaluate(..., incumbent=<best>)``): the lower end of the 95 % interval of
  best time / candidate time clears ``1 + min_gain``;
- else (an older log, a judge without it, a comparison that failed): its time is below the
  best's by more than the fraction ``min_gain``.

``min_gain`` is the objective's (0 in logs written before the field). A timing marked ``contended``
(taken while another evaluation of the run shared its device: ``pytest_kopt.executor``) never
replaces the best.

In call order. With several evaluations in flight (``--kopt-workers``) results land in any order,
but the best is decided in the order of the calls' numbers: a timed verdict of call ``n`` is weighed
only once no call below ``n`` is still in flight (issued, without a result, not abandoned), so the
live run and any later fold of its log, which see the same events in the same order, agree on it.
With one call at a time every verdict is weighed at once, as before.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

from . import events as ev

TIMER_METRICS = ("eager", "device", "graph")
OLD_METRIC = "device"  # what a log from before the metric was named timed


def number(value: Any) -> float | None:
    """A finite number as float, else None (booleans are not numbers here)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def seconds(stamp: Any) -> float | None:
    """An event's ``time`` as epoch seconds (a number or an ISO-8601 string)."""
    if isinstance(stamp, (int, float)):
        return float(stamp)
    if isinstance(stamp, str):
        try:
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def speedup_of(event: dict) -> float | None:
    """Over the run's baseline candidate when logged (``vs_baseline``), else over the judge's first baseline."""
    vs_baseline = number(event.get("vs_baseline"))
    return vs_baseline if vs_baseline is not None else number(event.get("speedup"))


def metric_of(objective: dict) -> str:
    """The timer metric a run is scored under (eager, device or graph); older logs timed device time."""
    name = (objective or {}).get("metric")
    return name if name in TIMER_METRICS else OLD_METRIC


def three_figures(figures: Any, candidate_us: Any, metric: str) -> dict[str, float | None]:
    """Eager, device and graph time of one timing: the judge's ``figures`` when it gave them, else the one
    figure under the metric it was timed with (a log from before the three figures: device)."""
    if isinstance(figures, dict) and any(number(figures.get(name)) is not None for name in TIMER_METRICS):
        return {name: number(figures.get(name)) for name in TIMER_METRICS}
    return {name: (number(candidate_us) if name == metric else None) for name in TIMER_METRICS}


def ratio_text(ratio: Any) -> str:
    """``1.043x [1.021, 1.065]``: a ratio of times with its 95 % interval, or "" without one."""
    if not isinstance(ratio, dict) or number(ratio.get("median")) is None:
        return ""
    lo, hi = number(ratio.get("lo")), number(ratio.get("hi"))
    interval = f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else ""
    return f"{float(ratio['median']):.3f}x{interval}"


def ratio_against(verdict: dict, best_id: str | None) -> dict | None:
    """The judge's interleaved ratio (best time / this time, with its interval) when ``verdict`` was
    timed beside ``best_id``; None otherwise."""
    incumbent = verdict.get("incumbent")
    if not best_id or not isinstance(incumbent, dict) or incumbent.get("candidate_id") != best_id:
        return None
    ratio = incumbent.get("ratio")
    if isinstance(ratio, dict) and number(ratio.get("lo")) is not None:
        return ratio
    return None


def beats(best: dict | None, verdict: dict, min_gain: float) -> bool:
    """Whether ``verdict`` makes its candidate the new best (see the module docstring)."""
    us = number(verdict.get("candidate_us"))
    if verdict.get("verdict") != "pass" or verdict.get("stage") == "judge" or us is None or us <= 0:
        return False
    if verdict.get("contended"):  # timed beside another evaluation on its device: indicative only
        return False
    if best is None:
        return True
    ratio = ratio_against(verdict, best.get("candidate_id"))
    if ratio is not None:
        return float(ratio["lo"]) > 1.0 + min_gain
    return us < float(best["candidate_us"]) * (1.0 - min_gain)


def best_record(verdict: dict, previous: dict | None) -> dict:
    """The ``best`` event's fields for a verdict that beat ``previous``."""
    record = {k: verdict.get(k) for k in ("candidate_id", "candidate_us", "speedup", "vs_baseline", "call")}
    ratio = ratio_against(verdict, (previous or {}).get("candidate_id"))
    if ratio is not None:
        record["ratio"] = {"incumbent": previous["candidate_id"], **ratio}
    if isinstance(verdict.get("figures"), dict):
        record["figures"] = verdict["figures"]
    return record


@dataclass
class Attempt:
    """One candidate as the log knows it: where it came from and what the judge said of it."""

    candidate_id: str
    order: int  # 0-based order of writing
    parent: str | None = None
    strategy: str | None = None
    knobs: Any = None
    notes: str = ""
    path: str | None = None
    written_at: int | None = None  # tool call that wrote it (0: the loop's own set-up)
    judged_at: int | None = None  # tool call of its latest verdict
    latest: dict | None = None  # its latest verdict event (a failure of the judge itself included)
    tests: dict | None = None  # its latest passing verdict without a time
    timing: dict | None = None  # its latest passing verdict with a time
    failure: dict | None = None  # its latest failing verdict
    fastest: dict | None = None  # its passing verdict with the lowest time
    profiled: bool = False
    was_best: bool = False
    timed_on: str | None = None  # the machine (GPU name or "cpu") of its fastest timing
    result_path: str | None = None  # of its latest verdict that has one

    @property
    def meta(self) -> dict:
        """The fields of its ``candidate`` event."""
        return {"candidate_id": self.candidate_id, "parent": self.parent, "strategy": self.strategy, "knobs": self.knobs,
                "path": self.path or f"candidates/{self.candidate_id}.py", "notes": self.notes, "call": self.written_at}

    @property
    def verdict(self) -> str | None:
        return self.latest.get("verdict") if self.latest else None

    @property
    def stage(self) -> str | None:
        return self.latest.get("stage") if self.latest else None

    @property
    def upto(self) -> str | None:
        return self.latest.get("upto") if self.latest else None

    @property
    def reasons(self) -> list[str]:
        return list((self.latest or {}).get("reasons") or [])

    @property
    def candidate_us(self) -> float | None:
        """Its fastest verified time (what best-so-far is tracked by)."""
        return number(self.fastest.get("candidate_us")) if self.fastest else None

    @property
    def speedup(self) -> float | None:
        """The speedup of its fastest verified time."""
        return speedup_of(self.fastest) if self.fastest else None

    @property
    def figures(self) -> dict | None:
        return self.fastest.get("figures") if self.fastest and isinstance(self.fastest.get("figures"), dict) else None


@dataclass
class RunState:
    """Everything a log says about its run; build with ``fold`` (or ``apply`` event by event)."""

    objective: dict = field(default_factory=dict)
    run_id: str = ""
    problem: str | None = None
    agent: Any = None
    seed: Any = None
    started: dict | None = None  # the run_started event
    environment: dict = field(default_factory=dict)  # run_started's
    machine: str | None = None  # the GPU (or "cpu") of the session in force
    agent_settings: dict[str, dict] = field(default_factory=dict)  # agent name -> its last recorded settings
    budget: int | None = None
    status: str = "in progress"  # "finished", "interrupted" or "in progress"
    status_reason: str | None = None
    resumes: int = 0
    candidates: dict[str, Attempt] = field(default_factory=dict)
    results: dict[tuple[str, str], dict] = field(default_factory=dict)  # (id, upto) -> its latest verdict (not a judge failure)
    best: dict | None = None
    progress: list[tuple[int, float, str]] = field(default_factory=list)  # (call, speedup, id): each change of best
    best_ratios: dict[str, dict] = field(default_factory=dict)  # id -> how it beat the best before it, timed side by side
    logged_best: dict | None = None  # the last best event
    retracted: dict[str, str] = field(default_factory=dict)  # id -> why it may not be best
    calls: dict[int, dict] = field(default_factory=dict)  # call number -> its latest tool_call event
    answered: dict[int, dict] = field(default_factory=dict)  # call number -> its tool_result event
    pending: dict[int, dict] = field(default_factory=dict)  # call number -> its tool_call, issued and not answered (in flight)
    abandoned: set[int] = field(default_factory=set)  # numbers of calls given up on resume (a note says why); free again
    tool_seconds: dict[str, list[float]] = field(default_factory=dict)  # tool -> wall seconds of each call
    replies: list[str] = field(default_factory=list)  # what an LLM wrote beside its tool calls
    promotions: list[dict] = field(default_factory=list)  # promote events
    ended_budget_used: int = 0  # the largest budget_used an end or resume event recorded
    _timed: list[dict] = field(default_factory=list, repr=False)  # passing timed verdicts, weighed, in call order
    _waiting: list[tuple] = field(default_factory=list, repr=False)  # (call, seq, verdict): timed, not yet weighed
    _call: int = field(default=0, repr=False)  # the latest call number seen (for events without one)
    _stamps: list[float] = field(default_factory=list, repr=False)
    _sessions: list[float] = field(default_factory=list, repr=False)
    _session_start: float = field(default=0.0, repr=False)

    # ---- building ---------------------------------------------------------------------------
    @classmethod
    def fold(cls, events: Iterable[dict], objective: dict | None = None) -> "RunState":
        state = cls(objective=dict(objective or {}))
        for event in events:
            state.apply(event)
        return state

    @classmethod
    def from_log(cls, path: str | Path) -> "RunState":
        return cls.fold(ev.read_events(path))

    def apply(self, event: dict) -> None:
        """Take in one event, in log order."""
        kind = event.get("kind")
        self.run_id = event.get("run_id") or self.run_id
        self._clock(kind, event.get("time"))
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, event)

    def _clock(self, kind: str | None, stamp: Any) -> None:
        at = seconds(stamp)
        if at is None:
            return
        if kind == ev.RUN_RESUMED and self._stamps:  # close the session before this resume
            self._sessions.append(self._stamps[-1] - self._session_start)
        if kind == ev.RUN_RESUMED or not self._stamps:
            self._session_start = at
        self._stamps.append(at)

    def _session(self, event: dict) -> None:
        if event.get("kind") == ev.RUN_STARTED:
            self.started = event
            self.problem = event.get("problem", self.problem)
            self.objective = dict(event.get("objective") or {})
            self.environment = event.get("environment") or {}
            self.agent = agent_name(event.get("agent")) or self.agent
            self.seed = event.get("seed", self.seed)
        else:
            self.resumes += 1
            self.status, self.status_reason = "in progress", None
            self.ended_budget_used = max(self.ended_budget_used, _int(event.get("budget_used")))
        self.budget = event.get("budget", self.budget)
        if "environment" in event:
            self.machine = machine_name(event.get("environment"))
        if agent_name(event.get("agent")) and isinstance(event.get("agent_settings"), dict):
            self.agent_settings[agent_name(event["agent"])] = event["agent_settings"]

    def _end(self, event: dict) -> None:
        self.status = "finished" if event.get("kind") == ev.RUN_FINISHED else "interrupted"
        self.status_reason = event.get("reason")
        self.budget = event.get("budget", self.budget)
        self.ended_budget_used = max(self.ended_budget_used, _int(event.get("budget_used")))

    def _tool_call(self, event: dict) -> None:
        self._call = _int(event.get("call")) or self._call + 1
        self.calls[self._call] = event
        if self._call not in self.answered:
            self.pending[self._call] = event

    def _tool_result(self, event: dict) -> None:
        number_ = _int(event.get("call")) or self._call
        self.answered[number_] = event
        self.pending.pop(number_, None)
        self._settle()
        took = number(event.get("duration_s"))
        if took is not None and event.get("tool"):
            self.tool_seconds.setdefault(str(event["tool"]), []).append(took)

    def _candidate(self, event: dict) -> None:
        cid = event.get("candidate_id")
        if not cid or cid in self.candidates:
            return
        at = event.get("call")
        self.candidates[cid] = Attempt(
            cid, len(self.candidates), parent=event.get("parent"), strategy=event.get("strategy"), knobs=event.get("knobs"),
            notes=event.get("notes") or "", path=event.get("path"), written_at=at if isinstance(at, int) else self._call,
        )

    def _verdict(self, event: dict) -> None:
        cid = event.get("candidate_id")
        if not cid:
            return
        at = event.get("call") if isinstance(event.get("call"), int) else self._call
        attempt = self.candidates.get(cid)
        if attempt is None:  # a log that judged a candidate it never recorded: keep what it says
            attempt = self.candidates[cid] = Attempt(cid, len(self.candidates), written_at=at)
        attempt.latest, attempt.judged_at = event, at
        attempt.result_path = event.get("result_path") or attempt.result_path
        us = number(event.get("candidate_us"))
        if event.get("verdict") != "pass":
            attempt.failure = event
        elif us is not None:
            attempt.timing = event
            if _faster(event, attempt.fastest):
                attempt.fastest, attempt.timed_on = event, self.machine
        else:
            attempt.tests = event
        if event.get("verdict") == "pass" and event.get("upto") == "profile":
            attempt.profiled = True
        if event.get("stage") == "judge":  # the judge itself failed: nothing is known of the candidate
            return
        if event.get("upto"):
            self.results[(cid, str(event["upto"]))] = event
        if event.get("verdict") == "pass" and us is not None:
            heapq.heappush(self._waiting, (_int(at), _int(event.get("seq")), {**event, "call": at}))
            self._settle()

    def _settle(self) -> None:
        """Weigh the timed verdicts no earlier call is still in flight for, in call order (module docstring)."""
        while self._waiting:
            at = self._waiting[0][0]
            if any(n < at for n in self.pending):
                return
            verdict = heapq.heappop(self._waiting)[2]
            self._timed.append(verdict)
            if verdict["candidate_id"] not in self.retracted and beats(self.best, verdict, self.min_gain):
                self._new_best(best_record(verdict, self.best))

    def _note(self, event: dict) -> None:
        abandoned = event.get("abandoned")
        if isinstance(abandoned, int) and abandoned not in self.answered:
            self.pending.pop(abandoned, None)
            self.abandoned.add(abandoned)
            self._settle()

    def _new_best(self, record: dict) -> None:
        self.best = record
        if isinstance(record.get("ratio"), dict):
            self.best_ratios[record["candidate_id"]] = record["ratio"]
        speedup = speedup_of(record)
        if speedup is not None:
            self.progress.append((_int(record.get("call")), speedup, record["candidate_id"]))
        self.candidates[record["candidate_id"]].was_best = True

    def _best(self, event: dict) -> None:
        self.logged_best = event

    def _retract(self, event: dict) -> None:
        cid = event.get("candidate_id")
        if not cid:
            return
        self.retracted[cid] = str(event.get("reason", ""))
        # the best and its progress line as if the retracted candidates had never been timed
        self.best, self.progress, self.best_ratios = None, [], {}
        for attempt in self.candidates.values():
            attempt.was_best = False
        for verdict in self._timed:
            if verdict["candidate_id"] not in self.retracted and beats(self.best, verdict, self.min_gain):
                self._new_best(best_record(verdict, self.best))

    def _promote(self, event: dict) -> None:
        self.promotions.append(event)

    def _llm_response(self, event: dict) -> None:
        content = (event.get("message") or {}).get("content")
        if content and str(content).strip():
            self.replies.append(str(content))

    # ---- what a reader asks -------------------------------------------------------------------
    @property
    def min_gain(self) -> float:
        return number(self.objective.get("min_gain")) or 0.0

    @property
    def metric(self) -> str:
        return metric_of(self.objective)

    @property
    def baseline_us(self) -> float | None:
        return number(self.objective.get("baseline_us"))

    @property
    def budget_used(self) -> int:
        """Tool calls charged: the distinct call numbers that have a result."""
        return len(self.answered)

    @property
    def unanswered_gaps(self) -> list[int]:
        """Call numbers below a charged one that were never issued nor given up (a damaged log)."""
        done = set(self.answered)
        return sorted(set(range(1, max(done) + 1)) - done - set(self.pending) - self.abandoned) if done else []

    @property
    def in_flight(self) -> dict | None:
        """The latest tool_call with no result: in flight when its process died."""
        return max(self.pending.values(), key=lambda e: e.get("seq", 0)) if self.pending else None

    @property
    def in_flight_calls(self) -> list[dict]:
        """Every tool_call with no result (several with ``--kopt-workers``), by call number."""
        return [self.pending[n] for n in sorted(self.pending)]

    @property
    def issued(self) -> int:
        """Calls charged or in flight: what the budget must cover."""
        return len(self.answered) + len(self.pending)

    def free_number(self) -> int:
        """The number the next call gets: the lowest neither charged nor in flight (a call given up frees its number)."""
        n = 1
        while n in self.answered or n in self.pending:
            n += 1
        return n

    @property
    def missing_best(self) -> bool:
        """Whether the log's last ``best`` event is not the best its verdicts make (a kill between them)."""
        if self.best is None:
            return False
        logged = self.logged_best or {}
        return logged.get("candidate_id") != self.best["candidate_id"] or number(logged.get("candidate_us")) != number(self.best.get("candidate_us"))

    @property
    def running_s(self) -> float | None:
        """Time the run ran, summed over its sessions (a stop-to-resume gap left out)."""
        if not self._stamps:
            return None
        return sum(self._sessions) + self._stamps[-1] - self._session_start

    def completed_calls(self) -> list[tuple[str, dict, dict]]:
        """(tool, logged args, result) of every call that has a result, in call order."""
        out = []
        for n in sorted(self.answered):
            result_event, call = self.answered[n], self.calls.get(n) or {}
            out.append((result_event.get("tool") or call.get("tool"), dict(call.get("args") or {}), result_event.get("result") or {}))
        return out

    def setup_verdicts(self) -> dict[str, dict]:
        """The loop's own evaluations (call 0, not charged: the baseline candidate), by candidate id."""
        found: dict[str, dict] = {}
        for (cid, _), verdict in self.results.items():
            if verdict.get("call") == 0:
                found[cid] = verdict
        return found


def agent_name(value: Any) -> str | None:
    """The agent's name as a log records it: a string, or (in logs from before settings were kept apart) ``{"name": ...}``."""
    if isinstance(value, dict):
        value = value.get("name")
    return str(value) if value else None


def machine_name(environment: Any) -> str | None:
    """The kind of machine an environment record names: its GPU, or "cpu"."""
    if not isinstance(environment, dict):
        return None
    return str(environment.get("gpu") or "cpu")


def _faster(event: dict, fastest: dict | None) -> bool:
    """Whether a passing timing stands for its candidate before ``fastest``: an uncontended one before a
    contended one, else the lower time."""
    if fastest is None:
        return True
    if bool(event.get("contended")) != bool(fastest.get("contended")):
        return not event.get("contended")
    return number(event.get("candidate_us")) < number(fastest.get("candidate_us"))


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


_HANDLERS = {
    ev.RUN_STARTED: RunState._session,
    ev.RUN_RESUMED: RunState._session,
    ev.RUN_FINISHED: RunState._end,
    ev.RUN_INTERRUPTED: RunState._end,
    ev.TOOL_CALL: RunState._tool_call,
    ev.TOOL_RESULT: RunState._tool_result,
    ev.CANDIDATE: RunState._candidate,
    ev.VERDICT: RunState._verdict,
    ev.BEST: RunState._best,
    ev.RETRACT: RunState._retract,
    ev.PROMOTE: RunState._promote,
    ev.LLM_RESPONSE: RunState._llm_response,
    ev.NOTE: RunState._note,
}
