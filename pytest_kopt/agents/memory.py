"""Print a run's compacted memory: what an LLM agent keeps when its conversation is compacted.

A day of attempts does not fit in a context window, so the LLM agent periodically replaces its
conversation with this memory. It is built from the event log alone (deterministic: the same
log gives the same text), so a resumed run, or ``kopt memory RUN_DIR``, gets exactly what the
agent had. Sections: the best candidate and its source, a table of strategies tried and what
each gave, what the profiler said, the failures and why, and the open leads.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from .. import runstore
from .. import events as ev
from ..events import read_events
from ..runstate import Attempt, RunState

MAX_TABLE_ROWS = 40  # attempts listed one per row; older, unremarkable ones are only counted
MAX_FAILURES = 8  # distinct failure reasons kept
MAX_LEADS = 8
NOTE_CHARS = 110
REASON_CHARS = 220
LAST_RESULTS = 3  # tool results quoted verbatim (trimmed) at the end
RESULT_CHARS = 1500


@dataclass
class RunDigest:
    """The facts the memory is written from: the log's fold, plus what the profiler said."""

    state: RunState
    run_dir: Path | None = None
    profiles: dict[str, list[dict]] = field(default_factory=dict)  # candidate id -> kernels

    @property
    def attempts(self) -> dict[str, Attempt]:
        return self.state.candidates

    @property
    def best(self) -> dict | None:
        return self.state.best

    @property
    def notes(self) -> list[str]:
        return self.state.replies


def _short(text: Any, limit: int) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _fmt_us(us: Any) -> str:
    return f"{us:.1f} us" if isinstance(us, (int, float)) else "?"


def _fmt_speedup(ev: dict) -> str:
    """Against the run's baseline candidate when known, else the judge's first baseline."""
    for key, label in (("vs_baseline", "the baseline candidate"), ("speedup", "the judge's baseline")):
        x = ev.get(key)
        if isinstance(x, (int, float)):
            return f"{x:.2f}x vs {label}"
    return "speedup unknown"


def _read_json(path: str | Path | None, run_dir: Path | None) -> dict | None:
    if not path:
        return None
    p = Path(path)
    if not p.is_absolute() and run_dir is not None:
        p = run_dir / p
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def _profile_kernels(obj: Any) -> list[dict] | None:
    """Find ``[{name, us, calls}]`` in a judge result or a compact tool result."""
    if not isinstance(obj, dict):
        return None
    prof = obj.get("profile")
    if isinstance(prof, dict) and isinstance(prof.get("kernels"), list):
        return prof["kernels"]
    if isinstance(obj.get("kernels"), list):
        return obj["kernels"]
    return None


def digest(events: Iterable[dict], run_dir: Path | None = None) -> RunDigest:
    """Fold a run's events once and gather what its profiles said."""
    d = RunDigest(RunState.fold(events), run_dir)
    for cid, attempt in d.attempts.items():  # the judge's full results of profiled candidates
        verdict = d.state.results.get((cid, "profile"))
        kernels = _profile_kernels(_read_json(verdict.get("result_path"), run_dir)) if verdict and attempt.profiled else None
        if kernels:
            d.profiles[cid] = kernels
    for tool, args, result in d.state.completed_calls():  # else what the profile tool answered
        kernels = _profile_kernels(result) if tool == "profile" else None
        cid = args.get("candidate_id") or (result.get("candidate_id") if isinstance(result, dict) else None)
        if kernels and cid:
            d.profiles.setdefault(cid, kernels)
    return d


def _outcome(att: Attempt, attempts: dict[str, Attempt]) -> str:
    if att.failure is not None and (att.timing is None or att.failure.get("seq", 0) > att.timing.get("seq", 0)):
        reasons = att.failure.get("reasons") or []
        return f"FAILED at {att.failure.get('stage', '?')}: {_short(reasons[0] if reasons else 'no reason given', REASON_CHARS)}"
    if att.timing is not None:
        text = f"{_fmt_us(att.candidate_us)}, {_fmt_speedup(att.fastest or {})}"
        parent = attempts.get(att.parent or "")
        if parent is not None and parent.candidate_us and att.candidate_us:
            text += ", faster than parent" if att.candidate_us < parent.candidate_us else ", slower than parent"
        if att.was_best:
            text += ", new best"
        return text
    if att.tests is not None:
        return "correct, not benchmarked"
    return "written, never tested"


