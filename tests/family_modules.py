"""What the family test modules share: a family imported as its candidates are made (rendered
with some knobs by ``pytest_kopt.families``, exactly as the search agent renders them, written
to a file, imported), the import contract a family file is held to, and a compile for sm_90
in a process of its own."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from pytest_kopt.families import Family
from pytest_kopt.gate import load_module
from pytest_kopt.judge import candidate_id

# What a candidate may import, as docs/architecture.md states it (the judge's policy lets a
# few more through): families are held to the stated contract.
CANDIDATE_IMPORTS = {"torch", "triton", "triton.language", "math", "typing", "functools", "dataclasses",
                     "triton.experimental.gluon", "triton.experimental.gluon.language",
                     "triton.experimental.gluon.language.nvidia.hopper", "triton.experimental.gluon.nvidia.hopper",
                     "triton.tools.tensor_descriptor"}


def import_rendered(family: Family, knobs: dict, directory: Path) -> ModuleType:
    """``family`` with ``knobs`` (the others at their defaults), written under ``directory``
    as its candidate would be, and imported."""
    source = family.render(knobs)
    path = Path(directory) / f"{family.name}_{candidate_id(source)}.py"
    path.write_text(source)
    module = load_module(path)
    assert module.KNOBS == {**family.knobs, **knobs}
    return module


def imported_modules(source: str) -> set[str]:
    """Every module a source imports, by ``import x`` or ``from x import y``, at any depth."""
    tree = ast.parse(source)
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    return imported | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}


def compile_in_child(script: str, *args: str, cache_dir: Path | None = None, timeout: float = 300) -> str:
    """Run a Python ``script`` that compiles kernels for sm_90 (no GPU needed) in a fresh process
    with Triton's interpreter off: the interpreter leaves triton.language patched in a process
    that ran it, and then the real compiler fails on its own. ``cache_dir``: a fresh Triton cache,
    so the kernels are compiled for real, not read from a cache. Returns the script's stdout."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if cache_dir is not None:
        env["TRITON_CACHE_DIR"] = str(cache_dir)
    child = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert child.returncode == 0, child.stderr[-3000:]
    return child.stdout
