"""ENGINE "seesaw": both warpgroups score, each every other tile of a piece, and both fold every tile into their half
of O (FlashMLA's sm90 schedule; its deep-dive calls it seesaw), on ENGINE "gluon"'s loader, scheduler and merge.

Why: under ENGINE "gluon" warpgroup 0 does all the scoring, its softmax and half of P V, and the tensor cores idle
while it computes the softmax (H200, B32 Sq4: score 49 % of its stall samples, softmax 20 %). Here the warpgroup that
did not score tile t scores tile t + 1 while the other runs tile t's softmax.

The chain between the warpgroups, for tile t scored by X and t + 1 by Y:
- X scores t, takes the running max m(t - 1) from Y, computes m(t) and publishes it, writes P(t) (relative to m(t))
  into tile t's rope box (its scores are done with it), then scales its half of O and adds P(t) V from registers.
- Y, which had issued its score product of t + 1 first, scales its half to m(t) and adds P(t) V from shared memory
  (the fold of the other's tile comes before its own softmax, so P needs no second scaling), then does t + 1's
  softmax on m(t).
- Each warpgroup keeps the sum of its own tiles' P; the two sums are added at the end (both relative to the last
  max).

Shared memory is ENGINE "gluon"'s (q and a ring of two tiles); P needs none of its own. Each tile's three boxes have
their own ready and empty barriers: a warpgroup hands back its value half of a tile after its product on it, and the
rope box (then P) after its product on the other's P, so the next tile's boxes load as soon as each is free."""

import triton.experimental.gluon as gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .gluon_ws import ROWS_G, KEYS_G, HALF_G, RING_G, _g_schedule, _g_piece, _g_zero_rows_past, _g_store_half


@gluon.jit
def _s_loader(q_n, q_r, kv_n, kv_r, q_s, k_s, r_s, q_ready, q_free, ready, empty, table, lens, stride_tb, B, Sq, R,
              capacity, PAGE: gl.constexpr, OVH: gl.constexpr, B_P2: gl.constexpr):
    """One warp: a piece's q by TMA once both warpgroups are done with the last piece's, then each tile's boxes, the
    scoring warpgroup's value half first (its own box, handed back earliest)."""
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
                x = (t - t0) % 2  # the scoring warpgroup
                for j in gl.static_range(2):
                    box = x ^ j
                    mbarrier.wait(empty.index(3 * st + box), ph)
                    mbarrier.expect(ready.index(3 * st + box), kv_n.block_type.nbytes)
                    tma.async_copy_global_to_shared(kv_n, [kv_row, box * HALF_G], ready.index(3 * st + box), k_s.index(2 * st + box))
                mbarrier.wait(empty.index(3 * st + 2), ph)
                mbarrier.expect(ready.index(3 * st + 2), kv_r.block_type.nbytes)
                tma.async_copy_global_to_shared(kv_r, [kv_row, 2 * HALF_G], ready.index(3 * st + 2), r_s.index(st))
                it += 1


@gluon.jit
def _s_scores(q_s, k_s, r_s, ready, st, ph, ME: gl.constexpr, LS: gl.constexpr):
    """The score product of the tile in stage st issued, box by box as each arrives (this warpgroup's value half
    first: it handed that one back earliest)."""
    mbarrier.wait(ready.index(3 * st + ME), ph)
    s = warpgroup_mma(q_s.index(ME), k_s.index(2 * st + ME).permute((1, 0)), gl.zeros([ROWS_G, KEYS_G], gl.float32, layout=LS),
                      use_acc=False, is_async=True)
    mbarrier.wait(ready.index(3 * st + 1 - ME), ph)
    s = warpgroup_mma(q_s.index(1 - ME), k_s.index(2 * st + 1 - ME).permute((1, 0)), s, is_async=True)
    mbarrier.wait(ready.index(3 * st + 2), ph)
    s = warpgroup_mma(r_s.index(RING_G), r_s.index(st).permute((1, 0)), s, is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(s,))


@gluon.jit
def _s_softmax(s, t, m_run, qk_scale, keys, limit, open_below, mx_s, m_out, ME: gl.constexpr):
    """Tile t's scores on the running max m_run: the new max, published first (the other warpgroup's softmax waits
    for it), and P (log2 domain)."""
    s = s * qk_scale
    if (t + 1) * KEYS_G > open_below:  # the causal edge or the length: a key some row must not see
        s = gl.where(t * KEYS_G + keys[None, :] <= limit[:, None], s, float("-inf"))
    m_new = gl.maximum(m_run, gl.max(s, 1))
    mx_s.index(ME).store(m_new)
    mbarrier.arrive(m_out, count=1)
    return gl.exp2(s - m_new[:, None]), m_new


