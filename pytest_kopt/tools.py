"""The agent's tools, the budget, the candidate store and best-so-far: the one door to the judge.

Budget accounting
-----------------
The budget counts tool calls, as in the case study this project is modelled on. Every action
an agent takes costs exactly one unit, whatever it does and whatever comes back:

- ``write_candidate`` (store a source file), ``run_tests`` (policy + compile + correctness),
  ``benchmark``, ``profile``, ``show_reference``, ``show_problem``, ``show_candidate`` and
  ``history`` each cost one;
- a call with bad arguments, an unknown candidate id or an unknown tool still costs one (the
  agent did make it) and answers ``{"error": ...}``; so does a call the agent could not even
  state (an LLM's tool call whose arguments are not JSON: ``reject``);
- asking again for an evaluation the run already has (same candidate, same or an earlier
  stage; or any stage of a candidate that already failed) is answered from the run's cache
  (``"cached": true``): cheap in time, still one unit;
- the loop's own set-up (timing the baseline candidate for the objective) and an agent's
  free bookkeeping (``Toolbox.history()`` called as a method) cost nothing;
- call ``n`` is logged as a ``tool_call`` before it runs and a ``tool_result`` after. A
  ``tool_call`` with no ``tool_result`` was in flight when the process died: on resume it is
  redone under the same number ``n`` (``"redo": true``) and so is charged once. (A
  ``write_candidate`` whose source had not been stored yet cannot be redone; the agent makes
  its next call under that number instead: the later ``tool_call`` of a number is the real one.)
  ``budget_used`` is the number of distinct ``call`` numbers that have a ``tool_result``.
  A ``write_candidate``'s source is stored before its ``tool_call`` is logged, so a new log's
  write can always be redone.


When every call of the budget is charged or in flight, ``call`` and ``submit`` raise
``BudgetExhausted`` and the run ends once the calls in flight are answered. A run directory that
cannot be written (a full disk, a read-only mount) is not an answer to the agent: the error
propagates and the run stops (the call is redone on resume, charged once).

Several calls in flight
-----------------------
With ``--kopt-workers=N`` up to N evaluations run at once (``pytest_kopt.executor``). ``submit``
issues a call and returns its number at once: the number is given and the ``tool_call`` logged
when the call is issued (the lowest number neither charged nor in flight), a tool that needs no
judge is answered on the spot, and an evaluation runs on a free worker (``submit`` waits for one).
Results are recorded in this (the main) thread as they land, in any order, each as its
``verdict`` and ``tool_result``; ``next_result`` hands them to the agent in the order they were
logged, ``result_of(n)`` waits for one call, ``call`` is ``submit`` then ``result_of``. A resume
redoes every call that was in flight, each once under its own number, before the agent restores
itself from the log. The best is decided in call order (``pytest_kopt.runstate``). A timing taken
beside another evaluation on its device is marked ``contended`` in the verdict and in what the
agent sees; it never becomes the best, and asking for the same stage again times it afresh
instead of answering from the cache.

Best so far
-----------
The state of the run (candidates, verdicts, best, budget) is a ``RunState`` that every logged
event is applied to, the same fold a resumed run rebuilds from the log (``pytest_kopt.runstate``,
where the rule for a new best lives). When a best exists, a benchmark or profile times the
candidate beside it, interleaved round by round (``evaluate(..., incumbent=<best's file>)``), and
the candidate replaces it only when the interval of the ratio clears ``1 + min_gain``.

Retraction
----------
A verdict is evidence about the shapes the judge drew, and a later judgement can contradict it
(the same kernel code failing on other hypothesis shapes, a check run by hand). ``retract`` takes
a candidate out of the running for best, for a stated reason, in a ``retract`` event; the best
is then rebuilt from the log's verdicts without it and logged as a new ``best`` event. It is free
(no tool call), and a retracted candidate never becomes best again, live or on resume.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from . import events as ev
from .events import TEMP_GLOB, EventLog, atomic_write, dumps, is_storage_error, signals_deferred
from .executor import Executor, LocalExecutor, Ticket, takes_keyword
from .judge import STAGES, candidate_id
from .runstate import Attempt, RunState, metric_of

if TYPE_CHECKING:  # pragma: no cover
    from .problems.base import Problem

MAX_SOURCE_CHARS = 200_000
HISTORY_RECENT, HISTORY_FASTEST = 40, 10  # rows the history tool shows: the latest and the fastest
RAW_ARGS_CHARS = 400  # of a malformed call's arguments, kept in its tool_call event
TIMED = ("benchmark", "profile")  # the stages that time a candidate (beside the best, when there is one)
EVALUATIONS = {"run_tests": "correctness", "benchmark": "benchmark", "profile": "profile"}  # tool -> the judge's last stage
WAIT_S = 0.25  # how often a wait for results looks up (Ctrl-C is acted on between looks)

Evaluate = Callable[..., dict]


class BudgetExhausted(RuntimeError):
    """No tool calls are left."""


def _id_arg(description: str = "id of a candidate written in this run") -> dict:
    return {"type": "object", "properties": {"candidate_id": {"type": "string", "description": description}}, "required": ["candidate_id"], "additionalProperties": False}


def _no_args() -> dict:
    return {"type": "object", "properties": {}, "additionalProperties": False}


SCHEMAS: dict[str, dict] = {
    "write_candidate": {
        "description": "Store a complete candidate file (a Python module exposing kernel(...)); returns its candidate_id. Costs one call.",
        "type": "object",
        "properties": {
            "source": {"type": "string", "description": "the whole candidate file"},
            "notes": {"type": "string", "description": "what changed and the prediction it tests"},
            "parent": {"type": ["string", "null"], "description": "candidate_id this one was derived from"},
            "strategy": {"type": ["string", "null"], "description": "family name, or 'llm'"},
            "knobs": {"type": ["object", "null"], "description": "knob values when rendered from a family"},
        },
        "required": ["source"],
        "additionalProperties": False,
    },
    "run_tests": {**_id_arg(), "description": "Judge policy, compile and correctness of a candidate. Costs one call."},
    "benchmark": {**_id_arg(), "description": "Correctness, then time the candidate against the baselines on the headline shape. Costs one call."},
    "profile": {**_id_arg(), "description": "Correctness, timing, then per-kernel profile of a candidate. Costs one call."},
    "show_reference": {**_no_args(), "description": "The readable PyTorch reference of the problem. Costs one call."},
    "show_problem": {**_no_args(), "description": "The objective: problem, shapes, metric, baseline time, floor, rules, budget. Costs one call."},
    "show_candidate": {**_id_arg(), "description": "The source and notes of a candidate written in this run. Costs one call."},
    "history": {**_no_args(), "description": "One row per candidate so far: verdict, stage, time, speedup; and the best. Costs one call."},
}

_JSON_TYPES = {"string": str, "object": dict, "null": type(None)}


def _check_args(tool: str, args: dict) -> str | None:
    """Why ``args`` do not fit the tool's schema, or None."""
    schema = SCHEMAS[tool]
    props = schema["properties"]
    unknown = sorted(set(args) - set(props))
    if unknown:
        return f"{tool} takes no argument(s) {', '.join(unknown)}; it takes {', '.join(props) or 'none'}"
    missing = [k for k in schema.get("required", []) if k not in args]
    if missing:
        return f"{tool} needs argument(s) {', '.join(missing)}"
    for name, value in args.items():
        kinds = props[name]["type"]
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not isinstance(value, tuple(_JSON_TYPES[k] for k in kinds)):
            return f"{tool}: {name} must be {' or '.join(kinds)}, got {type(value).__name__}"
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _timings(result: dict) -> dict:
    timings = result.get("timings") or {}
    if isinstance(timings, list):  # tolerate a per-case list: the first is the headline
        timings = timings[0] if timings else {}
    return timings if isinstance(timings, dict) else {}


