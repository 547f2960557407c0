"""MLA causal prefill written in Gluon (Triton's explicit-layout dialect), beside the Triton family.

    PYTHONPATH=. python3 benchmarks/dev_gluon_prefill.py --offline        # CPU: compile for sm_90, SASS summary
    PYTHONPATH=. python3 benchmarks/dev_gluon_prefill.py [--out DIR]      # H200: check and time

Why (kernels/notes/mla.md): the Triton kernel drains the tensor cores five times per 64-key tile
(after each of its three score dots and two P V dots) and issues at ~23 %. Here every wgmma is
asynchronous and waited once per tile: a tile's score dots are issued right behind the previous
tile's P V, and the one wait returns both. KV tiles arrive by TMA into a two-stage ring (mbarriers);
the next tile's copy is issued as soon as the P V that read its stage has completed.

One program per (query, batch): the 64 heads of one query are the 64 rows (H must be 64); the two
warpgroups split the score tile's keys and the 512 value columns, as the Triton QK_SPLIT kernel does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_init,
                                                               warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

DN, DR, ROWS, BLOCK_N = 512, 64, 64, 64
LOG2E = 1.4426950408889634


@gluon.jit
def _attend(j, s_raw, acc, m_i, l_el, q_lat, q_rope, k_lat, k_rope, p_smem, ready, k_lat_desc, k_rope_desc,
            kv_row0, n_tiles, limit, qk_scale, cols, row_o: gl.constexpr, DN: gl.constexpr, BLOCK_N: gl.constexpr):
    """Key tile j: its score dots go out behind tile j - 1's P V, one wait returns both, then the softmax and
    this tile's P V (left in flight). Fetches tile j + 1 into the stage tile j - 1 has released."""
    kv_bytes: gl.constexpr = BLOCK_N * (DN + k_rope.shape[2]) * 2
    st = j % 2
    mbarrier.wait(ready.index(st), (j // 2) & 1)
    s_raw = warpgroup_mma(q_rope, k_rope.index(st).permute((1, 0)), s_raw, use_acc=False, is_async=True)
    s_raw = warpgroup_mma(q_lat, k_lat.index(st).permute((1, 0)), s_raw, is_async=True)
    s_raw, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s_raw, acc))
    nxt = j + 1
    if (j >= 1) & (nxt < n_tiles):
        gl.thread_barrier()  # the other warpgroup's P V of tile j - 1 has completed too: its stage may be overwritten
        ns = nxt % 2
        mbarrier.expect(ready.index(ns), kv_bytes)
        tma.async_copy_global_to_shared(k_lat_desc, [kv_row0 + nxt * BLOCK_N, 0], ready.index(ns), k_lat.index(ns))
        tma.async_copy_global_to_shared(k_rope_desc, [kv_row0 + nxt * BLOCK_N, DN], ready.index(ns), k_rope.index(ns))
    s = s_raw * qk_scale
    s = gl.where((j * BLOCK_N + cols)[None, :] <= limit, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s - m_new[:, None])
    l_el = l_el * alpha[:, None] + p
    gl.thread_barrier()  # both warpgroups are past their wait: nothing reads p_smem any more
    p_smem.store(p.to(gl.bfloat16))
    fence_async_shared()
    gl.thread_barrier()  # both halves of P are in shared memory before either warpgroup's P V reads it
    acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    acc = warpgroup_mma(p_smem, k_lat.index(st), acc, is_async=True)
    return s_raw, acc, m_new, l_el


