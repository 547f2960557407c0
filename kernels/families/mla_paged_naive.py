"""MLA decode on a paged cache, the plain way: one Triton program per (head, query, sequence).

Each program reads its sequence's length, then walks the keys it may see (query i of Sq sees keys
j <= i + length - Sq) in BLOCK_N-key blocks with an online softmax. Key j's row is found through
the block table: page block_table[b, j // page_size], slot j % page_size. The row's 512 latent
columns serve as key and value, its 64 rope columns as key only. Scores and the accumulator are
float32; o is written in q's dtype and lse (natural log) in float32. Keys past the visible end
are masked at the load (read as 0), so the NaN an allocator may leave in unused slots never
reaches the sums.

Lengths are checked on the host when they are on the host (the CPU interpreter) and on the first
call of each shape on a GPU (one synchronisation per shape); a later call with a length outside
[Sq, max_pages * page_size] gets NaN for that sequence instead of a read outside its pages.

This is the baseline every ``mla-paged`` run starts from. It is slow by design: the cache is
re-read by every (head, query) program, and with one query per program there is no tl.dot.
"""

import torch
import triton
import triton.language as tl

# kopt:knobs-begin
KNOBS = {"BLOCK_N": 32, "num_warps": 4, "num_stages": 2}
# kopt:knobs-end
SPACE = {"BLOCK_N": [16, 32, 64], "num_warps": [2, 4, 8], "num_stages": [1, 2, 3]}

LATENT_DIM = 512
ROPE_DIM = 64


