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
accumulator on most tiles (the instruction-issue limit of the profile, kernels/notes/mla.md).

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
DESC (TMA kernel): "device" builds the KV descriptors in every program (global scratch, fences),
"host" passes descriptors built once by the host as kernel arguments (over kv as [B * Skv, 576]
rows; when B > 1 needs Skv a multiple of BLOCK_N, else "device" is used). PERSISTENT (TMA kernel):
one program per SM walks the row tiles in a snake over the heaviest-first order instead of one
program per row tile; the program's start is paid once per SM.
Accumulator registers: BLOCK_M * 512 / V_SPLIT floats per program (64 x 512 = 32K: give it 8 warps).
"""

import math

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

# kopt:knobs-begin
KNOBS = {"BLOCK_M": 64, "BLOCK_N": 64, "HEADS_PER_TILE": 16, "V_SPLIT": 1, "UNMASKED_LOOP": False, "KEYS_AS_M": False, "num_warps": 8, "num_stages": 2, "RESCALE_TAU": 0, "KV_LOAD": "tma", "QK_SPLIT": True, "ROWSUM": "defer", "DESC": "device", "PERSISTENT": False}
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
    "DESC": ["device", "host"],  # TMA kernel: KV descriptors built by every program, or once on the host (kernel arguments)
    "PERSISTENT": [False, True],  # TMA kernel: one program per row tile, or one per SM walking the row tiles
}
# Measured by the search loop right after the defaults: HEADS_PER_TILE 64 (the promoted kernel, 12.34-12.38 ms,
# session 4). Session 5's QK_AHEAD (17.4 ms at BLOCK_N 32) and Q_LOAD tma (12.40 ms) lost to it on the H200 (12.33 ms)
# and were removed from the family (kernels/notes/mla.md "Version 7 measured"; code in commit ce6db40).
# Session 9 (unmeasured when written): the per-row-tile start paid once, by host-built descriptors and/or one
# program per SM (offline sm_90: loop 611 -> 627 / 618 / 633 instructions per tile, persistent 1 spill in the loop).
TRY_EARLY = [{"HEADS_PER_TILE": 64}, {"HEADS_PER_TILE": 64, "PERSISTENT": True, "DESC": "host"},
             {"HEADS_PER_TILE": 64, "DESC": "host"}, {"HEADS_PER_TILE": 64, "PERSISTENT": True}]

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
    acc0, acc1, l_i, m_i, qn0, qn1, qr, kn_desc, kr_desc, row0, start, limit, qk_scale,
    BLOCK_N: tl.constexpr, DN: tl.constexpr, MASKED: tl.constexpr, KEYS_AS_M: tl.constexpr, TAU: tl.constexpr,
):
    """``_attend_tile`` on descriptor-loaded tiles: the latent as two [BLOCK_N, 256] boxes (a box
    is at most 256 wide), each also the value half of its accumulator; rows past Skv read as zeros.
    The descriptors' row of key 0 is ``row0`` (0, or b * Skv on a [B * Skv, 576] descriptor)."""
    HALF: tl.constexpr = DN // 2
    kn0 = kn_desc.load([row0 + start, 0])
    kn1 = kn_desc.load([row0 + start, HALF])
    kr = kr_desc.load([row0 + start, DN])
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
    acc0, acc1, l_i, m_i, qn0, qn1, qr, kn_desc, kr_desc, row0, start, limit, qk_scale, live,
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
    kn0 = kn_desc.load([row0 + start, 0])
    kn1 = kn_desc.load([row0 + start, HALF])
    kr = kr_desc.load([row0 + start, DN])
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
    q, kv, kn_desc, kr_desc, o, lse,
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_kb, stride_kn,
    stride_ob, stride_os, stride_oh, stride_od,
    stride_lb, stride_lh, stride_ls,
    Sq, H, Skv, n_hgroups, n_batch, qk_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEADS_PER_TILE: tl.constexpr,
    UNMASKED_LOOP: tl.constexpr, KEYS_AS_M: tl.constexpr, TAU: tl.constexpr, DN: tl.constexpr, DR: tl.constexpr,
    QK_SPLIT: tl.constexpr, DEFER_SUM: tl.constexpr = False, FLAT: tl.constexpr = False, PERSISTENT: tl.constexpr = False,
):
    """``_mla_prefill_fwd`` (V_SPLIT 1) with KV tiles through tensor descriptors (TMA on sm_90).

    FLAT: one descriptor pair over kv as [B * Skv, 576] rows (kn_desc / kr_desc from the host, or
    built here once when they are None); else every row tile builds its own pair over its batch.
    PERSISTENT: the grid is at most one program per SM, and program p takes row tiles p, then
    2P - 1 - p, then 2P + p, ... of the heaviest-first order (a snake, so the causal work evens out);
    the per-program start (descriptors, launch, ramp) is paid once per SM, not once per row tile."""
    HALF: tl.constexpr = DN // 2
    QB: tl.constexpr = BLOCK_M // HEADS_PER_TILE
    n_qblocks = tl.cdiv(Sq, QB)
    if FLAT:
        if kn_desc is None:
            kn_desc = tl.make_tensor_descriptor(kv, shape=[n_batch * Skv, DN + DR], strides=[stride_kn, 1], block_shape=[BLOCK_N, HALF])
            kr_desc = tl.make_tensor_descriptor(kv, shape=[n_batch * Skv, DN + DR], strides=[stride_kn, 1], block_shape=[BLOCK_N, DR])
    pid = tl.program_id(0)
    if PERSISTENT:
        nprog = tl.num_programs(0)
        n_tiles = n_qblocks * n_hgroups * n_batch
        for k in range(0, tl.cdiv(n_tiles, nprog)):
            t = k * nprog + tl.where(k % 2 == 0, pid, nprog - 1 - pid)
            if t < n_tiles:
                u = t // n_batch
                _prefill_row_tile(q, kv, kn_desc, kr_desc, o, lse,
                                  stride_qb, stride_qs, stride_qh, stride_qd, stride_kb, stride_kn,
                                  stride_ob, stride_os, stride_oh, stride_od, stride_lb, stride_lh, stride_ls,
                                  (t % n_batch).to(tl.int64), n_qblocks - 1 - u // n_hgroups, u % n_hgroups,
                                  Sq, H, Skv, qk_scale, BLOCK_M, BLOCK_N, HEADS_PER_TILE, UNMASKED_LOOP, KEYS_AS_M, TAU,
                                  DN, DR, QK_SPLIT, DEFER_SUM, FLAT)
    else:
        _prefill_row_tile(q, kv, kn_desc, kr_desc, o, lse,
                          stride_qb, stride_qs, stride_qh, stride_qd, stride_kb, stride_kn,
                          stride_ob, stride_os, stride_oh, stride_od, stride_lb, stride_lh, stride_ls,
                          (tl.program_id(2) % n_batch).to(tl.int64), n_qblocks - 1 - pid // n_hgroups, pid % n_hgroups,
                          Sq, H, Skv, qk_scale, BLOCK_M, BLOCK_N, HEADS_PER_TILE, UNMASKED_LOOP, KEYS_AS_M, TAU,
                          DN, DR, QK_SPLIT, DEFER_SUM, FLAT)


