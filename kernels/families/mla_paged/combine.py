"""MERGE_ROWS (ENGINE "gluon"): the merge kernel shaped as FlashMLA's combine (``_mla_paged_combine``). ROWS rows a
program, a warp a row, every value column of the row in that warp. Each program works out its sequence's pieces from
the lengths, as the main kernel's prologue does, before it waits for the main kernel: a sequence in one piece (the
main kernel wrote it) ends its programs before the wait, so they hold no slot while the main kernel ends. The others,
once the main kernel is done, load every piece's lse and the first two pieces' rows at once, then fold the pieces in
order, two pieces' rows in flight while one is folded. H200, device time interleaved with the row-per-program
merge: B128 long-tail 180.0 against 180.4 us, B64 161.4 against 162.4, B32 Sq1 95.0 against 94.8; with one piece in
flight B32 Sq1 took 95.6, since its four pieces a sequence were then four round trips.

The row-per-program merge kernel (``_mla_paged_merge``, MERGE_ROWS 0) reads the main kernel's record of a sequence
once it has waited: all of its B * Sq * H programs wait, and two round trips to L2 follow the wait before the first
partial row is asked for."""

import triton.experimental.gluon as gluon
from triton.experimental.gluon import language as gl

from .gluon_ws import _g_line, _g_packing, _g_piece

COMBINE_LSE = gl.constexpr(32)  # pieces' lse a warp loads at once (a lane each)


@gluon.jit
def _mla_paged_combine(part_o, part_lse, o, lse, lens, Sq, H, B, capacity, n_parts, OVH: gl.constexpr,
                       B_P2: gl.constexpr, ROWS: gl.constexpr, DN: gl.constexpr, PDL: gl.constexpr):
    """Program (sequence b, ROWS rows), ROWS warps. Sequence b's pieces as the main kernel's ``_g_schedule`` and
    ``_g_piece`` cut them, every warp holding all the lengths (no reduction crosses a warp); a length outside [Sq,
    capacity] runs as Sq and its rows are NaN."""
    LB: gl.constexpr = gl.BlockedLayout([(B_P2 + 31) // 32], [32], [ROWS], [0])  # every warp: the whole batch
    LO: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [ROWS, 1], [1, 0])  # [ROWS, DN]: a warp a row, 16 B a load
    LL: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [ROWS, 1], [1, 0])  # [ROWS, COMBINE_LSE]: a lane a piece
    LR: gl.constexpr = gl.SliceLayout(1, LO)
    b = gl.program_id(0)
    R = Sq * H
    idx = gl.arange(0, B_P2, layout=LB)
    in_b, n_all, cost = _g_line(lens, idx, B, Sq, capacity, OVH)
    per = (gl.sum(cost, 0) + n_parts - 1) // n_parts
    packed = _g_packing(n_all, in_b, B, n_parts)
    n_b, bad, t0, t1, first_part, n_pieces, first_odd = _g_piece(lens, idx, cost, per, 0, 0, packed, b, Sq, capacity, OVH)
    if n_pieces > 1:
        if PDL:  # launched before the main kernel finished: wait for it (and its memory) here
            gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        rows = gl.program_id(1) * ROWS + gl.arange(0, ROWS, layout=LR)
        row_ok = rows < R
        cols = gl.arange(0, DN, layout=gl.SliceLayout(0, LO))
        srow = (2 * first_part + first_odd) * R + rows  # the first two pieces' rows, asked for beside the lse pass
        po = gl.load(part_o + (srow.to(gl.int64) * DN)[:, None] + cols[None, :], mask=row_ok[:, None], other=0.0)
        lk = gl.load(part_lse + srow, mask=row_ok, other=float("-inf"))
        srow = 2 * (first_part + 1) * R + rows
        po_next = gl.load(part_o + (srow.to(gl.int64) * DN)[:, None] + cols[None, :], mask=row_ok[:, None], other=0.0)
        lk_next = gl.load(part_lse + srow, mask=row_ok, other=float("-inf"))
        rows_l = gl.convert_layout(rows, gl.SliceLayout(1, LL))
        pcs = gl.arange(0, COMBINE_LSE, layout=gl.SliceLayout(0, LL))
        mx = gl.full([ROWS], -3.0e38, gl.float32, layout=gl.SliceLayout(1, LL))  # finite: a partial's lse is finite
        tot = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, LL))
        for c0 in range(0, n_pieces, COMBINE_LSE):
            k = c0 + pcs
            ok = (rows_l < R)[:, None] & (k < n_pieces)[None, :]
            lc = gl.load(part_lse + (2 * (first_part + k) + gl.where(k == 0, first_odd, 0))[None, :] * R + rows_l[:, None], mask=ok,
                         other=float("-inf"))
            m_new = gl.maximum(mx, gl.max(lc, 1))
            tot = tot * gl.exp2(mx - m_new) + gl.sum(gl.exp2(lc - m_new[:, None]), 1)
            mx = m_new
        mx = gl.convert_layout(mx, LR)
        tot = gl.convert_layout(tot, LR)
        acc = gl.zeros([ROWS, DN], gl.float32, layout=LO)
        for j in range(2, n_pieces + 2):
            w = gl.exp2(lk - mx)
            cur = po
            po = po_next
            lk = lk_next
            ok = row_ok & (j < n_pieces)  # piece j's loads go out before piece j - 2 is folded
            srow = 2 * (first_part + j) * R + rows
            po_next = gl.load(part_o + (srow.to(gl.int64) * DN)[:, None] + cols[None, :], mask=ok[:, None], other=0.0)
            lk_next = gl.load(part_lse + srow, mask=ok, other=float("-inf"))
            acc += w[:, None] * cur.to(gl.float32)
        poison = gl.where(bad, float("nan"), 0.0)
        tot = gl.where(row_ok, tot, 1.0)
        gl.store(o + ((b * R + rows).to(gl.int64) * DN)[:, None] + cols[None, :], (acc / tot[:, None] + poison).to(o.dtype.element_ty),
                 mask=row_ok[:, None])
        gl.store(lse + b * R + (rows % H) * Sq + rows // H, (mx + gl.log2(tot)) * 0.6931471805599453 + poison, mask=row_ok)
    elif PDL and (b == 0) & (gl.program_id(1) == 0):
        # the first program waits even for a whole sequence, so this kernel never ends before the main kernel (work
        # launched after it on the stream then follows both, whatever the batch)
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
