"""The state pass and the read-out as one warp-specialised Gluon kernel for Hopper, one program per (BV = 64 or 128
value columns, batch * head). Its compute warpgroup(s) hold S^T [BV, K] as a wgmma accumulator: its bf16 copy is
the register operand of S^T w^T and of the read-out S^T qd^T, and delta^T = u^T - S^T w^T (a bf16 hi/lo pair) that
of S^T <- gl (.) S^T + delta^T kd, accumulated into the state itself: the state never leaves registers. A loader
warp brings each chunk's w, kd, qd (one [3, BH, TP, K] buffer), u, au (one [2, BH, TP, V]) and gl by TMA into a
ring of four stages, a storer warp sends o out by TMA; the compute warpgroup only waits on mbarriers. WAIT: the
loader waits for each chunk's flag, set by the preparation running beside (host.py) to the call's generation + 1;
the generation lives on the GPU behind the flags, so a call (or a graph's replay) zeroes nothing."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# chunks whose flags the loader checks with one load and one pair of fences
_WAIT_GROUP = gl.constexpr(8)


@gluon.jit
def _wgmma_chunk(S, ws, wkq_stage, ua_stage, g_stage, LS: gl.constexpr, LD: gl.constexpr,
                 K: gl.constexpr, BT: gl.constexpr):
    """One chunk of the state pass: returns the update of S^T still in flight (the caller waits for it), w's
    product, and o^T = au^T + S^T qd^T (complete)."""
    A_WS: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=LD, k_width=2)
    A_UPD: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=LS, k_width=2)
    tiles = wkq_stage.reshape([4 * BT, K])
    ua_t = ua_stage.reshape([2 * BT, ua_stage.shape[2]])
    # Accumulator registers are written only here, before any wgmma is issued (ptxas waits for every wgmma in
    # flight before one is written; offline sm_90: a wait 0 behind the read-out's product): the state is
    # decayed, and the read-out's accumulator starts at au^T, so that o^T = au^T + S^T qd^T needs no add.
    ot = ua_t.slice(BT, BT).permute((1, 0)).load(LD).to(gl.float32)
    s_a = gl.convert_layout(S.to(gl.bfloat16), A_WS)
    S = S * g_stage.reshape([K]).load(gl.SliceLayout(0, LS))[None, :]
    ws = warpgroup_mma(s_a, tiles.slice(0, BT).permute((1, 0)), ws, use_acc=False, is_async=True)
    ot = warpgroup_mma(s_a, tiles.slice(2 * BT, BT).permute((1, 0)), ot, is_async=True)
    u_t = ua_t.slice(0, BT).permute((1, 0)).load(LD).to(gl.float32)
    ws = warpgroup_mma_wait(num_outstanding=1, deps=(ws,))
    d = u_t - ws
    # delta's hi/lo pair: hi truncated to bf16 by masking (exact, no round trip through bf16), lo the rounded rest
    d_hi_f = (d.to(gl.int32, bitcast=True) & -65536).to(gl.float32, bitcast=True)
    kd_t = tiles.slice(BT, BT)
    S = warpgroup_mma(gl.convert_layout(d_hi_f.to(gl.bfloat16), A_UPD), kd_t, S, is_async=True)
    S = warpgroup_mma(gl.convert_layout((d - d_hi_f).to(gl.bfloat16), A_UPD), kd_t, S, is_async=True)
    # the read-out's product is the oldest group in flight: o is ready while the update still runs
    ot = warpgroup_mma_wait(num_outstanding=2, deps=(ot,))
    return S, ws, ot


@gluon.jit
def _ws_compute(wkq_s, ua_s, g_s, o_s, ready, empty, o_ready, o_free, h0_ptr, ht_ptr, i_bh, v0, NT,
                K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr, NS: gl.constexpr,
                USE_H0: gl.constexpr, STORE_HT: gl.constexpr):
    """The compute warpgroup(s): wait for a chunk, step the state, hand the stage back and o over."""
    LS: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[BV // 16, 1], instr_shape=[16, K, 16])
    LD: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[BV // 16, 1], instr_shape=[16, BT, 16])
    rv = gl.arange(0, BV, layout=gl.SliceLayout(1, LS))
    ck = gl.arange(0, K, layout=gl.SliceLayout(0, LS))
    st_off = (i_bh * K + ck[None, :]).to(gl.int64) * V + v0 + rv[:, None]  # S^T[v, k] = S[k, v0 + v]
    if USE_H0:
        S = gl.load(h0_ptr + st_off).to(gl.float32)
    else:
        S = gl.zeros([BV, K], gl.float32, layout=LS)
    # w's product's accumulator is carried and overwritten (use_acc=False): a fresh zero tensor per step would
    # write accumulator registers while a wgmma is in flight, and ptxas would then serialise every wgmma.
    ws = gl.zeros([BV, BT], gl.float32, layout=LD)
    for n in range(NT):
        st = n % NS
        mbarrier.wait(ready.index(st), (n // NS) & 1)
        S, ws, ot = _wgmma_chunk(S, ws, wkq_s.index(st), ua_s.index(st), g_s.index(st), LS, LD, K, BT)
        ob = n % 2
        mbarrier.wait(o_free.index(ob), ((n // 2) & 1) ^ 1)  # the store of chunk n - 2 has read this buffer
        o_s.index(ob).reshape([BT, BV]).permute((1, 0)).store(ot.to(gl.bfloat16))
        fence_async_shared()
        mbarrier.arrive(o_ready.index(ob), count=1)
        S = warpgroup_mma_wait(num_outstanding=0, deps=(S,))
        fence_async_shared()  # this stage's generic-proxy reads are ordered before the loader's next TMA write
        mbarrier.arrive(empty.index(st), count=1)
    if STORE_HT:
        gl.store(ht_ptr + st_off, S)


@gluon.jit
def _ws_wait_chunks(flags_ptr, n0, NT, target, G: gl.constexpr):
    """Spin until chunks n0 .. n0 + G - 1 are flagged with this call's ``target`` (past NT: done), then order their
    stores before the TMA loads that follow (a strong load and a fence: the acquire; the proxy fence: the TMA's async
    proxy). Checked per chunk, the round trip and fences cost more than a scan step (H200: 330 against 163 us at the
    headline). A preparation that never runs beside (e.g. serialised by a profiler) would leave it spinning: after
    ~2^24 polls it traps."""
    offs = n0 + gl.arange(0, G, layout=gl.BlockedLayout([1], [32], [1], [0]))
    flagged = gl.load(flags_ptr + offs, mask=offs < NT, other=target, volatile=True) == target
    done = gl.min(flagged.to(gl.int32), axis=0)
    polls = 0
    while done == 0:
        polls += 1
        if polls > 16777216:
            gl.inline_asm_elementwise("trap; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        flagged = gl.load(flags_ptr + offs, mask=offs < NT, other=target, volatile=True) == target
        done = gl.min(flagged.to(gl.int32), axis=0)
    gl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tfence.proxy.async.global; // $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _ws_loader(wkq_desc, ua_desc, g_desc, o_desc, wkq_s, ua_s, g_s, o_s, ready, empty, o_ready, o_free,
               row0, g_row0, v0, o_row, o_col, NT, flag_ptr, target, BT: gl.constexpr, NS: gl.constexpr,
               WAIT: gl.constexpr):
    """The loader warp: chunk n's tiles into stage n % NS once the compute warpgroup has handed that stage back
    (and, with WAIT, once the preparation running beside the scan has stored them)."""
    nbytes: gl.constexpr = wkq_desc.block_type.nbytes + ua_desc.block_type.nbytes + g_desc.block_type.nbytes
    for n in range(NT):
        st = n % NS
        if WAIT:
            if n % _WAIT_GROUP == 0:
                _ws_wait_chunks(flag_ptr + g_row0, n, NT, target, _WAIT_GROUP)
        mbarrier.wait(empty.index(st), ((n // NS) & 1) ^ 1)  # barriers start with phase 1 complete: no wait at first
        mbarrier.expect(ready.index(st), nbytes)
        tma.async_copy_global_to_shared(wkq_desc, [0, row0 + n * BT, 0], ready.index(st), wkq_s.index(st))
        tma.async_copy_global_to_shared(ua_desc, [0, row0 + n * BT, v0], ready.index(st), ua_s.index(st))
        tma.async_copy_global_to_shared(g_desc, [g_row0 + n, 0], ready.index(st), g_s.index(st))


@gluon.jit
def _ws_storer(wkq_desc, ua_desc, g_desc, o_desc, wkq_s, ua_s, g_s, o_s, ready, empty, o_ready, o_free,
               row0, g_row0, v0, o_row, o_col, NT, flag_ptr, target, BT: gl.constexpr, NS: gl.constexpr,
               WAIT: gl.constexpr):
    """The storer warp: o of chunk n from its buffer by TMA store; a buffer is handed back once its store has read
    it (one store left in flight)."""
    for n in range(NT):
        ob = n % 2
        mbarrier.wait(o_ready.index(ob), (n // 2) & 1)
        tma.async_copy_shared_to_global(o_desc, [o_row, n * BT, o_col], o_s.index(ob))
        tma.store_wait(pendings=1)
        mbarrier.arrive(o_free.index((n + 1) % 2), count=1, pred=n >= 1)
    tma.store_wait(pendings=0)


@gluon.jit
def _kda_scan_wgmma_ws(wkq_desc, ua_desc, g_desc, o_desc, h0_ptr, ht_ptr, TP, NT, H, flag_ptr,
                       K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr, NS: gl.constexpr,
                       USE_H0: gl.constexpr, STORE_HT: gl.constexpr, WAIT: gl.constexpr):
    """Grid (V // BV, batch * heads), BV // 16 warps of compute and two of TMA. The w, kd, qd box is 4 deep (a
    power of two): its fourth slot lies past the tensor, which TMA fills with zeros without reading memory."""
    gen_ptr = flag_ptr + gl.num_programs(1) * NT  # behind the flags: the call's generation, then its ticket
    if WAIT:
        # the preparation (launched next, programmatically dependent) may start as soon as every scan program runs
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)
        target = gl.load(gen_ptr, volatile=True) + 1  # the flag value of this call's chunks
    else:
        target = 0
    i_v = gl.program_id(0)
    i_bh = gl.program_id(1)
    v0 = i_v * BV
    wkq_s = gl.allocate_shared_memory(gl.bfloat16, [NS, 4, BT, K], wkq_desc.layout)
    ua_s = gl.allocate_shared_memory(gl.bfloat16, [NS, 2, BT, BV], ua_desc.layout)
    g_s = gl.allocate_shared_memory(gl.float32, [NS, 1, K], g_desc.layout)
    o_s = gl.allocate_shared_memory(gl.bfloat16, [2, 1, BT, BV], o_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    o_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    o_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NS):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(o_ready.index(i), count=1)
        mbarrier.init(o_free.index(i), count=1)
    fence_async_shared()
    worker_args = (wkq_desc, ua_desc, g_desc, o_desc, wkq_s, ua_s, g_s, o_s, ready, empty, o_ready, o_free,
                   i_bh * TP, i_bh * NT, v0, i_bh // H, (i_bh % H) * V + v0, NT, flag_ptr, target, BT, NS, WAIT)
    gl.warp_specialize([
        (_ws_compute, (wkq_s, ua_s, g_s, o_s, ready, empty, o_ready, o_free, h0_ptr, ht_ptr, i_bh, v0, NT,
                       K, V, BT, BV, NS, USE_H0, STORE_HT)),
        (_ws_loader, worker_args),
        (_ws_storer, worker_args),
    ], [1, 1], [24, 24])
    if WAIT:
        # the call's last scan program to finish moves the generation on, so the flags need no zeroing before the
        # next call (nor a memset in a captured graph): every flag has been waited for by then, and every
        # preparation program read the generation before it flagged its chunk
        ticket_ptr = gen_ptr + 1
        if gl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu") == gl.num_programs(0) * gl.num_programs(1) - 1:
            gl.store(ticket_ptr, 0)
            gl.store(gen_ptr, target)