@triton.jit
def _mla_paged_naive_kernel(
    q_ptr, kv_ptr, table_ptr, lens_ptr, o_ptr, lse_ptr,
    scale, Sq, H, max_pages,
    stride_qb, stride_qs, stride_qh,
    stride_kp, stride_ks, stride_tb,
    PAGE: tl.constexpr, D_LAT: tl.constexpr, D_ROPE: tl.constexpr, BLOCK_N: tl.constexpr,
):
    h = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)

    length = tl.load(lens_ptr + b)
    bad = (length < Sq) | (length > max_pages * PAGE)  # the host checks when it can; never read past the table
    length = tl.where(bad, Sq, length)
    n_visible = i + length - Sq + 1

    offs_lat = tl.arange(0, D_LAT)
    offs_rope = tl.arange(0, D_ROPE)
    q_row = q_ptr + b * stride_qb + i * stride_qs + h * stride_qh
    q_lat = tl.load(q_row + offs_lat).to(tl.float32)
    q_rope = tl.load(q_row + D_LAT + offs_rope).to(tl.float32)

    m_i = float("-inf")
    l_i = 0.0
    acc = tl.zeros([D_LAT], dtype=tl.float32)
    for start in range(0, n_visible, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        valid = offs_n < n_visible
        page = tl.load(table_ptr + b * stride_tb + offs_n // PAGE, mask=valid, other=0).to(tl.int64)
        rows = kv_ptr + page[:, None] * stride_kp + (offs_n % PAGE)[:, None] * stride_ks
        k_lat = tl.load(rows + offs_lat[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        k_rope = tl.load(rows + D_LAT + offs_rope[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        s = tl.sum(k_lat * q_lat[None, :], axis=1) + tl.sum(k_rope * q_rope[None, :], axis=1)
        s = tl.where(valid, s * scale, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * k_lat, axis=0)  # the value is the latent part
        m_i = m_new

    poison = tl.where(bad, float("nan"), 0.0)
    o_row = o_ptr + ((b * Sq + i) * H + h) * D_LAT
    tl.store(o_row + offs_lat, (acc / l_i + poison).to(o_ptr.dtype.element_ty))
    tl.store(lse_ptr + (b * H + h) * Sq + i, m_i + tl.log(l_i) + poison)


def _check_knobs(knobs):
    block_n = knobs["BLOCK_N"]
    if not isinstance(block_n, int) or block_n < 1 or block_n & (block_n - 1):
        raise ValueError(f"BLOCK_N={block_n!r}: must be a positive power of two (tl.arange needs one)")
    if block_n > 256:
        raise ValueError(f"BLOCK_N={block_n}: a {block_n}x{LATENT_DIM} float32 tile does not fit in registers")
    warps = knobs["num_warps"]
    if not isinstance(warps, int) or warps < 1 or warps > 32 or warps & (warps - 1):
        raise ValueError(f"num_warps={warps!r}: must be a power of two from 1 to 32")
    stages = knobs["num_stages"]
    if not isinstance(stages, int) or stages < 1:
        raise ValueError(f"num_stages={stages!r}: must be a positive integer")


def _check_inputs(q, kv_cache, block_table, cache_seqlens):
    if q.dim() != 4 or q.shape[-1] != LATENT_DIM + ROPE_DIM:
        raise ValueError(f"q must be [B, Sq, H, {LATENT_DIM + ROPE_DIM}], got {tuple(q.shape)}")
    B, Sq, H, _ = q.shape
    if kv_cache.dim() != 3 or kv_cache.shape[-1] != LATENT_DIM + ROPE_DIM:
        raise ValueError(f"kv_cache must be [num_pages, page_size, {LATENT_DIM + ROPE_DIM}], got {tuple(kv_cache.shape)}")
    if kv_cache.dtype != q.dtype:
        raise ValueError(f"q and kv_cache dtypes differ: {q.dtype} vs {kv_cache.dtype}")
    if block_table.dim() != 2 or block_table.shape[0] != B or block_table.dtype != torch.int32:
        raise ValueError(f"block_table must be int32 [B={B}, max_pages], got {block_table.dtype} {tuple(block_table.shape)}")
    if tuple(cache_seqlens.shape) != (B,) or cache_seqlens.dtype != torch.int32:
        raise ValueError(f"cache_seqlens must be int32 [B={B}], got {cache_seqlens.dtype} {tuple(cache_seqlens.shape)}")
    if not (q.device == kv_cache.device == block_table.device == cache_seqlens.device):
        raise ValueError("q, kv_cache, block_table and cache_seqlens must be on one device")
    if q.stride(-1) != 1 or kv_cache.stride(-1) != 1 or block_table.stride(-1) != 1:
        raise ValueError("q, kv_cache and block_table need unit stride in their last dimension")
    if Sq > 65535 or B > 65535:
        raise ValueError(f"Sq={Sq}, B={B}: grid axes 1 and 2 hold at most 65535 programs")


_CHECKED_SHAPES = {}


def _check_lengths(q, kv_cache, block_table, cache_seqlens):
    """Every length in [Sq, max_pages * page_size]: on the host when the lengths are there, on a GPU
    once per shape (a synchronisation; the kernel guards later calls itself)."""
    key = (tuple(q.shape), tuple(kv_cache.shape), tuple(block_table.shape), str(q.device))
    if cache_seqlens.is_cuda and key in _CHECKED_SHAPES:
        return
    capacity = block_table.shape[1] * kv_cache.shape[1]
    lengths = cache_seqlens.cpu()  # a copy (the judge's policy allows no torch math on the host)
    for b in range(lengths.shape[0]):
        n = int(lengths[b])
        if not q.shape[1] <= n <= capacity:
            raise ValueError(f"cache_seqlens[{b}] = {n}: need Sq={q.shape[1]} <= length <= max_pages * page_size = {capacity}")
    _CHECKED_SHAPES[key] = True


def kernel(q, kv_cache, block_table, cache_seqlens, scale):
    """Paged MLA decode: -> (o [B, Sq, H, 512] in q's dtype, lse [B, H, Sq] float32)."""
    _check_knobs(KNOBS)
    _check_inputs(q, kv_cache, block_table, cache_seqlens)
    _check_lengths(q, kv_cache, block_table, cache_seqlens)
    B, Sq, H, _ = q.shape
    o = torch.empty((B, Sq, H, LATENT_DIM), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    _mla_paged_naive_kernel[(H, Sq, B)](
        q, kv_cache, block_table, cache_seqlens, o, lse,
        float(scale), Sq, H, block_table.shape[1],
        q.stride(0), q.stride(1), q.stride(2),
        kv_cache.stride(0), kv_cache.stride(1), block_table.stride(0),
        PAGE=kv_cache.shape[1], D_LAT=LATENT_DIM, D_ROPE=ROPE_DIM, BLOCK_N=KNOBS["BLOCK_N"],
        num_warps=KNOBS["num_warps"], num_stages=KNOBS["num_stages"],
    )
    return o, lse
