"""MLA decode / MTP on a paged latent cache: split-KV over pages, balanced by tokens, with a
scheduler computed on the device and a merge that needs no extra pass when few sequences split.

    kernel(q, kv_cache, block_table, cache_seqlens, scale) -> (o, lse)

q [B, Sq, H, 576] (512 latent + 64 rope), kv_cache [num_pages, page_size, 576] (the whole row is
the key, its first 512 columns the value), block_table [B, max_pages] int32, cache_seqlens [B]
int32. Query s of sequence b sees keys j <= s + len_b - Sq. o [B, Sq, H, 512] in q's dtype, lse
[B, H, Sq] float32 (natural log).

Rows. A sequence's Sq * H (query, head) pairs are its rows, s * H + h; BLOCK_H of them (every
query of a head group when H < BLOCK_H) are the M of every dot, so each KV tile brought into
shared memory serves all of them. Row blocks are the fastest grid axis, and every row block gets
the same share of the keys: the programs reading one KV tile run side by side and only the first
goes to DRAM.

Scheduler (FlashMLA's tile scheduler as the model; ``_mla_paged_fwd``'s prologue). The grid is
(row blocks, PARTS), PARTS = WAVES * SMs / row blocks: one wave. Every program reads the lengths
and lays the batch out as a line of work units: sequence b costs cdiv(len_b, BLOCK_N) tiles plus
OVERHEAD units (a piece's fixed cost: its q, its output, its share of a merge), in batch order (the Triton
kernel leaves a lone sequence's out: every piece pays it alike).
Part p takes units [p * per, (p + 1) * per), per = cdiv(total, PARTS): work is balanced by
tokens, not by sequences, so one 32k-token sequence among 512-token ones is cut into as many
pieces as it needs, and short sequences share a part. Nothing is launched or synchronised for it;
each program spends a few hundred cycles on prefix sums over the lengths.

Pieces and merge. A part's range covers pieces of consecutive sequences; only its first and last
piece can belong to a sequence that other parts also work on. A sequence in one piece is written
to o directly. A split sequence's pieces write partials (o normalised by its own sum, and lse in
log2) to slot 2p (the part's first piece) or 2p + 1 (its second), and are merged by log-sum-exp
weights: MERGE "fused": the last piece to arrive (an acq_rel ticket on a per-(sequence, row
block) counter, reset by that merger) merges them from L2 in the same launch; nothing waits, so
nothing can deadlock. MERGE "kernel": a second launch merges (one program per row and value
slice), with programmatic dependent launch (PDL) so that its launch overlaps the first's tail.
"auto": fused when B * 4 >= PARTS (few pieces per sequence: B >= 64 at H 64), else the kernel.

KV tiles. KV_LOAD "pointer": each key's row found through the block table (page = table[b, j //
page_size], slot j % page_size), masked past the length (NaN in an unused slot never reaches a
sum). "tma": when BLOCK_N divides the page size a tile lies in one page and is one contiguous
[BLOCK_N, 576] box: loaded by tensor descriptors (two 256-column latent boxes and the rope box);
a sequence's partial last tile, whose rows past the length may hold anything, goes through the
masked pointer path. QK_SPLIT (8 warps): the score dots unchained so the two warpgroups split the
score tile (see mla_decode's QK_SPLIT); P V then as O^T = V^T P^T.

ENGINE "gluon" (Hopper, bf16, q and the cache contiguous and 16-byte aligned, Sq * H % 64 == 0, pages of 64k tokens,
not CONFIG "auto"'s narrow regime;
else the Triton kernel above): FlashMLA's split of the work, warp-specialised (``_mla_paged_ws``), on the same
scheduler, except that equal lengths at 2 <= B <= parts are packed as FlashMLA packs them (each sequence in equal
pieces, one a part: B32 Sq4 needs no merge), and the merge kernel. A loader warp brings a piece's q once and each 64-key tile's three TMA boxes into a ring
of two; warpgroup 0 computes the whole score tile, the online softmax, P and the rows' factor into shared memory and
O[:, :256] (P from registers); warpgroup 1 O[:, 256:]. No score reduction crosses warpgroups (QK_SPLIT's does, every tile), and
warpgroup 1's product of a tile runs while warpgroup 0 scores the next (kernels/notes/mla-paged/README.md). GRID_MERGE (``gluon_merge.py``): the
split rows merged at the end of the main kernel, after a barrier across the grid (a cooperative launch, every
program resident), instead of by the merge kernel: 1 where the batch has at most GRID_MERGE_ROWS rows, 2 always.
MERGE_ROWS 4 or 8 (``combine.py``, where the batch's rows fill the GPU): the merge kernel shaped as FlashMLA's combine,
a warp a row, each program finding its sequence's pieces from the lengths before it waits for the main kernel.

Lengths. Shapes, dtypes and devices are checked on every call; the lengths on the host when they
are there (the CPU), on a GPU on the first call of each shape (one synchronisation). A later call
with a length outside [Sq, max_pages * page_size] reads nothing outside its table: the kernel
clamps it and writes NaN for that sequence.

Host path. Everything that depends only on the shapes, strides and dtypes (tile config, grid,
constexprs, scratch buffers) is planned once; a call makes o and lse and launches (one launch with
the fused merge). LAUNCH "direct": after the first call of a plan has compiled through Triton's
JIT entry, later calls call the cached compiled kernel's launcher directly, skipping the JIT's
argument binding and specialisation (most of a launch's host time) and the launch hooks; a call whose pointers are not 16-byte
aligned (the compiled kernel assumes what the first call's were) goes through the JIT again.
"""

import functools
import math
import torch
import triton
import triton.experimental.gluon as gluon
import triton.language as tl
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor


# -- knobs.py ----------------------------------------------------------------------------------------------------------
# The knobs and their choices (the package docstring says what each does), CONFIG "auto"'s regimes, and the
# constants the kernels and the host share.

