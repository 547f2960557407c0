"""ENGINE "gluon" with PV_DEFER 1 (``_mla_paged_ws_defer``): warpgroup 0 issues its half of P V for tile t after
tile t + 1's score product, so the product runs on the tensor cores during tile t + 1's softmax (the overlap
FlashAttention-3 gets within a warpgroup).

Deferring that product holds tile t's first value box half a tile longer, and the ring has two stages (q's 72 KB
and two 72 KB tiles fill shared memory). So each of a stage's three boxes has its own ready and empty barrier:
the rope box is handed back once the tile is scored, the second value box once warpgroup 1 has folded it in, the
first after the deferred product. The loader refills them in that order, and the score product takes them in the
same order (rope, second half, first half), so it starts on the boxes that came back first while the last one is
still on its way. Warpgroup 1 is ``gluon_ws._g_wg1`` with three boxes a stage."""

import triton.experimental.gluon as gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .gluon_merge import _g_grid_merge
from .gluon_ws import HALF_G, KEYS_G, RING_G, ROWS_G, _g_device_descriptors, _g_piece, _g_schedule, _g_store_half, _g_wg1, _g_zero_rows_past


@gluon.jit
def _d_loader(q_n, q_r, kv_n, kv_r, q_s, k_s, r_s, q_ready, q_free, ready, empty, table, lens, stride_tb, B, Sq, R,
              capacity, PAGE: gl.constexpr, OVH: gl.constexpr, B_P2: gl.constexpr, PDL: gl.constexpr):
    """One warp: a piece's q by TMA once the last piece's is free, then each tile's boxes (rope, second value half,
    first value half: the order they are handed back in) into the ring, each as soon as its slot is empty."""
    idx, cost, per, u0, u1, b_first, b_stop, k = _g_schedule(lens, B, Sq, capacity, OVH, B_P2, 1)
    q_bytes: gl.constexpr = 2 * q_n.block_type.nbytes + q_r.block_type.nbytes
    it = 0
    pc = 0
    for b in range(b_first, b_stop):
        n_b, bad, t0, t1, first_part, n_pieces, first_odd = _g_piece(lens, idx, cost, per, u0, u1, k, b, Sq, capacity, OVH)
        if t1 > t0:
            mbarrier.wait(q_free, (pc & 1) ^ 1)
            mbarrier.expect(q_ready, q_bytes)
            row = b * R + gl.program_id(0) * ROWS_G
            tma.async_copy_global_to_shared(q_n, [row, 0], q_ready, q_s.index(0))
            tma.async_copy_global_to_shared(q_n, [row, HALF_G], q_ready, q_s.index(1))
            tma.async_copy_global_to_shared(q_r, [row, 2 * HALF_G], q_ready, r_s.index(RING_G))
            pc += 1
            for t in range(t0, t1):
                st = it % RING_G
                ph = ((it // RING_G) & 1) ^ 1
                page = gl.load(table + b * stride_tb + (t * KEYS_G) // PAGE)
                kv_row = page * PAGE + (t * KEYS_G) % PAGE
                mbarrier.wait(empty.index(3 * st + 2), ph)
                mbarrier.expect(ready.index(3 * st + 2), kv_r.block_type.nbytes)
                tma.async_copy_global_to_shared(kv_r, [kv_row, 2 * HALF_G], ready.index(3 * st + 2), r_s.index(st))
                mbarrier.wait(empty.index(3 * st + 1), ph)
                mbarrier.expect(ready.index(3 * st + 1), kv_n.block_type.nbytes)
                tma.async_copy_global_to_shared(kv_n, [kv_row, HALF_G], ready.index(3 * st + 1), k_s.index(2 * st + 1))
                mbarrier.wait(empty.index(3 * st), ph)
                mbarrier.expect(ready.index(3 * st), kv_n.block_type.nbytes)
                tma.async_copy_global_to_shared(kv_n, [kv_row, 0], ready.index(3 * st), k_s.index(2 * st))
                it += 1
    if PDL:  # as _g_loader
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _d_scores(q_s, k_s, r_s, ready, st, ph, LS: gl.constexpr):
    """Tile st's score product issued box by box as each arrives (rope, second value half, first), not waited for."""
    mbarrier.wait(ready.index(3 * st + 2), ph)
    s = warpgroup_mma(r_s.index(RING_G), r_s.index(st).permute((1, 0)), gl.zeros([ROWS_G, KEYS_G], gl.float32, layout=LS),
                      use_acc=False, is_async=True)
    mbarrier.wait(ready.index(3 * st + 1), ph)
    s = warpgroup_mma(q_s.index(1), k_s.index(2 * st + 1).permute((1, 0)), s, is_async=True)
    mbarrier.wait(ready.index(3 * st), ph)
    return warpgroup_mma(q_s.index(0), k_s.index(2 * st).permute((1, 0)), s, is_async=True)


@gluon.jit
def _d_softmax(s, t, m_i, l_i, qk_scale, keys, limit, open_below, n_b, k0):
    """Tile t's scores into the online softmax (log2): P in bf16, the rows' factor, the new max and sum. A partial last
    tile's first value box is cleaned (rows past the length hold anything) before its product."""
    s = s * qk_scale
    if (t + 1) * KEYS_G > open_below:  # the causal edge or the length: a key some row must not see
        s = gl.where(t * KEYS_G + keys[None, :] <= limit[:, None], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s - m_new[:, None])
    if (t + 1) * KEYS_G > n_b:
        _g_zero_rows_past(k0, n_b - t * KEYS_G)
    return p.to(gl.bfloat16), alpha, m_new, l_i * alpha + gl.sum(p, 1)


@gluon.jit
def _d_hand_over(p16, alpha, p_s, a_s, p_free, p_ready, it):
    """P and the rows' factor to warpgroup 1, once it is done with the last tile's."""
    mbarrier.wait(p_free, (it & 1) ^ 1)
    p_s.store(p16)
    a_s.store(alpha)
    fence_async_shared()
    mbarrier.arrive(p_ready, count=1)


@gluon.jit
def _d_wg0(q_s, k_s, r_s, p_s, a_s, l_s, bars, ready, empty, o, lse, part_o, part_lse, meta, sync, lens, B, Sq, H, R,
           capacity, qk_scale, OVH: gl.constexpr, B_P2: gl.constexpr, DN: gl.constexpr, GRID: gl.constexpr):
    """Warpgroup 0: scores, the online softmax (log2), P and the rows' factor for warpgroup 1, and its half of P V one
    tile late: the product for tile t - 1 is issued behind tile t's scores and waited for after tile t's softmax. It
    reads P from shared memory, where the hand-over left it (and where nothing overwrites it before that wait): with P
    from registers, ptxas serialises the in-flight products (C7513: the A registers are written inside the pipeline
    stage). A piece's first tile is peeled (no product before it), its last tile's product follows the loop."""
    q_ready, q_free, p_ready, p_free = bars.index(0), bars.index(1), bars.index(2), bars.index(3)
    l_ready, l_free = bars.index(4), bars.index(5)
    LS: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    LO: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    idx, cost, per, u0, u1, b_first, b_stop, k = _g_schedule(lens, B, Sq, capacity, OVH, B_P2, 4)
    rows = gl.program_id(0) * ROWS_G + gl.arange(0, ROWS_G, layout=gl.SliceLayout(1, LS))
    keys = gl.arange(0, KEYS_G, layout=gl.SliceLayout(0, LS))
    it = 0
    pc = 0
    for b in range(b_first, b_stop):
        n_b, bad, t0, t1, first_part, n_pieces, first_odd = _g_piece(lens, idx, cost, per, u0, u1, k, b, Sq, capacity, OVH)
        if t1 > t0:
            if (gl.program_id(1) == first_part) & (gl.program_id(0) == 0):  # the merge kernel's record of b
                gl.store(meta + 4 * b, first_part)
                gl.store(meta + 4 * b + 1, n_pieces)
                gl.store(meta + 4 * b + 2, first_odd)
                gl.store(meta + 4 * b + 3, bad.to(gl.int32))
            limit = rows // H + n_b - Sq  # row (s, h) sees keys j <= s + len - Sq
            open_below = (gl.program_id(0) * ROWS_G) // H + n_b - Sq + 1  # every row sees keys below this: no mask
            m_i = gl.full([ROWS_G], -1.0e30, gl.float32, layout=gl.SliceLayout(1, LS))  # finite: a masked tile gives p = 0
            l_i = gl.zeros([ROWS_G], gl.float32, layout=gl.SliceLayout(1, LS))
            acc = gl.zeros([ROWS_G, HALF_G], gl.float32, layout=LO)
            mbarrier.wait(q_ready, pc & 1)
            st = it % RING_G
            s = _d_scores(q_s, k_s, r_s, ready, st, (it // RING_G) & 1, LS)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            mbarrier.arrive(empty.index(3 * st + 2), count=1)  # the rope box: read by the scores only
            p16, alpha, m_i, l_i = _d_softmax(s, t0, m_i, l_i, qk_scale, keys, limit, open_below, n_b, k_s.index(2 * st))
            _d_hand_over(p16, alpha, p_s, a_s, p_free, p_ready, it)
            it += 1
            for t in range(t0 + 1, t1):
                st = it % RING_G
                sl = (it + RING_G - 1) % RING_G  # the last tile's stage
                s = _d_scores(q_s, k_s, r_s, ready, st, (it // RING_G) & 1, LS)
                acc = warpgroup_mma(p_s, k_s.index(2 * sl), acc, is_async=True)  # the last tile's half of P V
                s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
                mbarrier.arrive(empty.index(3 * st + 2), count=1)
                p16, alpha, m_i, l_i = _d_softmax(s, t, m_i, l_i, qk_scale, keys, limit, open_below, n_b, k_s.index(2 * st))
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                mbarrier.arrive(empty.index(3 * sl), count=1)  # the last tile's first value box
                acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, LO))[:, None]
                _d_hand_over(p16, alpha, p_s, a_s, p_free, p_ready, it)
                it += 1
            sl = (it + RING_G - 1) % RING_G
            acc = warpgroup_mma(p_s, k_s.index(2 * sl), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(empty.index(3 * sl), count=1)
            mbarrier.arrive(q_free, count=1)
            mbarrier.wait(l_free, (pc & 1) ^ 1)
            l_s.store(l_i)
            mbarrier.arrive(l_ready, count=1)
            pc += 1
            _g_store_half(o, lse, part_o, part_lse, acc, l_i, m_i, LO, 0, b, bad, R, Sq, H, first_part, n_pieces, first_odd,
                          True, DN)
    if GRID:
        _g_grid_merge(part_o, part_lse, o, lse, meta, sync, B, Sq, H, R, 0, k, True, DN, B_P2)


@gluon.jit
def _mla_paged_ws_defer(q_n, q_r, kv_n, kv_r, table, lens, o, lse, part_o, part_lse, meta, sync, stride_tb, B, Sq, H, capacity,
                        qk_scale, n_q_rows, n_kv_rows, PAGE: gl.constexpr, OVH: gl.constexpr, B_P2: gl.constexpr,
                        DN: gl.constexpr, DEVICE_DESC: gl.constexpr, GRID_MERGE: gl.constexpr, PDL: gl.constexpr):
    """PV_DEFER 1: ``_mla_paged_ws``'s grid, shared memory and merge, with a ready and an empty barrier per box."""
    if DEVICE_DESC:
        q_n, q_r, kv_n, kv_r = _g_device_descriptors(q_n, q_r, kv_n, kv_r, n_q_rows, n_kv_rows, DN)
    R = Sq * H
    q_s = gl.allocate_shared_memory(gl.bfloat16, [2, ROWS_G, HALF_G], q_n.layout)
    k_s = gl.allocate_shared_memory(gl.bfloat16, [2 * RING_G, KEYS_G, HALF_G], kv_n.layout)
    r_s = gl.allocate_shared_memory(gl.bfloat16, [RING_G + 1, KEYS_G, 64], kv_r.layout)  # the tiles' rope, then q's
    p_s = gl.allocate_shared_memory(gl.bfloat16, [ROWS_G, KEYS_G], gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16))
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    a_s = gl.allocate_shared_memory(gl.float32, [ROWS_G], flat)
    l_s = gl.allocate_shared_memory(gl.float32, [ROWS_G], flat)
    ready = gl.allocate_shared_memory(gl.int64, [3 * RING_G, 1], mbarrier.MBarrierLayout())  # per stage: value halves, rope
    empty = gl.allocate_shared_memory(gl.int64, [3 * RING_G, 1], mbarrier.MBarrierLayout())
    bars = gl.allocate_shared_memory(gl.int64, [6, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(3 * RING_G):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)  # each box has one warpgroup that hands it back
    for i in gl.static_range(6):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()
    gl.warp_specialize([
        (_d_wg0, (q_s, k_s, r_s, p_s, a_s, l_s, bars, ready, empty, o, lse, part_o, part_lse, meta, sync, lens, B, Sq, H, R,
                  capacity, qk_scale, OVH, B_P2, DN, GRID_MERGE)),
        (_g_wg1, (q_s, k_s, r_s, p_s, a_s, l_s, bars, ready, empty, o, lse, part_o, part_lse, meta, sync, lens, B, Sq, H, R,
                  capacity, qk_scale, OVH, B_P2, DN, GRID_MERGE, 3)),
        (_d_loader, (q_n, q_r, kv_n, kv_r, q_s, k_s, r_s, bars.index(0), bars.index(1), ready, empty, table, lens, stride_tb,
                     B, Sq, R, capacity, PAGE, OVH, B_P2, PDL)),
    ], [4, 1], [232, 40])