def _strategy(att: Attempt) -> str:
    if att.strategy and att.strategy != "llm":
        knobs = json.dumps(att.knobs, sort_keys=True) if att.knobs else ""
        return _short(f"{att.strategy} {knobs}".strip(), NOTE_CHARS)
    return _short(att.notes or "(no notes)", NOTE_CHARS)


def _table(d: RunDigest) -> list[str]:
    attempts = sorted(d.attempts.values(), key=lambda a: a.order)
    best_id = (d.best or {}).get("candidate_id")
    keep = {a.candidate_id for a in attempts if a.was_best or a.candidate_id == best_id}
    for a in reversed(attempts):
        if len(keep) >= MAX_TABLE_ROWS:
            break
        keep.add(a.candidate_id)
    lines = ["| # | id | parent | strategy / notes | outcome |", "| --- | --- | --- | --- | --- |"]
    omitted = {"failed": 0, "timed": 0, "untimed": 0}
    for a in attempts:
        if a.candidate_id not in keep:
            key = "failed" if a.failure and not a.timing else "timed" if a.timing else "untimed"
            omitted[key] += 1
            continue
        outcome = _outcome(a, d.attempts).replace("|", "/")
        lines.append(f"| {a.order + 1} | {a.candidate_id} | {a.parent or '-'} | {_strategy(a).replace('|', '/')} | {outcome} |")
    if any(omitted.values()):
        lines.append(
            f"({sum(omitted.values())} older attempts not listed: {omitted['failed']} failed, "
            f"{omitted['timed']} timed but never best, {omitted['untimed']} not timed)"
        )
    return lines


def _profile_lines(d: RunDigest) -> list[str]:
    best_id = (d.best or {}).get("candidate_id")
    order = {a.candidate_id: a.order for a in d.attempts.values()}
    ids = sorted(d.profiles, key=lambda c: (c != best_id, -order.get(c, -1)))[:3]
    lines = []
    for cid in ids:
        kernels = sorted(d.profiles[cid], key=lambda k: -(k.get("us") or 0))
        total = sum(k.get("us") or 0 for k in kernels) or 1.0
        parts = [f"{k.get('name', '?')} {_fmt_us(k.get('us'))} ({100 * (k.get('us') or 0) / total:.0f}%, {k.get('calls', '?')} calls)" for k in kernels[:5]]
        label = "best " if cid == best_id else ""
        lines.append(f"- {label}{cid}: " + "; ".join(parts))
    return lines


def _failure_lines(d: RunDigest) -> list[str]:
    seen: dict[str, list[str]] = {}
    for a in sorted(d.attempts.values(), key=lambda a: -a.order):
        if a.failure is None:
            continue
        reasons = a.failure.get("reasons") or ["no reason given"]
        key = f"{a.failure.get('stage', '?')}: {_short(reasons[0], REASON_CHARS)}"
        seen.setdefault(key, []).append(a.candidate_id)
    lines = []
    for key, ids in list(seen.items())[:MAX_FAILURES]:
        lines.append(f"- {key} ({', '.join(ids[:4])}{', …' if len(ids) > 4 else ''})")
    return lines


def _lead_lines(d: RunDigest) -> list[str]:
    leads = []
    attempts = sorted(d.attempts.values(), key=lambda a: -a.order)
    for a in attempts:
        if a.tests is not None and a.timing is None and a.failure is None:
            leads.append(f"- {a.candidate_id} passed the tests but was never benchmarked ({_strategy(a)})")
    best_id = (d.best or {}).get("candidate_id")
    if best_id and best_id not in d.profiles:
        leads.append(f"- the best candidate {best_id} has not been profiled yet")
    for a in attempts:
        if a.failure is not None and a.failure.get("stage") == "correctness" and a.timing is None:
            errs = [e for e in a.failure.get("errors") or [] if isinstance(e, dict) and not e.get("ok", True)]
            if errs:
                leads.append(f"- {a.candidate_id} was close but wrong ({_strategy(a)}): fix it or drop the idea")
                break
    for text in reversed(d.notes[-3:]):
        leads.append(f"- last plan: {_short(text, 300)}")
    return leads[:MAX_LEADS]


