"""Write a Markdown report (and its plots) of one or more runs: `kopt report RUN_DIR... [--out DIR]`.

For someone coming back to a finished run, or a week of them: what was asked, how much budget
and time it took, how candidates fared and why they failed, how the best speedup grew, and how
the best candidate stands against the baseline and the roofline floor. The same Markdown is
printed to the terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import plots, runstore
from .runstate import TIMER_METRICS, ratio_text, three_figures
from .runsummary import RunSummary, summarise

DEFAULT_OUT = Path("results/reports")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
                        help="runs: directories holding events.jsonl, or packed (results/runs/<id>.tar.xz)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"where report.md and the PNG plots go (default: {DEFAULT_OUT})")
    parser.add_argument("--quiet", action="store_true", help="do not print the report")


def run(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as stack:  # a packed run (results/runs/<id>.tar.xz) is read unpacked to a temporary dir
        run_dirs = [stack.enter_context(runstore.readable(d)) for d in args.run_dirs]
        missing = [str(given) for given, d in zip(args.run_dirs, run_dirs) if not (d / "events.jsonl").is_file()]
        if missing:
            print(f"kopt report: no events.jsonl in {', '.join(missing)}", file=sys.stderr)
            return 2
        path = write_report(run_dirs, args.out)
    if not args.quiet:
        print(path.read_text(encoding="utf-8"))
        print(f"[report written to {path}]")
    return 0


def write_report(run_dirs: list[Path], out: Path) -> Path:
    """Summarise the runs, draw the plots into ``out`` and write ``out/report.md``; returns its path."""
    out.mkdir(parents=True, exist_ok=True)
    runs = [summarise(d) for d in run_dirs]
    plots.progress(runs, out / "progress.png")
    for run in runs:
        plots.candidates(run, out / f"candidates-{_slug(run.run_id)}.png", floor_us=_floor_us(run))
    path = out / "report.md"
    path.write_text(render(runs), encoding="utf-8")
    return path


def render(runs: list[RunSummary]) -> str:
    """The whole report as Markdown; plot files are referenced by their names in the same folder."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# kopt report: {len(runs)} run{'s' if len(runs) != 1 else ''}", "", f"_Generated {now}._", ""]
    lines += _table(["run", "problem", "agent", "status", "budget used", "running time", "candidates (pass/fail)", "best speedup over baseline candidate"],
                    [[r.run_id, r.problem or "?", _agent(r), r.status, _budget(r), _duration(r.running_s),
                      f"{len(r.candidates)} ({r.counts_by_verdict()['pass']}/{r.counts_by_verdict()['fail']})",
                      _times(r.best_speedup)] for r in runs])
    lines += ["", "![Best speedup against tool calls, one line per run](progress.png)", ""]
    for run in runs:
        lines += _run_section(run)
    return "\n".join(lines).rstrip() + "\n"


