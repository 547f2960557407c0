"""The report's two pictures, drawn with matplotlib's object API (no pyplot, no display needed).

- ``progress``: best speedup against tool calls, one line per run: the progress curve that
  shows which run or agent got further on the same budget.
- ``candidates``: every candidate's time against the tool call that judged it, failed ones
  marked, with the running best, the baseline and the roofline floor: does the agent keep
  finding improvements or has it plateaued?
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from .runsummary import RunSummary


def _times(value: float, _pos: int | None = None) -> str:
    return f"{value:,.0f}×" if value >= 100 else f"{value:.3g}×"


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def progress(runs: list[RunSummary], path: Path) -> Path:
    """Best speedup over the baseline against tool calls spent, one step line per run."""
    fig = Figure(figsize=(8, 4.8))
    ax = fig.add_subplot()
    speedups = [1.0]
    for run in runs:
        if not run.progress:
            continue
        calls = [c for c, _, _ in run.progress]
        values = [s for _, s, _ in run.progress]
        end = max(run.budget_used, calls[-1])
        (line,) = ax.step(calls + [end], values + [values[-1]], where="post", linewidth=2,
                          label=f"{run.label}{' [CPU interpreter]' if run.on_interpreter else ''}  (best {_times(values[-1])})")
        ax.plot(calls, values, "o", color=line.get_color(), markersize=5)
        speedups.extend(values)
    ax.axhline(1.0, color="0.4", linestyle="--", linewidth=1)
    ax.annotate("baseline candidate", xy=(1, 1.0), xycoords=("axes fraction", "data"), xytext=(-4, -10),
                textcoords="offset points", ha="right", color="0.4", fontsize=8)
    if max(speedups) / min(speedups) > 4:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=2))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(_times))
    ax.set_xlim(left=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ax.get_yscale() == "linear":
        low, high = ax.get_ylim()
        ax.set_ylim(low, high + 0.08 * (high - low))  # head room above the best line
    ax.set_xlabel("tool calls (budget units)")
    ax.set_ylabel("best verified speedup over the baseline candidate")
    problems = sorted({r.problem for r in runs if r.problem})
    ax.set_title(f"Best speedup against budget spent ({', '.join(problems) or 'runs'})")
    ax.grid(True, which="major", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # below the chart: never over a line, room for many runs
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=8, frameon=False)
    else:
        ax.text(0.5, 0.5, "no candidate has been timed yet", transform=ax.transAxes, ha="center", color="0.4")
    return _save(fig, path)


def _plain_log_axis(axis, lo: float, hi: float) -> None:
    """Label a log axis with plain numbers (300, not 3×10²); some minor ticks too when it spans little."""
    span = hi / lo
    keep = None if span < 6 else (2, 3, 5) if span < 300 else (2, 5) if span < 3000 else ()

    def minor(value: float, _pos: int) -> str:
        mantissa = round(value / 10 ** math.floor(math.log10(value)), 6)
        return f"{value:g}" if keep is None or mantissa in keep else ""

    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(minor))


def candidates(run: RunSummary, path: Path, floor_us: float | None = None) -> Path:
    """Every timed candidate's time by the call that judged it; below, a strip of the failures by stage."""
    fig = Figure(figsize=(9, 5.6))
    ax, strip = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [4, 1.3], "hspace": 0.08})
    judged = sorted((c for c in run.candidates.values() if c.verdict), key=lambda c: c.judged_at or 0)
    timed = [c for c in judged if c.verdict == "pass" and c.candidate_us]
    untimed = [c for c in judged if c.verdict == "pass" and not c.candidate_us]
    failed = [c for c in judged if c.verdict == "fail"]
    floor_us = None if run.on_interpreter else floor_us  # a GPU's floor says nothing about the interpreter
    levels = [c.candidate_us for c in timed] + [v for v in (run.baseline_us, floor_us) if v]
    unit, size = next(((u, k) for u, k in (("s", 1e6), ("ms", 1e3)) if levels and min(levels) >= k), ("µs", 1.0))
    if timed:
        ax.plot([c.judged_at for c in timed], [c.candidate_us / size for c in timed], "o", color="tab:blue",
                alpha=0.75, label=f"passed, timed ({len(timed)})")
        best_x, best_y, best = [], [], None
        for c in timed:
            best = c.candidate_us if best is None else min(best, c.candidate_us)
            best_x.append(c.judged_at)
            best_y.append(best / size)
        best_x.append(max(run.budget_used, best_x[-1]))
        best_y.append(best_y[-1])
        ax.step(best_x, best_y, where="post", color="tab:green", linewidth=2, label=f"best so far ({best / size:.4g} {unit})")
    else:
        ax.text(0.5, 0.5, "no candidate has been timed yet", transform=ax.transAxes, ha="center", color="0.4")
    if run.baseline_us:
        ax.axhline(run.baseline_us / size, color="0.3", linestyle="--", linewidth=1,
                   label=f"baseline candidate ({run.baseline_us / size:.4g} {unit})")
    if floor_us:
        ax.axhline(floor_us / size, color="tab:purple", linestyle=":", linewidth=1.5,
                   label=f"roofline floor ({floor_us / size:.4g} {unit})")
    if levels:
        ax.set_yscale("log")
        lo, hi = ax.get_ylim()
        _plain_log_axis(ax.yaxis, lo, hi)
    ax.set_ylabel(f"candidate {run.metric} time ({unit}{', log scale' if levels else ''})")
    where = " (CPU interpreter: indicative times)" if run.on_interpreter else ""
    ax.set_title(f"Every candidate: {run.label}{where}")
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", alpha=0.1)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)

    # The strip: one row per way a candidate ended without a time, so failures never hide the data.
    rows = [f"failed: {stage}" for stage in run.failures_by_stage()] + (["passed, not timed"] if untimed else [])
    for c in failed:
        strip.plot(c.judged_at, rows.index(f"failed: {c.stage or 'unknown'}"), "x", color="tab:red", markersize=7)
    for c in untimed:
        strip.plot(c.judged_at, rows.index("passed, not timed"), "|", color="0.45", markersize=9)
    strip.set_yticks(range(len(rows)), rows, fontsize=8)
    strip.set_ylim(-0.7, max(len(rows), 1) - 0.3)
    strip.invert_yaxis()
    strip.grid(True, axis="x", alpha=0.25)
    if not rows:
        strip.set_yticks([])
        strip.text(0.5, 0.5, "no failed candidates", transform=strip.transAxes, ha="center", va="center", color="0.4", fontsize=8)
    strip.set_xlim(-0.5, max([run.budget_used, 1] + [c.judged_at or 0 for c in judged]) + 1)
    strip.xaxis.set_major_locator(MaxNLocator(integer=True))
    strip.set_xlabel("tool call that judged the candidate")
    return _save(fig, path)
