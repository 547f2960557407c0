"""``pytest --kopt-optimize=PROBLEM``: the optimization loop as a single pytest item.

plugin.py registers ``OptimizePlugin`` when ``--kopt-optimize`` is given. It replaces collection
with the one test in loop_item.py (``test_optimize``), so the loop runs inside pytest with its fixtures:

- ``kopt_run``: the resolved ``RunOptions`` (problem, budget, run dir, seed, agent, ...);
- ``kopt_problem``: the ``Problem``; ``kopt_evaluate``: the judge's ``evaluate``;
- ``kopt_agent``: the agent named by ``--kopt-agent`` (search, openai, replay).

Any of them can be overridden in a ``conftest.py`` (e.g. your own agent as ``kopt_agent``).
Each tool call prints one line through the terminal reporter, also with output capture on;
a summary table follows the run. The test passes when the run finished with a verified best.
An error that marks itself ``resumable`` (the LLM agent's ``EndpointError``) fails the test
with one line saying how to continue the run, not a traceback.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from .plugin import option
from .progress import Progress, summary_lines
from .run import DEFAULT_RESULTS_DIR, Run, RunError, RunOptions, resolve, resume_command


class OptimizePlugin:
    """Collects the loop item, provides its fixtures, prints progress and the summary."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.lines: list[str] = []
        config.pluginmanager.register(sys.modules[__name__], "kopt-optimize-fixtures")
        try:
            self.options = resolve(self.read_options(config))
        except RunError as exc:
            raise pytest.UsageError(str(exc)) from None

    @staticmethod
    def read_options(config: pytest.Config) -> RunOptions:
        run_dir = config.getoption("kopt_run_dir")
        resume = bool(config.getoption("kopt_resume"))
        budget, more = _budget(config.getoption("kopt_budget"))
        return RunOptions(
            problem=config.getoption("kopt_optimize"),
            budget=budget,
            budget_more=more,
            run_dir=Path(run_dir) if run_dir else None,
            resume=resume,
            # on resume the log's agent and metric, unless the command line names them
            agent=config.getoption("kopt_agent") or (None if resume else option(config, "kopt_agent")),
            metric=config.getoption("kopt_metric") or (None if resume else option(config, "kopt_metric")),
            seed=config.getoption("kopt_seed"),
            eval_timeout=float(option(config, "kopt_eval_timeout")),
            min_gain=_fraction(option(config, "kopt_min_gain"), "--kopt-min-gain"),
            promote=config.getoption("kopt_promote"),
            retract=(config.getoption("kopt_retract"), config.getoption("kopt_retract_reason") or "")
            if config.getoption("kopt_retract") else None,
            results_dir=config.rootpath / DEFAULT_RESULTS_DIR,
            workers=_whole(option(config, "kopt_workers"), "--kopt-workers"),
            executor=str(option(config, "kopt_executor")).strip() or "local",
            ray_address=str(option(config, "kopt_ray_address") or "").strip() or None,
        )

    # ---- collection: exactly one item ------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> bool:
        from . import loop_item

        session.perform_collect([str(Path(loop_item.__file__).resolve())])
        return True

    # ---- output -------------------------------------------------------------------------------
    def write(self, line: str) -> None:
        """One line on the terminal, past pytest's output capture."""
        manager = self.config.pluginmanager
        reporter = manager.getplugin("terminalreporter")
        capture = manager.getplugin("capturemanager")
        if reporter is None:
            print(line, file=sys.__stdout__, flush=True)
        elif capture is None:
            reporter.write_line(line)
        else:
            with capture.global_and_fixture_disabled():
                reporter.write_line(line)

    def execute(self, options: RunOptions, agent: Any, problem: Any, evaluate: Any) -> Any:
        progress = Progress(self.write)
        # the log names the agent that ran and its settings (an agent without ``settings`` records none)
        options = replace(options, agent=getattr(agent, "name", None) or options.agent, agent_settings=dict(getattr(agent, "settings", None) or {}))
        try:
            with Run(options, problem=problem, evaluate=evaluate, progress=progress) as run:
                try:
                    outcome = run.execute(agent)
                finally:
                    progress.close()
                    if run.outcome is not None:
                        self.lines = summary_lines(run.tools, run.outcome)
        except RunError as exc:
            raise pytest.fail.Exception(str(exc), pytrace=False) from None  # the message alone, not the chained error
        except Exception as exc:
            if not getattr(exc, "resumable", False):
                raise
            message = " ".join(str(exc).split())  # one line: the log's run_interrupted has the details
            raise pytest.fail.Exception(f"{message}; continue with: {resume_command(options.problem, options.run_dir)}", pytrace=False) from None
        except KeyboardInterrupt:
            pytest.exit(f"kopt run interrupted; continue it with: {resume_command(options.problem, options.run_dir)}", returncode=pytest.ExitCode.INTERRUPTED)
        return outcome

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.lines:
            terminalreporter.section("kopt optimize")
            for line in self.lines:
                terminalreporter.write_line(line)


