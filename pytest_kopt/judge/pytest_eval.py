"""``pytest --kopt-problem=P --kopt-candidate=FILE``: the judge as a pytest session.

The session judges the candidate and nothing else: ordinary test collection is switched off
and one item per stage (policy, compile, correctness, benchmark, profile) is collected. All
items share one evaluation; an item passes when its stage passed, fails with the judge's
reasons at the stage that failed, and is skipped after it. The benchmark item hands the
timings to pytest-benchmark, so ``--benchmark-json``/``--benchmark-autosave`` and its table
work as for any benchmark test. ``--kopt-quick`` and ``--kopt-json`` are honoured.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from . import STAGES, evaluate, summary


class JudgeFailure(Exception):
    """The candidate failed at this item's stage."""


class EvalPlugin:
    def __init__(self, config: pytest.Config) -> None:
        from ..plugin import option

        self.config = config
        self.problem = config.getoption("kopt_problem")
        self.candidate = config.getoption("kopt_candidate")
        if not self.problem or not self.candidate:
            raise pytest.UsageError("--kopt-problem and --kopt-candidate go together: name the problem and the candidate file")
        self.quick = bool(config.getoption("kopt_quick"))
        self.json_out = config.getoption("kopt_json")
        self.timeout_s = float(option(config, "kopt_eval_timeout") or 900)
        self.stages = STAGES[:-1] if self.quick else STAGES
        self._result: dict | None = None

    def result(self) -> dict:
        if self._result is None:
            self._result = evaluate(self.problem, self.candidate, upto=self.stages[-1], quick=self.quick,
                                    timeout_s=self.timeout_s, json_out=self.json_out)
        return self._result

    # ---- collection: the judge's items only ---------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_ignore_collect(self, collection_path: Path, config: pytest.Config) -> bool:
        return True

    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config, items: list) -> None:
        label = f"kopt[{self.problem}:{Path(self.candidate).name}]"
        items[:] = [JudgeItem.from_parent(session, name=f"{label}::{stage}", plugin=self, stage=stage) for stage in self.stages]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self._result is not None:
            terminalreporter.section("kopt judge")
            terminalreporter.write_line(summary(self._result))


class JudgeItem(pytest.Item):
    def __init__(self, *, plugin: EvalPlugin, stage: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plugin = plugin
        self.stage = stage

    def runtest(self) -> None:
        result = self.plugin.result()
        reached = STAGES.index(result.get("stage") or "policy")
        mine = STAGES.index(self.stage)
        if result.get("verdict") != "pass":
            if mine == reached:
                raise JudgeFailure("\n".join(result.get("reasons") or ["failed (no reason given)"]))
            if mine > reached:
                pytest.skip(f"not reached: the candidate failed at {result.get('stage')}")
        if self.stage == "benchmark" and result.get("benchmarks"):
            self._hand_to_pytest_benchmark(result["benchmarks"])

    def _hand_to_pytest_benchmark(self, entries: list[dict]) -> None:
        """Register the child's measurements with pytest-benchmark's session (table, JSON, autosave)."""
        session = getattr(self.config, "_benchmarksession", None)
        if session is None or getattr(session, "disabled", False):
            return
        from pytest_benchmark.fixture import BenchmarkFixture

        for entry in entries:
            node = SimpleNamespace(name=entry["name"], nodeid=f"{self.nodeid}::{entry['name']}")
            options = dict(session.options)
            fixture = BenchmarkFixture(node, add_stats=session.benchmarks.append, logger=session.logger, warner=self.warn,
                                       disabled=False, **dict(options, group=entry.get("group")))
            fixture.extra_info.update(entry.get("extra_info") or {})
            stats = fixture._make_stats(1)
            stats.options["timer"] = (entry.get("options") or {}).get("timer", "unknown")
            for duration in entry["stats"]["data"]:
                stats.update(duration)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, JudgeFailure):
            return f"{self.stage} failed:\n{excinfo.value}"
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return Path(self.plugin.candidate), None, f"{self.stage} of {self.plugin.candidate}"

