"""MLA causal prefill (Sq = Skv; correct for any 1 <= Sq <= Skv), absorbed form.

Shapes: q [B, Sq, H, 576] (512 latent + 64 rope), kv [B, Skv, 576] (one latent cache shared by
all heads: the whole row is the key, its first 512 columns the value), float ``scale``.
Query s sees keys j <= s + Skv - Sq (bottom-right-aligned causal mask).
Returns o [B, Sq, H, 512] in q's dtype and lse [B, H, Sq] float32 (natural log).

Flash-attention forward, one program per (row tile, value slice, batch). A row tile is BLOCK_M
(query, head) rows: BLOCK_M // HEADS_PER_TILE consecutive queries times HEADS_PER_TILE
consecutive heads (HEADS_PER_TILE = 1 is the classic per-head tile; larger values put several
heads of one query in the M dimension, which share the one latent cache). Per KV tile of
BLOCK_N keys: S = q_nope @ k_nope^T + q_rope @ k_rope^T (a 576-wide contraction done as 512 + 64),
online softmax in base 2, acc += P @ V where V is the same tile's first 512 columns, or, when
V_SPLIT > 1, a 512 / V_SPLIT column slice of it (the program then owns only that slice of the
output and recomputes S: more FLOPs, a smaller accumulator). Key tiles entirely above the
diagonal are never visited; with UNMASKED_LOOP, tiles entirely below it run in a second loop
without a mask (two copies of the loop body: more registers; at 64 x 512 it spilled on sm_90).

RESCALE_TAU > 0: the accumulator is rescaled only when some row's max grows by more than TAU
(log2 units) over the max it is scaled to (a tile-uniform branch); otherwise the stale max stays
and weights reach up to 2**TAU (exact in fp32, no worse in bf16). Saves the multiply of the whole
accumulator on most tiles (the instruction-issue limit of the profile, kernels/notes/mla/).

QK_SPLIT (TMA kernel): Triton gives a dot whose result feeds another dot all warps along M
(its "chained dot" rule, meant for flash attention's in-warp row reductions). At BLOCK_M 64 on 8
warps a wgmma warpgroup needs M = 64, so both warpgroups compute the whole 64 x BLOCK_N score tile
and its softmax: the score dots (53% of the FLOPs) run twice (offline sm_90: 72 instead of 36
HGMMA.64x32x16 per tile). QK_SPLIT keeps every score dot out of that rule: the three partial score
dots get fresh accumulators (each scaled, then summed: an add of a dot with a zero accumulator
would be folded back into a chain), and P and the rescale factor reach the P V dots through a
branch that is always taken (the rule follows uses and stops at a branch's yield). The score tile
is then split over the two warpgroups ([4, 2] warps), the row max and sum cross them through
shared memory, and P V is acc^T = V^T P^T (the value columns are the wgmma M, P^T the B operand in
shared memory; accumulators [256, BLOCK_M]). V_SPLIT > 1 and the pointer kernel have no QK_SPLIT form.
ROWSUM "defer" (QK_SPLIT): the row sums are kept per score element (l = l * alpha + p) and reduced
once after the loop, instead of a cross-warpgroup reduction per tile.

Tiles are issued heaviest first (last queries first) to shorten the tail.

ENGINE "gluon": ``_prefill_gluon``, the QK_SPLIT kernel's algorithm written in Gluon, Triton's
dialect with explicit layouts, shared memory, mbarriers and asynchronous wgmma. Triton 3.6 waits for every
wgmma it does not pipeline right after issuing it: five tensor-core drains per 64-key tile here. The Gluon
kernel issues a tile's score dots behind the previous tile's P V and waits once for both, and fetches KV
tiles by TMA into a two-stage ring as soon as a stage is released. It runs where it applies (a Hopper GPU,
bf16 contiguous inputs, H in 16/32/64/128, B 1 or Skv a multiple of 64; see ``_gluon_applies``), else the
Triton kernel of the other knobs runs; Gluon has no CPU interpreter, so on the CPU it is always the latter.
Accumulator registers: BLOCK_M * 512 / V_SPLIT floats per program (64 x 512 = 32K: give it 8 warps).
"""

import math

import torch
import triton
import triton.experimental.gluon as gluon
import triton.language as tl
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

# kopt:knobs-begin
KNOBS = {"BLOCK_M": 64, "BLOCK_N": 64, "HEADS_PER_TILE": 16, "V_SPLIT": 1, "UNMASKED_LOOP": False, "KEYS_AS_M": False, "num_warps": 8, "num_stages": 2, "RESCALE_TAU": 0, "KV_LOAD": "tma", "QK_SPLIT": True, "ROWSUM": "defer", "ENGINE": "gluon"}
# kopt:knobs-end
SPACE = {
    "BLOCK_M": [32, 64, 128],  # (query, head) rows per program
    "BLOCK_N": [16, 32, 64],  # keys per KV tile
    "HEADS_PER_TILE": [1, 2, 4, 16, 64],  # heads per row tile (rows = queries x heads)
    "V_SPLIT": [1, 2, 4],  # value slices: each program writes 512 / V_SPLIT output columns
    "UNMASKED_LOOP": [False, True],  # key tiles below the diagonal in a second, mask-free loop
    "KEYS_AS_M": [False, True],  # scores as S^T = K q^T (keys are the M of the dot) instead of q K^T
    "num_warps": [4, 8],
    "num_stages": [1, 2, 3],
    "RESCALE_TAU": [0, 8],  # 0: rescale the accumulator every tile; 8: only when a row max grows by > 8 (log2)
    "KV_LOAD": ["pointer", "tma"],  # KV tiles by per-thread pointers (cp.async) or tensor descriptors (TMA; V_SPLIT 1)
    "QK_SPLIT": [False, True],  # TMA kernel: score keys split over the warpgroups (no duplicated QK), P V as V^T P^T
    "ROWSUM": ["reduce", "defer"],  # QK_SPLIT: row sums reduced every tile (across warpgroups), or kept per element and reduced once at the end
    # "gluon" runs _prefill_gluon (fixed 64-row tiles, 8 warps; the knobs above are then unused) where it applies -- a
    # Hopper GPU, bf16 contiguous inputs, H 16/32/64/128, B 1 or Skv a multiple of 64 -- else the Triton kernel
    "ENGINE": ["triton", "gluon"],
}

