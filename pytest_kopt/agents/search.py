"""The embedded search agent: needs no network and no key, and learns from every verdict.

It renders concrete candidates from the problem's kernel families (``kernels/families``) and
picks the next (family, knobs) with Optuna's TPE sampler (seeded, ask/tell). The first attempt
is the baseline candidate, then every other family at its default knobs (its author's best
known configuration: on the H200 a random start-up trial is often several times slower), then
each family's TRY_EARLY settings (its author's unmeasured ideas), then
whatever the sampler proposes, except that a family DOMINATED times slower than the best is not
run again while other candidates are left, and a combination the family's REQUIRES refuses is told
the penalty without a tool call. Each proposal walks one pipeline::

    write_candidate -> run_tests -> (pass) benchmark -> [confirm] -> (pass, new best or within 5%) profile

(no profile on Triton's CPU interpreter, where it would only repeat the benchmark slowly). The
baseline candidate is not walked again: the loop timed it before handing over (call 0), and that
verdict is taken as its outcome at no cost (a log written before this rule, whose agent re-did
it, replays as it was written).

The sampler is told the headline time of a benchmarked candidate and a penalty for a candidate
that failed anywhere (a knob combination the kernel cannot serve teaches it too); a bad
candidate never stops the search. A proposal that renders to a candidate already tried is told
its known value at no cost and the sampler is asked again; after a few such repeats the next
untried combination is taken in order, and when none is left the agent says it is done.

Profiles are recorded in the log (for people and LLM agents); the sampler optimises the
headline time alone. The parent of a candidate is the incumbent best when it was proposed.

Batches (``--kopt-workers=N``): the agent walks up to N proposals at once, so up to N calls are in
flight. Optuna's ask/tell interface gives several trials before any is told, and the TPE sampler's
constant liar (``constant_liar=True``) makes the trials asked while others run differ from them.
Each ``act`` decides (``_fill``: finish what is done, tell the sampler, decide each idle proposal's
next step, ask for new ones until N are in flight), issues what it decided (``Toolbox.submit``),
then takes in one result, in the order the log recorded them. A benchmark whose timing was
*contended* (it shared its device with another evaluation) and that would lead the search is
*confirmed*: benchmarked again, alone (nothing else is decided while it runs), because a contended
time never makes the run's best. With one worker this is the one pipeline, one call per ``act``.

Resume: every decision is a function of the seed and the results seen in the order seen, so
``restore`` replays the log through the same decision procedure, in the log's order: each of the
agent's ``tool_call`` events must be what it decides next, each ``tool_result`` is taken in as the
live agent took it (after the calls decided before it were issued). This rebuilds the sampler
exactly (the continued run proposes what the uninterrupted one would have; with several workers,
what it would have had the results landed as they did). If the log does not
match (another agent, seed or code version wrote it), the sampler is instead rebuilt from the
log's candidates and verdicts with ``add_trial``, and unfinished candidates are finished first.
Candidates rendered from an earlier version of a family file (edited between sessions) still
teach the sampler their outcome, but are not marked tried: their knobs may be measured again.
"""

from __future__ import annotations

import json
import os
import warnings
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from .. import events as ev
from ..events import dumps
from ..families import Family, FamilyError, load_family
from ..runstate import RunState
from ..tools import candidate_id
from .base import Agent

PENALTY = 1e30  # the sampler's value for a failed candidate: worse than any time
MAX_REPEATS = 20  # proposals of already-tried candidates before walking the space in order
MAX_REFUSED = 200  # proposals the family's REQUIRES refuses (no tool call each) before walking the space
PROFILE_WITHIN = 0.05  # profile a passing candidate within this fraction of the best time
# A family whose best time is this many times the overall best is not run again while others are
# left (the sampler is told its best time instead): on the H200 one timing of a naive prefill
# candidate costs minutes, and TPE kept proposing that family for its unexplored knobs.
DOMINATED = 10.0


