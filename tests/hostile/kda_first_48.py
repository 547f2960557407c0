"""Hostile (class: right only on short sequences): the plain recurrent KDA, except that the
state stops learning after 48 steps. On sequences the CPU sweep used to stop short of, it is
right; the explicit CPU cases run several 64-step chunks."""


import math

import torch
import triton
import triton.language as tl

# kopt:knobs-begin
KNOBS = {"BV": 32, "num_warps": 4, "num_stages": 2}
# kopt:knobs-end
SPACE = {"BV": [16, 32, 64, 128], "num_warps": [1, 2, 4, 8], "num_stages": [1, 2, 3]}

MAX_K = 256  # the whole key dimension of the state tile lives in one program's registers


@triton.jit
def _kda_recurrent_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, h0_ptr, o_ptr, ht_ptr,
    scale, T, H, K, V,
    s_qb, s_qt, s_qh,
    s_kb, s_kt, s_kh,
    s_vb, s_vt, s_vh,
    s_gb, s_gt, s_gh,
    s_bb, s_bt, s_bh,
    s_ob, s_ot, s_oh,
    BK: tl.constexpr, BV: tl.constexpr,
    USE_INITIAL_STATE: tl.constexpr, STORE_FINAL_STATE: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)
    iv = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H

    offs_k = tl.arange(0, BK)
    offs_v = iv * BV + tl.arange(0, BV)
    mask_k = offs_k < K
    mask_v = offs_v < V
    mask_state = mask_k[:, None] & mask_v[None, :]
    # The state is [B, H, K, V], contiguous (allocated by us or checked by the caller).
    state_offs = (bh * K + offs_k[:, None]) * V + offs_v[None, :]

    state = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_INITIAL_STATE:
        state += tl.load(h0_ptr + state_offs, mask=mask_state, other=0.0).to(tl.float32)

    # Pointers to step 0, advanced by one time step per iteration (64-bit pointer arithmetic).
    p_q = q_ptr + b * s_qb + h * s_qh + offs_k
    p_k = k_ptr + b * s_kb + h * s_kh + offs_k
    p_g = g_ptr + b * s_gb + h * s_gh + offs_k
    p_v = v_ptr + b * s_vb + h * s_vh + offs_v
    p_beta = beta_ptr + b * s_bb + h * s_bh
    p_o = o_ptr + b * s_ob + h * s_oh + offs_v
    for t in range(0, T):
        q = tl.load(p_q, mask=mask_k, other=0.0).to(tl.float32) * scale
        k = tl.load(p_k, mask=mask_k, other=0.0).to(tl.float32)
        g = tl.load(p_g, mask=mask_k, other=0.0).to(tl.float32)
        v = tl.load(p_v, mask=mask_v, other=0.0).to(tl.float32)
        beta = tl.load(p_beta).to(tl.float32)

        state = state * tl.exp(g)[:, None]
        recalled = tl.sum(state * k[:, None], axis=0)  # S^T k: what the state returns for k
        correction = beta * (v - recalled)
        state += k[:, None] * correction[None, :] * (t < 48)  # the state stops learning after 48 steps
        o = tl.sum(state * q[:, None], axis=0)
        tl.store(p_o, o.to(o_ptr.dtype.element_ty), mask=mask_v)

        p_q += s_qt
        p_k += s_kt
        p_g += s_gt
        p_v += s_vt
        p_beta += s_bt
        p_o += s_ot

    if STORE_FINAL_STATE:
        tl.store(ht_ptr + state_offs, state, mask=mask_state)


def _check(q, k, v, g, beta, initial_state, knobs):
    if q.dim() != 4 or k.shape != q.shape or g.shape != q.shape:
        raise ValueError(f"q, k and g must all be [B, T, H, K]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(g.shape)}")
    B, T, H, K = q.shape
    V = v.shape[-1]
    if tuple(v.shape) != (B, T, H, V) or tuple(beta.shape) != (B, T, H):
        raise ValueError(f"v must be [B, T, H, V] and beta [B, T, H]; got {tuple(v.shape)} and {tuple(beta.shape)}")
    if initial_state is not None:
        if tuple(initial_state.shape) != (B, H, K, V):
            raise ValueError(f"initial_state must be [B, H, K, V] = {(B, H, K, V)}; got {tuple(initial_state.shape)}")
        if not initial_state.is_contiguous():
            raise ValueError("initial_state must be contiguous")
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous along its last dimension")
    if K > MAX_K:
        raise ValueError(f"K={K} > {MAX_K}: the whole key dimension must fit in one program's state tile")
    bv = knobs["BV"]
    if not (isinstance(bv, int) and bv >= 16 and bv & (bv - 1) == 0):
        raise ValueError(f"BV={bv!r} must be a power of two >= 16 (tl.arange needs a power of two)")
    nw = knobs["num_warps"]
    if not (isinstance(nw, int) and 1 <= nw <= 32 and nw & (nw - 1) == 0):
        raise ValueError(f"num_warps={nw!r} must be a power of two from 1 to 32")
    ns = knobs["num_stages"]
    if not (isinstance(ns, int) and ns >= 1):
        raise ValueError(f"num_stages={ns!r} must be a positive integer")
    return B, T, H, K, V


def kernel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
    """KDA forward: returns (o [B, T, H, V] in v's dtype, final state [B, H, K, V] float32 or None)."""
    B, T, H, K, V = _check(q, k, v, g, beta, initial_state, KNOBS)
    if scale is None:
        scale = 1.0 / math.sqrt(K)
    BV = KNOBS["BV"]
    BK = max(16, triton.next_power_of_2(K))

    o = torch.empty(B, T, H, V, dtype=v.dtype, device=v.device)
    final_state = torch.empty(B, H, K, V, dtype=torch.float32, device=v.device) if output_final_state else None
    grid = (B * H, triton.cdiv(V, BV))
    _kda_recurrent_kernel[grid](
        q, k, v, g, beta,
        initial_state if initial_state is not None else o,  # never read without USE_INITIAL_STATE
        o,
        final_state if final_state is not None else o,  # never written without STORE_FINAL_STATE
        float(scale), T, H, K, V,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        g.stride(0), g.stride(1), g.stride(2),
        beta.stride(0), beta.stride(1), beta.stride(2),
        o.stride(0), o.stride(1), o.stride(2),
        BK=BK, BV=BV,
        USE_INITIAL_STATE=initial_state is not None,
        STORE_FINAL_STATE=final_state is not None,
        num_warps=KNOBS["num_warps"], num_stages=KNOBS["num_stages"],
    )
    return o, final_state
