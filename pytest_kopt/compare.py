"""Compare saved benchmark histories side by side: `kopt compare [--storage DIR] [RUN...]`.

The histories are the JSON files pytest-benchmark saves (``--benchmark-save``/``--benchmark-autosave``
with ``--benchmark-storage=results/benchmarks``, or ``--benchmark-json``), from different commits,
machines or Triton versions. A RUN is a saved run's name in the storage, or a JSON file, or a
folder of them (the benchmark JSONs of record committed under ``results/``), so a fresh clone can
compare what is committed. Loading, grouping, the side-by-side table and the regression rule are
pytest-benchmark's own (``FileStorage``, ``pytest_benchmark_group_stats``,
``CompareBetweenResults``, ``--benchmark-compare-fail`` syntax); this module picks the runs,
says where each came from, and adds the per-benchmark time ratio, a regression flag, and each
benchmark's three figures (eager, device, graph: ``extra_info["figures"]`` in microseconds; a file
from before the three figures shows its one figure, pytest-benchmark's median, as device time).
Its own errors (nothing to compare, a file that is not a benchmark JSON) exit with status 2.

In CI, gate on regressions with pytest-benchmark itself (see docs/reports.md):
``pytest benchmarks --benchmark-compare --benchmark-compare-fail=median:10%``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from _pytest._io import TerminalWriter
from pytest_benchmark.cli import TerminalReporter
from pytest_benchmark.logger import Logger
from pytest_benchmark.plugin import pytest_benchmark_group_stats, pytest_benchmark_scale_unit
from pytest_benchmark.table import CompareBetweenResults
from pytest_benchmark.utils import NAME_FORMATTERS, load_storage, parse_columns, parse_compare_fail, report_noprogress, time_unit

from . import runstore

DEFAULT_STORAGE = "results/benchmarks"
DEFAULT_THRESHOLD = "median:10%"
FIGURES = ("eager", "device", "graph")
EXAMPLE = "kopt compare results/h200-2026-11-30m/call4 results/h200-2026-11-30n/call3"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="*", metavar="RUN",
                        help="saved runs as pytest-benchmark names them (a number 0003, a glob 'Linux-*/0002'), or "
                             "pytest-benchmark JSON files, or folders of them; the first is the reference. "
                             "Default: the two most recent runs in the storage")
    parser.add_argument("--storage", default=DEFAULT_STORAGE,
                        help=f"pytest-benchmark storage (path or file://path; default {DEFAULT_STORAGE})")
    parser.add_argument("--threshold", type=parse_compare_fail, default=parse_compare_fail(DEFAULT_THRESHOLD),
                        metavar="FIELD:LIMIT",
                        help="what counts as a regression, in --benchmark-compare-fail syntax: "
                             f"median:10%% (relative) or min:0.000001 (seconds). Default {DEFAULT_THRESHOLD.replace('%', '%%')}")
    parser.add_argument("--columns", type=parse_columns, default=["min", "median"],
                        help="statistics in the side-by-side table (default min,median)")
    parser.add_argument("--group-by", default="group", help="as pytest-benchmark's --benchmark-group-by (default group)")
    parser.add_argument("-k", dest="filter_expr", metavar="EXPR", help="only benchmarks matching this pytest -k expression")
    parser.add_argument("--fail", action="store_true", help="exit with status 1 when any benchmark regressed")


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Compare the RUNs; a RUN inside a packed folder (``results/h200-…/call4`` with
    ``results/h200-….tar.xz`` beside it, or the archive itself) is read from the archive."""
    with runstore.readable_all(args.runs) as paths:
        runs = [str(path) if runstore.locate(run) else run for run, path in zip(args.runs, paths)]
        return _run(argparse.Namespace(**{**vars(args), "runs": runs}), out or sys.stdout)


