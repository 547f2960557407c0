"""The block rows in Triton (wherever the fused Gluon preparation does not run): Aqk, Akk and each diagonal block's
inverse, a 16-row block row per program. A decay between blocks is factored around the row block's first step r,
exp(G_i - G_r) exp(G_r - G_j), both <= 1, each exponent a forward running sum of exactly the gates it spans. A
diagonal block is factored around its midpoint where its per-channel decay span is at most LIMIT (160 nats: both
factors within e^+-80), else split exactly (``_diag_split``). Gates are raised to at least FLOOR (-30) first: a
decay changes only where a gate is below -30, and is below e^-30 either way; a reset then stays within the guard."""

import triton
import triton.language as tl

from .common import _dot3, _dot_tf32, _exp


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
