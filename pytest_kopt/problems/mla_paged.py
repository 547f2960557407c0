"""``mla-paged``: MLA decode as inference engines call it, on a paged latent cache with a length
per sequence (FlashMLA's layout).

    kernel(q, kv_cache, block_table, cache_seqlens, scale) -> (o, lse)

q [B, Sq, H, 576] bf16; kv_cache [num_pages, page_size, 576] bf16; block_table [B, max_pages]
int32; cache_seqlens [B] int32. Sequence b's Sq new tokens are the last Sq of its cache_seqlens[b]
tokens (bottom-right causal, as in ``mla``). o [B, Sq, H, 512] in q's dtype, lse [B, H, Sq]
float32. The math and the layout are written out in ``kernels/reference/mla.py``.

A case is ``{"B", "Sq", "H", ...}`` plus the lengths, in one of three forms:
- ``"Skv": n``: every sequence n tokens long;
- ``"lengths": [n0, n1, ...]``: one length per sequence (the hypothesis cases);
- ``"dist": "longtail", "min_len": lo, "Skv": hi, "lengths_seed": s``: lengths drawn once from a
  log-normal (median LONGTAIL_MEDIAN, sigma LONGTAIL_SIGMA) clipped to [lo, hi], seeded by the case,
  so every input set of the case has the same lengths (and the same shapes).
Options: ``page_size`` (default 64), ``shared_pages`` (the first k pages of every sequence are the
same physical pages: a prefix-cache hit), ``table_slack`` (block-table columns past the longest
sequence), ``spare_pages`` (pages no sequence uses), ``q_scale`` (q multiplied by it: 32 makes the
softmax nearly one-hot, 0.01 nearly flat).

Inputs look like an allocator left them: pages in a random order (seeded by the input seed), the
unused slots of each sequence's last page, the spare pages and therefore every block-table entry
past a sequence's last page (they point at a spare page) hold NaN. A kernel that reads a key it
must not, or multiplies a masked weight by an unread value (0 * NaN), returns NaN and fails.
"""

from __future__ import annotations

from typing import Any

import torch

from pytest_kopt.kernels.reference.mla import HEAD_DIM, LATENT_DIM, mla_paged_eager_bf16, mla_paged_reference

from .. import KERNELS_DIR
from . import register_problem
from .base import Baseline, Case, Cost, OutputSpec, Problem
from .mla import DEEPSEEK_SCALE, INPUT_STD, flashmla_baseline

PAGE_SIZE = 64  # engines' and FlashMLA's page of the latent cache
LONGTAIL_MEDIAN = 2048  # tokens: the serving mix's typical context
LONGTAIL_SIGMA = 1.2  # log-normal spread: at B128, a few sequences reach the 32768 cap


def case_lengths(case: Case) -> list[int]:
    """Each sequence's length for ``case`` (see the module doc for the three forms)."""
    B = int(case["B"])
    if "lengths" in case:
        lengths = [int(n) for n in case["lengths"]]
        if len(lengths) != B:
            raise ValueError(f"mla-paged: {len(lengths)} lengths for B={B}")
        return lengths
    if case.get("dist") == "longtail":
        gen = torch.Generator().manual_seed(int(case["lengths_seed"]))
        z = torch.randn(B, generator=gen, dtype=torch.float64)
        drawn = (LONGTAIL_MEDIAN * torch.exp(LONGTAIL_SIGMA * z)).round().clamp(int(case["min_len"]), int(case["Skv"]))
        return [int(n) for n in drawn.tolist()]
    if "dist" in case:
        raise ValueError(f"mla-paged: unknown length distribution {case['dist']!r} (known: 'longtail')")
    return [int(case["Skv"])] * B


