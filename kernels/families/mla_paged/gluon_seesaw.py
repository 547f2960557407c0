"""ENGINE "seesaw": the Gluon kernel with the score work shared by both warpgroups (``_mla_paged_seesaw``).

Under ENGINE "gluon" warpgroup 0 scores every tile (Q K^T, 64 x 64 x 576) and runs the softmax while warpgroup 1
only multiplies: at Sq * H = 256 (MTP) the kernel is bound by warpgroup 0's tensor work. Here warpgroup W scores
the tiles t = W, W + 2, ... (its own) and folds every tile into its half of O (columns 256 W ..): its own tile with
P in registers, the other's with the P and the rows' factor that warpgroup published in shared memory. Tile t's
softmax starts from tile t - 1's running max, published by its owner right after its softmax (before its folds),
so the two softmaxes take turns while the tensor cores run the products. One P buffer serves both: tile t's P is
written by t's owner once it has folded tile t - 1, and read only by the other warpgroup, which owns t + 1 and
writes the next P after its product on t has completed. Ownership
goes by the program's tile count, not the piece's, so the turns alternate across pieces too. Each
warpgroup sums the rows of its own tiles' P; the two sums are added through shared memory at the end of a piece.
Same loader warp, scheduler, stores and merge kernel as ENGINE "gluon"; q's rope box stays in shared memory, so
the one P buffer (8 KB) is all that is added."""

import triton.experimental.gluon as gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait

from .gluon_ws import ROWS_G, KEYS_G, HALF_G, RING_G, _g_schedule, _g_piece, _g_loader, _g_zero_rows_past, _g_store_half


@gluon.jit
def _g_running_max(a_s, m_s, m_pub, g, LO: gl.constexpr):
    """Tile g's running max and rows' factor, once its owner has published them."""
    mbarrier.wait(m_pub, g & 1)
    return m_s.load(gl.SliceLayout(1, LO)), a_s.load(gl.SliceLayout(1, LO))


