"""Agents by name: ``search`` (embedded, default), ``openai`` (LLM endpoint), ``replay`` (a log).

``make_agent(name, **settings)`` imports the agent lazily (the LLM agent needs the openai
client, the search agent optuna) and passes it the settings its constructor accepts. Settings
the loop provides: ``problem`` (a Problem), ``seed``, ``model``, ``base_url``, ``api_key_env``,
``context_tokens``, ``request_timeout``, ``replay_path``. A name of the form ``module:Class``
loads a user's own agent the same way. An agent may expose ``settings``, a JSON-able dict
(never a secret): the loop records it in ``run_started``/``run_resumed``, and on
``--kopt-resume`` its recorded ``model``, ``base_url``, ``api_key_env``, ``context_tokens`` and
``request_timeout`` stand in for the options the command line leaves out.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from .base import Agent

AGENTS = {
    "search": "pytest_kopt.agents.search:SearchAgent",
    "openai": "pytest_kopt.agents.llm:LLMAgent",
    "replay": "pytest_kopt.agents.replay:ReplayAgent",
}


def agent_class(name: str) -> type[Agent]:
    target = AGENTS.get(name, name)
    if ":" not in target:
        raise ValueError(f"unknown agent {name!r}; choose one of {', '.join(AGENTS)} or give module:Class")
    module_name, _, class_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Agent)):
        raise ValueError(f"{target} is not an Agent subclass")
    return cls


def make_agent(name: str, **settings: Any) -> Agent:
    """Build the agent ``name`` from the settings its constructor takes (the rest are ignored)."""
    cls = agent_class(name)
    params = inspect.signature(cls.__init__).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        settings = {k: v for k, v in settings.items() if k in params}
    return cls(**settings)


__all__ = ["AGENTS", "Agent", "agent_class", "make_agent"]