def _run(args: argparse.Namespace, out: TextIO) -> int:
    try:
        named = named_files(args.runs)
    except ValueError as exc:
        print(f"kopt compare: {exc}", file=sys.stderr)
        return 2
    if named is not None:  # files and folders: no storage needed
        if len(named) < 2:
            found = ", ".join(str(f) for f in named) or "none"
            print(f"kopt compare: need at least two pytest-benchmark JSON files in {' '.join(args.runs)} (found: {found})", file=sys.stderr)
            return 2
        where = os.path.commonpath([str(path.resolve().parent) for path in named])
    else:
        where = str(args.storage)
        if "://" not in where and not Path(where).is_dir():
            print(f"kopt compare: no benchmark storage at {where} (save runs there with pytest benchmarks "
                  f"--benchmark-storage={where} --benchmark-autosave), and {'no RUN was named' if not args.runs else 'the RUNs named are not files or folders'}; "
                  f"name two benchmark JSON files or folders, e.g. {EXAMPLE}", file=sys.stderr)
            return 2
    storage = load_storage(where, logger=Logger(Logger.QUIET), netrc="")
    try:
        files = named if named is not None else select_runs(storage, args.runs)
    except ValueError as exc:  # pytest-benchmark's word on a malformed glob
        print(f"kopt compare: {exc}", file=sys.stderr)
        return 2
    if len(files) < 2:
        found = ", ".join(str(f) for f in files) or "none"
        print(f"kopt compare: need at least two saved runs in {storage} (found: {found})", file=sys.stderr)
        return 2
    benches = load(storage, files)
    if args.filter_expr:
        from _pytest.mark.expression import Expression

        expr = Expression.compile(args.filter_expr)
        benches = [b for b in benches if expr.evaluate(lambda key, b=b: key in (b.get("fullname") or b["name"]))]
    sources = list(dict.fromkeys(b["source"] for b in benches))
    if len(sources) < 2:
        print("kopt compare: fewer than two runs have matching benchmarks", file=sys.stderr)
        return 2
    shared = _shared_names(benches)
    if not shared:
        print(f"kopt compare: the runs share no benchmark ({', '.join(sources)}): nothing to compare", file=sys.stderr)
        return 2

    print("Runs (the first is the reference):", file=out)
    for source, path in zip(sources, files):
        print(f"  {source}: {describe(path)}", file=out)
    side_by_side(benches, args.columns, args.group_by, out)
    rows = ratios(benches, sources, args.threshold)
    print(format_ratios(rows, sources, args.threshold), file=out)
    print(format_figures(benches, sources), file=out)
    regressed = [r for r in rows if any(flag.startswith("REGRESSION") for flag in r.flags)]
    print(f"{len(regressed)} of {len(rows)} benchmarks regressed beyond {args.threshold.field} "
          f"{_limit(args.threshold)} against {sources[0]}.", file=out)
    return 1 if regressed and args.fail else 0


def named_files(runs: list[str]) -> list[Path] | None:
    """The pytest-benchmark JSON files the RUNs name when every one is a file or a folder (a folder's
    files oldest first), else None (the RUNs are names in a storage). ValueError for a named file that
    is not a benchmark JSON."""
    paths = [Path(run) for run in runs]
    if not paths or not all(path.exists() for path in paths):
        return None
    files: list[Path] = []
    for path in paths:
        if path.is_file():
            if not is_benchmark_json(path):
                raise ValueError(f"{path} is not a pytest-benchmark JSON file (no 'benchmarks' list)")
            found = [path]
        else:
            found = sorted((f for f in path.rglob("*.json") if is_benchmark_json(f)), key=_saved_at)
        files += [f for f in found if f.resolve() not in {g.resolve() for g in files}]
    return files


def is_benchmark_json(path: Path) -> bool:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("benchmarks"), list) and "machine_info" in data


def select_runs(storage: Any, runs: list[str]) -> list[Path]:
    """The saved files to compare, the reference first: each argument's matches oldest first,
    or without arguments the two most recent runs."""
    if not runs:
        return sorted(storage.query(), key=_saved_at)[-2:]
    files: list[Path] = []
    for run in runs:
        for path in sorted(storage.query(run), key=_saved_at):
            if path not in files:
                files.append(path)
    return files


