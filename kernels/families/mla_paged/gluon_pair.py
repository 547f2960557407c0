"""ENGINE "gluon" with PAIR 1 (``_mla_paged_pair``): FlashMLA's sm90 schedule. Two warpgroups, no loader warp; tiles
go in pairs (t, t + 1), t in ring stage 0 and t + 1 in stage 1. Warpgroup 0 scores t, warpgroup 1 scores t + 1 on
t's running max, and each folds both tiles into its half of O (warpgroup 0 columns 0-255, warpgroup 1 256-511): its
own P from registers, the other's from shared memory. So one warpgroup's softmax runs while the other's products
keep the tensor cores busy, which the loader form (``gluon_ws.py``: one warpgroup scores every tile) cannot do.

Each half of a tile has its own ready barrier and is refilled by the warpgroup that reads it last, the moment its
product is done: warpgroup 0 the first 256 latent columns (only it folds them), warpgroup 1 the other 256 and the
rope. The score products take a tile half by half, the half that comes back first first. (Nine 64-column boxes, as
FlashMLA copies them, were slower here: each box's expect and copy carry two barriers across the warpgroup that
Triton inserts; H200, B32 Sq4 249.2 against 242.5 us. Nor did nine boxes issued by a loader warp help: 238.1
against 232.7.)

The hand-overs between the warpgroups (t's max, t + 1's max, each P) are named barriers, ``bar.arrive`` by the
128 threads that publish and ``bar.sync`` by the 128 that wait, as FlashMLA's are. An mbarrier arrival is one
thread's, so Triton puts a barrier across the warpgroup in front of each; the barriers that remain are the copies'
and the waits'. Each mbarrier and each max buffer is an allocation of its own, since Triton's membar pass takes an
allocation as one buffer. The softmax's scale is folded into the exponent (one FFMA a score), and only a piece's
last pair can hold a partial tile, so only it zeroes rows (H200, B32 Sq4: 232.7 us against 239.5 before these three).

Where P goes: warpgroup 0's (tile t, rescaled to t + 1's max) over stage 0's rope box, which nobody reads once t is
scored; warpgroup 1's in a buffer of its own. Shared memory: q 72 KB, two 72 KB stages, P 8 KB.

Ends of a piece: a pair whose second tile is past the piece's last runs with that tile masked (no key past the
piece is seen; values past the sequence's length zeroed), and tiles past the end are loaded from the piece's last
page, so every barrier completes once a pair and no product is branched around (an accumulator in flight across a
branch makes ptxas serialise the products). The host uses it only where every program gets one long piece
(``PAIR_FROM_ROWS``; H200, session 37: B32 Sq4 239.7 us against the loader form's 257.8, FlashMLA 215.5; slower at
B1 Sq4, B64 and B128, where pieces are short or memory bounds the loop)."""

import triton.experimental.gluon as gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .gluon_merge import _g_grid_merge
from .gluon_ws import HALF_G, KEYS_G, ROWS_G, _g_device_descriptors, _g_piece, _g_schedule, _g_store_half, _g_store_staged, _g_zero_rows_past

# O's reference max lags the running max: a row's moves only when its scores pass it by more than LAG_G (log2 units),
# so P stays below 2^LAG_G and in most pairs no row's moves. A warp where none moved skips the 128 multiplies a thread
# that rescale O (``_p_rescale``: a vote over the warp, one branch over all of a thread's O), which sat between each
# warpgroup's softmax and its product (H200, B32 Sq4: 218.6 us against 221.8, FlashMLA 215.5).
LAG_G = gl.constexpr(8.0)


def _rescale_asm(n):
    """PTX for n values of O times their row's scale, skipped by a warp whose flag (the last operand) is 0, and its
    constraints: outputs $0.., then O, the scales and the flags."""
    body = [f"mov.f32 ${i}, ${n + i};" for i in range(n)] + ["@!p bra.uni SKIP;"]
    body += [f"mul.f32 ${i}, ${i}, ${2 * n + i};" for i in range(n)]
    asm = " ".join(["{ .reg .pred p;", f"setp.ne.b32 p, ${3 * n}, 0;", *body, "SKIP: }"])
    return asm, ",".join(["=f"] * n + ["f"] * (2 * n) + ["r"] * n)