def _budget(text: str | None) -> tuple[int | None, int | None]:
    """(total, more) from --kopt-budget: "N" is the run's total, "+N" N calls more than it has used."""
    if text is None:
        return None, None
    raw = str(text).strip()
    try:
        value = int(raw)
    except ValueError:
        raise RunError(f"--kopt-budget must be a whole number of tool calls (N, the run's total) or +N (N more), got {text!r}") from None
    if value < 0:
        raise RunError(f"--kopt-budget must be 0 or more tool calls, got {value}")
    return (None, value) if raw.startswith("+") else (value, None)


def _whole(text: str, name: str) -> int:
    """A whole number of at least 1 from an option's text, or a RunError that names the option."""
    try:
        value = int(str(text).strip())
    except (TypeError, ValueError):
        raise RunError(f"{name} must be a whole number (1 or more), got {text!r}") from None
    if value < 1:
        raise RunError(f"{name} must be 1 or more, got {value}")
    return value


def _fraction(text: str, name: str) -> float:
    """A fraction in [0, 1) from an option's text, or a RunError that names the option."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise RunError(f"{name} must be a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise RunError(f"{name} must be in [0, 1), got {value}")
    return value


# ---- fixtures (module level, so a conftest.py overrides any of them) ---------------------------
def _plugin(config: pytest.Config) -> OptimizePlugin:
    return config.pluginmanager.get_plugin("kopt-optimize")


@pytest.fixture(scope="session")
def kopt_run(pytestconfig: pytest.Config) -> RunOptions:
    """The run's resolved options (problem, budget, run_dir, resume, agent, seed, ...)."""
    return _plugin(pytestconfig).options


@pytest.fixture(scope="session")
def kopt_problem(kopt_run: RunOptions) -> Any:
    from .problems import get_problem

    try:
        return get_problem(kopt_run.problem)
    except KeyError as exc:  # a one-line usage error, not a traceback
        pytest.exit(f"--kopt-optimize: {exc.args[0]}", returncode=pytest.ExitCode.USAGE_ERROR)


@pytest.fixture(scope="session")
def kopt_evaluate(pytestconfig: pytest.Config) -> Any:
    """The judge (``pytest_kopt.judge.evaluate``), in quick mode with ``--kopt-quick`` (first
    headline shape and a few hypothesis shapes per evaluation); override with a fake to test a
    loop quickly."""
    import functools

    from .judge import evaluate

    return functools.partial(evaluate, quick=True) if pytestconfig.getoption("kopt_quick") else evaluate


@pytest.fixture
def kopt_agent(pytestconfig: pytest.Config, kopt_run: RunOptions, kopt_problem: Any) -> Any:
    """The agent named by --kopt-agent (or the resumed run's); override to bring your own.

    Each setting comes from the command line, else (on resume) from the settings the log last
    recorded for this agent, else from the ini file."""
    from .agents import make_agent

    config = pytestconfig
    recorded = kopt_run.agent_settings or {}

    def setting(name: str, key: str) -> Any:
        value = config.getoption(name)
        if value is None:
            value = recorded.get(key)
        return value if value is not None else config.getini(name)

    return make_agent(
        kopt_run.agent, problem=kopt_problem, seed=kopt_run.seed, run_dir=kopt_run.run_dir,
        max_malformed=int(option(config, "kopt_max_malformed")),
        model=setting("kopt_model", "model"), base_url=setting("kopt_base_url", "base_url") or None,
        api_key_env=setting("kopt_api_key_env", "api_key_env"), context_tokens=setting("kopt_context_tokens", "context_tokens"),
        request_timeout=setting("kopt_request_timeout", "request_timeout"), replay_path=config.getoption("kopt_replay"),
    )
