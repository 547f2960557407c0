"""Kernel families imported as candidates are made from them: rendered with some knobs by
``pytest_kopt.families`` (exactly as the search agent renders them), written to a file and
imported. Shared by the family test modules."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from pytest_kopt.families import Family
from pytest_kopt.gate import load_module
from pytest_kopt.judge import candidate_id


def import_rendered(family: Family, knobs: dict, directory: Path) -> ModuleType:
    """``family`` with ``knobs`` (the others at their defaults), written under ``directory``
    as its candidate would be, and imported."""
    source = family.render(knobs)
    path = Path(directory) / f"{family.name}_{candidate_id(source)}.py"
    path.write_text(source)
    module = load_module(path)
    assert module.KNOBS == {**family.knobs, **knobs}
    return module