@gluon.jit
def _prefill_gluon(q_lat_desc, q_rope_desc, k_lat_desc, k_rope_desc, o, lse, Sq, Skv, qk_scale,
                   DN: gl.constexpr, DR: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr):
    s_idx = Sq - 1 - gl.program_id(0)  # heaviest (latest queries) first
    b = gl.program_id(1)
    limit = s_idx + Skv - Sq  # last visible key
    n_tiles = limit // BLOCK_N + 1
    q_row0 = (b * Sq + s_idx) * ROWS  # q as [B * Sq * 64, 576] rows: this query's 64 heads
    kv_row0 = b * Skv

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, BLOCK_N], gl.bfloat16)

    q_lat = gl.allocate_shared_memory(gl.bfloat16, [ROWS, DN], q_lat_desc.layout)
    q_rope = gl.allocate_shared_memory(gl.bfloat16, [ROWS, DR], q_rope_desc.layout)
    k_lat = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, DN], k_lat_desc.layout)
    k_rope = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, DR], k_rope_desc.layout)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [ROWS, BLOCK_N], p_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(ready.index(0), count=1)
    mbarrier.init(ready.index(1), count=1)
    fence_async_shared()

    kv_bytes: gl.constexpr = BLOCK_N * (DN + DR) * 2
    mbarrier.expect(q_bar, ROWS * (DN + DR) * 2)
    tma.async_copy_global_to_shared(q_lat_desc, [q_row0, 0], q_bar, q_lat)
    tma.async_copy_global_to_shared(q_rope_desc, [q_row0, DN], q_bar, q_rope)
    mbarrier.expect(ready.index(0), kv_bytes)
    tma.async_copy_global_to_shared(k_lat_desc, [kv_row0, 0], ready.index(0), k_lat.index(0))
    tma.async_copy_global_to_shared(k_rope_desc, [kv_row0, DN], ready.index(0), k_rope.index(0))
    more = n_tiles > 1
    mbarrier.expect(ready.index(1), kv_bytes, pred=more)
    tma.async_copy_global_to_shared(k_lat_desc, [kv_row0 + BLOCK_N, 0], ready.index(1), k_lat.index(1), pred=more)
    tma.async_copy_global_to_shared(k_rope_desc, [kv_row0 + BLOCK_N, DN], ready.index(1), k_rope.index(1), pred=more)

    m_i = gl.full([ROWS], -1.0e30, gl.float32, layout=row_s)
    l_el = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)  # row sums kept per score element, reduced at the end
    acc = warpgroup_mma_init(gl.zeros([ROWS, DN], gl.float32, layout=o_layout))  # carried as an in-flight accumulator
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    # The score accumulator is carried through the loop and overwritten (use_acc=False): a fresh zero tensor would
    # be written between the previous P V's issue and its wait, and ptxas then serialises every wgmma (C7515).
    s_raw = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
    mbarrier.wait(q_bar, 0)
    # Tile 0 outside the loop: with a loop that may run zero times, the skip path writes acc's registers and ptxas
    # serialises every wgmma of the kernel (C7515).
    s_raw, acc, m_i, l_el = _attend(0, s_raw, acc, m_i, l_el, q_lat, q_rope, k_lat, k_rope, p_smem, ready, k_lat_desc, k_rope_desc,
                                    kv_row0, n_tiles, limit, qk_scale, cols, row_o, DN, BLOCK_N)
    for j in range(1, n_tiles):
        s_raw, acc, m_i, l_el = _attend(j, s_raw, acc, m_i, l_el, q_lat, q_rope, k_lat, k_rope, p_smem, ready, k_lat_desc,
                                        k_rope_desc, kv_row0, n_tiles, limit, qk_scale, cols, row_o, DN, BLOCK_N)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.invalidate(q_bar)
    mbarrier.invalidate(ready.index(0))
    mbarrier.invalidate(ready.index(1))

    l_i = gl.sum(l_el, 1)
    out = acc / gl.convert_layout(l_i, row_o)[:, None]
    heads_o = gl.arange(0, ROWS, layout=row_o)
    cols_o = gl.arange(0, DN, layout=gl.SliceLayout(0, o_layout))
    o_ptr = o + (q_row0 + heads_o).to(gl.int64)[:, None] * DN + cols_o[None, :]
    gl.store(o_ptr, out.to(gl.bfloat16))
    heads_l = gl.arange(0, ROWS, layout=row_s)
    gl.store(lse + (b * ROWS + heads_l) * Sq + s_idx, (m_i + gl.log2(l_i)) * 0.6931471805599453)


def _layout(shape):
    return gl.NVMMASharedLayout.get_default_for(shape, gl.bfloat16)


def prefill(q: torch.Tensor, kv: torch.Tensor, scale: float):
    """o [B, Sq, 64, 512] bf16, lse [B, 64, Sq] fp32 for contiguous bf16 q [B, Sq, 64, 576], kv [B, Skv, 576]."""
    B, Sq, H, D = q.shape
    Skv = kv.shape[1]
    assert H == ROWS and D == DN + DR and q.is_contiguous() and kv.is_contiguous() and q.dtype == torch.bfloat16
    assert B == 1 or Skv % BLOCK_N == 0, "a key tile may not run into the next batch's keys"
    q2, kv2 = q.view(B * Sq * H, D), kv.view(B * Skv, D)
    q_lat_desc = TensorDescriptor(q2, list(q2.shape), [D, 1], [ROWS, DN], _layout([ROWS, DN]))
    q_rope_desc = TensorDescriptor(q2, list(q2.shape), [D, 1], [ROWS, DR], _layout([ROWS, DR]))
    k_lat_desc = TensorDescriptor(kv2, list(kv2.shape), [D, 1], [BLOCK_N, DN], _layout([BLOCK_N, DN]))
    k_rope_desc = TensorDescriptor(kv2, list(kv2.shape), [D, 1], [BLOCK_N, DR], _layout([BLOCK_N, DR]))
    o = torch.empty((B, Sq, H, DN), device=q.device, dtype=q.dtype)
    lse = torch.empty((B, H, Sq), device=q.device, dtype=torch.float32)
    _prefill_gluon[(Sq, B)](q_lat_desc, q_rope_desc, k_lat_desc, k_rope_desc, o, lse, Sq, Skv, float(scale) * LOG2E,
                            DN=DN, DR=DR, ROWS=ROWS, BLOCK_N=BLOCK_N, num_warps=8)
    return o, lse


