"""Hold committed kernels correct in CI: a kernel file against its problem's reference on
hypothesis shapes, in-process, on the CPU interpreter or natively on a GPU.

The judge (``kopt eval``) is for untrusted candidates: a child process, policy, honesty checks.
Kernels in ``kernels/best/`` were reviewed and committed, so the gate only asks the question a
change can break: does ``kernel(...)`` still match the reference, on the smoke case and on
shapes hypothesis draws (shrunk to the smallest failing one), with the contract's dtypes?
``tests/test_best_kernels.py`` runs it for every best kernel and every problem's baseline.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch

from . import KERNELS_DIR
from .problems import Problem, available_problems, get_problem

BEST_DIR = KERNELS_DIR / "best"
_counter = itertools.count()


class KernelIncorrect(AssertionError):
    """A gated kernel gave wrong outputs (or raised) on a case; the message names the case."""


def best_kernels(directory: Path = BEST_DIR) -> list[tuple[str, Path]]:
    """(problem name, path) for every kernel promoted into ``kernels/best/``: the file is named
    after its problem, with ``_`` for ``-`` allowed (``mla_prefill.py`` is ``mla-prefill``)."""
    known = set(available_problems())
    found = []
    for path in sorted(Path(directory).glob("*.py")):
        if not path.name.startswith("_"):
            name = path.stem if path.stem in known else path.stem.replace("_", "-")
            found.append((name if name in known else path.stem, path))
    return found


def load_module(path: Path | str) -> ModuleType:
    """Import a kernel file of this repository (trusted: no judge) under a fresh module name,
    so the same file, or one rendered again, is imported anew."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"kopt_gated_{path.stem.replace('-', '_')}_{next(_counter)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_kernel(path: Path | str) -> Callable[..., Any]:
    """Import a candidate file under a fresh module name and return its ``kernel``."""
    module = load_module(path)
    if not callable(getattr(module, "kernel", None)):
        raise KernelIncorrect(f"{path} defines no kernel(...) function")
    return module.kernel


def check_case(problem: Problem, kernel: Callable[..., Any], case: dict, *, seed: int, device: str) -> None:
    """Run ``kernel`` on one case; raise KernelIncorrect with every reason it is wrong."""
    label = f"{problem.name} {problem.describe(case)} seed={seed} on {device}"
    inputs = problem.make_inputs(case, device=device, seed=seed)
    expected = problem.reference(**inputs)
    try:
        outputs = kernel(**inputs)
    except Exception as exc:  # a crash is a failure of the kernel, not of the gate
        raise KernelIncorrect(f"{label}: kernel raised {type(exc).__name__}: {exc}") from exc
    reasons = [e.reason for e in problem.compare(outputs, expected) if not e.ok]
    if not reasons:
        dtypes = problem.expected_dtypes(inputs)
        for spec, got in zip(problem.outputs, outputs):
            if isinstance(got, torch.Tensor) and spec.name in dtypes and got.dtype != dtypes[spec.name]:
                reasons.append(f"{spec.name}: dtype {got.dtype}, expected {dtypes[spec.name]}")
    if reasons:
        raise KernelIncorrect(f"{label}: " + "; ".join(reasons))


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_examples(device: str) -> int:
    """How many hypothesis cases per kernel: few on the slow CPU interpreter, more on a GPU;
    ``KOPT_GATE_EXAMPLES`` overrides (e.g. a nightly job that digs deeper)."""
    if os.environ.get("KOPT_GATE_EXAMPLES"):
        return int(os.environ["KOPT_GATE_EXAMPLES"])
    return 50 if device.startswith("cuda") else 4


def check_kernel(problem: Problem | str, path: Path | str, *, device: str | None = None,
                 max_examples: int | None = None, shrink: bool | None = None, derandomize: bool = True) -> None:
    """The gate: ``path``'s kernel against ``problem``'s reference on the smoke case, on a GPU
    the headline cases too, then on hypothesis cases. Raises KernelIncorrect naming the failing
    case when it is wrong; returns None when it holds.

    ``derandomize``: the same cases on every run, so CI never flickers (pass False, or raise
    ``max_examples``, to explore). ``shrink``: hypothesis shrinks a failure to the smallest
    failing shape; by default only on a GPU, since on the CPU interpreter each example costs
    seconds and shrinking can take minutes (the unshrunk case is still named)."""
    from hypothesis import HealthCheck, Phase, example, given, settings
    from hypothesis import strategies as st

    problem = get_problem(problem) if isinstance(problem, str) else problem
    device = device or default_device()
    kernel = load_kernel(path)
    fixed = [problem.smoke_case] + (list(problem.headline_cases[:1]) if device.startswith("cuda") else [])
    shrink = device.startswith("cuda") if shrink is None else shrink
    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if shrink else [])

    @settings(max_examples=max_examples or default_examples(device), deadline=None, derandomize=derandomize,
              phases=phases, database=None if derandomize else settings.default.database, print_blob=not derandomize,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors])
    @given(case=problem.case_strategy(device), seed=st.integers(0, 2**31 - 1))
    def holds(case: dict, seed: int) -> None:
        check_case(problem, kernel, case, seed=seed, device=device)

    for case in reversed(fixed):  # explicit examples run first and are never shrunk: a quick, clear failure
        holds = example(case=dict(case), seed=0)(holds)
    holds()
