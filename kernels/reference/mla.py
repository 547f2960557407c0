"""MLA attention in the absorbed form (DeepSeek-V2/V3 decode, MTP and prefill): the ground truth.

In the absorbed form every head attends over one shared latent cache, so MLA is multi-query
attention with a 576-wide key and a 512-wide value taken from the same rows:

    q   [B, Sq, H, 576]   512 latent columns + 64 rope columns per head
    kv  [B, Skv, 576]     one row per cached token; the key is the whole row,
                          the value is its first 512 columns
    scale                 explicit (DeepSeek uses 1/sqrt(192): the 128+64 head size before absorption)

    s[b, h, i, j] = scale * q[b, i, h, :] . kv[b, j, :]
    query i sees key j only when j <= i + Skv - Sq   (causal, aligned to the bottom-right corner:
                          the last query is the newest token and sees the whole cache; with Sq = 1
                          this masks nothing)
    lse[b, h, i]  = log(sum_j exp(s[b, h, i, j]))             natural log, float32
    o[b, i, h, :] = sum_j exp(s[b, h, i, j] - lse[b, h, i]) * kv[b, j, :512]

Both functions return ``(o [B, Sq, H, 512], lse [B, H, Sq] float32)`` and need Sq <= Skv.
"""

from __future__ import annotations

import contextlib

import torch

LATENT_DIM = 512  # value width: the first LATENT_DIM columns of each kv row
ROPE_DIM = 64
HEAD_DIM = LATENT_DIM + ROPE_DIM  # key width (576)

# Scores held at once by the reference: bounds its memory at any shape (2**27 float32 is 512 MiB).
_MAX_SCORES = 2**27


def _check_shapes(q: torch.Tensor, kv: torch.Tensor) -> tuple[int, int, int, int]:
    if q.dim() != 4 or q.shape[-1] != HEAD_DIM:
        raise ValueError(f"q must be [B, Sq, H, {HEAD_DIM}], got {tuple(q.shape)}")
    B, Sq, H, _ = q.shape
    if kv.dim() != 3 or kv.shape[0] != B or kv.shape[-1] != HEAD_DIM:
        raise ValueError(f"kv must be [B={B}, Skv, {HEAD_DIM}], got {tuple(kv.shape)}")
    Skv = kv.shape[1]
    if not 1 <= Sq <= Skv:
        raise ValueError(f"need 1 <= Sq <= Skv, got Sq={Sq}, Skv={Skv}")
    return B, Sq, H, Skv


def causal_mask(query_start: int, n_queries: int, Sq: int, Skv: int, device: torch.device) -> torch.Tensor:
    """True where a key is hidden from a query: [n_queries, 1, Skv], broadcast over heads."""
    i = torch.arange(query_start, query_start + n_queries, device=device)
    j = torch.arange(Skv, device=device)
    return (j[None, :] > i[:, None] + (Skv - Sq))[:, None, :]


@contextlib.contextmanager
def _exact_float32_matmul(device: torch.device):
    """TF32 would cost the reference ~1e-3 of accuracy on a GPU; keep full float32 while it runs."""
    if device.type != "cuda":
        yield
        return
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)


@torch.no_grad()
def mla_reference(q: torch.Tensor, kv: torch.Tensor, scale: float, *, accum_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact MLA attention in ``accum_dtype`` (float64 on CPU, float32 on a GPU by default).

    Queries are processed in chunks so that the [B, chunk, H, Skv] score block stays under
    ``_MAX_SCORES`` elements: Sq = Skv = 8192 at H = 64 runs in 32 chunks of 256 queries
    instead of materialising 2**32 scores. ``o`` comes back in ``accum_dtype`` (the judge
    compares in float64), ``lse`` in float32.
    """
    B, Sq, H, Skv = _check_shapes(q, kv)
    if accum_dtype is None:
        accum_dtype = torch.float32 if q.device.type == "cuda" else torch.float64
    keys = kv.to(accum_dtype)  # [B, Skv, 576]
    keys_t = keys.transpose(1, 2)  # [B, 576, Skv]
    values = keys[..., :LATENT_DIM]  # [B, Skv, 512]
    o = torch.empty(B, Sq, H, LATENT_DIM, dtype=accum_dtype, device=q.device)
    lse = torch.empty(B, Sq, H, dtype=accum_dtype, device=q.device)
    chunk = max(1, _MAX_SCORES // (B * H * Skv))
    with _exact_float32_matmul(q.device):
        for start in range(0, Sq, chunk):
            n = min(chunk, Sq - start)
            # Heads share the cache, so (query, head) pairs fold into one matmul dimension.
            qc = q[:, start:start + n].to(accum_dtype).reshape(B, n * H, HEAD_DIM)
            scores = torch.bmm(qc, keys_t).view(B, n, H, Skv) * scale
            scores.masked_fill_(causal_mask(start, n, Sq, Skv, q.device), float("-inf"))
            row_lse = torch.logsumexp(scores, dim=-1)  # [B, n, H]; every row sees key 0, so finite
            probs = torch.exp(scores - row_lse[..., None])
            o[:, start:start + n] = torch.bmm(probs.view(B, n * H, Skv), values).view(B, n, H, LATENT_DIM)
            lse[:, start:start + n] = row_lse
    return o, lse.permute(0, 2, 1).to(torch.float32).contiguous()


@torch.no_grad()
def mla_eager_bf16(q: torch.Tensor, kv: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """What a user would write in eager PyTorch: matmuls in the inputs' dtype (bf16), softmax in float32.

    This is the timed baseline. It materialises all [B, Sq, H, Skv] scores, as plain eager
    code does; (query, head) pairs share one batched matmul, so the cache is never copied per head.
    """
    B, Sq, H, Skv = _check_shapes(q, kv)
    dtype = q.dtype
    kv = kv.to(dtype)
    scores = torch.bmm(q.reshape(B, Sq * H, HEAD_DIM), kv.transpose(1, 2)).float().view(B, Sq, H, Skv)
    scores.mul_(scale)
    if Sq > 1:
        scores.masked_fill_(causal_mask(0, Sq, Sq, Skv, q.device), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [B, Sq, H]
    probs = scores.sub_(lse[..., None]).exp_().to(dtype)
    o = torch.bmm(probs.view(B, Sq * H, Skv), kv[..., :LATENT_DIM]).view(B, Sq, H, LATENT_DIM)
    return o, lse.permute(0, 2, 1).contiguous()
