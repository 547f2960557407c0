"""The solve of the fused preparation as stacked warpgroup products: the rows of a [2 BT, N] wgmma accumulator
are the rows of a wgmma register operand, so a product whose left operand is the previous result needs no
exchange between threads. Products that need more than bf16 take their operands as bf16 hi / lo pairs."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)


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