@triton.jit
def _prefill_row_tile(
    q, kv, kn_desc, kr_desc, o, lse,
    stride_qb, stride_qs, stride_qh, stride_qd, stride_kb, stride_kn,
    stride_ob, stride_os, stride_oh, stride_od, stride_lb, stride_lh, stride_ls,
    b, qb, hg, Sq, H, Skv, qk_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEADS_PER_TILE: tl.constexpr,
    UNMASKED_LOOP: tl.constexpr, KEYS_AS_M: tl.constexpr, TAU: tl.constexpr, DN: tl.constexpr, DR: tl.constexpr,
    QK_SPLIT: tl.constexpr, DEFER_SUM: tl.constexpr, FLAT: tl.constexpr,
):
    """One row tile (query block qb, head group hg, batch b) of ``_mla_prefill_tma``."""
    HALF: tl.constexpr = DN // 2
    QB: tl.constexpr = BLOCK_M // HEADS_PER_TILE
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

    if FLAT:
        row0 = (b * Skv).to(tl.int32)  # TMA coordinates are 32-bit; b is the constant 0 when B == 1
    else:
        row0 = 0
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
            acc0, acc1, l_i, m_i = _attend_tile_split(acc0, acc1, l_i, m_i, qn0, qn1, qr, kn_desc, kr_desc, row0, start, limit, qk_scale,
                                                      live, BLOCK_N, DN, False, KEYS_AS_M, TAU, DEFER_SUM)
        for start in range(full_end, end, BLOCK_N):
            acc0, acc1, l_i, m_i = _attend_tile_split(acc0, acc1, l_i, m_i, qn0, qn1, qr, kn_desc, kr_desc, row0, start, limit, qk_scale,
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
            acc0, acc1, l_i, m_i = _attend_tile_tma(acc0, acc1, l_i, m_i, qn0, qn1, qr, kn_desc, kr_desc, row0, start, limit, qk_scale,
                                                    BLOCK_N, DN, False, KEYS_AS_M, TAU)
        for start in range(full_end, end, BLOCK_N):
            acc0, acc1, l_i, m_i = _attend_tile_tma(acc0, acc1, l_i, m_i, qn0, qn1, qr, kn_desc, kr_desc, row0, start, limit, qk_scale,
                                                    BLOCK_N, DN, True, KEYS_AS_M, TAU)
        inv_l = 1.0 / l_i  # every real row sees key 0, so l_i > 0
        ptr = o_row[:, None] + offs_h[None, :] * stride_od
        tl.store(ptr, (acc0 * inv_l[:, None]).to(o.dtype.element_ty), mask=row_ok[:, None])
        tl.store(ptr + HALF * stride_od, (acc1 * inv_l[:, None]).to(o.dtype.element_ty), mask=row_ok[:, None])
    l_ptr = lse + b * stride_lb + h_idx.to(tl.int64) * stride_lh + s_idx.to(tl.int64) * stride_ls
    tl.store(l_ptr, (m_i + tl.log2(l_i)) * 0.6931471805599453, mask=row_ok)


_DESCRIPTOR_SCRATCH = {}


def _descriptor_scratch(size, alignment, stream):
    """Global memory Triton asks for when a kernel builds tensor descriptors on the device: one
    buffer per (size, stream), reused (launches on one stream are ordered; each program writes
    its descriptors before it reads them)."""
    buf = _DESCRIPTOR_SCRATCH.get((size, stream))
    if buf is None:
        buf = _DESCRIPTOR_SCRATCH[(size, stream)] = torch.empty(size, device="cuda", dtype=torch.int8)
    return buf


def _persistent_programs(device):
    """PERSISTENT's grid: one program per SM on a GPU; three on the CPU interpreter, so a small test
    still walks several rounds of the snake in both directions."""
    if device.type != "cuda":
        return 3
    return torch.cuda.get_device_properties(device).multi_processor_count


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
    if K["DESC"] not in ("device", "host"):
        raise ValueError(f"DESC must be 'device' or 'host', got {K['DESC']!r}")

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
            # One descriptor pair over kv as [B * Skv, 576] rows: needs the batches back to back, and
            # (B > 1) no key tile that runs past its batch's end into the next one's keys.
            flat = kv.stride(0) == Skv * kv.stride(1) and (B == 1 or Skv % block_n == 0)
            host = K["DESC"] == "host" and flat
            persistent = bool(K["PERSISTENT"])
            kn_desc = kr_desc = None
            if host:
                rows, width = B * Skv, D_NOPE + D_ROPE
                kn_desc = TensorDescriptor(kv, [rows, width], [kv.stride(1), 1], [block_n, D_NOPE // 2])
                kr_desc = TensorDescriptor(kv, [rows, width], [kv.stride(1), 1], [block_n, D_ROPE])
            if q.is_cuda and not host:
                triton.set_allocator(_descriptor_scratch)
            if persistent:
                grid = (min(n_qblocks * n_hgroups * B, _persistent_programs(q.device)), 1, 1)
            _mla_prefill_tma[grid](
                q, kv, kn_desc, kr_desc, o, lse,
                q.stride(0), q.stride(1), q.stride(2), q.stride(3),
                kv.stride(0), kv.stride(1),
                o.stride(0), o.stride(1), o.stride(2), o.stride(3),
                lse.stride(0), lse.stride(1), lse.stride(2),
                Sq, H, Skv, n_hgroups, B, float(scale) * LOG2E,
                BLOCK_M=block_m, BLOCK_N=block_n, HEADS_PER_TILE=hpt, UNMASKED_LOOP=bool(K["UNMASKED_LOOP"]),
                KEYS_AS_M=bool(K["KEYS_AS_M"]), TAU=tau, DN=D_NOPE, DR=D_ROPE, QK_SPLIT=qk_split,
                DEFER_SUM=K["ROWSUM"] == "defer", FLAT=host or (persistent and flat), PERSISTENT=persistent,
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