RESCALE_PACK = gl.constexpr(128)  # all of a thread's O, one branch (four of 32 values: 222.9 us against 220.5)
_RESCALE_PTX = _rescale_asm(RESCALE_PACK.value)
RESCALE_ASM = gl.constexpr(_RESCALE_PTX[0])
RESCALE_CONSTRAINTS = gl.constexpr(_RESCALE_PTX[1])


@gluon.jit
def _p_named(ASM: gl.constexpr):
    """A named-barrier instruction of all 128 threads of a warpgroup (bar.arrive / bar.sync ID, 256): the hand-over
    between the two warpgroups, with no partition barrier in front of it (an mbarrier arrive is one thread's). IDs 8-11
    (m0, m1, p0, p1); Triton's own take 0-2. Each is used once a pair in a fixed order (m0, m1, p0, p1 each wait on
    the one before), so a warpgroup never arrives twice on one before the other has waited."""
    gl.inline_asm_elementwise(ASM + " // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _p_rescale(acc, scale, moved, LO: gl.constexpr):
    """O [64, 256] times ``scale`` by rows, where ``moved`` (rows whose reference moved; elsewhere scale is 1): a
    warp where no row moved skips the multiplies (a vote over the warp, then a branch all its lanes take alike)."""
    flag = gl.inline_asm_elementwise(
        "{ .reg .pred p, q; setp.ne.b32 p, $2, 0; setp.ne.b32 q, $3, 0; or.pred p, p, q; "
        "vote.sync.any.pred p, p, 0xffffffff; selp.b32 $0, 1, 0, p; mov.b32 $1, $0; }",
        "=r,=r,r,r", [moved.to(gl.int32)], dtype=gl.int32, is_pure=True, pack=2)
    rows: gl.constexpr = gl.SliceLayout(1, LO)
    return gl.inline_asm_elementwise(RESCALE_ASM, RESCALE_CONSTRAINTS,
                                     [acc, gl.convert_layout(scale, rows)[:, None], gl.convert_layout(flag, rows)[:, None]],
                                     dtype=gl.float32, is_pure=True, pack=RESCALE_PACK)


@gluon.jit
def _p_row(table, b, stride_tb, u, t1, PAGE: gl.constexpr):
    """The cache row where tile u of sequence b starts (the piece's last tile's, where u is past it)."""
    u = gl.minimum(u, t1 - 1)
    page = gl.load(table + b * stride_tb + (u * KEYS_G) // PAGE)
    return page * PAGE + (u * KEYS_G) % PAGE


@gluon.jit
def _p_issue(kv_n, kv_r, k_s, r_s, ready, row, st: gl.constexpr, HALF: gl.constexpr):
    """Half HALF of the tile at cache row ``row`` into ring stage st, on its own ready barrier: 0 the first 256
    latent columns (warpgroup 0 reads them last), 1 the other 256 and the rope (warpgroup 1 does)."""
    bar = ready[2 * st + HALF]
    if HALF == 0:
        mbarrier.expect(bar, kv_n.block_type.nbytes)
        tma.async_copy_global_to_shared(kv_n, [row, 0], bar, k_s.index(2 * st))
    else:
        mbarrier.expect(bar, kv_n.block_type.nbytes + kv_r.block_type.nbytes)
        tma.async_copy_global_to_shared(kv_n, [row, HALF_G], bar, k_s.index(2 * st + 1))
        tma.async_copy_global_to_shared(kv_r, [row, 2 * HALF_G], bar, r_s.index(st))


@gluon.jit
def _p_qk(q_s, k_s, r_s, ready, st: gl.constexpr, g, s, HALF: gl.constexpr, FRESH: gl.constexpr):
    """Issue the score product of half HALF of stage st's tile for pair g once it has arrived (FRESH: it starts the
    accumulator)."""
    mbarrier.wait(ready[2 * st + HALF], g & 1)
    z = g >> 30  # 0, but not known to be: the operands' descriptors are made where they are used, not all held in
    # registers across the loop (held, they spilled)
    if HALF == 0:
        s = warpgroup_mma(q_s.index(z), k_s.index(2 * st + z).permute((1, 0)), s, use_acc=not FRESH, is_async=True)
    else:
        s = warpgroup_mma(q_s.index(1 + z), k_s.index(2 * st + 1 + z).permute((1, 0)), s, use_acc=not FRESH,
                          is_async=True)
        s = warpgroup_mma(r_s.index(2 + z), r_s.index(st + z).permute((1, 0)), s, is_async=True)
    return s


@gluon.jit
def _p_pair0(q_s, k_s, r_s, p_s, mx_s, ready, kv_n, kv_r, table, b, stride_tb, s, acc, m_i, l_i, t, t1, n_b, g,
             qk_scale, keys, limit, open_below, PAGE: gl.constexpr, NEXT: gl.constexpr, MASK: gl.constexpr):
    """Warpgroup 0's share of the pair (t, t + 1), its scores of t in ``s``: softmax, its own half of P V, P
    rescaled to t + 1's max for warpgroup 1, warpgroup 1's P against its half, and (NEXT) the next pair's loads of
    its boxes and the scores of t + 2. Returns those scores, O, the max and the sum."""
    LS: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    LO: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    LP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=LO, k_width=2)
    if NEXT:  # the page numbers first: their loads run beside the softmax
        row2 = _p_row(table, b, stride_tb, t + 2, t1, PAGE)
        row3 = _p_row(table, b, stride_tb, t + 3, t1, PAGE)
    x = s
    if MASK:  # a pair that may reach the causal edge or the piece's end (``_p_wg`` runs the others without the test)
        if (t + 1) * KEYS_G > open_below:  # a key some row must not see
            x = gl.where(t * KEYS_G + keys[None, :] <= limit[:, None], x, float("-inf"))
    top = gl.max(x, 1) * qk_scale  # qk_scale > 0
    moved = top > m_i + LAG_G  # m_i: O's reference (``LAG_G``)
    m_a = gl.where(moved, top, m_i)
    mx_s[0].store(m_a)
    _p_named("bar.arrive 8, 256;")  # m0
    p = gl.exp2(x * qk_scale - m_a[:, None])
    alpha = gl.where(moved, gl.exp2(m_i - m_a), 1.0)
    if not NEXT and (t + 1) * KEYS_G > n_b:  # a partial tile: rows past the length hold anything
        _g_zero_rows_past(k_s.index(0), n_b - t * KEYS_G)
    acc = _p_rescale(acc, alpha, moved, LO)
    acc = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), LP), k_s.index(0), acc, is_async=True)
    # the row sum (shuffles across four lanes) once the product is issued: taken before, it sat in front of the
    # rescale's branch, which ptxas moves nothing across (H200, B32 Sq4: ~3 us a call, results/h200-2026-12-04e)
    l_i = l_i * alpha + gl.sum(p, 1)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    if NEXT:  # boxes 0-3 of stage 0 are read by nobody else
        _p_issue(kv_n, kv_r, k_s, r_s, ready, row2, 0, 0)
    _p_named("bar.sync 9, 256;")  # m1
    m_b = mx_s[1].load(gl.SliceLayout(1, LS))
    moved = m_b != m_a
    scale = gl.where(moved, gl.exp2(m_a - m_b), 1.0)
    r_s.index(0).store((p * scale[:, None]).to(gl.bfloat16))  # over t's rope box: t is scored
    fence_async_shared()
    _p_named("bar.arrive 10, 256;")  # p0
    l_i = l_i * scale
    if not NEXT and (t + 2) * KEYS_G > n_b:  # t + 1 partial or past the piece: warpgroup 1 has scored it
        _g_zero_rows_past(k_s.index(2), n_b - (t + 1) * KEYS_G)
    acc = _p_rescale(acc, scale, moved, LO)
    _p_named("bar.sync 11, 256;")  # p1
    acc = warpgroup_mma(p_s, k_s.index(2), acc, is_async=True)
    if NEXT:
        s = _p_qk(q_s, k_s, r_s, ready, 0, g + 1, s, 0, True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        _p_issue(kv_n, kv_r, k_s, r_s, ready, row3, 1, 0)
        s = _p_qk(q_s, k_s, r_s, ready, 0, g + 1, s, 1, False)
        s, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s, acc))
    else:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    return s, acc, m_b, l_i


