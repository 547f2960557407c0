"""What happened in one run, as a report needs it: the log's fold (``runstate``) plus the judge's
result JSON for the best candidate's full figures.

The log (``RUN_DIR/events.jsonl``) is the truth, so this module only reads it. It tolerates logs
from runs that crashed or are still going, and events missing optional fields: a report of half
a run is still worth reading.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import judge
from .runstate import OLD_METRIC, Attempt, RunState, number


_OWN_FILE = re.compile(r"^[0-9a-f]{12}\.py(?: line \d+)?:\s*")
STAGES = (*judge.STAGES, "judge")  # "judge": the judge itself failed


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
    metric: str = OLD_METRIC  # the objective's timer metric (eager, device or graph)
    candidates: dict[str, Attempt] = field(default_factory=dict)
    # (call, best speedup, candidate id); speedups are over the run's baseline candidate, the
    # objective's baseline_us, when the log has them (vs_baseline), else the judge's first baseline
    progress: list[tuple[int, float, str]] = field(default_factory=list)
    best_id: str | None = None
    best_us: float | None = None
    best_speedup: float | None = None
    best_ratios: dict[str, dict] = field(default_factory=dict)  # id of a best -> how it beat the one before it (median, lo, hi, incumbent)
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
    state = RunState.from_log(run_dir / "events.jsonl")
    best = state.best or {}
    summary = RunSummary(
        run_dir=run_dir, run_id=state.run_id or run_dir.name, problem=state.problem, agent=state.agent, seed=state.seed,
        objective=state.objective, environment=state.environment, budget=state.budget,
        budget_used=max(state.budget_used, state.ended_budget_used), status=state.status, status_reason=state.status_reason,
        running_s=state.running_s, resumes=state.resumes, metric=state.metric, candidates=state.candidates,
        progress=list(state.progress), best_id=best.get("candidate_id"), best_us=number(best.get("candidate_us")),
        best_speedup=number(best.get("vs_baseline")) if number(best.get("vs_baseline")) is not None else number(best.get("speedup")),
        best_ratios=dict(state.best_ratios),
        baseline_us=state.baseline_us, tool_seconds=state.tool_seconds, retracted=dict(state.retracted),
    )
    if summary.baseline_us is None:  # speedup = baseline_us / candidate_us, for a log whose objective lacks it
        for attempt in sorted(state.candidates.values(), key=lambda a: a.judged_at or 0):
            if attempt.candidate_us is not None and attempt.speedup is not None:
                summary.baseline_us = attempt.candidate_us * attempt.speedup
                break
    summary.best_result = _load_best_result(summary)
    return summary


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