D_NOPE = 512  # latent width: the value width
D_ROPE = 64  # rope width; key width = D_NOPE + D_ROPE = 576
LOG2E = 1.4426950408889634
SMEM_LIMIT = 232448  # bytes of shared memory a block may opt into on sm_90


@triton.jit
def _attend_tile(
    acc, l_i, m_i, qn, qr, kv_b, stride_kn, stride_kd, start, limit, v0, qk_scale,
    BLOCK_N: tl.constexpr, DN: tl.constexpr, DR: tl.constexpr, BV: tl.constexpr, MASKED: tl.constexpr,
    KEYS_AS_M: tl.constexpr, TAU: tl.constexpr,
):
    offs_n = start + tl.arange(0, BLOCK_N)
    offs_dn = tl.arange(0, DN)
    offs_dr = tl.arange(0, DR)
    kv_row = kv_b + offs_n.to(tl.int64)[:, None] * stride_kn
    if MASKED:
        n_ok = (offs_n <= tl.max(limit, 0))[:, None]  # limit <= Skv - 1 for every row
        kn = tl.load(kv_row + offs_dn[None, :] * stride_kd, mask=n_ok, other=0.0)
        kr = tl.load(kv_row + (DN + offs_dr)[None, :] * stride_kd, mask=n_ok, other=0.0)
    else:
        kn = tl.load(kv_row + offs_dn[None, :] * stride_kd)
        kr = tl.load(kv_row + (DN + offs_dr)[None, :] * stride_kd)
    if KEYS_AS_M:  # qn, qr hold q^T: keys form the M of the score dot
        qk = tl.trans(tl.dot(kn, qn, tl.dot(kr, qr)))
    else:
        qk = tl.dot(qr, tl.trans(kr))
        qk = tl.dot(qn, tl.trans(kn), qk)
    qk = qk * qk_scale
    if MASKED:
        qk = tl.where(offs_n[None, :] <= limit[:, None], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    if TAU > 0:  # lazy: keep the stale max unless some row grew by more than TAU
        if tl.max(m_new - m_i, 0) > TAU:
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha
            acc = acc * alpha[:, None]
            m_i = m_new
        p = tl.exp2(qk - m_i[:, None])
        l_i = l_i + tl.sum(p, 1)
        m_new = m_i
    else:
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
    if BV == DN:
        acc = tl.dot(p.to(kn.dtype), kn, acc)  # values: the same tile's first 512 columns
    else:
        offs_v = v0 + tl.arange(0, BV)
        if MASKED:
            vv = tl.load(kv_row + offs_v[None, :] * stride_kd, mask=n_ok, other=0.0)
        else:
            vv = tl.load(kv_row + offs_v[None, :] * stride_kd)
        acc = tl.dot(p.to(vv.dtype), vv, acc)
    return acc, l_i, m_new


@triton.jit
def _mla_prefill_fwd(
    q, kv, o, lse,
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kd,
    stride_ob, stride_os, stride_oh, stride_od,
    stride_lb, stride_lh, stride_ls,
    Sq, H, Skv, n_hgroups, qk_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEADS_PER_TILE: tl.constexpr, BV: tl.constexpr,
    UNMASKED_LOOP: tl.constexpr, KEYS_AS_M: tl.constexpr, TAU: tl.constexpr, DN: tl.constexpr, DR: tl.constexpr,
):
    QB: tl.constexpr = BLOCK_M // HEADS_PER_TILE  # queries per tile
    pid = tl.program_id(0)
    pid_v = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    n_qblocks = tl.cdiv(Sq, QB)
    qb = n_qblocks - 1 - pid // n_hgroups  # heaviest (latest queries) first
    hg = pid % n_hgroups

    r = tl.arange(0, BLOCK_M)
    s_idx = qb * QB + r // HEADS_PER_TILE
    h_idx = hg * HEADS_PER_TILE + r % HEADS_PER_TILE
    row_ok = (s_idx < Sq) & (h_idx < H)
    offs_dn = tl.arange(0, DN)
    offs_dr = tl.arange(0, DR)
    q_row = q + b * stride_qb + s_idx.to(tl.int64) * stride_qs + h_idx.to(tl.int64) * stride_qh
    if KEYS_AS_M:  # q^T [576, BLOCK_M]: the B operand of S^T = K q^T
        qn = tl.load(q_row[None, :] + offs_dn[:, None] * stride_qd, mask=row_ok[None, :], other=0.0)
        qr = tl.load(q_row[None, :] + (DN + offs_dr)[:, None] * stride_qd, mask=row_ok[None, :], other=0.0)
    else:
        qn = tl.load(q_row[:, None] + offs_dn[None, :] * stride_qd, mask=row_ok[:, None], other=0.0)
        qr = tl.load(q_row[:, None] + (DN + offs_dr)[None, :] * stride_qd, mask=row_ok[:, None], other=0.0)

    shift = Skv - Sq
    limit = tl.minimum(s_idx + shift, Skv - 1)  # last visible key of each row
    lo = qb * QB + shift  # the tile's smallest limit (its first query)
    hi = tl.minimum(qb * QB + QB - 1, Sq - 1) + shift  # and its largest
    full_end = ((lo + 1) // BLOCK_N) * BLOCK_N  # key tiles below this need no mask
    end = hi + 1

    v0 = pid_v * BV
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BV], dtype=tl.float32)
    kv_b = kv + b * stride_kb
    if not UNMASKED_LOOP:
        full_end = 0  # one masked loop: less code, fewer registers (the mask is a compare and a select)
    for start in range(0, full_end, BLOCK_N):
        acc, l_i, m_i = _attend_tile(acc, l_i, m_i, qn, qr, kv_b, stride_kn, stride_kd, start, limit, v0, qk_scale,
                                     BLOCK_N, DN, DR, BV, False, KEYS_AS_M, TAU)
    for start in range(full_end, end, BLOCK_N):
        acc, l_i, m_i = _attend_tile(acc, l_i, m_i, qn, qr, kv_b, stride_kn, stride_kd, start, limit, v0, qk_scale,
                                     BLOCK_N, DN, DR, BV, True, KEYS_AS_M, TAU)

    out = acc / l_i[:, None]  # every real row sees key 0, so l_i > 0
    offs_v = v0 + tl.arange(0, BV)
    o_row = o + b * stride_ob + s_idx.to(tl.int64) * stride_os + h_idx.to(tl.int64) * stride_oh
    tl.store(o_row[:, None] + offs_v[None, :] * stride_od, out.to(o.dtype.element_ty), mask=row_ok[:, None])
    if pid_v == 0:
        l_ptr = lse + b * stride_lb + h_idx.to(tl.int64) * stride_lh + s_idx.to(tl.int64) * stride_ls
        tl.store(l_ptr, (m_i + tl.log2(l_i)) * 0.6931471805599453, mask=row_ok)