# kopt:knobs-begin
KNOBS = {'CONFIG': 'auto', 'BLOCK_H': 64, 'BLOCK_N': 64, 'KEYS_AS_M': False, 'VALUES_AS_M': False, 'QK_SPLIT': True, 'num_warps': 8, 'num_stages': 2, 'KV_LOAD': 'tma', 'OVERHEAD': 4, 'WAVES': 1, 'MERGE': 'auto', 'PARTIAL_DTYPE': 'auto', 'PDL': 1, 'LAUNCH': 'direct', 'ENGINE': 'gluon', 'TMA_DESC': 'host', 'GRID_MERGE': 1, 'GLUON_PDL': 1, 'PAIR': 1, 'MERGE_ROWS': 8}
# kopt:knobs-end
SPACE = {
    "CONFIG": ["auto", "knobs"],  # auto: the tile config of the shape's regime (REGIMES); knobs: the knobs below
    "BLOCK_H": [16, 32, 64],  # (query, head) rows per program: the M (or N, with KEYS_AS_M) of the dots
    "BLOCK_N": [16, 32, 64],  # keys per KV tile
    "KEYS_AS_M": [False, True],  # scores as S^T = K q^T (keys are the M of the dot)
    "VALUES_AS_M": [False, True],  # P V as O^T = V^T P^T (the 512 value columns are the M)
    "QK_SPLIT": [False, True],  # 8 warps: unchained score dots, so both warpgroups split the score tile
    "num_warps": [4, 8],
    "num_stages": [1, 2, 3, 4],
    "KV_LOAD": ["pointer", "tma"],  # KV tiles by per-row pointers through the block table, or by tensor descriptors
    "OVERHEAD": [0, 2, 3, 4, 5, 10, 20],  # scheduler: a piece's fixed cost, in tiles
    "WAVES": [1, 2],  # programs per SM (one wave, or two)
    "MERGE": ["auto", "fused", "kernel"],  # fused: the last piece merges (one launch); kernel: a second launch
    "PARTIAL_DTYPE": ["float32", "bfloat16", "auto"],  # split partial outputs; auto: bfloat16 where ENGINE "gluon"'s main kernel merges them (GRID_MERGE), else float32
    "PDL": [0, 1, 2],  # MERGE kernel (not ENGINE "gluon"'s): 1 the merge launch overlaps the main kernel's tail; 2 the main kernel's launch too
    "LAUNCH": ["jit", "direct"],  # direct: later calls of a plan launch the cached compiled kernel (less host time)
    "ENGINE": ["triton", "gluon"],  # the warp-specialised Hopper kernels where they apply (module doc)
    "TMA_DESC": ["host", "device"],  # ENGINE "gluon"'s four TMA descriptors: encoded by the launcher every launch, or made in the kernel
    "GRID_MERGE": [0, 1, 2],  # ENGINE "gluon": split rows merged in the main kernel (gluon_merge.py), 1 where the batch has at most GRID_MERGE_ROWS rows, 2 always; 0 the merge kernel
    "GLUON_PDL": [0, 1],  # ENGINE "gluon" with the merge kernel: 1 it is the main kernel's programmatic dependent, let go once the loader's last load is issued
    "PAIR": [0, 1, 2],  # ENGINE "gluon": FlashMLA's schedule, both warpgroups scoring a tile of each pair (gluon_pair.py); 1 where every program has one long piece (B32 Sq4), 2 always
    "MERGE_ROWS": [0, 4, 8],  # ENGINE "gluon"'s merge kernel where the batch's rows fill the GPU: 0 a program per row; 4 or 8 rows a program, a warp a row, whole sequences' programs ending before the wait (combine.py)
}
TRY_EARLY = [
    {"ENGINE": "gluon"},  # on the H200 (session 25): 0.87-0.96x FlashMLA's device time, B1 Sq1 1.14x; the Triton tiles 0.60x
    {"OVERHEAD": 0},
    {"MERGE": "kernel"},
    {"MERGE": "fused"},
    {"PARTIAL_DTYPE": "bfloat16"},
    {"CONFIG": "knobs"},  # BLOCK_H 64 / TMA / QK_SPLIT at every shape, B1 Sq1 included
    {"PDL": 2},
    {"ENGINE": "gluon", "TMA_DESC": "device"},  # H200 (session 28): 9-15 us less host time a call at B1 Sq2/Sq4, 2-4 us more device time
    {"ENGINE": "gluon", "GRID_MERGE": 1},
    {"ENGINE": "gluon", "GRID_MERGE": 1, "GLUON_PDL": 1},
    {"ENGINE": "gluon", "GRID_MERGE": 1, "GLUON_PDL": 1, "PAIR": 1},
    {"ENGINE": "gluon", "GRID_MERGE": 1, "GLUON_PDL": 1, "PAIR": 1, "MERGE_ROWS": 8},  # H200 (session 47): B128 long-tail 0.4 us, B64 1.0 us less device time interleaved
]

# CONFIG "auto": a tile config per regime, from the dense family's measurements (mla_decode.py's
# REGIMES, kernels/notes/mla.md). "narrow" (one query at small batch and a short cache: fewer than
# 8 (sequence, 64-row block) pairs, fewer than 128 rows, fewer than 65536 tokens of table): 16 rows
# per program, keys as the M. "wide" (everything else, MTP at B1 included: every query of a
# sequence shares each tile): 64 rows, TMA, QK_SPLIT on 8 warps.
REGIMES = {
    "narrow": {"BLOCK_H": 16, "BLOCK_N": 64, "KEYS_AS_M": True, "VALUES_AS_M": False, "QK_SPLIT": False,
               "num_warps": 4, "num_stages": 3, "KV_LOAD": "pointer"},
    "wide": {"BLOCK_H": 64, "BLOCK_N": 64, "KEYS_AS_M": False, "VALUES_AS_M": False, "QK_SPLIT": True,
             "num_warps": 8, "num_stages": 2, "KV_LOAD": "tma"},
}
WIDE_FROM_PAIRS = 8  # (sequence, 64-row block) pairs from which "wide" applies
WIDE_FROM_ROWS = 128  # rows per sequence (Sq * H) from which "wide" applies at any batch
WIDE_FROM_TOKENS = 65536  # cache capacity of the batch (B * max_pages * page_size) from which "wide" applies