def _run_section(run: RunSummary) -> list[str]:
    lines = [f"## Run {run.run_id}", ""]
    objective = run.objective
    if objective.get("description"):  # its first sentence; the whole statement is in the log
        first = str(objective["description"]).split(". ")[0].rstrip(".")
        lines += [f"**Objective** ({run.problem}): {first}.", ""]
    facts = []
    if objective.get("headline"):
        headline = objective["headline"]
        facts.append(f"headline shape: {headline[0] if isinstance(headline, list) else headline}")
    if objective.get("case"):
        facts.append(f"timed on: {objective['case']}")
    for spec in objective.get("outputs") or []:
        if isinstance(spec, dict) and "name" in spec:
            facts.append(f"`{spec['name']}` within relative RMS {spec.get('tolerance', '?')}")
    facts.append(f"timer metric: {run.metric} (the objective's figure; eager, device and graph are shown where the judge gave them)")
    facts += [f"agent: {_agent(run)}", f"seed: {run.seed}" if run.seed is not None else ""]
    env = run.environment
    env_text = ", ".join(f"{k} {str(env[k])[:10] if k == 'commit' else env[k]}" for k in ("gpu", "driver", "torch", "triton", "python", "commit") if env.get(k))
    if env.get("interpreter"):
        env_text += ", Triton CPU interpreter"
    if env_text:
        facts.append(f"environment: {env_text}")
    status = run.status + (f" ({run.status_reason})" if run.status_reason else "")
    if run.resumes:
        status += f", resumed {run.resumes}×"
    facts += [f"status: {status}", f"budget used: {_budget(run)} tool calls", f"running time: {_duration(run.running_s)} (summed over its sessions)"]
    facts += [f"retracted `{cid}` (never best again): {reason}" for cid, reason in run.retracted.items()]
    lines += [f"- {f}" for f in facts if f] + [""]

    counts = run.counts_by_verdict()
    lines += ["### Candidates", ""]
    lines += _table(["verdict", "candidates"], [[k, str(v)] for k, v in counts.items() if v or k != "not judged"])
    by_stage = run.failures_by_stage()
    if by_stage:
        lines += ["", "Failures by stage: " + ", ".join(f"{stage} {n}" for stage, n in by_stage.items()), ""]
        lines += _table(["stage", "reason", "candidates"], [[s, _short(r), str(n)] for s, r, n in run.failures_by_reason()[:15]])
    lines += [""]

    if run.tool_seconds:  # a loop's throughput is candidates per hour: where its minutes went
        lines += ["### Time per tool", ""]
        lines += _table(["tool", "calls", "mean", "total"],
                        [[tool, str(len(s)), f"{sum(s) / len(s):.1f} s", _duration(sum(s))]
                         for tool, s in sorted(run.tool_seconds.items(), key=lambda kv: -sum(kv[1]))])
        lines += [""]

    lines += ["### Best speedup over time", ""]
    if run.progress:
        lines += _table(["tool call", "candidate", "speedup", "over the best before it, timed side by side [95 % interval]"],
                        [[str(c), f"`{cid}`" if cid else "", _times(s), ratio_text(run.best_ratios.get(cid)) or "—"]
                         for c, s, cid in run.progress])
    else:
        lines += ["No candidate has passed and been timed yet."]
    lines += [""]

    lines += ["### Best candidate", ""]
    lines += _best_section(run) + [""]
    lines += [f"![Every candidate's time against the tool call that judged it](candidates-{_slug(run.run_id)}.png)", ""]
    return lines


def _best_section(run: RunSummary) -> list[str]:
    if not run.best_id:
        return ["None yet."]
    result = run.best_result or {}
    timings = result.get("timings") or {}
    roofline = result.get("roofline") or {}
    lines = [f"`{run.best_id}`" + (f", case {timings['case']}" if timings.get("case") else "")
             + (f", {result['device']}" if result.get("device") else ""), ""]
    best_us = _num(timings.get("candidate_us")) or run.best_us
    metric = timings.get("metric") if timings.get("metric") in TIMER_METRICS else run.metric

    def row(label: str, figures: Any, us: Any, word: str = "faster", against: Any = None) -> list[str]:
        three = three_figures(figures, us, metric)
        return [label, *[_us(three[name]) if three[name] is not None else "—" for name in TIMER_METRICS],
                _ratio(against if against is not None else us, best_us, word)]

    baseline_figures = timings.get("baseline_figures") if isinstance(timings.get("baseline_figures"), dict) else {}
    rows = [row("this candidate", timings.get("figures"), best_us)[:-1] + ["—"]]
    if run.baseline_us:
        rows.append(row("the run's baseline candidate", None, run.baseline_us))
    for name, us in (timings.get("baselines") or {}).items():
        rows.append(row(f"baseline: {name}", baseline_figures.get(name), _num(us)))
    if _num(timings.get("reference_us")):
        rows.append(row("PyTorch reference", timings.get("reference_figures"), timings["reference_us"]))
    floor = _floor_us(run)
    if floor and not run.on_interpreter:
        rows.append(["roofline floor"] + ["" for _ in TIMER_METRICS] + [_ratio(best_us, floor, "the floor's time")])
        rows[-1][1 + TIMER_METRICS.index(metric)] = _us(floor)
    lines += _table(["", *[f"{name}{' (the metric)' if name == metric else ''}" for name in TIMER_METRICS], f"this candidate is ({metric})"], rows)
    ratio = run.best_ratios.get(run.best_id)
    if ratio_text(ratio):
        lines += ["", f"Timed beside the best before it (`{ratio.get('incumbent')}`) round by round: "
                      f"{ratio_text(ratio)} its time (95 % interval over {ratio.get('rounds', '?')} rounds)."]
    if run.on_interpreter:
        return lines + ["", "_Timed on Triton's CPU interpreter: the times are indicative only, and the roofline "
                            "floor (a GPU's ceilings) does not apply. Time on a GPU for real figures._"]
    achieved = []
    if _num(roofline.get("floor_fraction")):
        ceilings = roofline.get("ceilings") if isinstance(roofline.get("ceilings"), dict) else {}
        source = f", ceilings: {ceilings['source']}" if ceilings.get("source") else ""
        achieved.append(f"{roofline['floor_fraction'] * 100:.3g}% of roofline (floor time / candidate time{source})")
    if _num(roofline.get("achieved_GBps")):
        achieved.append(f"{roofline['achieved_GBps']:.4g} GB/s")
    if _num(roofline.get("achieved_TFLOPs")):
        achieved.append(f"{roofline['achieved_TFLOPs']:.4g} TFLOP/s")
    if achieved:
        lines += ["", "Achieved: " + ", ".join(achieved) + "."]
    lines += _cases_table(timings, roofline)
    judge_seconds = result.get("seconds") or {}
    if judge_seconds:
        parts = ", ".join(f"{key} {value:.1f} s" for key, value in judge_seconds.items() if _num(value) is not None)
        lines += ["", f"The judge's child spent {result.get('child_duration_s', 0):.1f} s on this evaluation: {parts}."]
    if not result:
        lines += ["", "_(the judge's result file for this candidate was not found; figures from the event log)_"]
    return lines


