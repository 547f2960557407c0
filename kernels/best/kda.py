"""KDA forward, chunk-parallel: prepare every chunk at once, then scan the state across chunks and read out.

Per (batch, head) the KDA recurrence keeps a K x V float32 state S; per step t
``S = exp(g_t) * S; S += beta_t k_t (v_t - S^T k_t)^T; o_t = S^T (scale q_t)``.
Cut the sequence into chunks of BT = 32 steps and write G_i for the running sum of g from the chunk's start to
step i (inclusive). Unrolling the recurrence inside a chunk that starts from state S0 (the UT / WY form of the
delta rule):

    delta = u - w S0                       the delta-rule corrections, one row per step
    u     = A (V),  w = A (exp(G) * K)     A = (I + Akk)^-1 diag(beta)
    Akk_ij = beta_i <k_i, exp(G_i - G_j) k_j>          (j < i)
    Aqk_ij = scale <q_i, exp(G_i - G_j) k_j>           (j <= i)
    o      = (scale exp(G) * Q) S0 + Aqk delta = qd S0 + au,   qd = scale exp(G) Q - Aqk w,  au = Aqk u
    S_end  = exp(G_last) * S0 + (exp(G_last - G) * K)^T delta

Two stages. The preparation (every chunk at once): the block rows (Aqk and Akk, 16 rows at a time), the solve
(A's inverse) and the scan's inputs w, u, kd = exp(G_last - G) k, qd, au, gl = exp(G_last). The scan (one program
per value slice and head, chunk after chunk): delta = u - w S, o = qd S + au, S = gl S + kd^T delta. On Hopper the
preparation is one Gluon program per chunk and the scan a warp-specialised Gluon kernel, launched beside each
other where the scan is the longer stage; elsewhere Triton kernels of the same algebra (host.py says where).

Any gate in (-inf, 0] (-1000 resets, long strong-decay runs, -3e4) keeps exp in range: every decay is factored
around a reference inside its span, each exponent a running sum of exactly the gates it spans; a diagonal block too
steep for one reference is split exactly; gates are floored at -30 (below e^-30 a decay is negligible). Precision (relative RMS against the float64 recurrence, tolerance 5e-3): the factors that need more than
bf16 are tf32 or bf16 hi / lo pairs (~16 bits); w, kd, qd, u and au are stored in bf16; the state is rounded to
bf16 in its products. Measured: ~3.2e-3 in o and ~2.4e-3 in the final state at fla's shapes (fla: ~4.0e-3).
Measurements, history and open questions: kernels/notes/kda/README.md."""

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor


# -- knobs.py ----------------------------------------------------------------------------------------------------------
# The knobs. ``launch``: how a call launches its kernels once its plan is built (host.py): "compiled" straight through
# the compiled kernels, "jit" through ``JITFunction.run`` (binding and specialising every argument again: tens of
# microseconds); the CPU interpreter always takes the second. ``beside``: where the scan runs beside the preparation
# (host.py), "quarter" where its 64-wide programs number at most a quarter of the SMs (the headline's 32 of the H200's
# 132), "wide" also where 128-wide programs would (then 128-wide: B2 T16384 H16's 32 programs). The family's other
# choices were measured on the H200 and retired (kernels/notes/kda/README.md).

# kopt:knobs-begin
KNOBS = {'launch': 'compiled', 'beside': 'wide'}
# kopt:knobs-end
SPACE = {"launch": ["compiled", "jit"], "beside": ["quarter", "wide"]}
TRY_EARLY = [{"beside": "wide"}]


# -- common.py ---------------------------------------------------------------------------------------------------------
# Shared device math: exp as one ex2, and products that need more than bf16's 8 significant bits.

_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _exp(x):
    """e^x as one ex2.approx.ftz on the GPU (``tl.exp`` adds a guard for subnormal results: five instructions, not
    two); every decay here is a normal number or negligible below e^-87, so flushing subnormals changes nothing."""
    return tl.exp2(x * _LOG2E)


@gluon.jit
def _gl_exp(x):
    """``_exp`` for the Gluon kernels."""
    return gl.exp2(x * 1.4426950408889634)


@triton.jit
def _split(x):
    """x ~= hi + lo with both halves bf16 (about 16 significant bits together)."""
    hi = x.to(tl.bfloat16)
    lo = (x - hi.to(tl.float32)).to(tl.bfloat16)
    return hi, lo


@triton.jit
def _dot3(a, b, acc):
    """acc + a @ b with float32 operands as bf16 hi/lo pairs: three bf16 tensor-core products
    (hi*hi + hi*lo + lo*hi), about 16 significant bits, no tf32 involved."""
    a_hi, a_lo = _split(a)
    b_hi, b_lo = _split(b)
    acc = tl.dot(a_hi, b_hi, acc)
    acc = tl.dot(a_hi, b_lo, acc)
    return tl.dot(a_lo, b_hi, acc)


@triton.jit
def _dot_tf32(a, b, acc):
    """acc + a @ b for float32 operands as one tf32 tensor-core product (10 explicit mantissa bits per operand)."""
    return tl.dot(a, b, acc, input_precision="tf32")


# -- rows.py -----------------------------------------------------------------------------------------------------------
# The block rows in Triton (wherever the fused Gluon preparation does not run): Aqk, Akk and each diagonal block's
# inverse, a 16-row block row per program. A decay between blocks is factored around the row block's first step r,
# exp(G_i - G_r) exp(G_r - G_j), both <= 1, each exponent a forward running sum of exactly the gates it spans. A
# diagonal block is factored around its midpoint where its per-channel decay span is at most LIMIT (160 nats: both
# factors within e^+-80), else split exactly (``_diag_split``). Gates are raised to at least FLOOR (-30) first: a
# decay changes only where a gate is below -30, and is below e^-30 either way; a reset then stays within the guard.

