"""The Triton kernels: ``_mla_paged_fwd`` (the scheduler's prologue, the KV tile loop, the partial or direct
store and the fused merge) and ``_mla_paged_merge`` (MERGE "kernel")."""

import triton
import triton.language as tl

from .knobs import _NO_SPEC


@triton.jit
def _tile_rows(kv, table_b, page, k0, n_b, stride_kp, stride_ks, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
               HALF: tl.constexpr, DN: tl.constexpr, DR: tl.constexpr):
    """A KV tile by pointers: keys k0 .. k0 + BLOCK_N, read as 0 past the length. When a page
    holds whole tiles the tile's rows are page's slots k0 % PAGE ..; otherwise (pages smaller than
    a tile) each key's page is looked up in the table (that load is not pipelined: a slow path)."""
    offs_n = k0 + tl.arange(0, BLOCK_N)
    n_ok = offs_n < n_b
    if PAGE % BLOCK_N == 0:
        row = kv + page.to(tl.int64) * stride_kp + (k0 % PAGE + tl.arange(0, BLOCK_N)).to(tl.int64) * stride_ks
    else:
        pages = tl.load(table_b + offs_n // PAGE, mask=n_ok, other=0).to(tl.int64)
        row = kv + pages * stride_kp + (offs_n % PAGE).to(tl.int64) * stride_ks
    offs_h = tl.arange(0, HALF)
    kn0 = tl.load(row[:, None] + offs_h[None, :], mask=n_ok[:, None], other=0.0)
    kn1 = tl.load(row[:, None] + (HALF + offs_h)[None, :], mask=n_ok[:, None], other=0.0)
    kr = tl.load(row[:, None] + (DN + tl.arange(0, DR))[None, :], mask=n_ok[:, None], other=0.0)
    return kn0, kn1, kr


@triton.jit
def _page_of(pages, t_idx, i):
    """pages[i] (a chunk's page numbers held in registers): the tile loops read no table entry, so
    the pipeliner can issue a tile's loads stages ahead (a page number loaded inside the loop would
    hold them to one tile ahead)."""
    return tl.sum(tl.where(t_idx == i, pages, 0), 0)


@triton.jit
def _attend(qn0, qn1, qr, kn0, kn1, kr, offs_n, limit, m_i, l_i, acc0, acc1, qk_scale, live,
            BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, KEYS_AS_M: tl.constexpr, QK_SPLIT: tl.constexpr, VT: tl.constexpr):
    """One KV tile into the online softmax (log2 domain) of BLOCK_H rows: scores over the 576-wide
    keys, the same tile's first 512 columns as values (two 256-column halves)."""
    if QK_SPLIT:  # unchained score dots: the warpgroups split the score tile (mla_decode's QK_SPLIT)
        if KEYS_AS_M:
            qk = tl.trans(tl.dot(kr, qr) * qk_scale + tl.dot(kn0, qn0) * qk_scale + tl.dot(kn1, qn1) * qk_scale)
        else:
            qk = tl.dot(qr, tl.trans(kr)) * qk_scale + tl.dot(qn0, tl.trans(kn0)) * qk_scale + tl.dot(qn1, tl.trans(kn1)) * qk_scale
    else:
        if KEYS_AS_M:
            qk = tl.trans(tl.dot(kn1, qn1, tl.dot(kn0, qn0, tl.dot(kr, qr))))
        else:
            qk = tl.dot(qn1, tl.trans(kn1), tl.dot(qn0, tl.trans(kn0), tl.dot(qr, tl.trans(kr))))
        qk = qk * qk_scale
    qk = tl.where(offs_n[None, :] <= limit[:, None], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if VT:  # accumulators [256, BLOCK_H]: o^T += V^T P^T
        pt = tl.zeros([BLOCK_N, BLOCK_H], dtype=kn0.dtype)
        if live > 0:  # always taken: P and alpha reach the P V dots through the branch (QK_SPLIT's layout)
            pt = tl.trans(p.to(kn0.dtype))
            acc0 = acc0 * alpha[None, :]
            acc1 = acc1 * alpha[None, :]
        acc0 = tl.dot(tl.trans(kn0), pt, acc0)
        acc1 = tl.dot(tl.trans(kn1), pt, acc1)
    else:
        pb = p.to(kn0.dtype)
        acc0 = tl.dot(pb, kn0, acc0 * alpha[:, None])
        acc1 = tl.dot(pb, kn1, acc1 * alpha[:, None])
    return m_new, l_i, acc0, acc1


@triton.jit
def _store_rows(dst, row_base, acc0, acc1, scale_rows, poison, row_ok, HALF: tl.constexpr, VT: tl.constexpr):
    """Both accumulator halves, each row times ``scale_rows``, at dst + row_base[row] + column."""
    offs_h = tl.arange(0, HALF)
    if VT:
        ptr = dst + row_base[None, :] + offs_h[:, None]
        tl.store(ptr, (acc0 * scale_rows[None, :] + poison).to(dst.dtype.element_ty), mask=row_ok[None, :])
        tl.store(ptr + HALF, (acc1 * scale_rows[None, :] + poison).to(dst.dtype.element_ty), mask=row_ok[None, :])
    else:
        ptr = dst + row_base[:, None] + offs_h[None, :]
        tl.store(ptr, (acc0 * scale_rows[:, None] + poison).to(dst.dtype.element_ty), mask=row_ok[:, None])
        tl.store(ptr + HALF, (acc1 * scale_rows[:, None] + poison).to(dst.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _merge_rows(part_o, part_lse, o, lse, b, first_part, first_odd, n_pieces, rows, row_ok, s_idx, h_idx, R, Sq, poison,
                BLOCK_H: tl.constexpr, W: tl.constexpr, DN: tl.constexpr):
    """o and lse of these rows of sequence b from its n_pieces partials (slot of piece k: 2 * (first_part
    + k), plus first_odd for k = 0), by log-sum-exp weights; W value columns at a time."""
    mx = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    for k in range(0, n_pieces):
        slot = 2 * (first_part + k) + tl.where(k == 0, first_odd, 0)
        lk = tl.load(part_lse + slot.to(tl.int64) * R + rows, mask=row_ok, other=float("-inf"), cache_modifier=".cg")
        mx = tl.maximum(mx, lk)
    mx = tl.where(row_ok, mx, 0.0)  # finite for a real row: its first piece holds key 0
    tot = tl.zeros([BLOCK_H], dtype=tl.float32)
    for k in range(0, n_pieces):
        slot = 2 * (first_part + k) + tl.where(k == 0, first_odd, 0)
        tot += tl.exp2(tl.load(part_lse + slot.to(tl.int64) * R + rows, mask=row_ok, other=float("-inf"), cache_modifier=".cg") - mx)
    inv = 1.0 / tl.where(row_ok, tot, 1.0)
    cols = tl.arange(0, W)
    o_row = (b * R + rows.to(tl.int64)) * DN
    for c0 in tl.static_range(0, DN, W):
        acc = tl.zeros([BLOCK_H, W], dtype=tl.float32)
        for k in range(0, n_pieces):
            slot = 2 * (first_part + k) + tl.where(k == 0, first_odd, 0)
            p_row = slot.to(tl.int64) * R + rows
            w = tl.exp2(tl.load(part_lse + p_row, mask=row_ok, other=float("-inf"), cache_modifier=".cg") - mx)
            po = tl.load(part_o + p_row[:, None] * DN + c0 + cols[None, :], mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
            acc += w[:, None] * po.to(tl.float32)
        tl.store(o + o_row[:, None] + c0 + cols[None, :], (acc * inv[:, None] + poison).to(o.dtype.element_ty), mask=row_ok[:, None])
    tl.store(lse + b * R + h_idx.to(tl.int64) * Sq + s_idx, (mx + tl.log2(tl.where(row_ok, tot, 1.0))) * 0.6931471805599453 + poison, mask=row_ok)


@triton.jit(do_not_specialize=_NO_SPEC)
def _mla_paged_fwd(
    q, kv, table, lens, o, lse, part_o, part_lse, counters, meta,
    stride_qb, stride_qs, stride_qh, stride_kp, stride_ks, stride_tb,
    B, Sq, H, n_rows, max_pages, qk_scale,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr, KEYS_AS_M: tl.constexpr, VALUES_AS_M: tl.constexpr,
    QK_SPLIT: tl.constexpr, TMA: tl.constexpr, MERGE: tl.constexpr, OVERHEAD: tl.constexpr, B_P2: tl.constexpr,
    PAGE_CHUNK: tl.constexpr, MERGE_W: tl.constexpr, DN: tl.constexpr, DR: tl.constexpr, PDL: tl.constexpr,
):
    """Program (row block, part): the part's pieces of the work line, in sequence order (module
    doc). MERGE 1: partials for a merge kernel (and meta[b] = first part, pieces, first_odd, bad);
    2: the last piece of a split sequence merges."""
    HALF: tl.constexpr = DN // 2
    VT: tl.constexpr = VALUES_AS_M or QK_SPLIT
    if PDL >= 2:
        tl.extra.cuda.gdc_wait()
    if PDL >= 1:
        tl.extra.cuda.gdc_launch_dependents()
    pid_r = tl.program_id(0)
    part = tl.program_id(1)
    n_parts = tl.num_programs(1)
    R = Sq * H
    capacity = max_pages * PAGE

    # the work line: sequence b costs cdiv(len_b, BLOCK_N) tiles + OVERHEAD units; a lone sequence's fixed cost is
    # left out (every piece pays it alike), else the first part would hold little but it when a part's share is small
    ovh = tl.where(B > 1, OVERHEAD, 0)
    idx = tl.arange(0, B_P2)
    in_b = idx < B
    n_all = tl.load(lens + idx, mask=in_b, other=0)
    n_all = tl.where((n_all < Sq) | (n_all > capacity), Sq, n_all)
    cost = tl.where(in_b, (n_all + BLOCK_N - 1) // BLOCK_N + ovh, 0)
    ends = tl.cumsum(cost, 0)
    total = tl.sum(cost, 0)
    per = (total + n_parts - 1) // n_parts
    u0 = part * per
    u1 = tl.minimum(u0 + per, total)
    b_first = tl.sum((in_b & (ends <= u0)).to(tl.int32), 0)
    b_stop = tl.sum((in_b & (ends - cost < u1)).to(tl.int32), 0)

    rows = pid_r * BLOCK_H + tl.arange(0, BLOCK_H)
    row_ok = rows < R
    s_idx = rows // H
    h_idx = rows % H
    s_last = tl.minimum((pid_r + 1) * BLOCK_H - 1, R - 1) // H
    offs_h = tl.arange(0, HALF)
    offs_dr = tl.arange(0, DR)
    if TMA:
        kn_desc = tl.make_tensor_descriptor(kv, shape=[n_rows, DN + DR], strides=[stride_ks, 1], block_shape=[BLOCK_N, HALF])
        kr_desc = tl.make_tensor_descriptor(kv, shape=[n_rows, DN + DR], strides=[stride_ks, 1], block_shape=[BLOCK_N, DR])

    for b_i in range(b_first, b_stop):
        b = tl.cast(b_i, tl.int64)
        n_b = tl.load(lens + b)
        bad = (n_b < Sq) | (n_b > capacity)
        n_b = tl.where(bad, Sq, n_b)
        n_before = tl.load(lens + idx, mask=idx < b, other=0)  # reloaded (L1): nothing B-sized stays live in the loop
        n_before = tl.where((n_before < Sq) | (n_before > capacity), Sq, n_before)
        start_b = tl.sum(tl.where(idx < b, (n_before + BLOCK_N - 1) // BLOCK_N + ovh, 0), 0)
        tiles_b = (n_b + BLOCK_N - 1) // BLOCK_N
        t0 = tl.maximum(u0 - start_b - ovh, 0)
        t1 = tl.minimum(u1 - start_b - ovh, tiles_b)
        if t1 > t0:
            first_part = (start_b + ovh) // per
            n_pieces = (start_b + ovh + tiles_b - 1) // per - first_part + 1
            first_odd = (start_b > first_part * per).to(tl.int32)  # b's first piece is its part's second
            slot = 2 * part + tl.where(part == first_part, first_odd, 0)
            if MERGE == 1:
                if (part == first_part) & (pid_r == 0):
                    tl.store(meta + 4 * b, first_part)
                    tl.store(meta + 4 * b + 1, n_pieces)
                    tl.store(meta + 4 * b + 2, first_odd)
                    tl.store(meta + 4 * b + 3, bad.to(tl.int32))

            q_row = q + b * stride_qb + s_idx.to(tl.int64) * stride_qs + h_idx.to(tl.int64) * stride_qh
            if KEYS_AS_M:  # q^T halves [256, BLOCK_H] and [64, BLOCK_H]
                qn0 = tl.load(q_row[None, :] + offs_h[:, None], mask=row_ok[None, :], other=0.0)
                qn1 = tl.load(q_row[None, :] + (HALF + offs_h)[:, None], mask=row_ok[None, :], other=0.0)
                qr = tl.load(q_row[None, :] + (DN + offs_dr)[:, None], mask=row_ok[None, :], other=0.0)
            else:
                qn0 = tl.load(q_row[:, None] + offs_h[None, :], mask=row_ok[:, None], other=0.0)
                qn1 = tl.load(q_row[:, None] + (HALF + offs_h)[None, :], mask=row_ok[:, None], other=0.0)
                qr = tl.load(q_row[:, None] + (DN + offs_dr)[None, :], mask=row_ok[:, None], other=0.0)
            limit = s_idx + n_b - Sq  # row (s, h) sees keys j <= limit (< n_b)
            k_lo = t0 * BLOCK_N
            k_hi = tl.minimum(t1 * BLOCK_N, s_last + n_b - Sq + 1)
            table_b = table + b * stride_tb
            m_i = tl.full([BLOCK_H], -1.0e30, dtype=tl.float32)  # finite: a fully masked tile gives p = 0, alpha = 1
            l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
            if VT:
                acc0 = tl.zeros([HALF, BLOCK_H], dtype=tl.float32)
                acc1 = tl.zeros([HALF, BLOCK_H], dtype=tl.float32)
            else:
                acc0 = tl.zeros([BLOCK_H, HALF], dtype=tl.float32)
                acc1 = tl.zeros([BLOCK_H, HALF], dtype=tl.float32)
            whole = (n_b // BLOCK_N) * BLOCK_N  # keys in whole tiles: every row of such a tile is a key of b
            t_idx = tl.arange(0, PAGE_CHUNK)
            for c0 in range(k_lo, k_hi, PAGE_CHUNK * BLOCK_N):  # PAGE_CHUNK tiles at a time, their pages in registers
                c_hi = tl.minimum(c0 + PAGE_CHUNK * BLOCK_N, k_hi)
                pages = t_idx
                if PAGE % BLOCK_N == 0:
                    k_c = c0 + t_idx * BLOCK_N
                    pages = tl.load(table_b + k_c // PAGE, mask=k_c < c_hi, other=0)
                c_mid = c0
                if TMA:  # whole tiles by descriptors; the sequence's partial last tile by the masked pointer path
                    c_mid = tl.maximum(tl.minimum(c_hi, whole), c0)
                    for k0 in range(c0, c_mid, BLOCK_N):
                        row = _page_of(pages, t_idx, (k0 - c0) // BLOCK_N) * PAGE + k0 % PAGE
                        kn0 = kn_desc.load([row, 0])
                        kn1 = kn_desc.load([row, HALF])
                        kr = kr_desc.load([row, DN])
                        m_i, l_i, acc0, acc1 = _attend(qn0, qn1, qr, kn0, kn1, kr, k0 + tl.arange(0, BLOCK_N), limit, m_i, l_i, acc0, acc1,
                                                       qk_scale, B, BLOCK_H, BLOCK_N, KEYS_AS_M, QK_SPLIT, VT)
                for k0 in range(c_mid, c_hi, BLOCK_N):
                    page = _page_of(pages, t_idx, (k0 - c0) // BLOCK_N)
                    kn0, kn1, kr = _tile_rows(kv, table_b, page, k0, n_b, stride_kp, stride_ks, PAGE, BLOCK_N, HALF, DN, DR)
                    m_i, l_i, acc0, acc1 = _attend(qn0, qn1, qr, kn0, kn1, kr, k0 + tl.arange(0, BLOCK_N), limit, m_i, l_i, acc0, acc1,
                                                   qk_scale, B, BLOCK_H, BLOCK_N, KEYS_AS_M, QK_SPLIT, VT)

            has = l_i > 0.0
            inv_l = 1.0 / tl.where(has, l_i, 1.0)
            lse2 = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
            poison = tl.where(bad, float("nan"), 0.0)
            if n_pieces == 1:
                _store_rows(o, (b * R + rows.to(tl.int64)) * DN, acc0, acc1, inv_l, poison, row_ok, HALF, VT)
                tl.store(lse + b * R + h_idx.to(tl.int64) * Sq + s_idx, lse2 * 0.6931471805599453 + poison, mask=row_ok)
            else:
                p_row = slot.to(tl.int64) * R + rows
                _store_rows(part_o, p_row * DN, acc0, acc1, inv_l, 0.0, row_ok, HALF, VT)
                tl.store(part_lse + p_row, lse2, mask=row_ok)
                if MERGE == 2:
                    tl.debug_barrier()  # every thread's partial stores precede the release below
                    cnt = counters + b * tl.num_programs(0) + pid_r
                    ticket = tl.atomic_add(cnt, 1, sem="acq_rel")
                    if ticket == n_pieces - 1:  # the last piece of (b, row block): every partial is visible
                        _merge_rows(part_o, part_lse, o, lse, b, first_part, first_odd, n_pieces, rows, row_ok, s_idx, h_idx,
                                    R, Sq, poison, BLOCK_H, MERGE_W, DN)
                        tl.atomic_xchg(cnt, 0)  # for the next call (calls on one stream are ordered)


@triton.jit
def _mla_paged_merge(
    part_o, part_lse, o, lse, meta, Sq, H,
    BLOCK_V: tl.constexpr, CHUNK: tl.constexpr, DN: tl.constexpr, PDL: tl.constexpr,
):
    """MERGE "kernel": one program per (row, value slice, sequence); sequences in one piece were
    written by the main kernel and are skipped. One pass over the pieces, CHUNK at a time: a
    chunk's lse and partial rows are loaded together and folded in with a running max, so a
    sequence in up to CHUNK pieces costs one round trip to L2, not two per chunk."""
    if PDL >= 1:  # launched before the main kernel finished: wait for it (and its memory) here
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0)
    b = tl.program_id(2).to(tl.int64)
    R = Sq * H
    n_pieces = tl.load(meta + 4 * b + 1)
    if n_pieces > 1:
        first_part = tl.load(meta + 4 * b)
        first_odd = tl.load(meta + 4 * b + 2)
        poison = tl.where(tl.load(meta + 4 * b + 3) != 0, float("nan"), 0.0)
        offs_k = tl.arange(0, CHUNK)
        offs_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
        mx = tl.max(tl.full([CHUNK], -3.0e38, dtype=tl.float32), 0)  # finite: a partial's lse is finite (log2)
        tot = tl.sum(tl.zeros([CHUNK], dtype=tl.float32), 0)
        acc = tl.zeros([BLOCK_V], dtype=tl.float32)
        for k0 in range(0, n_pieces, CHUNK):
            k = k0 + offs_k
            slot = (2 * (first_part + k) + tl.where(k == 0, first_odd, 0)).to(tl.int64)
            lk = tl.load(part_lse + slot * R + row, mask=k < n_pieces, other=float("-inf"))
            po = tl.load(part_o + (slot * R + row)[:, None] * DN + offs_v[None, :], mask=(k < n_pieces)[:, None], other=0.0)
            m_new = tl.maximum(mx, tl.max(lk, 0))
            fold = tl.exp2(mx - m_new)
            w = tl.exp2(lk - m_new)
            tot = tot * fold + tl.sum(w, 0)
            acc = acc * fold + tl.sum(w[:, None] * po.to(tl.float32), 0)
            mx = m_new
        tl.store(o + (b * R + row) * DN + offs_v, (acc / tot + poison).to(o.dtype.element_ty))
        if tl.program_id(1) == 0:
            tl.store(lse + b * R + (row % H) * Sq + row // H, (mx + tl.log2(tot)) * 0.6931471805599453 + poison)
