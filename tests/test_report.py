"""`kopt report` and `kopt compare` on small synthetic runs and benchmark histories.

The runs are written in the event-log contract of docs/architecture.md, as the loop writes
them, so these tests pin that the report reads that format (and survives a torn last line).
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timezone
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_kopt import REPO_ROOT as REPO, cli, runstore
from pytest_kopt.report import write_report
from pytest_kopt.runsummary import summarise

BASELINE_US = 400.0  # the run's baseline candidate
FLA_US = 90.0  # the judge's first baseline


def make_run(run_dir: Path, *, run_id: str, agent: str, n_candidates: int, seed: int, finish: bool = True,
             torn_tail: bool = False, minimal: bool = False, interpreter: bool = False) -> dict:
    """Write a plausible run: write/test/benchmark candidates, some failing; returns what was logged.
    ``minimal`` leaves out the optional fields (the objective's figures, vs_baseline, call)."""
    rng = random.Random(seed)
    run_dir.mkdir(parents=True)
    (run_dir / "evals").mkdir()
    events: list[dict] = []
    clock = [1_700_000_000.0]
    times: list[float] = []

    def log(kind: str, **fields) -> None:
        clock[0] += rng.uniform(1, 20)
        times.append(clock[0])
        stamp = datetime.fromtimestamp(clock[0], timezone.utc).isoformat(timespec="milliseconds")  # as EventLog writes it
        if minimal and kind not in ("tool_call", "tool_result"):
            fields = {k: v for k, v in fields.items() if k not in ("vs_baseline", "call")}
        events.append({"seq": len(events) + 1, "time": stamp, "run_id": run_id, "kind": kind, **fields})

    log("run_started", problem="kda", budget=3 * n_candidates + 2, agent={"name": agent}, seed=seed,
        objective={"problem": "kda", "description": "Gated delta rule forward (KDA)", "headline": ["B1 T8192 H16 K128 V128"],
                   "outputs": [{"name": "o", "tolerance": 0.02}, {"name": "final_state", "tolerance": 0.02}],
                   **({} if minimal else {"baseline_us": BASELINE_US, "floor_us": 25.0})},
        environment={"gpu": None, "interpreter": True, "triton": "3.6.0"} if interpreter else
                    {"gpu": "NVIDIA H200", "triton": "3.6.0", "torch": "2.13.0", "commit": "abc1234"})
    call, best, expected = 0, None, {"pass": 0, "fail": 0, "stages": {}, "best": None}
    us = BASELINE_US
    for i in range(n_candidates):
        cid = f"{seed:02d}{i:010x}"
        call += 1
        log("tool_call", call=call, tool="write_candidate", args={"source": cid})
        log("candidate", candidate_id=cid, parent=None, strategy="kda_recurrent", knobs={"BV": 32}, path=f"candidates/{cid}.py", notes="")
        log("tool_result", call=call, tool="write_candidate", result={"candidate_id": cid}, duration_s=0.01)
        call += 1
        log("tool_call", call=call, tool="run_tests", args={"candidate_id": cid})
        failure = None if i == 0 else rng.choice([None, None, ("compile", "CompilationError: BV=128 exceeds shared memory"),
                                                   ("correctness", "o: relative RMS error 0.31 > tolerance 0.02")])
        if failure:
            stage, reason = failure
            log("verdict", candidate_id=cid, upto="correctness", verdict="fail", stage=stage, reasons=[reason],
                candidate_us=None, speedup=None, errors=[], result_path=f"evals/{cid}-correctness.json")
            log("tool_result", call=call, tool="run_tests", result={"verdict": "fail"}, duration_s=2.0)
            expected["fail"] += 1
            expected["stages"][stage] = expected["stages"].get(stage, 0) + 1
            continue
        log("verdict", candidate_id=cid, upto="correctness", verdict="pass", stage="correctness", reasons=[],
            candidate_us=None, speedup=None, errors=[], result_path=f"evals/{cid}-correctness.json")
        log("tool_result", call=call, tool="run_tests", result={"verdict": "pass"}, duration_s=2.0)
        call += 1
        log("tool_call", call=call, tool="benchmark", args={"candidate_id": cid})
        us = BASELINE_US if i == 0 else us * rng.uniform(0.6, 1.3)
        speedup = BASELINE_US / us  # over the run's baseline candidate
        log("verdict", candidate_id=cid, upto="benchmark", verdict="pass", stage="benchmark", reasons=[],
            candidate_us=us, speedup=speedup if minimal else FLA_US / us, vs_baseline=speedup, errors=[],
            result_path=f"evals/{cid}-benchmark.json", call=call)
        result = {"verdict": "pass", "stage": "benchmark", "candidate_id": cid, "device": "NVIDIA H200",
                  "timings": {"case": "B1 T8192 H16 K128 V128", "candidate_us": us,
                              "baselines": {"fla chunk_kda": FLA_US}, "reference_us": 5000.0},
                  "speedup": speedup, "roofline": {"floor_us": 25.0, "achieved_GBps": 1000.0, "floor_fraction": 25.0 / us}}
        (run_dir / "evals" / f"{cid}-benchmark.json").write_text(json.dumps(result))
        if best is None or us < best[1]:
            best = (cid, us, speedup)
            log("best", candidate_id=cid, candidate_us=us, speedup=speedup if minimal else FLA_US / us, vs_baseline=speedup, call=call)
        log("tool_result", call=call, tool="benchmark", result={"candidate_us": us}, duration_s=5.0)
        expected["pass"] += 1
    if finish:
        log("run_finished", reason="budget exhausted", budget_used=call, best={"candidate_id": best[0]})
    text = "".join(json.dumps(e) + "\n" for e in events)
    if torn_tail:
        text += '{"seq": 999, "kind": "tool_ca'
    (run_dir / "events.jsonl").write_text(text)
    expected.update(best=best, calls=call, wall=times[-1] - times[0])
    return expected


@pytest.mark.parametrize("minimal", [False, True], ids=["full", "minimal"])
def test_summary_counts_what_the_log_says(tmp_path, minimal):
    expected = make_run(tmp_path / "r1", run_id="r1", agent="search", n_candidates=12, seed=3, torn_tail=True, minimal=minimal)
    run = summarise(tmp_path / "r1")
    counts = run.counts_by_verdict()
    assert (counts["pass"], counts["fail"]) == (expected["pass"], expected["fail"])
    assert run.failures_by_stage() == {s: expected["stages"][s] for s in ("compile", "correctness") if s in expected["stages"]}
    assert run.budget_used == expected["calls"] and run.status == "finished"
    assert run.running_s == pytest.approx(expected["wall"], abs=0.01)
    assert run.best_id == expected["best"][0] and run.best_speedup == pytest.approx(expected["best"][2])
    assert run.baseline_us == pytest.approx(BASELINE_US)
    speedups = [s for _, s, _ in run.progress]
    assert speedups == sorted(speedups)  # the best only ever improves
    assert run.best_result["timings"]["candidate_us"] == pytest.approx(expected["best"][1])


def test_report_writes_markdown_and_plots(tmp_path, capsys):
    e1 = make_run(tmp_path / "runs" / "r1", run_id="r1", agent="search", n_candidates=12, seed=3)
    make_run(tmp_path / "runs" / "r2", run_id="r2", agent="openai", n_candidates=8, seed=5, finish=False, minimal=True)
    out = tmp_path / "report"
    assert cli.main(["report", str(tmp_path / "runs" / "r1"), str(tmp_path / "runs" / "r2"), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert md in capsys.readouterr().out
    assert "## Run r1" in md and "## Run r2" in md
    assert "| r2 | kda | openai | in progress |" in md
    assert f"| pass | {e1['pass']} |" in md and f"| fail | {e1['fail']} |" in md
    assert "relative RMS error 0.31 > tolerance 0.02" in md or "exceeds shared memory" in md
    assert f"`{e1['best'][0]}`" in md and "roofline floor" in md and "baseline: fla chunk_kda" in md and "the run's baseline candidate" in md
    run = summarise(tmp_path / "runs" / "r1")
    benchmark_calls = len(run.tool_seconds["benchmark"])
    assert benchmark_calls and f"| benchmark | {benchmark_calls} | 5.0 s |" in md  # time per tool, from the log's durations
    for name in ("progress.png", "candidates-r1.png", "candidates-r2.png"):
        assert f"]({name})" in md
        png = (out / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000  # a drawn chart, not an empty canvas


def test_report_of_an_interpreter_run_leaves_out_the_roofline(tmp_path):
    make_run(tmp_path / "cpu", run_id="cpu", agent="search", n_candidates=6, seed=3, interpreter=True)
    md = write_report([tmp_path / "cpu"], tmp_path / "out").read_text()
    assert "Triton CPU interpreter" in md and "indicative only" in md
    assert "| roofline floor |" not in md and "| the run's baseline candidate | — | 400 µs | — |" in md


def test_report_lists_each_timed_case_of_a_geometric_mean_objective(tmp_path):
    expected = make_run(tmp_path / "gm", run_id="gm", agent="search", n_candidates=6, seed=3)
    cid, us, _ = expected["best"]
    path = tmp_path / "gm" / "evals" / f"{cid}-benchmark.json"
    result = json.loads(path.read_text())
    result["timings"]["cases"] = [
        {"case": "B1 T8192 H16 K128 V128", "candidate_us": us / 2, "baselines": {"fla chunk_kda": 45.0}, "baseline": "fla chunk_kda"},
        {"case": "B8 T1024 H8 K64 V64", "candidate_us": us * 2, "baselines": {"fla chunk_kda": 180.0}, "baseline": "fla chunk_kda"},
    ]
    result["roofline"]["cases"] = [{"achieved_GBps": 1234.0}, {"achieved_GBps": 567.0}]
    path.write_text(json.dumps(result))
    md = write_report([tmp_path / "gm"], tmp_path / "out").read_text()
    assert "Timed cases (the figures above are their geometric means)" in md
    assert "| B8 T1024 H8 K64 V64 |" in md and "| 1234 |" in md and "| 567 |" in md
    assert "fla chunk_kda 45 µs" in md and "fla chunk_kda 180 µs" in md


def test_report_of_a_run_that_has_timed_nothing(tmp_path):
    run_dir = tmp_path / "empty"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_text(json.dumps({"seq": 1, "time": 1.0, "run_id": "empty", "kind": "run_started",
                                                      "problem": "mla", "budget": 10}) + "\n")
    md = write_report([run_dir], tmp_path / "out").read_text()
    assert "No candidate has passed and been timed yet." in md and "| empty | mla | ? | in progress | 0/10 |" in md
    assert (tmp_path / "out" / "progress.png").stat().st_size > 5_000


def test_report_refuses_a_directory_without_a_log(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "no events.jsonl" in capsys.readouterr().err


BENCHMARKS = '''
def test_scan(benchmark):
    benchmark(sum, range(300))

def test_sort(benchmark):
    benchmark(sorted, list(range(300, 0, -1)))

def test_dropped(benchmark):
    benchmark(max, range(300))
'''


@pytest.fixture(scope="module")
def histories(tmp_path_factory) -> Path:
    """Two saved pytest-benchmark histories: one real run, and a copy edited to a later commit
    on which test_scan takes 1.5× as long, test_sort half as long and test_dropped is gone."""
    root = tmp_path_factory.mktemp("bench")
    (root / "test_w.py").write_text(BENCHMARKS)
    (root / "pytest.ini").write_text("[pytest]\n")
    store = root / "store"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:kopt", "-p", "no:cacheprovider", "test_w.py",
                           f"--benchmark-storage={store}", "--benchmark-save=before", "--benchmark-max-time=0.01"],
                          cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    (before,) = store.glob("*/0001_before.json")
    data = json.loads(before.read_text())
    data["machine_info"].update(gpu="NVIDIA H200", triton="3.6.0")
    before.write_text(json.dumps(data))
    data["datetime"] = "2999-01-01T00:00:00"
    data["commit_info"].update(id="f" * 40, dirty=False)
    data["machine_info"]["triton"] = "3.7.0"
    factors = {"test_scan": 1.5, "test_sort": 0.5}
    data["benchmarks"] = [b for b in data["benchmarks"] if b["name"] != "test_dropped"]
    for bench in data["benchmarks"]:
        stats = bench["stats"]
        for key in ("min", "max", "mean", "stddev", "median", "iqr", "q1", "q3", "ld15iqr", "hd15iqr", "total"):
            stats[key] *= factors[bench["name"]]
        stats["ops"] /= factors[bench["name"]]
    (before.parent / "0002_after.json").write_text(json.dumps(data))
    return store


def _row(text: str, name: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"test_w.py::{name}"))


def test_compare_flags_the_regression(histories, capsys):
    assert cli.main(["compare", "--storage", str(histories), "--fail"]) == 1  # default: the two latest runs
    text = capsys.readouterr().out
    assert "0001_before:" in text and "0002_after:" in text and "triton 3.7.0" in text and "commit ffffffffff" in text
    assert "benchmark: 3 tests, 2 sources" in text  # pytest-benchmark's own side-by-side table
    assert _row(text, "test_scan").endswith("1.500  REGRESSION +50.0%")
    assert _row(text, "test_sort").endswith("0.500  faster -50.0%")
    assert _row(text, "test_dropped").endswith("n/a  missing")
    assert "1 of 3 benchmarks regressed beyond median 10% against 0001_before." in text


def test_compare_takes_the_first_run_named_as_reference(histories, capsys):
    assert cli.main(["compare", "--storage", str(histories), "0002", "0001", "--threshold", "min:60%", "-k", "scan or sort"]) == 0
    text = capsys.readouterr().out
    assert "Time ratio = run / 0002_after (min;" in text
    assert _row(text, "test_scan").endswith("0.667")  # within 60%: no flag
    assert _row(text, "test_sort").endswith("2.000  REGRESSION +100.0%")
    assert "test_dropped" not in text


def test_compare_needs_a_storage_with_two_runs(histories, tmp_path, capsys):
    assert cli.main(["compare", "--storage", str(tmp_path / "absent")]) == 2
    assert "no benchmark storage at" in capsys.readouterr().err
    assert not (tmp_path / "absent").exists()  # looking does not create it
    assert cli.main(["compare", "--storage", str(histories), "0001"]) == 2
    assert "need at least two saved runs" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["report", "compare"])
def test_help_renders(command, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    assert done.value.code == 0 and f"usage: kopt {command}" in capsys.readouterr().out


def test_a_resumed_run_counts_its_running_time_and_its_extended_budget(tmp_path):
    """A run stopped, resumed an hour later with a larger budget: the hour is not running time."""
    run_dir = tmp_path / "r"
    run_dir.mkdir()

    def event(seq, seconds, kind, **fields):
        stamp = datetime.fromtimestamp(1_700_000_000 + seconds, timezone.utc).isoformat(timespec="milliseconds")
        return {"seq": seq, "time": stamp, "run_id": "r", "kind": kind, **fields}

    events = [event(1, 0, "run_started", problem="kda", budget=30, agent={"name": "search"}),
              event(2, 100, "run_interrupted", reason="stopped by Ctrl-C", budget_used=12, budget=30),
              event(3, 3700, "run_resumed", budget_used=12, budget=45),
              event(4, 3750, "run_finished", reason="budget exhausted", budget_used=45, budget=45)]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    run = summarise(run_dir)
    assert run.running_s == pytest.approx(150.0) and run.resumes == 1
    assert (run.budget_used, run.budget, run.status) == (45, 45, "finished")


# ---- kopt compare on the benchmark JSONs of record (a fresh clone has no storage) -------------
RECORD_BEFORE = REPO / "results" / "h200-2026-11-30m" / "call4"
RECORD_AFTER = REPO / "results" / "h200-2026-11-30n" / "call3"


def test_compare_takes_the_committed_benchmark_jsons_as_files_or_folders(capsys):
    """What the README tells a fresh clone to type: no storage, the JSONs of record named directly,
    as folders or files inside the packed session folders (read from the archives)."""
    with runstore.readable(RECORD_BEFORE) as folder:
        (before,) = [RECORD_BEFORE / f.name for f in folder.glob("*.json")]
    with runstore.readable(RECORD_AFTER) as folder:
        (after,) = [RECORD_AFTER / f.name for f in folder.glob("*.json")]
    for args in ([str(RECORD_BEFORE), str(RECORD_AFTER)], [str(before), str(after)]):
        assert cli.main(["compare", "--storage", str(REPO / "no-such-storage"), *args]) == 0
        captured = capsys.readouterr()
        assert "ERROR" not in captured.out + captured.err
        assert "kda-B1_T8192_H16_K128_V128_+hT-candidate:best" in captured.out and "0.788  faster -21.2%" in captured.out
        # a file from before the three figures shows its one figure (the median) as device time
        assert "-/318.8/-" in captured.out and "-/251.1/-" in captured.out


def test_compare_without_storage_or_runs_names_a_command_that_works(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert cli.main(["compare", "--storage", str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err
    example = err.split("e.g. ")[1].strip()
    assert example.startswith("kopt compare ") and cli.main(example.split()[1:]) == 0


def test_compare_exits_non_zero_on_its_own_errors_and_prints_no_stray_error(tmp_path, capsys):
    kda, mla = REPO / "results" / "h200-2026-11-30d" / "bench-kda.json", REPO / "results" / "h200-2026-11-30d" / "bench-mla.json"
    assert cli.main(["compare", str(kda), str(mla)]) == 2  # two runs that share no benchmark
    captured = capsys.readouterr()
    assert "share no benchmark" in captured.err and "ERROR" not in captured.out + captured.err
    (tmp_path / "other.json").write_text('{"not": "a benchmark"}')
    assert cli.main(["compare", str(kda), str(tmp_path / "other.json")]) == 2
    assert "is not a pytest-benchmark JSON file" in capsys.readouterr().err
    assert cli.main(["compare", str(kda)]) == 2
    assert "need at least two" in capsys.readouterr().err


def test_compare_shows_the_three_figures_where_the_json_has_them(histories, tmp_path, capsys):
    (before,) = histories.glob("*/0001_before.json")
    after = histories.parent / "figures.json"
    data = json.loads(before.read_text())
    for bench in data["benchmarks"]:
        bench["extra_info"]["figures"] = {"eager": 12.5, "device": 10.25, "graph": None}
    after.write_text(json.dumps(data))
    assert cli.main(["compare", str(before), str(after)]) == 0
    out = capsys.readouterr().out
    assert _row(out.split("Figures:")[1], "test_scan").endswith("12.5/10.2/-")