@triton.jit
def _attend_tile_tma(
    acc0, acc1, l_i, m_i, qn0, qn1, qr, kn_desc, kr_desc, start, limit, qk_scale,
    BLOCK_N: tl.constexpr, DN: tl.constexpr, MASKED: tl.constexpr, KEYS_AS_M: tl.constexpr, TAU: tl.constexpr,
):
    """``_attend_tile`` on descriptor-loaded tiles: the latent as two [BLOCK_N, 256] boxes (a box
    is at most 256 wide), each also the value half of its accumulator; rows past Skv read as zeros."""
    HALF: tl.constexpr = DN // 2
    kn0 = kn_desc.load([start, 0])
    kn1 = kn_desc.load([start, HALF])
    kr = kr_desc.load([start, DN])
    if KEYS_AS_M:
        qk = tl.trans(tl.dot(kn1, qn1, tl.dot(kn0, qn0, tl.dot(kr, qr))))
    else:
        qk = tl.dot(qn1, tl.trans(kn1), tl.dot(qn0, tl.trans(kn0), tl.dot(qr, tl.trans(kr))))
    qk = qk * qk_scale
    if MASKED:
        offs_n = start + tl.arange(0, BLOCK_N)
        qk = tl.where(offs_n[None, :] <= limit[:, None], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    if TAU > 0:
        if tl.max(m_new - m_i, 0) > TAU:
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha
            acc0 = acc0 * alpha[:, None]
            acc1 = acc1 * alpha[:, None]
            m_i = m_new
        p = tl.exp2(qk - m_i[:, None])
        l_i = l_i + tl.sum(p, 1)
        m_new = m_i
    else:
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc0 = acc0 * alpha[:, None]
        acc1 = acc1 * alpha[:, None]
    pb = p.to(kn0.dtype)
    acc0 = tl.dot(pb, kn0, acc0)
    acc1 = tl.dot(pb, kn1, acc1)
    return acc0, acc1, l_i, m_new


@triton.jit
def _attend_tile_split(
    acc0, acc1, l_i, m_i, qn0, qn1, qr, kn_desc, kr_desc, start, limit, qk_scale, live,
    BLOCK_N: tl.constexpr, DN: tl.constexpr, MASKED: tl.constexpr, KEYS_AS_M: tl.constexpr, TAU: tl.constexpr,
    DEFER_SUM: tl.constexpr = False,
):
    """``_attend_tile_tma`` for QK_SPLIT: no score dot may feed another dot in the same block, else
    Triton's chained-dot rule puts all 8 warps on the M of the score dot, and at M = 64 both
    warpgroups then compute the whole score tile. So the three partial score dots get fresh
    accumulators (scaled, then summed: an add of a zero-accumulator dot would be folded back into a
    chain), and P and alpha reach the P V dots through a branch that is always taken (``live``: the
    forward slice that the rule follows stops at a branch's yield). P V is transposed, acc^T = V^T P^T
    (the 512 value columns are the wgmma M, P^T the B operand through shared memory): acc0 / acc1 are
    [256, rows]. KEYS_AS_M: scores as S^T = K q^T (keys are the M; qn0, qn1, qr hold q^T), which is
    P^T's own layout.

    DEFER_SUM (ROWSUM "defer"): l_i is the score tile's shape and takes l_i * alpha + p elementwise;
    the row sums (a reduction across the two warpgroups, through shared memory and barriers) are
    taken once after the loop (offline sm_90: 3 fewer barriers per tile, no spills)."""
    HALF: tl.constexpr = DN // 2
    kn0 = kn_desc.load([start, 0])
    kn1 = kn_desc.load([start, HALF])
    kr = kr_desc.load([start, DN])
    offs_n = start + tl.arange(0, BLOCK_N)
    if KEYS_AS_M:  # s [BLOCK_N, rows]; reductions over axis 0
        s = tl.dot(kr, qr) * qk_scale + tl.dot(kn0, qn0) * qk_scale + tl.dot(kn1, qn1) * qk_scale
        if MASKED:
            s = tl.where(offs_n[:, None] <= limit[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
    else:  # s [rows, BLOCK_N]
        s = tl.dot(qr, tl.trans(kr)) * qk_scale + tl.dot(qn0, tl.trans(kn0)) * qk_scale + tl.dot(qn1, tl.trans(kn1)) * qk_scale
        if MASKED:
            s = tl.where(offs_n[None, :] <= limit[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
    grow = True
    if TAU > 0:  # lazy: keep the stale max unless some row grew by more than TAU (tile-uniform)
        grow = tl.max(m_new - m_i, 0) > TAU
        m_new = tl.where(grow, m_new, m_i)
    alpha = tl.exp2(m_i - m_new)
    if KEYS_AS_M:
        p = tl.exp2(s - m_new[None, :])
        if DEFER_SUM:
            l_i = l_i * alpha[None, :] + p
        else:
            l_i = l_i * alpha + tl.sum(p, 0)
    else:
        p = tl.exp2(s - m_new[:, None])
        if DEFER_SUM:
            l_i = l_i * alpha[:, None] + p
        else:
            l_i = l_i * alpha + tl.sum(p, 1)
    pt = tl.zeros([BLOCK_N, acc0.shape[1]], dtype=kn0.dtype)
    if live > 0:  # always taken: P and alpha leave through the branch, so no dot is downstream of a score dot
        if KEYS_AS_M:
            pt = p.to(kn0.dtype)
        else:
            pt = tl.trans(p.to(kn0.dtype))
        if grow:
            acc0 = acc0 * alpha[None, :]
            acc1 = acc1 * alpha[None, :]
    acc0 = tl.dot(tl.trans(kn0), pt, acc0)
    acc1 = tl.dot(tl.trans(kn1), pt, acc1)
    return acc0, acc1, l_i, m_new


@triton.jit
def _mla_prefill_tma(
    q, kv, o, lse,
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_kb, stride_kn,
    stride_ob, stride_os, stride_oh, stride_od,
    stride_lb, stride_lh, stride_ls,
    Sq, H, Skv, n_hgroups, qk_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEADS_PER_TILE: tl.constexpr,
    UNMASKED_LOOP: tl.constexpr, KEYS_AS_M: tl.constexpr, TAU: tl.constexpr, DN: tl.constexpr, DR: tl.constexpr,
    QK_SPLIT: tl.constexpr, DEFER_SUM: tl.constexpr = False,
):
    """``_mla_prefill_fwd`` (V_SPLIT 1) with KV tiles through tensor descriptors (TMA on sm_90)."""
    HALF: tl.constexpr = DN // 2
    QB: tl.constexpr = BLOCK_M // HEADS_PER_TILE
    pid = tl.program_id(0)
    b = tl.program_id(2).to(tl.int64)
    n_qblocks = tl.cdiv(Sq, QB)
    qb = n_qblocks - 1 - pid // n_hgroups
    hg = pid % n_hgroups

    r = tl.arange(0, BLOCK_M)
    s_idx = qb * QB + r // HEADS_PER_TILE
    h_idx = hg * HEADS_PER_TILE + r % HEADS_PER_TILE
    row_ok = (s_idx < Sq) & (h_idx < H)
    offs_h = tl.arange(0, HALF)
    offs_dr = tl.arange(0, DR)
    q_row = q + b * stride_qb + s_idx.to(tl.int64) * stride_qs + h_idx.to(tl.int64) * stride_qh
    if KEYS_AS_M:
        qn0 = tl.load(q_row[None, :] + offs_h[:, None] * stride_qd, mask=row_ok[None, :], other=0.0)
        qn1 = tl.load(q_row[None, :] + (HALF + offs_h)[:, None] * stride_qd, mask=row_ok[None, :], other=0.0)
        qr = tl.load(q_row[None, :] + (DN + offs_dr)[:, None] * stride_qd, mask=row_ok[None, :], other=0.0)
    else:
        qn0 = tl.load(q_row[:, None] + offs_h[None, :] * stride_qd, mask=row_ok[:, None], other=0.0)
        qn1 = tl.load(q_row[:, None] + (HALF + offs_h)[None, :] * stride_qd, mask=row_ok[:, None], other=0.0)
        qr = tl.load(q_row[:, None] + (DN + offs_dr)[None, :] * stride_qd, mask=row_ok[:, None], other=0.0)

    shift = Skv - Sq
    limit = tl.minimum(s_idx + shift, Skv - 1)
    lo = qb * QB + shift
    hi = tl.minimum(qb * QB + QB - 1, Sq - 1) + shift
    full_end = ((lo + 1) // BLOCK_N) * BLOCK_N
    end = hi + 1

    kv_b = kv + b * stride_kb
    kn_desc = tl.make_tensor_descriptor(kv_b, shape=[Skv, DN + DR], strides=[stride_kn, 1], block_shape=[BLOCK_N, HALF])
    kr_desc = tl.make_tensor_descriptor(kv_b, shape=[Skv, DN + DR], strides=[stride_kn, 1], block_shape=[BLOCK_N, DR])
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if not UNMASKED_LOOP:
        full_end = 0
    o_row = o + b * stride_ob + s_idx.to(tl.int64) * stride_os + h_idx.to(tl.int64) * stride_oh
    if QK_SPLIT:  # transposed accumulators [256, BLOCK_M]
        live = Skv  # >= 1, but the compiler cannot know: keeps the branches around the score dots
        acc0 = tl.zeros([HALF, BLOCK_M], dtype=tl.float32)
        acc1 = tl.zeros([HALF, BLOCK_M], dtype=tl.float32)
        if DEFER_SUM:  # per-element partial row sums in the score tile's shape
            if KEYS_AS_M:
                l_i = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            else:
                l_i = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, full_end, BLOCK_N):
            acc0, acc1, l_i, m_i = _attend_tile_split(acc0, acc1, l_i, m_i, qn0, qn1, qr, kn_desc, kr_desc, start, limit, qk_scale,
                                                      live, BLOCK_N, DN, False, KEYS_AS_M, TAU, DEFER_SUM)
        for start in range(full_end, end, BLOCK_N):
            acc0, acc1, l_i, m_i = _attend_tile_split(acc0, acc1, l_i, m_i, qn0, qn1, qr, kn_desc, kr_desc, start, limit, qk_scale,
                                                      live, BLOCK_N, DN, True, KEYS_AS_M, TAU, DEFER_SUM)
        if DEFER_SUM:
            if KEYS_AS_M:
                l_i = tl.sum(l_i, 0)
            else:
                l_i = tl.sum(l_i, 1)
        inv_l = 1.0 / l_i
        ptr = o_row[None, :] + offs_h[:, None] * stride_od
        tl.store(ptr, (acc0 * inv_l[None, :]).to(o.dtype.element_ty), mask=row_ok[None, :])
        tl.store(ptr + HALF * stride_od, (acc1 * inv_l[None, :]).to(o.dtype.element_ty), mask=row_ok[None, :])
    else:
        acc0 = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
        acc1 = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
        for start in range(0, full_end, BLOCK_N):
            acc0, acc1, l_i, m_i = _attend_tile_tma(acc0, acc1, l_i, m_i, qn0, qn1, qr, kn_desc, kr_desc, start, limit, qk_scale,
                                                    BLOCK_N, DN, False, KEYS_AS_M, TAU)
        for start in range(full_end, end, BLOCK_N):
            acc0, acc1, l_i, m_i = _attend_tile_tma(acc0, acc1, l_i, m_i, qn0, qn1, qr, kn_desc, kr_desc, start, limit, qk_scale,
                                                    BLOCK_N, DN, True, KEYS_AS_M, TAU)
        inv_l = 1.0 / l_i  # every real row sees key 0, so l_i > 0
        ptr = o_row[:, None] + offs_h[None, :] * stride_od
        tl.store(ptr, (acc0 * inv_l[:, None]).to(o.dtype.element_ty), mask=row_ok[:, None])
        tl.store(ptr + HALF * stride_od, (acc1 * inv_l[:, None]).to(o.dtype.element_ty), mask=row_ok[:, None])
    l_ptr = lse + b * stride_lb + h_idx.to(tl.int64) * stride_lh + s_idx.to(tl.int64) * stride_ls
    tl.store(l_ptr, (m_i + tl.log2(l_i)) * 0.6931471805599453, mask=row_ok)


# ------------------------------------------------------------------------------------------
# ENGINE "gluon": the same attention in Gluon (Triton's explicit-layout dialect), sm_90 only
# ------------------------------------------------------------------------------------------
GLUON_ROWS = 64  # (query, head) rows per program: the wgmma M of both warpgroups
GLUON_BLOCK_N = 64  # keys per tile


@gluon.jit
def _gluon_tile(j, s_raw, acc, m_i, l_el, q_lat, q_rope, k_lat, k_rope, p_smem, ready, k_lat_desc, k_rope_desc,
                kv_row0, n_tiles, limit, qk_scale, cols, row_o: gl.constexpr, DN: gl.constexpr, BLOCK_N: gl.constexpr):
    """Key tile j. Its score dots are issued behind tile j - 1's P V and one wait returns both (the Triton
    kernel waits after each of its five dots); then the online softmax, and this tile's P V is left in flight.
    Fetches tile j + 1 into the stage that tile j - 1 has released."""
    kv_bytes: gl.constexpr = BLOCK_N * (DN + k_rope.shape[2]) * 2
    st = j % 2
    mbarrier.wait(ready.index(st), (j // 2) & 1)
    s_raw = warpgroup_mma(q_rope, k_rope.index(st).permute((1, 0)), s_raw, use_acc=False, is_async=True)
    s_raw = warpgroup_mma(q_lat, k_lat.index(st).permute((1, 0)), s_raw, is_async=True)
    s_raw, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s_raw, acc))
    nxt = j + 1
    if (j >= 1) & (nxt < n_tiles):
        gl.thread_barrier()  # the other warpgroup's P V of tile j - 1 is done too: its stage may be overwritten
        ns = nxt % 2
        mbarrier.expect(ready.index(ns), kv_bytes)
        tma.async_copy_global_to_shared(k_lat_desc, [kv_row0 + nxt * BLOCK_N, 0], ready.index(ns), k_lat.index(ns))
        tma.async_copy_global_to_shared(k_rope_desc, [kv_row0 + nxt * BLOCK_N, DN], ready.index(ns), k_rope.index(ns))
    s = s_raw * qk_scale
    s = gl.where((j * BLOCK_N + cols)[None, :] <= limit[:, None], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s - m_new[:, None])
    l_el = l_el * alpha[:, None] + p  # row sums per score element, reduced once after the loop (as ROWSUM "defer")
    gl.thread_barrier()  # both warpgroups are past their wait: no P V reads p_smem any more
    p_smem.store(p.to(gl.bfloat16))
    fence_async_shared()
    gl.thread_barrier()  # both halves of P (each warpgroup scores half the keys) are in place before either P V
    acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    acc = warpgroup_mma(p_smem, k_lat.index(st), acc, is_async=True)
    return s_raw, acc, m_new, l_el


@gluon.jit
def _prefill_gluon(q_lat_desc, q_rope_desc, k_lat_desc, k_rope_desc, o, lse, Sq, H, Skv, n_hgroups, qk_scale,
                   HT: gl.constexpr, DN: gl.constexpr, DR: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr):
    """One program per (row tile, batch): ROWS rows = ROWS // HT queries x HT heads, which are ROWS consecutive
    rows of q and o viewed as [B * Sq * H, width]. The two warpgroups split the score tile's keys and the 512
    value columns (as QK_SPLIT); q stays in shared memory, KV tiles arrive by TMA into a two-stage ring."""
    QB: gl.constexpr = ROWS // HT
    pid = gl.program_id(0)
    b = gl.program_id(1)
    qb = (Sq + QB - 1) // QB - 1 - pid // n_hgroups  # heaviest (latest queries) first
    hg = pid % n_hgroups
    q_row0 = (b * Sq + qb * QB) * H + hg * HT
    kv_row0 = b * Skv
    n_tiles = (gl.minimum(qb * QB + QB - 1, Sq - 1) + Skv - Sq) // BLOCK_N + 1

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    q_lat = gl.allocate_shared_memory(gl.bfloat16, [ROWS, DN], q_lat_desc.layout)
    q_rope = gl.allocate_shared_memory(gl.bfloat16, [ROWS, DR], q_rope_desc.layout)
    k_lat = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, DN], k_lat_desc.layout)
    k_rope = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, DR], k_rope_desc.layout)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [ROWS, BLOCK_N], gl.NVMMASharedLayout.get_default_for([ROWS, BLOCK_N], gl.bfloat16))
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(ready.index(0), count=1)
    mbarrier.init(ready.index(1), count=1)
    fence_async_shared()

    kv_bytes: gl.constexpr = BLOCK_N * (DN + DR) * 2
    mbarrier.expect(q_bar, ROWS * (DN + DR) * 2)
    tma.async_copy_global_to_shared(q_lat_desc, [q_row0, 0], q_bar, q_lat)
    tma.async_copy_global_to_shared(q_rope_desc, [q_row0, DN], q_bar, q_rope)
    mbarrier.expect(ready.index(0), kv_bytes)
    tma.async_copy_global_to_shared(k_lat_desc, [kv_row0, 0], ready.index(0), k_lat.index(0))
    tma.async_copy_global_to_shared(k_rope_desc, [kv_row0, DN], ready.index(0), k_rope.index(0))
    more = n_tiles > 1
    mbarrier.expect(ready.index(1), kv_bytes, pred=more)
    tma.async_copy_global_to_shared(k_lat_desc, [kv_row0 + BLOCK_N, 0], ready.index(1), k_lat.index(1), pred=more)
    tma.async_copy_global_to_shared(k_rope_desc, [kv_row0 + BLOCK_N, DN], ready.index(1), k_rope.index(1), pred=more)

    r = gl.arange(0, ROWS, layout=row_s)
    s_idx = qb * QB + r // HT
    limit = gl.minimum(s_idx, Sq - 1) + Skv - Sq  # each row's last visible key (rows past Sq: never stored)
    m_i = gl.full([ROWS], -1.0e30, gl.float32, layout=row_s)
    l_el = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
    acc = warpgroup_mma_init(gl.zeros([ROWS, DN], gl.float32, layout=o_layout))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    # The score accumulator is carried and overwritten (use_acc=False), and tile 0 runs before the loop: a zero
    # tensor made per tile, or a zero-trip path into the final wait, writes wgmma accumulator registers while a
    # P V is in flight, and ptxas then serialises every wgmma of the kernel (its C7515 note).
    s_raw = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
    mbarrier.wait(q_bar, 0)
    s_raw, acc, m_i, l_el = _gluon_tile(0, s_raw, acc, m_i, l_el, q_lat, q_rope, k_lat, k_rope, p_smem, ready, k_lat_desc,
                                        k_rope_desc, kv_row0, n_tiles, limit, qk_scale, cols, row_o, DN, BLOCK_N)
    for j in range(1, n_tiles):
        s_raw, acc, m_i, l_el = _gluon_tile(j, s_raw, acc, m_i, l_el, q_lat, q_rope, k_lat, k_rope, p_smem, ready, k_lat_desc,
                                            k_rope_desc, kv_row0, n_tiles, limit, qk_scale, cols, row_o, DN, BLOCK_N)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.invalidate(q_bar)
    mbarrier.invalidate(ready.index(0))
    mbarrier.invalidate(ready.index(1))

    l_i = gl.sum(l_el, 1)
    out = acc / gl.convert_layout(l_i, row_o)[:, None]
    r_o = gl.arange(0, ROWS, layout=row_o)
    ok_o = (qb * QB + r_o // HT) < Sq
    cols_o = gl.arange(0, DN, layout=gl.SliceLayout(0, o_layout))
    gl.store(o + (q_row0 + r_o).to(gl.int64)[:, None] * DN + cols_o[None, :], out.to(gl.bfloat16), mask=ok_o[:, None])
    h_idx = hg * HT + r % HT
    gl.store(lse + ((b * H + h_idx) * Sq + s_idx).to(gl.int64), (m_i + gl.log2(l_i)) * 0.6931471805599453, mask=s_idx < Sq)


def _gluon_applies(q, kv) -> bool:
    """Where ENGINE "gluon" runs: wgmma and TMA (Hopper), bf16 rows the descriptors can take, row tiles of whole
    head groups, and (B > 1) no key tile running past its batch into the next one's keys."""
    B, _, H, _ = q.shape
    return (q.is_cuda and torch.cuda.get_device_capability(q.device)[0] == 9
            and q.dtype == kv.dtype == torch.bfloat16 and q.is_contiguous() and kv.is_contiguous()
            and H in (16, 32, 64, 128) and (B == 1 or kv.shape[1] % GLUON_BLOCK_N == 0))


def _prefill_gluon_launch(q, kv, scale):
    B, Sq, H, D = q.shape
    Skv = kv.shape[1]
    ht = min(H, GLUON_ROWS)
    q2, kv2 = q.view(B * Sq * H, D), kv.view(B * Skv, D)

    def desc(t, rows, width):
        layout = gl.NVMMASharedLayout.get_default_for([rows, width], gl.bfloat16)
        return GluonDescriptor(t, list(t.shape), [D, 1], [rows, width], layout)

    o = torch.empty((B, Sq, H, D_NOPE), device=q.device, dtype=q.dtype)
    lse = torch.empty((B, H, Sq), device=q.device, dtype=torch.float32)
    n_hgroups = H // ht
    grid = (triton.cdiv(Sq, GLUON_ROWS // ht) * n_hgroups, B)
    _prefill_gluon[grid](desc(q2, GLUON_ROWS, D_NOPE), desc(q2, GLUON_ROWS, D_ROPE), desc(kv2, GLUON_BLOCK_N, D_NOPE),
                         desc(kv2, GLUON_BLOCK_N, D_ROPE), o, lse, Sq, H, Skv, n_hgroups, float(scale) * LOG2E,
                         HT=ht, DN=D_NOPE, DR=D_ROPE, ROWS=GLUON_ROWS, BLOCK_N=GLUON_BLOCK_N, num_warps=8)
    return o, lse


_DESCRIPTOR_SCRATCH = {}


def _descriptor_scratch(size, alignment, stream):
    """Global memory Triton asks for when a kernel builds tensor descriptors on the device: one
    buffer per (size, stream), reused (launches on one stream are ordered; each program writes
    its descriptors before it reads them)."""
    buf = _DESCRIPTOR_SCRATCH.get((size, stream))
    if buf is None:
        buf = _DESCRIPTOR_SCRATCH[(size, stream)] = torch.empty(size, device="cuda", dtype=torch.int8)
    return buf


def _tma_ok(kv):
    """Tensor descriptors need a 16-byte aligned base, 16-byte aligned row strides, unit column stride."""
    return kv.stride(2) == 1 and kv.stride(1) % 8 == 0 and kv.stride(0) % 8 == 0 and kv.data_ptr() % 16 == 0


def _check(q, kv, scale):
    if q.dim() != 4 or kv.dim() != 3:
        raise ValueError(f"expected q [B,Sq,H,576] and kv [B,Skv,576], got {tuple(q.shape)} and {tuple(kv.shape)}")
    B, Sq, H, D = q.shape
    if D != D_NOPE + D_ROPE or kv.shape[2] != D_NOPE + D_ROPE:
        raise ValueError(f"key width must be {D_NOPE + D_ROPE} (512 latent + 64 rope), got q {D} and kv {kv.shape[2]}")
    if kv.shape[0] != B:
        raise ValueError(f"batch mismatch: q {B}, kv {kv.shape[0]}")
    if Sq < 1 or Sq > kv.shape[1]:
        raise ValueError(f"need 1 <= Sq <= Skv, got Sq={Sq}, Skv={kv.shape[1]}")
    if q.dtype != kv.dtype:
        raise ValueError(f"q and kv dtypes differ: {q.dtype} vs {kv.dtype}")
    if q.device != kv.device:
        raise ValueError("q and kv are on different devices")
    if not math.isfinite(float(scale)):
        raise ValueError(f"scale must be finite, got {scale}")


def kernel(q, kv, scale):
    _check(q, kv, scale)
    K = KNOBS
    if K["ENGINE"] not in ("triton", "gluon"):
        raise ValueError(f"ENGINE must be 'triton' or 'gluon', got {K['ENGINE']!r}")
    if K["ENGINE"] == "gluon" and _gluon_applies(q, kv):
        return _prefill_gluon_launch(q, kv, scale)
    block_m, block_n = int(K["BLOCK_M"]), int(K["BLOCK_N"])
    hpt, v_split = int(K["HEADS_PER_TILE"]), int(K["V_SPLIT"])
    num_warps, num_stages = int(K["num_warps"]), int(K["num_stages"])
    if block_m not in (16, 32, 64, 128):
        raise ValueError(f"BLOCK_M must be 16, 32, 64 or 128 (the M of a tl.dot), got {block_m}")
    if block_n not in (16, 32, 64, 128):
        raise ValueError(f"BLOCK_N must be 16, 32, 64 or 128 (a tl.dot dimension), got {block_n}")
    if v_split not in (1, 2, 4, 8):
        raise ValueError(f"V_SPLIT must divide 512 into slices of at least 64 columns (1, 2, 4 or 8), got {v_split}")
    if hpt < 1 or hpt & (hpt - 1):
        raise ValueError(f"HEADS_PER_TILE must be a power of two, got {hpt}")
    if K["KV_LOAD"] not in ("pointer", "tma"):
        raise ValueError(f"KV_LOAD must be 'pointer' or 'tma', got {K['KV_LOAD']!r}")
    if K["ROWSUM"] not in ("reduce", "defer"):
        raise ValueError(f"ROWSUM must be 'reduce' or 'defer', got {K['ROWSUM']!r}")

    tau = float(K["RESCALE_TAU"])
    if not 0 <= tau <= 16:
        raise ValueError(f"RESCALE_TAU must be in [0, 16] (weights grow up to 2**RESCALE_TAU between rescales), got {tau}")
    B, Sq, H, _ = q.shape
    Skv = kv.shape[1]
    hpt = min(hpt, triton.next_power_of_2(H))  # no more head slots than heads
    if hpt > block_m:
        raise ValueError(f"HEADS_PER_TILE={hpt} exceeds BLOCK_M={block_m}: a tile must hold at least one query")
    qk_split = bool(K["QK_SPLIT"])
    if qk_split and K["KV_LOAD"] == "tma" and v_split == 1 and bool(K["KEYS_AS_M"]) and block_m < 64:
        # offline sm_90: this form keeps num_stages KV tiles in shared memory (one more than without QK_SPLIT)
        smem = num_stages * block_n * (D_NOPE + D_ROPE) * 2 + block_m * (D_NOPE + D_ROPE) * 2 + block_n * block_m * 2
        if smem > SMEM_LIMIT:
            raise ValueError(
                f"QK_SPLIT with KEYS_AS_M, BLOCK_M={block_m}, BLOCK_N={block_n}, num_stages={num_stages} keeps {num_stages} "
                f"KV tiles in shared memory: ~{smem // 1024} KB, over the {SMEM_LIMIT // 1024} KB of sm_90"
            )
    bv = D_NOPE // v_split
    n_hgroups = triton.cdiv(H, hpt)
    n_qblocks = triton.cdiv(Sq, block_m // hpt)

    o = torch.empty((B, Sq, H, D_NOPE), device=q.device, dtype=q.dtype)
    lse = torch.empty((B, H, Sq), device=q.device, dtype=torch.float32)
    grid = (n_qblocks * n_hgroups, v_split, B)
    try:
        if K["KV_LOAD"] == "tma" and v_split == 1 and kv.dtype == torch.bfloat16 and _tma_ok(kv):
            if q.is_cuda:
                triton.set_allocator(_descriptor_scratch)
            _mla_prefill_tma[grid](
                q, kv, o, lse,
                q.stride(0), q.stride(1), q.stride(2), q.stride(3),
                kv.stride(0), kv.stride(1),
                o.stride(0), o.stride(1), o.stride(2), o.stride(3),
                lse.stride(0), lse.stride(1), lse.stride(2),
                Sq, H, Skv, n_hgroups, float(scale) * LOG2E,
                BLOCK_M=block_m, BLOCK_N=block_n, HEADS_PER_TILE=hpt, UNMASKED_LOOP=bool(K["UNMASKED_LOOP"]),
                KEYS_AS_M=bool(K["KEYS_AS_M"]), TAU=tau, DN=D_NOPE, DR=D_ROPE, QK_SPLIT=qk_split,
                DEFER_SUM=K["ROWSUM"] == "defer",
                num_warps=num_warps, num_stages=num_stages,
            )
            return o, lse
        # the pointer kernel: V_SPLIT > 1, float32 inputs, or strides a descriptor cannot take
        _mla_prefill_fwd[grid](
            q, kv, o, lse,
            q.stride(0), q.stride(1), q.stride(2), q.stride(3),
            kv.stride(0), kv.stride(1), kv.stride(2),
            o.stride(0), o.stride(1), o.stride(2), o.stride(3),
            lse.stride(0), lse.stride(1), lse.stride(2),
            Sq, H, Skv, n_hgroups, float(scale) * LOG2E,
            BLOCK_M=block_m, BLOCK_N=block_n, HEADS_PER_TILE=hpt, BV=bv, UNMASKED_LOOP=bool(K["UNMASKED_LOOP"]),
            KEYS_AS_M=bool(K["KEYS_AS_M"]), TAU=tau,
            DN=D_NOPE, DR=D_ROPE,
            num_warps=num_warps, num_stages=num_stages,
        )
    except Exception as exc:  # compile-time resource limits are a property of the knobs
        if type(exc).__name__ == "OutOfResources":
            raise ValueError(
                f"knobs BLOCK_M={block_m} BLOCK_N={block_n} V_SPLIT={v_split} num_warps={num_warps} "
                f"num_stages={num_stages} need more registers or shared memory than the device has: {exc}"
            ) from exc
        raise
    return o, lse
