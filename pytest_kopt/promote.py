"""Promotion: a run's best replaces ``kernels/best/<problem>.py`` only when it is faster there.

``--kopt-promote`` (= ``check``) times the run's best and the promoted kernel side by side on
this machine, interleaved round by round (``evaluate(best, incumbent=<promoted file>)``), and
replaces the promoted kernel only when the lower end of the interval of promoted time / best time
clears ``1 + min_gain`` (the run's objective's). It refuses, saying why:

- when ``kernels/best/<problem>.json`` (the promoted kernel's provenance) names another kind of
  machine than this one, or than the one the run's best was timed on (a CPU run's "win" says
  nothing about an H200), or is missing (the machine is then unknown);
- when the judge cannot time the two side by side, the best fails it now, or the interval does
  not clear the bar.

``--kopt-promote=force`` skips the checks and the timing. Where there is no promoted kernel yet,
the best is promoted (nothing can be lost). A promotion writes the file and its provenance
(``<problem>.json``: run, candidate, family and knobs, commit, machine, metric, figures); the loop
logs what happened, or why not, as a ``promote`` event.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from .events import atomic_write, dumps
from .runstate import TIMER_METRICS, number

MODES = ("check", "force")


@dataclass
class Promotion:
    """What a promotion did: ``action`` is "promoted", "refused" or "unchanged"."""

    action: str
    reason: str
    candidate_id: str
    path: Path
    replaced: str | None = None  # the candidate id of the kernel it replaced (from its provenance)
    ratio: dict | None = None  # promoted time / best time, with its interval, when timed side by side
    result: dict | None = None  # the side-by-side evaluation
    record: dict | None = None  # the provenance written
    fields: dict = field(default_factory=dict)

    @property
    def promoted(self) -> bool:
        return self.action == "promoted"

    def event(self) -> dict:
        """The ``promote`` event's fields."""
        return {"action": self.action, "reason": self.reason, "candidate_id": self.candidate_id, "path": str(self.path),
                "replaced": self.replaced, "ratio": self.ratio, **self.fields}


def provenance_path(promote_dir: Path, problem: str) -> Path:
    return Path(promote_dir) / f"{problem}.json"


