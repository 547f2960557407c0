"""What "correct" and "fast" mean for one kernel: the contract every problem fills in.

A problem is the single source of truth the judge, the agents and the reports read:
the reference (ground truth), realistic inputs, hypothesis shapes, the error metric and
tolerance per output, headline shapes, a cost model for roofline figures, and the baseline
that speedups are measured against.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

Case = dict[str, Any]
"""One concrete shape plus flags, e.g. {"B": 1, "T": 64, "H": 2, "K": 32, "V": 16, "initial_state": True}."""


@dataclass(frozen=True)
class OutputSpec:
    """One output of the kernel and how close it must be to the reference (relative RMS error)."""

    name: str
    tolerance: float
    optional: bool = False  # may be None when the case asks for it (KDA's final state)


@dataclass(frozen=True)
class Cost:
    """Minimum traffic and arithmetic for one call: the roofline floor comes from these."""

    bytes: float
    flops: float

    def floor_seconds(self, bandwidth_bytes_per_s: float, flops_per_s: float) -> float:
        return max(self.bytes / bandwidth_bytes_per_s, self.flops / flops_per_s)


@dataclass(frozen=True)
class OutputError:
    """How one output compared with the reference."""

    name: str
    rel_rms: float  # ||out - ref|| / ||ref|| in float64; inf for missing or non-finite output
    tolerance: float
    reason: str = ""  # empty when it passed

    @property
    def ok(self) -> bool:
        return not self.reason


@dataclass(frozen=True)
class Baseline:
    """A callable timed beside the candidate (same keyword arguments as the reference)."""

    name: str
    fn: Callable[..., Any]


# Ceilings measured on the lent H200 (shared/anchors/h200-baselines-1.json); used when the
# judge has not measured its own in the run.
H200_COPY_BYTES_PER_S = 4.25e12
H200_BF16_FLOPS_PER_S = 686e12


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative RMS error in float64; inf when anything is non-finite."""
    out64 = out.detach().to("cpu", torch.float64)
    ref64 = ref.detach().to("cpu", torch.float64)
    if not torch.isfinite(out64).all():
        return math.inf
    denom = ref64.norm().item()
    diff = (out64 - ref64).norm().item()
    if denom == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / denom


