"""The solve in Triton, after ``_kda_rows_kernel``: A = (I + Akk)^-1 diag(beta), with the diagonal blocks' inverses
D^-1 in Akk's place, so that across the blocks (D + L)^-1 = (I - N) D^-1, N = D^-1 L; then w = A (exp(G) k), u = A v,
kd = exp(G_last - G) k, gl = exp(G_last), qd = scale exp(G) q - Aqk w and au = Aqk u (the scan's read-out is then
o = qd S + au). G_i: the block rows' running sum of its block plus the totals of the blocks before."""

import triton
import triton.language as tl

from .common import _dot_tf32, _exp


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
