"""What a person watching a run sees: one line per tool call, a heartbeat, a summary table.

Lines are built from the events the toolbox logs (the same facts as the log, never more), and
handed to a ``write(line)`` callable: the pytest terminal reporter in ``loop_plugin``, print
elsewhere. While an evaluation runs, a heartbeat line every ``heartbeat_s`` shows the run is
alive (with several workers: every evaluation in flight). A timing marked contended (it shared its
device with another evaluation, so it never becomes the best) says so on its line.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from . import events as ev
from .runstate import TIMER_METRICS, metric_of, ratio_text, three_figures

EVALUATIONS = ("run_tests", "benchmark", "profile")


def fmt_us(us: Any) -> str:
    if not isinstance(us, (int, float)):
        return "-"
    if us >= 10_000:
        return f"{us / 1000:.2f} ms"
    return f"{us:.1f} us" if us >= 1 else f"{us * 1000:.1f} ns"


def fmt_x(x: Any) -> str:
    return f"{x:.2f}x" if isinstance(x, (int, float)) else "-"


def knobs_text(knobs: Any, limit: int = 48) -> str:
    if not isinstance(knobs, dict) or not knobs:
        return ""
    text = ",".join(f"{k}={v}" for k, v in knobs.items())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Progress:
    """Listener for ``Toolbox.listeners`` that writes one line per finished tool call."""

    def __init__(self, write: Callable[[str], None], toolbox: Any = None, heartbeat_s: float = 60.0):
        self.write = write
        self.tools = toolbox  # set by the loop once the toolbox exists
        self.heartbeat_s = heartbeat_s
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None
        self._started = 0.0
        self._running: dict[Any, str] = {}  # call number -> label, evaluations in flight

    def say(self, line: str) -> None:
        """Write one line (the heartbeat thread writes too: one line at a time)."""
        with self._lock:
            self.write(line)

    def __call__(self, event: dict) -> None:
        kind = event.get("kind")
        if kind == ev.TOOL_CALL:
            self._started = time.monotonic()
            if event.get("tool") in EVALUATIONS:
                args = event.get("args") or {}
                self._running[event.get("call")] = f"[{event.get('call')}/{self.tools.budget}] {event.get('tool')} {args.get('candidate_id', '')}"
                self.waiting(" + ".join(self._running.values()))
        elif kind == ev.TOOL_RESULT:
            self._quiet()
            self.say(self.line(event))
            if self._running.pop(event.get("call"), None) is not None and self._running:
                self.waiting(" + ".join(self._running.values()))
        elif kind == ev.NOTE:
            self.say(f"       note: {str(event.get('text', ''))[:200]}")

    def line(self, event: dict) -> str:
        """``[  n/budget] tool candidate strategy(knobs) verdict time vs-baseline | best``."""
        t = self.tools
        result = event.get("result") or {}
        cid = result.get("candidate_id") or ((event.get("args") or {}).get("candidate_id")) or ""
        attempt = t.candidates.get(cid) if isinstance(cid, str) else None
        label = f"{attempt.strategy or ''}({knobs_text(attempt.knobs)})" if attempt is not None else ""
        if result.get("error"):
            outcome = "error: " + str(result["error"])[:80]
        elif event.get("tool") in EVALUATIONS:
            outcome = f"{result.get('verdict', '?'):<4} {fmt_us(result.get('candidate_us')):>10} {fmt_x(result.get('vs_baseline')):>7}"
            ratio = ratio_text((result.get("incumbent") or {}).get("ratio"))
            if ratio:
                outcome += f" vs best {ratio}"
            if result.get("verdict") == "fail":
                outcome += f" [{result.get('stage')}] " + (str((result.get("reasons") or [""])[0])[:70])
            if result.get("cached"):
                outcome += " (cached)"
            if result.get("contended"):
                outcome += " (contended: not a best)"
        else:
            outcome = "new" if result.get("new") else ("" if event.get("tool") != "write_candidate" else "known")
        best = t.best
        best_text = f"best {best['candidate_id'][:8]} {fmt_us(best.get('candidate_us'))} {fmt_x(best.get('vs_baseline'))}" if best else "best -"
        width = len(str(t.budget))
        return (
            f"[{event.get('call', 0):>{width}}/{t.budget}] {event.get('tool', ''):<15} {cid[:12]:<12} {label:<32} "
            f"{outcome}  | {best_text}  ({event.get('duration_s', 0):.1f}s)"
        )

    def waiting(self, label: str) -> None:
        """Say every ``heartbeat_s`` that ``label`` is still running, until the next line."""
        self._quiet()
        self._started = time.monotonic()
        stop = self._stop = threading.Event()

        def run() -> None:
            while not stop.wait(self.heartbeat_s):
                self.say(f"       … {label} still running ({time.monotonic() - self._started:.0f}s)")

        threading.Thread(target=run, name="kopt-heartbeat", daemon=True).start()

    def done(self) -> None:
        self._quiet()

    def _quiet(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    def close(self) -> None:
        self._quiet()


def summary_lines(tools: Any, outcome: Any, top: int = 10) -> list[str]:
    """The final table: the run's state, the baseline, the best and the fastest verified candidates,
    with their eager / device / graph figures and, for a candidate timed beside the best of its
    day, the ratio of times with its 95 % interval."""
    from .run import resume_command

    rows = tools.history()
    timed = sorted((r for r in rows if r.get("verdict") == "pass" and isinstance(r.get("candidate_us"), (int, float))), key=lambda r: r["candidate_us"])
    failed = [r for r in rows if r.get("verdict") == "fail"]
    obj = tools.objective
    metric = metric_of(obj)
    lines = [
        f"kopt run {outcome.run_dir}: {outcome.status} ({outcome.reason}); {tools.budget_used}/{tools.budget} tool calls",
        f"problem {obj.get('problem')}  case {obj.get('case') or '-'}  metric {metric}  baseline {str(obj.get('baseline_candidate') or '-')[:12]} {fmt_us(obj.get('baseline_us'))}  floor {fmt_us(obj.get('floor_us'))}",
        f"candidates: {len(rows)} written, {len(timed)} verified and timed, {len(failed)} failed",
    ]
    if tools.best:
        b = tools.best
        line = f"best: {b['candidate_id']} {fmt_us(b.get('candidate_us'))} ({metric}), {fmt_x(b.get('vs_baseline'))} vs baseline candidate, {fmt_x(b.get('speedup'))} vs {', '.join((obj.get('baselines_us') or {}).keys()) or 'judge baseline'}"
        ratio = b.get("ratio") or {}
        if ratio_text(ratio):
            line += f"; beat {str(ratio.get('incumbent', ''))[:12]} by {ratio_text(ratio)} (95 % interval, timed side by side)"
        lines.append(line)
    else:
        lines.append("best: none verified")
    if timed:
        shown = timed[:top]
        figures = [three_figures(r.get("figures"), r.get("candidate_us"), metric) for r in shown]
        header = f"  {'#':>2}  {'candidate':<12}  {'strategy':<16}  " + "  ".join(f"{name + ('*' if name == metric else ''):>10}" for name in TIMER_METRICS)
        lines.append(header + f"  {'vs base':>7}  {'vs best then [95 %]':<24}  knobs")
        for i, (r, fig) in enumerate(zip(shown, figures), 1):
            ratio = ratio_text((r.get("incumbent") or {}).get("ratio"))
            lines.append(f"  {i:>2}  {r['candidate_id']:<12}  {str(r.get('strategy') or '-')[:16]:<16}  "
                         + "  ".join(f"{fmt_us(fig[name]):>10}" for name in TIMER_METRICS)
                         + f"  {fmt_x(r.get('vs_baseline')):>7}  {ratio or '-':<24}  {knobs_text(r.get('knobs'), 60)}")
        lines.append(f"  (* the objective's metric; vs best then: the best's time / this one's, timed side by side when it was judged)")
    if outcome.best_path:
        lines.append(f"best candidate: {outcome.best_path}")
    promotion = getattr(outcome, "promotion", None)
    if promotion is not None:
        lines.append(f"promotion: {promotion.action}: {promotion.reason}")
    elif outcome.promoted:
        lines.append(f"promoted to {outcome.promoted}")
    if outcome.status != "finished" or outcome.reason == "budget exhausted":
        more = " --kopt-budget=+N" if outcome.status == "finished" else ""
        lines.append(f"continue: {resume_command(obj.get('problem') or '?', outcome.run_dir, more.strip())}")
    return lines