@gluon.jit
def _s_put_p(p16, r_s, pready, st):
    """P of the tile in stage st into its rope box (its scores are done with it), for the other warpgroup."""
    r_s.index(st).store(p16)
    fence_async_shared()
    mbarrier.arrive(pready.index(st), count=1)


@gluon.jit
def _s_take_p(k_s, pready, ready, i, valid, ME: gl.constexpr, CLEAN: gl.constexpr):
    """Wait for the P of the other warpgroup's tile (ring counter i, ``valid`` keys) and this warpgroup's value half
    of it, cleaned past the length when the tile is partial (CLEAN: it may be)."""
    sr = i % RING_G
    mbarrier.wait(pready.index(sr), (i // RING_G) & 1)  # its scores are done: this half may be cleaned
    mbarrier.wait(ready.index(3 * sr + ME), (i // RING_G) & 1)  # its TMA bytes, seen by this warpgroup too
    if CLEAN:
        if valid < KEYS_G:  # the partial last tile: rows past the length hold anything
            _g_zero_rows_past(k_s.index(2 * sr + ME), valid)


@gluon.jit
def _s_even(q_s, k_s, r_s, mx_s, l_s, bars, ready, empty, pready, o, lse, part_o, part_lse, meta, lens, B, Sq, H, R, capacity,
            qk_scale, OVH: gl.constexpr, B_P2: gl.constexpr, DN: gl.constexpr):
    """Warpgroup 0: of each pair of tiles (t, t + 1) of a piece, scores t; adds P(t) V to O[:, :256] from registers;
    once warpgroup 1 has published t + 1's max, rescales P(t) to it for warpgroup 1, and adds P(t + 1) V."""
    q_ready, q_free, m_in, m_out, l_in, l_out = bars.index(0), bars.index(1), bars.index(3), bars.index(2), bars.index(5), bars.index(4)
    LS: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    LO: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    LP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=LO, k_width=2)  # P as wgmma's A, from registers
    LR: gl.constexpr = gl.SliceLayout(1, LS)
    idx, cost, per, u0, u1, b_first, b_stop, k = _g_schedule(lens, B, Sq, capacity, OVH, B_P2, 4)
    rows = gl.program_id(0) * ROWS_G + gl.arange(0, ROWS_G, layout=LR)
    keys = gl.arange(0, KEYS_G, layout=gl.SliceLayout(0, LS))
    it = 0
    pc = 0
    got = 0  # maxes taken from warpgroup 1 (m_in's phase)
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
            m_i = gl.full([ROWS_G], -1.0e30, gl.float32, layout=LR)  # the max O and l_i are relative to (finite)
            l_i = gl.zeros([ROWS_G], gl.float32, layout=LR)  # the sum of this warpgroup's tiles' P
            acc = gl.zeros([ROWS_G, HALF_G], gl.float32, layout=LO)
            mbarrier.wait(q_ready, pc & 1)
            for t in range(t0, t1, 2):
                i = it + t - t0
                st = i % RING_G
                s = _s_scores(q_s, k_s, r_s, ready, st, (i // RING_G) & 1, 0, LS)
                p, m_t = _s_softmax(s, t, m_i, qk_scale, keys, limit, open_below, mx_s, m_out, 0)
                alpha = gl.exp2(m_i - m_t)
                l_i = l_i * alpha + gl.sum(p, 1)
                m_i = m_t
                if (t + 1) * KEYS_G > n_b:  # the partial last tile: rows past the length hold anything
                    _g_zero_rows_past(k_s.index(2 * st), n_b - t * KEYS_G)
                acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, LO))[:, None]
                acc = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), LP), k_s.index(2 * st), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                mbarrier.arrive(empty.index(3 * st), count=1)  # this value half, for tile t + 2
                if t + 1 < t1:  # tile t + 1, warpgroup 1's: its max, then P(t) rescaled to it, then its P V
                    mbarrier.wait(m_in, got & 1)
                    got += 1
                    m_t = mx_s.index(1).load(LR)
                    scale = gl.exp2(m_i - m_t)
                    _s_put_p((p * scale[:, None]).to(gl.bfloat16), r_s, pready, st)
                    l_i = l_i * scale
                    m_i = m_t
                    _s_take_p(k_s, pready, ready, i + 1, n_b - (t + 1) * KEYS_G, 0, True)
                    so = (i + 1) % RING_G
                    acc = acc * gl.convert_layout(scale, gl.SliceLayout(1, LO))[:, None]
                    acc = warpgroup_mma(r_s.index(so), k_s.index(2 * so), acc, is_async=True)
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                    mbarrier.arrive(empty.index(3 * so), count=1)
                    mbarrier.arrive(empty.index(3 * so + 2), count=1)
                else:  # the piece's last tile: P(t) as it is
                    _s_put_p(p.to(gl.bfloat16), r_s, pready, st)
            it += t1 - t0
            mbarrier.arrive(q_free, count=1)
            buf = 2 * (pc % 2)  # the two sums, double-buffered by piece
            l_s.index(buf).store(l_i)
            mbarrier.arrive(l_out, count=1)
            mbarrier.wait(l_in, pc & 1)
            l_all = l_i + l_s.index(buf + 1).load(LR)
            pc += 1
            _g_store_half(o, lse, part_o, part_lse, acc, l_all, m_i, LO, 0, b, bad, R, Sq, H, first_part, n_pieces, first_odd,
                          True, DN)


@gluon.jit
def _s_odd(q_s, k_s, r_s, mx_s, l_s, bars, ready, empty, pready, o, lse, part_o, part_lse, meta, lens, B, Sq, H, R, capacity,
           qk_scale, OVH: gl.constexpr, B_P2: gl.constexpr, DN: gl.constexpr):
    """Warpgroup 1: of each pair of tiles (t, t + 1) of a piece, scores t + 1 on t's max (published by warpgroup 0),
    adds P(t) V to O[:, 256:] (P(t) already rescaled by warpgroup 0) and then P(t + 1) V from registers. A piece's
    lone last tile t: O rescaled to t's max, then P(t) V."""
    q_ready, q_free, m_in, m_out, l_in, l_out = bars.index(0), bars.index(1), bars.index(2), bars.index(3), bars.index(4), bars.index(5)
    LS: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    LO: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    LP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=LO, k_width=2)
    LR: gl.constexpr = gl.SliceLayout(1, LS)
    idx, cost, per, u0, u1, b_first, b_stop, k = _g_schedule(lens, B, Sq, capacity, OVH, B_P2, 4)
    rows = gl.program_id(0) * ROWS_G + gl.arange(0, ROWS_G, layout=LR)
    keys = gl.arange(0, KEYS_G, layout=gl.SliceLayout(0, LS))
    it = 0
    pc = 0
    got = 0  # maxes taken from warpgroup 0
    for b in range(b_first, b_stop):
        n_b, bad, t0, t1, first_part, n_pieces, first_odd = _g_piece(lens, idx, cost, per, u0, u1, k, b, Sq, capacity, OVH)
        if t1 > t0:
            limit = rows // H + n_b - Sq
            open_below = (gl.program_id(0) * ROWS_G) // H + n_b - Sq + 1
            m_i = gl.full([ROWS_G], -1.0e30, gl.float32, layout=LR)
            l_i = gl.zeros([ROWS_G], gl.float32, layout=LR)
            acc = gl.zeros([ROWS_G, HALF_G], gl.float32, layout=LO)
            mbarrier.wait(q_ready, pc & 1)
            for t in range(t0, t1, 2):
                i = it + t - t0
                se = i % RING_G
                if t + 1 < t1:
                    so = (i + 1) % RING_G
                    s = _s_scores(q_s, k_s, r_s, ready, so, ((i + 1) // RING_G) & 1, 1, LS)
                    mbarrier.wait(m_in, got & 1)
                    got += 1
                    p, m_t = _s_softmax(s, t + 1, mx_s.index(0).load(LR), qk_scale, keys, limit, open_below, mx_s, m_out, 1)
                    p16 = p.to(gl.bfloat16)
                    _s_put_p(p16, r_s, pready, so)
                    alpha = gl.exp2(m_i - m_t)
                    l_i = l_i * alpha + gl.sum(p, 1)
                    m_i = m_t
                    if (t + 2) * KEYS_G > n_b:
                        _g_zero_rows_past(k_s.index(2 * so + 1), n_b - (t + 1) * KEYS_G)
                    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, LO))[:, None]
                    # P(t) V first (P(t) rescaled to m(t + 1) by warpgroup 0): tile t's boxes go back half a product
                    # earlier, and tile t + 2, warpgroup 0's next, loads into them
                    _s_take_p(k_s, pready, ready, i, KEYS_G, 1, False)
                    acc = warpgroup_mma(r_s.index(se), k_s.index(2 * se + 1), acc, is_async=True)
                    acc = warpgroup_mma(gl.convert_layout(p16, LP), k_s.index(2 * so + 1), acc, is_async=True)
                    acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                    mbarrier.arrive(empty.index(3 * se + 1), count=1)
                    mbarrier.arrive(empty.index(3 * se + 2), count=1)
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                    mbarrier.arrive(empty.index(3 * so + 1), count=1)
                else:  # the piece's lone last tile, warpgroup 0's
                    mbarrier.wait(m_in, got & 1)
                    got += 1
                    m_t = mx_s.index(0).load(LR)
                    alpha = gl.exp2(m_i - m_t)
                    l_i = l_i * alpha
                    m_i = m_t
                    _s_take_p(k_s, pready, ready, i, n_b - t * KEYS_G, 1, True)
                    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, LO))[:, None]
                    acc = warpgroup_mma(r_s.index(se), k_s.index(2 * se + 1), acc, is_async=True)
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                    mbarrier.arrive(empty.index(3 * se + 1), count=1)
                    mbarrier.arrive(empty.index(3 * se + 2), count=1)
            it += t1 - t0
            mbarrier.arrive(q_free, count=1)
            buf = 2 * (pc % 2)
            l_s.index(buf + 1).store(l_i)
            mbarrier.arrive(l_out, count=1)
            mbarrier.wait(l_in, pc & 1)
            l_all = l_i + l_s.index(buf).load(LR)
            pc += 1
            _g_store_half(o, lse, part_o, part_lse, acc, l_all, m_i, LO, HALF_G, b, bad, R, Sq, H, first_part, n_pieces,
                          first_odd, False, DN)