class Problem(ABC):
    """Base class of a kernel problem. Subclasses set the attributes and implement the methods."""

    name: str
    description: str
    signature: str  # the candidate's ``kernel(...)`` signature, exactly as callers use it
    outputs: tuple[OutputSpec, ...]
    reference_path: Path  # the readable PyTorch reference shown to agents
    baseline_candidate_path: Path  # the plain, correct Triton candidate every run starts from
    families: tuple[str, ...] = ()  # kernels/families/<name>.py the search agent renders from
    headline_cases: tuple[Case, ...] = ()  # the first is THE headline
    # which headline cases a candidate is timed on (on a GPU); with several, the metric is the
    # geometric mean of their times, so a kernel tuned for one shape cannot regress the others
    timed_headline: tuple[int, ...] = (0,)
    smoke_case: Case = {}  # small case the judge times on the CPU interpreter (indicative only)
    rules: tuple[str, ...] = (
        "Triton only: the math is done in @triton.jit kernels defined in the candidate file.",
        "No third-party kernel libraries (flash-linear-attention, flash_attn, flashinfer, ...).",
        "torch may allocate, view and reshape tensors; no torch compute ops.",
        "Outputs must be freshly allocated, fully written, and must not alias inputs.",
    )

    # ---- inputs and truth -------------------------------------------------------------
    @abstractmethod
    def make_inputs(self, case: Case, *, device: str | torch.device, seed: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
        """Realistic random inputs for ``case`` as the keyword arguments of ``kernel(...)``."""

    @abstractmethod
    def reference(self, **inputs: Any) -> tuple[Any, ...]:
        """Ground truth in float32 or better, as a tuple in the order of ``outputs``."""

    def timed_reference(self, **inputs: Any) -> tuple[Any, ...]:
        """The reference the judge checks timed calls against (there is one per timed call, so a
        problem may give a faster form here, as long as it is float32-or-better truth)."""
        return self.reference(**inputs)

    @abstractmethod
    def case_strategy(self, device: str) -> Any:
        """A hypothesis strategy of cases: small ones for the CPU interpreter, larger on a GPU."""

    @abstractmethod
    def cost(self, case: Case) -> Cost:
        """Minimum bytes moved and FLOPs for one call on ``case``."""

    @abstractmethod
    def describe(self, case: Case) -> str:
        """A short label such as ``B1 T8192 H16 K128 V128``."""

    def timed_cases(self, device: str) -> tuple[Case, ...]:
        """The cases a candidate is timed on: the ``timed_headline`` cases on a GPU, the smoke
        case on the CPU interpreter (where headline shapes would take hours)."""
        if str(device).startswith("cuda") and self.headline_cases:
            return tuple(self.headline_cases[i] for i in self.timed_headline)
        return (self.smoke_case,)

    # explicit cases the judge checks on the CPU beside the smoke case: small heads and dims, but
    # long enough to cross several tiles or chunks (a kernel right only for its first tile fails)
    cpu_cases: tuple[Case, ...] = ()
    # input distributions the hypothesis strategies draw beside the typical one ("dist" in a case)
    stress: tuple[str, ...] = ()

    def correctness_cases(self, device: str, *, quick: bool = False) -> tuple[Case, ...]:
        """Explicit cases checked after the smoke case: the headline cases (the first only when
        quick) and the timed ones on a GPU; ``cpu_cases`` on the CPU interpreter, quick or not."""
        if str(device).startswith("cuda") and self.headline_cases:
            explicit = list(self.headline_cases[:1] if quick else self.headline_cases)
            return tuple(explicit + [c for c in self.timed_cases(device) if c not in explicit])
        return tuple(self.cpu_cases)

    def timed_label(self, device: str) -> str:
        """How the objective names what is timed: a case, or the geometric mean of several."""
        labels = [self.describe(c) for c in self.timed_cases(device)]
        return labels[0] if len(labels) == 1 else "geomean of " + " | ".join(labels)

    def baselines(self, device: str) -> list[Baseline]:
        """What the candidate is timed against, best-known first. Override per problem."""
        return []

    # ---- judging ----------------------------------------------------------------------
    def compare(self, outputs: Any, expected: Sequence[Any]) -> list[OutputError]:
        """Check a candidate's outputs against the reference's, output by output."""
        if not isinstance(outputs, (tuple, list)):
            outputs = (outputs,)
        errors: list[OutputError] = []
        if len(outputs) != len(self.outputs):
            return [OutputError("outputs", math.inf, 0.0, f"returned {len(outputs)} outputs, expected {len(self.outputs)} ({', '.join(o.name for o in self.outputs)})")]
        for spec, got, want in zip(self.outputs, outputs, expected):
            errors.append(self._compare_one(spec, got, want))
        return errors

    @staticmethod
    def _compare_one(spec: OutputSpec, got: Any, want: Any) -> OutputError:
        if want is None:
            if got is None:
                return OutputError(spec.name, 0.0, spec.tolerance)
            return OutputError(spec.name, math.inf, spec.tolerance, f"{spec.name}: expected None, got {type(got).__name__}")
        if not isinstance(got, torch.Tensor):
            return OutputError(spec.name, math.inf, spec.tolerance, f"{spec.name}: expected a tensor, got {type(got).__name__}")
        if tuple(got.shape) != tuple(want.shape):
            return OutputError(spec.name, math.inf, spec.tolerance, f"{spec.name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
        err = rel_rms(got, want)
        if not math.isfinite(err):
            return OutputError(spec.name, err, spec.tolerance, f"{spec.name}: contains NaN or Inf")
        if err > spec.tolerance:
            return OutputError(spec.name, err, spec.tolerance, f"{spec.name}: relative RMS error {err:.3g} > tolerance {spec.tolerance:.3g}")
        return OutputError(spec.name, err, spec.tolerance)

    def expected_dtypes(self, inputs: Mapping[str, Any]) -> dict[str, torch.dtype]:
        """dtype each output must have for these inputs; override when it differs from float32."""
        return {}

    def summary(self) -> dict[str, Any]:
        """The objective as plain data: recorded in run logs and stated to agents."""
        return {
            "problem": self.name,
            "description": self.description,
            "signature": self.signature,
            "outputs": [{"name": o.name, "tolerance": o.tolerance, "metric": "relative RMS error vs float32-or-better reference"} for o in self.outputs],
            "headline": [self.describe(c) for c in self.headline_cases],
            "rules": list(self.rules),
        }
