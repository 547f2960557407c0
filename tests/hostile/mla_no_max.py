"""Hostile (class: numerics checked only on unit-variance inputs): the plain MLA kernel with a
softmax that never subtracts its running max. Right on unit-variance inputs; on logits 32x
larger exp overflows to inf. The problem's stress inputs include q x 32."""


import torch
import triton
import triton.language as tl

# kopt:knobs-begin
KNOBS = {"BLOCK_N": 32, "num_warps": 4, "num_stages": 2}
# kopt:knobs-end
SPACE = {"BLOCK_N": [16, 32, 64], "num_warps": [2, 4, 8], "num_stages": [1, 2, 3]}

LATENT_DIM = 512
ROPE_DIM = 64


@triton.jit
def _mla_naive_kernel(
    q_ptr, kv_ptr, o_ptr, lse_ptr,
    scale, Sq, Skv, H,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks,
    stride_ob, stride_os, stride_oh,
    D_LAT: tl.constexpr, D_ROPE: tl.constexpr, BLOCK_N: tl.constexpr,
):
    h = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)

    offs_lat = tl.arange(0, D_LAT)
    offs_rope = tl.arange(0, D_ROPE)
    q_row = q_ptr + b * stride_qb + i * stride_qs + h * stride_qh
    q_lat = tl.load(q_row + offs_lat).to(tl.float32)
    q_rope = tl.load(q_row + D_LAT + offs_rope).to(tl.float32)

    # Bottom-right causal: query i sees keys 0 .. i + Skv - Sq. Every block visited holds at
    # least one visible key, so the running max is finite after the first block.
    n_visible = i + Skv - Sq + 1
    kv_base = kv_ptr + b * stride_kb

    m_i = 0.0
    l_i = 0.0
    acc = tl.zeros([D_LAT], dtype=tl.float32)
    for start in range(0, n_visible, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        valid = offs_n < n_visible
        rows = kv_base + offs_n[:, None] * stride_ks
        k_lat = tl.load(rows + offs_lat[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        k_rope = tl.load(rows + D_LAT + offs_rope[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        s = tl.sum(k_lat * q_lat[None, :], axis=1) + tl.sum(k_rope * q_rope[None, :], axis=1)
        s = tl.where(valid, s * scale, float("-inf"))

        m_new = 0.0  # no running max: exp(s) overflows once the logits are large
        alpha = 1.0
        p = tl.exp(s)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * k_lat, axis=0)  # the value is the latent part
        m_i = m_new

    o_row = o_ptr + b * stride_ob + i * stride_os + h * stride_oh
    tl.store(o_row + offs_lat, (acc / l_i).to(o_ptr.dtype.element_ty))
    tl.store(lse_ptr + (b * H + h) * Sq + i, m_i + tl.log(l_i))


def _check_knobs(knobs):
    block_n = knobs["BLOCK_N"]
    if not isinstance(block_n, int) or block_n < 1 or block_n & (block_n - 1):
        raise ValueError(f"BLOCK_N={block_n!r}: must be a positive power of two (tl.arange needs one)")
    if block_n > 256:
        raise ValueError(f"BLOCK_N={block_n}: a {block_n}x{LATENT_DIM} float32 tile does not fit in registers")
    warps = knobs["num_warps"]
    if not isinstance(warps, int) or warps < 1 or warps > 32 or warps & (warps - 1):
        raise ValueError(f"num_warps={warps!r}: must be a power of two from 1 to 32")
    stages = knobs["num_stages"]
    if not isinstance(stages, int) or stages < 1:
        raise ValueError(f"num_stages={stages!r}: must be a positive integer")


def kernel(q, kv, scale):
    """MLA attention: q [B, Sq, H, 576], kv [B, Skv, 576] -> (o [B, Sq, H, 512], lse [B, H, Sq] float32)."""
    _check_knobs(KNOBS)
    if q.dim() != 4 or q.shape[-1] != LATENT_DIM + ROPE_DIM:
        raise ValueError(f"q must be [B, Sq, H, {LATENT_DIM + ROPE_DIM}], got {tuple(q.shape)}")
    B, Sq, H, _ = q.shape
    if kv.dim() != 3 or kv.shape[0] != B or kv.shape[-1] != LATENT_DIM + ROPE_DIM:
        raise ValueError(f"kv must be [B={B}, Skv, {LATENT_DIM + ROPE_DIM}], got {tuple(kv.shape)}")
    Skv = kv.shape[1]
    if not 1 <= Sq <= Skv:
        raise ValueError(f"need 1 <= Sq <= Skv, got Sq={Sq}, Skv={Skv}")
    if Sq > 65535 or B > 65535:
        raise ValueError(f"Sq={Sq}, B={B}: grid axes 1 and 2 hold at most 65535 programs")
    if q.stride(-1) != 1 or kv.stride(-1) != 1:
        raise ValueError("q and kv need unit stride in their last dimension")

    o = torch.empty((B, Sq, H, LATENT_DIM), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    grid = (H, Sq, B)
    _mla_naive_kernel[grid](
        q, kv, o, lse,
        float(scale), Sq, Skv, H,
        q.stride(0), q.stride(1), q.stride(2),
        kv.stride(0), kv.stride(1),
        o.stride(0), o.stride(1), o.stride(2),
        D_LAT=LATENT_DIM, D_ROPE=ROPE_DIM, BLOCK_N=KNOBS["BLOCK_N"],
        num_warps=KNOBS["num_warps"], num_stages=KNOBS["num_stages"],
    )
    return o, lse
