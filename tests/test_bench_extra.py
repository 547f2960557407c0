"""KOPT_BENCH_EXTRA: the files timed beside the promoted bests. A wrong entry stops the benchmarks before anything
runs (session 27 lost a comparison to ';' where ',' was read, 24 tests failing one by one on the GPU); the run's JSON
names each file by its sha256."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_kopt import bench_extra

ROOT = Path(__file__).resolve().parent.parent
PROBLEMS = ("kda", "mla", "mla-paged")


def test_entries_by_comma_or_semicolon(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("x = 2\n")
    assert bench_extra.parse("mla-paged=a.py;mla=b.py", PROBLEMS, tmp_path) == [("mla-paged", "a.py"), ("mla", "b.py")]
    assert bench_extra.parse(" kda = a.py , ", PROBLEMS, tmp_path) == [("kda", "a.py")]
    assert bench_extra.parse("", PROBLEMS, tmp_path) == []
    assert bench_extra.digests([("kda", "a.py")], tmp_path) == {"sha256:a.py": hashlib.sha256(b"x = 1\n").hexdigest()[:16]}


@pytest.mark.parametrize("text, message", [
    ("kda=missing.py", "no file missing.py"),
    ("mla-paged=a.py;mla=b.py;mla=a.py;mla", "write PROBLEM=PATH"),
    ("prefill=a.py", "no benchmarked problem 'prefill'"),
    ("kda=", "write PROBLEM=PATH"),
])
def test_a_wrong_entry_is_named(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("x = 2\n")
    with pytest.raises(ValueError, match=message):
        bench_extra.parse(text, PROBLEMS, tmp_path)


def _collect(tmp_path: Path, extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KOPT_BENCH_EXTRA": extra}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                           "benchmarks/test_headline.py", "-k", "kda and B1_T8192_H16"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_the_benchmarks_stop_at_collection_on_a_wrong_entry(tmp_path: Path) -> None:
    done = _collect(tmp_path, "kda=no/such/file.py")
    assert done.returncode != 0 and "KOPT_BENCH_EXTRA entry 'kda=no/such/file.py': no file no/such/file.py" in done.stdout + done.stderr
    good = _collect(tmp_path, "kda=kernels/best/kda.py")
    assert good.returncode == 0 and "candidate:file=kernels/best/kda.py" in good.stdout
