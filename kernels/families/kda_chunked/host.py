"""Host side: which kernels run where, one cached plan per kind of call, and its launches.

Where. On Hopper with bf16 q, k, v, float32 g, TMA-compatible strides, K 32/64/128 and V a multiple of 64: the
fused Gluon preparation, then the Gluon scan. Where the scan has at most a quarter as many programs as the GPU has
SMs (the headline's 32 on the H200's 132; knob ``beside`` "wide": also where as many 128-wide programs would be) it
is launched first, the preparation beside it as its programmatic dependent, flagging each chunk once stored: there
the scan's chain is the longer stage (H200: -12 % at the headline). Elsewhere the Triton block rows and solve, then
the Gluon scan where it applies, else the Triton scan and read-out: always so on the CPU interpreter.

Plans. What depends only on a call's key (shapes, dtypes, strides and 16-byte alignment of the inputs, initial and
final state or not, device, stream) is built once: grids, argument lists, kernels compiled for the key,
intermediates, TMA descriptors, device properties. A call allocates o and the final state, writes its tensors
into the argument slots and the descriptors' ``base``, launches, and lets go of its tensors. Where the scan runs
beside, its chunk flags carry the call's generation (kept on the GPU, moved on by the scan), so nothing is zeroed
between calls. Every call writes the intermediates in full before reading them; the four most recent plans are
kept."""

import torch
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

from .gluon_prep import _kda_prep_gluon
from .gluon_scan import _kda_scan_wgmma_ws
from .knobs import KNOBS
from .rows import _kda_rows_kernel
from .scan import _kda_out_kernel, _kda_scan_kernel
from .solve import _kda_solve_kernel

BT = 32  # steps per chunk
BC = 16  # rows per block row
FLOOR = -30.0  # gates are raised to at least this before any running sum (rows.py)
LIMIT = 160.0  # a diagonal block is factored around its midpoint up to this decay span, in nats (rows.py)
SCAN_RING = 4  # chunks in the Gluon scan's TMA ring (3 and 5 were slower on the H200)
PLANS_KEPT = 4
_PLANS = {}  # key -> _Plan, least recently used first


def _tma_ok(x) -> bool:
    """Whether a TMA descriptor can take x: 16-byte aligned, every stride but the last a 16-byte multiple."""
    return x.data_ptr() % 16 == 0 and all(st * x.element_size() % 16 == 0 for st in x.stride()[:-1])


def _check(q, k, v, g, beta, h0, want_final):
    B, T, H, K = q.shape
    V = v.shape[-1]
    if tuple(k.shape) != (B, T, H, K) or tuple(g.shape) != (B, T, H, K):
        raise ValueError("q, k and g must share the shape [B, T, H, K]")
    if tuple(v.shape[:3]) != (B, T, H) or tuple(beta.shape) != (B, T, H):
        raise ValueError("v must be [B, T, H, V] and beta [B, T, H]")
    for name, x in (("k", k), ("v", v), ("g", g), ("beta", beta), ("initial_state", h0)):
        if x is not None and x.device != q.device:
            raise ValueError(f"{name} is on {x.device}, q on {q.device}: all inputs must be on one device")
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous along its last dimension")
    if not (K in (16, 32, 64, 128, 256) and V in (16, 32, 64, 128, 256)):
        raise ValueError(f"K={K} and V={V} must be powers of two in [16, 256] (tl.dot tiles)")
    if h0 is not None and (tuple(h0.shape) != (B, H, K, V) or not h0.is_contiguous()):
        raise ValueError(f"initial_state must be a contiguous [B, H, K, V] = {(B, H, K, V)} tensor")
    if T == 0 and want_final:
        raise ValueError("T must be positive")


def _desc(x, shape, strides, block, layout):
    return GluonDescriptor(x, list(shape), list(strides), list(block), layout)


def _unswizzled(bits, rank):
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=rank)


