"""GRID_MERGE (ENGINE "gluon"): split sequences merged at the end of the main kernel, after a barrier across the
grid, instead of by the merge kernel.

The merge kernel is a second launch: at B1 its launch and ramp cost more than its work (H200, Nsight Compute, B1 Sq4:
main kernel 20.1 us, merge kernel 9.9 us, where FlashMLA's combine overlaps its main kernel). Every program of the
Gluon kernel is resident at once (one a multiprocessor, at most one per multiprocessor: the host launches it as a
cooperative grid, which the driver refuses rather than run it partly), so each warpgroup can wait for all the others'
partials and then merge a share of the split rows from L2. The barrier resets itself (the last arrival sets the
count back to zero and bumps a generation the others wait on), so a CUDA graph can replay it."""

import triton.experimental.gluon as gluon
from triton.experimental.gluon import language as gl

MERGE_RB = gl.constexpr(2)  # rows a warpgroup merges at once (one per pair of warps)
MERGE_PC = gl.constexpr(16)  # pieces a thread folds per load (in its registers: no cross-thread reduction)


@gluon.jit
def _g_add(a, b):
    return a + b


@gluon.jit
def _g_grid_sync(sync, n_arrivals):
    """Return once every warpgroup of the grid has called this (``n_arrivals`` of them), with their stores visible.
    sync[0] counts the arrivals, sync[1] is the generation the last arrival bumps once it has set the count back
    to zero."""
    gen = gl.atomic_add(sync + 1, 0, sem="acquire", scope="gpu")
    gl.thread_barrier()  # every thread of this warpgroup has stored its part before the arrival releases them
    if gl.atomic_add(sync, 1, sem="acq_rel", scope="gpu") == n_arrivals - 1:
        gl.atomic_xchg(sync, 0, sem="relaxed", scope="gpu")
        gl.atomic_add(sync + 1, 1, sem="release", scope="gpu")
    else:
        seen = gen
        while seen == gen:
            seen = gl.atomic_add(sync + 1, 0, sem="acquire", scope="gpu")
    gl.thread_barrier()


