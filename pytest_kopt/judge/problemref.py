"""Naming a problem so that the judge's child process finds the same one as its parent.

A problem is named by its registry name (``kda``; built-ins and the ``pytest_kopt.problems``
entry points, which the child loads too) or by an import reference ``package.module:attribute``
whose attribute is a ``Problem`` instance, a ``Problem`` subclass or a zero-argument factory.

A problem registered only in the parent (say by a ``conftest.py`` calling ``register_problem``)
is not in a fresh child's registry; ``evaluate`` therefore also hands the child the module and
class the parent's instance came from, and the child imports that module (re-registering it)
or instantiates the class. The child's ``PYTHONPATH`` is the parent's ``sys.path``, so a module
the parent could import, the child can.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..problems import Problem, get_problem


def _coerce(obj: Any, ref: str) -> Problem:
    if isinstance(obj, Problem):
        return obj
    if callable(obj):
        made = obj()
        if isinstance(made, Problem):
            return made
    raise TypeError(f"{ref} does not name a Problem instance, subclass or factory")


def resolve_problem(ref: str, *, module: str | None = None, qualname: str | None = None) -> Problem:
    """The problem named by ``ref`` (registry name or ``module:attribute``); ``module`` and
    ``qualname`` are the parent's hints for a problem registered only there."""
    if ":" in ref:
        module_name, _, attr = ref.partition(":")
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return _coerce(obj, ref)
    try:
        return get_problem(ref)
    except KeyError:
        if not module:
            raise
    mod = importlib.import_module(module)  # importing it usually registers the problem again
    try:
        return get_problem(ref)
    except KeyError:
        pass
    for value in vars(mod).values():
        if isinstance(value, Problem) and value.name == ref:
            return value
    if qualname:
        obj = mod
        for part in qualname.split("."):
            obj = getattr(obj, part)
        problem = _coerce(obj, f"{module}:{qualname}")
        if problem.name == ref:
            return problem
    raise KeyError(f"problem {ref!r} is not registered and {module} does not define it")


def hints(problem: Problem) -> tuple[str, str]:
    """(module, qualname) of a problem's class, for the child."""
    cls = type(problem)
    return cls.__module__, cls.__qualname__