@gluon.jit
def _mla_paged_seesaw(q_n, q_r, kv_n, kv_r, table, lens, o, lse, part_o, part_lse, meta, stride_tb, B, Sq, H, capacity,
                      qk_scale, n_q_rows, n_kv_rows, PAGE: gl.constexpr, OVH: gl.constexpr, B_P2: gl.constexpr, DN: gl.constexpr,
                      DEVICE_DESC: gl.constexpr):
    """ENGINE "seesaw": ``_mla_paged_ws``'s signature, grid and merge kernel; warpgroup 0 (here), warpgroup 1 and the
    loader warp."""
    if DEVICE_DESC:
        wide: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS_G, HALF_G], gl.bfloat16)
        rope: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS_G, 64], gl.bfloat16)
        q_n = tma.make_tensor_descriptor(q_n, [n_q_rows, DN + 64], [DN + 64, 1], [ROWS_G, HALF_G], wide)
        q_r = tma.make_tensor_descriptor(q_r, [n_q_rows, DN + 64], [DN + 64, 1], [ROWS_G, 64], rope)
        kv_n = tma.make_tensor_descriptor(kv_n, [n_kv_rows, DN + 64], [DN + 64, 1], [KEYS_G, HALF_G], wide)
        kv_r = tma.make_tensor_descriptor(kv_r, [n_kv_rows, DN + 64], [DN + 64, 1], [KEYS_G, 64], rope)
    R = Sq * H
    q_s = gl.allocate_shared_memory(gl.bfloat16, [2, ROWS_G, HALF_G], q_n.layout)
    k_s = gl.allocate_shared_memory(gl.bfloat16, [2 * RING_G, KEYS_G, HALF_G], kv_n.layout)
    r_s = gl.allocate_shared_memory(gl.bfloat16, [RING_G + 1, KEYS_G, 64], kv_r.layout)  # the tiles' rope (then P), then q's
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    mx_s = gl.allocate_shared_memory(gl.float32, [2, ROWS_G], flat)  # each warpgroup's last max
    l_s = gl.allocate_shared_memory(gl.float32, [4, ROWS_G], flat)  # each warpgroup's sum, by piece parity
    ready = gl.allocate_shared_memory(gl.int64, [3 * RING_G, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [3 * RING_G, 1], mbarrier.MBarrierLayout())
    pready = gl.allocate_shared_memory(gl.int64, [RING_G, 1], mbarrier.MBarrierLayout())
    bars = gl.allocate_shared_memory(gl.int64, [6, 1], mbarrier.MBarrierLayout())  # q ready, q free, m by 0 / 1, l by 0 / 1
    for i in gl.static_range(3 * RING_G):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)  # one warpgroup hands each box back
    for i in gl.static_range(RING_G):
        mbarrier.init(pready.index(i), count=1)
    mbarrier.init(bars.index(0), count=1)
    mbarrier.init(bars.index(1), count=2)  # both warpgroups are done with a piece's q
    for i in gl.static_range(2, 6):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()
    gl.warp_specialize([
        (_s_even, (q_s, k_s, r_s, mx_s, l_s, bars, ready, empty, pready, o, lse, part_o, part_lse, meta, lens, B, Sq, H, R, capacity,
                  qk_scale, OVH, B_P2, DN)),
        (_s_odd, (q_s, k_s, r_s, mx_s, l_s, bars, ready, empty, pready, o, lse, part_o, part_lse, meta, lens, B, Sq, H, R, capacity,
                  qk_scale, OVH, B_P2, DN)),
        (_s_loader, (q_n, q_r, kv_n, kv_r, q_s, k_s, r_s, bars.index(0), bars.index(1), ready, empty, table, lens, stride_tb,
                     B, Sq, R, capacity, PAGE, OVH, B_P2)),
    ], [4, 1], [232, 40])
