"""benchmarks/conftest.py rewrites --benchmark-json after every test, so a benchmark session killed
at a device command's time limit keeps what it finished (session 5 lost a six-shape JSON that way)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CONFTEST = "from benchmarks.conftest import pytest_benchmark_update_commit_info, pytest_runtest_teardown  # noqa: F401\n"
TESTS = '''
import os
import signal


def test_finishes(benchmark):
    benchmark.extra_info["impl"] = "first"
    benchmark.pedantic(lambda: sum(range(1000)), rounds=5)


def test_killed(benchmark):
    benchmark.pedantic(lambda: sum(range(1000)), rounds=5)
    os.kill(os.getpid(), signal.SIGKILL)  # as `timeout -k` does when the session overruns
'''


def test_a_killed_session_keeps_the_benchmarks_it_finished(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_two.py").write_text(TESTS)
    out = tmp_path / "bench.json"
    (tmp_path / "extra.py").write_text("def kernel():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "KOPT_BENCH_EXTRA": "kda=extra.py"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--benchmark-json={out}", "test_two.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0  # killed in the second test: pytest-benchmark itself wrote nothing
    saved = json.loads(out.read_text())
    names = [b["name"] for b in saved["benchmarks"]]
    assert names[0] == "test_finishes" and saved["benchmarks"][0]["extra_info"]["impl"] == "first"
    assert saved["benchmarks"][0]["stats"]["rounds"] == 5
    assert any(key.startswith("sha256:kernels/best/") for key in saved["commit_info"])  # the suite's own hooks ran
    assert saved["commit_info"]["sha256:extra.py"] == hashlib.sha256((tmp_path / "extra.py").read_bytes()).hexdigest()[:16]
    assert not list(tmp_path.glob("*.partial"))
