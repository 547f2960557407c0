"""pytest hooks and options only. The work is delegated:
- ``--kopt-problem/--kopt-candidate``: judge one candidate (pytest_kopt.judge.pytest_eval)
- ``--kopt-optimize``: run the optimization loop (pytest_kopt.loop_plugin)
"""

from __future__ import annotations

import pytest

INI_OPTIONS = {
    # name: (help, default)
    "kopt_agent": ("agent that writes candidates: search (embedded, default), openai, replay", "search"),
    "kopt_model": ("model name for --kopt-agent=openai", ""),
    "kopt_base_url": ("OpenAI-compatible base URL (default: $OPENAI_BASE_URL)", ""),
    "kopt_api_key_env": ("environment variable holding the API key", "OPENAI_API_KEY"),
    "kopt_context_tokens": ("token budget before the LLM conversation is compacted (0: per-model default)", "0"),
    "kopt_request_timeout": ("seconds before one LLM request times out (retries: env KOPT_LLM_RETRIES, KOPT_LLM_PAUSE_S, KOPT_LLM_PAUSES; see docs/llm-agent.md)", "600"),
    "kopt_eval_timeout": ("seconds before one candidate evaluation is killed", "900"),
    "kopt_min_gain": ("fraction by which a candidate must beat the best so far to replace it (a new run fixes it in its objective)", "0.01"),
    "kopt_metric": ("the objective's timer: eager (back-to-back calls, host time included; the default), device (GPU time, L2 flushed) "
                    "or graph (CUDA-graph replay); a new run fixes it in its objective, a resumed run keeps its own", "eager"),
    "kopt_workers": ("evaluations in flight at once, each its own judge on its own worker (one GPU each on a GPU machine); "
                     "more workers than GPUs share them, and their timings are marked contended (never a best)", "1"),
    "kopt_executor": ("where evaluations run: local (this host) or ray (tasks on a Ray cluster, num_gpus=1 each where it has GPUs)", "local"),
    "kopt_ray_address": ("the Ray cluster for --kopt-executor=ray (ray.init(address=...), e.g. HEAD:6379 or auto); empty: start a local Ray instance", ""),
    "kopt_max_malformed": ("replies in a row without a usable tool call (malformed arguments, or none) before an LLM agent's run stops with an error", "3"),
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kopt", "pytest-kopt: long-horizon kernel optimization")
    group.addoption("--kopt-problem", help="problem to judge a candidate against (kda, mla, mla-prefill, ...)")
    group.addoption("--kopt-candidate", help="candidate file to judge (with --kopt-problem)")
    group.addoption("--kopt-quick", action="store_true", help="judge quickly: the first headline shape, a few hypothesis shapes, fewer rounds; no profile stage for --kopt-candidate (the loop still profiles when its agent asks)")
    group.addoption("--kopt-json", help="judge: write the result JSON here")
    group.addoption("--kopt-optimize", metavar="PROBLEM", help="run the optimization loop on PROBLEM")
    group.addoption("--kopt-budget", default=None, metavar="N|+N",
                    help="the run's total of tool calls (default 100; on --kopt-resume the run's own total); +N: N calls more than the run has used")
    group.addoption("--kopt-run-dir", help="run directory (default results/runs/<problem>-<timestamp>)")
    group.addoption("--kopt-resume", action="store_true", help="continue the run in --kopt-run-dir from its log")
    group.addoption("--kopt-seed", type=int, default=None, help="seed of the agent's sampler")
    group.addoption("--kopt-replay", help="a recorded run (its events.jsonl, its folder or its packed .tar.xz), for --kopt-agent=replay")
    group.addoption("--kopt-promote", nargs="?", const="check", default=None, choices=("check", "force"),
                    help="when the run ends, time its best beside kernels/best/<problem>.py on this machine and replace that "
                         "only when the best is faster beyond the noise (check, the default); force: replace it without checks")
    group.addoption("--kopt-retract", metavar="CANDIDATE_ID", help="on resume: take this candidate out of the running for best (with --kopt-retract-reason); the best is rebuilt without it")
    group.addoption("--kopt-retract-reason", metavar="TEXT", help="what showed the retracted candidate wrong (logged with the retraction)")
    for name, (help_text, default) in INI_OPTIONS.items():
        group.addoption("--" + name.replace("_", "-"), dest=name, default=None, help=help_text)
        parser.addini(name, help_text, default=default)


def option(config: pytest.Config, name: str) -> str:
    """A kopt option from the command line, else from [tool.pytest.ini_options]."""
    value = config.getoption(name)
    return value if value is not None else config.getini(name)


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("kopt_candidate") or config.getoption("kopt_problem"):
        from .judge.pytest_eval import EvalPlugin

        config.pluginmanager.register(EvalPlugin(config), "kopt-eval")
    if config.getoption("kopt_optimize"):
        from .loop_plugin import OptimizePlugin

        config.pluginmanager.register(OptimizePlugin(config), "kopt-optimize")