def load(storage: Any, files: list[Path]) -> list[dict]:
    """Flat benchmark records as pytest-benchmark's compare sees them, the reference's first."""
    benches = list(storage.load_benchmarks(*files))
    order = {}
    for index, path in enumerate(files):
        try:
            order[str(Path(path).resolve().relative_to(storage.path))] = index
        except ValueError:
            order[str(path)] = index
    return sorted(benches, key=lambda b: order.get(b["path"], len(order)))


def describe(path: Path) -> str:
    """Where a saved run came from: when, which commit, which machine and software."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    commit, machine = data.get("commit_info") or {}, data.get("machine_info") or {}
    parts = [str(data.get("datetime", "?"))[:19]]
    if commit.get("id"):
        commit_id = str(commit["id"])
        commit_id = commit_id[:10] if len(commit_id) == 40 else commit_id
        parts.append(f"commit {commit_id}{' (dirty)' if commit.get('dirty') else ''}"
                     + (f" on {commit['branch']}" if commit.get("branch") not in (None, "(unknown)") else ""))
    for key in ("gpu", "driver", "cuda", "torch", "triton"):
        if machine.get(key):
            parts.append(f"{key} {machine[key]}")
    if not machine.get("gpu") and isinstance(machine.get("cpu"), dict) and machine["cpu"].get("brand_raw"):
        parts.append(machine["cpu"]["brand_raw"])
    if machine.get("node"):
        parts.append(f"on {machine['node']}")
    return ", ".join(parts)


def _name(bench: dict) -> str:
    return bench.get("fullname") or bench["name"]


def _shared_names(benches: list[dict]) -> set[str]:
    """Benchmarks that more than one run has: the ones there is something to compare for."""
    seen: dict[str, set[str]] = {}
    for bench in benches:
        seen.setdefault(_name(bench), set()).add(bench["source"])
    return {name for name, sources in seen.items() if len(sources) > 1}


def side_by_side(benches: list[dict], columns: list[str], group_by: str, out: TextIO) -> None:
    """pytest-benchmark's own between-runs table (values per run and percentage change), for the groups
    that more than one run has (a group of one run has nothing to compare; its rows are in the ratio table)."""
    table = CompareBetweenResults(
        columns=columns, sort=columns[0], histogram=False, name_format=NAME_FORMATTERS["normal"],
        logger=Logger(Logger.QUIET), scale_unit=partial(pytest_benchmark_scale_unit, config=None))
    groups = pytest_benchmark_group_stats(config=None, benchmarks=[dict(b) for b in benches], group_by=group_by)
    groups = [(group, members) for group, members in groups if len({b["source"] for b in members}) > 1]
    reporter = TerminalReporter()
    reporter._tw = TerminalWriter(file=out if out is not sys.stdout else None)
    table.display(reporter, groups, progress_reporter=report_noprogress)


@dataclass
class Row:
    name: str
    values: list[float | None]  # the threshold's field per run, in seconds
    ratios: list[float | None]  # run / reference, for every run after the reference
    flags: list[str]


def ratios(benches: list[dict], sources: list[str], check: Any) -> list[Row]:
    """Per benchmark: the field per run, its ratio to the reference and pytest-benchmark's verdict."""
    by_name: dict[str, dict[str, dict]] = {}
    for bench in benches:
        by_name.setdefault(bench.get("fullname") or bench["name"], {})[bench["source"]] = bench
    rows = []
    for name, runs in by_name.items():
        reference = runs.get(sources[0])
        values = [runs[s][check.field] if s in runs else None for s in sources]
        row_ratios, flags = [], []
        for source in sources[1:]:
            current = runs.get(source)
            if reference is None or current is None:
                row_ratios.append(None)
                flags.append("new" if reference is None and current is not None else "missing")
                continue
            row_ratios.append(current[check.field] / reference[check.field] if reference[check.field] else None)
            if check.fails(current, reference):
                flags.append(f"REGRESSION {_change(check, current, reference)}")
            elif check.fails(reference, current):  # the same rule the other way round: a clear improvement
                flags.append(f"faster {_change(check, current, reference)}")
            else:
                flags.append("")
        rows.append(Row(name, values, row_ratios, flags))
    return sorted(rows, key=lambda r: r.name)


