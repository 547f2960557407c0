"""The problem registry: built-ins (``kda``, ``mla``, ``mla-prefill``, ``mla-paged``) plus user problems.

A user registers a problem of their own either by calling ``register_problem(MyProblem())``
(e.g. from a ``conftest.py``) or through the ``pytest_kopt.problems`` entry-point group,
whose entry points name a ``Problem`` instance or a zero-argument factory.
"""

from __future__ import annotations

import threading
from importlib import metadata

from .base import Case, Cost, OutputError, OutputSpec, Problem

_REGISTRY: dict[str, Problem] = {}
_LOADED_BUILTINS = False
_LOAD_LOCK = threading.RLock()

ENTRY_POINT_GROUP = "pytest_kopt.problems"


def register_problem(problem: Problem, *, replace: bool = False) -> Problem:
    if problem.name in _REGISTRY and not replace:
        raise ValueError(f"a problem named {problem.name!r} is already registered")
    _REGISTRY[problem.name] = problem
    return problem


def _load() -> None:
    """Register the built-ins and entry points once. Under the lock, so that a thread never
    reads a half-filled registry (evaluate() may run in several threads); reentrant, so an
    entry point that looks a problem up while loading sees what is loaded so far."""
    global _LOADED_BUILTINS
    with _LOAD_LOCK:
        if _LOADED_BUILTINS:
            return
        _LOADED_BUILTINS = True
        from . import kda, mla, mla_paged  # noqa: F401  (each registers itself)

        for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
            obj = entry.load()
            problem = obj() if callable(obj) and not isinstance(obj, Problem) else obj
            if problem.name not in _REGISTRY:
                register_problem(problem)


def get_problem(name: str) -> Problem:
    _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown problem {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def available_problems() -> list[str]:
    _load()
    return sorted(_REGISTRY)


__all__ = ["Case", "Cost", "OutputError", "OutputSpec", "Problem", "available_problems", "get_problem", "register_problem"]
