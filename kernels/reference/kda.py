"""Kimi Delta Attention (KDA) forward in plain PyTorch: the ground truth candidates are judged by.

Shapes: q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; g ``[B, T, H, K]`` (per-channel decay in
natural-log space, g <= 0); beta ``[B, T, H]``; state ``[B, H, K, V]``. For each head, with a
K x V state S, every step t does::

    S   = exp(g_t)[:, None] * S                      # per-key-channel forgetting
    S   = S + beta_t * outer(k_t, v_t - S^T k_t)     # delta rule: move S^T k_t towards v_t
    o_t = S^T (scale * q_t)                          # read out

Two forms live here:

- ``naive_recurrent_kda`` follows the three lines above step by step (float64 by default):
  slow, obviously right, the ground truth.
- ``chunk_kda_reference`` computes the same thing chunk by chunk with matrix products, fast
  enough for T=8192 on a GPU. It must stay exact for *any* gate in (-inf, 0] -- isolated
  -1000 resets, long runs of strong decay -- so it never splits a decay exp(G_i - G_j) into
  exp(G_i) * exp(-G_j) (exp(-G_j) overflows once a chunk's cumulative gate passes about -88 in
  float32). Every exponent it takes is a sum of gates, hence <= 0, and every exp is <= 1.

Both return the output and final state in the accumulation dtype (not rounded to the input
dtype): they are references, and rounding would add error of their own.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


def _check_shapes(q, k, v, g, beta, initial_state):
    B, T, H, K = q.shape
    V = v.shape[-1]
    if k.shape != q.shape or g.shape != q.shape:
        raise ValueError(f"q, k and g must share the shape [B, T, H, K]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(g.shape)}")
    if tuple(v.shape) != (B, T, H, V) or tuple(beta.shape) != (B, T, H):
        raise ValueError(f"v must be [B, T, H, V] and beta [B, T, H]; got {tuple(v.shape)} and {tuple(beta.shape)}")
    if initial_state is not None and tuple(initial_state.shape) != (B, H, K, V):
        raise ValueError(f"initial_state must be [B, H, K, V] = {(B, H, K, V)}; got {tuple(initial_state.shape)}")
    return B, T, H, K, V


def naive_recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    accum_dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The KDA recurrence one time step at a time, vectorised over batch and heads.

    Returns ``(o [B, T, H, V], final_state [B, H, K, V] or None)``, both in ``accum_dtype``.
    """
    B, T, H, K, V = _check_shapes(q, k, v, g, beta, initial_state)
    if scale is None:
        scale = K**-0.5
    q, k, v, g, beta = (x.to(accum_dtype) for x in (q, k, v, g, beta))
    if initial_state is None:
        S = q.new_zeros(B, H, K, V)
    else:
        S = initial_state.to(accum_dtype).clone()
    o = q.new_empty(B, T, H, V)
    for t in range(T):
        q_t, k_t, v_t = q[:, t], k[:, t], v[:, t]  # [B, H, K], [B, H, K], [B, H, V]
        S = S * torch.exp(g[:, t]).unsqueeze(-1)
        predicted = torch.einsum("bhk,bhkv->bhv", k_t, S)  # what S currently recalls for k_t
        correction = beta[:, t, :, None] * (v_t - predicted)  # [B, H, V]
        S = S + k_t.unsqueeze(-1) * correction.unsqueeze(-2)
        o[:, t] = torch.einsum("bhk,bhkv->bhv", q_t * scale, S)
    return o, (S if output_final_state else None)


@contextmanager
def _full_precision_matmuls(device: torch.device):
    """On a GPU, run float32 matmuls in IEEE float32 even if someone switched TF32 on (TF32
    keeps 10 mantissa bits: ~1e-3 error, too close to the tolerances judged against)."""
    matmul = torch.backends.cuda.matmul
    if device.type != "cuda" or not hasattr(matmul, "fp32_precision"):
        yield
        return
    previous = matmul.fp32_precision
    matmul.fp32_precision = "ieee"
    try:
        yield
    finally:
        matmul.fp32_precision = previous