@gluon.jit
def _g_fold_other(k_s, p_s, ready, empty, p_pub, acc, l_i, alpha, g, t, n_b, W: gl.constexpr):
    """Fold the other warpgroup's tile g (the piece's tile t) into acc once its P is published: rescale by its factor,
    add P V with P from shared memory; the tile's stage is handed back."""
    st = g % RING_G
    mbarrier.wait(ready.index(st), (g // RING_G) & 1)
    mbarrier.wait(p_pub, g & 1)
    v = k_s.index(2 * st + W)
    if (t + 1) * KEYS_G > n_b:  # the partial last tile: rows past the length hold anything
        _g_zero_rows_past(v, n_b - t * KEYS_G)
    acc = warpgroup_mma(p_s, v, acc * alpha[:, None], is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.arrive(empty.index(st), count=1)
    return acc, l_i * alpha


@gluon.jit
def _g_half(q_s, k_s, r_s, p_s, a_s, m_s, l_s, bars, ready, empty, o, lse, part_o, part_lse, meta, lens, B, Sq, H, R,
            capacity, qk_scale, W: gl.constexpr, OVH: gl.constexpr, B_P2: gl.constexpr, DN: gl.constexpr):
    """Warpgroup W: scores its own tiles, publishes their running max and factor, then their P; folds every tile into
    its half of O."""
    q_ready, q_free, m_pub, p_pub = bars.index(0), bars.index(1), bars.index(2), bars.index(3)
    l_ready, l_free = bars.index(4), bars.index(5)
    LS: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    LO: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    LP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=LO, k_width=2)
    idx, cost, per, u0, u1, b_first, b_stop = _g_schedule(lens, B, Sq, capacity, OVH, B_P2, 4)
    rows = gl.program_id(0) * ROWS_G + gl.arange(0, ROWS_G, layout=gl.SliceLayout(1, LS))
    keys = gl.arange(0, KEYS_G, layout=gl.SliceLayout(0, LS))
    it = 0  # this program's tiles before the piece (both warpgroups count every tile)
    pc = 0
    for b in range(b_first, b_stop):
        n_b, bad, t0, t1, first_part, n_pieces, first_odd = _g_piece(lens, idx, cost, per, u0, u1, b, Sq, capacity, OVH)
        if t1 > t0:
            if W == 0:
                if (gl.program_id(1) == first_part) & (gl.program_id(0) == 0):  # the merge kernel's record of b
                    gl.store(meta + 4 * b, first_part)
                    gl.store(meta + 4 * b + 1, n_pieces)
                    gl.store(meta + 4 * b + 2, first_odd)
                    gl.store(meta + 4 * b + 3, bad.to(gl.int32))
            limit = rows // H + n_b - Sq  # row (s, h) sees keys j <= s + len - Sq
            m_i = gl.full([ROWS_G], -1.0e30, gl.float32, layout=gl.SliceLayout(1, LO))  # finite: a masked tile gives p = 0
            l_i = gl.zeros([ROWS_G], gl.float32, layout=gl.SliceLayout(1, LO))
            acc = gl.zeros([ROWS_G, HALF_G], gl.float32, layout=LO)
            n_t = t1 - t0
            mbarrier.wait(q_ready, pc & 1)
            for j in range((it + W) % 2, n_t, 2):  # its own tiles (g = it + j of W's parity), each after the one before
                g = it + j
                st = g % RING_G
                mbarrier.wait(ready.index(st), (g // RING_G) & 1)
                s = warpgroup_mma(q_s.index(0), k_s.index(2 * st).permute((1, 0)),
                                  gl.zeros([ROWS_G, KEYS_G], gl.float32, layout=LS), use_acc=False, is_async=True)
                s = warpgroup_mma(q_s.index(1), k_s.index(2 * st + 1).permute((1, 0)), s, is_async=True)
                s = warpgroup_mma(r_s.index(RING_G), r_s.index(st).permute((1, 0)), s, is_async=True)
                alpha_prev = gl.full([ROWS_G], 1.0, gl.float32, layout=gl.SliceLayout(1, LO))
                if j > 0:  # the tile before is the other's: start from its running max
                    m_i, alpha_prev = _g_running_max(a_s, m_s, m_pub, g - 1, LO)
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
                t = t0 + j
                s = gl.where(t * KEYS_G + keys[None, :] <= limit[:, None], s * qk_scale, float("-inf"))
                m_prev = gl.convert_layout(m_i, gl.SliceLayout(1, LS))
                m_new = gl.maximum(m_prev, gl.max(s, 1))
                alpha = gl.exp2(m_prev - m_new)
                p = gl.exp2(s - m_new[:, None])
                a_s.store(alpha)  # the other warpgroup read the last ones before publishing its tile
                m_s.store(m_new)
                fence_async_shared()
                mbarrier.arrive(m_pub, count=1)  # the next tile's softmax can start
                if j > 0:
                    acc, l_i = _g_fold_other(k_s, p_s, ready, empty, p_pub, acc, l_i, alpha_prev, g - 1, t - 1, n_b, W)
                p16 = p.to(gl.bfloat16)
                p_s.store(p16)  # the buffer held the tile before's P, folded just now (and by nobody else)
                fence_async_shared()
                mbarrier.arrive(p_pub, count=1)
                v = k_s.index(2 * st + W)
                if (t + 1) * KEYS_G > n_b:
                    _g_zero_rows_past(v, n_b - t * KEYS_G)
                alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, LO))
                acc = warpgroup_mma(gl.convert_layout(p16, LP), v, acc * alpha_o[:, None], is_async=True)
                l_i = l_i * alpha_o + gl.convert_layout(gl.sum(p, 1), gl.SliceLayout(1, LO))
                m_i = gl.convert_layout(m_new, gl.SliceLayout(1, LO))
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                mbarrier.arrive(empty.index(st), count=1)
            if (it + n_t - 1) % 2 != W:  # the piece's last tile is the other's
                m_i, alpha_last = _g_running_max(a_s, m_s, m_pub, it + n_t - 1, LO)
                acc, l_i = _g_fold_other(k_s, p_s, ready, empty, p_pub, acc, l_i, alpha_last, it + n_t - 1, t1 - 1, n_b, W)
            mbarrier.arrive(q_free, count=1)
            mbarrier.wait(l_free, (pc & 1) ^ 1)  # both read the last piece's sums
            l_s.slice(W * ROWS_G, ROWS_G).store(l_i)
            mbarrier.arrive(l_ready, count=1)
            mbarrier.wait(l_ready, pc & 1)
            l_i = l_i + l_s.slice((1 - W) * ROWS_G, ROWS_G).load(gl.SliceLayout(1, LO))
            mbarrier.arrive(l_free, count=1)
            it += n_t
            pc += 1
            _g_store_half(o, lse, part_o, part_lse, acc, l_i, m_i, LO, W * HALF_G, b, bad, R, Sq, H, first_part, n_pieces,
                          first_odd, W == 0, DN)


@gluon.jit
def _mla_paged_seesaw(q_n, q_r, kv_n, kv_r, table, lens, o, lse, part_o, part_lse, meta, stride_tb, B, Sq, H, capacity,
                      qk_scale, PAGE: gl.constexpr, OVH: gl.constexpr, B_P2: gl.constexpr, DN: gl.constexpr):
    """ENGINE "seesaw": grid (row blocks, parts); warpgroup 0 (here), warpgroup 1 and the loader warp."""
    R = Sq * H
    q_s = gl.allocate_shared_memory(gl.bfloat16, [2, ROWS_G, HALF_G], q_n.layout)
    k_s = gl.allocate_shared_memory(gl.bfloat16, [2 * RING_G, KEYS_G, HALF_G], kv_n.layout)
    r_s = gl.allocate_shared_memory(gl.bfloat16, [RING_G + 1, KEYS_G, 64], kv_r.layout)  # the tiles' rope, then q's
    p_s = gl.allocate_shared_memory(gl.bfloat16, [ROWS_G, KEYS_G], gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16))
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    a_s = gl.allocate_shared_memory(gl.float32, [ROWS_G], flat)
    m_s = gl.allocate_shared_memory(gl.float32, [ROWS_G], flat)
    l_s = gl.allocate_shared_memory(gl.float32, [2 * ROWS_G], flat)  # each warpgroup's row sums
    ready = gl.allocate_shared_memory(gl.int64, [RING_G, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [RING_G, 1], mbarrier.MBarrierLayout())
    bars = gl.allocate_shared_memory(gl.int64, [6, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(RING_G):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # both warpgroups hand a stage back
    mbarrier.init(bars.index(0), count=1)  # q ready (the loader's TMA)
    mbarrier.init(bars.index(1), count=2)  # q free: both warpgroups score with it
    mbarrier.init(bars.index(2), count=1)  # a tile's running max and rows' factor published by its owner
    mbarrier.init(bars.index(3), count=1)  # a tile's P published by its owner
    mbarrier.init(bars.index(4), count=2)  # both row sums written
    mbarrier.init(bars.index(5), count=2)  # both row sums read
    fence_async_shared()
    # the partitions' argument tuples are written out here: a tuple held in a variable turns constexprs into tensors
    gl.warp_specialize([
        (_g_half, (q_s, k_s, r_s, p_s, a_s, m_s, l_s, bars, ready, empty, o, lse, part_o, part_lse, meta, lens, B, Sq, H, R,
                   capacity, qk_scale, 0, OVH, B_P2, DN)),
        (_g_half, (q_s, k_s, r_s, p_s, a_s, m_s, l_s, bars, ready, empty, o, lse, part_o, part_lse, meta, lens, B, Sq, H, R,
                   capacity, qk_scale, 1, OVH, B_P2, DN)),
        (_g_loader, (q_n, q_r, kv_n, kv_r, q_s, k_s, r_s, bars.index(0), bars.index(1), ready, empty, table, lens, stride_tb,
                     B, Sq, R, capacity, PAGE, OVH, B_P2)),
    ], [4, 1], [232, 40])
