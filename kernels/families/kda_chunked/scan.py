"""The state pass and the read-out in Triton, where the Gluon scan does not run. ``_kda_scan_kernel``: per (16 value
columns, batch * head), chunk after chunk, delta = u - w S, S = gl S + kd^T delta, storing the state entering each
chunk in bf16; ``_kda_out_kernel``: o = qd h + au for every chunk at once. Delta as a bf16 hi/lo pair (~16 bits) in
its products, the state rounded to bf16 in its own."""

import triton
import triton.language as tl

from .common import _split


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