def _last_results(state: RunState, n: int = LAST_RESULTS) -> list[str]:
    """The last few tool calls and what they returned: where the conversation left off."""
    results = sorted(state.answered.values(), key=lambda e: e.get("seq", 0))[-n:]
    lines = []
    for ev in results:
        args = (state.calls.get(ev.get("call")) or {}).get("args") or {}
        shown = ", ".join(f"{k}={json.dumps(v)[:60]}" for k, v in sorted(args.items()) if v not in (None, ""))
        result = json.dumps(ev.get("result"), sort_keys=True, ensure_ascii=False)
        if len(result) > RESULT_CHARS:
            result = result[:RESULT_CHARS] + f"… [{len(result) - RESULT_CHARS} characters trimmed]"
        lines.append(f"- call {ev.get('call')}: {ev.get('tool')}({shown}) -> {result}")
    return lines


def best_source(d: RunDigest, run_dir: Path | None) -> str | None:
    best_id = (d.best or {}).get("candidate_id")
    if not best_id:
        return None
    candidates = [run_dir / "candidates" / f"{best_id}.py"] if run_dir else []
    att = d.attempts.get(best_id)
    if att and att.path:
        p = Path(att.path)
        candidates.append(p if p.is_absolute() or run_dir is None else run_dir / p)
        candidates.append(p)
    for p in candidates:
        try:
            return p.read_text()
        except OSError:
            continue
    return None


def build_memory(events: Iterable[dict], run_dir: str | Path | None = None) -> str:
    """The compact memory of a run, as Markdown text, from its events alone."""
    run_dir = Path(run_dir) if run_dir is not None else None
    d = digest(events, run_dir)
    state = d.state
    budget = f" of {state.budget}" if state.budget else ""
    out = [f"# Memory of run {state.run_id or '?'} ({state.problem or '?'}), after {state.budget_used}{budget} tool calls", ""]
    out.append("This replaces the earlier conversation. Everything below comes from the run's log.")
    out.append("")
    out.append("## Best so far")
    if d.best:
        b = d.best
        att = d.attempts.get(b.get("candidate_id"))
        out.append(f"{b.get('candidate_id')}: {_fmt_us(b.get('candidate_us'))}, {_fmt_speedup(b)}" + (f" — {_strategy(att)}" if att else ""))
        src = best_source(d, run_dir)
        if src is not None:
            out += ["", "```python", src.rstrip(), "```"]
    else:
        out.append("No verified, timed candidate yet.")
    out += ["", f"## Strategies tried ({len(d.attempts)} candidates)"]
    out += _table(d) if d.attempts else ["None yet."]
    out += ["", "## What the profiler said"]
    out += _profile_lines(d) or ["Nothing profiled yet."]
    out += ["", "## Failures and why"]
    out += _failure_lines(d) or ["None."]
    out += ["", "## Open leads"]
    out += _lead_lines(d) or ["None recorded: pick the largest kernel in the profile of the best and attack it."]
    last = _last_results(state)
    if last:
        out += ["", "## Last tool results"] + last
    return "\n".join(out) + "\n"


def last_compaction(events: Iterable[dict]) -> dict | None:
    """The most recent ``compaction`` event, if any."""
    last = None
    for event in events:
        if event.get("kind") == ev.COMPACTION:
            last = event
    return last


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a run: its directory, its events.jsonl or its packed file (results/runs/<id>.tar.xz)")
    parser.add_argument("--recorded", action="store_true", help="print the last compaction recorded in the log instead of building it now")


def run(args: argparse.Namespace) -> int:
    with runstore.readable(args.run_dir) as path:  # a packed run is read unpacked to a temporary dir
        return _print_memory(args, path)


def _print_memory(args: argparse.Namespace, path: Path) -> int:
    run_dir, log = (path.parent, path) if path.suffix == ".jsonl" else (path, path / "events.jsonl")
    if not log.exists():
        print(f"kopt memory: no event log at {args.run_dir}", file=sys.stderr)
        return 2
    events = read_events(log)
    if args.recorded:
        ev = last_compaction(events)
        if ev is None:
            print(f"kopt memory: the run in {args.run_dir} has not been compacted yet", file=sys.stderr)
            return 1
        sys.stdout.write(str(ev.get("memory", "")))
        return 0
    sys.stdout.write(build_memory(events, run_dir))
    return 0
