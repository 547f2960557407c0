"""`kopt status`: results/STATUS.md from the runs and the benchmark JSONs, packed or not.

A small results tree is built the way the loop and `pytest benchmarks` write theirs; the page
must name the run that found the promoted kernel, the JSON that timed that very file, and the
figures in it. The last test holds the committed results/STATUS.md to what the evidence says now.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pytest_kopt import REPO_ROOT, cli, runstore
from pytest_kopt.status import render

BEST_SOURCE = "def kernel(q, k, v, g, beta):\n    return q\n"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write_run(folder: Path, best_id: str, *, best_us: float, baseline_us: float) -> None:
    events = [
        {"kind": "run_started", "problem": "kda", "objective": {"baseline_candidate": "base00000000", "baseline_us": baseline_us, "timed": "B1 T64 H2"}},
        {"kind": "candidate", "candidate_id": "other0000000"},
        {"kind": "best", "candidate_id": "other0000000", "candidate_us": best_us * 2, "call": 3},
        {"kind": "candidate", "candidate_id": best_id},
        {"kind": "best", "candidate_id": best_id, "candidate_us": best_us, "call": 7},
        {"kind": "run_finished", "budget_used": 9},
    ]
    folder.mkdir(parents=True)
    (folder / "events.jsonl").write_text("".join(json.dumps({"seq": i + 1, **e}) + "\n" for i, e in enumerate(events)))
    (folder / "best.json").write_text(json.dumps({"candidate_id": best_id, "evaluation": {"timings": {"timer": "cuda-events"}}}))
    (folder / "candidates").mkdir()
    (folder / "candidates" / f"{best_id}.py").write_text(BEST_SOURCE)


def bench_json(path: Path, file_sha: str, when: str, best_us: float, fla_us: float, cases: tuple[str, ...] = ("B1 T64 H2",)) -> None:
    def item(impl: str, order: int, us: float, rel_rms: float, case: str) -> dict:
        return {"params": {"problem_name": "kda", "impl": impl}, "group": f"kda {case}",
                "extra_info": {"case": case, "order": order, "rel_rms": rel_rms},
                "options": {"timer": "EventClock"}, "stats": {"median": us * 1e-6}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "machine_info": {"gpu": "NVIDIA H200"}, "datetime": when,
        "commit_info": {"sha256:kernels/best/kda.py": file_sha[:16]},
        "benchmarks": [it for case in cases for it in (item("baseline:fla-chunk_kda", 0, fla_us, 4e-3, case),
                                                       item("candidate:best", 20, best_us, 3.2e-3, case))],
    }))


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    results, kernels = tmp_path / "results", tmp_path / "kernels"
    (kernels / "best").mkdir(parents=True)
    (kernels / "best" / "kda.py").write_text(BEST_SOURCE)
    file_sha = sha(BEST_SOURCE)
    write_run(results / "runs" / "kda-x", file_sha[:12], best_us=250.0, baseline_us=5000.0)
    runstore.pack(results / "runs" / "kda-x")
    session = results / "h200-day"
    (session / "README.md").parent.mkdir(parents=True)
    (session / "README.md").write_text("# a session\n")
    bench_json(session / "call1" / "bench-old.json", sha("an earlier best\n"), "2026-11-30T10:00:00+00:00", 300.0, 600.0)
    bench_json(session / "call2" / "bench-kda.json", file_sha, "2026-11-30T09:00:00+00:00", 240.0, 612.0)
    runstore.pack(session)
    return results, kernels


def test_status_names_the_run_and_the_json_that_timed_this_file(tree: tuple[Path, Path]) -> None:
    results, kernels = tree
    page = render(results, kernels)
    cid = sha(BEST_SOURCE)[:12]
    assert f"| kda | `{cid}` | `kda-x` | `results/h200-day/call2/bench-kda.json` |" in page  # the JSON of this file, not the newer one
    assert "`results/runs/kda-x.tar.xz`), tool call 7 of 9." in page
    assert "The run's figure: 250.0 µs on B1 T64 H2 (judge timer: cuda-events)" in page
    assert "baseline candidate `base00000000` 5,000.0 µs in the same objective (20.0×)" in page
    assert "packed in `results/h200-day.tar.xz`" in page and "2026-11-30 09:00 UTC, NVIDIA H200" in page
    assert "Timer: EventClock (the judge's EventClock" in page
    assert "| B1 T64 H2 | 612.0 | 240.0 | **2.55×** | 3.20e-03 |" in page
    assert "earlier" not in page


def test_a_newer_check_at_fewer_shapes_is_not_the_record(tmp_path: Path) -> None:
    """A short run that times the promoted file at a few shapes (a check of the benchmark itself, say) is newer than
    the whole benchmark, but the record stays the JSON that timed the file at the most shapes."""
    results, kernels = tmp_path / "results", tmp_path / "kernels"
    (kernels / "best").mkdir(parents=True)
    (kernels / "best" / "kda.py").write_text(BEST_SOURCE)
    bench_json(results / "h200-a" / "bench-whole.json", sha(BEST_SOURCE), "2026-11-30T09:00:00+00:00", 240.0, 612.0,
               cases=("B1 T64 H2", "B2 T64 H2", "B4 T64 H2"))
    bench_json(results / "h200-b" / "bench-check.json", sha(BEST_SOURCE), "2026-11-30T12:00:00+00:00", 250.0, 610.0)
    page = render(results, kernels)
    assert "`results/h200-a/bench-whole.json`" in page and "bench-check" not in page
    bench_json(results / "h200-c" / "bench-whole-again.json", sha(BEST_SOURCE), "2026-11-30T13:00:00+00:00", 241.0, 611.0,
               cases=("B1 T64 H2", "B2 T64 H2", "B4 T64 H2"))
    assert "`results/h200-c/bench-whole-again.json`" in render(results, kernels)  # of equally whole ones, the newest


def test_status_says_when_no_json_has_timed_the_promoted_file(tree: tuple[Path, Path]) -> None:
    results, kernels = tree
    (kernels / "best" / "kda.py").write_text(BEST_SOURCE + "# re-rendered\n")
    page = render(results, kernels)
    assert "no committed run under `results/runs/` holds this candidate" in page
    assert "`results/h200-day/call1/bench-old.json` (an earlier file)" in page  # the newest timing of any best of kda
    assert "It timed an earlier `kernels/best/kda.py`" in page and "run `pytest benchmarks` on a GPU" in page


def test_status_check_fails_on_a_stale_page(tree: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    results, kernels = tree
    args = ["status", "--results", str(results), "--kernels", str(kernels)]
    assert cli.main(args + ["--check"]) == 1 and "regenerate it with `kopt status`" in capsys.readouterr().err
    assert cli.main(args) == 0 and (results / "STATUS.md").read_text() == render(results, kernels)
    assert cli.main(args + ["--check"]) == 0
    (results / "STATUS.md").write_text((results / "STATUS.md").read_text().replace("2.55×", "2.60×"))
    assert cli.main(args + ["--check"]) == 1


def test_the_committed_status_page_is_current(capsys: pytest.CaptureFixture[str]) -> None:
    """results/STATUS.md is what `kopt status` says now: after a promotion or a new benchmark,
    run `kopt status` and commit the page with the evidence."""
    assert cli.main(["status", "--results", str(REPO_ROOT / "results"), "--check"]) == 0, capsys.readouterr().err


def test_status_finds_the_run_of_a_re_rendered_best_through_its_provenance(tree: tuple[Path, Path]) -> None:
    """A best rendered again from its family is not the run's candidate byte for byte; its
    provenance JSON names the candidate the run found, and the page says so."""
    results, kernels = tree
    (kernels / "best" / "kda.py").write_text(BEST_SOURCE + "# re-rendered\n")
    run_cid = sha(BEST_SOURCE)[:12]
    (kernels / "best" / "kda.json").write_text(json.dumps({"problem": "kda", "candidate_id": run_cid, "run": "results/runs/kda-x"}))
    page = render(results, kernels)
    assert f"| `kda-x` |" in page and "no committed run" not in page
    assert f"This file was rendered again from the run's candidate `{run_cid}`" in page
    assert "tool call 7 of 9." in page


def test_status_shows_the_eager_host_share_and_not_the_device_timers(tmp_path: Path) -> None:
    """The eager timer's host_us (the best's calls back to back) gets a column; the device timer's
    host_us (one call after a flush, noisy) does not appear in it."""
    results, kernels = tmp_path / "results", tmp_path / "kernels"
    (kernels / "best").mkdir(parents=True)
    (kernels / "best" / "kda.py").write_text(BEST_SOURCE)

    def item(impl: str, metric: str, us: float, host_us: float) -> dict:
        return {"params": {"problem_name": "kda", "impl": impl}, "options": {"timer": "PerCall"},
                "extra_info": {"case": "B1 T64 H2", "metric": metric, "order": 0 if impl.startswith("baseline") else 20,
                               "rel_rms": 3e-3, "host_us": host_us}, "stats": {"median": us * 1e-6}}
    folder = results / "h200-day"
    folder.mkdir(parents=True)
    (folder / "bench.json").write_text(json.dumps({
        "machine_info": {"gpu": "NVIDIA H200"}, "datetime": "2026-11-30T09:00:00+00:00",
        "commit_info": {"sha256:kernels/best/kda.py": sha(BEST_SOURCE)[:16]},
        "benchmarks": [item("baseline:fla-chunk_kda", "eager", 600.0, 550.0), item("candidate:best", "eager", 250.0, 57.25),
                       item("baseline:fla-chunk_kda", "device", 590.0, 700.0), item("candidate:best", "device", 245.0, 191.0)],
    }))
    page = render(results, kernels)
    assert "host µs a call (best, eager) |" in page
    assert "| B1 T64 H2 [eager] | 600.0 | 250.0 | **2.40×** | 3.00e-03 | 57.2 |" in page
    assert "| B1 T64 H2 [device] | 590.0 | 245.0 | **2.41×** | 3.00e-03 |  |" in page
    assert "191.0" not in page and "550.0" not in page


def test_a_file_promoted_after_the_run_that_timed_it_beside_the_best(tmp_path: Path) -> None:
    """A candidate timed as `file=...` (its sha256 in commit_info) and promoted afterwards: that JSON is its record,
    and its row gives the speed, not the best of then; a newer JSON that timed only the old best is not the record."""
    results, kernels = tmp_path / "results", tmp_path / "kernels"
    (kernels / "best").mkdir(parents=True)
    (kernels / "best" / "kda.py").write_text(BEST_SOURCE)

    def item(impl: str, order: int, us: float) -> dict:
        return {"params": {"problem_name": "kda", "impl": impl}, "options": {"timer": "EventClock"},
                "extra_info": {"case": "B1 T64 H2", "order": order, "rel_rms": 3e-3}, "stats": {"median": us * 1e-6}}
    folder = results / "h200-day"
    folder.mkdir(parents=True)
    (folder / "call1.json").write_text(json.dumps({
        "machine_info": {"gpu": "NVIDIA H200"}, "datetime": "2026-11-30T09:00:00+00:00",
        "commit_info": {"sha256:kernels/best/kda.py": sha("the old best\n")[:16], "sha256:bench_extra/new.py": sha(BEST_SOURCE)[:16]},
        "benchmarks": [item("baseline:fla-chunk_kda", 0, 600.0), item("candidate:best", 20, 300.0),
                       item("candidate:file=bench_extra/new.py", 30, 200.0)],
    }))
    (folder / "call2.json").write_text(json.dumps({
        "machine_info": {"gpu": "NVIDIA H200"}, "datetime": "2026-11-30T10:00:00+00:00",
        "commit_info": {"sha256:kernels/best/kda.py": sha("the old best\n")[:16]},
        "benchmarks": [item("baseline:fla-chunk_kda", 0, 600.0), item("candidate:best", 20, 300.0)],
    }))
    page = render(results, kernels)
    assert "`results/h200-day/call1.json` |" in page and "(an earlier file)" not in page
    assert "It timed this file as `file=bench_extra/new.py` (the same sha256)" in page
    assert "| B1 T64 H2 | 600.0 | 300.0 | 200.0 | **3.00×** | 3.00e-03 |" in page
    assert "rel. RMS error (this file)" in page and "It timed an earlier" not in page
