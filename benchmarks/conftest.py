"""The benchmark suite: every problem's headline shapes, timed in one pytest-benchmark session.

Run on a GPU (on a CPU these are skipped: interpreter timings mean nothing at these sizes):

    pytest benchmarks --benchmark-storage=file://results/benchmarks --benchmark-autosave
    pytest benchmarks -k kda --benchmark-compare --benchmark-compare-fail=median:10%

Each test checks one implementation on one headline case and reports its figure on one timer (the judge's device
timer: CUDA events, L2 flushed before every call; eager; graph), warm-up rounds outside the figure. A case's
implementations of one timer are timed together, turn by turn in a shuffled order, by the first of their tests
(``KOPT_BENCH_INTERLEAVE=0``: each test alone). Implementations: the
problem's baselines (e.g. flash-linear-attention's chunk_kda, eager bf16 PyTorch), the
baseline candidate every run starts from, and the promoted winner in kernels/best/. Tests of
one case share a pytest-benchmark group, so its table shows them side by side; the terminal
summary adds each one's speedup over the group's first baseline, from this run alone.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from pytest_kopt import interpret

interpret.configure()

STORAGE = "file://results/benchmarks"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Keep benchmark histories under results/benchmarks (committed), not .benchmarks/, unless
    --benchmark-storage says otherwise; so `--benchmark-compare` finds the saved history."""
    if config.getoption("benchmark_storage", None) == "file://./.benchmarks":
        config.option.benchmark_storage = STORAGE


def pytest_benchmark_update_machine_info(config, machine_info):  # noqa: ANN001
    """Record the GPU and the software stack, so histories from different cards never mix unseen."""
    import triton

    machine_info["torch"] = torch.__version__
    machine_info["triton"] = triton.__version__
    if torch.cuda.is_available():
        machine_info["gpu"] = torch.cuda.get_device_name()
        machine_info["cuda"] = torch.version.cuda


def pytest_benchmark_update_commit_info(config, commit_info):  # noqa: ANN001
    """Name the timed files by content: on the lent GPU machine the repository's git metadata is a
    snapshot from the session's start (the JSON said ``5bbcc4f (dirty)`` for later commits), so
    the commit id alone does not say which kernels were timed."""
    import hashlib

    from pytest_kopt import KERNELS_DIR

    for path in sorted((KERNELS_DIR / "best").glob("*.py")):
        if path.name != "__init__.py":
            commit_info[f"sha256:kernels/best/{path.name}"] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    # the files timed beside the bests (KOPT_BENCH_EXTRA), so a file promoted after the run is found as the one timed
    from pathlib import Path

    from pytest_kopt import bench_extra
    from pytest_kopt.problems import available_problems

    extras = bench_extra.parse(os.environ.get("KOPT_BENCH_EXTRA", ""), tuple(available_problems()), Path.cwd())
    commit_info.update(bench_extra.digests(extras, Path.cwd()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """Rewrite --benchmark-json after every test, not only at the session's end: a device command
    stopped at its time limit lost a whole six-shape JSON once (session 5, call 4), though twenty
    of its tests had finished. The file is replaced atomically, so a kill mid-write leaves the last one."""
    yield
    save_json_so_far(item.config)


def save_json_so_far(config: pytest.Config) -> None:
    """The JSON pytest-benchmark writes at the session's end, from the benchmarks finished so far."""
    bench_session = getattr(config, "_benchmarksession", None)
    if bench_session is None or not bench_session.json or not bench_session.benchmarks:
        return
    hook = config.hook
    commit_info = hook.pytest_benchmark_generate_commit_info(config=config)
    hook.pytest_benchmark_update_commit_info(config=config, commit_info=commit_info)
    output = hook.pytest_benchmark_generate_json(config=config, benchmarks=bench_session.benchmarks, include_data=True,
                                                 machine_info=bench_session.get_machine_info(), commit_info=commit_info)
    hook.pytest_benchmark_update_json(config=config, benchmarks=bench_session.benchmarks, output_json=output)
    path = str(bench_session.json)
    with open(path + ".partial", "w", encoding="utf-8") as handle:
        json.dump(output, handle, indent=1, default=str)
    os.replace(path + ".partial", path)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="benchmarks need a CUDA GPU")
    for item in items:
        if "benchmarks" in str(item.fspath):
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ANN001
    session = getattr(config, "_benchmarksession", None)
    if session is None or not session.benchmarks:
        return
    groups: dict[str, list] = {}
    for bench in session.benchmarks:
        groups.setdefault(bench.group, []).append(bench)
    terminalreporter.section("speedups (median, this run)")
    for group, benches in groups.items():
        base = min(benches, key=lambda b: b.extra_info.get("order", 99))
        terminalreporter.write_line(f"{group}")
        for bench in sorted(benches, key=lambda b: b.stats.median):
            median_us = bench.stats.median * 1e6
            ratio = base.stats.median / bench.stats.median
            floor = bench.extra_info.get("floor_us")
            floor_text = f"  {floor / median_us:6.1%} of floor" if floor else ""
            err = bench.extra_info.get("rel_rms")
            err_text = f"  err {err:.2g}" if err is not None else ""
            # the host outlasted the GPU's wait: the figure includes idle time, not only the kernels'
            bound_text = "  HOST-BOUND" if bench.extra_info.get("host_bound") else ""
            terminalreporter.write_line(
                f"  {bench.extra_info.get('impl', bench.name):28s} {median_us:12.1f} us  {ratio:7.2f}x vs {base.extra_info.get('impl')}{floor_text}{err_text}{bound_text}"
            )