D_NOPE = 512
D_ROPE = 64
LOG2E = 1.4426950408889634
FUSED_MERGE_ELEMS = 8192  # fused merge: partial elements per [rows, columns] step
MERGE_ELEMS = 2048  # merge kernel: partial elements a program loads at once (pieces x value columns)
PAGE_CHUNK = 32  # tiles whose page numbers are loaded at once (a tile loop restarts its pipeline every PAGE_CHUNK tiles)
MERGE_WARPS = 2  # merge kernel: small programs, so that many are resident at once (B128: fewer waves of them)
PAIR_FROM_ROWS = 256  # PAIR 1: the fewest rows (Sq * H) a sequence needs, beside 2 * B * row blocks >= SMs (host.py)
GRID_MERGE_ROWS = 256  # GRID_MERGE 1: the most rows (B * Sq * H) a batch may have for the main kernel to merge them
MAX_BATCH = 8192  # the scheduler holds the lengths in one block of registers
PLANS_KEPT = 16  # plans (each with its scratch) kept at once, the oldest dropped first
SMEM_LIMIT = 232448  # bytes of shared memory a block may opt into on sm_90
_NO_SPEC = ["B", "Sq", "max_pages"]  # B is also the always-taken branch's condition (QK_SPLIT)


# -- tiles.py ----------------------------------------------------------------------------------------------------------
# The Triton kernels: ``_mla_paged_fwd`` (the scheduler's prologue, the KV tile loop, the partial or direct
# store and the fused merge) and ``_mla_paged_merge`` (MERGE "kernel").

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


# -- gluon_merge.py ----------------------------------------------------------------------------------------------------
# GRID_MERGE (ENGINE "gluon"): split sequences merged at the end of the main kernel, after a barrier across the
# grid, instead of by the merge kernel.
#
# The merge kernel is a second launch: at B1 its launch and ramp cost more than its work (H200, Nsight Compute, B1 Sq4:
# main kernel 20.1 us, merge kernel 9.9 us, where FlashMLA's combine overlaps its main kernel). Every program of the
# Gluon kernel is resident at once (one a multiprocessor, at most one per multiprocessor: the host launches it as a
# cooperative grid, which the driver refuses rather than run it partly), so each warpgroup can wait for all the others'
# partials and then merge a share of the split rows from L2. The barrier resets itself (the last arrival sets the
# count back to zero and bumps a generation the others wait on), so a CUDA graph can replay it.

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


# -- gluon_ws.py -------------------------------------------------------------------------------------------------------
# ENGINE "gluon": FlashMLA's split of the work, warp-specialised for Hopper (``_mla_paged_ws``), on the Triton
# kernel's scheduler and merge kernel.

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


# -- gluon_pair.py -----------------------------------------------------------------------------------------------------
# ENGINE "gluon" with PAIR 1 (``_mla_paged_pair``): FlashMLA's sm90 schedule. Two warpgroups, no loader warp; tiles
# go in pairs (t, t + 1), t in ring stage 0 and t + 1 in stage 1. Warpgroup 0 scores t, warpgroup 1 scores t + 1 on
# t's running max, and each folds both tiles into its half of O (warpgroup 0 columns 0-255, warpgroup 1 256-511): its
# own P from registers, the other's from shared memory. So one warpgroup's softmax runs while the other's products
# keep the tensor cores busy, which the loader form (``gluon_ws.py``: one warpgroup scores every tile) cannot do.
#
# Each half of a tile has its own ready barrier and is refilled by the warpgroup that reads it last, the moment its
# product is done: warpgroup 0 the first 256 latent columns (only it folds them), warpgroup 1 the other 256 and the
# rope. The score products take a tile half by half, the half that comes back first first. (Nine 64-column boxes, as
# FlashMLA copies them, were slower here: each box's expect and copy carry two barriers across the warpgroup that
# Triton inserts; H200, B32 Sq4 249.2 against 242.5 us. Nor did nine boxes issued by a loader warp help: 238.1
# against 232.7.)
#
# The hand-overs between the warpgroups (t's max, t + 1's max, each P) are named barriers, ``bar.arrive`` by the
# 128 threads that publish and ``bar.sync`` by the 128 that wait, as FlashMLA's are. An mbarrier arrival is one
# thread's, so Triton puts a barrier across the warpgroup in front of each; the barriers that remain are the copies'
# and the waits'. Each mbarrier and each max buffer is an allocation of its own, since Triton's membar pass takes an
# allocation as one buffer. The softmax's scale is folded into the exponent (one FFMA a score), and only a piece's
# last pair can hold a partial tile, so only it zeroes rows (H200, B32 Sq4: 232.7 us against 239.5 before these three).
#
# Where P goes: warpgroup 0's (tile t, rescaled to t + 1's max) over stage 0's rope box, which nobody reads once t is
# scored; warpgroup 1's in a buffer of its own. Shared memory: q 72 KB, two 72 KB stages, P 8 KB.
#
# Ends of a piece: a pair whose second tile is past the piece's last runs with that tile masked (no key past the
# piece is seen; values past the sequence's length zeroed), and tiles past the end are loaded from the piece's last
# page, so every barrier completes once a pair and no product is branched around (an accumulator in flight across a
# branch makes ptxas serialise the products). The host uses it only where every program gets one long piece
# (``PAIR_FROM_ROWS``; H200, session 37: B32 Sq4 239.7 us against the loader form's 257.8, FlashMLA 215.5; slower at
# B1 Sq4, B64 and B128, where pieces are short or memory bounds the loop).

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