def read_provenance(path: Path) -> dict | None:
    """The promoted kernel's provenance, or None when there is none (or it cannot be read)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def promote(
    *, problem: str, mode: str, best: dict, best_path: Path, attempt: Any, run_shown: str, objective: dict,
    promote_dir: Path, machine: str, environment: dict, evaluate: Callable[..., dict] | None, timeout_s: float,
    recorded_result: dict | None = None,
) -> Promotion:
    """Promote the run's ``best`` (its file ``best_path``) to ``promote_dir/<problem>.py`` if it wins; see the module doc.

    ``attempt`` is the best's ``runstate.Attempt`` (family, knobs, the machine it was timed on);
    ``machine`` this machine's kind (GPU name or "cpu"); ``recorded_result`` the run's own judge result
    for the best (its figures, when nothing is timed here)."""
    if mode not in MODES:
        raise ValueError(f"--kopt-promote takes check or force, got {mode!r}")
    target = Path(promote_dir) / f"{problem}.py"
    cid = best["candidate_id"]
    source = Path(best_path).read_text(encoding="utf-8")
    current = target.read_text(encoding="utf-8") if target.is_file() else None
    provenance = read_provenance(provenance_path(promote_dir, problem))
    replaced = (provenance or {}).get("candidate_id")
    timed_on = getattr(attempt, "timed_on", None) or machine
    outcome = Promotion("refused", "", cid, target, replaced=replaced, fields={"mode": mode, "machine": machine, "timed_on": timed_on})
    if current == source:
        outcome.action, outcome.reason = "unchanged", f"{target.name} already holds {cid}"
        return outcome
    result = None
    if current is not None and mode == "check":
        recorded_on = ((provenance or {}).get("machine") or {}).get("gpu")
        if provenance is None:
            outcome.reason = (f"{provenance_path(promote_dir, problem)} is missing, so the machine {target.name} was measured on is "
                              "unknown; nothing replaced (--kopt-promote=force replaces it anyway)")
            return outcome
        if recorded_on != machine or timed_on != machine:
            where = "this machine" if recorded_on != machine else "the run's best"
            found = machine if recorded_on != machine else timed_on
            outcome.reason = (f"{target.name} was measured on {recorded_on!r}, {where} on {found!r}: a promotion needs both "
                              f"timed on the same kind of machine; nothing replaced (--kopt-promote=force replaces it anyway)")
            return outcome
        result, why = _side_by_side(problem, best_path, target, objective, evaluate, timeout_s)
        if why:
            outcome.reason, outcome.result = f"{why}; nothing replaced", result
            return outcome
        ratio = result["incumbent"]["ratio"]
        outcome.ratio, outcome.result = ratio, result
        bar = 1.0 + (number(objective.get("min_gain")) or 0.0)
        if not float(ratio["lo"]) > bar:
            outcome.reason = (f"{cid} is not faster than {replaced or target.name} beyond the noise here: "
                              f"{_ratio_text(ratio)}, the interval must clear {bar:.3g}; nothing replaced")
            return outcome
        outcome.reason = f"{cid} is faster than {replaced or target.name} timed side by side here: {_ratio_text(ratio)}"
    elif current is not None:
        outcome.reason = f"forced over {replaced or target.name} (no side-by-side timing)"
    else:
        outcome.reason = f"the first promoted {problem} kernel"
    outcome.record = _provenance(problem, cid, attempt, run_shown, objective, environment, timed_on if result is None else machine,
                                 result or recorded_result, best, outcome.reason)
    atomic_write(target, source)
    atomic_write(provenance_path(promote_dir, problem), json.dumps(json.loads(dumps(outcome.record)), indent=2) + "\n")
    outcome.action = "promoted"
    return outcome


def _side_by_side(problem: str, best_path: Path, target: Path, objective: dict, evaluate: Callable[..., dict] | None,
                  timeout_s: float) -> tuple[dict | None, str | None]:
    """(the judge's result, why it does not decide) of the best timed beside the promoted file."""
    from .tools import takes_keyword

    if evaluate is None:
        from .judge import evaluate
    if not takes_keyword(evaluate, "incumbent"):
        return None, "this judge cannot time two kernels side by side (no incumbent=)"
    extra = {"metric": objective["metric"]} if objective.get("metric") in TIMER_METRICS and takes_keyword(evaluate, "metric") else {}
    try:
        result = evaluate(problem, str(Path(best_path).resolve()), upto="benchmark", timeout_s=timeout_s,
                          incumbent=str(Path(target).resolve()), **extra)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:
        return None, f"the judge failed timing the two: {type(exc).__name__}: {exc}"
    if not isinstance(result, dict) or result.get("verdict") != "pass":
        reasons = "; ".join(map(str, (result or {}).get("reasons") or []))[:300] if isinstance(result, dict) else repr(result)
        return result, f"the run's best failed the judge here ({reasons})"
    incumbent = result.get("incumbent")
    ratio = incumbent.get("ratio") if isinstance(incumbent, dict) else None
    if not isinstance(ratio, dict) or number(ratio.get("lo")) is None:
        return result, f"the promoted kernel could not be timed beside it ({result.get('incumbent_error') or 'no ratio in the result'})"
    return result, None


def _ratio_text(ratio: dict) -> str:
    return (f"{float(ratio['median']):.3f}x (95 % interval {float(ratio['lo']):.3f}-{float(ratio['hi']):.3f}, "
            f"{ratio.get('rounds', '?')} rounds, {ratio.get('metric', '?')} time)") if number(ratio.get("median")) is not None else str(ratio)


def _provenance(problem: str, cid: str, attempt: Any, run_shown: str, objective: dict, environment: dict, gpu: str,
                result: dict | None, best: dict, note: str) -> dict:
    """``kernels/best/<problem>.json``, as docs/architecture.md pins it."""
    strategy = getattr(attempt, "strategy", None)
    timings = (result or {}).get("timings") if isinstance((result or {}).get("timings"), dict) else {}
    metric = timings.get("metric") or objective.get("metric")
    metric = metric if metric in TIMER_METRICS else "device"
    figures = timings.get("figures") if isinstance(timings.get("figures"), dict) else None
    if figures is None:
        figures = {name: None for name in TIMER_METRICS} | {metric: number(timings.get("candidate_us")) or number(best.get("candidate_us"))}
    commit = environment.get("commit")
    return {
        "problem": problem, "candidate_id": cid, "family": strategy if strategy not in (None, "llm", "baseline") else None,
        "knobs": getattr(attempt, "knobs", None), "run": run_shown, "commit": commit[:7] if isinstance(commit, str) else None,
        "machine": {"gpu": gpu, "torch": environment.get("torch"), "triton": environment.get("triton")},
        "metric": metric, "figures": figures, "promoted_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "note": note,
    }
