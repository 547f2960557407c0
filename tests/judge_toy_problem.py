"""A tiny user-registered problem for the judge's tests: out = alpha * x + y, row by row.

Cheap under the CPU interpreter (one elementwise kernel), and registered the way a user
registers their own problem, so the tests also prove the judge's child finds a problem that
only the parent process registered.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from pytest_kopt.problems import register_problem
from pytest_kopt.problems.base import Baseline, Case, Cost, OutputSpec, Problem

HERE = Path(__file__).resolve().parent


def axpy_reference(x: torch.Tensor, y: torch.Tensor, alpha: float) -> tuple[torch.Tensor]:
    return (alpha * x.double() + y.double(),)


def _torch_eager(x: torch.Tensor, y: torch.Tensor, alpha: float) -> tuple[torch.Tensor]:
    return (alpha * x + y,)


class AxpyProblem(Problem):
    name = "judge-toy-axpy"
    description = "out[b, n] = alpha * x[b, n] + y[b, n]; x, y bf16 [B, N]; out in x's dtype."
    signature = "kernel(x, y, alpha) -> (out,)"
    outputs = (OutputSpec("out", 1e-2),)
    reference_path = Path(__file__)
    baseline_candidate_path = HERE / "hostile" / "good_axpy.py"
    headline_cases = ({"B": 64, "N": 1 << 20},)
    smoke_case = {"B": 2, "N": 100}

    def make_inputs(self, case: Case, *, device: str | torch.device, seed: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
        gen = torch.Generator(device=device).manual_seed(int(seed))
        shape = (int(case["B"]), int(case["N"]))
        x = torch.randn(shape, generator=gen, device=device).to(dtype)
        y = torch.randn(shape, generator=gen, device=device).to(dtype)
        alpha = float(torch.rand((), generator=gen, device=device).item()) * 2 + 0.5
        return {"x": x, "y": y, "alpha": alpha}

    def reference(self, **inputs: Any) -> tuple[Any, ...]:
        return axpy_reference(**inputs)

    def expected_dtypes(self, inputs):
        return {"out": inputs["x"].dtype}

    def case_strategy(self, device: str) -> Any:
        from hypothesis import strategies as st

        return st.fixed_dictionaries({"B": st.integers(1, 3), "N": st.integers(1, 300)})

    def cost(self, case: Case) -> Cost:
        n = int(case["B"]) * int(case["N"])
        return Cost(bytes=3.0 * 2 * n, flops=2.0 * n)

    def describe(self, case: Case) -> str:
        return f"B{case['B']} N{case['N']}"

    def baselines(self, device: str) -> list[Baseline]:
        return [Baseline("torch-eager", _torch_eager)]


AXPY = register_problem(AxpyProblem(), replace=True)


class AxpyTwoCases(AxpyProblem):
    """The same problem timed on two shapes (here on the CPU too), as a problem with several
    ``timed_headline`` cases is on a GPU: its figures are geometric means."""

    name = "judge-toy-axpy-two-cases"
    timed_shapes = ({"B": 2, "N": 100}, {"B": 1, "N": 700})

    def timed_cases(self, device: str) -> tuple[Case, ...]:
        return self.timed_shapes


AXPY_TWO = register_problem(AxpyTwoCases(), replace=True)