class _Launch:
    """One launch of a plan: kernel, grid, options, arguments in the kernel's order and the slots a call fills (by
    role). On a GPU the kernel is compiled and loaded with the plan (a kernel launched beside a running scan must not
    load lazily: the load would wait for the scan, which waits for it). Launch "compiled" then calls its launcher
    straight, on the caller's stream: no launch metadata and no launch hooks (a profiler's hooks do not see these
    launches), the plan's own buffers passed as addresses, which the launcher takes as they are (a tensor it asks
    for its address and checks with the driver)."""

    def __init__(self, fn, grid, args, options, roles, gpu):
        # three dimensions: a compiled kernel's launcher reads grid[2]
        self.fn, self.grid, self.options = fn, (*grid, *(1,) * (3 - len(grid))), options
        names = list(fn.arg_names)
        self.args = [args[name] for name in names]
        self.slots = [(names.index(name), role) for name, role in roles.items()]
        self.kernel = None
        if gpu:
            kernel = fn.warmup(*self.args, grid=self.grid, **options)
            if kernel.run is None:  # the launcher property loads the kernel onto the GPU
                raise RuntimeError(f"{fn.__name__} did not load")
            if KNOBS["launch"] == "compiled":
                self.kernel = (kernel.run, kernel.function, kernel.packed_metadata)
                per_call = {i for i, _ in self.slots}
                self.owned = [x for i, x in enumerate(self.args) if i not in per_call and isinstance(x, torch.Tensor)]
                self.args = [x.data_ptr() if i not in per_call and isinstance(x, torch.Tensor) else x
                             for i, x in enumerate(self.args)]

    def __call__(self, values, stream):
        args = self.args
        for i, role in self.slots:
            args[i] = values[role]
        if self.kernel is not None:
            run, function, metadata = self.kernel
            run(*self.grid, stream, function, metadata, None, None, None, *args)
        else:
            self.fn[self.grid](*args, **self.options)
        for i, _ in self.slots:  # hold no tensor of the caller's between calls
            args[i] = None