def remove_stale_temp_files(run_dir: Path) -> list[Path]:
    """Delete temporary files a killed writer left behind; call only while owning the run."""
    stale = [p for p in Path(run_dir).rglob(TEMP_GLOB) if p.is_file()]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


class Toolbox:
    """Tools an agent calls, each charged one unit of budget and logged (see the module docstring)."""

    SCHEMAS = SCHEMAS

    def __init__(
        self,
        problem: "Problem",
        objective: dict,
        log: EventLog,
        run_dir: Path,
        budget: int,
        *,
        evaluate: Evaluate | None = None,
        eval_timeout: float = 900.0,
        executor: Executor | None = None,
    ):
        self.problem = problem
        self.objective = objective
        self.log = log
        self.run_dir = Path(run_dir)
        self.budget = int(budget)
        self.state = RunState(objective=dict(objective))  # every event this toolbox logs is applied to it
        self.results: dict[tuple[str, str], dict] = {}  # (id, upto) -> judge result
        self.in_flight: dict | None = None  # the latest tool_call of a previous process without result
        self.unfinished: list[dict] = []  # every tool_call of a previous process without result (redo_in_flight)
        self.executor = executor or LocalExecutor(1)
        self.running: dict[int, _Running] = {}  # call number -> its evaluation on a worker
        self.delivered: deque[tuple[int, str, dict]] = deque()  # (call, tool, result) answered, not yet handed out
        self.listeners: list[Callable[[dict], None]] = []  # see every event the toolbox logs
        self.eval_timeout = float(eval_timeout)
        if evaluate is None:
            from .judge import evaluate as judge_evaluate

            evaluate = judge_evaluate
        self._evaluate = evaluate
        self._evaluator = self.executor.evaluator(evaluate)
        self.executor.problem_modules[getattr(problem, "name", "")] = type(problem).__module__  # a Ray task imports it
        self._can_skip_sweep = takes_keyword(evaluate, "hypothesis")
        self._takes_metric = takes_keyword(evaluate, "metric")
        self._takes_incumbent = takes_keyword(evaluate, "incumbent")
        self._takes_baselines = takes_keyword(evaluate, "baselines")
        self._takes_timing = takes_keyword(evaluate, "timing")

    # ---- bookkeeping --------------------------------------------------------------------
    @property
    def budget_left(self) -> int:
        return max(0, self.budget - self.budget_used)

    @property
    def calls_left(self) -> int:
        """Calls that may still be issued: the budget less what is charged and what is in flight."""
        return max(0, self.budget - self.state.issued)

    @property
    def workers(self) -> int:
        """How many evaluations may run at once (``--kopt-workers``)."""
        return self.executor.workers

    @property
    def budget_used(self) -> int:
        return self.state.budget_used

    @property
    def best(self) -> dict | None:
        """The best verified candidate so far (candidate_id, candidate_us, speedup, vs_baseline, call[, ratio])."""
        return self.state.best

    @property
    def retracted(self) -> dict[str, str]:
        return self.state.retracted

    @property
    def candidates(self) -> dict[str, Attempt]:
        return self.state.candidates

    @property
    def evaluator(self) -> Evaluate:
        """The judge this toolbox calls (``pytest_kopt.judge.evaluate`` unless one was injected), run through
        its executor: on a Ray cluster, the loop's own evaluations (a promotion) run on a worker too."""
        return self._evaluator

    @property
    def metric(self) -> str:
        """The timer metric the objective is scored under: eager, device or graph."""
        return metric_of(self.objective)

    @property
    def baseline_us(self) -> float | None:
        return _number(self.objective.get("baseline_us"))

    def emit(self, kind: str, **fields: Any) -> dict:
        """Log one event and apply it to the run state (listeners see it too). A verdict or a result that
        makes a new best (the state's rule, in call order) is followed by its ``best`` event."""
        before = self.state.best
        event = self.log.append(kind, **fields)
        self.state.apply(event)
        for listener in list(self.listeners):
            try:
                listener(event)
            except Exception:  # a broken display (closed pipe, ...) must not end the run
                self.listeners.remove(listener)
        if kind in (ev.VERDICT, ev.TOOL_RESULT) and self.state.best is not before and self.state.best is not None:
            self.emit(ev.BEST, **self.state.best)
        return event

    def restore(self, events: list[dict]) -> None:
        """Rebuild budget, candidates, evaluation cache, best and the in-flight call from a log."""
        state = RunState.fold(events, objective=self.objective)
        if state.unanswered_gaps:
            raise ValueError(f"{self.log.path}: tool calls {state.unanswered_gaps} have no result although later ones do")
        self.state = state
        self.results = {key: self._load_result(verdict) for key, verdict in state.results.items()}
        self.in_flight = state.in_flight
        self.unfinished = state.in_flight_calls

    def recover_best(self) -> dict | None:
        """Log the ``best`` event a kill between a verdict and its best event left out (on resume),
        so every reader of the log agrees with best.json; returns it, or None when nothing was missing."""
        if not self.state.missing_best:
            return None
        return self.emit(ev.BEST, **self.best, recovered=True)

    def _load_result(self, verdict: dict) -> dict:
        path = self.run_dir / (verdict.get("result_path") or "")
        if verdict.get("result_path") and path.is_file():
            try:
                return json.loads(path.read_text())
            except ValueError:
                pass  # a torn result file: the verdict event is enough
        timings = {"candidate_us": verdict.get("candidate_us"), "figures": verdict.get("figures"), "metric": verdict.get("metric")}
        return {k: verdict.get(k) for k in ("verdict", "stage", "reasons", "errors", "speedup", "incumbent", "contended")} | {"timings": timings}

    def resolve(self, cid: Any) -> str:
        """A known candidate id from an id or a unique prefix of at least 6 characters."""
        if not isinstance(cid, str) or not cid.strip():
            raise KeyError("candidate_id must be a non-empty string")
        cid = cid.strip()
        if cid in self.candidates:
            return cid
        matches = [c for c in self.candidates if len(cid) >= 6 and c.startswith(cid)]
        if len(matches) == 1:
            return matches[0]
        known = ", ".join(list(self.candidates)[-8:]) or "none yet"
        raise KeyError(f"unknown candidate_id {cid!r} (latest known: {known})")

    # ---- issuing and answering calls -------------------------------------------------------
    def call(self, tool: str, **args: Any) -> dict:
        """Run one tool: charge one unit, log ``tool_call`` and ``tool_result``, return the result."""
        return self.result_of(self.submit(tool, **args))

    def submit(self, tool: str, **args: Any) -> int:
        """Issue one call and return its number; its result comes from ``next_result`` or ``result_of``
        (see the module docstring). Raises ``BudgetExhausted`` when every call of the budget is issued."""
        self._check_budget()
        if tool in EVALUATIONS:
            self._wait_for_worker()
        return self._issue(tool, args, self.state.free_number())

    def reject(self, tool: str, error: str, raw: Any = None) -> dict:
        """Charge one call the agent could not state (arguments that are not a JSON object): logged as a
        call, answered ``{"error": error}``, nothing run."""
        self._check_budget()
        raw_text = raw if isinstance(raw, str) else dumps(raw)
        number = self._issue(str(tool or "?"), {"raw": raw_text[:RAW_ARGS_CHARS]}, self.state.free_number(), rejected=str(error))
        return self.result_of(number)

    def next_result(self) -> tuple[int, str, dict] | None:
        """(call, tool, result) of the oldest answered call not yet handed out, waiting for an evaluation
        to land if none is; None when nothing is answered and nothing is in flight."""
        while not self.delivered:
            if not self.running:
                return None
            self._collect(block=True)
        return self.delivered.popleft()

    def result_of(self, number: int) -> dict:
        """The result of call ``number`` (issued by this toolbox), waiting for it if it is in flight."""
        while True:
            for item in self.delivered:
                if item[0] == number:
                    self.delivered.remove(item)
                    return item[2]
            if number not in self.running:
                raise KeyError(f"call {number} was not issued here or its result was handed out already")
            self._collect(block=True)

    def drain(self) -> None:
        """Wait for every evaluation in flight and record it (the run ends, or a resume's redos finish)."""
        while self.running:
            self._collect(block=True)

    def close(self) -> None:
        """Let go of the executor (evaluations still running are abandoned: redone on resume)."""
        self.executor.close()

    def redo_in_flight(self) -> dict | None:
        """Redo the calls a killed process left without result, each under its own number, and wait for them;
        returns the result of the latest one (None when there was none). A call that cannot be redone (a
        write whose source was never stored, in a log written before sources were stored first) or that the
        budget no longer covers is given up in a note, uncharged, and its number is free again."""
        unfinished, self.unfinished, self.in_flight = self.unfinished, [], None
        redone: list[int] = []
        for event in unfinished:
            number = int(event["call"])
            args = dict(event.get("args") or {})
            if self.budget_used + len(redone) >= self.budget:
                self.emit(ev.NOTE, text=f"in-flight call {number} ({event['tool']}) is past the budget of {self.budget}: not redone, not charged", abandoned=number)
                continue
            if event.get("rejected"):
                redone.append(self._issue(event["tool"], args, number, redo=True, rejected=event["rejected"]))
                continue
            if event["tool"] == "write_candidate" and "candidate_id" in args:
                path = self.run_dir / "candidates" / f"{args.pop('candidate_id')}.py"
                if not path.is_file():
                    self.emit(ev.NOTE, text=f"in-flight call {number} (write_candidate) could not be redone: its source was never stored; not charged", abandoned=number)
                    continue
                args["source"] = path.read_text(encoding="utf-8")
            if event["tool"] in EVALUATIONS:
                self._wait_for_worker()
            redone.append(self._issue(event["tool"], args, number, redo=True))
        self.drain()
        results = [self.result_of(n) for n in redone]
        return results[-1] if results else None

    def _check_budget(self) -> None:
        if self.state.issued >= self.budget:
            raise BudgetExhausted(f"budget of {self.budget} tool calls used up")

    def _wait_for_worker(self) -> None:
        while len(self.running) >= self.workers:
            self._collect(block=True)

    def _issue(self, tool: str, args: dict, number: int, redo: bool = False, rejected: str | None = None) -> int:
        """Log call ``number`` and answer it, or start its evaluation on a worker; returns the number."""
        logged_args = dict(args)
        if tool == "write_candidate" and isinstance(args.get("source"), str) and rejected is None:
            logged_args["candidate_id"] = candidate_id(args["source"])
            del logged_args["source"]
            self._store_first(args)
        extra = ({"redo": True} if redo else {}) | ({"rejected": rejected} if rejected is not None else {})
        self.emit(ev.TOOL_CALL, call=number, tool=tool, args=logged_args, **extra)
        start = time.monotonic()
        if rejected is not None:
            result = {"error": rejected}
        elif tool not in SCHEMAS:
            result = {"error": f"unknown tool {tool!r}; tools: {', '.join(SCHEMAS)}"}
        else:
            problem = _check_args(tool, args)
            if problem:
                result = {"error": problem}
            else:
                try:
                    if tool in EVALUATIONS:
                        answer = self._start_evaluation(number, tool, self.resolve(args["candidate_id"]), start)
                        if answer is None:  # running on a worker: answered when it lands
                            return number
                        result = answer
                    else:
                        result = getattr(self, "_tool_" + tool)(number, **args)
                except KeyError as exc:
                    result = {"error": str(exc.args[0]) if exc.args else str(exc)}
                except Exception as exc:  # a bug must not end a long run; a run dir that cannot be written must
                    if is_storage_error(exc):
                        raise
                    result = {"error": f"{tool} failed inside the toolbox: {type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=4)}
        self._answer(number, tool, result, start)
        return number

    def _store_first(self, args: dict) -> None:
        """A write's source goes to candidates/ before its call is logged: a kill between the two leaves a
        call that can be redone (an unlogged file is harmless: content-addressed, written again alike)."""
        source = args["source"]
        if not source.strip() or len(source) > MAX_SOURCE_CHARS:
            return  # refused by the tool itself, with its message
        path = self.run_dir / "candidates" / f"{candidate_id(source)}.py"
        if not path.is_file() or path.read_text(encoding="utf-8") != source:
            atomic_write(path, source)

    def _answer(self, number: int, tool: str, result: dict, start: float) -> None:
        with signals_deferred():  # the log and budget_used move together, even on Ctrl-C
            self.emit(ev.TOOL_RESULT, call=number, tool=tool, result=result, duration_s=round(time.monotonic() - start, 3))
        self.delivered.append((number, tool, result))

    def _start_evaluation(self, number: int, tool: str, cid: str, start: float) -> dict | None:
        """The cached answer of an evaluation, or None once it is running on a worker."""
        upto = EVALUATIONS[tool]
        result = self.cached(cid, upto)
        if result is not None:
            return self.compact(cid, upto, result, cached=True)
        path, extra = self._judge_args(cid, upto)
        ticket = self.executor.submit(self._evaluate, self.problem.name, str(Path(path).resolve()), {"upto": upto, "timeout_s": self.eval_timeout, **extra})
        self.running[number] = _Running(number, tool, cid, upto, ticket, start)
        if ticket.future.done():  # the inline worker: recorded now, as the loop always did
            self._complete(self.running.pop(number))
        return None

    def _collect(self, block: bool) -> None:
        """Record the evaluations that have landed (waiting for one if ``block``), in the order they ended."""
        while True:
            done = [r for r in self.running.values() if r.ticket.future.done()]
            if done or not block or not self.running:
                break
            wait([r.ticket.future for r in self.running.values()], timeout=WAIT_S, return_when=FIRST_COMPLETED)
        for running in sorted(done, key=lambda r: (r.ticket.finished or 0.0, r.number)):
            self._complete(self.running.pop(running.number))

    def _complete(self, running: "_Running") -> None:
        """Record a landed evaluation: its verdict (with where it ran and whether it was contended), then its result."""
        ticket = self.executor.collect(running.ticket)
        result = self._judged(ticket.future)
        placement = ticket.placement(self.executor.name) if (self.workers > 1 or self.executor.name != "local") else None
        try:
            answer = self.record(running.cid, running.upto, result, call=running.number, placement=placement,
                                 contended=ticket.contended and _timed(result))
        except Exception as exc:  # a bug must not end a long run; a run dir that cannot be written must
            if is_storage_error(exc):
                raise
            answer = {"error": f"{running.tool} failed inside the toolbox: {type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=4)}
        self._answer(running.number, running.tool, answer, running.start)

    # ---- tools ----------------------------------------------------------------------------
    def add_candidate(self, source: str, *, notes: str = "", parent: str | None = None, strategy: str | None = None, knobs: dict | None = None, call: int = 0) -> str:
        """Store a source content-addressed; log a ``candidate`` event the first time it is seen."""
        if not source.strip():
            raise ValueError("source is empty")
        if len(source) > MAX_SOURCE_CHARS:
            raise ValueError(f"source has {len(source)} characters; the limit is {MAX_SOURCE_CHARS}")
        cid = candidate_id(source)
        path = self.run_dir / "candidates" / f"{cid}.py"
        if not path.is_file() or path.read_text(encoding="utf-8") != source:
            atomic_write(path, source)
        if cid not in self.candidates:
            self.emit(ev.CANDIDATE, candidate_id=cid, parent=parent, strategy=strategy, knobs=knobs, path=f"candidates/{cid}.py", notes=notes, call=call)
        return cid

    def _tool_write_candidate(self, number: int, source: str, notes: str = "", parent: str | None = None, strategy: str | None = None, knobs: dict | None = None) -> dict:
        if parent is not None:
            parent = self.resolve(parent)
        try:
            known = candidate_id(source) in self.candidates
            cid = self.add_candidate(source, notes=notes, parent=parent, strategy=strategy, knobs=knobs, call=number)
        except ValueError as exc:
            return {"error": str(exc)}
        return {"candidate_id": cid, "new": not known}

    def _tool_show_reference(self, number: int) -> dict:
        path = Path(self.problem.reference_path)
        return {"path": path.name, "source": path.read_text(encoding="utf-8")}

    def _tool_show_problem(self, number: int) -> dict:
        return {"objective": self.objective, "budget": self.budget, "budget_used": number, "best": self.best}

    def _tool_show_candidate(self, number: int, candidate_id: str) -> dict:
        cid = self.resolve(candidate_id)
        meta = self.candidates[cid].meta
        source = (self.run_dir / meta["path"]).read_text(encoding="utf-8")
        return {**{k: meta.get(k) for k in ("candidate_id", "parent", "strategy", "knobs", "notes")}, "source": source}

    def _tool_history(self, number: int) -> dict:
        rows = self.history()
        fastest = sorted((r for r in rows if r.get("candidate_us") is not None), key=lambda r: r["candidate_us"])[:HISTORY_FASTEST]
        shown = {r["candidate_id"] for r in fastest + rows[-HISTORY_RECENT:]}
        return {
            "rows": [r for r in rows if r["candidate_id"] in shown], "candidates": len(rows),
            "omitted": len(rows) - len(shown), "best": self.best, "budget": self.budget, "budget_used": number,
        }

    # ---- evaluation -----------------------------------------------------------------------
    def cached(self, cid: str, upto: str) -> dict | None:
        """A result that answers (cid, upto): a pass at this stage or later, or a failure at or before it.
        A contended timing answers no timed stage: asking again times the candidate afresh."""
        want = STAGES.index(upto)
        for (rid, rupto), result in self.results.items():
            if rid != cid:
                continue
            untimed = _number(_timings(result).get("candidate_us")) is None  # a profile of a candidate timed before
            if (result.get("verdict") == "pass" and STAGES.index(rupto) >= want
                    and not (upto in TIMED and result.get("contended")) and not (upto == "benchmark" and untimed)):
                return result
            stage = result.get("stage")
            if result.get("verdict") == "fail" and (STAGES.index(stage) if stage in STAGES else 0) <= want:
                return result
        return None

    def evaluate(self, cid: str, upto: str, *, call: int = 0) -> dict:
        """Judge ``cid`` up to ``upto`` (or answer from the cache), waited for, and return the compact result."""
        result = self.cached(cid, upto)
        if result is not None:
            return self.compact(cid, upto, result, cached=True)
        path, extra = self._judge_args(cid, upto)
        return self.record(cid, upto, self.judge(path, upto, **extra), call=call)

    def _judge_args(self, cid: str, upto: str) -> tuple[Path, dict]:
        """(file, the judge's keywords) for a tool's evaluation of ``cid``: without the random-shape
        sweep when this very file passed it; beside the best when it is timed; never timing the
        baselines (the run timed them when it started: ``objective["baselines_us"]``); and a profile
        of a candidate with an uncontended timing already is not timed again (``timed_by``)."""
        passed = self.cached(cid, "correctness")  # a pass here means this very file passed the random shapes
        swept = passed is not None and passed.get("verdict") == "pass"
        timed = self.timed_result(cid) if upto == "profile" and self._takes_timing else None
        best = self.best
        incumbent = None
        if upto in TIMED and timed is None and best is not None and best["candidate_id"] != cid:
            incumbent = self.run_dir / "candidates" / f"{best['candidate_id']}.py"
        extra = self._keywords(sweep=not swept, incumbent=incumbent)
        if self._takes_baselines:
            extra["baselines"] = False
        if timed is not None:
            extra["timing"] = False
        return self.run_dir / "candidates" / f"{cid}.py", extra

    def timed_result(self, cid: str) -> dict | None:
        """A passing, uncontended result of ``cid`` with a timing (its benchmark), or None."""
        for (rid, _upto), result in self.results.items():
            if (rid == cid and result.get("verdict") == "pass" and not result.get("contended")
                    and _number(_timings(result).get("candidate_us")) is not None):
                return result
        return None

    def _keywords(self, *, sweep: bool = True, incumbent: Path | None = None) -> dict:
        extra: dict[str, Any] = {} if sweep or not self._can_skip_sweep else {"hypothesis": False}
        if self._takes_metric:
            extra["metric"] = self.metric
        if incumbent is not None and self._takes_incumbent and incumbent.is_file():
            extra["incumbent"] = str(incumbent.resolve())
        return extra

    def judge(self, path: Path, upto: str, *, sweep: bool = True, incumbent: Path | None = None, **extra: Any) -> dict:
        """The judge's result for one file, waited for (on a worker of the executor); a failure of the
        judge itself is a failed verdict.
        ``sweep=False``: the file passed the random-shape sweep before, so the judge leaves it out
        (its explicit cases still run on fresh inputs): ~40 % of a KDA benchmark call on the H200.
        ``incumbent``: the best's file, timed beside this one round by round (a judge that takes it).
        The objective's timer metric goes with every call (a judge that takes it)."""
        kwargs = {**self._keywords(sweep=sweep, incumbent=incumbent), **extra}
        future: Future = Future()
        try:
            future.set_result(self._evaluator(self.problem.name, str(Path(path).resolve()), upto=upto, timeout_s=self.eval_timeout, **kwargs))
        except Exception as exc:  # noqa: BLE001 - the judge's own failure, made a verdict by _judged
            future.set_exception(exc)
        return self._judged(future)

    @staticmethod
    def _judged(future: Future) -> dict:
        """A judge's result from its future: a failure of the judge itself (it raised, or gave no verdict)
        is a failed verdict at stage ``judge`` (not cached)."""
        try:
            result = future.result()
            if not isinstance(result, dict) or result.get("verdict") not in ("pass", "fail"):
                raise TypeError(f"the judge returned {type(result).__name__} without a pass/fail verdict")
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # the judge is a child-process boundary; its own failure is a verdict too
            result = {"verdict": "fail", "stage": "judge", "reasons": [f"the judge itself failed: {type(exc).__name__}: {exc}"]}
        return result

    def record(self, cid: str, upto: str, result: dict, *, call: int = 0, placement: dict | None = None, contended: bool = False) -> dict:
        """Keep a judge result (evals/ file, cache, ``verdict`` event, best) and return it compact.
        ``placement``: where it ran (several workers, or Ray); ``contended``: its timing shared a device."""
        if contended:
            result["contended"] = True
        judged = result.get("stage") != "judge"  # a judge failure is logged, not cached
        result_path = f"evals/{cid}-{upto}.json" if judged else None
        if judged:
            atomic_write(self.run_dir / result_path, dumps(result) + "\n")
            self.results[(cid, upto)] = result
        compact = self.compact(cid, upto, result, cached=False)
        optional = {k: compact[k] for k in ("figures", "metric", "incumbent", "incumbent_error", "contended") if compact.get(k) is not None}
        if isinstance(result.get("isolation"), dict):
            optional["isolation"] = result["isolation"]
        if placement is not None:
            optional["placement"] = placement
        with signals_deferred():  # a verdict and the best it makes (emit adds it) are logged together
            self.emit(
                ev.VERDICT, candidate_id=cid, upto=upto, verdict=result["verdict"], stage=result.get("stage"),
                reasons=compact["reasons"], candidate_us=compact.get("candidate_us"), speedup=compact.get("speedup"),
                vs_baseline=compact.get("vs_baseline"), errors=compact.get("errors", []), result_path=result_path, call=call,
                **optional,
            )
        return compact

    def note(self, text: str) -> dict:
        """An agent's note in the log (free)."""
        return self.emit(ev.NOTE, text=str(text))

    def retract(self, candidate_id: str, reason: str) -> dict | None:
        """Take a candidate out of the running for best (see the module docstring); returns the best after.
        Refused (ValueError) without a reason, for an unknown candidate or one with no passing timed verdict."""
        reason = str(reason or "").strip()
        if not reason:
            raise ValueError("a retraction needs a reason (what showed the candidate wrong)")
        try:
            cid = self.resolve(candidate_id)
        except KeyError as exc:
            raise ValueError(f"retract: {exc.args[0]}") from None
        if cid in self.retracted:
            raise ValueError(f"retract: {cid} is already retracted ({self.retracted[cid]})")
        if not any(k[0] == cid and r.get("verdict") == "pass" and _number(_timings(r).get("candidate_us"))
                   for k, r in self.results.items()):
            raise ValueError(f"retract: {cid} has no passing timed verdict, so it never could be best")
        was_best = bool(self.best and self.best["candidate_id"] == cid)
        with signals_deferred():  # the retraction and the best it leaves are logged together
            self.emit(ev.RETRACT, candidate_id=cid, reason=reason, was_best=was_best)  # the state rebuilds its best
            if was_best and self.best is not None:
                self.emit(ev.BEST, **self.best)
        return self.best

    @property
    def min_gain(self) -> float:
        return self.state.min_gain

    def compact(self, cid: str, upto: str, result: dict, *, cached: bool) -> dict:
        """What the agent sees of a judge result (the whole one is in evals/)."""
        out: dict[str, Any] = {
            "candidate_id": cid, "upto": upto, "verdict": result.get("verdict"), "stage": result.get("stage"),
            "reasons": [str(r)[:800] for r in (result.get("reasons") or [])[:6]], "cached": cached,
        }
        errors = result.get("errors") or []
        bad = [e for e in errors if isinstance(e, dict) and not e.get("ok", True)]
        if errors:
            out["errors"] = (bad or errors)[:6]
        timings = _timings(result)
        us = _number(timings.get("candidate_us"))
        if us is not None:
            out["candidate_us"] = us
            out["speedup"] = _number(result.get("speedup"))
            out["vs_baseline"] = self.baseline_us / us if self.baseline_us and us > 0 else None
            out["baselines_us"] = timings.get("baselines")
            run_baselines = self.objective.get("baselines_us") if isinstance(self.objective, dict) else None
            if not out["baselines_us"] and isinstance(run_baselines, dict) and run_baselines:
                # the baselines as the run timed them when it started (tool evaluations leave them out)
                out["baselines_us"] = run_baselines
                first = _number(next(iter(run_baselines.values())))
                out["speedup"] = first / us if first and us > 0 else None
            out["case"] = timings.get("case")
            out["metric"] = timings.get("metric") if timings.get("metric") else None
            if isinstance(timings.get("figures"), dict):
                out["figures"] = timings["figures"]
        elif upto == "profile" and result.get("verdict") == "pass" and (before := self.timed_result(cid)) is not None:
            # profiled without timing again: the timing it has (not a new one, so not logged as one)
            t = _timings(before)
            out["timed_before"] = {"upto": before.get("upto"), "candidate_us": _number(t.get("candidate_us")), "figures": t.get("figures")}
        if result.get("contended"):
            out["contended"] = True  # timed beside another evaluation on its device: indicative, never the best
        incumbent = result.get("incumbent")
        if isinstance(incumbent, dict) and isinstance(incumbent.get("ratio"), dict):
            out["incumbent"] = {"candidate_id": incumbent.get("candidate_id"), "ratio": incumbent["ratio"]}
        elif result.get("incumbent_error"):
            out["incumbent_error"] = str(result["incumbent_error"])[:300]
        if isinstance(result.get("roofline"), dict):
            out["roofline"] = result["roofline"]
        kernels = ((result.get("profile") or {}).get("kernels")) if isinstance(result.get("profile"), dict) else None
        if kernels:
            out["profile"] = sorted(kernels, key=lambda k: -(_number(k.get("us")) or 0))[:8]
        return out

    # ---- the run so far -------------------------------------------------------------------
    def history(self) -> list[dict]:
        """One compact row per candidate, in order of writing (free: no budget charged).

        ``verdict``/``stage``/``upto`` are those of its deepest evaluation; ``candidate_us`` is
        its fastest verified time, the same figure best-so-far is tracked by.
        """
        rows = []
        for cid, attempt in self.candidates.items():
            meta = attempt.meta
            row = {k: meta.get(k) for k in ("candidate_id", "parent", "strategy", "knobs")}
            row["notes"] = (meta.get("notes") or "")[:200]
            row.update(verdict=None, stage=None, upto=None, candidate_us=None, speedup=None, vs_baseline=None, reason="")
            for upto in STAGES:
                result = self.results.get((cid, upto))
                if result is None:
                    continue
                compact = self.compact(cid, upto, result, cached=True)
                row.update(verdict=compact["verdict"], stage=compact["stage"], upto=upto, reason=compact["reasons"][0][:300] if compact["reasons"] else "")
                us = compact.get("candidate_us")
                if compact["verdict"] == "pass" and us is not None and (row["candidate_us"] is None or us < row["candidate_us"]):
                    row.update({k: compact.get(k) for k in ("candidate_us", "speedup", "vs_baseline", "figures", "incumbent", "contended")})
            rows.append(row)
        return rows


@dataclass
class _Running:
    """A call whose evaluation runs on a worker."""

    number: int
    tool: str
    cid: str
    upto: str
    ticket: Ticket
    start: float


def _timed(result: dict) -> bool:
    """Whether a judge result carries a time (a contended flag means something only then)."""
    return _number(_timings(result).get("candidate_us")) is not None

