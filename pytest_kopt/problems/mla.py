"""MLA attention in DeepSeek's absorbed form: ``mla`` (decode and multi-token prediction) and
``mla-prefill`` (causal prefill over a whole sequence). Both share one base class; they differ
in shapes, headline cases and the fast family an agent starts from.

A case is ``{"B", "Sq", "H", "Skv"}``; the math and the causal rule are documented in
``kernels/reference/mla.py``.

Baselines: FlashMLA's dense bf16 decode (what an inference engine calls; ``flashmla`` below, only
where ``flash_mla`` imports on a GPU), eager bf16 PyTorch and the float32 reference.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import weakref
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
    # beside unit-variance inputs: logits 32x larger (a softmax without a running max overflows)
    # and 100x smaller (nearly flat weights over every key)
    stress = ("q_x32", "q_x0.01")
    Q_SCALE = {None: 1.0, "typical": 1.0, "q_x32": 32.0, "q_x0.01": 0.01}

    def make_inputs(self, case: Case, *, device: str | torch.device, seed: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
        B, Sq, H, Skv = (int(case[k]) for k in ("B", "Sq", "H", "Skv"))
        if not 1 <= Sq <= Skv:
            raise ValueError(f"{self.name}: need 1 <= Sq <= Skv, got {self.describe(case)}")
        if case.get("dist") not in self.Q_SCALE:
            raise ValueError(f"{self.name}: unknown input distribution {case.get('dist')!r}")
        gen = torch.Generator(device=device).manual_seed(seed)
        q = torch.randn(B, Sq, H, HEAD_DIM, generator=gen, device=device) * INPUT_STD * self.Q_SCALE[case.get("dist")]
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
        label = f"B{case['B']} Sq{case['Sq']} H{case['H']} Skv{case['Skv']}"
        return label if case.get("dist") in (None, "typical") else f"{label} {case['dist']}"

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
    families = ("mla_naive", "mla_decode", "mla_decode_paged")
    headline_cases = (
        {"B": 1, "Sq": 1, "H": 64, "Skv": 8192},
        {"B": 1, "Sq": 2, "H": 64, "Skv": 8192},
        {"B": 1, "Sq": 4, "H": 64, "Skv": 8192},
        {"B": 64, "Sq": 1, "H": 64, "Skv": 8192},
        # reported by the benchmarks, never timed by the loop: a check against over-fitting (as mla-paged's)
        {"B": 32, "Sq": 1, "H": 64, "Skv": 8192},
        {"B": 1, "Sq": 1, "H": 64, "Skv": 131072},
    )
    # timed on single-sequence and batched decode: the loop's first H200 run, scored on B1
    # alone, promoted a kernel that over-split B64 (1348 GB/s where the family default gives 2067)
    timed_headline = (0, 3)
    smoke_case = {"B": 1, "Sq": 2, "H": 16, "Skv": 64}
    cpu_cases = (
        {"B": 1, "Sq": 4, "H": 2, "Skv": 300},
        {"B": 1, "Sq": 2, "H": 16, "Skv": 130, "dist": "q_x32"},
        {"B": 2, "Sq": 1, "H": 2, "Skv": 100, "dist": "q_x0.01"},
    )

    def baselines(self, device: str) -> list[Baseline]:
        """FlashMLA first where it imports (the speedup is against it, as KDA's is against fla),
        then eager bf16 PyTorch and the float32 reference."""
        flashmla = flashmla_baseline(device)
        return ([Baseline("flashmla", flashmla.dense)] if flashmla is not None else []) + super().baselines(device)

    def case_strategy(self, device: str) -> Any:
        from hypothesis import strategies as st

        if _on_gpu(device):
            B, Sq, H, max_skv = st.integers(1, 8), st.integers(1, 16), st.sampled_from([16, 32, 64, 128]), 4096
        else:
            B, Sq, H, max_skv = st.integers(1, 2), st.integers(1, 4), st.sampled_from([1, 2, 16]), 70

        @st.composite
        def cases(draw):
            sq = draw(Sq)
            return {"B": draw(B), "Sq": sq, "H": draw(H), "Skv": draw(st.integers(sq, max_skv)),
                    "dist": draw(st.sampled_from(("typical",) + self.stress))}

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
    cpu_cases = ({"B": 1, "Sq": 80, "H": 1, "Skv": 80}, {"B": 1, "Sq": 24, "H": 2, "Skv": 24, "dist": "q_x32"})

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
            return {"B": b, "Sq": s, "H": h, "Skv": s, "dist": draw(st.sampled_from(("typical",) + self.stress))}

        return cases()


# ---- FlashMLA ---------------------------------------------------------------------------------
FLASHMLA_INSTALL = ("pip install 'pytest-kopt[flashmla]' (the sgl-flash-mla wheel; on torch < 2.14 install it with "
                    "pip install --no-deps sgl-flash-mla, it loads through torch's stable ABI)")
FLASHMLA_PAGE = 64  # the only page size FlashMLA's dense decode takes


class FlashMLA:
    """FlashMLA's dense bf16 decode (``flash_mla_with_kvcache``, the SM90 kernel; in the
    sgl-flash-mla wheel behind ``use_legacy=True``), called as an inference engine calls it.

    ``paged`` takes the ``mla-paged`` problem's arguments as they are (FlashMLA's own layout: pages
    of 64 tokens, a block table, a length per sequence); ``dense`` takes ``mla``'s contiguous
    [B, Skv, 576] cache as pages of 64 tokens in order (a view; Skv must be a multiple of 64).

    Scheduler metadata: an engine makes it once per step and reuses it in every layer, so FlashMLA
    is timed per layer: the metadata is made on the first call with a lengths tensor and reused for
    as long as that same tensor object is passed with the same shapes (the judge and the benchmarks
    write a case's own lengths into it between rounds, so they stay valid). ``fresh_metadata``:
    made again on every call (the scheduler kernel included in the call). Host objects only:
    nothing a call returns is cached."""

    def __init__(self, module: Any, fresh_metadata: bool = False) -> None:
        self._call = module.flash_mla_with_kvcache
        self._new_meta = module.get_mla_metadata
        params = inspect.signature(self._call).parameters
        self._extra = {"use_legacy": True} if "use_legacy" in params else {}
        self.fresh_metadata = fresh_metadata
        self._metas: dict[tuple, tuple[Any, Any]] = {}
        self._dense: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def _meta(self, q: torch.Tensor, cache_seqlens: torch.Tensor) -> Any:
        if self.fresh_metadata:
            return self._new_meta()[0]
        key = (q.device, tuple(q.shape), cache_seqlens.data_ptr())
        held = self._metas.get(key)
        if held is not None and held[0]() is cache_seqlens:
            return held[1]
        meta = self._new_meta()[0]  # filled by FlashMLA's scheduler on its first use
        if len(self._metas) > 64:
            self._metas.clear()
        self._metas[key] = (weakref.ref(cache_seqlens), meta)
        return meta

    def paged(self, q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, cache_seqlens: torch.Tensor,
              scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        if kv_cache.dim() != 3 or kv_cache.shape[1] != FLASHMLA_PAGE:
            raise ValueError(f"FlashMLA's dense decode takes pages of {FLASHMLA_PAGE} tokens, got kv_cache {tuple(kv_cache.shape)}")
        return self._call(q, kv_cache.unsqueeze(2), block_table, cache_seqlens, LATENT_DIM, self._meta(q, cache_seqlens), None,
                          softmax_scale=scale, causal=q.shape[1] > 1, **self._extra)

    def dense(self, q: torch.Tensor, kv: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        B, Skv, D = kv.shape
        if Skv % FLASHMLA_PAGE or not kv.is_contiguous():
            raise ValueError(f"FlashMLA reads a contiguous cache as pages of {FLASHMLA_PAGE} tokens: Skv={Skv} is not a multiple")
        key = (kv.device, B, Skv)
        table = self._dense.get(key)
        if table is None:  # pages in order; the lengths never change, so neither does the metadata
            pages = B * Skv // FLASHMLA_PAGE
            table = self._dense[key] = (torch.arange(pages, dtype=torch.int32, device=kv.device).view(B, -1),
                                        torch.full((B,), Skv, dtype=torch.int32, device=kv.device))
        return self.paged(q, kv.view(-1, FLASHMLA_PAGE, D), table[0], table[1], scale)


@functools.lru_cache(maxsize=None)
def flashmla_status() -> tuple[FlashMLA | None, str]:
    """(the FlashMLA baseline, "") where ``flash_mla`` imports with its SM90 dense decode, else
    (None, why not)."""
    try:
        import flash_mla

        if hasattr(flash_mla, "has_legacy") and not flash_mla.has_legacy():
            return None, "flash_mla imports but was built without its legacy (SM90 dense decode) kernels"
        return FlashMLA(flash_mla), ""
    except Exception as exc:  # not installed, or built for another torch: the baseline is skipped
        return None, f"flash_mla does not import ({type(exc).__name__}: {str(exc)[:200]}); {FLASHMLA_INSTALL}"


def flashmla_baseline(device: str) -> FlashMLA | None:
    """The FlashMLA baseline on a GPU where it imports; None (the reason logged once) otherwise."""
    if not _on_gpu(device):
        return None
    flashmla, reason = flashmla_status()
    if flashmla is None:
        _log_skip(reason)
    return flashmla


@functools.lru_cache(maxsize=None)
def _log_skip(reason: str) -> None:
    logging.getLogger(__name__).warning("FlashMLA baseline skipped: %s", reason)


MLA = register_problem(MLADecode())
MLA_PREFILL = register_problem(MLAPrefill())