@dataclass
class Proposal:
    """One candidate the sampler proposed, on its way through the pipeline (not a log record: that is
    ``runstate.Attempt``)."""

    source: str
    strategy: str
    knobs: dict | None
    trial: Any = None  # optuna trial (None: told with add_trial, or not told)
    params: dict | None = None
    parent: str | None = None
    results: dict[str, dict] = field(default_factory=dict)  # step -> result
    free: bool = False  # its results are the loop's own timing (call 0): nothing more to call for it
    waiting: bool = False  # a step of it is decided and not yet answered

    @property
    def cid(self) -> str:
        return candidate_id(self.source)


@dataclass(frozen=True)
class Action:
    tool: str
    args: dict
    step: str = ""  # the pipeline's step it is ("confirm" is a benchmark); default: the tool

    @property
    def name(self) -> str:
        return self.step or self.tool

    def candidate(self) -> str:
        return candidate_id(self.args["source"]) if self.tool == "write_candidate" else self.args["candidate_id"]


class SearchAgent(Agent):
    """TPE over (family, knobs) of the problem's families; one tool call per ``act``."""

    name = "search"

    def __init__(
        self, *, problem: Any, seed: int | None = 0, families: list[Family] | None = None,
        startup_trials: int = 5, profile: bool | None = None,
    ):
        self.problem = problem
        # profiles on Triton's CPU interpreter say nothing about a GPU and cost a whole evaluation
        self.profile = (os.environ.get("TRITON_INTERPRET", "0") != "1") if profile is None else bool(profile)
        self.seed = int(seed or 0)
        self.startup_trials = startup_trials
        self.load_notes: list[str] = []
        if families is None:
            families = []
            for name in getattr(problem, "families", ()) or ():
                try:
                    families.append(load_family(name))
                except FamilyError as exc:
                    self.load_notes.append(f"search: family {name} left out: {exc}")
        self.families = {f.name: f for f in families}
        baseline_path = Path(problem.baseline_candidate_path)
        self.baseline_source = baseline_path.read_text(encoding="utf-8")
        self.baseline_family = next((f for f in families if f.source == self.baseline_source), None)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.width = 1  # proposals walked at once: the run's workers (the log's, on restore)
        self._reset()

    # ---- state --------------------------------------------------------------------------
    def _reset(self) -> None:
        with warnings.catch_warnings():  # constant_liar is marked experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(seed=self.seed, n_startup_trials=self.startup_trials, constant_liar=True)
        self.study = optuna.create_study(direction="minimize", sampler=sampler)
        self.tried: dict[str, float] = {}  # candidate id -> value told to the sampler
        self.queue: list[Proposal] = []  # unfinished candidates to finish first (fallback restore)
        self.active: list[Proposal] = []  # proposals on their way through the pipeline, in order of proposal
        self.outbox: deque[tuple[Proposal, Action]] = deque()  # decided, not yet issued
        self.issued: dict[int, tuple[Proposal, Action]] = {}  # call number -> what it is, until its result is taken in
        self.unobserved: deque[tuple[int, dict]] = deque()  # results in the log the agent has not taken in yet (restore)
        self.exhausted = False  # every candidate of the space is tried or on its way
        self.setup: dict[str, dict[str, dict]] = {}  # candidate id -> tool results the loop's own timing stands for
        self.best: tuple[float, str] | None = None  # (us, id) among finished attempts
        self.family_best: dict[str, float] = {}  # family name -> its best passing time (us)
        self.baseline_done = False
        self.notes: list[str] = list(self.load_notes)
        defaults_first = [self.baseline_family] if self.baseline_family is not None else []
        defaults_first += [f for f in self.families.values() if f is not self.baseline_family]
        early = [(f, f.knobs) for f in defaults_first] + [(f, {**f.knobs, **t}) for f in defaults_first for t in f.try_early]
        for family, knobs in early:
            params = self._params(family, knobs)
            if params is not None and family.refusal(knobs) is None:
                self.study.enqueue_trial(params)

    def _distributions(self, family: Family) -> dict:
        dists = {"family": optuna.distributions.CategoricalDistribution(list(self.families))}
        for knob, choices in family.space.items():
            dists[f"{family.name}.{knob}"] = optuna.distributions.CategoricalDistribution(list(range(len(choices))))
        return dists

    def _params(self, family: Family, knobs: dict) -> dict | None:
        """Sampler parameters for these knobs, or None when a value is outside the space."""
        params: dict[str, Any] = {"family": family.name}
        for knob, choices in family.space.items():
            if knobs.get(knob) not in choices:
                return None
            params[f"{family.name}.{knob}"] = choices.index(knobs[knob])
        return params

    # ---- deciding ---------------------------------------------------------------------------
    def _attempt(self, family: Family, knobs: dict, trial: Any, params: dict | None) -> Proposal:
        parent = self.best[1] if self.best else None
        return Proposal(family.render(knobs), family.name, knobs, trial, params, parent)

    def _propose(self) -> Proposal | None:
        """The next untried candidate, or None when the whole space has been tried."""
        if self.queue:
            return self.queue.pop(0)
        if not self.baseline_done:
            self.baseline_done = True
            if self.baseline_family is None or self._params(self.baseline_family, self.baseline_family.knobs) is None:
                return Proposal(self.baseline_source, "baseline", None)
        if not self.families:
            return None
        repeats = refused = 0
        while repeats < MAX_REPEATS and refused < MAX_REFUSED:
            trial = self.study.ask()
            family = self.families[trial.suggest_categorical("family", list(self.families))]
            knobs = {k: choices[trial.suggest_categorical(f"{family.name}.{k}", list(range(len(choices))))] for k, choices in family.space.items()}
            if family.refusal(knobs):  # the family declares it refused: a penalty, no tool call
                self.study.tell(trial, PENALTY)
                refused += 1
                continue
            attempt = self._attempt(family, {**family.knobs, **knobs}, trial, trial.params)
            if attempt.cid in self.tried:
                self.study.tell(trial, self.tried[attempt.cid])
                repeats += 1
            elif attempt.cid in self._walking():  # on its way already: its value is not known yet
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                repeats += 1
            elif self._dominated(family.name):
                self.study.tell(trial, self.family_best[family.name])
                repeats += 1
            else:
                return attempt
        # the sampler keeps repeating itself: walk the space, dominated families last
        for family in sorted(self.families.values(), key=lambda f: self._dominated(f.name)):
            for knobs in family.combinations():
                if family.refusal(knobs) is None and candidate_id(family.render(knobs)) not in set(self.tried) | self._walking():
                    self.study.enqueue_trial(self._params(family, knobs))  # combinations lie in the space
                    trial = self.study.ask(self._distributions(family))
                    return self._attempt(family, knobs, trial, trial.params)
        return None

    def _walking(self) -> set[str]:
        return {a.cid for a in self.active}

    def _dominated(self, family: str) -> bool:
        """Whether this family's best is DOMINATED times slower than the best of any family."""
        mine = self.family_best.get(family)
        return mine is not None and self.best is not None and mine > DOMINATED * self.best[0]

    def _next_step(self, attempt: Proposal) -> str | None:
        r = attempt.results
        if "write_candidate" not in r:
            return "write_candidate"
        if "run_tests" not in r:
            return "run_tests"
        if r["run_tests"].get("verdict") != "pass":
            return None
        if "benchmark" not in r:
            return "benchmark"
        us = r["benchmark"].get("candidate_us")
        if r["benchmark"].get("verdict") != "pass" or us is None:
            return None
        if r["benchmark"].get("contended") and "confirm" not in r and (self.best is None or us < self.best[0]):
            return "confirm"  # it would lead, but a contended time never makes the best: time it alone
        timing = _timing(attempt)
        us = timing.get("candidate_us") if timing.get("verdict") == "pass" else None
        if us is None:
            return None
        if self.profile and not attempt.free and "profile" not in r and (self.best is None or us <= self.best[0] * (1 + PROFILE_WITHIN)):
            return "profile"
        return None

    def _finish(self, attempt: Proposal) -> None:
        bench = _timing(attempt)
        us = bench.get("candidate_us") if bench.get("verdict") == "pass" else None
        value = float(us) if us is not None else PENALTY
        if attempt.trial is not None:
            self.study.tell(attempt.trial, value)
        elif attempt.params is not None:
            family = self.families[attempt.strategy]
            self.study.add_trial(optuna.trial.create_trial(params=attempt.params, distributions=self._distributions(family), value=value))
        self.tried[attempt.cid] = value
        if us is not None and attempt.strategy in self.families:
            self.family_best[attempt.strategy] = min(float(us), self.family_best.get(attempt.strategy, float("inf")))
        if us is not None and not bench.get("contended") and (self.best is None or us < self.best[0]):
            self.best = (float(us), attempt.cid)

    def _new_proposal(self) -> Proposal | None:
        """The next proposal, with the loop's own timing as its outcome where there is one; None once the
        whole space is tried or on its way (then for good)."""
        if self.exhausted:
            return None
        proposal = self._propose()
        if proposal is None:
            self.exhausted = True
            return None
        known = self.setup.get(proposal.cid)
        if known:  # the loop timed it already: its verdict is this proposal's outcome
            proposal.results.update(known)
            proposal.free = True
        return proposal

    def _action(self, a: Proposal, step: str) -> Action:
        if step == "write_candidate":
            knobs_text = ", ".join(f"{k}={v}" for k, v in (a.knobs or {}).items())
            notes = f"{a.strategy}({knobs_text})" + (" [baseline]" if a.source == self.baseline_source else "")
            return Action("write_candidate", {"source": a.source, "notes": notes, "parent": a.parent, "strategy": a.strategy, "knobs": a.knobs})
        if step == "confirm":
            return Action("benchmark", {"candidate_id": a.cid}, "confirm")
        return Action(step, {"candidate_id": a.cid})

    def _confirming(self) -> bool:
        return any(action.name == "confirm" for _, action in [*self.issued.values(), *self.outbox])

    def _fill(self) -> None:
        """Decide until ``width`` steps are in flight or decided (see the module docstring): finish what is
        done (telling the sampler), decide each idle proposal's next step in order, propose new ones. A
        confirmation is decided only when nothing else is in flight, and nothing beside it."""
        while not self._confirming():
            busy = len(self.issued) + len(self.outbox)
            if busy >= self.width:
                return
            for a in self.active:
                if a.waiting:
                    continue
                step = self._next_step(a)
                if step is None:
                    self._finish(a)
                    self.active.remove(a)
                elif step == "confirm" and busy:
                    return  # when what runs now has landed
                else:
                    a.waiting = True
                    self.outbox.append((a, self._action(a, step)))
                break
            else:  # every proposal waits for a result: a new one
                proposal = self._new_proposal()
                if proposal is None:
                    return
                self.active.append(proposal)

    def next_action(self) -> Action | None:
        """What to call next (None: the space is exhausted), one call at a time: decided, then issued."""
        self._fill()
        if not self.outbox:
            return None
        proposal, action = self.outbox.popleft()
        self.issued[0] = (proposal, action)
        return action

    def observe(self, action: Action, result: dict) -> None:
        """Take in the result of the action ``next_action`` gave."""
        self._take_in(0, result)

    def _take_in(self, number: int, result: Any) -> None:
        """Take in a tool result (as the log holds it, so a replay sees exactly the same)."""
        result = json.loads(dumps(result if isinstance(result, dict) else {"error": repr(result)}))
        if number not in self.issued:
            return
        a, action = self.issued.pop(number)
        a.waiting = False
        if result.get("error"):
            result = {"verdict": "fail", "reasons": [result["error"]]}
        a.results[action.name] = result
        if action.tool == "write_candidate" and result.get("verdict") == "fail":
            a.results["run_tests"] = result  # never stored: finish it as failed

    # ---- the Agent interface ----------------------------------------------------------------
    def act(self, tools: Any) -> bool:
        """Decide, issue what was decided, take in one result (see the module docstring)."""
        for text in self.notes:
            tools.log.append(ev.NOTE, text=text)
        self.notes = []
        self.width = max(1, int(getattr(tools, "workers", 1)))
        self._fill()
        while self.outbox:
            proposal, action = self.outbox[0]
            number = tools.submit(action.tool, **action.args)  # BudgetExhausted ends the run: the rest stays decided
            self.outbox.popleft()
            self.issued[number] = (proposal, action)
        if self.unobserved:
            self._take_in(*self.unobserved.popleft())
            return True
        if not self.issued:
            tools.log.append(ev.NOTE, text=f"search: all {sum(f.size() for f in self.families.values())} candidates of {', '.join(self.families) or 'no family'} tried; stopping")
            return False
        got = tools.next_result()
        if got is None:  # nothing in flight after all (cannot happen with the loop's toolbox): decide afresh
            for proposal, _ in self.issued.values():
                proposal.waiting = False
            self.issued.clear()
            return True
        self._take_in(got[0], got[2])
        return True

    def restore(self, events: list[dict]) -> None:
        """Replay the log through the decision procedure, in the log's order (see the module doc)."""
        state = RunState.fold(events)
        self._reset()
        self.setup = _setup_results(state, state.completed_calls())
        try:
            self._replay(events, state)
        except _Mismatch:
            self._rebuild(state)
        self._forget_retracted(state)

    def _replay(self, events: list[dict], state: RunState) -> None:
        """As ``act`` did: before each of its calls the agent decided (``_fill``), and it took in one result
        after issuing all it had decided; results of the log it had not taken in wait in ``unobserved``."""
        results: deque[tuple[int, dict]] = deque()
        for event in events:
            kind = event.get("kind")
            if kind in ev.SESSION_STARTS:
                self.width = max(1, int(event.get("workers") or 1))
            elif kind == ev.TOOL_CALL and not event.get("redo"):
                self._fill()
                if not self.outbox:
                    raise _Mismatch
                proposal, action = self.outbox.popleft()
                if action.tool != event.get("tool") or action.candidate() != (event.get("args") or {}).get("candidate_id"):
                    raise _Mismatch
                self.issued[int(event["call"])] = (proposal, action)
            elif kind == ev.TOOL_RESULT and event.get("call") in self.issued:
                results.append((int(event["call"]), event.get("result") or {}))
            elif kind == ev.NOTE and event.get("abandoned") in self.issued:  # given up on resume: decided again
                proposal, _ = self.issued.pop(event["abandoned"])
                proposal.waiting = False
            while results and not self.outbox:  # act: everything decided was issued, then one result taken in
                self._take_in(*results.popleft())
                self._fill()
        self.unobserved = results
        for number in [n for n in self.issued if n not in state.pending and n not in state.answered]:
            proposal, _ = self.issued.pop(number)  # a call of the log that will get no result: decided again
            proposal.waiting = False

    def _forget_retracted(self, state: RunState) -> None:
        """A retracted candidate (the toolbox's ``retract``) is no yardstick: the best to beat and to profile
        near is the fastest of the others."""
        retracted = set(state.retracted)
        if self.best is not None and self.best[1] in retracted:
            rest = [(us, cid) for cid, us in self.tried.items() if cid not in retracted and us < PENALTY]
            self.best = min(rest) if rest else None

    def _rebuild(self, state: RunState) -> None:
        """Fallback restore: the sampler learns every finished candidate; unfinished ones queue."""
        setup = self.setup
        self._reset()
        self.setup = setup
        self.baseline_done = True
        self.notes.append("search: the log was not written by this agent's decision procedure; sampler rebuilt from its candidates and verdicts")
        results: dict[str, dict[str, dict]] = {cid: dict(known) for cid, known in setup.items()}
        for tool, args, result in state.completed_calls():
            if tool in ("write_candidate", "run_tests", "benchmark", "profile") and args.get("candidate_id"):
                results.setdefault(args["candidate_id"], {})[tool] = json.loads(dumps(result))
        stale = 0
        for cid, written in state.candidates.items():
            family = self.families.get(written.strategy or "")
            knobs = written.knobs
            if family is None or not isinstance(knobs, dict):
                continue
            try:
                attempt = self._attempt(family, {**family.knobs, **knobs}, None, self._params(family, {**family.knobs, **knobs}))
            except FamilyError:  # a knob the edited family file no longer has
                stale += self._learn_stale(family, knobs, results.get(cid, {}))
                continue
            if attempt.cid != cid:  # the family file changed since
                stale += self._learn_stale(family, knobs, results.get(cid, {}))
                continue
            attempt.results = results.get(cid, {})
            attempt.free = cid in setup and set(attempt.results) <= set(setup[cid])
            if "write_candidate" not in attempt.results:
                attempt.results["write_candidate"] = {"candidate_id": cid}
            if self._next_step(attempt) is None:
                self._finish(attempt)
            else:
                self.tried[cid] = PENALTY  # never proposed again; finished from the queue
                self.queue.append(attempt)
        if stale:
            self.notes.append(f"search: {stale} candidates rendered from an earlier version of their family file taught "
                              "the sampler their outcome; the same knobs may be measured again under the edited file")

    def _learn_stale(self, family: Family, knobs: dict, results: dict[str, dict]) -> int:
        """Tell the sampler how a candidate of an earlier version of this family did (1 if told).

        Its id no longer matches a render of the edited file, so it is not marked tried and its time
        does not count as the best (the code it timed is gone); but which knob regions were fast,
        slow or refused survives most edits, and without it every edit of a family file would send
        the sampler back to random start-up trials."""
        params = self._params(family, {**family.knobs, **{k: v for k, v in knobs.items() if k in family.space}})
        if params is None:  # a value the edited SPACE no longer holds
            return 0
        bench, tests = results.get("benchmark") or {}, results.get("run_tests") or {}
        if bench.get("verdict") == "pass" and bench.get("candidate_us") is not None:
            value = float(bench["candidate_us"])
        elif "fail" in (bench.get("verdict"), tests.get("verdict")):
            value = PENALTY
        else:  # never finished: nothing to learn
            return 0
        self.study.add_trial(optuna.trial.create_trial(params=params, distributions=self._distributions(family), value=value))
        return 1