@gluon.jit
def _p_pair1(q_s, k_s, r_s, p_s, mx_s, ready, kv_n, kv_r, table, b, stride_tb, s, acc, m_i, l_i, t, t1, n_b, g,
             qk_scale, keys, limit, open_below, PAGE: gl.constexpr, NEXT: gl.constexpr, MASK: gl.constexpr):
    """Warpgroup 1's share of the pair (t, t + 1), its scores of t + 1 in ``s``: softmax on t's max, its P for
    warpgroup 0, both tiles against its half of the values, then (NEXT) its boxes of the next pair and the scores of
    t + 3."""
    LS: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    LO: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    LP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=LO, k_width=2)
    if NEXT:
        row2 = _p_row(table, b, stride_tb, t + 2, t1, PAGE)
        row3 = _p_row(table, b, stride_tb, t + 3, t1, PAGE)
    x = s
    if MASK:
        if (t + 2) * KEYS_G > open_below:
            x = gl.where((t + 1) * KEYS_G + keys[None, :] <= limit[:, None], x, float("-inf"))
    top = gl.max(x, 1) * qk_scale
    _p_named("bar.sync 8, 256;")  # m0
    m_a = mx_s[0].load(gl.SliceLayout(1, LS))
    m_b = gl.where(top > m_a + LAG_G, top, m_a)
    mx_s[1].store(m_b)
    _p_named("bar.arrive 9, 256;")  # m1
    p = gl.exp2(x * qk_scale - m_b[:, None])
    moved = m_b != m_i
    alpha = gl.where(moved, gl.exp2(m_i - m_b), 1.0)
    p16 = p.to(gl.bfloat16)
    p_s.store(p16)  # warpgroup 0's product on the last P is done: it passed the last pair before arriving m0
    if not NEXT and (t + 2) * KEYS_G > n_b:
        _g_zero_rows_past(k_s.index(3), n_b - (t + 1) * KEYS_G)
    if not NEXT and (t + 1) * KEYS_G > n_b:  # warpgroup 0 has scored t (it arrived m0)
        _g_zero_rows_past(k_s.index(1), n_b - t * KEYS_G)
    fence_async_shared()
    acc = _p_rescale(acc, alpha, moved, LO)
    acc = warpgroup_mma(gl.convert_layout(p16, LP), k_s.index(3), acc, is_async=True)
    l_i = l_i * alpha + gl.sum(p, 1)  # once the product is issued, as in ``_p_pair0``
    _p_named("bar.sync 10, 256;")  # p0
    acc = warpgroup_mma(r_s.index(0), k_s.index(1), acc, is_async=True)
    _p_named("bar.arrive 11, 256;")  # p1
    if NEXT:
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        _p_issue(kv_n, kv_r, k_s, r_s, ready, row3, 1, 1)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        _p_issue(kv_n, kv_r, k_s, r_s, ready, row2, 0, 1)  # P0 read: the rope box is free
        s = _p_qk(q_s, k_s, r_s, ready, 1, g + 1, s, 1, True)
        s = _p_qk(q_s, k_s, r_s, ready, 1, g + 1, s, 0, False)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    else:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    return s, acc, m_b, l_i


