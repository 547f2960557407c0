"""ENGINE "gluon": FlashMLA's split of the work, warp-specialised for Hopper (``_mla_paged_ws``), on the Triton
kernel's scheduler and merge kernel."""

import triton.experimental.gluon as gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .gluon_merge import _g_add, _g_grid_merge

ROWS_G = gl.constexpr(64)  # (query, head) rows per program
KEYS_G = gl.constexpr(64)  # keys per tile
HALF_G = gl.constexpr(256)  # value columns per warpgroup, and the width of a latent box
RING_G = gl.constexpr(2)  # tiles in the ring (with q's 72 KB, shared memory is full)


@gluon.jit
def _g_line(lens, idx, B, Sq, capacity, OVH: gl.constexpr):
    """The work line over ``idx`` (0 .. B_P2, in the caller's layout): which entries are sequences, each one's length
    (one outside [Sq, capacity] runs as Sq) and its cost in units, its tiles plus OVH."""
    in_b = idx < B
    n_all = gl.load(lens + idx, mask=in_b, other=0)
    n_all = gl.where((n_all < Sq) | (n_all > capacity), Sq, n_all)
    cost = gl.where(in_b, (n_all + KEYS_G - 1) // KEYS_G + OVH, 0)
    return in_b, n_all, cost


@gluon.jit
def _g_packing(n_all, in_b, B, parts):
    """FlashMLA's packing: where every sequence has one length and there are at least two and no more than parts,
    each sequence in k = parts // B (at most its tiles) equal pieces, one a part; k is 0 where the work line holds."""
    n_max = gl.max(gl.where(in_b, n_all, 0), 0)
    same = gl.min(gl.where(in_b, n_all, n_max), 0) == n_max
    k = gl.minimum(parts // B, (n_max + KEYS_G - 1) // KEYS_G)
    return gl.where(same & (B >= 2) & (k >= 1), k, 0)


@gluon.jit
def _g_schedule(lens, B, Sq, capacity, OVH: gl.constexpr, B_P2: gl.constexpr, W: gl.constexpr):
    """``_mla_paged_fwd``'s work line, in each partition: the part's units and its first and last sequences; or, where
    ``_g_packing`` applies (B32 Sq4, B64 at the headline), one piece of one sequence a part, so no sequence is cut into
    three pieces and none at all where k is 1 (no partials, nothing to merge)."""
    L: gl.constexpr = gl.BlockedLayout([1], [32], [W.value], [0])
    idx = gl.arange(0, B_P2, layout=L)
    in_b, n_all, cost = _g_line(lens, idx, B, Sq, capacity, OVH)
    ends = gl.associative_scan(cost, 0, _g_add)
    total = gl.sum(cost, 0)
    per = (total + gl.num_programs(1) - 1) // gl.num_programs(1)
    u0 = gl.program_id(1) * per
    u1 = gl.minimum(u0 + per, total)
    b_first = gl.sum((in_b & (ends <= u0)).to(gl.int32), 0)
    b_stop = gl.sum((in_b & (ends - cost < u1)).to(gl.int32), 0)
    k = _g_packing(n_all, in_b, B, gl.num_programs(1))
    part = gl.program_id(1)
    mine = gl.where(part < B * k, part // gl.maximum(k, 1), B)
    b_first = gl.where(k > 0, mine, b_first)
    b_stop = gl.where(k > 0, gl.minimum(mine + 1, B), b_stop)
    return idx, cost, per, u0, u1, b_first, b_stop, k


@gluon.jit
def _g_piece(lens, idx, cost, per, u0, u1, k, b, Sq, capacity, OVH: gl.constexpr):
    """Sequence b's piece in this part: its length (clamped; ``bad``: out of range), tiles [t0, t1), its slots."""
    n_b = gl.load(lens + b)
    bad = (n_b < Sq) | (n_b > capacity)
    n_b = gl.where(bad, Sq, n_b)
    start_b = gl.sum(gl.where(idx < b, cost, 0), 0)
    tiles_b = (n_b + KEYS_G - 1) // KEYS_G
    t0 = gl.maximum(u0 - start_b - OVH, 0)
    t1 = gl.minimum(u1 - start_b - OVH, tiles_b)
    first_part = (start_b + OVH) // per
    n_pieces = (start_b + OVH + tiles_b - 1) // per - first_part + 1
    first_odd = (start_b > first_part * per).to(gl.int32)
    # equal pieces (k > 0): piece j of b in part b * k + j, its partial in slot 2 * part
    kk = gl.maximum(k, 1)
    j = gl.program_id(1) - b * kk
    t0 = gl.where(k > 0, (j * tiles_b) // kk, t0)
    t1 = gl.where(k > 0, ((j + 1) * tiles_b) // kk, t1)
    first_part = gl.where(k > 0, b * kk, first_part)
    n_pieces = gl.where(k > 0, kk, n_pieces)
    first_odd = gl.where(k > 0, 0, first_odd)
    return n_b, bad, t0, t1, first_part, n_pieces, first_odd


@gluon.jit
def _g_loader(q_n, q_r, kv_n, kv_r, q_s, k_s, r_s, q_ready, q_free, ready, empty, table, lens, stride_tb, B, Sq, R,
              capacity, PAGE: gl.constexpr, OVH: gl.constexpr, B_P2: gl.constexpr, PDL: gl.constexpr):
    """One warp: a piece's q by TMA once the last piece's is free, then each tile's three boxes into the ring. PDL: its
    last load issued, the program lets the merge kernel launch (which waits for this grid's end before it reads)."""
    idx, cost, per, u0, u1, b_first, b_stop, k = _g_schedule(lens, B, Sq, capacity, OVH, B_P2, 1)
    q_bytes: gl.constexpr = 2 * q_n.block_type.nbytes + q_r.block_type.nbytes
    kv_bytes: gl.constexpr = 2 * kv_n.block_type.nbytes + kv_r.block_type.nbytes
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
                page = gl.load(table + b * stride_tb + (t * KEYS_G) // PAGE)
                kv_row = page * PAGE + (t * KEYS_G) % PAGE
                mbarrier.wait(empty.index(st), ((it // RING_G) & 1) ^ 1)
                mbarrier.expect(ready.index(st), kv_bytes)
                tma.async_copy_global_to_shared(kv_n, [kv_row, 0], ready.index(st), k_s.index(2 * st))
                tma.async_copy_global_to_shared(kv_n, [kv_row, HALF_G], ready.index(st), k_s.index(2 * st + 1))
                tma.async_copy_global_to_shared(kv_r, [kv_row, 2 * HALF_G], ready.index(st), r_s.index(st))
                it += 1
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _g_zero_rows_past(buf, valid):
    """Rows valid.. of a [64, 256] tile in shared memory set to zero (a partial last tile's values may be NaN), eight
    rows at a time: 16 values a thread live, not 128."""
    L: gl.constexpr = gl.BlockedLayout([1, 16], [2, 16], [4, 1], [1, 0])  # [8, 256] over the warpgroup, no copies
    for c in gl.static_range(KEYS_G // 8):
        chunk = buf.slice(c * 8, 8, dim=0)
        x = chunk.load(L)
        rows = c * 8 + gl.arange(0, 8, layout=gl.SliceLayout(1, L))
        chunk.store(gl.where(rows[:, None] < valid, x, gl.zeros_like(x)))
    fence_async_shared()


@gluon.jit
def _g_store_half(o, lse, part_o, part_lse, acc, l_i, m_i, LO: gl.constexpr, col0, b, bad, R, Sq, H, first_part,
                  n_pieces, first_odd, WRITE_LSE: gl.constexpr, DN: gl.constexpr):
    """This warpgroup's 256 columns of the piece's rows: to o (NaN for a bad length) or its partial slot."""
    rows = gl.program_id(0) * ROWS_G + gl.arange(0, ROWS_G, layout=gl.SliceLayout(1, LO))
    cols = col0 + gl.arange(0, HALF_G, layout=gl.SliceLayout(0, LO))
    inv = gl.convert_layout(1.0 / gl.where(l_i > 0.0, l_i, 1.0), gl.SliceLayout(1, LO))
    out = acc * inv[:, None]
    lse2 = m_i + gl.log2(gl.where(l_i > 0.0, l_i, 1.0))
    r = gl.program_id(0) * ROWS_G + gl.arange(0, ROWS_G, layout=lse2.type.layout)
    part = gl.program_id(1)
    if n_pieces == 1:
        poison = gl.where(bad, float("nan"), 0.0)
        gl.store(o + (b * R + rows).to(gl.int64)[:, None] * DN + cols[None, :], (out + poison).to(o.dtype.element_ty))
        if WRITE_LSE:
            gl.store(lse + b * R + (r % H) * Sq + r // H, lse2 * 0.6931471805599453 + poison)
    else:
        slot = 2 * part + gl.where(part == first_part, first_odd, 0)
        gl.store(part_o + (slot * R + rows).to(gl.int64)[:, None] * DN + cols[None, :], out.to(part_o.dtype.element_ty))
        if WRITE_LSE:
            gl.store(part_lse + slot * R + r, lse2)


@gluon.jit
def _g_store_staged(o, lse, part_o, part_lse, acc, l_i, m_i, buf, LO: gl.constexpr, col0, b, bad, R, Sq, H, first_part,
                    n_pieces, first_odd, WRITE_LSE: gl.constexpr, DN: gl.constexpr, WHOLE: gl.constexpr = False):
    """``_g_store_half`` for bfloat16 rows (o, or bfloat16 partials; WHOLE: the caller knows the piece is the whole
    sequence, so o), staged in ``buf``: a [64, 256] box of this
    warpgroup's that nothing reads or loads until it is handed back, then read back eight contiguous values a thread,
    so that each warp stores whole rows of 512 bytes. From the accumulator's own layout each store writes 4 bytes a
    thread in eight rows. H200: o staged, B32 Sq4 229.3 -> 228.1 us; bfloat16 partials staged were faster at B1 Sq2 /
    Sq4 and slower at B64 / B128, whose stores' time is not their issue pattern."""
    inv = gl.convert_layout(1.0 / gl.where(l_i > 0.0, l_i, 1.0), gl.SliceLayout(1, LO))
    lse2 = m_i + gl.log2(gl.where(l_i > 0.0, l_i, 1.0))
    r = gl.program_id(0) * ROWS_G + gl.arange(0, ROWS_G, layout=lse2.type.layout)
    if WHOLE or n_pieces == 1:
        poison = gl.where(bad, float("nan"), 0.0)
        dst = o + (b * R).to(gl.int64) * DN
        if WRITE_LSE:
            gl.store(lse + b * R + (r % H) * Sq + r // H, lse2 * 0.6931471805599453 + poison)
    else:
        poison = 0.0
        slot = 2 * gl.program_id(1) + gl.where(gl.program_id(1) == first_part, first_odd, 0)
        dst = part_o + (slot * R).to(gl.int64) * DN
        if WRITE_LSE:
            gl.store(part_lse + slot * R + r, lse2)
    buf.store((acc * inv[:, None] + poison).to(gl.bfloat16))
    LW: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])  # a warp a row: 32 x 16 bytes
    x = buf.load(LW)
    rows = gl.program_id(0) * ROWS_G + gl.arange(0, ROWS_G, layout=gl.SliceLayout(1, LW))
    cols = col0 + gl.arange(0, HALF_G, layout=gl.SliceLayout(0, LW))
    gl.store(dst + rows.to(gl.int64)[:, None] * DN + cols[None, :], x)


@gluon.jit
def _g_wg0(q_s, k_s, r_s, p_s, a_s, l_s, bars, ready, empty, o, lse, part_o, part_lse, meta, sync, lens, B, Sq, H, R,
           capacity, qk_scale, OVH: gl.constexpr, B_P2: gl.constexpr, DN: gl.constexpr, GRID: gl.constexpr):
    """Warpgroup 0: scores, the online softmax (log2), P and the rows' factor for warpgroup 1, its half of P V. Only
    tiles that reach the causal edge or the length are masked; this half of P V takes P from registers and is issued
    before P is handed over, so the hand-over runs beside it (H200: B1 Sq4 33.4 against 36.1 us, B1 Skv 131072 69.7
    against 79.8; B32 Sq4 and B64 unchanged)."""
    STAGED: gl.constexpr = part_o.dtype.element_ty == gl.bfloat16  # bfloat16 partials: every piece's rows staged
    q_ready, q_free, p_ready, p_free = bars.index(0), bars.index(1), bars.index(2), bars.index(3)
    l_ready, l_free = bars.index(4), bars.index(5)
    LS: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    LO: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    LP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=LO, k_width=2)  # P as wgmma's A, from registers
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
            for t in range(t0, t1):
                st = it % RING_G
                mbarrier.wait(ready.index(st), (it // RING_G) & 1)
                k0 = k_s.index(2 * st)
                s = warpgroup_mma(q_s.index(0), k0.permute((1, 0)), gl.zeros([ROWS_G, KEYS_G], gl.float32, layout=LS),
                                  use_acc=False, is_async=True)
                s = warpgroup_mma(q_s.index(1), k_s.index(2 * st + 1).permute((1, 0)), s, is_async=True)
                s = warpgroup_mma(r_s.index(RING_G), r_s.index(st).permute((1, 0)), s, is_async=True)
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
                s = s * qk_scale
                if (t + 1) * KEYS_G > open_below:  # the causal edge or the length: a key some row must not see
                    s = gl.where(t * KEYS_G + keys[None, :] <= limit[:, None], s, float("-inf"))
                m_new = gl.maximum(m_i, gl.max(s, 1))
                alpha = gl.exp2(m_i - m_new)
                p = gl.exp2(s - m_new[:, None])
                l_i = l_i * alpha + gl.sum(p, 1)
                m_i = m_new
                p16 = p.to(gl.bfloat16)
                if (t + 1) * KEYS_G > n_b:  # the partial last tile: rows past the length hold anything
                    _g_zero_rows_past(k0, n_b - t * KEYS_G)
                acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, LO))[:, None]
                acc = warpgroup_mma(gl.convert_layout(p16, LP), k0, acc, is_async=True)  # this half first, P from registers
                mbarrier.wait(p_free, (it & 1) ^ 1)  # warpgroup 1 is done with the last tile's P and factor
                p_s.store(p16)
                a_s.store(alpha)
                fence_async_shared()
                mbarrier.arrive(p_ready, count=1)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                mbarrier.arrive(empty.index(st), count=1, pred=(t + 1 < t1) if STAGED else True)  # STAGED: the last below
                it += 1
            mbarrier.arrive(q_free, count=1)
            mbarrier.wait(l_free, (pc & 1) ^ 1)
            l_s.store(l_i)
            mbarrier.arrive(l_ready, count=1)
            pc += 1
            if STAGED:  # through the last tile's first latent box, then the stage is handed back
                st = (it - 1) % RING_G
                _g_store_staged(o, lse, part_o, part_lse, acc, l_i, m_i, k_s.index(2 * st), LO, 0, b, bad, R, Sq, H,
                                first_part, n_pieces, first_odd, True, DN)
                mbarrier.arrive(empty.index(st), count=1)
            else:
                _g_store_half(o, lse, part_o, part_lse, acc, l_i, m_i, LO, 0, b, bad, R, Sq, H, first_part, n_pieces,
                              first_odd, True, DN)
    if GRID:  # the split rows, merged here (gluon_merge.py)
        _g_grid_merge(part_o, part_lse, o, lse, meta, sync, B, Sq, H, R, 0, k, True, DN, B_P2)


@gluon.jit
def _g_wg1(q_s, k_s, r_s, p_s, a_s, l_s, bars, ready, empty, o, lse, part_o, part_lse, meta, sync, lens, B, Sq, H, R,
           capacity, qk_scale, OVH: gl.constexpr, B_P2: gl.constexpr, DN: gl.constexpr, GRID: gl.constexpr):
    """Warpgroup 1: the other half of P V, with warpgroup 0's P and factor. A stage's boxes share one ready and one
    empty barrier, handed back by both warpgroups."""
    STAGED: gl.constexpr = part_o.dtype.element_ty == gl.bfloat16  # bfloat16 partials: every piece's rows staged
    p_ready, p_free, l_ready, l_free = bars.index(2), bars.index(3), bars.index(4), bars.index(5)
    LO: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    idx, cost, per, u0, u1, b_first, b_stop, k = _g_schedule(lens, B, Sq, capacity, OVH, B_P2, 4)
    it = 0
    pc = 0
    for b in range(b_first, b_stop):
        n_b, bad, t0, t1, first_part, n_pieces, first_odd = _g_piece(lens, idx, cost, per, u0, u1, k, b, Sq, capacity, OVH)
        if t1 > t0:
            acc = gl.zeros([ROWS_G, HALF_G], gl.float32, layout=LO)
            for t in range(t0, t1):
                st = it % RING_G
                k1 = k_s.index(2 * st + 1)
                mbarrier.wait(ready.index(st), (it // RING_G) & 1)
                mbarrier.wait(p_ready, it & 1)  # the scores are done: k1 may be cleaned
                if (t + 1) * KEYS_G > n_b:
                    _g_zero_rows_past(k1, n_b - t * KEYS_G)
                acc = acc * a_s.load(gl.SliceLayout(1, LO))[:, None]
                acc = warpgroup_mma(p_s, k1, acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                mbarrier.arrive(p_free, count=1)
                mbarrier.arrive(empty.index(st), count=1, pred=(t + 1 < t1) if STAGED else True)
                it += 1
            mbarrier.wait(l_ready, pc & 1)
            l_i = l_s.load(gl.SliceLayout(1, LO))
            mbarrier.arrive(l_free, count=1)
            pc += 1
            if STAGED:  # through the last tile's second latent box
                st = (it - 1) % RING_G
                _g_store_staged(o, lse, part_o, part_lse, acc, l_i, l_i, k_s.index(2 * st + 1), LO, HALF_G, b, bad, R, Sq,
                                H, first_part, n_pieces, first_odd, False, DN)
                mbarrier.arrive(empty.index(st), count=1)
            else:
                _g_store_half(o, lse, part_o, part_lse, acc, l_i, l_i, LO, HALF_G, b, bad, R, Sq, H, first_part, n_pieces,
                              first_odd, False, DN)
    if GRID:
        _g_grid_merge(part_o, part_lse, o, lse, meta, sync, B, Sq, H, R, HALF_G, k, False, DN, B_P2)


@gluon.jit
def _g_device_descriptors(q_n, q_r, kv_n, kv_r, n_q_rows, n_kv_rows, DN: gl.constexpr):
    """TMA_DESC "device": the four descriptors (q and the cache, each in 256-column latent and 64-column rope boxes)
    made from the two pointers the host passed, so the launcher encodes none on the host."""
    wide: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS_G, HALF_G], gl.bfloat16)
    rope: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS_G, 64], gl.bfloat16)
    return (tma.make_tensor_descriptor(q_n, [n_q_rows, DN + 64], [DN + 64, 1], [ROWS_G, HALF_G], wide),
            tma.make_tensor_descriptor(q_r, [n_q_rows, DN + 64], [DN + 64, 1], [ROWS_G, 64], rope),
            tma.make_tensor_descriptor(kv_n, [n_kv_rows, DN + 64], [DN + 64, 1], [KEYS_G, HALF_G], wide),
            tma.make_tensor_descriptor(kv_r, [n_kv_rows, DN + 64], [DN + 64, 1], [KEYS_G, 64], rope))


@gluon.jit
def _mla_paged_ws(q_n, q_r, kv_n, kv_r, table, lens, o, lse, part_o, part_lse, meta, sync, stride_tb, B, Sq, H, capacity,
                  qk_scale, n_q_rows, n_kv_rows, PAGE: gl.constexpr, OVH: gl.constexpr, B_P2: gl.constexpr, DN: gl.constexpr,
                  DEVICE_DESC: gl.constexpr, GRID_MERGE: gl.constexpr, PDL: gl.constexpr):
    """ENGINE "gluon": grid (row blocks, parts); warpgroup 0 (here), warpgroup 1 and the loader warp. GRID_MERGE: the
    split rows merged here after a grid barrier (gluon_merge.py); else the merge kernel follows, PDL (knob GLUON_PDL)
    as this kernel's programmatic dependent let go once the loader has issued its last load (let go at this kernel's
    start, B1 Skv 131072 took 105.9 against 88.1 us on the H200: kernels/notes/mla-paged/README.md, session 26). DEVICE_DESC:
    q_n and q_r are q's pointer, kv_n and kv_r the cache's, and the four descriptors are made here (TMA_DESC "device":
    no descriptor for the launcher to encode on the host in every launch)."""
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
    ready = gl.allocate_shared_memory(gl.int64, [RING_G, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [RING_G, 1], mbarrier.MBarrierLayout())
    bars = gl.allocate_shared_memory(gl.int64, [6, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(RING_G):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # both warpgroups hand a stage back
    for i in gl.static_range(6):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()
    # the partitions' argument tuples are written out here: a tuple held in a variable turns constexprs into tensors
    gl.warp_specialize([
        (_g_wg0, (q_s, k_s, r_s, p_s, a_s, l_s, bars, ready, empty, o, lse, part_o, part_lse, meta, sync, lens, B, Sq, H, R,
                  capacity, qk_scale, OVH, B_P2, DN, GRID_MERGE)),
        (_g_wg1, (q_s, k_s, r_s, p_s, a_s, l_s, bars, ready, empty, o, lse, part_o, part_lse, meta, sync, lens, B, Sq, H, R,
                  capacity, qk_scale, OVH, B_P2, DN, GRID_MERGE)),
        (_g_loader, (q_n, q_r, kv_n, kv_r, q_s, k_s, r_s, bars.index(0), bars.index(1), ready, empty, table, lens, stride_tb,
                     B, Sq, R, capacity, PAGE, OVH, B_P2, PDL)),
    ], [4, 1], [232, 40])