def _chunk_slab(n_chunks: int, per_chunk_elems: int, budget_elems: int = 1 << 27) -> int:
    """How many chunks to expand pairwise at once, so the [.., C, C, K] decays stay ~0.5-1 GB."""
    return max(1, min(n_chunks, budget_elems // max(1, per_chunk_elems)))


def chunk_kda_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
    accum_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """KDA computed chunk by chunk (the UT / WY form), same results as ``naive_recurrent_kda``.

    Inside a chunk of length C, write G_i for the running sum of g from the chunk's start to
    position i (inclusive) and S0 for the state entering the chunk. Unrolling the recurrence,
    the state after position i is

        S_i = exp(G_i) * S0 + sum_{j<=i} (exp(G_i - G_j) * k_j) u_j^T

    where u_j = beta_j (v_j - (exp(g_j) * S_{j-1})^T k_j) is the delta-rule update of step j.
    Substituting S_{j-1} shows the u's solve a unit lower-triangular system

        (I + A) U = beta * V - (beta * exp(G) * k) S0,   A_ij = beta_i <k_i, exp(G_i - G_j) * k_j>, j < i

    so U = u - w S0 with u = (I + A)^-1 (beta V) and w = (I + A)^-1 (beta exp(G) k), both
    independent of S0 and hence computed for all chunks at once. Then, chunk after chunk,

        o     = (scale q exp(G)) S0 + P U,   P_ij = scale <q_i, exp(G_i - G_j) * k_j>, j <= i
        S_C   = exp(G_last) * S0 + (exp(G_last - G) * k)^T U

    The pairwise decays exp(G_i - G_j) are taken only where i >= j (the rest are set to -inf
    before exp), so no exponent is ever positive. Running sums are kept in float64 so that a
    difference of two large sums (after a -1000 reset) keeps its precision; the remaining work
    runs in ``accum_dtype``. The sequence is padded to a whole number of chunks with g = 0,
    beta = 0, k = 0, which leaves the state untouched.

    Returns ``(o [B, T, H, V], final_state [B, H, K, V] or None)`` in ``accum_dtype``.
    """
    with _full_precision_matmuls(q.device):
        return _chunk_kda(q, k, v, g, beta, scale, initial_state, output_final_state, int(chunk_size), accum_dtype)


def _chunk_kda(q, k, v, g, beta, scale, initial_state, output_final_state, C, acc):
    B, T, H, K, V = _check_shapes(q, k, v, g, beta, initial_state)
    if scale is None:
        scale = K**-0.5
    if C < 1:
        raise ValueError(f"chunk_size must be positive, got {C}")
    dev = q.device
    N = max(1, -(-T // C))
    pad = N * C - T

    def heads_first(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        # [B, T, H, ...] -> [B, H, N, C, ...], zero-padded along time
        x = x.to(dtype).transpose(1, 2)
        if pad:
            x = torch.cat([x, x.new_zeros(*x.shape[:2], pad, *x.shape[3:])], dim=2)
        return x.reshape(B, H, N, C, *x.shape[3:])

    qc, kc, vc = heads_first(q, acc), heads_first(k, acc), heads_first(v, acc)
    bc = heads_first(beta, acc)  # [B, H, N, C]
    G = heads_first(g, torch.float64).cumsum(dim=3)  # [B, H, N, C, K], every entry <= 0
    G_last = G[:, :, :, -1:, :]  # [B, H, N, 1, K]

    q_decayed = (qc * scale) * torch.exp(G).to(acc)  # scale * exp(G_i) * q_i
    k_decayed = kc * torch.exp(G).to(acc)  # exp(G_i) * k_i
    k_to_end = kc * torch.exp(G_last - G).to(acc)  # exp(G_last - G_j) * k_j
    state_decay = torch.exp(G_last[:, :, :, 0, :]).to(acc)  # [B, H, N, K]

    # Intra-chunk matrices, a slab of chunks at a time so the pairwise decays fit in memory.
    causal = torch.ones(C, C, dtype=torch.bool, device=dev).tril()  # i >= j
    eye = torch.eye(C, dtype=acc, device=dev)
    P = qc.new_empty(B, H, N, C, C)
    u = qc.new_empty(B, H, N, C, V)
    w = qc.new_empty(B, H, N, C, K)
    step = _chunk_slab(N, B * H * C * C * K)
    for n0 in range(0, N, step):
        sl = slice(n0, min(N, n0 + step))
        Gs = G[:, :, sl]
        diff = Gs.unsqueeze(-2) - Gs.unsqueeze(-3)  # [.., i, j, K] = G_i - G_j
        decay = torch.exp(diff.masked_fill(~causal[:, :, None], float("-inf"))).to(acc)
        del diff
        k_j = kc[:, :, sl].unsqueeze(-3)  # [.., 1, j, K]
        P[:, :, sl] = ((qc[:, :, sl] * scale).unsqueeze(-2) * decay * k_j).sum(-1)
        A = (kc[:, :, sl].unsqueeze(-2) * decay * k_j).sum(-1)  # [.., i, j]
        del decay
        A = (bc[:, :, sl].unsqueeze(-1) * A).tril(-1)
        lower = eye + A  # unit lower triangular
        u[:, :, sl] = torch.linalg.solve_triangular(lower, bc[:, :, sl].unsqueeze(-1) * vc[:, :, sl], upper=False, unitriangular=True)
        w[:, :, sl] = torch.linalg.solve_triangular(lower, bc[:, :, sl].unsqueeze(-1) * k_decayed[:, :, sl], upper=False, unitriangular=True)

    # Across chunks: carry the state, the only sequential part.
    if initial_state is None:
        S = qc.new_zeros(B, H, K, V)
    else:
        S = initial_state.to(device=dev, dtype=acc).clone()
    o = qc.new_empty(B, H, N, C, V)
    for n in range(N):
        U = u[:, :, n] - w[:, :, n] @ S  # [B, H, C, V]
        o[:, :, n] = q_decayed[:, :, n] @ S + P[:, :, n] @ U
        S = state_decay[:, :, n].unsqueeze(-1) * S + k_to_end[:, :, n].transpose(-1, -2) @ U
    o = o.reshape(B, H, N * C, V)[:, :, :T].transpose(1, 2).contiguous()
    return o, (S if output_final_state else None)