def _cases_table(timings: dict, roofline: dict) -> list[str]:
    """Each timed case of a geometric-mean objective, with the first baseline beside it."""
    cases = [c for c in timings.get("cases") or [] if isinstance(c, dict)]
    if not cases:
        return []
    roofs = [r if isinstance(r, dict) else {} for r in roofline.get("cases") or []] + [{}] * len(cases)
    rows = []
    for case, roof in zip(cases, roofs):
        name = case.get("baseline")
        base = _num((case.get("baselines") or {}).get(name)) if name else None
        rows.append([str(case.get("case")), _us(_num(case.get("candidate_us"))), f"{name} {_us(base)}" if base else "—",
                     _ratio(base, _num(case.get("candidate_us")), "faster") if base else "—",
                     f"{roof['achieved_GBps']:.4g}" if _num(roof.get("achieved_GBps")) else "—"])
    return ["", f"Timed cases (the figures above are their geometric means), {timings.get('metric') or 'the metric'} time:", ""] + _table(
        ["case", "time", "baseline", "this candidate is", "GB/s"], rows)


def _floor_us(run: RunSummary) -> float | None:
    roofline = (run.best_result or {}).get("roofline") or {}
    return _num(roofline.get("floor_us")) or _num(run.objective.get("floor_us"))


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value else None


def _us(value: float | None) -> str:
    """A time given in microseconds, in the unit that reads best."""
    if value is None:
        return "n/a"
    for unit, size in (("s", 1e6), ("ms", 1e3)):
        if value >= size:
            return f"{value / size:.4g} {unit}"
    return f"{value:.4g} µs"


def _times(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}×"


def _ratio(other_us: Any, this_us: Any, word: str) -> str:
    """How this candidate stands against another time: "2.1× faster", or "1.7× slower"."""
    other_us, this_us = _num(other_us), _num(this_us)
    if not other_us or not this_us:
        return "n/a"
    if word == "faster" and other_us < this_us:
        return f"{this_us / other_us:.3g}× slower"
    return f"{other_us / this_us:.3g}× {word}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"


def _budget(run: RunSummary) -> str:
    return f"{run.budget_used}/{run.budget}" if run.budget else str(run.budget_used)


def _agent(run: RunSummary) -> str:
    agent = run.agent
    if isinstance(agent, dict):
        return " ".join(str(agent[k]) for k in ("name", "model") if agent.get(k)) or "?"
    return str(agent) if agent else "?"


def _short(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)