@gluon.jit
def _p_pair(ME: gl.constexpr, q_s, k_s, r_s, p_s, mx_s, ready, kv_n, kv_r, table, b, stride_tb, s, acc, m_i, l_i, t, t1, n_b,
            g, qk_scale, keys, limit, open_below, PAGE: gl.constexpr, NEXT: gl.constexpr, MASK: gl.constexpr):
    """Warpgroup ME's share of the pair (t, t + 1): ``_p_pair0`` or ``_p_pair1``, which take the same arguments."""
    if ME == 0:
        s, acc, m_i, l_i = _p_pair0(q_s, k_s, r_s, p_s, mx_s, ready, kv_n, kv_r, table, b, stride_tb, s, acc, m_i, l_i, t, t1,
                                    n_b, g, qk_scale, keys, limit, open_below, PAGE, NEXT, MASK)
    else:
        s, acc, m_i, l_i = _p_pair1(q_s, k_s, r_s, p_s, mx_s, ready, kv_n, kv_r, table, b, stride_tb, s, acc, m_i, l_i, t, t1,
                                    n_b, g, qk_scale, keys, limit, open_below, PAGE, NEXT, MASK)
    return s, acc, m_i, l_i


@gluon.jit
def _p_wg(ME: gl.constexpr, q_n, q_r, kv_n, kv_r, table, stride_tb, q_s, k_s, r_s, p_s, mx_s, l_s, ready, bars, o, lse, part_o,
          part_lse, meta, sync, lens, B, Sq, H, R, capacity, qk_scale, PAGE: gl.constexpr, OVH: gl.constexpr,
          B_P2: gl.constexpr, DN: gl.constexpr, GRID: gl.constexpr, PDL: gl.constexpr):
    """Warpgroup ME (a partition of ``_mla_paged_pair``) over the program's pieces: a piece's first loads (warpgroup 0
    also q), its scores of the first pair, the pairs, then the sums exchanged and its half of the rows written."""
    q_ready, l0_bar, l1_bar = bars
    LS: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    LO: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    LR: gl.constexpr = gl.SliceLayout(1, LS)
    idx, cost, per, u0, u1, b_first, b_stop, k = _g_schedule(lens, B, Sq, capacity, OVH, B_P2, 4)
    rows = gl.program_id(0) * ROWS_G + gl.arange(0, ROWS_G, layout=LR)
    keys = gl.arange(0, KEYS_G, layout=gl.SliceLayout(0, LS))
    g = 0  # pairs so far: every barrier of the ring and of the hand-over completes once a pair
    pc = 0
    for b in range(b_first, b_stop):
        n_b, bad, t0, t1, first_part, n_pieces, first_odd = _g_piece(lens, idx, cost, per, u0, u1, k, b, Sq, capacity, OVH)
        if t1 > t0:
            # both warpgroups passed the last piece's exchange of sums: every box and q are free
            if ME == 0:
                q_bytes: gl.constexpr = 2 * q_n.block_type.nbytes + q_r.block_type.nbytes
                mbarrier.expect(q_ready, q_bytes)
                row = b * R + gl.program_id(0) * ROWS_G
                tma.async_copy_global_to_shared(q_n, [row, 0], q_ready, q_s.index(0))
                tma.async_copy_global_to_shared(q_n, [row, HALF_G], q_ready, q_s.index(1))
                tma.async_copy_global_to_shared(q_r, [row, 2 * HALF_G], q_ready, r_s.index(2))
                _p_issue(kv_n, kv_r, k_s, r_s, ready, _p_row(table, b, stride_tb, t0, t1, PAGE), 0, 0)
                _p_issue(kv_n, kv_r, k_s, r_s, ready, _p_row(table, b, stride_tb, t0 + 1, t1, PAGE), 1, 0)
                if (gl.program_id(1) == first_part) & (gl.program_id(0) == 0):  # the merge kernel's record of b
                    gl.store(meta + 4 * b, first_part)
                    gl.store(meta + 4 * b + 1, n_pieces)
                    gl.store(meta + 4 * b + 2, first_odd)
                    gl.store(meta + 4 * b + 3, bad.to(gl.int32))
            else:
                _p_issue(kv_n, kv_r, k_s, r_s, ready, _p_row(table, b, stride_tb, t0, t1, PAGE), 0, 1)
                _p_issue(kv_n, kv_r, k_s, r_s, ready, _p_row(table, b, stride_tb, t0 + 1, t1, PAGE), 1, 1)
            # row (s, h) sees keys j <= s + len - Sq, and none past the piece (a pair's second tile may lie past it)
            limit = gl.minimum(rows // H + n_b - Sq, t1 * KEYS_G - 1)
            open_below = gl.minimum((gl.program_id(0) * ROWS_G) // H + n_b - Sq + 1, t1 * KEYS_G)  # below: no mask
            m_i = gl.full([ROWS_G], -1.0e30, gl.float32, layout=LR)  # finite: a masked tile gives p = 0
            l_i = gl.zeros([ROWS_G], gl.float32, layout=LR)
            acc = gl.zeros([ROWS_G, HALF_G], gl.float32, layout=LO)
            s = gl.zeros([ROWS_G, KEYS_G], gl.float32, layout=LS)
            mbarrier.wait(q_ready, pc & 1)
            if ME == 0:
                s = _p_qk(q_s, k_s, r_s, ready, 0, g, s, 0, True)
                s = _p_qk(q_s, k_s, r_s, ready, 0, g, s, 1, False)
            else:
                s = _p_qk(q_s, k_s, r_s, ready, 1, g, s, 1, True)
                s = _p_qk(q_s, k_s, r_s, ready, 1, g, s, 0, False)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            # pairs (t, t + 1) whose keys every row sees run without the mask's test: its compare and select
            # sat before each warpgroup's max, which the other warpgroup waits for; then those that may reach the
            # causal edge or the piece's end (in decode, at most one before the last pair)
            t_last = t0 + 2 * ((t1 - t0 - 1) // 2)
            t_mask = gl.minimum(t0 + 2 * ((gl.maximum(open_below // KEYS_G - 1 - t0, 0) + 1) // 2), t_last)
            for t in range(t0, t_mask, 2):
                s, acc, m_i, l_i = _p_pair(ME, q_s, k_s, r_s, p_s, mx_s, ready, kv_n, kv_r, table, b, stride_tb, s, acc, m_i,
                                           l_i, t, t1, n_b, g, qk_scale, keys, limit, open_below, PAGE, True, False)
                g += 1
            for t in range(t_mask, t_last, 2):
                s, acc, m_i, l_i = _p_pair(ME, q_s, k_s, r_s, p_s, mx_s, ready, kv_n, kv_r, table, b, stride_tb, s, acc, m_i,
                                           l_i, t, t1, n_b, g, qk_scale, keys, limit, open_below, PAGE, True, True)
                g += 1
            s, acc, m_i, l_i = _p_pair(ME, q_s, k_s, r_s, p_s, mx_s, ready, kv_n, kv_r, table, b, stride_tb, s, acc, m_i, l_i,
                                       t_last, t1, n_b, g, qk_scale, keys, limit, open_below, PAGE, False, True)
            g += 1
            buf = 2 * (pc % 2)  # both sums are relative to the pair's last max
            l_s.index(buf + ME).store(l_i)
            if ME == 0:
                mbarrier.arrive(l0_bar, count=1)
                mbarrier.wait(l1_bar, pc & 1)
            else:
                mbarrier.arrive(l1_bar, count=1)
                mbarrier.wait(l0_bar, pc & 1)
            l_all = l_i + l_s.index(buf + 1 - ME).load(LR)
            pc += 1
            # through shared memory in whole rows: o, and bfloat16 partials
            if part_o.dtype.element_ty == gl.bfloat16:
                _g_store_staged(o, lse, part_o, part_lse, acc, l_all, m_i, k_s.index(ME), LO, ME * HALF_G, b, bad, R, Sq, H,
                                first_part, n_pieces, first_odd, ME == 0, DN)
            elif n_pieces == 1:
                _g_store_staged(o, lse, part_o, part_lse, acc, l_all, m_i, k_s.index(ME), LO, ME * HALF_G, b, bad, R, Sq, H,
                                first_part, n_pieces, first_odd, ME == 0, DN, True)
            else:
                _g_store_half(o, lse, part_o, part_lse, acc, l_all, m_i, LO, ME * HALF_G, b, bad, R, Sq, H, first_part,
                              n_pieces, first_odd, ME == 0, DN)
    if PDL:
        if ME == 0:
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    if GRID:  # the split rows, merged here (gluon_merge.py)
        _g_grid_merge(part_o, part_lse, o, lse, meta, sync, B, Sq, H, R, ME * HALF_G, k, ME == 0, DN, B_P2)


@gluon.jit
def _p_bar():
    """An mbarrier in an allocation of its own: Triton's membar pass takes an allocation as one buffer, so barriers
    sharing one would order every wait and arrival on any of them behind a partition barrier."""
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    return bar


@gluon.jit
def _mla_paged_pair(q_n, q_r, kv_n, kv_r, table, lens, o, lse, part_o, part_lse, meta, sync, stride_tb, B, Sq, H, capacity,
                    qk_scale, n_q_rows, n_kv_rows, PAGE: gl.constexpr, OVH: gl.constexpr, B_P2: gl.constexpr,
                    DN: gl.constexpr, DEVICE_DESC: gl.constexpr, GRID_MERGE: gl.constexpr, PDL: gl.constexpr):
    """ENGINE "gluon", PAIR 1: grid (row blocks, parts) as ``_mla_paged_ws``, the same arguments; warpgroup 0 (here)
    and warpgroup 1."""
    if DEVICE_DESC:
        q_n, q_r, kv_n, kv_r = _g_device_descriptors(q_n, q_r, kv_n, kv_r, n_q_rows, n_kv_rows, DN)
    R = Sq * H
    q_s = gl.allocate_shared_memory(gl.bfloat16, [2, ROWS_G, HALF_G], q_n.layout)
    k_s = gl.allocate_shared_memory(gl.bfloat16, [4, KEYS_G, HALF_G], kv_n.layout)  # stage, then latent half
    r_s = gl.allocate_shared_memory(gl.bfloat16, [3, KEYS_G, 64], kv_r.layout)  # the stages' rope, then q's
    p_s = gl.allocate_shared_memory(gl.bfloat16, [ROWS_G, KEYS_G], kv_r.layout)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    mx_s = (gl.allocate_shared_memory(gl.float32, [ROWS_G], flat), gl.allocate_shared_memory(gl.float32, [ROWS_G], flat))  # t's max, t + 1's
    l_s = gl.allocate_shared_memory(gl.float32, [4, ROWS_G], flat)
    ready = (_p_bar(), _p_bar(), _p_bar(), _p_bar())  # stage, then half
    bars = (_p_bar(), _p_bar(), _p_bar())  # q ready, the sums of warpgroups 0 and 1
    fence_async_shared()
    gl.warp_specialize([
        (_p_wg, (0, q_n, q_r, kv_n, kv_r, table, stride_tb, q_s, k_s, r_s, p_s, mx_s, l_s, ready, bars, o, lse, part_o,
                 part_lse, meta, sync, lens, B, Sq, H, R, capacity, qk_scale, PAGE, OVH, B_P2, DN, GRID_MERGE, PDL)),
        (_p_wg, (1, q_n, q_r, kv_n, kv_r, table, stride_tb, q_s, k_s, r_s, p_s, mx_s, l_s, ready, bars, o, lse, part_o,
                 part_lse, meta, sync, lens, B, Sq, H, R, capacity, qk_scale, PAGE, OVH, B_P2, DN, GRID_MERGE, PDL)),
    ], [4], [240])
