"""The one test ``pytest --kopt-optimize=PROBLEM`` collects: run the loop (see loop_plugin)."""

from __future__ import annotations

from typing import Any

import pytest


def test_optimize(request: pytest.FixtureRequest, kopt_run: Any, kopt_agent: Any, kopt_problem: Any, kopt_evaluate: Any) -> None:
    """Run the optimization loop; pass when it finished with a verified best candidate."""
    plugin = request.config.pluginmanager.get_plugin("kopt-optimize")
    outcome = plugin.execute(kopt_run, kopt_agent, kopt_problem, kopt_evaluate)
    assert outcome.status == "finished", f"the run did not finish: {outcome.reason}"
    assert outcome.best is not None, f"no candidate passed the judge in {outcome.budget_used} tool calls (see {outcome.run_dir}/events.jsonl)"
