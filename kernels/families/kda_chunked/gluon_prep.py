"""The fused preparation for Hopper: one Gluon program per chunk does the block rows and the solve and writes the
scan's inputs; Aqk, Akk, the running sums and a second read of q and k never go through memory. One warpgroup, one
key channel per thread (WR threads per channel), so each running sum is mostly a thread's own loop. q, k, g and
later v arrive by TMA ([1, BT, 1, K] boxes of the [B, T, H, K] tensors, rows past T zero-filled). Rows 16.. against
columns ..15 are factored around row 16; the diagonal blocks around their midpoints where every channel's decay span
is within LIMIT, else split exactly level by level. K 32, 64 or 128."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from .common import _gl_exp
from .gluon_rows import _gl_off, _gl_pair, _gl_seg_add, _gl_split
from .gluon_solve import _gl_hilo, _gl_solve_wg


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