# -- combine.py --------------------------------------------------------------------------------------------------------
# MERGE_ROWS (ENGINE "gluon"): the merge kernel shaped as FlashMLA's combine (``_mla_paged_combine``). ROWS rows a
# program, a warp a row, every value column of the row in that warp. Each program works out its sequence's pieces from
# the lengths, as the main kernel's prologue does, before it waits for the main kernel: a sequence in one piece (the
# main kernel wrote it) ends its programs before the wait, so they hold no slot while the main kernel ends. The others,
# once the main kernel is done, load every piece's lse and the first two pieces' rows at once, then fold the pieces in
# order, two pieces' rows in flight while one is folded. H200, device time interleaved with the row-per-program
# merge: B128 long-tail 180.0 against 180.4 us, B64 161.4 against 162.4, B32 Sq1 95.0 against 94.8; with one piece in
# flight B32 Sq1 took 95.6, since its four pieces a sequence were then four round trips.
#
# The row-per-program merge kernel (``_mla_paged_merge``, MERGE_ROWS 0) reads the main kernel's record of a sequence
# once it has waited: all of its B * Sq * H programs wait, and two round trips to L2 follow the wait before the first
# partial row is asked for.

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


# -- host.py -----------------------------------------------------------------------------------------------------------
# The host: input checks, a plan per shape (tile config, grid, constexprs, scratch, descriptors), and the launches.

@functools.lru_cache(maxsize=None)
def _sm_count(device_index):
    if device_index is None:
        return 8  # CPU interpreter: a few parts, so that sequences split and merge there too
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _check_inputs(q, kv_cache, block_table, cache_seqlens):
    if q.dim() != 4 or q.shape[-1] != D_NOPE + D_ROPE:
        raise ValueError(f"q must be [B, Sq, H, {D_NOPE + D_ROPE}], got {tuple(q.shape)}")
    B, Sq, H, _ = q.shape
    if kv_cache.dim() != 3 or kv_cache.shape[-1] != D_NOPE + D_ROPE:
        raise ValueError(f"kv_cache must be [num_pages, page_size, {D_NOPE + D_ROPE}], got {tuple(kv_cache.shape)}")
    if kv_cache.dtype != q.dtype or q.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"q and kv_cache must share a float dtype, got {q.dtype} and {kv_cache.dtype}")
    if block_table.dim() != 2 or block_table.shape[0] != B or block_table.dtype != torch.int32:
        raise ValueError(f"block_table must be int32 [B={B}, max_pages], got {block_table.dtype} {tuple(block_table.shape)}")
    if tuple(cache_seqlens.shape) != (B,) or cache_seqlens.dtype != torch.int32 or cache_seqlens.stride(0) != 1:
        raise ValueError(f"cache_seqlens must be contiguous int32 [B={B}], got {cache_seqlens.dtype} {tuple(cache_seqlens.shape)}")
    if not (q.device == kv_cache.device == block_table.device == cache_seqlens.device):
        raise ValueError("q, kv_cache, block_table and cache_seqlens must be on one device")
    if q.stride(3) != 1 or kv_cache.stride(2) != 1 or block_table.stride(1) != 1:
        raise ValueError("q, kv_cache and block_table need unit stride in their last dimension")
    if not 1 <= B <= MAX_BATCH or Sq < 1 or H < 1:
        raise ValueError(f"need 1 <= B <= {MAX_BATCH}, Sq >= 1 and H >= 1, got B={B}, Sq={Sq}, H={H}")


def _check_lengths(q, kv_cache, block_table, cache_seqlens):
    capacity = block_table.shape[1] * kv_cache.shape[1]
    lengths = cache_seqlens.cpu()  # a copy (the judge's policy allows no torch math on the host)
    for b in range(lengths.shape[0]):
        n = int(lengths[b])
        if not q.shape[1] <= n <= capacity:
            raise ValueError(f"cache_seqlens[{b}] = {n}: need Sq={q.shape[1]} <= length <= max_pages * page_size = {capacity}")


def _narrow(knobs, B, R, capacity):
    """Whether CONFIG "auto" puts the shape in the "narrow" regime (module doc)."""
    wide = B * triton.cdiv(R, 64) >= WIDE_FROM_PAIRS or R >= WIDE_FROM_ROWS or B * capacity >= WIDE_FROM_TOKENS
    return knobs["CONFIG"] == "auto" and not wide


def _tiles(knobs, B, R, capacity):
    """The tile knobs in force: the knobs, or under CONFIG "auto" the regime's (module doc)."""
    tiles = dict(knobs)
    tiles.update(REGIMES["narrow" if _narrow(knobs, B, R, capacity) else "wide"])
    return tiles