@gluon.jit
def _g_merge_split(part_o, part_lse, o, lse, meta, B, Sq, H, R, col0, slot0, n_slots, WRITE_LSE: gl.constexpr,
                   DN: gl.constexpr, B_P2: gl.constexpr):
    """This warpgroup's share of the split sequences' rows, value columns [col0, col0 + 256): units of MERGE_RB rows,
    unit u to warpgroup slot u % n_slots (``slot0``: this one), every piece folded with a running max (as the merge
    kernel does), MERGE_PC pieces a load, the next load issued before the last is folded."""
    L3: gl.constexpr = gl.BlockedLayout([1, MERGE_PC, 4], [1, 1, 32], [2, 1, 2], [2, 1, 0])  # [RB, PC, 256]
    LRP: gl.constexpr = gl.SliceLayout(2, L3)
    LRC: gl.constexpr = gl.SliceLayout(1, L3)
    LB: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    idx = gl.arange(0, B_P2, layout=LB)
    in_b = idx < B
    np_all = gl.load(meta + 4 * idx + 1, mask=in_b, other=1, cache_modifier=".cg")
    fp_all = gl.load(meta + 4 * idx, mask=in_b, other=0, cache_modifier=".cg")
    fo_all = gl.load(meta + 4 * idx + 2, mask=in_b, other=0, cache_modifier=".cg")
    bad_all = gl.load(meta + 4 * idx + 3, mask=in_b, other=0, cache_modifier=".cg")
    split = (np_all > 1).to(gl.int32)
    cum = gl.associative_scan(split, 0, _g_add)
    blocks = (R + MERGE_RB - 1) // MERGE_RB
    pcs = gl.arange(0, MERGE_PC, layout=gl.SliceLayout(0, LRP))
    cols = col0 + gl.arange(0, 256, layout=gl.SliceLayout(0, LRC))
    for u in range(slot0, gl.sum(split, 0) * blocks, n_slots):
        j = u // blocks
        this = (cum == j + 1) & (split > 0)
        b = gl.min(gl.where(this, idx, B_P2), 0)
        first_part = gl.sum(gl.where(this, fp_all, 0), 0)
        n_pieces = gl.sum(gl.where(this, np_all, 0), 0)
        first_odd = gl.sum(gl.where(this, fo_all, 0), 0)
        poison = gl.where(gl.sum(gl.where(this, bad_all, 0), 0) != 0, float("nan"), 0.0)
        rows = (u % blocks) * MERGE_RB + gl.arange(0, MERGE_RB, layout=gl.SliceLayout(1, LRP))
        m = gl.full([MERGE_RB], -3.0e38, gl.float32, layout=gl.SliceLayout(1, LRP))  # finite: a partial's lse is finite
        tot = gl.zeros([MERGE_RB], gl.float32, layout=gl.SliceLayout(1, LRP))
        acc = gl.zeros([MERGE_RB, 256], gl.float32, layout=LRC)
        k = pcs
        ok = (rows[:, None] < R) & (k[None, :] < n_pieces)
        srow = (2 * (first_part + k) + gl.where(k == 0, first_odd, 0))[None, :] * R + rows[:, None]
        lk_next = gl.load(part_lse + srow, mask=ok, other=float("-inf"), cache_modifier=".cg")
        po_next = gl.load(part_o + (srow.to(gl.int64) * DN)[:, :, None] + cols[None, None, :], mask=ok[:, :, None],
                          other=0.0, cache_modifier=".cg")
        for c0 in range(0, n_pieces, MERGE_PC):
            lk = lk_next
            po = po_next
            k = c0 + MERGE_PC + pcs  # the next chunk's loads go out before this one is folded
            ok = (rows[:, None] < R) & (k[None, :] < n_pieces)
            srow = (2 * (first_part + k))[None, :] * R + rows[:, None]
            lk_next = gl.load(part_lse + srow, mask=ok, other=float("-inf"), cache_modifier=".cg")
            po_next = gl.load(part_o + (srow.to(gl.int64) * DN)[:, :, None] + cols[None, None, :], mask=ok[:, :, None],
                              other=0.0, cache_modifier=".cg")
            m_new = gl.maximum(m, gl.max(lk, 1))
            fold = gl.exp2(m - m_new)
            w = gl.exp2(lk - m_new[:, None])
            tot = tot * fold + gl.sum(w, 1)
            fold_c = gl.convert_layout(fold, gl.SliceLayout(1, LRC))
            acc = acc * fold_c[:, None] + gl.sum(w[:, :, None] * po, 1)
            m = m_new
        rows_c = gl.convert_layout(rows, gl.SliceLayout(1, LRC))
        out = acc / gl.convert_layout(tot, gl.SliceLayout(1, LRC))[:, None] + poison
        gl.store(o + ((b * R + rows_c).to(gl.int64) * DN)[:, None] + cols[None, :], out.to(o.dtype.element_ty),
                 mask=(rows_c < R)[:, None])
        if WRITE_LSE:
            gl.store(lse + b * R + (rows % H) * Sq + rows // H, (m + gl.log2(tot)) * 0.6931471805599453 + poison,
                     mask=rows < R)


@gluon.jit
def _g_grid_merge(part_o, part_lse, o, lse, meta, sync, B, Sq, H, R, col0, k, WRITE_LSE: gl.constexpr, DN: gl.constexpr,
                  B_P2: gl.constexpr):
    """GRID_MERGE: once both warpgroups of every program have stored their pieces, this program's units of split rows,
    this warpgroup's value columns. Where ``_g_schedule`` packed one piece a sequence (k 1, the same in every program),
    nothing is split: no program waits."""
    if k != 1:
        n_prog = gl.num_programs(0) * gl.num_programs(1)
        _g_grid_sync(sync, 2 * n_prog)
        _g_merge_split(part_o, part_lse, o, lse, meta, B, Sq, H, R, col0, gl.program_id(1) * gl.num_programs(0) + gl.program_id(0),
                       n_prog, WRITE_LSE, DN, B_P2)