def page_layout(case: Case, lengths: list[int], seed: int) -> tuple[torch.Tensor, int, torch.Tensor]:
    """(block_table [B, max_pages] int32, num_pages, garbage [num_pages, page_size] bool) on the CPU:
    pages handed out in a seeded random order, shared prefix pages first; every entry past a
    sequence's last page points at a spare page; ``garbage`` marks the slots no sequence owns."""
    ps = int(case.get("page_size", PAGE_SIZE))
    shared = int(case.get("shared_pages", 0))
    if shared * ps > min(lengths):
        raise ValueError(f"mla-paged: {shared} shared pages of {ps} tokens exceed the shortest length {min(lengths)}")
    pages = [-(-n // ps) for n in lengths]
    distinct = shared + sum(p - shared for p in pages)
    spare = int(case.get("spare_pages", 1 + distinct // 16))
    if spare < 1:
        raise ValueError("mla-paged: spare_pages must be >= 1 (unused block-table entries point at one)")
    num_pages = distinct + spare
    order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed)).to(torch.int32)
    max_pages = max(pages) + int(case.get("table_slack", 0))
    table = torch.full((len(lengths), max_pages), int(order[distinct]), dtype=torch.int32)
    garbage = torch.zeros(num_pages, ps, dtype=torch.bool)
    garbage[order[distinct:].long()] = True
    cursor = shared
    for b, (n, p) in enumerate(zip(lengths, pages)):
        table[b, :shared] = order[:shared]
        table[b, shared:p] = order[cursor:cursor + p - shared]
        cursor += p - shared
        if n % ps:  # the last page is the sequence's own (shared pages are full): its tail is unused
            garbage[int(table[b, p - 1]), n % ps:] = True
    return table, num_pages, garbage


def _describe_lengths(case: Case) -> str:
    if "lengths" in case:
        lengths = [int(n) for n in case["lengths"]]
        return "len[" + ",".join(map(str, lengths)) + "]" if len(lengths) <= 6 else f"len{min(lengths)}-{max(lengths)}x{len(lengths)}"
    if case.get("dist") == "longtail":
        lengths = case_lengths(case)
        return f"len{case['min_len']}-{case['Skv']} longtail s{case['lengths_seed']} (max {max(lengths)}, mean {sum(lengths) / len(lengths):.0f})"
    return f"Skv{case['Skv']}"


class MLAPaged(Problem):
    name = "mla-paged"
    description = (
        "DeepSeek MLA decode / multi-token prediction on a paged latent cache, as inference engines call it: "
        "q [B,Sq,H,576], kv_cache [num_pages,page_size,576] (pages in any order), block_table [B,max_pages] int32, "
        "cache_seqlens [B] int32 (a length per sequence; the Sq new tokens at its end, bottom-right causal); "
        "returns o [B,Sq,H,512] and lse [B,H,Sq] float32."
    )
    signature = "kernel(q, kv_cache, block_table, cache_seqlens, scale) -> (o, lse)"
    outputs = (OutputSpec("o", 5e-3), OutputSpec("lse", 5e-4))  # as ``mla``: bf16 rounding of o is ~1.7e-3
    reference_path = KERNELS_DIR / "reference" / "mla.py"
    baseline_candidate_path = KERNELS_DIR / "families" / "mla_paged_naive.py"
    families = ("mla_paged_naive", "mla_paged")
    headline_cases = (
        {"B": 1, "Sq": 1, "H": 64, "Skv": 8192},
        {"B": 1, "Sq": 2, "H": 64, "Skv": 8192},
        {"B": 1, "Sq": 4, "H": 64, "Skv": 8192},
        {"B": 64, "Sq": 1, "H": 64, "Skv": 8192},
        {"B": 128, "Sq": 1, "H": 64, "dist": "longtail", "min_len": 512, "Skv": 32768, "lengths_seed": 0},
        {"B": 32, "Sq": 4, "H": 64, "Skv": 8192},
        # reported by the benchmarks, never timed by the loop: a check against over-fitting
        {"B": 32, "Sq": 1, "H": 64, "Skv": 8192},
        {"B": 1, "Sq": 1, "H": 64, "Skv": 131072},
    )
    # latency (B1 Sq1), MTP (B1 Sq4), bandwidth (B64), unequal lengths (B128) and batched MTP
    # (B32 Sq4): a kernel tuned for one regime cannot regress another unseen
    timed_headline = (0, 2, 3, 4, 5)
    smoke_case = {"B": 2, "Sq": 2, "H": 16, "page_size": 16, "lengths": [37, 20]}

    # ---- inputs and truth -------------------------------------------------------------
    def make_inputs(self, case: Case, *, device: str | torch.device, seed: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
        B, Sq, H = (int(case[k]) for k in ("B", "Sq", "H"))
        lengths = case_lengths(case)
        if Sq < 1 or min(lengths) < Sq:
            raise ValueError(f"mla-paged: need 1 <= Sq <= every length, got Sq={Sq} and lengths down to {min(lengths)}")
        table, num_pages, garbage = page_layout(case, lengths, seed)
        device = torch.device(device)
        gen = torch.Generator(device=device).manual_seed(seed)
        q = torch.randn(B, Sq, H, HEAD_DIM, generator=gen, device=device) * (INPUT_STD * float(case.get("q_scale", 1.0)))
        kv_cache = torch.randn(num_pages, garbage.shape[1], HEAD_DIM, generator=gen, device=device) * INPUT_STD
        kv_cache.masked_fill_(garbage.to(device)[..., None], float("nan"))
        return {
            "q": q.to(dtype), "kv_cache": kv_cache.to(dtype), "block_table": table.to(device),
            "cache_seqlens": torch.tensor(lengths, dtype=torch.int32, device=device), "scale": DEEPSEEK_SCALE,
        }

    def reference(self, **inputs: Any) -> tuple[Any, ...]:
        return mla_paged_reference(inputs["q"], inputs["kv_cache"], inputs["block_table"], inputs["cache_seqlens"], inputs["scale"])

    def expected_dtypes(self, inputs: dict[str, Any]) -> dict[str, torch.dtype]:
        return {"o": inputs["q"].dtype, "lse": torch.float32}

    # ---- shapes and costs --------------------------------------------------------------
    def case_strategy(self, device: str) -> Any:
        """Length 1, lengths not a multiple of the page, unequal lengths in one batch, shared
        prefix pages, slack table columns, and q scaled by 32 and 0.01 beside the typical 1.
        The CPU strategy keeps B * H * Sq <= 128 programs of a plain kernel (the interpreter)."""
        from hypothesis import strategies as st

        if str(device).startswith("cuda"):
            B, Sq, H, pages, max_len, cap = st.integers(1, 8), st.integers(1, 8), st.sampled_from([16, 32, 64, 128]), [16, 64, 64, 128], 4096, None
        else:
            B, Sq, H, pages, max_len, cap = st.integers(1, 3), st.integers(1, 3), st.sampled_from([1, 2, 16]), [1, 4, 16, 64], 70, 128

        @st.composite
        def cases(draw):
            b, h = draw(B), draw(H)
            sq = draw(Sq) if cap is None else draw(st.integers(1, max(1, min(3, cap // (b * h)))))
            ps = draw(st.sampled_from(pages))
            lengths = draw(st.lists(st.integers(sq, max_len), min_size=b, max_size=b))
            case = {"B": b, "Sq": sq, "H": h, "page_size": ps, "lengths": lengths}
            shared = draw(st.integers(0, min(2, min(lengths) // ps)))
            if shared:
                case["shared_pages"] = shared
            slack = draw(st.integers(0, 2))
            if slack:
                case["table_slack"] = slack
            q_scale = draw(st.sampled_from([1.0, 1.0, 32.0, 0.01]))
            if q_scale != 1.0:
                case["q_scale"] = q_scale
            return case

        return cases()

    def cost(self, case: Case) -> Cost:
        """q, the lengths' worth of cache, o, lse, the used block-table entries and the lengths, each
        once (bf16 q, cache and o); FLOPs of QK^T (576 wide) and PV (512 wide) over the (query,
        head, key) triples the causal mask keeps, sequence by sequence."""
        B, Sq, H = (int(case[k]) for k in ("B", "Sq", "H"))
        lengths = case_lengths(case)
        ps = int(case.get("page_size", PAGE_SIZE))
        elt = 2
        tokens = sum(lengths)
        bytes_ = elt * (B * Sq * H * HEAD_DIM + tokens * HEAD_DIM + B * Sq * H * LATENT_DIM) + 4 * B * H * Sq
        bytes_ += 4 * sum(-(-n // ps) for n in lengths) + 4 * B
        visible = sum(Sq * (n - Sq + 1) + Sq * (Sq - 1) // 2 for n in lengths)
        return Cost(bytes=float(bytes_), flops=float(2 * (HEAD_DIM + LATENT_DIM) * H * visible))

    def describe(self, case: Case) -> str:
        label = f"B{case['B']} Sq{case['Sq']} H{case['H']} {_describe_lengths(case)}"
        if int(case.get("page_size", PAGE_SIZE)) != PAGE_SIZE:
            label += f" p{case['page_size']}"
        if case.get("shared_pages"):
            label += f" shared{case['shared_pages']}"
        if case.get("table_slack"):
            label += f" slack{case['table_slack']}"
        if float(case.get("q_scale", 1.0)) != 1.0:
            label += f" q*{case['q_scale']:g}"
        return label

    def baselines(self, device: str) -> list[Baseline]:
        """FlashMLA where it imports (it takes this layout as it is; pages of 64 only), then the
        eager PyTorch gather path."""
        flashmla = flashmla_baseline(device)
        found = [Baseline("flashmla", flashmla.paged)] if flashmla is not None else []
        return found + [Baseline("torch-eager-gather-bf16", mla_paged_eager_bf16)]


MLA_PAGED = register_problem(MLAPaged())