def _merge_chunk(parts, block_v):
    """Pieces the merge kernel loads at once: every piece a sequence can have (one a part) in one round trip, up to
    MERGE_ELEMS values a program."""
    return max(2, min(triton.next_power_of_2(parts), MERGE_ELEMS // block_v))


def _plan(knobs, q, kv_cache, block_table, dev_index, aligned=True):
    """Everything about a launch that depends only on the knobs, the shapes, strides and dtypes (and, for ENGINE
    "gluon", whether q and the cache start on 16 bytes)."""
    for name, allowed in (("CONFIG", ("auto", "knobs")), ("MERGE", ("auto", "fused", "kernel")), ("KV_LOAD", ("pointer", "tma")),
                          ("PARTIAL_DTYPE", ("float32", "bfloat16", "auto")), ("LAUNCH", ("jit", "direct")), ("PDL", (0, 1, 2)), ("WAVES", (1, 2)), ("TMA_DESC", ("host", "device")), ("GRID_MERGE", (0, 1, 2)), ("GLUON_PDL", (0, 1)), ("PAIR", (0, 1, 2)), ("MERGE_ROWS", (0, 4, 8)),
                          ("ENGINE", ("triton", "gluon"))):
        if knobs[name] not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {knobs[name]!r}")
    overhead = knobs["OVERHEAD"]
    if not isinstance(overhead, int) or not 0 <= overhead <= 1000:
        raise ValueError(f"OVERHEAD must be an integer number of tiles in [0, 1000], got {overhead!r}")
    B, Sq, H, _ = q.shape
    num_pages, page, _ = kv_cache.shape
    R = Sq * H
    n_sms = _sm_count(dev_index)
    tiles = _tiles(knobs, B, R, block_table.shape[1] * page)
    block_n, block_h, warps = tiles["BLOCK_N"], tiles["BLOCK_H"], tiles["num_warps"]
    if block_n not in (16, 32, 64, 128):
        raise ValueError(f"BLOCK_N must be 16, 32, 64 or 128 (a tl.dot dimension), got {block_n}")
    if block_h not in (16, 32, 64, 128):
        raise ValueError(f"BLOCK_H must be 16, 32, 64 or 128 (the M of a tl.dot), got {block_h}")
    if warps not in (4, 8):
        raise ValueError(f"num_warps must be 4 or 8, got {warps}")
    qk_split = bool(tiles["QK_SPLIT"]) and warps == 8  # with one warpgroup there is nothing to split
    stages = int(tiles["num_stages"])
    if qk_split and tiles["KV_LOAD"] == "tma" and tiles["KEYS_AS_M"] and block_h < 64:
        smem = stages * block_n * (D_NOPE + D_ROPE) * 2 + block_h * (D_NOPE + D_ROPE) * 2 + block_n * block_h * 2
        if smem > SMEM_LIMIT:
            raise ValueError(f"QK_SPLIT with KEYS_AS_M, BLOCK_H={block_h}, BLOCK_N={block_n}, num_stages={stages} keeps {stages} KV tiles "
                             f"in shared memory: ~{smem // 1024} KB, over the {SMEM_LIMIT // 1024} KB of sm_90")
    if 16 <= page < block_n and page & (page - 1) == 0:
        block_n = page  # a tile never spans pages that hold 16 keys or more: its rows are one page's (pipelined, TMA)
    block_h = min(block_h, max(16, triton.next_power_of_2(R)))  # fewer rows than a block: a smaller block (>= 16)
    n_rb = triton.cdiv(R, block_h)
    parts = max(1, knobs["WAVES"] * n_sms // n_rb)
    merge = "fused" if B * 4 >= parts else "kernel"
    # TMA: a tile must lie in one page, pages back to back in memory, 16-byte aligned rows
    tma = (tiles["KV_LOAD"] == "tma" and kv_cache.dtype == torch.bfloat16 and page % block_n == 0
           and kv_cache.stride(0) == page * kv_cache.stride(1) and kv_cache.stride(1) % 8 == 0)
    merge_bv = 64 if B * R * 8 <= 16 * n_sms else D_NOPE
    pdl = int(knobs["PDL"]) if dev_index is not None and merge == "kernel" else 0  # griddepcontrol: GPU only
    constexprs = dict(BLOCK_H=block_h, BLOCK_N=block_n, PAGE=page, KEYS_AS_M=bool(tiles["KEYS_AS_M"]), VALUES_AS_M=bool(tiles["VALUES_AS_M"]),
                      QK_SPLIT=qk_split, TMA=tma, MERGE=2 if merge == "fused" else 1, OVERHEAD=overhead,
                      B_P2=triton.next_power_of_2(B), PAGE_CHUNK=PAGE_CHUNK, MERGE_W=max(16, min(D_NOPE, FUSED_MERGE_ELEMS // block_h)), DN=D_NOPE, DR=D_ROPE, PDL=pdl)
    merge_constexprs = dict(BLOCK_V=merge_bv, CHUNK=_merge_chunk(parts, merge_bv), DN=D_NOPE, PDL=pdl)
    plan = dict(
        engine="triton", descs=None, device_descs=False, host_descs=False,  # ENGINE "gluon"'s TMA descriptors (TMA_DESC)
        grid=(n_rb, parts, 1), merge_grid=(R, D_NOPE // merge_bv, B), fused=merge == "fused", tma=tma,
        sizes=(B, Sq, H, num_pages * page, block_table.shape[1]),
        strides=(q.stride(0), q.stride(1), q.stride(2), kv_cache.stride(0), kv_cache.stride(1), block_table.stride(0)),
        constexprs=constexprs, merge_constexprs=merge_constexprs,
        constexpr_values=[constexprs[n] for n in _mla_paged_fwd.arg_names if n in constexprs],
        merge_constexpr_values=[merge_constexprs[n] for n in _mla_paged_merge.arg_names if n in merge_constexprs],
        options=dict(num_warps=warps, num_stages=stages, **({"launch_pdl": True} if pdl >= 2 else {})),
        merge_options=dict(num_warps=MERGE_WARPS, num_stages=2, **({"launch_pdl": True} if pdl else {})),
        scratch_shapes=((2 * parts, R, D_NOPE), (2 * parts, R), (B * n_rb,), (4 * B,)), part_dtype=_partial_dtype(knobs, False),
        merge_fn=_mla_paged_merge, merge_reads_lens=False,
        direct=knobs["LAUNCH"] == "direct" and dev_index is not None, compiled=None, scratch={},
        o_shape=(B, Sq, H, D_NOPE), lse_shape=(B, H, Sq), merge_sizes=(Sq, H),
    )
    # the narrow regime (one query, small batch, short cache) stays on the Triton tiles: as fast on the device there
    # and a shorter host path (H200, B1 Sq1: 26.3 against 26.8 us device, 43.3 against 52.8 us eager)
    gluon_fits = (knobs["ENGINE"] == "gluon" and not _narrow(knobs, B, R, block_table.shape[1] * page) and aligned and dev_index is not None and R % 64 == 0 and page % 64 == 0
                  and torch.cuda.get_device_capability(dev_index)[0] == 9 and q.dtype == kv_cache.dtype == torch.bfloat16
                  and q.is_contiguous() and kv_cache.is_contiguous())
    if gluon_fits:  # ENGINE "gluon": one 64-row block per program, the merge kernel for split sequences
        # PAIR: where every program gets one long piece of a sequence with several row blocks (B32 Sq4: 128 programs of
        # 128 tiles); with short pieces its per-piece start costs more than its overlap gains (H200, B1 Sq4, B64, B128)
        fn = (_mla_paged_pair if (R >= PAIR_FROM_ROWS and 2 * B * (R // 64) >= n_sms)
              else _mla_paged_ws)
        n_rb, parts = R // 64, max(1, n_sms // (R // 64))
        # GRID_MERGE: the main kernel merges (a cooperative launch: every program resident, or no launch at all)
        grid_merge = knobs["GRID_MERGE"] == 2 or (knobs["GRID_MERGE"] == 1 and B * R <= GRID_MERGE_ROWS)
        bf16_partials = grid_merge  # PARTIAL_DTYPE "auto" (``_partial_dtype``)
        if fn is _mla_paged_pair:  # equal lengths leave nothing split, and then no program waits
            grid_merge = knobs["GRID_MERGE"] != 0
            bf16_partials = False
        g_pdl = int(knobs["GLUON_PDL"]) if not grid_merge else 0  # the merge kernel launched once the main kernel's loads are issued
        g_constexprs = dict(PAGE=page, OVH=overhead, B_P2=triton.next_power_of_2(B), DN=D_NOPE, DEVICE_DESC=knobs["TMA_DESC"] == "device",
                            GRID_MERGE=grid_merge, PDL=g_pdl)
        m_constexprs = dict(merge_constexprs, CHUNK=_merge_chunk(parts, merge_bv), PDL=g_pdl)
        plan.update(
            engine="gluon", gluon_fn=fn, device_descs=g_constexprs["DEVICE_DESC"], host_descs=not g_constexprs["DEVICE_DESC"], grid=(n_rb, parts, 1), fused=grid_merge, tma=False, constexprs=g_constexprs, merge_constexprs=m_constexprs,
            constexpr_values=[g_constexprs[n] for n in fn.arg_names if n in g_constexprs],
            merge_constexpr_values=[m_constexprs[n] for n in _mla_paged_merge.arg_names if n in m_constexprs],
            options=dict(num_warps=4, **({"launch_cooperative_grid": True} if grid_merge else {})), merge_options=dict(num_warps=MERGE_WARPS, num_stages=2, **({"launch_pdl": True} if g_pdl else {})),
            scratch_shapes=((2 * parts, R, D_NOPE), (2 * parts, R), (max(B * n_rb, 2),), (4 * B,)),  # GRID_MERGE: two barrier words
            part_dtype=_partial_dtype(knobs, bf16_partials),
            gluon_values=(block_table.stride(0), B, Sq, H, block_table.shape[1] * page), q_rows=B * R, kv_rows=num_pages * page,
        )
    if plan["engine"] == "gluon" and not plan["fused"] and merge_bv == D_NOPE:
        _use_combine(plan, knobs["MERGE_ROWS"], B, R, block_table.shape[1] * page)
    return plan


def _partial_dtype(knobs, bf16_partials):
    """The split pieces' partial rows' dtype. PARTIAL_DTYPE "auto": ``bf16_partials``, which the host sets where the
    loader form's main kernel merges them (GRID_MERGE; at B1 the merge after the grid's barrier reads half the bytes),
    float32 where a merge kernel does (H200: B1 Sq4 25.2 against 27.4 us device; B64 and B128 1-2 us slower in
    bfloat16) and for PAIR's kernel."""
    return torch.bfloat16 if bf16_partials else torch.float32


def _use_combine(plan, rows, B, R, capacity):
    """MERGE_ROWS: ENGINE "gluon"'s merge kernel is ``_mla_paged_combine`` (combine.py), grid (sequences, row groups),
    a warp a row; it works the main kernel's schedule out again (its OVERHEAD and parts) from the lengths."""
    c = dict(OVH=plan["constexprs"]["OVH"], B_P2=triton.next_power_of_2(B), ROWS=rows, DN=D_NOPE, PDL=plan["merge_constexprs"]["PDL"])
    plan.update(merge_fn=_mla_paged_combine, merge_reads_lens=True, merge_grid=(B, triton.cdiv(R, rows), 1), merge_constexprs=c,
                merge_constexpr_values=[c[n] for n in _mla_paged_combine.arg_names if n in c],
                merge_sizes=(plan["merge_sizes"][0], plan["merge_sizes"][1], B, capacity, plan["grid"][1]),
                merge_options=dict(plan["merge_options"], num_warps=rows))


def _gluon_descriptors(q, kv_cache):
    """q [B * Sq * H, 576] and the cache [pages * page_size, 576] in 64-row boxes of 256 (latent) and 64 (rope)
    columns: built once per plan, a call sets their bases."""
    q2 = q.view(-1, D_NOPE + D_ROPE)
    kv2 = kv_cache.view(-1, D_NOPE + D_ROPE)

    def desc(t, cols):
        layout = gl.NVMMASharedLayout.get_default_for([64, cols], gl.bfloat16)
        return TensorDescriptor(t, list(t.shape), list(t.stride()), [64, cols], layout)

    return desc(q2, D_NOPE // 2), desc(q2, D_ROPE), desc(kv2, D_NOPE // 2), desc(kv2, D_ROPE)


def _compiled(kernel):
    """What a direct launch needs of a compiled kernel: its launcher (loaded), function handle and metadata."""
    return None if kernel is None else (kernel.run, kernel.function, kernel.packed_metadata)


def _direct(compiled, grid, stream_id, *args):
    """A compiled kernel's launcher called straight, on the caller's stream, every argument in signature order
    (constexprs included: the launcher skips them): no runner, launch metadata or launch hooks (a profiler's hooks do
    not see these launches), so a few microseconds less host time a launch than ``compiled[grid](...)``."""
    run, function, metadata = compiled
    run(grid[0], grid[1], grid[2], stream_id, function, metadata, None, None, None, *args)


def _gluon_args(plan, q, kv_cache, block_table, cache_seqlens, o, lse, scratch, qk_scale):
    """ENGINE "gluon"'s arguments with tensors (the JIT entry of a plan's first call). TMA_DESC "host": the plan's four
    descriptors pointed at this call's q and cache (the launcher encodes each in every launch; the caller clears their
    bases after the launch); "device": the pointers themselves, the kernel makes the descriptors in the global scratch
    Triton asks the allocator for."""
    part_o, part_lse, counters, meta = scratch
    if plan["constexprs"]["DEVICE_DESC"]:
        plan["descs"] = ()
        q_n = q_r = q
        kv_n = kv_r = kv_cache
    else:
        if plan["descs"] is None:
            plan["descs"] = _gluon_descriptors(q, kv_cache)
        q_n, q_r, kv_n, kv_r = plan["descs"]
        q_n.base = q_r.base = q
        kv_n.base = kv_r.base = kv_cache
    return (q_n, q_r, kv_n, kv_r, block_table, cache_seqlens, o, lse, part_o, part_lse, meta, counters, *plan["gluon_values"], qk_scale,
            plan["q_rows"], plan["kv_rows"])


def _launch_first(plan, q, kv_cache, block_table, cache_seqlens, o, lse, scratch, qk_scale, aligned):
    """A plan's launches through Triton's JIT entry (it compiles on first use): the main kernel, then the merge kernel
    unless the merge is fused. Under LAUNCH "direct", with every pointer 16-byte aligned (what the compiled kernels
    then assume), their compiled kernels are kept for ``_launch_direct``."""
    part_o, part_lse, _, meta = scratch
    merge_args = (part_o, part_lse, o, lse, cache_seqlens if plan["merge_reads_lens"] else meta, *plan["merge_sizes"])
    gluon = plan["engine"] == "gluon"
    try:
        if gluon:
            args = _gluon_args(plan, q, kv_cache, block_table, cache_seqlens, o, lse, scratch, qk_scale)
            main = plan["gluon_fn"][plan["grid"]](*args, **plan["constexprs"], **plan["options"])
        else:
            args = (q, kv_cache, block_table, cache_seqlens, o, lse, *scratch, *plan["strides"], *plan["sizes"], qk_scale)
            main = _mla_paged_fwd[plan["grid"]](*args, **plan["constexprs"], **plan["options"])
        merge = None
        if not plan["fused"]:
            merge = plan["merge_fn"][plan["merge_grid"]](*merge_args, **plan["merge_constexprs"], **plan["merge_options"])
    except Exception as exc:  # compile-time resource limits are a property of the knobs
        if type(exc).__name__ == "OutOfResources":
            c = plan["constexprs"]
            raise ValueError(f"knobs {c} {plan['options']} need more registers or shared memory than the device has: {exc}") from exc
        raise
    finally:
        for d in plan["descs"] or ():  # hold none of the caller's tensors between calls
            d.base = None
    if plan["direct"] and aligned:
        plan["compiled"] = (_compiled(main), _compiled(merge))


def _launch_direct(plan, ptrs, o_ptr, lse_ptr, scratch_ptrs, qk_scale, stream_id, descs_from=None):
    """A plan's compiled kernels launched straight (``_direct``) with every pointer an integer: the caller's tensors
    by the addresses this call read, o and lse by theirs, the scratch by the addresses the plan holds, so the C
    launcher neither calls ``data_ptr`` nor asks the driver about any pointer (the plan's key fixed the devices).
    ``descs_from``: q and the cache (TMA_DESC "host"), whose plan descriptors the launcher encodes."""
    q_ptr, kv_ptr, bt_ptr, cs_ptr = ptrs
    part_o, part_lse, counters, meta = scratch_ptrs
    main, merge = plan["compiled"]
    if plan["engine"] == "gluon":
        if descs_from is None:
            q_n = q_r = q_ptr
            kv_n = kv_r = kv_ptr
        else:
            q_n, q_r, kv_n, kv_r = plan["descs"]
            q_n.base = q_r.base = descs_from[0]
            kv_n.base = kv_r.base = descs_from[1]
        try:
            _direct(main, plan["grid"], stream_id, q_n, q_r, kv_n, kv_r, bt_ptr, cs_ptr, o_ptr, lse_ptr, part_o, part_lse, meta,
                    counters, *plan["gluon_values"], qk_scale, plan["q_rows"], plan["kv_rows"], *plan["constexpr_values"])
        finally:
            if descs_from is not None:
                for d in plan["descs"]:
                    d.base = None
    else:
        _direct(main, plan["grid"], stream_id, q_ptr, kv_ptr, bt_ptr, cs_ptr, o_ptr, lse_ptr, part_o, part_lse, counters, meta,
                *plan["strides"], *plan["sizes"], qk_scale, *plan["constexpr_values"])
    if merge is not None:
        _direct(merge, plan["merge_grid"], stream_id, part_o, part_lse, o_ptr, lse_ptr, cs_ptr if plan["merge_reads_lens"] else meta,
                *plan["merge_sizes"], *plan["merge_constexpr_values"])


_PLANS = {}  # key -> plan, oldest first (at most PLANS_KEPT)
_DESCRIPTOR_SCRATCH = {}


def _descriptor_scratch(size, alignment, stream):
    """Global memory Triton asks for when a kernel builds tensor descriptors on the device: one
    buffer per (size, stream), reused (launches on one stream are ordered)."""
    buf = _DESCRIPTOR_SCRATCH.get((size, stream))
    if buf is None:
        buf = _DESCRIPTOR_SCRATCH[(size, stream)] = torch.empty(size, device="cuda", dtype=torch.int8)
    return buf


def _scratch(plan, device, stream_id):
    """(tensors, their addresses): partials, lse partials, counters (the fused merge's tickets, which every merge
    leaves at zero; under GRID_MERGE counters[0:2] are the grid barrier's count, back at zero after every launch, and
    its generation, which only grows) and the merge kernel's per-sequence record, reused by every call of a plan on one stream (calls on one stream are
    ordered); a call on another stream than the last gets fresh ones."""
    scratch = plan["scratch"].get(stream_id)
    if scratch is None:
        p_o, p_l, cnt, meta = plan["scratch_shapes"]
        tensors = (torch.empty(p_o, device=device, dtype=plan["part_dtype"]), torch.empty(p_l, device=device, dtype=torch.float32),
                   torch.zeros(cnt, device=device, dtype=torch.int32), torch.zeros(meta, device=device, dtype=torch.int32))
        plan["scratch"] = {stream_id: (tensors, tuple(t.data_ptr() for t in tensors))}
        scratch = plan["scratch"][stream_id]
    return scratch


def plan_for(q, kv_cache, block_table, cache_seqlens, key):
    """The plan of ``key`` (made, after the input checks, the first time the key is seen; the oldest plan goes past
    PLANS_KEPT, so a cache whose length grows every step does not keep a plan, and its scratch, for every length)."""
    plan = _PLANS.get(key)
    if plan is None:
        _check_inputs(q, kv_cache, block_table, cache_seqlens)
        _check_lengths(q, kv_cache, block_table, cache_seqlens)  # once per shape on a GPU (it synchronises)
        dev_index = (q.device.index if q.device.index is not None else torch.cuda.current_device()) if q.is_cuda else None
        plan = _plan(KNOBS, q, kv_cache, block_table, dev_index, aligned=key[-1])
        while len(_PLANS) >= PLANS_KEPT:
            _PLANS.pop(next(iter(_PLANS)))
        _PLANS[key] = plan
    elif not q.is_cuda:
        _check_lengths(q, kv_cache, block_table, cache_seqlens)  # free on the host
    return plan


def run_plan(plan, q, kv_cache, block_table, cache_seqlens, scale, ptrs):
    """o and lse of one call of ``plan``; ``ptrs``: the four inputs' addresses. On the direct path only those
    addresses are read (and kv_cache's for TMA_DESC "host"), so a caller may pass a tensor whose memory is
    kv_cache's in another shape (mla_decode_paged's dense cache)."""
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    o = torch.empty(plan["o_shape"], device=q.device, dtype=q.dtype)
    lse = torch.empty(plan["lse_shape"], device=q.device, dtype=torch.float32)
    stream_id = torch.cuda.current_stream(q.device).cuda_stream if q.is_cuda else 0
    scratch, scratch_ptrs = _scratch(plan, q.device, stream_id)
    if plan["tma"] and q.is_cuda or plan["device_descs"]:
        triton.set_allocator(_descriptor_scratch)  # kernels that make tensor descriptors on the device
    aligned = (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3]) % 16 == 0
    if plan["compiled"] is not None and aligned:
        _launch_direct(plan, ptrs, o.data_ptr(), lse.data_ptr(), scratch_ptrs, scale * LOG2E, stream_id,
                       (q, kv_cache) if plan["host_descs"] else None)
    else:
        _launch_first(plan, q, kv_cache, block_table, cache_seqlens, o, lse, scratch, scale * LOG2E, aligned)
    return o, lse


def plan_key(q, kv_cache, block_table, cache_seqlens, ptrs):
    """What a plan depends on: the inputs' shapes, strides, dtypes and devices, and whether q and the cache start on
    16 bytes (ENGINE "gluon" needs it: TMA); ``ptrs``: the four inputs' addresses."""
    return (q.shape, q.stride(), q.dtype, q.device, kv_cache.shape, kv_cache.stride(), kv_cache.dtype, kv_cache.device,
            block_table.shape, block_table.stride(), block_table.dtype, block_table.device,
            cache_seqlens.shape, cache_seqlens.stride(), cache_seqlens.dtype, cache_seqlens.device, (ptrs[0] | ptrs[1]) % 16 == 0)


def paged_attention(q, kv_cache, block_table, cache_seqlens, scale):
    """The family's work for ``kernel`` (entry.py): the plan of the inputs' key (checks once per key), then
    ``run_plan``."""
    ptrs = (q.data_ptr(), kv_cache.data_ptr(), block_table.data_ptr(), cache_seqlens.data_ptr())
    plan = plan_for(q, kv_cache, block_table, cache_seqlens, plan_key(q, kv_cache, block_table, cache_seqlens, ptrs))
    return run_plan(plan, q, kv_cache, block_table, cache_seqlens, scale, ptrs)


# -- entry.py ----------------------------------------------------------------------------------------------------------
# The entry point with mla-paged's signature (a family that takes the other stages, as mla_decode_paged does for
# the dense cache, brings its own).

def kernel(q, kv_cache, block_table, cache_seqlens, scale):
    """o [B, Sq, H, 512] in q's dtype and lse [B, H, Sq] float32 (the family's docstring says how)."""
    return paged_attention(q, kv_cache, block_table, cache_seqlens, scale)
