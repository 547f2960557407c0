"""ENGINE "gluon" with SCORER (``_mla_paged_scorer``): one warpgroup scores, two fold P V.

In the pair form (``gluon_ws``) warpgroup 0 scores a tile, runs its softmax and folds half of P V, so the tensor
cores idle through every softmax (~950 of ~3,270 cycles a tile at B32 Sq4 on the H200). Here the scoring warpgroup
holds no output: it issues tile t + 1's score product before tile t's softmax, so that product runs beside it, and
two folding warpgroups each fold P V into 256 value columns. P(t) is written over tile t's rope box (read only by
the score product, which is done by then), with the rows' factor in a two-slot ring, so the hand-over needs no
shared memory beyond the pair form's and waits for no earlier tile's product. The folders hand a stage back; the
loader is ``gluon_ws._g_loader``. Issuing t + 1's scores early needs tile t + 1 loaded before tile t's softmax,
which delays P(t) where the loads bound the loop (B64, B128), so the host takes this form only for rows that
several row blocks share (SCORER 1: Sq * H >= SCORER_FROM_ROWS)."""

import triton.experimental.gluon as gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait

from .gluon_merge import _g_grid_merge
from .gluon_ws import HALF_G, KEYS_G, RING_G, ROWS_G, _g_device_descriptors, _g_loader, _g_piece, _g_schedule, _g_store_half, \
    _g_zero_rows_past


@gluon.jit
def _s_scores(q_s, k_s, r_s, st):
    """Tile st's score product [64 rows, 64 keys], issued (not waited for): q's two latent halves and its rope."""
    LS: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    s = warpgroup_mma(q_s.index(0), k_s.index(2 * st).permute((1, 0)), gl.zeros([ROWS_G, KEYS_G], gl.float32, layout=LS),
                      use_acc=False, is_async=True)
    s = warpgroup_mma(q_s.index(1), k_s.index(2 * st + 1).permute((1, 0)), s, is_async=True)
    return warpgroup_mma(r_s.index(RING_G), r_s.index(st).permute((1, 0)), s, is_async=True)


@gluon.jit
def _s_hand_over(s, t, st, limit, keys, m_i, l_i, qk_scale, r_s, a_s, p_ready):
    """Tile t's online softmax (log2); P over the tile's rope box and the rows' factor into slot st, for the folders.
    The mask is applied to every tile (no branch: the next tile's product is in flight here)."""
    s = gl.where(t * KEYS_G + keys[None, :] <= limit[:, None], s * qk_scale, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, 1)
    r_s.index(st).store(p.to(gl.bfloat16))
    a_s.index(st).store(alpha)
    fence_async_shared()
    mbarrier.arrive(p_ready.index(st), count=1)
    return m_new, l_i