class _Plan:
    """The launches, intermediates and descriptors of one kind of call (see the module docstring)."""

    def __init__(self, q, k, v, g, beta, h0, want_final):
        _check(q, k, v, g, beta, h0, want_final)
        B, T, H, K = q.shape
        V = v.shape[-1]
        dev = q.device
        NT = max(1, triton.cdiv(T, BT))
        TP = NT * BT
        BH = B * H
        self.shape, self.want_final = (B, T, H, K, V), want_final
        self.launches, self.descs, self.flags = [], [], None
        if T == 0:
            return
        gpu = q.is_cuda
        hopper = gpu and torch.cuda.get_device_capability(dev)[0] == 9
        gluon_scan = hopper and K in (32, 64, 128) and V % 64 == 0 and v.dtype == torch.bfloat16
        fused = (gluon_scan and q.dtype == k.dtype == torch.bfloat16 and g.dtype == torch.float32
                 and all(_tma_ok(x) for x in (q, k, g, v)))
        # w, kd, qd as one [3, BH, TP, K] buffer and u, Aqk u as one [2, BH, TP, V]: one TMA copy each in the scan
        wkq = torch.empty((3, BH, TP, K), dtype=torch.bfloat16, device=dev)
        ua = torch.empty((2, BH, TP, V), dtype=torch.bfloat16, device=dev)
        g_last = torch.empty((BH, NT, K), dtype=torch.float32, device=dev)  # exp(G_last) per chunk
        self.bufs = {"w": wkq[0], "kd": wkq[1], "qd": wkq[2], "u": ua[0], "au": ua[1], "gl": g_last}
        o = torch.empty((B, T, H, V), dtype=v.dtype, device=dev)  # stands for each call's o while the plan is made
        state = {"USE_H0": h0 is not None, "STORE_HT": want_final}
        state_ptrs = {"h0_ptr": h0 if h0 is not None else g_last, "ht_ptr": g_last}
        state_roles = {**({"h0_ptr": "h0"} if h0 is not None else {}), **({"ht_ptr": "ht"} if want_final else {})}
        sizes = dict(T=T, TP=TP, NT=NT, H=H)

        if gluon_scan:
            sm_count = torch.cuda.get_device_properties(dev).multi_processor_count
            # two compute warpgroups per program where one-warpgroup programs would outnumber the SMs
            scan_bv = 128 if V % 128 == 0 and BH * (V // 64) > sm_count else 64
        if fused:
            beside = BH * (V // scan_bv) <= sm_count // 4
            if KNOBS["beside"] == "wide" and not beside and V % 128 == 0 and BH * (V // 128) <= sm_count // 4:
                beside, scan_bv = True, 128  # fewer, wider scan programs: more SMs left to the preparation
            if beside:
                # a flag per chunk, then the call's generation and the scan's ticket (gluon_scan.py): zeroed once
                self.flags = torch.zeros((BH * NT + 2,), dtype=torch.int32, device=dev)
            box = [1, BT, 1, K]
            d_q = _desc(q, q.shape, q.stride(), box, _unswizzled(16, 4))
            d_k = _desc(k, k.shape, k.stride(), box, _unswizzled(16, 4))
            d_g = _desc(g, g.shape, g.stride(), box, _unswizzled(32, 4))
            # swizzled: the products read v's tile from shared memory as it lands
            d_v = _desc(v, v.shape, v.stride(), [1, BT, 1, V], gl.NVMMASharedLayout.get_default_for([1, BT, 1, V], gl.bfloat16))
            self.descs += [("q", d_q), ("k", d_k), ("g", d_g), ("v", d_v)]
            prep = dict(q_desc=d_q, k_desc=d_k, g_desc=d_g, v_desc=d_v, g_ptr=g, beta_ptr=beta, w_ptr=wkq[0],
                        kd_ptr=wkq[1], qd_ptr=wkq[2], u_ptr=ua[0], au_ptr=ua[1], gl_ptr=g_last,
                        flag_ptr=self.flags if beside else g_last, scale=1.0, **sizes,
                        s_gb=g.stride(0), s_gt=g.stride(1), s_gh=g.stride(2),
                        s_bb=beta.stride(0), s_bt=beta.stride(1), s_bh=beta.stride(2),
                        K=K, V=V, BT=BT, FLOOR=FLOOR, LIMIT=LIMIT, WR=128 // K, FLAG=beside)
            # uncapped at K 128 (~200 B spilled, two programs per SM: faster than three at 168 registers), capped below
            options = dict(num_warps=4, launch_pdl=beside, **({"maxnreg": 168} if K < 128 else {}))
            prep_launch = _Launch(_kda_prep_gluon, (BH, NT) if beside else (NT, BH), prep, options,
                                  {"g_ptr": "g", "beta_ptr": "beta", "scale": "scale"}, gpu)
        else:
            aqk = torch.empty((2, BH, TP, BT), dtype=torch.bfloat16, device=dev)  # Aqk as bf16 hi, lo
            akk = torch.empty((BH, TP, BT), dtype=torch.float32, device=dev)
            g_sums = torch.empty((BH, TP, K), dtype=torch.float32, device=dev)  # each block's running sums
            g_tots = torch.empty((BH, NT, BT // BC, K), dtype=torch.float32, device=dev)  # and its totals
            self.bufs.update(aqk=aqk, akk=akk, gs=g_sums, gt=g_tots)
            common = dict(q_ptr=q, k_ptr=k, beta_ptr=beta, aqk_ptr=aqk, akk_ptr=akk, gs_ptr=g_sums, gt_ptr=g_tots,
                          scale=1.0, **sizes, lo_off=BH * TP * BT, s_qb=q.stride(0), s_qt=q.stride(1),
                          s_qh=q.stride(2), s_kb=k.stride(0), s_kt=k.stride(1), s_kh=k.stride(2),
                          s_bb=beta.stride(0), s_bt=beta.stride(1), s_bh=beta.stride(2), K=K, BT=BT, BC=BC)
            roles = {"q_ptr": "q", "k_ptr": "k", "beta_ptr": "beta", "scale": "scale"}
            bk = min(64, K)
            rows = dict(common, g_ptr=g, s_gb=g.stride(0), s_gt=g.stride(1), s_gh=g.stride(2), BK=bk, LIMIT=LIMIT,
                        FLOOR=FLOOR, LOG_BC=4, SB=4, LOG_NS=2, DKS=8)
            self.launches.append(_Launch(_kda_rows_kernel, (NT * (BT // BC), BH), rows,
                                         dict(num_warps=8, num_stages=1, **({"maxnreg": 168} if bk == 16 else {})),
                                         {**roles, "g_ptr": "g"}, gpu))
            solve = dict(common, v_ptr=v, w_ptr=wkq[0], u_ptr=ua[0], kd_ptr=wkq[1], qd_ptr=wkq[2], gl_ptr=g_last,
                         au_ptr=ua[1], s_vb=v.stride(0), s_vt=v.stride(1), s_vh=v.stride(2), V=V, BK=min(64, K),
                         BVP=min(64, V))
            self.launches.append(_Launch(_kda_solve_kernel, (NT, BH), solve, dict(num_warps=2, num_stages=1, maxnreg=168),
                                         {**roles, "v_ptr": "v"}, gpu))

        if gluon_scan:
            o_box = [1, BT, scan_bv]
            # o [B, T, H, V] (contiguous: made by the call) as [B, T, H * V]: a tile never runs past its batch's T
            d_o = _desc(o, (B, T, H * V), (T * H * V, H * V, 1), o_box, gl.NVMMASharedLayout.get_default_for(o_box, gl.bfloat16))
            self.descs.append(("o", d_o))

            def stacked(t, width, block_w):
                flat = t.view(t.shape[0], BH * TP, width)
                block = [triton.next_power_of_2(t.shape[0]), BT, block_w]
                return _desc(flat, flat.shape, (BH * TP * width, width, 1), block,
                             gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16))

            d_gl = _desc(g_last.view(BH * NT, K), (BH * NT, K), (K, 1), [1, K], _unswizzled(32, 2))
            scan = dict(wkq_desc=stacked(wkq, K, K), ua_desc=stacked(ua, V, scan_bv), g_desc=d_gl, o_desc=d_o,
                        **state_ptrs, TP=TP, NT=NT, H=H, flag_ptr=self.flags if self.flags is not None else g_last,
                        K=K, V=V, BT=BT, BV=scan_bv, NS=SCAN_RING, **state, WAIT=self.flags is not None)
            scan_launch = _Launch(_kda_scan_wgmma_ws, (V // scan_bv, BH), scan, dict(num_warps=scan_bv // 16),
                                  state_roles, gpu)
            if fused:
                self.launches += [scan_launch, prep_launch] if self.flags is not None else [prep_launch, scan_launch]
            else:
                self.launches.append(scan_launch)
        else:
            # the state entering every chunk, bf16 (its products take it in bf16), for the read-out
            hbuf = torch.empty((BH, NT, K, V), dtype=torch.bfloat16, device=dev)
            bv = min(16, V)
            scan = dict(w_ptr=wkq[0], u_ptr=ua[0], kd_ptr=wkq[1], gl_ptr=g_last, **state_ptrs, hbuf_ptr=hbuf,
                        TP=TP, NT=NT, K=K, V=V, BT=BT, BV=bv, **state)
            self.launches.append(_Launch(_kda_scan_kernel, (triton.cdiv(V, bv), BH), scan,
                                         dict(num_warps=2, num_stages=3), state_roles, gpu))
            obv = min(V, 64)
            out = dict(qd_ptr=wkq[2], hbuf_ptr=hbuf, au_ptr=ua[1], o_ptr=o, **sizes,
                       s_ob=T * H * V, s_ot=H * V, s_oh=V, K=K, V=V, BT=BT, BV=obv)
            self.launches.append(_Launch(_kda_out_kernel, (NT, triton.cdiv(V, obv), BH), out,
                                         dict(num_warps=4, num_stages=2), {"o_ptr": "o"}, gpu))

    def __call__(self, q, k, v, g, beta, scale, h0, stream):
        B, T, H, K, V = self.shape
        o = torch.empty((B, T, H, V), dtype=v.dtype, device=q.device)
        final = torch.empty((B, H, K, V), dtype=torch.float32, device=q.device) if self.want_final else None
        values = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "h0": h0, "o": o, "ht": final,
                  "scale": float(K ** -0.5 if scale is None else scale)}
        for role, desc in self.descs:
            desc.base = values[role]
        for launch in self.launches:
            launch(values, stream)
        for _, desc in self.descs:
            desc.base = None
        return o, final


def kernel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
    """KDA forward. q, k, g [B,T,H,K]; v [B,T,H,V]; beta [B,T,H]; returns (o [B,T,H,V] in v's dtype, the final
    state [B,H,K,V] float32 or None)."""
    h0 = initial_state
    tensors = (q, k, v, g, beta) if h0 is None else (q, k, v, g, beta, h0)
    stream = torch.cuda.current_stream(q.device).cuda_stream if q.is_cuda else None
    key = (q.shape, k.shape, v.shape, g.shape, beta.shape, q.dtype, k.dtype, v.dtype, g.dtype, beta.dtype,
           q.stride(), k.stride(), v.stride(), g.stride(), beta.stride(), bool(output_final_state),
           tuple((x.get_device(), x.data_ptr() % 16 == 0) for x in tensors),
           None if h0 is None else (h0.shape, h0.stride(), h0.dtype), stream)
    try:
        plan = _PLANS.get(key)
        if plan is None:
            plan = _Plan(q, k, v, g, beta, h0, bool(output_final_state))
            while len(_PLANS) >= PLANS_KEPT:  # the oldest plan goes
                _PLANS.pop(next(iter(_PLANS)))
            _PLANS[key] = plan
        return plan(q, k, v, g, beta, scale, h0, stream)
    except Exception as err:
        # Triton's OutOfResources (shared memory or registers) named without importing its module
        if type(err).__name__ == "OutOfResources":
            raise ValueError(f"this GPU cannot run the kernels at K={q.shape[-1]}, V={v.shape[-1]}: {err}") from err
        raise