def offline() -> int:
    """Compile for sm_90 without a GPU; print resources and the loop's wgmma waits."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    def desc(shape):
        return f"tensordesc<bf16[{shape[0]}, {shape[1]}],{_layout(shape)!r}>"

    sig = {"q_lat_desc": desc([ROWS, DN]), "q_rope_desc": desc([ROWS, DR]), "k_lat_desc": desc([BLOCK_N, DN]),
           "k_rope_desc": desc([BLOCK_N, DR]), "o": "*bf16", "lse": "*fp32", "Sq": "i32", "Skv": "i32", "qk_scale": "fp32",
           "DN": "constexpr", "DR": "constexpr", "ROWS": "constexpr", "BLOCK_N": "constexpr"}
    src = GluonASTSource(_prefill_gluon, sig, constexprs={"DN": DN, "DR": DR, "ROWS": ROWS, "BLOCK_N": BLOCK_N})
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    sys.path.insert(0, str(Path(__file__).parent))
    from sass_mla import classify, counts, regions, sass_of  # noqa: E402 - the SASS helpers of the Triton kernel's analysis

    sass = sass_of(c, Path("/tmp/gluon_prefill_sass"), "gluon-prefill")
    pro, loop, epi = regions(sass)
    lc, _ = counts(loop)
    order = []
    for _, x in loop:
        k = classify(x)
        if k in {"HGMMA", "WG.DEPBAR(wait)", "BAR.SYNC", "MUFU.EX2", "UTMALDG(TMA)", "SYNCS(mbarrier)", "STS", "LDS"}:
            if order and order[-1][0] == k:
                order[-1][1] += 1
            else:
                order.append([k, 1])
    print(f"shared {c.metadata.shared} B, loop {lc['total']} instr/warp, HGMMA {lc.get('HGMMA', 0)}, BAR {lc.get('BAR.SYNC', 0)}, "
          f"EX2 {lc.get('MUFU.EX2', 0)}")
    print(" -> ".join(f"{k}x{n}" for k, n in order))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--offline", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    if args.offline:
        return offline()
    import importlib.util

    import triton.testing as tt

    from pytest_kopt.problems.base import rel_rms
    from pytest_kopt.problems.mla import MLA, MLA_PREFILL

    spec = importlib.util.spec_from_file_location("best_prefill", Path(__file__).parents[1] / "kernels" / "best" / "mla-prefill.py")
    best = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(best)
    rows = []
    cases = [{"B": 1, "Sq": 200, "H": 64, "Skv": 200}, {"B": 1, "Sq": 70, "H": 64, "Skv": 333}, {"B": 2, "Sq": 128, "H": 64, "Skv": 256},
             {"B": 1, "Sq": 1, "H": 64, "Skv": 1}] + list(MLA_PREFILL.headline_cases)
    for i, case in enumerate(cases):
        inputs = MLA.make_inputs(case, device="cuda", seed=100 + i, dtype=torch.bfloat16)
        want_o, want_lse = MLA_PREFILL.reference(**inputs)
        row = {"case": MLA.describe(case)}
        try:
            o, lse = prefill(**inputs)
            torch.cuda.synchronize()
            row.update(rel_o=rel_rms(o, want_o), rel_lse=rel_rms(lse, want_lse), finite=bool(torch.isfinite(o).all()))
            if case in MLA_PREFILL.headline_cases:
                row["gluon_us"] = tt.do_bench(lambda: prefill(**inputs), return_mode="median") * 1e3
                row["best_us"] = tt.do_bench(lambda: best.kernel(**inputs), return_mode="median") * 1e3
                row["gluon_us_again"] = tt.do_bench(lambda: prefill(**inputs), return_mode="median") * 1e3
        except Exception as exc:  # noqa: BLE001 - report and go on
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        print(json.dumps(row), flush=True)
        rows.append(row)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "dev_gluon_prefill.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