@gluon.jit
def _s_scorer(q_s, k_s, r_s, a_s, ml_s, bars, ready, p_ready, lens, B, Sq, H, capacity, qk_scale, OVH: gl.constexpr,
              B_P2: gl.constexpr):
    """The scoring warpgroup: a piece's tiles, the next tile's scores in flight during this tile's softmax (and waited
    for within the iteration: a product in flight across the loop's back edge makes ptxas serialise them); at the
    piece's end its rows' max and sum for the folders."""
    q_ready, q_free, l_ready, l_free = bars.index(0), bars.index(1), bars.index(2), bars.index(3)
    LS: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    idx, cost, per, u0, u1, b_first, b_stop, k = _g_schedule(lens, B, Sq, capacity, OVH, B_P2, 4)
    rows = gl.program_id(0) * ROWS_G + gl.arange(0, ROWS_G, layout=gl.SliceLayout(1, LS))
    keys = gl.arange(0, KEYS_G, layout=gl.SliceLayout(0, LS))
    it = 0
    pc = 0
    for b in range(b_first, b_stop):
        n_b, bad, t0, t1, first_part, n_pieces, first_odd = _g_piece(lens, idx, cost, per, u0, u1, k, b, Sq, capacity, OVH)
        if t1 > t0:
            limit = rows // H + n_b - Sq  # row (s, h) sees keys j <= s + len - Sq
            m_i = gl.full([ROWS_G], -1.0e30, gl.float32, layout=gl.SliceLayout(1, LS))  # finite: a masked tile gives p = 0
            l_i = gl.zeros([ROWS_G], gl.float32, layout=gl.SliceLayout(1, LS))
            mbarrier.wait(q_ready, pc & 1)
            mbarrier.wait(ready.index(it % RING_G), (it // RING_G) & 1)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(_s_scores(q_s, k_s, r_s, it % RING_G),))
            for t in range(t0, t1 - 1):
                st1 = (it + 1) % RING_G
                mbarrier.wait(ready.index(st1), ((it + 1) // RING_G) & 1)
                s_next = _s_scores(q_s, k_s, r_s, st1)  # in flight during this tile's softmax, done before the back edge
                m_i, l_i = _s_hand_over(s, t, it % RING_G, limit, keys, m_i, l_i, qk_scale, r_s, a_s, p_ready)
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s_next,))
                it += 1
            mbarrier.arrive(q_free, count=1)  # the next piece's q may load during this softmax
            m_i, l_i = _s_hand_over(s, t1 - 1, it % RING_G, limit, keys, m_i, l_i, qk_scale, r_s, a_s, p_ready)
            it += 1
            mbarrier.wait(l_free, (pc & 1) ^ 1)
            ml_s.index(0).store(m_i)
            ml_s.index(1).store(l_i)
            mbarrier.arrive(l_ready, count=1)
            pc += 1


@gluon.jit
def _s_folder(k_s, r_s, a_s, ml_s, bars, ready, empty, p_ready, o, lse, part_o, part_lse, meta, sync, lens, B, Sq, H, R,
              capacity, OVH: gl.constexpr, B_P2: gl.constexpr, DN: gl.constexpr, GRID: gl.constexpr, F: gl.constexpr):
    """A folding warpgroup: value columns [256 F, 256 F + 256) of P V, each tile's P and factor from the scorer; it
    writes its columns of the piece (F 0: the lse and the merge kernel's record too) and hands each stage back."""
    l_ready, l_free = bars.index(2), bars.index(3)
    # two [64, 128] products a tile, not one [64, 256]: the block's 16 warps leave 128 registers a thread outside the
    # setmaxnreg regions, and ptxas wants 154 for an m64n256 product
    LO: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 16])
    idx, cost, per, u0, u1, b_first, b_stop, k = _g_schedule(lens, B, Sq, capacity, OVH, B_P2, 4)
    it = 0
    pc = 0
    for b in range(b_first, b_stop):
        n_b, bad, t0, t1, first_part, n_pieces, first_odd = _g_piece(lens, idx, cost, per, u0, u1, k, b, Sq, capacity, OVH)
        if t1 > t0:
            if (F == 0) & (gl.program_id(1) == first_part) & (gl.program_id(0) == 0):  # the merge kernel's record of b
                gl.store(meta + 4 * b, first_part)
                gl.store(meta + 4 * b + 1, n_pieces)
                gl.store(meta + 4 * b + 2, first_odd)
                gl.store(meta + 4 * b + 3, bad.to(gl.int32))
            acc_a = gl.zeros([ROWS_G, HALF_G // 2], gl.float32, layout=LO)
            acc_b = gl.zeros([ROWS_G, HALF_G // 2], gl.float32, layout=LO)
            for t in range(t0, t1):
                st = it % RING_G
                v = k_s.index(2 * st + F)
                mbarrier.wait(ready.index(st), (it // RING_G) & 1)
                mbarrier.wait(p_ready.index(st), (it // RING_G) & 1)  # scored: the values may be cleaned
                if (t + 1) * KEYS_G > n_b:  # the partial last tile: rows past the length hold anything
                    _g_zero_rows_past(v, n_b - t * KEYS_G)
                alpha = a_s.index(st).load(gl.SliceLayout(1, LO))
                acc_a = acc_a * alpha[:, None]
                acc_b = acc_b * alpha[:, None]  # both before either product is issued (else ptxas serialises them)
                acc_a = warpgroup_mma(r_s.index(st), v.slice(0, HALF_G // 2, dim=1), acc_a, is_async=True)
                acc_b = warpgroup_mma(r_s.index(st), v.slice(HALF_G // 2, HALF_G // 2, dim=1), acc_b, is_async=True)
                acc_a, acc_b = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a, acc_b))
                mbarrier.arrive(empty.index(st), count=1)
                it += 1
            mbarrier.wait(l_ready, pc & 1)
            m_i = ml_s.index(0).load(gl.SliceLayout(1, LO))
            l_i = ml_s.index(1).load(gl.SliceLayout(1, LO))
            mbarrier.arrive(l_free, count=1)
            pc += 1
            _g_store_half(o, lse, part_o, part_lse, acc_a, l_i, m_i, LO, F * HALF_G, b, bad, R, Sq, H, first_part, n_pieces,
                          first_odd, F == 0, DN)
            _g_store_half(o, lse, part_o, part_lse, acc_b, l_i, m_i, LO, F * HALF_G + HALF_G // 2, b, bad, R, Sq, H, first_part,
                          n_pieces, first_odd, False, DN)
    if GRID:  # the split rows, merged here (gluon_merge.py): the folders are the grid barrier's two arrivals
        _g_grid_merge(part_o, part_lse, o, lse, meta, sync, B, Sq, H, R, F * HALF_G, F == 0, DN, B_P2)


@gluon.jit
def _mla_paged_scorer(q_n, q_r, kv_n, kv_r, table, lens, o, lse, part_o, part_lse, meta, sync, stride_tb, B, Sq, H, capacity,
                      qk_scale, n_q_rows, n_kv_rows, PAGE: gl.constexpr, OVH: gl.constexpr, B_P2: gl.constexpr,
                      DN: gl.constexpr, DEVICE_DESC: gl.constexpr, GRID_MERGE: gl.constexpr, PDL: gl.constexpr):
    """SCORER: grid (row blocks, parts) as ``_mla_paged_ws``; the scorer (here), two folders and the loader warp. The
    arguments and knobs mean what they mean there."""
    if DEVICE_DESC:
        q_n, q_r, kv_n, kv_r = _g_device_descriptors(q_n, q_r, kv_n, kv_r, n_q_rows, n_kv_rows, DN)
    R = Sq * H
    q_s = gl.allocate_shared_memory(gl.bfloat16, [2, ROWS_G, HALF_G], q_n.layout)
    k_s = gl.allocate_shared_memory(gl.bfloat16, [2 * RING_G, KEYS_G, HALF_G], kv_n.layout)
    r_s = gl.allocate_shared_memory(gl.bfloat16, [RING_G + 1, KEYS_G, 64], kv_r.layout)  # the tiles' rope (then P), q's
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    a_s = gl.allocate_shared_memory(gl.float32, [RING_G, ROWS_G], flat)
    ml_s = gl.allocate_shared_memory(gl.float32, [2, ROWS_G], flat)
    ready = gl.allocate_shared_memory(gl.int64, [RING_G, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [RING_G, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [RING_G, 1], mbarrier.MBarrierLayout())
    bars = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())  # q ready, q free, max and sum ready, free
    for i in gl.static_range(RING_G):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # both folders hand a stage back
        mbarrier.init(p_ready.index(i), count=1)
    for i in gl.static_range(3):
        mbarrier.init(bars.index(i), count=1)
    mbarrier.init(bars.index(3), count=2)
    fence_async_shared()
    gl.warp_specialize([
        (_s_scorer, (q_s, k_s, r_s, a_s, ml_s, bars, ready, p_ready, lens, B, Sq, H, capacity, qk_scale, OVH, B_P2)),
        (_s_folder, (k_s, r_s, a_s, ml_s, bars, ready, empty, p_ready, o, lse, part_o, part_lse, meta, sync, lens, B, Sq, H, R,
                     capacity, OVH, B_P2, DN, GRID_MERGE, 0)),
        (_s_folder, (k_s, r_s, a_s, ml_s, bars, ready, empty, p_ready, o, lse, part_o, part_lse, meta, sync, lens, B, Sq, H, R,
                     capacity, OVH, B_P2, DN, GRID_MERGE, 1)),
        (_g_loader, (q_n, q_r, kv_n, kv_r, q_s, k_s, r_s, bars.index(0), bars.index(1), ready, empty, table, lens, stride_tb,
                     B, Sq, R, capacity, PAGE, OVH, B_P2, PDL)),
    ], [4, 4, 1], [168, 168, 24])
