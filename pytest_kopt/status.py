"""Write results/STATUS.md, where each problem stands, from the evidence: `kopt status [--check]`.

Per problem with a promoted kernel (``kernels/best/<problem>.py``): the candidate it is (the
file's id, the first 12 hex digits of its sha256, as the loop names candidates), the run that found
it and that run's own figure beside the baseline candidate it timed in the same objective, and the
benchmark of record: of the pytest-benchmark JSONs under ``results/`` whose ``commit_info`` names
this very file, the newest of those that timed it at the most shapes (``benchmarks/conftest.py``
records each best file's sha256, and each file timed beside the bests: a file promoted after the
run that timed it is found as that run's ``file=`` row), with every implementation that session
timed beside it, per shape, and the timer named. Nothing is typed in
by hand, so the page changes only when the evidence does; ``--check`` (run by the test suite)
fails when the committed page is not what the evidence says now.

Runs and device-session folders are read packed or unpacked (``runstore.readable``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

from . import KERNELS_DIR, runstore
from .bench_extra import SHA_PREFIX
from .events import read_events

TIMERS = {  # a timer's name in a pytest-benchmark JSON (and the figure it gives) -> what it measures
    "EventClock": "the judge's EventClock: CUDA events around each call, L2 flushed before every round; device time",
    "EventClock / device": "device: CUDA events around each call, L2 flushed before every round",
    "PerCall / eager": "eager: wall clock of calls back to back on different inputs, per call, host time included",
    "PerCall / graph": "graph: the same calls replayed from one CUDA graph, per call",
    "EventClock, interleaved / device": "device: CUDA events around each call, L2 flushed before every call; the case's "
                                        "implementations timed turn by turn in a shuffled order",
    "PerCall, interleaved / eager": "eager: wall clock of calls back to back on different inputs, per call, host time "
                                    "included; the case's implementations timed turn by turn in a shuffled order",
    "PerCall, interleaved / graph": "graph: the same calls replayed from one CUDA graph, per call; the case's "
                                    "implementations timed turn by turn in a shuffled order",
}
BEST_IMPL = "candidate:best"


@dataclass
class Benchmark:
    """One pytest-benchmark JSON: where it is, when, on what, and its medians per shape."""

    shown_path: str  # its path in the repository, as if unpacked
    archive: str | None  # the packed folder that holds it, if packed
    time: str
    gpu: str
    best_sha: dict[str, str]  # problem -> sha256 prefix of kernels/best/<problem>.py it timed
    file_sha: dict[str, str] = field(default_factory=dict)  # "candidate:file=<path>" -> sha256 prefix (KOPT_BENCH_EXTRA)
    rows: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # problem -> case -> impl -> figures


@dataclass
class RunFigure:
    """The run that holds a candidate, and its own figures for it."""

    run: str
    shown_path: str
    call: int | None
    calls: int | None
    is_best: bool
    candidate_us: float | None
    baseline_candidate: str | None
    baseline_us: float | None
    timed: str | None
    timer: str | None
    rendered_from: str | None = None  # the run's candidate this file was rendered from (its provenance says so)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", type=Path, default=Path("results"), help="the results folder (default: results)")
    parser.add_argument("--kernels", type=Path, default=None, help="the kernels folder with best/ (default: the package's)")
    parser.add_argument("--out", type=Path, default=None, help="where to write (default: RESULTS/STATUS.md)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the file differs from what the evidence says now")


def run(args: argparse.Namespace) -> int:
    out = args.out or args.results / "STATUS.md"
    text = render(args.results, args.kernels or KERNELS_DIR)
    if args.check:
        current = out.read_text(encoding="utf-8") if out.is_file() else ""
        if current != text:
            print(f"kopt status: {out} is not what the evidence says now; regenerate it with `kopt status`", file=sys.stderr)
            return 1
        print(f"{out} is current")
        return 0
    out.write_text(text, encoding="utf-8")
    print(text)
    print(f"[written to {out}]")
    return 0


def render(results: Path, kernels: Path) -> str:
    """The whole page as Markdown."""
    best_files = sorted((p for p in (kernels / "best").glob("*.py") if p.name != "__init__.py"), key=lambda p: p.stem)
    benches = list(benchmarks(results))
    # a best re-rendered from its family (or relaunched) is not byte for byte the run's candidate:
    # its provenance (kernels/best/<problem>.json) names the candidate the run found
    provenance = {p.stem: _json(p.with_suffix(".json")) or {} for p in best_files}
    found_ids = {str(provenance[p.stem].get("candidate_id") or "")[:12] for p in best_files} - {""}
    figures = find_runs({_sha(p)[:12] for p in best_files} | found_ids, _run_paths(results / "runs"), results)
    for path in best_files:
        sha12, origin = _sha(path)[:12], str(provenance[path.stem].get("candidate_id") or "")[:12]
        if sha12 not in figures and origin in figures:
            figures[sha12] = dataclasses.replace(figures[origin], rendered_from=origin)
    lines = ["# Where each problem stands", "",
             "_Written by `kopt status` from the runs under `results/runs/` and the pytest-benchmark JSONs under `results/`;"
             " do not edit (regenerate it). A figure is a median on the timer named, beside the baselines timed in the same"
             " session; figures from different sessions or machines are leads, not results._", ""]
    rows = []
    for path in best_files:
        figure, bench = figures.get(_sha(path)[:12]), record_for(path.stem, _sha(path), benches)
        rows.append([path.stem, f"`{_sha(path)[:12]}`", f"`{figure.run}`" if figure else "none found",
                     (f"`{bench.shown_path}`" + ("" if _timed_this_file(path, bench) else " (an earlier file)")) if bench else "none"])
    lines += _table(["problem", "promoted kernel", "run", "benchmark of record"], rows)
    for path in best_files:
        lines += ["", *_problem_section(path, figures.get(_sha(path)[:12]), record_for(path.stem, _sha(path), benches))]
    return "\n".join(lines).rstrip() + "\n"


def _problem_section(path: Path, figure: RunFigure | None, bench: Benchmark | None) -> list[str]:
    problem, sha = path.stem, _sha(path)
    lines = [f"## {problem}", "", f"- Promoted: `kernels/best/{path.name}`, candidate `{sha[:12]}` (sha256 `{sha[:16]}…`)."]
    if figure is None:
        lines.append("- Run: no committed run under `results/runs/` holds this candidate.")
    else:
        where = f"`{figure.run}` ({figure.shown_path})"
        found = f"tool call {figure.call} of {figure.calls}" if figure.call is not None else "a run's candidate"
        lines.append(f"- Run: {where}, {found}{'' if figure.is_best else '; not that run’s best now'}.")
        if figure.rendered_from:
            lines.append(f"  This file was rendered again from the run's candidate `{figure.rendered_from}` (its provenance,"
                         f" `kernels/best/{problem}.json`, has the family, the knobs and what changed); the run's figures are of that candidate.")
        if figure.candidate_us is not None:
            versus = ""
            if figure.baseline_us:
                versus = (f"; the run's baseline candidate `{figure.baseline_candidate}` {_us(figure.baseline_us)} µs in the same objective"
                          f" ({figure.baseline_us / figure.candidate_us:.1f}×)")
            lines.append(f"- The run's figure: {_us(figure.candidate_us)} µs on {figure.timed or 'its headline'}"
                         f" (judge timer: {figure.timer or 'not recorded'}){versus}.")
    if bench is None:
        lines.append("- Benchmark of record: none; no pytest-benchmark JSON under `results/` times this problem's best.")
        return lines
    packed = f", packed in `{bench.archive}` (`kopt unpack {bench.archive}`)" if bench.archive else ""
    lines.append(f"- Benchmark of record: `{bench.shown_path}`{packed}; {bench.time}, {bench.gpu}.")
    mine = _timed_as(problem, sha, bench) or BEST_IMPL
    old = bench.best_sha.get(problem, "")
    if not _timed_this_file(path, bench):
        lines.append(f"  **It timed an earlier `kernels/best/{path.name}` (`{old[:12]}`), not this file**: run `pytest benchmarks` on a GPU to time this one.")
    elif mine != BEST_IMPL:
        lines.append(f"  It timed this file as `{_name(mine)}` (the same sha256), beside the `kernels/best/{path.name}` of then"
                     f" (`{old[:12]}`, the table's `best`); speed, error and host time below are this file's.")
    rows = bench.rows.get(problem, {})
    impls = sorted({impl for case in rows.values() for impl in case}, key=lambda i: (_order(rows, i), i))
    reference = impls[0] if impls else None
    timers = sorted({f["timer"] for case in rows.values() for f in case.values() if f.get("timer")})
    lines.append("- Timer: " + "; ".join(f"{t} ({TIMERS[t]})" if t in TIMERS else t for t in timers) + ". Medians in µs;"
                 f" speed = `{_name(reference)}`'s time over the best's, both from this session.")
    lines += [""]
    who = "best" if mine == BEST_IMPL else "this file"
    header = ["shape", *[f"{_name(i)}" for i in impls], f"speed vs {_name(reference)}", f"rel. RMS error ({who})"]
    hosts = any(f.get("host_us") is not None for case in rows.values() for f in case.values())
    if hosts:  # the eager timer's host share: what the best's calls cost the caller's thread, back to back
        header.append(f"host µs a call ({who}, eager)")
    body = []
    for case, figures in rows.items():
        best, ref = figures.get(mine, {}), figures.get(reference, {})
        speed = f"**{ref['us'] / best['us']:.2f}×**" if best.get("us") and ref.get("us") else ""
        error = f"{best['rel_rms']:.2e}" if isinstance(best.get("rel_rms"), (int, float)) else ""
        body.append([case, *[_us(figures.get(i, {}).get("us")) for i in impls], speed, error] + ([_us(best.get("host_us"))] if hosts else []))
    lines += _table(header, body)
    return lines


# ---- evidence -----------------------------------------------------------------------------------
def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run_paths(runs_dir: Path) -> list[Path]:
    """Each run once: a packed run by its archive, an unpacked one (with no archive) by its folder."""
    if not runs_dir.is_dir():
        return []
    packed = sorted(runs_dir.glob("*" + runstore.SUFFIX))
    names = {runstore.folder_of(p).name for p in packed}
    return packed + [d for d in sorted(runs_dir.iterdir()) if d.is_dir() and d.name not in names and (d / "events.jsonl").is_file()]


def find_runs(cids: set[str], runs: list[Path], results: Path) -> dict[str, RunFigure]:
    """The run that holds each candidate id (where it is the run's best if one such run is). Only
    the front of a packed run is read: its log and ``best.json``."""
    found: dict[str, list[RunFigure]] = {}
    for path in runs:
        with runstore.readable(path, only=("events.jsonl", "best.json")) as run_dir:
            events = read_events(run_dir / "events.jsonl")
            held = {e.get("candidate_id") for e in events if e.get("kind") == "candidate"} & cids
            best = _json(run_dir / "best.json") if held else None
            for cid in sorted(held):
                found.setdefault(cid, []).append(_figure(cid, path, events, best, results))
    return {cid: next((f for f in figs if f.is_best), figs[0]) for cid, figs in found.items()}


def _figure(cid: str, path: Path, events: list[dict], best: dict | None, results: Path) -> RunFigure:
    started = next((e for e in events if e.get("kind") == "run_started"), {})
    objective = started.get("objective") or {}
    bests = [e for e in events if e.get("kind") == "best"]
    mine = [e for e in bests if e.get("candidate_id") == cid]
    calls = next((e.get("budget_used") for e in reversed(events) if e.get("kind") in ("run_finished", "run_interrupted")), None)
    timer = None
    if isinstance(best, dict) and best.get("candidate_id") == cid:  # the loop's record of its best evaluation
        timings = (best.get("evaluation") or {}).get("timings") or {}
        timer = " / ".join(str(t) for t in (timings.get("timer"), timings.get("metric")) if t) or None
    return RunFigure(
        run=runstore.folder_of(path).name if runstore.is_archive(path) else path.name,
        shown_path=f"`{_shown(path, results)}`", call=mine[-1].get("call") if mine else None, calls=calls,
        is_best=bool(bests) and bests[-1].get("candidate_id") == cid,
        candidate_us=mine[-1].get("candidate_us") if mine else None,
        baseline_candidate=objective.get("baseline_candidate"), baseline_us=objective.get("baseline_us"),
        timed=objective.get("timed") or objective.get("case"), timer=timer,
    )


def benchmarks(results: Path) -> Iterator[Benchmark]:
    """Every pytest-benchmark JSON under ``results`` (packed folders too; runs' own files aside)."""
    for entry in sorted(results.iterdir()) if results.is_dir() else []:
        if entry.name == "runs":
            continue
        archive = entry if runstore.is_archive(entry) else None
        with (runstore.readable(entry, only=lambda name: name.endswith(".json")) if archive else contextlib.nullcontext(entry)) as folder:
            files = sorted(folder.rglob("*.json")) if folder.is_dir() else [folder] if folder.suffix == ".json" else []
            for file in files:
                data = _json(file)
                if isinstance(data, dict) and {"benchmarks", "machine_info", "commit_info"} <= data.keys():
                    shown = runstore.folder_of(entry) / file.relative_to(folder) if archive else file
                    yield _benchmark(data, _shown(shown, results), _shown(archive, results) if archive else None)


def _benchmark(data: dict, shown: str, archive: str | None) -> Benchmark:
    commit = data.get("commit_info") or {}
    best_sha = {key.split("/")[-1][: -len(".py")]: value for key, value in commit.items()
                if key.startswith("sha256:kernels/best/") and key.endswith(".py")}
    file_sha = {"candidate:file=" + key[len(SHA_PREFIX):]: value for key, value in commit.items()
                if key.startswith(SHA_PREFIX) and not key.startswith(SHA_PREFIX + "kernels/best/")}
    bench = Benchmark(shown, archive, _when(data.get("datetime")), str((data.get("machine_info") or {}).get("gpu") or "GPU not recorded"),
                      best_sha, file_sha)
    for item in data.get("benchmarks") or []:
        params, extra, stats = item.get("params") or {}, item.get("extra_info") or {}, item.get("stats") or {}
        problem, impl = params.get("problem_name"), params.get("impl")
        if not problem or not impl or not isinstance(stats.get("median"), (int, float)):
            continue
        timer = (item.get("options") or {}).get("timer")
        case = extra.get("case") or item.get("group") or "?"
        if extra.get("metric"):  # three figures per case since session 20: a row per case and figure
            case = f"{case} [{extra['metric']}]"
        bench.rows.setdefault(problem, {}).setdefault(case, {})[impl] = {
            "us": stats["median"] * 1e6, "rel_rms": extra.get("rel_rms"), "order": extra.get("order", 99),
            "timer": " / ".join(str(t) for t in (timer, extra.get("metric")) if t),
            # the device timer's host_us (one call after a flush) moves by tens of µs between runs: eager's only
            "host_us": extra.get("host_us") if extra.get("metric") == "eager" else None,
        }
    return bench


def record_for(problem: str, sha: str, benches: list[Benchmark]) -> Benchmark | None:
    """Of the JSONs that timed this very file (as the best, or beside it before it was promoted), the newest of those
    that timed it at the most shapes; else the same of those that timed any best of ``problem``. A check at a few
    shapes, newer than the whole benchmark, does not become the record."""
    timed = [b for b in benches if any(BEST_IMPL in impls for impls in b.rows.get(problem, {}).values())]
    exact = [b for b in timed if _timed_as(problem, sha, b)]
    pool = exact or timed
    return max(pool, key=lambda b: (_shapes_timed(problem, sha, b), b.time, b.shown_path)) if pool else None


def _shapes_timed(problem: str, sha: str, bench: Benchmark) -> int:
    """How many (shape, timer) rows of ``problem`` in ``bench`` time this file (else its best)."""
    impl = _timed_as(problem, sha, bench) or BEST_IMPL
    return sum(impl in impls for impls in bench.rows.get(problem, {}).values())


def _timed_as(problem: str, sha: str, bench: Benchmark | None) -> str | None:
    """The implementation name under which ``bench`` timed the file with this sha256 for ``problem``, or None."""
    if bench is None:
        return None
    if bench.best_sha.get(problem) and sha.startswith(bench.best_sha[problem]):
        return BEST_IMPL
    impls = {impl for case in bench.rows.get(problem, {}).values() for impl in case}
    return next((impl for impl, prefix in sorted(bench.file_sha.items()) if impl in impls and prefix and sha.startswith(prefix)), None)


def _timed_this_file(path: Path, bench: Benchmark | None) -> bool:
    return _timed_as(path.stem, _sha(path), bench) is not None


# ---- formatting ---------------------------------------------------------------------------------
def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _shown(path: Path, results: Path) -> str:
    """A path as the reader of the repository sees it (results/... relative to its parent)."""
    try:
        return (Path(results.name) / Path(path).relative_to(results)).as_posix()
    except ValueError:
        return Path(path).as_posix()


def _when(stamp: Any) -> str:
    try:
        return datetime.fromisoformat(str(stamp)).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return "time not recorded"


def _order(rows: dict, impl: str) -> float:
    orders = [case[impl]["order"] for case in rows.values() if impl in case]
    return min(orders) if orders else 99


def _name(impl: str | None) -> str:
    return {"candidate:best": "best", "candidate:baseline": "baseline candidate"}.get(impl or "", (impl or "?").split(":", 1)[-1])


def _us(value: Any) -> str:
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return ""
    return f"{value:,.1f}" if value < 10_000 else f"{value:,.0f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]
