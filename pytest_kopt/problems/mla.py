"""MLA attention in DeepSeek's absorbed form: ``mla`` (decode and multi-token prediction) and
``mla-prefill`` (causal prefill over a whole sequence). Both share one base class; they differ
in shapes, headline cases and the fast family an agent starts from.

A case is ``{"B", "Sq", "H", "Skv"}``; the math and the causal rule are documented in
``kernels/reference/mla.py``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .. import KERNELS_DIR
from . import register_problem
from .base import Baseline, Case, Cost, OutputSpec, Problem

from pytest_kopt.kernels.reference.mla import HEAD_DIM, LATENT_DIM, mla_eager_bf16, mla_reference

# DeepSeek-V2/V3 scale: 1/sqrt(qk_nope_head_dim + qk_rope_head_dim) = 1/sqrt(128 + 64), kept
# after absorbing the 128-wide nope projection into the 512-wide latent.
DEEPSEEK_SCALE = 1.0 / math.sqrt(192)

# Inputs are standard normal. DeepSeek's latent cache is RMS-normalised (entries of order 1),
# and with unit entries the logits scale * q.k have standard deviation sqrt(576 / 192) = 1.73:
# over 8192 keys the largest weight is a few percent, so the softmax is neither flat nor one-hot.
INPUT_STD = 1.0


class _MLAProblem(Problem):
    """What the two MLA problems share: inputs, reference, metric, cost model and baselines."""

    signature = "kernel(q, kv, scale) -> (o, lse)"
    outputs = (
        # bf16 rounding of o alone costs ~1.7e-3; bf16 P in the PV product adds ~2e-4.
        OutputSpec("o", 5e-3),
        # With float32 scores a kernel's lse is within ~1e-7; scores rounded to bf16 reach ~1e-3.
        OutputSpec("lse", 5e-4),
    )
    reference_path = KERNELS_DIR / "reference" / "mla.py"
    baseline_candidate_path = KERNELS_DIR / "families" / "mla_naive.py"

    def make_inputs(self, case: Case, *, device: str | torch.device, seed: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
        B, Sq, H, Skv = (int(case[k]) for k in ("B", "Sq", "H", "Skv"))
        if not 1 <= Sq <= Skv:
            raise ValueError(f"{self.name}: need 1 <= Sq <= Skv, got {self.describe(case)}")
        gen = torch.Generator(device=device).manual_seed(seed)
        q = torch.randn(B, Sq, H, HEAD_DIM, generator=gen, device=device) * INPUT_STD
        kv = torch.randn(B, Skv, HEAD_DIM, generator=gen, device=device) * INPUT_STD
        return {"q": q.to(dtype), "kv": kv.to(dtype), "scale": DEEPSEEK_SCALE}

    def reference(self, **inputs: Any) -> tuple[Any, ...]:
        return mla_reference(inputs["q"], inputs["kv"], inputs["scale"])

    def expected_dtypes(self, inputs: dict[str, Any]) -> dict[str, torch.dtype]:
        return {"o": inputs["q"].dtype, "lse": torch.float32}

    def cost(self, case: Case) -> Cost:
        """q and kv read once, o and lse written once (bf16 tensors, float32 lse); FLOPs of QK^T
        (576 wide) and PV (512 wide) over the (query, head, key) triples the causal mask keeps."""
        B, Sq, H, Skv = (int(case[k]) for k in ("B", "Sq", "H", "Skv"))
        elt = 2
        bytes_ = elt * (B * Sq * H * HEAD_DIM + B * Skv * HEAD_DIM + B * Sq * H * LATENT_DIM) + 4 * B * H * Sq
        # query i sees i + Skv - Sq + 1 keys
        visible = Sq * (Skv - Sq + 1) + Sq * (Sq - 1) // 2
        flops = 2 * (HEAD_DIM + LATENT_DIM) * B * H * visible
        return Cost(bytes=float(bytes_), flops=float(flops))

    def describe(self, case: Case) -> str:
        return f"B{case['B']} Sq{case['Sq']} H{case['H']} Skv{case['Skv']}"

    def baselines(self, device: str) -> list[Baseline]:
        return [Baseline("torch-eager-bf16", mla_eager_bf16), Baseline("torch-fp32-reference", mla_reference)]


def _on_gpu(device: str) -> bool:
    return str(device).startswith("cuda")


class MLADecode(_MLAProblem):
    name = "mla"
    description = (
        "DeepSeek MLA decode / multi-token prediction, absorbed form: Sq = 1..16 new tokens per "
        "sequence attend (bottom-right causal) over a shared 576-wide latent cache; returns o and lse."
    )
    families = ("mla_naive", "mla_decode")
    headline_cases = (
        {"B": 1, "Sq": 1, "H": 64, "Skv": 8192},
        {"B": 1, "Sq": 2, "H": 64, "Skv": 8192},
        {"B": 1, "Sq": 4, "H": 64, "Skv": 8192},
        {"B": 64, "Sq": 1, "H": 64, "Skv": 8192},
    )
    # timed on single-sequence and batched decode: the loop's first H200 run, scored on B1
    # alone, promoted a kernel that over-split B64 (1348 GB/s where the family default gives 2067)
    timed_headline = (0, 3)
    smoke_case = {"B": 1, "Sq": 2, "H": 16, "Skv": 64}

    def case_strategy(self, device: str) -> Any:
        from hypothesis import strategies as st

        if _on_gpu(device):
            B, Sq, H, max_skv = st.integers(1, 8), st.integers(1, 16), st.sampled_from([16, 32, 64, 128]), 4096
        else:
            B, Sq, H, max_skv = st.integers(1, 2), st.integers(1, 4), st.sampled_from([1, 2, 16]), 70

        @st.composite
        def cases(draw):
            sq = draw(Sq)
            return {"B": draw(B), "Sq": sq, "H": draw(H), "Skv": draw(st.integers(sq, max_skv))}

        return cases()


class MLAPrefill(_MLAProblem):
    name = "mla-prefill"
    description = (
        "DeepSeek MLA causal prefill, absorbed form: every token of a sequence attends to itself "
        "and earlier tokens (Sq = Skv) over a shared 576-wide latent cache; returns o and lse."
    )
    families = ("mla_naive", "mla_prefill")
    headline_cases = ({"B": 1, "Sq": 8192, "H": 64, "Skv": 8192},)
    smoke_case = {"B": 1, "Sq": 32, "H": 2, "Skv": 32}

    def make_inputs(self, case: Case, *, device: str | torch.device, seed: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
        if case["Sq"] != case["Skv"]:
            raise ValueError(f"{self.name}: prefill needs Sq == Skv, got {self.describe(case)}")
        return super().make_inputs(case, device=device, seed=seed, dtype=dtype)

    def case_strategy(self, device: str) -> Any:
        from hypothesis import strategies as st

        if _on_gpu(device):
            max_s, max_programs, H = 2048, None, st.sampled_from([16, 32, 64, 128])
        else:
            # The interpreter spends ~10 ms per (batch, head, query) program of a plain kernel:
            # cap B*H*S at 128 so one example stays near a second (H=16 gets S <= 8 or 4).
            max_s, max_programs, H = 48, 128, st.sampled_from([1, 2, 16])

        @st.composite
        def cases(draw):
            b, h = draw(st.integers(1, 2)), draw(H)
            cap = max_s if max_programs is None else min(max_s, max_programs // (b * h))
            s = draw(st.integers(1, cap))
            return {"B": b, "Sq": s, "H": h, "Skv": s}

        return cases()


MLA = register_problem(MLADecode())
MLA_PREFILL = register_problem(MLAPrefill())