@triton.jit
def _split_level(q_b, k_b, e_b, HALF: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr):
    """One level of ``_diag_split``: the lower-left HALF x HALF quarter of every 2 HALF x 2 HALF
    diagonal block, factored around that quarter's first row m: exp(E_i - E_m) (rows) times
    exp(E_m - E_j) (columns), exponents <= 0; everything else of the [BC, BC] result is 0."""
    ri = tl.arange(0, BC)
    m_row = (ri // (2 * HALF)) * (2 * HALF) + HALF  # the reference row of row i (and of column j = i)
    e_ref = tl.zeros([BC, BK], dtype=tl.float32)
    for b in tl.static_range(BC // (2 * HALF)):
        e_m = tl.sum(tl.where((ri == b * 2 * HALF + HALF)[:, None], e_b, 0.0), axis=0)  # E at row m
        e_ref = tl.where((m_row == b * 2 * HALF + HALF)[:, None], e_m[None, :], e_ref)
    in_row = (ri % (2 * HALF)) >= HALF  # rows of a later half
    in_col = (ri % (2 * HALF)) < HALF  # columns of an earlier half
    up = tl.where(in_row[:, None], _exp(tl.where(in_row[:, None], e_b - e_ref, 0.0)), 0.0)
    down = tl.where(in_col[:, None], k_b * _exp(tl.where(in_col[:, None], e_ref - e_b, 0.0)), 0.0)
    down_t = tl.trans(down)
    dq = _dot_tf32(q_b * up, down_t, tl.zeros([BC, BC], dtype=tl.float32))
    dk = _dot_tf32(k_b * up, down_t, tl.zeros([BC, BC], dtype=tl.float32))
    sel = in_row[:, None] & in_col[None, :] & ((ri // (2 * HALF))[:, None] == (ri // (2 * HALF))[None, :])
    return tl.where(sel, dq, 0.0), tl.where(sel, dk, 0.0)


@triton.jit
def _diag_split(q_b, k_b, e_b, q_ptr, k_ptr, g_ptr, row0, rows_ok, ks,
                s_qt, s_kt, s_gt,
                BC: tl.constexpr, BK: tl.constexpr, DK: tl.constexpr, SB: tl.constexpr, LOG_NS: tl.constexpr):
    """Aqk and Akk (unscaled) of a BC x BC diagonal block over channels ks..ks+BK where the guard fails, exactly: at
    each level h = BC/2, .., SB the lower-left h x h quarter of every 2h x 2h diagonal block is factored around the
    later half's first row m, exp(E_i - E_m) exp(E_m - E_j), both exponents <= 0 (one that underflows stands for a
    product below e^-87); only the SB x SB sub-blocks are taken pairwise, with sums local to each. q_b, k_b, e_b:
    the block's [BC, BK] rows and running sums (first row's gate left out) as loaded by the block row."""
    NS: tl.constexpr = BC // SB
    acc_q = tl.zeros([BC, BC], dtype=tl.float32)
    acc_k = tl.zeros([BC, BC], dtype=tl.float32)
    for lv in tl.static_range(LOG_NS):
        dq, dk = _split_level(q_b, k_b, e_b, BC // (2 << lv), BC, BK)
        acc_q += dq
        acc_k += dk
    # the SB x SB diagonal sub-blocks, pairwise: [NS, SB, DK] tiles, sums local to each sub-block
    s3 = tl.arange(0, NS)[:, None, None]
    i3 = tl.arange(0, SB)[None, :, None]
    rows3 = row0 + s3 * SB + i3
    ok3 = tl.reshape(rows_ok, [NS, SB, 1])
    causal = (tl.arange(0, SB)[:, None] >= tl.arange(0, SB)[None, :])[None, :, :, None]
    blk_q = tl.zeros([NS, SB, SB], dtype=tl.float32)
    blk_k = tl.zeros([NS, SB, SB], dtype=tl.float32)
    for c0 in range(0, BK, DK):
        c3 = (ks + c0 + tl.arange(0, DK))[None, None, :]
        g = tl.load(g_ptr + rows3 * s_gt + c3, mask=ok3, other=0.0).to(tl.float32)
        q = tl.load(q_ptr + rows3 * s_qt + c3, mask=ok3, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + rows3 * s_kt + c3, mask=ok3, other=0.0).to(tl.float32)
        e_loc = tl.cumsum(tl.where(i3 > 0, g, 0.0), axis=1)
        diff = e_loc[:, :, None, :] - e_loc[:, None, :, :]
        dec = _exp(tl.where(causal, diff, float("-inf")))
        kj = k[:, None, :, :] * dec
        blk_q += tl.sum(q[:, :, None, :] * kj, axis=3)
        blk_k += tl.sum(k[:, :, None, :] * kj, axis=3)
    # place the sub-blocks on the diagonal: [NS, SB, NS, SB] -> [BC, BC], selection only
    same = (tl.arange(0, NS)[:, None, None, None] == tl.arange(0, NS)[None, None, :, None])
    acc_q += tl.reshape(tl.where(same, blk_q[:, :, None, :], 0.0), [BC, BC])
    acc_k += tl.reshape(tl.where(same, blk_k[:, :, None, :], 0.0), [BC, BC])
    return acc_q, acc_k


@triton.jit
def _kda_rows_kernel(
    q_ptr, k_ptr, g_ptr, beta_ptr, aqk_ptr, akk_ptr, gs_ptr, gt_ptr,
    scale, T, TP, NT, H, lo_off,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_gb, s_gt, s_gh, s_bb, s_bt, s_bh,
    K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, LIMIT: tl.constexpr,
    FLOOR: tl.constexpr, LOG_BC: tl.constexpr, SB: tl.constexpr, LOG_NS: tl.constexpr, DKS: tl.constexpr,
):
    """Rows bi*BC.. of one chunk's Aqk (scaled; bf16 hi and lo halves, lo_off elements apart) and Akk (beta-scaled,
    strictly lower, float32; the diagonal block replaced by the inverse of I + it); grid (chunks * BT // BC, batch *
    heads). The block's running sums of its floored gates, G_i - G_(r-1), and its totals go to gs and gt."""
    NC: tl.constexpr = BT // BC
    i_t = tl.program_id(0).to(tl.int64) // NC
    bi = tl.program_id(0) % NC
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    t0 = i_t * BT
    q_ptr += i_b * s_qb + i_h * s_qh + t0 * s_qt
    k_ptr += i_b * s_kb + i_h * s_kh + t0 * s_kt
    g_ptr += i_b * s_gb + i_h * s_gh + t0 * s_gt
    beta_ptr += i_b * s_bb + i_h * s_bh + t0 * s_bt
    row_base = i_bh * TP + t0  # first row of this chunk in the [B*H, TP, *] intermediates
    aqk_ptr += row_base * BT
    akk_ptr += row_base * BT
    gs_ptr += row_base * K
    gt_ptr += (i_bh * NT + i_t) * NC * K
    W: tl.constexpr = BT - BC
    r = bi * BC
    ct = tl.arange(0, BT)
    cw = tl.arange(0, W)
    rc = tl.arange(0, BC)
    cc = tl.arange(0, BC)
    rb_ok = t0 + r + rc < T
    beta_r = tl.load(beta_ptr + (r + rc) * s_bt, mask=rb_ok, other=0.0).to(tl.float32)
    off_q = tl.zeros([BC, W], dtype=tl.float32)  # column i holds chunk column j = r - 1 - i
    off_k = tl.zeros([BC, W], dtype=tl.float32)
    dia_q = tl.zeros([BC, BC], dtype=tl.float32)
    dia_k = tl.zeros([BC, BC], dtype=tl.float32)
    mb = rb_ok[:, None]
    p_g = g_ptr + (r + rc)[:, None] * s_gt + tl.arange(0, BK)[None, :]
    p_q = q_ptr + (r + rc)[:, None] * s_qt + tl.arange(0, BK)[None, :]
    p_k = k_ptr + (r + rc)[:, None] * s_kt + tl.arange(0, BK)[None, :]
    for ks in range(0, K, BK):
        ck = ks + tl.arange(0, BK)
        g_b = tl.load(p_g + ks, mask=mb, other=0.0).to(tl.float32)
        q_b = tl.load(p_q + ks, mask=mb, other=0.0).to(tl.float32)
        k_b = tl.load(p_k + ks, mask=mb, other=0.0).to(tl.float32)
        g_b = tl.maximum(g_b, FLOOR)
        # E_i = G_i - G_r inside the block (<= 0, non-increasing); the first row's own gate is
        # left out of the sum, so a -1000 there never has to cancel against itself
        e_b = tl.cumsum(tl.where(rc[:, None] > 0, g_b, 0.0), axis=0)
        # the sums the solve needs: the first row's floored gate added back
        g_first = tl.maximum(tl.load(g_ptr + r * s_gt + ck, mask=(t0 + r) < T, other=0.0).to(tl.float32), FLOOR)
        tl.store(gs_ptr + (r + rc)[:, None] * K + ck[None, :], e_b + g_first[None, :], mask=mb)
        if bi > 0:
            # columns j < r, held transposed ([BK, W]) and in reverse order, i = r - 1 - j:
            # exp(G_r - G_j) = exp(g_r + sum_{j < t < r} g_t), the sum a forward running sum
            # of g[r - 1], g[r - 2], ... (no reverse scan, no large prefix to subtract)
            m_shift = (cw >= 1) & (cw < r) & (t0 + r - cw < T)
            gs = tl.load(g_ptr + (r - cw)[None, :] * s_gt + ck[:, None], mask=m_shift[None, :], other=0.0).to(tl.float32)
            m_col = (cw < r) & (t0 + r - 1 - cw < T)
            k_t = tl.load(k_ptr + (r - 1 - cw)[None, :] * s_kt + ck[:, None], mask=m_col[None, :], other=0.0).to(tl.float32)
            g_r = tl.load(g_ptr + r * s_gt + ck, mask=(t0 + r) < T, other=0.0).to(tl.float32)
            x_col = g_r[:, None] + tl.cumsum(gs, axis=1)
            kb = k_t * _exp(tl.where((cw < r)[None, :], x_col, float("-inf")))
            e_row = _exp(e_b)
            off_q = _dot_tf32(q_b * e_row, kb, off_q)
            off_k = _dot_tf32(k_b * e_row, kb, off_k)
        # the diagonal block; gates are <= 0, so the smallest running sum is the last row's: the block's total
        e_last = tl.min(e_b, axis=0)  # [BK]; the block's decay span per channel is -e_last
        tl.store(gt_ptr + bi * K + ck, e_last + g_first)
        span = -tl.min(e_last, axis=0)
        if span <= LIMIT:
            ref = 0.5 * e_last  # the block's midpoint: both factors within e^(span / 2)
            up = _exp(e_b - ref[None, :])
            down = tl.trans(k_b * _exp(ref[None, :] - e_b))  # the column side: the row side's registers, transposed
            dq = _dot_tf32(q_b * up, down, tl.zeros([BC, BC], dtype=tl.float32))
            dk = _dot_tf32(k_b * up, down, tl.zeros([BC, BC], dtype=tl.float32))
            # the upper triangle may hold inf / nan: select, never multiply
            dia_q += tl.where(rc[:, None] >= cc[None, :], dq, 0.0)
            dia_k += tl.where(rc[:, None] > cc[None, :], dk, 0.0)
        else:
            dq, dk = _diag_split(q_b, k_b, e_b, q_ptr, k_ptr, g_ptr, r, rb_ok, ks, s_qt, s_kt, s_gt,
                                 BC, BK, DKS, SB, LOG_NS)
            dia_q += dq
            dia_k += tl.where(rc[:, None] > cc[None, :], dk, 0.0)
    # off-diagonal part (reversed columns j = r - 1 - i < r), zeros right of the block, and
    # the diagonal block: three disjoint stores
    p_row = (r + rc)[:, None] * BT
    before = (cw < r)[None, :]
    aq = off_q * scale
    aq_hi = aq.to(tl.bfloat16)
    aq_lo = (aq - aq_hi.to(tl.float32)).to(tl.bfloat16)
    tl.store(aqk_ptr + p_row + (r - 1 - cw)[None, :], aq_hi, mask=before)
    tl.store(aqk_ptr + lo_off + p_row + (r - 1 - cw)[None, :], aq_lo, mask=before)
    tl.store(akk_ptr + p_row + (r - 1 - cw)[None, :], off_k * beta_r[:, None], mask=before)
    after = (ct >= r + BC)[None, :]
    zero = tl.zeros([BC, BT], dtype=tl.float32)
    tl.store(aqk_ptr + p_row + ct[None, :], zero.to(tl.bfloat16), mask=after)
    tl.store(aqk_ptr + lo_off + p_row + ct[None, :], zero.to(tl.bfloat16), mask=after)
    tl.store(akk_ptr + p_row + ct[None, :], zero, mask=after)
    dq_s = dia_q * scale
    dq_hi = dq_s.to(tl.bfloat16)
    tl.store(aqk_ptr + p_row + r + cc[None, :], dq_hi)
    tl.store(aqk_ptr + lo_off + p_row + r + cc[None, :], (dq_s - dq_hi.to(tl.float32)).to(tl.bfloat16))
    # (I + L)^-1 = (I - L)(I + L^2)(I + L^4)...(I + L^(BC/2)), exact because the strictly lower BC x BC block L is
    # nilpotent of index BC: LOG_BC - 1 squarings and as many products, each three bf16 tensor-core products
    # (``_dot3``, ~16 bits): a dependency chain of 2 (LOG_BC - 1) small products instead of BC substitution steps
    akk_d = dia_k * beta_r[:, None]
    eye_c = tl.where(rc[:, None] == cc[None, :], 1.0, 0.0)
    n_c = akk_d
    x_c = eye_c - n_c
    for _ in tl.static_range(LOG_BC - 1):
        n_c = _dot3(n_c, n_c, tl.zeros([BC, BC], dtype=tl.float32))
        x_c = _dot3(x_c, eye_c + n_c, tl.zeros([BC, BC], dtype=tl.float32))
    tl.store(akk_ptr + p_row + r + cc[None, :], x_c)


# -- solve.py ----------------------------------------------------------------------------------------------------------
# The solve in Triton, after ``_kda_rows_kernel``: A = (I + Akk)^-1 diag(beta), with the diagonal blocks' inverses
# D^-1 in Akk's place, so that across the blocks (D + L)^-1 = (I - N) D^-1, N = D^-1 L; then w = A (exp(G) k), u = A v,
# kd = exp(G_last - G) k, gl = exp(G_last), qd = scale exp(G) q - Aqk w and au = Aqk u (the scan's read-out is then
# o = qd S + au). G_i: the block rows' running sum of its block plus the totals of the blocks before.

@triton.jit
def _kda_solve_kernel(
    q_ptr, k_ptr, v_ptr, beta_ptr, w_ptr, u_ptr, kd_ptr, qd_ptr, aqk_ptr, akk_ptr, gl_ptr, au_ptr, gs_ptr, gt_ptr,
    scale, T, TP, NT, H, lo_off,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_bb, s_bt, s_bh,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BVP: tl.constexpr,
):
    """One chunk: w, u, kd, qd, gl and au as the module docstring defines them; grid (chunks, batch * heads). w, kd,
    qd, u and au are stored in bf16; au is formed from u before its rounding, qd from w as stored."""
    NC: tl.constexpr = BT // BC
    i_t = tl.program_id(0).to(tl.int64)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    t0 = i_t * BT
    q_ptr += i_b * s_qb + i_h * s_qh + t0 * s_qt
    k_ptr += i_b * s_kb + i_h * s_kh + t0 * s_kt
    v_ptr += i_b * s_vb + i_h * s_vh + t0 * s_vt
    beta_ptr += i_b * s_bb + i_h * s_bh + t0 * s_bt
    row_base = i_bh * TP + t0  # first row of this chunk in the [B*H, TP, *] intermediates
    w_ptr += row_base * K
    kd_ptr += row_base * K
    qd_ptr += row_base * K
    u_ptr += row_base * V
    au_ptr += row_base * V
    aqk_ptr += row_base * BT
    akk_ptr += row_base * BT
    gl_ptr += (i_bh * NT + i_t) * K
    gs_ptr += row_base * K
    gt_ptr += (i_bh * NT + i_t) * NC * K
    rt = tl.arange(0, BT)
    ct = tl.arange(0, BT)
    rt_ok = t0 + rt < T
    same_blk = (rt[:, None] // BC) == (ct[None, :] // BC)
    x = tl.load(akk_ptr + rt[:, None] * BT + ct[None, :], mask=same_blk, other=0.0)
    # the loads that do not depend on A are issued with the inverses, so that their latency overlaps the merge
    beta_c = tl.load(beta_ptr + ct * s_bt, mask=rt_ok, other=0.0).to(tl.float32)
    aq_hi = tl.load(aqk_ptr + rt[:, None] * BT + ct[None, :])
    aq_lo = tl.load(aqk_ptr + rt[:, None] * BT + ct[None, :] + lo_off)
    # across blocks: (D + L)^-1 = (I - N) D^-1, N = D^-1 L, by tf32 products
    lower = tl.load(akk_ptr + rt[:, None] * BT + ct[None, :], mask=(rt[:, None] // BC) > (ct[None, :] // BC), other=0.0)
    eye = tl.where(rt[:, None] == ct[None, :], 1.0, 0.0)
    zero = tl.zeros([BT, BT], dtype=tl.float32)
    n = _dot_tf32(x, lower, zero)
    p = eye - n
    x = _dot_tf32(p, x, zero)
    a_wy = (x * beta_c[None, :]).to(tl.bfloat16)  # A = (I + Akk)^-1 diag(beta)
    for ks in range(0, K, BK):
        ck = ks + tl.arange(0, BK)
        m = rt_ok[:, None]
        k_a = tl.load(k_ptr + rt[:, None] * s_kt + ck[None, :], mask=m, other=0.0).to(tl.float32)
        q_a = tl.load(q_ptr + rt[:, None] * s_qt + ck[None, :], mask=m, other=0.0).to(tl.float32)
        p_t = rt[:, None] * K + ck[None, :]
        # G_i = (its block's running sum) + (the earlier blocks' totals)
        g32 = tl.load(gs_ptr + rt[:, None] * K + ck[None, :], mask=m, other=0.0)
        tot32 = tl.zeros([BK], dtype=tl.float32)
        for b in tl.static_range(BT // BC):
            blk_tot = tl.load(gt_ptr + b * K + ck)
            if b < BT // BC - 1:
                g32 += tl.where((rt // BC > b)[:, None], blk_tot[None, :], 0.0)
            tot32 += blk_tot
        dec = _exp(g32)
        kd_t = k_a * _exp(tot32[None, :] - g32)
        tl.store(kd_ptr + p_t, kd_t.to(kd_ptr.dtype.element_ty))
        tl.store(gl_ptr + ck, _exp(tot32))
        w_t = tl.dot(a_wy, (k_a * dec).to(tl.bfloat16)).to(tl.bfloat16)
        tl.store(w_ptr + p_t, w_t)
        qd_t = q_a * (dec * scale)
        # Aqk (hi + lo, ~16 bits) times w exactly as the scan reads it
        aw = tl.dot(aq_hi, w_t)
        aw = tl.dot(aq_lo, w_t, aw)
        qd_t = qd_t - aw
        tl.store(qd_ptr + p_t, qd_t.to(qd_ptr.dtype.element_ty))
    for vs in range(0, V, BVP):
        cv = vs + tl.arange(0, BVP)
        v_a = tl.load(v_ptr + rt[:, None] * s_vt + cv[None, :], mask=rt_ok[:, None], other=0.0)
        u_t = tl.dot(a_wy, v_a.to(tl.bfloat16))
        tl.store(u_ptr + rt[:, None] * V + cv[None, :], u_t.to(u_ptr.dtype.element_ty))
        au = tl.dot(aq_hi.to(tl.float32) + aq_lo.to(tl.float32), u_t, input_precision="tf32")
        tl.store(au_ptr + rt[:, None] * V + cv[None, :], au.to(au_ptr.dtype.element_ty))


# -- scan.py -----------------------------------------------------------------------------------------------------------
# The state pass and the read-out in Triton, where the Gluon scan does not run. ``_kda_scan_kernel``: per (16 value
# columns, batch * head), chunk after chunk, delta = u - w S, S = gl S + kd^T delta, storing the state entering each
# chunk in bf16; ``_kda_out_kernel``: o = qd h + au for every chunk at once. Delta as a bf16 hi/lo pair (~16 bits) in
# its products, the state rounded to bf16 in its own.

@triton.jit
def _kda_scan_kernel(
    w_ptr, u_ptr, kd_ptr, gl_ptr, h0_ptr, ht_ptr, hbuf_ptr, TP, NT,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
    USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
):
    i_v = tl.program_id(0).to(tl.int64)
    i_bh = tl.program_id(1).to(tl.int64)
    rk = tl.arange(0, K)
    cv = i_v * BV + tl.arange(0, BV)
    rt = tl.arange(0, BT)
    state_off = (i_bh * K + rk[:, None]) * V + cv[None, :]  # [K, BV]
    if USE_H0:
        S = tl.load(h0_ptr + state_off).to(tl.float32)
    else:
        S = tl.zeros([K, BV], dtype=tl.float32)
    w_ptr += i_bh * TP * K
    kd_ptr += i_bh * TP * K
    u_ptr += i_bh * TP * V
    gl_ptr += i_bh * NT * K
    hbuf_ptr += i_bh * NT * K * V
    for n in range(NT):
        row = n * BT + rt
        p_k = row[:, None] * K + rk[None, :]
        w_n = tl.load(w_ptr + p_k)
        kd_n = tl.load(kd_ptr + p_k)
        gl_n = tl.load(gl_ptr + n * K + rk)
        u_n = tl.load(u_ptr + row[:, None] * V + cv[None, :]).to(tl.float32)
        s_hi = S.to(tl.bfloat16)
        ws = tl.dot(w_n, s_hi)
        d = u_n - ws  # [BT, BV]
        d_hi, d_lo = _split(d)
        tl.store(hbuf_ptr + n * K * V + rk[:, None] * V + cv[None, :], S.to(hbuf_ptr.dtype.element_ty))
        kt = tl.trans(kd_n)
        upd = tl.dot(kt, d_hi)
        upd = tl.dot(kt, d_lo, upd)
        S = S * gl_n[:, None] + upd
    if STORE_HT:
        tl.store(ht_ptr + state_off, S)


@triton.jit
def _kda_out_kernel(
    qd_ptr, hbuf_ptr, au_ptr, o_ptr, T, TP, NT, H, s_ob, s_ot, s_oh,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
):
    """o of one (chunk, BV value columns, batch * head)."""
    i_t = tl.program_id(0).to(tl.int64)
    i_v = tl.program_id(1).to(tl.int64)
    i_bh = tl.program_id(2).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    rk = tl.arange(0, K)
    cv = i_v * BV + tl.arange(0, BV)
    rt = tl.arange(0, BT)
    row = i_t * BT + rt
    qd = tl.load(qd_ptr + (i_bh * TP + row)[:, None] * K + rk[None, :])
    h = tl.load(hbuf_ptr + ((i_bh * NT + i_t) * K + rk)[:, None] * V + cv[None, :])
    o = tl.load(au_ptr + (i_bh * TP + row)[:, None] * V + cv[None, :]).to(tl.float32)
    o = tl.dot(qd, h, o)
    tl.store(o_ptr + i_b * s_ob + i_h * s_oh + row[:, None] * s_ot + cv[None, :],
             o.to(o_ptr.dtype.element_ty), mask=(row < T)[:, None])


# -- gluon_rows.py -----------------------------------------------------------------------------------------------------
# The block rows' products in Gluon, for the fused preparation (gluon_prep.py): q and k rows of one chunk against
# decayed k columns as tf32 warpgroup products from shared memory, each [2 BT, BT] result the q rows' products (Aqk)
# over the k rows' (Akk). The factorisations are those of the Triton rows (rows.py).

@gluon.jit
def _gl_seg_add(v1, f1, v2, f2):
    """Running sums that restart where a flag is set (each 16-row block's own sums)."""
    return gl.where(f2 > 0, v2, v1 + v2), gl.maximum(f1, f2)


@gluon.jit
def _gl_pair(a_s, b_s, top, bottom, cols, ACC: gl.constexpr, BT: gl.constexpr):
    """[top; bottom] @ cols^T for [BT, K] float32 tiles: one tf32 warpgroup product from shared memory
    ([2 BT, BT]: the q rows' products over the k rows' products)."""
    a_s.slice(0, BT).store(top)
    a_s.slice(BT, BT).store(bottom)
    b_s.store(cols)
    fence_async_shared()
    gl.thread_barrier()
    acc = warpgroup_mma(a_s, b_s.permute((1, 0)), gl.zeros([2 * BT, BT], gl.float32, ACC),
                        use_acc=False)  # float32 operands: tf32 (the compiler's default input precision)
    gl.thread_barrier()  # every warp has read the tiles before the next pair overwrites them
    return acc


@gluon.jit
def _gl_level(a_s, b_s, q, k, g, gn, ri, rr, cc, H: gl.constexpr, BT: gl.constexpr, ACC: gl.constexpr):
    """One level of the exact split (the Triton rows' ``_split_level``): the lower-left H x H quarter of every 2H x 2H
    diagonal block, factored around the later half's first row m, exp(G_i - G_m) k_j exp(G_m - G_j), exponents <= 0:
    running sums restarting every H rows, forward over the gates after m, backward over the next rows' gates gn up to
    m. ri: row index of g's layout; rr, cc: of the [2 BT, BT] product. Aqk's and Akk's quarters stacked, else 0."""
    later = (ri % (2 * H)) >= H
    restart = gl.where(ri % H == 0, 1.0, 0.0) + gl.zeros_like(g)
    fwd, _ = gl.associative_scan((gl.where(ri % H == 0, 0.0, g), restart), 0, _gl_seg_add)
    restart_rev = gl.where(ri % H == H - 1, 1.0, 0.0) + gl.zeros_like(g)
    rev, _ = gl.associative_scan((gn, restart_rev), 0, _gl_seg_add, reverse=True)
    up = gl.where(later, _gl_exp(gl.minimum(fwd, 0.0)), 0.0)
    down = gl.where(later, 0.0, k * _gl_exp(gl.minimum(rev, 0.0)))
    p = _gl_pair(a_s, b_s, q * up, k * up, down, ACC, BT)
    i = rr % BT
    sel = ((i % (2 * H)) >= H) & ((cc % (2 * H)) < H) & (i // (2 * H) == cc // (2 * H))
    return gl.where(sel, p, 0.0)


@gluon.jit
def _gl_off(a_s, b_s, q, k, e, gs, c16, ri, BT: gl.constexpr, ACC: gl.constexpr):
    """Rows 16.. against columns ..15, factored around row 16: exp(G_i - G_16) = exp(E_i), and k_j exp(G_16 - G_j)
    with G_16 - G_j = c16 - (running sum at j), c16 = floored g_16 + block 0's total (both exponents <= 0); the
    [2 BT, BT] product is zero elsewhere."""
    BC: gl.constexpr = 16
    up = gl.where(ri >= BC, _gl_exp(e), 0.0)
    down = gl.where(ri < BC, k * _gl_exp(gl.minimum(c16[None, :] - gs, 0.0)), 0.0)
    return _gl_pair(a_s, b_s, q * up, k * up, down, ACC, BT)


@gluon.jit
def _gl_split(a_s, b_s, q, k, g, g_ptr, s_gt, t0, T, ri, c1, rr, cc, FLOOR: gl.constexpr, BT: gl.constexpr,
              ACC: gl.constexpr):
    """The diagonal blocks' strictly lower part by the exact split (``_gl_level`` at H = 8, 4, 2, 1: every pair of
    a 16-row block lies in one level's quarter, the highest bit where i and j differ). g_ptr: the chunk's first
    gate; gn below is the next row's gate, floored (0 past the chunk and T)."""
    gn = gl.load(g_ptr + (ri + 1) * s_gt + c1[None, :], mask=(ri + 1 < BT) & ((t0 + ri + 1) < T), other=0.0)
    gn = gl.maximum(gn.to(gl.float32), FLOOR)
    z = _gl_level(a_s, b_s, q, k, g, gn, ri, rr, cc, 8, BT, ACC)
    for lv in gl.static_range(1, 4):
        z += _gl_level(a_s, b_s, q, k, g, gn, ri, rr, cc, 8 >> lv, BT, ACC)
    return z


# -- gluon_solve.py ----------------------------------------------------------------------------------------------------
# The solve of the fused preparation as stacked warpgroup products: the rows of a [2 BT, N] wgmma accumulator
# are the rows of a wgmma register operand, so a product whose left operand is the previous result needs no
# exchange between threads. Products that need more than bf16 take their operands as bf16 hi / lo pairs.

@gluon.jit
def _gl_hilo(x):
    """x (float32) as a bf16 pair hi + lo, ~16 bits: hi truncated by masking (exact in bf16), lo the rounded rest."""
    hi = (x.to(gl.int32, bitcast=True) & -65536).to(gl.float32, bitcast=True)
    return hi.to(gl.bfloat16), (x - hi).to(gl.bfloat16)


@gluon.jit
def _gl_prod3(a, b, acc, HALF: gl.constexpr, bh_s, bl_s, BT: gl.constexpr, ACC: gl.constexpr):
    """acc + a @ b[HALF] for [2 BT, BT] float32 tiles in the wgmma accumulator layout ACC, where b[HALF] is b's
    BT x BT block of rows HALF * BT..: three bf16 wgmma of hi / lo pairs (~16 bits). b goes through shared memory
    (bh_s, bl_s: [2 BT, BT] bf16); a stays in registers, since a warpgroup's accumulator rows are its operand rows."""
    AOP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2)
    b_hi, b_lo = _gl_hilo(b)
    bh_s.store(b_hi)
    bl_s.store(b_lo)
    fence_async_shared()
    gl.thread_barrier()
    a_hi, a_lo = _gl_hilo(a)
    a_hi = gl.convert_layout(a_hi, AOP)
    bh = bh_s.slice(HALF * BT, BT)
    t = warpgroup_mma(a_hi, bh, acc, is_async=True)
    t = warpgroup_mma(gl.convert_layout(a_lo, AOP), bh, t, is_async=True)
    t = warpgroup_mma(a_hi, bl_s.slice(HALF * BT, BT), t, is_async=True)
    t = warpgroup_mma_wait(num_outstanding=0, deps=(t,))
    gl.thread_barrier()  # every warp's product has read b before the next one overwrites it
    return t


@gluon.jit
def _gl_store_stacked(acc, st_flat, top_ptr, bot_ptr, ld, BT: gl.constexpr, N: gl.constexpr):
    """Rows ..BT of the [2 BT, N] float32 accumulator acc to top_ptr, rows BT.. to bot_ptr (row stride ld), as bf16,
    through shared memory (st_flat: a flat float32 view of at least BT * N elements, free): the accumulator's layout
    holds 2 columns per thread, so a direct store is 8 rows x 16 bytes per warp instruction; read back 8 columns
    per thread, every store is 16 bytes and a warp instruction covers whole rows."""
    SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([2 * BT, N], gl.bfloat16)
    st = st_flat.slice(0, BT * N)._reinterpret(gl.bfloat16, [2 * BT, N], SL)
    st.store(acc.to(gl.bfloat16))
    gl.thread_barrier()
    TPR: gl.constexpr = N // 8 if N < 256 else 32
    LB: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32 // TPR, TPR], warps_per_cta=[4, 1],
                                        order=[1, 0])
    r = gl.arange(0, BT, layout=gl.SliceLayout(1, LB))[:, None]
    c = gl.arange(0, N, layout=gl.SliceLayout(0, LB))[None, :]
    gl.store(top_ptr + r * ld + c, st.slice(0, BT).load(LB))
    gl.store(bot_ptr + r * ld + c, st.slice(BT, BT).load(LB))
    gl.thread_barrier()  # every warp has read the tile before the next one overwrites it


@gluon.jit
def _gl_solve_wg(z, scale, beta_ptr, s_bt, t0, T, kdec_s, qh_s, ql_s, v_s, v_bar, bh_s, bl_s,
                 w_ptr, qd_ptr, u_ptr, au_ptr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, st_flat):
    """w, qd, u and Aqk u (bf16, pointers at the chunk's first row) from the rows' [2 BT, BT] product z (Aqk unscaled
    over Akk). A = (I - P)^-1 diag(beta), P = -diag(beta) Akk. For P's two diagonal 16 x 16 blocks P_d (P_d^16 = 0),
    X = (I + P_d)(I + P_d^2)(I + P_d^4)(I + P_d^8): each doubling step multiplies the stacked rows [S_m; P_d^m] by
    P_d^m, giving [S_m P_d^m; P_d^2m], with S_2m = S_m + S_m P_d^m. Then (I - P)^-1 = X + X P_off X (P_off: P's
    lower-left block); five doubling steps on the whole of P came out a few per cent off on the H200 at K 32. Then
    [Aqk; I] @ A = [Aqk A; A], whose rows are the final products' operands: [qd; w] = [-Aqk A; A] @ k exp(G) +
    [I; 0] @ q exp(G) scale and [Aqk u; u] = [Aqk A; A] @ v (Aqk A as a bf16 hi / lo pair, A rounded to bf16).
    qh_s, ql_s: q exp(G) scale as a hi / lo pair; kdec_s: k exp(G); v_s: v's tile, arriving on v_bar. The outputs
    leave through st_flat (the rows' operand buffer, free by then) as 16-byte stores where a tile fits in it."""
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
    r = gl.arange(0, 2 * BT, layout=gl.SliceLayout(1, ACC))[:, None]
    c = gl.arange(0, BT, layout=gl.SliceLayout(0, ACC))[None, :]
    top = r < BT
    i = r % BT
    eye = gl.where(i == c, 1.0, 0.0)
    z = gl.convert_layout(z, ACC)
    beta_r = gl.load(beta_ptr + i * s_bt, mask=(t0 + i) < T, other=0.0).to(gl.float32)
    p = -beta_r * z
    same = (i // 16) == (c // 16)
    x = gl.where(top, eye, gl.where(same, p, 0.0))
    for _ in gl.static_range(4):
        x = _gl_prod3(x, x, gl.where(top, x, 0.0), 1, bh_s, bl_s, BT, ACC)
    xp = _gl_prod3(gl.where(top, x, 0.0), gl.where(top | same, 0.0, p), gl.zeros_like(x), 1, bh_s, bl_s, BT, ACC)
    x = _gl_prod3(gl.where(top, xp, 0.0), x, gl.where(top, x, 0.0), 0, bh_s, bl_s, BT, ACC)
    beta_c = gl.load(beta_ptr + c * s_bt, mask=(t0 + c) < T, other=0.0).to(gl.float32)
    m = _gl_prod3(gl.where(top, z * scale, eye), x * beta_c, gl.zeros_like(x), 0, bh_s, bl_s, BT, ACC)
    # the operands' rows: [Aqk A; A] as hi (A rounded to nearest) and lo (zero under A) for u, negated above for
    # w and qd; [I; 0] for q exp(G) scale
    hi = gl.where(top, (m.to(gl.int32, bitcast=True) & -65536).to(gl.float32, bitcast=True),
                  m.to(gl.bfloat16).to(gl.float32))
    lo = gl.where(top, m - hi, 0.0)
    hi_n = gl.where(top, -hi, hi).to(gl.bfloat16)
    lo_n = (-lo).to(gl.bfloat16)
    hi = hi.to(gl.bfloat16)
    lo = lo.to(gl.bfloat16)
    ident = gl.where(top & (i == c), 1.0, 0.0).to(gl.bfloat16)
    AW: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, K, 16])
    OPW: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=AW, k_width=2)
    acc = warpgroup_mma(gl.convert_layout(hi_n, OPW), kdec_s, gl.zeros([2 * BT, K], gl.float32, AW), use_acc=False,
                        is_async=True)
    acc = warpgroup_mma(gl.convert_layout(lo_n, OPW), kdec_s, acc, is_async=True)
    acc = warpgroup_mma(gl.convert_layout(ident, OPW), qh_s, acc, is_async=True)
    acc = warpgroup_mma(gl.convert_layout(ident, OPW), ql_s, acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    _gl_store_stacked(acc, st_flat, qd_ptr, w_ptr, K, BT, K)
    # u and Aqk u, at most 128 value columns at a time (the accumulator's registers)
    NB: gl.constexpr = V if V <= 128 else 128
    AU: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NB, 16])
    OPU: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=AU, k_width=2)
    hi_u = gl.convert_layout(hi, OPU)
    lo_u = gl.convert_layout(lo, OPU)
    ru = gl.arange(0, 2 * BT, layout=gl.SliceLayout(1, AU))[:, None]
    cu = gl.arange(0, NB, layout=gl.SliceLayout(0, AU))[None, :]
    mbarrier.wait(v_bar, 0)
    for n0 in gl.static_range(0, V, NB):
        vb = v_s.slice(n0, NB, 1)
        acc = warpgroup_mma(hi_u, vb, gl.zeros([2 * BT, NB], gl.float32, AU), use_acc=False, is_async=True)
        acc = warpgroup_mma(lo_u, vb, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        if NB <= 2 * K:  # the staging buffer holds 2 BT x K float32
            _gl_store_stacked(acc, st_flat, au_ptr + n0, u_ptr + n0, V, BT, NB)
        else:
            gl.store(gl.where(ru < BT, au_ptr + ru * V + n0 + cu, u_ptr + (ru - BT) * V + n0 + cu), acc.to(gl.bfloat16))


# -- gluon_prep.py -----------------------------------------------------------------------------------------------------
# The fused preparation for Hopper: one Gluon program per chunk does the block rows and the solve and writes the
# scan's inputs; Aqk, Akk, the running sums and a second read of q and k never go through memory. One warpgroup, one
# key channel per thread (WR threads per channel), so each running sum is mostly a thread's own loop. q, k, g and
# later v arrive by TMA ([1, BT, 1, K] boxes of the [B, T, H, K] tensors, rows past T zero-filled). Rows 16.. against
# columns ..15 are factored around row 16; the diagonal blocks around their midpoints where every channel's decay span
# is within LIMIT, else split exactly level by level. K 32, 64 or 128.

@gluon.jit
def _kda_prep_gluon(q_desc, k_desc, g_desc, v_desc, g_ptr, beta_ptr, w_ptr, kd_ptr, qd_ptr, u_ptr, au_ptr, gl_ptr,
                    flag_ptr, scale, T, TP, NT, H, s_gb, s_gt, s_gh, s_bb, s_bt, s_bh,
                    K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, FLOOR: gl.constexpr, LIMIT: gl.constexpr,
                    WR: gl.constexpr, FLAG: gl.constexpr):
    """Grid (chunks, batch * heads), or with FLAG (batch * heads, chunks): chunk-major, each chunk flagged in
    flag_ptr once its tiles are written, for the scan running beside. Writes w, kd, qd (bf16, [BH, TP, K]), u, Aqk u
    (bf16, [BH, TP, V]) and gl = exp(G_last) (float32, [BH, NT, K])."""
    BC: gl.constexpr = 16
    L: gl.constexpr = gl.BlockedLayout(size_per_thread=[BT // WR, 1], threads_per_warp=[1, 32],
                                       warps_per_cta=[WR, 4 // WR], order=[0, 1])
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 8])
    ROW: gl.constexpr = gl.SliceLayout(1, L)
    COL: gl.constexpr = gl.SliceLayout(0, L)
    if FLAG:  # chunk-major dispatch: chunk 0 of every head first, as the scan beside wants them
        i_t = gl.program_id(1)
        i_bh = gl.program_id(0)
    else:
        i_t = gl.program_id(0)
        i_bh = gl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    t0 = i_t * BT
    row_base = i_bh.to(gl.int64) * TP + t0
    g_ptr += i_b.to(gl.int64) * s_gb + i_h * s_gh + t0.to(gl.int64) * s_gt
    beta_ptr += i_b.to(gl.int64) * s_bb + i_h * s_bh + t0.to(gl.int64) * s_bt

    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    # q and k arrive in the products' operand buffer (read into registers before the first product writes it).
    # Views at byte offsets go through a flat view of the whole buffer: a row slice of a swizzled [2 BT, K] tile is
    # not one contiguous range once a row is wider than the swizzle (K > 32 at float32)
    a_s = gl.allocate_shared_memory(gl.float32, [2 * BT, K], gl.NVMMASharedLayout.get_default_for([2 * BT, K], gl.float32))
    a_flat = a_s._reinterpret(gl.float32, [2 * BT * K], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    q_s = a_flat.slice(0, BT * K // 2)._reinterpret(gl.bfloat16, [1, BT, 1, K], q_desc.layout)
    k_s = a_flat.slice(BT * K // 2, BT * K // 2)._reinterpret(gl.bfloat16, [1, BT, 1, K], k_desc.layout)
    b_s = gl.allocate_shared_memory(gl.float32, [BT, K], gl.NVMMASharedLayout.get_default_for([BT, K], gl.float32))
    g_s = gl.allocate_shared_memory(gl.float32, [1, BT, 1, K], g_desc.layout)
    kdec_s = gl.allocate_shared_memory(gl.bfloat16, [BT, K], gl.NVMMASharedLayout.get_default_for([BT, K], gl.bfloat16))
    # views of buffers free by the time they are written: q exp(G) scale's hi / lo pair in g's buffer (once g is in
    # registers); the inverse's operand pairs in the rows' operand buffer and v's tile in the column operand's (both
    # once the rows' products are done), or in a buffer of its own where v is wider
    QL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, K], gl.bfloat16)
    g_flat = g_s._reinterpret(gl.float32, [BT * K], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    qh_s = g_flat.slice(0, BT * K // 2)._reinterpret(gl.bfloat16, [BT, K], QL)
    ql_s = g_flat.slice(BT * K // 2, BT * K // 2)._reinterpret(gl.bfloat16, [BT, K], QL)
    IL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([2 * BT, BT], gl.bfloat16)
    bh_s = a_flat.slice(0, BT * BT)._reinterpret(gl.bfloat16, [2 * BT, BT], IL)
    bl_s = a_flat.slice(BT * BT, BT * BT)._reinterpret(gl.bfloat16, [2 * BT, BT], IL)
    if V <= 2 * K:
        b_flat = b_s._reinterpret(gl.float32, [BT * K], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        v_s = b_flat.slice(0, BT * V // 2)._reinterpret(gl.bfloat16, [1, BT, 1, V], v_desc.layout)
    else:
        v_s = gl.allocate_shared_memory(gl.bfloat16, [1, BT, 1, V], v_desc.layout)
    v_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(v_bar, count=1)
    fence_async_shared()
    mbarrier.expect(bar, BT * K * 8)
    tma.async_copy_global_to_shared(q_desc, [i_b, t0, i_h, 0], bar, q_s)
    tma.async_copy_global_to_shared(k_desc, [i_b, t0, i_h, 0], bar, k_s)
    tma.async_copy_global_to_shared(g_desc, [i_b, t0, i_h, 0], bar, g_s)

    r1 = gl.arange(0, BT, layout=ROW)
    c1 = gl.arange(0, K, layout=COL)
    ri = r1[:, None]
    gf0 = gl.maximum(gl.load(g_ptr + c1).to(gl.float32), FLOOR)
    gf16 = gl.maximum(gl.load(g_ptr + BC * s_gt + c1, mask=(t0 + BC) < T, other=0.0).to(gl.float32), FLOOR)
    mbarrier.wait(bar, 0)
    mbarrier.invalidate(bar)
    g = gl.maximum(g_s.reshape([BT, K]).load(L), FLOOR)
    # each block's running sums G_i - G_(r-1) (block start r), and the block-relative sums with the first row's gate
    # left out, E_i = G_i - G_r (the Triton rows' e_b)
    first = gl.where(ri % BC == 0, 1.0, 0.0) + gl.zeros_like(g)
    gs, _ = gl.associative_scan((g, first), 0, _gl_seg_add)
    e = gs - gl.where(ri < BC, gf0[None, :], gf16[None, :])
    tot0 = gl.min(gl.where(ri < BC, gs, 0.0), axis=0)  # gates are <= 0: the last row's sum is the block's total
    tot1 = gl.min(gl.where(ri < BC, 0.0, gs), axis=0)
    q = q_s.reshape([BT, K]).load(L).to(gl.float32)
    k = k_s.reshape([BT, K]).load(L).to(gl.float32)
    gl.thread_barrier()  # every warp has read q and k before the products overwrite their buffer
    # what the solve needs of q, k and the sums is formed now and set aside (shared memory, or written out), so that
    # q, k and the sums are dead after the rows' products: the chunk's running sums G_i (block sums plus the totals
    # before) and the decays of the scan's tiles
    g_run = gs + gl.where(ri >= BC, tot0[None, :], 0.0)
    tot = tot0 + tot1
    dec = _gl_exp(g_run)
    qh, ql = _gl_hilo(q * (dec * scale))
    qh_s.store(qh)
    ql_s.store(ql)
    kdec_s.store((k * dec).to(gl.bfloat16))
    gl.store(kd_ptr + row_base * K + ri * K + c1[None, :], (k * _gl_exp(tot[None, :] - g_run)).to(gl.bfloat16))
    gl.store(gl_ptr + (i_bh.to(gl.int64) * NT + i_t) * K + c1, _gl_exp(tot))

    rr = gl.arange(0, 2 * BT, layout=gl.SliceLayout(1, ACC))[:, None]
    cc = gl.arange(0, BT, layout=gl.SliceLayout(0, ACC))[None, :]
    i = rr % BT
    last0 = tot0 - gf0  # E at each block's last row: minus its decay span, per channel
    last1 = tot1 - gf16
    span = -gl.min(gl.minimum(last0, last1), axis=0)
    z = _gl_off(a_s, b_s, q, k, e, gs, gf16 + tot0, ri, BT, ACC)
    # the diagonal blocks
    if span <= LIMIT:
        ref = gl.where(ri < BC, 0.5 * last0[None, :], 0.5 * last1[None, :])
        up = _gl_exp(e - ref)
        down = k * _gl_exp(ref - e)
        d = _gl_pair(a_s, b_s, q * up, k * up, down, ACC, BT)
        # the upper triangle and the other block may hold inf / nan: select, never multiply
        sel = ((i // BC) == (cc // BC)) & ((i > cc) | ((i == cc) & (rr < BT)))
        z += gl.where(sel, d, 0.0)
    else:
        z += _gl_split(a_s, b_s, q, k, g, g_ptr, s_gt, t0, T, ri, c1, rr, cc, FLOOR, BT, ACC)
        # Aqk's diagonal <q_i, k_i>
        z += gl.where((rr < BT) & (i == cc), _gl_pair(a_s, b_s, q, k, k, ACC, BT), 0.0)
    # the rows' operand buffers are free (each product waited for, then a barrier): v's tile comes in while the
    # inverse is formed
    fence_async_shared()
    mbarrier.expect(v_bar, BT * V * 2)
    tma.async_copy_global_to_shared(v_desc, [i_b, t0, i_h, 0], v_bar, v_s)
    _gl_solve_wg(z, scale, beta_ptr, s_bt, t0, T, kdec_s, qh_s, ql_s, v_s.reshape([BT, V]), v_bar, bh_s, bl_s,
                 w_ptr + row_base * K, qd_ptr + row_base * K, u_ptr + row_base * V, au_ptr + row_base * V,
                 K, V, BT, a_flat)
    mbarrier.invalidate(v_bar)
    if FLAG:
        # the flag is the call's generation + 1 (the generation lies behind the flags; the scan moves it on once the
        # call is done). Every thread's stores are done (the barrier), then one release at GPU scope publishes them:
        # the scan's loader reads the flag with an acquire before its TMA loads of this chunk
        gen = gl.load(flag_ptr + gl.num_programs(0) * NT, volatile=True)
        gl.thread_barrier()
        gl.atomic_xchg(flag_ptr + i_bh * NT + i_t, gen + 1, sem="release", scope="gpu")


# -- gluon_scan.py -----------------------------------------------------------------------------------------------------
# The state pass and the read-out as one warp-specialised Gluon kernel for Hopper, one program per (BV = 64 or 128
# value columns, batch * head). Its compute warpgroup(s) hold S^T [BV, K] as a wgmma accumulator: its bf16 copy is
# the register operand of S^T w^T and of the read-out S^T qd^T, and delta^T = u^T - S^T w^T (a bf16 hi/lo pair) that
# of S^T <- gl (.) S^T + delta^T kd, accumulated into the state itself: the state never leaves registers. A loader
# warp brings each chunk's w, kd, qd (one [3, BH, TP, K] buffer), u, au (one [2, BH, TP, V]) and gl by TMA into a
# ring of four stages, a storer warp sends o out by TMA; the compute warpgroup only waits on mbarriers. WAIT: the
# loader waits for each chunk's flag, set by the preparation running beside (host.py) to the call's generation + 1;
# the generation lives on the GPU behind the flags, so a call (or a graph's replay) zeroes nothing.

# chunks whose flags the loader checks with one load and one pair of fences
_WAIT_GROUP = gl.constexpr(8)


@gluon.jit
def _wgmma_chunk(S, ws, wkq_stage, ua_stage, g_stage, LS: gl.constexpr, LD: gl.constexpr,
                 K: gl.constexpr, BT: gl.constexpr):
    """One chunk of the state pass: returns the update of S^T still in flight (the caller waits for it), w's
    product, and o^T = au^T + S^T qd^T (complete)."""
    A_WS: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=LD, k_width=2)
    A_UPD: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=LS, k_width=2)
    tiles = wkq_stage.reshape([4 * BT, K])
    ua_t = ua_stage.reshape([2 * BT, ua_stage.shape[2]])
    # Accumulator registers are written only here, before any wgmma is issued (ptxas waits for every wgmma in
    # flight before one is written; offline sm_90: a wait 0 behind the read-out's product): the state is
    # decayed, and the read-out's accumulator starts at au^T, so that o^T = au^T + S^T qd^T needs no add.
    ot = ua_t.slice(BT, BT).permute((1, 0)).load(LD).to(gl.float32)
    s_a = gl.convert_layout(S.to(gl.bfloat16), A_WS)
    S = S * g_stage.reshape([K]).load(gl.SliceLayout(0, LS))[None, :]
    ws = warpgroup_mma(s_a, tiles.slice(0, BT).permute((1, 0)), ws, use_acc=False, is_async=True)
    ot = warpgroup_mma(s_a, tiles.slice(2 * BT, BT).permute((1, 0)), ot, is_async=True)
    u_t = ua_t.slice(0, BT).permute((1, 0)).load(LD).to(gl.float32)
    ws = warpgroup_mma_wait(num_outstanding=1, deps=(ws,))
    d = u_t - ws
    # delta's hi/lo pair: hi truncated to bf16 by masking (exact, no round trip through bf16), lo the rounded rest
    d_hi_f = (d.to(gl.int32, bitcast=True) & -65536).to(gl.float32, bitcast=True)
    kd_t = tiles.slice(BT, BT)
    S = warpgroup_mma(gl.convert_layout(d_hi_f.to(gl.bfloat16), A_UPD), kd_t, S, is_async=True)
    S = warpgroup_mma(gl.convert_layout((d - d_hi_f).to(gl.bfloat16), A_UPD), kd_t, S, is_async=True)
    # the read-out's product is the oldest group in flight: o is ready while the update still runs
    ot = warpgroup_mma_wait(num_outstanding=2, deps=(ot,))
    return S, ws, ot


@gluon.jit
def _ws_compute(wkq_s, ua_s, g_s, o_s, ready, empty, o_ready, o_free, h0_ptr, ht_ptr, i_bh, v0, NT,
                K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr, NS: gl.constexpr,
                USE_H0: gl.constexpr, STORE_HT: gl.constexpr):
    """The compute warpgroup(s): wait for a chunk, step the state, hand the stage back and o over."""
    LS: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[BV // 16, 1], instr_shape=[16, K, 16])
    LD: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[BV // 16, 1], instr_shape=[16, BT, 16])
    rv = gl.arange(0, BV, layout=gl.SliceLayout(1, LS))
    ck = gl.arange(0, K, layout=gl.SliceLayout(0, LS))
    st_off = (i_bh * K + ck[None, :]).to(gl.int64) * V + v0 + rv[:, None]  # S^T[v, k] = S[k, v0 + v]
    if USE_H0:
        S = gl.load(h0_ptr + st_off).to(gl.float32)
    else:
        S = gl.zeros([BV, K], gl.float32, layout=LS)
    # w's product's accumulator is carried and overwritten (use_acc=False): a fresh zero tensor per step would
    # write accumulator registers while a wgmma is in flight, and ptxas would then serialise every wgmma.
    ws = gl.zeros([BV, BT], gl.float32, layout=LD)
    for n in range(NT):
        st = n % NS
        mbarrier.wait(ready.index(st), (n // NS) & 1)
        S, ws, ot = _wgmma_chunk(S, ws, wkq_s.index(st), ua_s.index(st), g_s.index(st), LS, LD, K, BT)
        ob = n % 2
        mbarrier.wait(o_free.index(ob), ((n // 2) & 1) ^ 1)  # the store of chunk n - 2 has read this buffer
        o_s.index(ob).reshape([BT, BV]).permute((1, 0)).store(ot.to(gl.bfloat16))
        fence_async_shared()
        mbarrier.arrive(o_ready.index(ob), count=1)
        S = warpgroup_mma_wait(num_outstanding=0, deps=(S,))
        fence_async_shared()  # this stage's generic-proxy reads are ordered before the loader's next TMA write
        mbarrier.arrive(empty.index(st), count=1)
    if STORE_HT:
        gl.store(ht_ptr + st_off, S)


@gluon.jit
def _ws_wait_chunks(flags_ptr, n0, NT, target, G: gl.constexpr):
    """Spin until chunks n0 .. n0 + G - 1 are flagged with this call's ``target`` (past NT: done), then order their
    stores before the TMA loads that follow (a strong load and a fence: the acquire; the proxy fence: the TMA's async
    proxy). Checked per chunk, the round trip and fences cost more than a scan step (H200: 330 against 163 us at the
    headline). A preparation that never runs beside (e.g. serialised by a profiler) would leave it spinning: after
    ~2^24 polls it traps."""
    offs = n0 + gl.arange(0, G, layout=gl.BlockedLayout([1], [32], [1], [0]))
    flagged = gl.load(flags_ptr + offs, mask=offs < NT, other=target, volatile=True) == target
    done = gl.min(flagged.to(gl.int32), axis=0)
    polls = 0
    while done == 0:
        polls += 1
        if polls > 16777216:
            gl.inline_asm_elementwise("trap; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        flagged = gl.load(flags_ptr + offs, mask=offs < NT, other=target, volatile=True) == target
        done = gl.min(flagged.to(gl.int32), axis=0)
    gl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tfence.proxy.async.global; // $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _ws_loader(wkq_desc, ua_desc, g_desc, o_desc, wkq_s, ua_s, g_s, o_s, ready, empty, o_ready, o_free,
               row0, g_row0, v0, o_row, o_col, NT, flag_ptr, target, BT: gl.constexpr, NS: gl.constexpr,
               WAIT: gl.constexpr):
    """The loader warp: chunk n's tiles into stage n % NS once the compute warpgroup has handed that stage back
    (and, with WAIT, once the preparation running beside the scan has stored them)."""
    nbytes: gl.constexpr = wkq_desc.block_type.nbytes + ua_desc.block_type.nbytes + g_desc.block_type.nbytes
    for n in range(NT):
        st = n % NS
        if WAIT:
            if n % _WAIT_GROUP == 0:
                _ws_wait_chunks(flag_ptr + g_row0, n, NT, target, _WAIT_GROUP)
        mbarrier.wait(empty.index(st), ((n // NS) & 1) ^ 1)  # barriers start with phase 1 complete: no wait at first
        mbarrier.expect(ready.index(st), nbytes)
        tma.async_copy_global_to_shared(wkq_desc, [0, row0 + n * BT, 0], ready.index(st), wkq_s.index(st))
        tma.async_copy_global_to_shared(ua_desc, [0, row0 + n * BT, v0], ready.index(st), ua_s.index(st))
        tma.async_copy_global_to_shared(g_desc, [g_row0 + n, 0], ready.index(st), g_s.index(st))


@gluon.jit
def _ws_storer(wkq_desc, ua_desc, g_desc, o_desc, wkq_s, ua_s, g_s, o_s, ready, empty, o_ready, o_free,
               row0, g_row0, v0, o_row, o_col, NT, flag_ptr, target, BT: gl.constexpr, NS: gl.constexpr,
               WAIT: gl.constexpr):
    """The storer warp: o of chunk n from its buffer by TMA store; a buffer is handed back once its store has read
    it (one store left in flight)."""
    for n in range(NT):
        ob = n % 2
        mbarrier.wait(o_ready.index(ob), (n // 2) & 1)
        tma.async_copy_shared_to_global(o_desc, [o_row, n * BT, o_col], o_s.index(ob))
        tma.store_wait(pendings=1)
        mbarrier.arrive(o_free.index((n + 1) % 2), count=1, pred=n >= 1)
    tma.store_wait(pendings=0)


@gluon.jit
def _kda_scan_wgmma_ws(wkq_desc, ua_desc, g_desc, o_desc, h0_ptr, ht_ptr, TP, NT, H, flag_ptr,
                       K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr, NS: gl.constexpr,
                       USE_H0: gl.constexpr, STORE_HT: gl.constexpr, WAIT: gl.constexpr):
    """Grid (V // BV, batch * heads), BV // 16 warps of compute and two of TMA. The w, kd, qd box is 4 deep (a
    power of two): its fourth slot lies past the tensor, which TMA fills with zeros without reading memory."""
    gen_ptr = flag_ptr + gl.num_programs(1) * NT  # behind the flags: the call's generation, then its ticket
    if WAIT:
        # the preparation (launched next, programmatically dependent) may start as soon as every scan program runs
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)
        target = gl.load(gen_ptr, volatile=True) + 1  # the flag value of this call's chunks
    else:
        target = 0
    i_v = gl.program_id(0)
    i_bh = gl.program_id(1)
    v0 = i_v * BV
    wkq_s = gl.allocate_shared_memory(gl.bfloat16, [NS, 4, BT, K], wkq_desc.layout)
    ua_s = gl.allocate_shared_memory(gl.bfloat16, [NS, 2, BT, BV], ua_desc.layout)
    g_s = gl.allocate_shared_memory(gl.float32, [NS, 1, K], g_desc.layout)
    o_s = gl.allocate_shared_memory(gl.bfloat16, [2, 1, BT, BV], o_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    o_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    o_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NS):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(o_ready.index(i), count=1)
        mbarrier.init(o_free.index(i), count=1)
    fence_async_shared()
    worker_args = (wkq_desc, ua_desc, g_desc, o_desc, wkq_s, ua_s, g_s, o_s, ready, empty, o_ready, o_free,
                   i_bh * TP, i_bh * NT, v0, i_bh // H, (i_bh % H) * V + v0, NT, flag_ptr, target, BT, NS, WAIT)
    gl.warp_specialize([
        (_ws_compute, (wkq_s, ua_s, g_s, o_s, ready, empty, o_ready, o_free, h0_ptr, ht_ptr, i_bh, v0, NT,
                       K, V, BT, BV, NS, USE_H0, STORE_HT)),
        (_ws_loader, worker_args),
        (_ws_storer, worker_args),
    ], [1, 1], [24, 24])
    if WAIT:
        # the call's last scan program to finish moves the generation on, so the flags need no zeroing before the
        # next call (nor a memset in a captured graph): every flag has been waited for by then, and every
        # preparation program read the generation before it flagged its chunk
        ticket_ptr = gen_ptr + 1
        if gl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu") == gl.num_programs(0) * gl.num_programs(1) - 1:
            gl.store(ticket_ptr, 0)
            gl.store(gen_ptr, target)


# -- host.py -----------------------------------------------------------------------------------------------------------
# Host side: which kernels run where, one cached plan per kind of call, and its launches.
#
# Where. On Hopper with bf16 q, k, v, float32 g, TMA-compatible strides, K 32/64/128 and V a multiple of 64: the
# fused Gluon preparation, then the Gluon scan. Where the scan has at most a quarter as many programs as the GPU has
# SMs (the headline's 32 on the H200's 132; knob ``beside`` "wide": also where as many 128-wide programs would be) it
# is launched first, the preparation beside it as its programmatic dependent, flagging each chunk once stored: there
# the scan's chain is the longer stage (H200: -12 % at the headline). Elsewhere the Triton block rows and solve, then
# the Gluon scan where it applies, else the Triton scan and read-out: always so on the CPU interpreter.
#
# Plans. What depends only on a call's key (shapes, dtypes, strides and 16-byte alignment of the inputs, initial and
# final state or not, device, stream) is built once: grids, argument lists, kernels compiled for the key,
# intermediates, TMA descriptors, device properties. A call allocates o and the final state, writes its tensors
# into the argument slots and the descriptors' ``base``, launches, and lets go of its tensors. Where the scan runs
# beside, its chunk flags carry the call's generation (kept on the GPU, moved on by the scan), so nothing is zeroed
# between calls. Every call writes the intermediates in full before reading them; the four most recent plans are
# kept.

BT = 32  # steps per chunk
BC = 16  # rows per block row
FLOOR = -30.0  # gates are raised to at least this before any running sum (rows.py)
LIMIT = 160.0  # a diagonal block is factored around its midpoint up to this decay span, in nats (rows.py)
SCAN_RING = 4  # chunks in the Gluon scan's TMA ring (3 and 5 were slower on the H200)
PLANS_KEPT = 4
_PLANS = {}  # key -> _Plan, least recently used first


def _tma_ok(x) -> bool:
    """Whether a TMA descriptor can take x: 16-byte aligned, every stride but the last a 16-byte multiple."""
    return x.data_ptr() % 16 == 0 and all(st * x.element_size() % 16 == 0 for st in x.stride()[:-1])


def _check(q, k, v, g, beta, h0, want_final):
    B, T, H, K = q.shape
    V = v.shape[-1]
    if tuple(k.shape) != (B, T, H, K) or tuple(g.shape) != (B, T, H, K):
        raise ValueError("q, k and g must share the shape [B, T, H, K]")
    if tuple(v.shape[:3]) != (B, T, H) or tuple(beta.shape) != (B, T, H):
        raise ValueError("v must be [B, T, H, V] and beta [B, T, H]")
    for name, x in (("k", k), ("v", v), ("g", g), ("beta", beta), ("initial_state", h0)):
        if x is not None and x.device != q.device:
            raise ValueError(f"{name} is on {x.device}, q on {q.device}: all inputs must be on one device")
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous along its last dimension")
    if not (K in (16, 32, 64, 128, 256) and V in (16, 32, 64, 128, 256)):
        raise ValueError(f"K={K} and V={V} must be powers of two in [16, 256] (tl.dot tiles)")
    if h0 is not None and (tuple(h0.shape) != (B, H, K, V) or not h0.is_contiguous()):
        raise ValueError(f"initial_state must be a contiguous [B, H, K, V] = {(B, H, K, V)} tensor")
    if T == 0 and want_final:
        raise ValueError("T must be positive")


def _desc(x, shape, strides, block, layout):
    return GluonDescriptor(x, list(shape), list(strides), list(block), layout)


def _unswizzled(bits, rank):
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=rank)


class _Launch:
    """One launch of a plan: kernel, grid, options, arguments in the kernel's order and the slots a call fills (by
    role). On a GPU the kernel is compiled and loaded with the plan (a kernel launched beside a running scan must not
    load lazily: the load would wait for the scan, which waits for it). Launch "compiled" then calls its launcher
    straight, on the caller's stream: no launch metadata and no launch hooks (a profiler's hooks do not see these
    launches), the plan's own buffers passed as addresses, which the launcher takes as they are (a tensor it asks
    for its address and checks with the driver)."""

    def __init__(self, fn, grid, args, options, roles, gpu):
        # three dimensions: a compiled kernel's launcher reads grid[2]
        self.fn, self.grid, self.options = fn, (*grid, *(1,) * (3 - len(grid))), options
        names = list(fn.arg_names)
        self.args = [args[name] for name in names]
        self.slots = [(names.index(name), role) for name, role in roles.items()]
        self.kernel = None
        if gpu:
            kernel = fn.warmup(*self.args, grid=self.grid, **options)
            if kernel.run is None:  # the launcher property loads the kernel onto the GPU
                raise RuntimeError(f"{fn.__name__} did not load")
            self.kernel = (kernel.run, kernel.function, kernel.packed_metadata)
            per_call = {i for i, _ in self.slots}
            self.owned = [x for i, x in enumerate(self.args) if i not in per_call and isinstance(x, torch.Tensor)]
            self.args = [x.data_ptr() if i not in per_call and isinstance(x, torch.Tensor) else x
                         for i, x in enumerate(self.args)]

    def __call__(self, values, stream):
        args = self.args
        for i, role in self.slots:
            args[i] = values[role]
        if self.kernel is not None:
            run, function, metadata = self.kernel
            run(*self.grid, stream, function, metadata, None, None, None, *args)
        else:
            self.fn[self.grid](*args, **self.options)
        for i, _ in self.slots:  # hold no tensor of the caller's between calls
            args[i] = None


class _Plan:
    """The launches, intermediates and descriptors of one kind of call (see the module docstring)."""

    def __init__(self, q, k, v, g, beta, h0, want_final):
        _check(q, k, v, g, beta, h0, want_final)
        B, T, H, K = q.shape
        V = v.shape[-1]
        dev = q.device
        NT = max(1, triton.cdiv(T, BT))
        TP = NT * BT
        BH = B * H
        self.shape, self.want_final = (B, T, H, K, V), want_final
        self.launches, self.descs, self.flags = [], [], None
        if T == 0:
            return
        gpu = q.is_cuda
        hopper = gpu and torch.cuda.get_device_capability(dev)[0] == 9
        gluon_scan = hopper and K in (32, 64, 128) and V % 64 == 0 and v.dtype == torch.bfloat16
        fused = (gluon_scan and q.dtype == k.dtype == torch.bfloat16 and g.dtype == torch.float32
                 and all(_tma_ok(x) for x in (q, k, g, v)))
        # w, kd, qd as one [3, BH, TP, K] buffer and u, Aqk u as one [2, BH, TP, V]: one TMA copy each in the scan
        wkq = torch.empty((3, BH, TP, K), dtype=torch.bfloat16, device=dev)
        ua = torch.empty((2, BH, TP, V), dtype=torch.bfloat16, device=dev)
        g_last = torch.empty((BH, NT, K), dtype=torch.float32, device=dev)  # exp(G_last) per chunk
        self.bufs = {"w": wkq[0], "kd": wkq[1], "qd": wkq[2], "u": ua[0], "au": ua[1], "gl": g_last}
        o = torch.empty((B, T, H, V), dtype=v.dtype, device=dev)  # stands for each call's o while the plan is made
        state = {"USE_H0": h0 is not None, "STORE_HT": want_final}
        state_ptrs = {"h0_ptr": h0 if h0 is not None else g_last, "ht_ptr": g_last}
        state_roles = {**({"h0_ptr": "h0"} if h0 is not None else {}), **({"ht_ptr": "ht"} if want_final else {})}
        sizes = dict(T=T, TP=TP, NT=NT, H=H)

        if gluon_scan:
            sm_count = torch.cuda.get_device_properties(dev).multi_processor_count
            # two compute warpgroups per program where one-warpgroup programs would outnumber the SMs
            scan_bv = 128 if V % 128 == 0 and BH * (V // 64) > sm_count else 64
        if fused:
            beside = BH * (V // scan_bv) <= sm_count // 4
            if not beside and V % 128 == 0 and BH * (V // 128) <= sm_count // 4:
                beside, scan_bv = True, 128  # fewer, wider scan programs: more SMs left to the preparation
            if beside:
                # a flag per chunk, then the call's generation and the scan's ticket (gluon_scan.py): zeroed once
                self.flags = torch.zeros((BH * NT + 2,), dtype=torch.int32, device=dev)
            box = [1, BT, 1, K]
            d_q = _desc(q, q.shape, q.stride(), box, _unswizzled(16, 4))
            d_k = _desc(k, k.shape, k.stride(), box, _unswizzled(16, 4))
            d_g = _desc(g, g.shape, g.stride(), box, _unswizzled(32, 4))
            # swizzled: the products read v's tile from shared memory as it lands
            d_v = _desc(v, v.shape, v.stride(), [1, BT, 1, V], gl.NVMMASharedLayout.get_default_for([1, BT, 1, V], gl.bfloat16))
            self.descs += [("q", d_q), ("k", d_k), ("g", d_g), ("v", d_v)]
            prep = dict(q_desc=d_q, k_desc=d_k, g_desc=d_g, v_desc=d_v, g_ptr=g, beta_ptr=beta, w_ptr=wkq[0],
                        kd_ptr=wkq[1], qd_ptr=wkq[2], u_ptr=ua[0], au_ptr=ua[1], gl_ptr=g_last,
                        flag_ptr=self.flags if beside else g_last, scale=1.0, **sizes,
                        s_gb=g.stride(0), s_gt=g.stride(1), s_gh=g.stride(2),
                        s_bb=beta.stride(0), s_bt=beta.stride(1), s_bh=beta.stride(2),
                        K=K, V=V, BT=BT, FLOOR=FLOOR, LIMIT=LIMIT, WR=128 // K, FLAG=beside)
            # uncapped at K 128 (~200 B spilled, two programs per SM: faster than three at 168 registers), capped below
            options = dict(num_warps=4, launch_pdl=beside, **({"maxnreg": 168} if K < 128 else {}))
            prep_launch = _Launch(_kda_prep_gluon, (BH, NT) if beside else (NT, BH), prep, options,
                                  {"g_ptr": "g", "beta_ptr": "beta", "scale": "scale"}, gpu)
        else:
            aqk = torch.empty((2, BH, TP, BT), dtype=torch.bfloat16, device=dev)  # Aqk as bf16 hi, lo
            akk = torch.empty((BH, TP, BT), dtype=torch.float32, device=dev)
            g_sums = torch.empty((BH, TP, K), dtype=torch.float32, device=dev)  # each block's running sums
            g_tots = torch.empty((BH, NT, BT // BC, K), dtype=torch.float32, device=dev)  # and its totals
            self.bufs.update(aqk=aqk, akk=akk, gs=g_sums, gt=g_tots)
            common = dict(q_ptr=q, k_ptr=k, beta_ptr=beta, aqk_ptr=aqk, akk_ptr=akk, gs_ptr=g_sums, gt_ptr=g_tots,
                          scale=1.0, **sizes, lo_off=BH * TP * BT, s_qb=q.stride(0), s_qt=q.stride(1),
                          s_qh=q.stride(2), s_kb=k.stride(0), s_kt=k.stride(1), s_kh=k.stride(2),
                          s_bb=beta.stride(0), s_bt=beta.stride(1), s_bh=beta.stride(2), K=K, BT=BT, BC=BC)
            roles = {"q_ptr": "q", "k_ptr": "k", "beta_ptr": "beta", "scale": "scale"}
            bk = min(64, K)
            rows = dict(common, g_ptr=g, s_gb=g.stride(0), s_gt=g.stride(1), s_gh=g.stride(2), BK=bk, LIMIT=LIMIT,
                        FLOOR=FLOOR, LOG_BC=4, SB=4, LOG_NS=2, DKS=8)
            self.launches.append(_Launch(_kda_rows_kernel, (NT * (BT // BC), BH), rows,
                                         dict(num_warps=8, num_stages=1, **({"maxnreg": 168} if bk == 16 else {})),
                                         {**roles, "g_ptr": "g"}, gpu))
            solve = dict(common, v_ptr=v, w_ptr=wkq[0], u_ptr=ua[0], kd_ptr=wkq[1], qd_ptr=wkq[2], gl_ptr=g_last,
                         au_ptr=ua[1], s_vb=v.stride(0), s_vt=v.stride(1), s_vh=v.stride(2), V=V, BK=min(64, K),
                         BVP=min(64, V))
            self.launches.append(_Launch(_kda_solve_kernel, (NT, BH), solve, dict(num_warps=2, num_stages=1, maxnreg=168),
                                         {**roles, "v_ptr": "v"}, gpu))

        if gluon_scan:
            o_box = [1, BT, scan_bv]
            # o [B, T, H, V] (contiguous: made by the call) as [B, T, H * V]: a tile never runs past its batch's T
            d_o = _desc(o, (B, T, H * V), (T * H * V, H * V, 1), o_box, gl.NVMMASharedLayout.get_default_for(o_box, gl.bfloat16))
            self.descs.append(("o", d_o))

            def stacked(t, width, block_w):
                flat = t.view(t.shape[0], BH * TP, width)
                block = [triton.next_power_of_2(t.shape[0]), BT, block_w]
                return _desc(flat, flat.shape, (BH * TP * width, width, 1), block,
                             gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16))

            d_gl = _desc(g_last.view(BH * NT, K), (BH * NT, K), (K, 1), [1, K], _unswizzled(32, 2))
            scan = dict(wkq_desc=stacked(wkq, K, K), ua_desc=stacked(ua, V, scan_bv), g_desc=d_gl, o_desc=d_o,
                        **state_ptrs, TP=TP, NT=NT, H=H, flag_ptr=self.flags if self.flags is not None else g_last,
                        K=K, V=V, BT=BT, BV=scan_bv, NS=SCAN_RING, **state, WAIT=self.flags is not None)
            scan_launch = _Launch(_kda_scan_wgmma_ws, (V // scan_bv, BH), scan, dict(num_warps=scan_bv // 16),
                                  state_roles, gpu)
            if fused:
                self.launches += [scan_launch, prep_launch] if self.flags is not None else [prep_launch, scan_launch]
            else:
                self.launches.append(scan_launch)
        else:
            # the state entering every chunk, bf16 (its products take it in bf16), for the read-out
            hbuf = torch.empty((BH, NT, K, V), dtype=torch.bfloat16, device=dev)
            bv = min(16, V)
            scan = dict(w_ptr=wkq[0], u_ptr=ua[0], kd_ptr=wkq[1], gl_ptr=g_last, **state_ptrs, hbuf_ptr=hbuf,
                        TP=TP, NT=NT, K=K, V=V, BT=BT, BV=bv, **state)
            self.launches.append(_Launch(_kda_scan_kernel, (triton.cdiv(V, bv), BH), scan,
                                         dict(num_warps=2, num_stages=3), state_roles, gpu))
            obv = min(V, 64)
            out = dict(qd_ptr=wkq[2], hbuf_ptr=hbuf, au_ptr=ua[1], o_ptr=o, **sizes,
                       s_ob=T * H * V, s_ot=H * V, s_oh=V, K=K, V=V, BT=BT, BV=obv)
            self.launches.append(_Launch(_kda_out_kernel, (NT, triton.cdiv(V, obv), BH), out,
                                         dict(num_warps=4, num_stages=2), {"o_ptr": "o"}, gpu))

    def __call__(self, q, k, v, g, beta, scale, h0, stream):
        B, T, H, K, V = self.shape
        o = torch.empty((B, T, H, V), dtype=v.dtype, device=q.device)
        final = torch.empty((B, H, K, V), dtype=torch.float32, device=q.device) if self.want_final else None
        values = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "h0": h0, "o": o, "ht": final,
                  "scale": float(K ** -0.5 if scale is None else scale)}
        for role, desc in self.descs:
            desc.base = values[role]
        for launch in self.launches:
            launch(values, stream)
        for _, desc in self.descs:
            desc.base = None
        return o, final


def kernel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
    """KDA forward. q, k, g [B,T,H,K]; v [B,T,H,V]; beta [B,T,H]; returns (o [B,T,H,V] in v's dtype, the final
    state [B,H,K,V] float32 or None)."""
    h0 = initial_state
    tensors = (q, k, v, g, beta) if h0 is None else (q, k, v, g, beta, h0)
    stream = torch.cuda.current_stream(q.device).cuda_stream if q.is_cuda else None
    key = (q.shape, k.shape, v.shape, g.shape, beta.shape, q.dtype, k.dtype, v.dtype, g.dtype, beta.dtype,
           q.stride(), k.stride(), v.stride(), g.stride(), beta.stride(), bool(output_final_state),
           tuple((x.get_device(), x.data_ptr() % 16 == 0) for x in tensors),
           None if h0 is None else (h0.shape, h0.stride(), h0.dtype), stream)
    try:
        plan = _PLANS.get(key)
        if plan is None:
            plan = _Plan(q, k, v, g, beta, h0, bool(output_final_state))
            while len(_PLANS) >= PLANS_KEPT:  # the oldest plan goes
                _PLANS.pop(next(iter(_PLANS)))
            _PLANS[key] = plan
        return plan(q, k, v, g, beta, scale, h0, stream)
    except Exception as err:
        # Triton's OutOfResources (shared memory or registers) named without importing its module
        if type(err).__name__ == "OutOfResources":
            raise ValueError(f"this GPU cannot run the kernels at K={q.shape[-1]}, V={v.shape[-1]}: {err}") from err
        raise