class _Mismatch(Exception):
    """The log is not what this agent's decision procedure would have written."""


def _timing(attempt: Proposal) -> dict:
    """The benchmark a proposal is judged by: its confirmation when that passed, else its benchmark."""
    confirm = attempt.results.get("confirm") or {}
    if confirm.get("verdict") == "pass" and confirm.get("candidate_us") is not None:
        return confirm
    return attempt.results.get("benchmark") or {}


def completed_calls(events: list[dict]) -> list[tuple[str, dict, dict]]:
    """(tool, logged args, result) of every call that has a result, in call order."""
    return RunState.fold(events).completed_calls()


def _setup_results(state: RunState, calls: list[tuple[str, dict, dict]]) -> dict[str, dict[str, dict]]:
    """The tool results the loop's own timing of the baseline candidate (call 0) stands for, by candidate id;
    none for a log whose agent walked the baseline itself (written before this rule)."""
    walked = {args.get("candidate_id") for _, args, _ in calls}
    known: dict[str, dict[str, dict]] = {}
    for cid, verdict in state.setup_verdicts().items():
        if cid in walked:
            continue
        outcome = {k: verdict.get(k) for k in ("verdict", "stage", "reasons")}
        results = {"write_candidate": {"candidate_id": cid, "new": False}, "run_tests": outcome}
        if verdict.get("verdict") == "pass":
            results["benchmark"] = {**outcome, "candidate_us": verdict.get("candidate_us")}
        known[cid] = results
    return known