def format_ratios(rows: list[Row], sources: list[str], check: Any) -> str:
    known = [v for r in rows for v in r.values if v]
    unit, scale = time_unit(min(known)) if known else ("", 1.0)
    header = ["benchmark", f"{sources[0]} {check.field} ({unit}s)"]
    for source in sources[1:]:
        header += [f"{source} {check.field}", "ratio", "flag"]
    table = [header]
    for row in rows:
        cells = [row.name, _fmt(row.values[0], scale)]
        for value, ratio, flag in zip(row.values[1:], row.ratios, row.flags):
            cells += [_fmt(value, scale), "n/a" if ratio is None else f"{ratio:.3f}", flag]
        table.append(cells)
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["", f"Time ratio = run / {sources[0]} ({check.field}; above 1 is slower); "
                 f"REGRESSION when slower by more than {_limit(check)}."]
    for number, cells in enumerate(table):
        lines.append("  ".join(c.ljust(w) if i == 0 or header[i] == "flag" else c.rjust(w)
                               for i, (c, w) in enumerate(zip(cells, widths))).rstrip())
        if number == 0:
            lines.append("-" * len(lines[-1]))
    return "\n".join(lines)


def figures(bench: dict) -> dict[str, float | None]:
    """A benchmark's eager, device and graph figures in microseconds (see the module docstring)."""
    extra = bench.get("extra_info") if isinstance(bench.get("extra_info"), dict) else {}
    given = extra.get("figures") if isinstance(extra.get("figures"), dict) else {}
    found = {name: _micro(given.get(name, extra.get(f"{name}_us"))) for name in FIGURES}
    if all(value is None for value in found.values()):  # a file from before the three figures: its median, device time
        median = bench.get("median", (bench.get("stats") or {}).get("median"))
        found["device"] = median * 1e6 if isinstance(median, (int, float)) else None
    return found


def format_figures(benches: list[dict], sources: list[str]) -> str:
    """Each benchmark's eager / device / graph time per run (µs; "-" where a run did not record it)."""
    by_name: dict[str, dict[str, dict]] = {}
    for bench in benches:
        by_name.setdefault(_name(bench), {})[bench["source"]] = bench
    header = ["benchmark"] + [f"{source} eager/device/graph (us)" for source in sources]
    table = [header]
    for name in sorted(by_name):
        cells = [name]
        for source in sources:
            bench = by_name[name].get(source)
            three = figures(bench) if bench is not None else {}
            cells.append("/".join("-" if three.get(k) is None else f"{three[k]:,.1f}" for k in FIGURES) if bench is not None else "n/a")
        table.append(cells)
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["", "Figures: eager (back-to-back calls, host included) / device (L2 flushed) / graph (CUDA-graph replay); "
                 "a file from before them shows its median as device time."]
    for number, cells in enumerate(table):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip())
        if number == 0:
            lines.append("-" * len(lines[-1]))
    return "\n".join(lines)


def _micro(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _change(check: Any, current: dict, reference: dict) -> str:
    if type(check).__name__.startswith("Percentage"):
        return f"{check.compute(current, reference):+.1f}%"
    return f"{current[check.field] - reference[check.field]:+.3g}s"


def _limit(check: Any) -> str:
    return f"{check.threshold}%" if type(check).__name__.startswith("Percentage") else f"{check.threshold}s"


def _fmt(value: float | None, scale: float) -> str:
    return "n/a" if value is None else f"{value * scale:,.4f}"


def _saved_at(path: Path) -> tuple[str, str]:
    try:
        stamp = str(json.loads(Path(path).read_text(encoding="utf-8")).get("datetime", ""))
    except (OSError, ValueError):
        stamp = ""
    return stamp, Path(path).name

