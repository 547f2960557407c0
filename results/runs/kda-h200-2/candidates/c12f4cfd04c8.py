"""KDA forward, chunk-parallel: prepare every chunk at once, scan the state, read out.

Per (batch, head) the KDA recurrence keeps a K x V float32 state S; per step t
``S = exp(g_t) * S; S += beta_t k_t (v_t - S^T k_t)^T; o_t = S^T (scale q_t)``.
Cut the sequence into chunks of BT steps and write G_i for the running sum of g from the
chunk's start to step i (inclusive).  Unrolling the recurrence inside a chunk that starts from
state S0 (the UT / WY form of the delta rule):

    delta = u - w S0                       the delta-rule corrections, one row per step
    u     = A (V),  w = A (exp(G) * K)     A = (I + Akk)^-1 diag(beta)
    Akk_ij = beta_i <k_i, exp(G_i - G_j) k_j>          (j < i)
    Aqk_ij = scale <q_i, exp(G_i - G_j) k_j>           (j <= i)
    o      = (scale exp(G) * Q) S0 + Aqk delta
    S_end  = exp(G_last) * S0 + (exp(G_last - G) * K)^T delta

Stages (three launches by default; ``fuse_prep`` folds the first two into one (BT 32), and without
``fuse_output`` a fourth computes the read-out):

1. block rows -- ``_kda_prep_kernel`` STAGE 1, one program per (chunk, BC-row block,
   batch*head) (``block_prog="chunk"``: one per (chunk, batch*head), version 5 below): that block row of Aqk (scaled; stored as bf16 hi + lo halves) and of Akk
   (beta-scaled, strictly lower, float32 scratch).  With ``subst="rows"`` (version 4) the program
   also inverts its own diagonal block: (I + L)^-1 = (I - L)(I + L^2)(I + L^4)(I + L^8) for the
   strictly lower BC x BC block L (nilpotent, so exact), six float32 FMA products of 16 x 16,
   stored in the scratch in the diagonal block's place.
2. solve -- STAGE 2, one program per (chunk, batch*head): forward substitution on the BC x BC
   diagonal blocks of I + Akk (all blocks side by side, float32; ``subst="direct"`` works on the
   transpose with each step's Akk rows loaded in place, ``"extract"`` is version 2's loop;
   ``"rows"`` loads the inverses the block rows stored, no substitution at all), then
   the block-level product
   (I - N)(I + N^2)(I + N^4)... (exact: N is nilpotent; ``merge`` = float32 FMA or bf16 hi/lo
   tensor-core products), then the WY factors w = A (exp(G) k), u = A v (A = inverse times
   diag(beta)) and the pre-decayed tiles the scan reads: kd = exp(G_last - G) k,
   qd = scale exp(G) q, gl = exp(G_last).  With ``readout="pre"`` (default) it also folds the
   read-out's intra-chunk part in: o = qd S0 + Aqk (u - w S0) = qd' S0 + au with
   qd' = qd - Aqk w (bf16, stored in qd's place) and au = Aqk u (float32).
3. scan -- ``_kda_scan_kernel``, one program per (V-block, batch*head), walking the chunks in
   order with its K x BV slice of the state in registers (``scan_layout`` "kv": S [K, BV];
   "vk": S^T [BV, K], so the state and delta are the register-side operands of every product):
   delta = u - w S, S = gl S + kd^T delta, and with ``fuse_output`` o = qd' S + au
   (``readout="aqk"``: o = qd S + Aqk delta, version 2's read-out, three more products and the
   Aqk tiles per step).
4. ``_kda_out_kernel`` (only without ``fuse_output``): o = qd' h + au (or qd h + Aqk delta) from
   the stored per-chunk states h (and deltas), all chunks at once.

Keeping exp in range with any gate in (-inf, 0] (isolated -1000, long strong-decay runs,
-3e4), without clamping anything:

* every decay between different sub-chunks is factored around the first step r of the later
  (row) block: exp(G_i - G_r) for the row, exp(G_r - G_j) for the column, both <= 1.  Each
  exponent is a forward running sum of exactly the gates it spans (the column side over rows
  loaded in reverse order), never a difference of two long prefix sums, so a huge gate before
  the span cannot cancel its precision away;
* the decay inside a diagonal BC x BC block is either taken pairwise (exp of E_i - E_j
  masked to i >= j before the exp: always exact), or -- ``diag="guarded"`` -- factored around
  a reference ``recentre`` = start / midpoint / end of the block when the block's largest
  per-channel decay span allows it (start/end: span <= 80, both factors within e^+-80;
  midpoint: span <= 160, both factors within e^+-80); blocks over the limit fall back to the
  pairwise form, per block and per key tile, at run time.  The upper triangle of a factored
  block may overflow to inf; it is masked out with ``where`` after the product.

Precision (relative RMS vs the float64 recurrence; tolerance 5e-3): every product that needs
more than bf16 is done as bf16 hi/lo pairs (two or three bf16 tensor-core products, ~16
significant bits) -- the CPU interpreter then reproduces the GPU's rounding -- or, in the
preparation with ``prec="tf32"``, as one tf32 product (11 significant bits; the interpreter
computes it exactly, so tests/test_kda_chunked.py emulates the tf32 operand truncation: worst
2.9e-3 on the problem's inputs, the same as bf16x3).  Kept
at that precision: the Aqk/Akk factors, delta in both delta products, Aqk in the read-out, the
state with ``scan_dot="split"`` (``"mixed"`` rounds the state to bf16 for its two products).
u stays float32 (``u_store="bf16"``, version 8, rounds it too); w, kd, qd are bf16.  Everything all-bf16 (as flash-linear-attention does)
measures ~3.9e-3 on long sequences and up to 4.3e-3 on short ones; this family measures up to
3.0e-3 (mixed) / 2.5e-3 (split), 1.7e-3 of which is o's own bf16 rounding.

GPU status (see kernels/notes/kda.md): the first version of this file, which used reverse
``tl.cumsum``, tf32 products and a 3D forward substitution written back through the scratch,
was wrong on the H200 with 4-warp preparation launches (right with 8); version 2 removed all
three constructs, runs the solve at 8 warps, and passed the judge on the H200 (1500 us at the
headline; 1307 us beside fla's 1366 us in run 3, where its 4-warp solve computed a wrong w).
Version 3 (``prec`` tf32, ``readout`` pre, ``subst`` direct, the solve's 64-wide key tile) ran on
the H200 only inside the search loop (``results/runs/kda-h200``, its last 25 tool calls): the
three BT=64 candidates with ``subst="direct"`` were wrong (o relative error 0.40-0.49; the CPU
interpreter passes them), so ``_plan`` refuses ``"direct"``; the BT=32 ``"extract"`` candidates
with tf32 and the precomputed read-out passed (best 1136 us, judge timer). The defaults below are
that best candidate's knobs.  Version 4 (``subst="rows"``, ``solve_warps=4`` with it at BT=32,
``scan_warps`` 1 and 2) ran in the dev table of session 3 (kernels/notes/kda.md, "Run 5"):
rows + 4-warp solve + 4-warp block rows was right and fastest (877.6 us vs fla 1619.8 us in the
same run), so those are the defaults now; the 1- and 2-warp scans were slower.

Version 5 (prepared, not run on a GPU; kernels/notes/kda.md "Version 5"), two knobs whose
defaults keep version 4's code: ``block_prog="chunk"`` runs stage 1 as one program per (chunk,
batch*head) (``_block_chunk``) instead of one per block row: per key tile it reads the chunk's q,
k, g once, takes one float64 running sum of the gates (every decay exponent a float64 difference,
as exact as a forward sum of the spanned gates -- closer to the float64 Aqk/Akk than ``"row"`` on
-3e4 gates), and, when every channel's decay over the chunk is within the guard, forms the whole
chunk's Aqk and Akk as one pair of [BT, BT] products around a chunk-wide reference; otherwise the
row blocks' off-diagonal parts around each block start, the diagonal blocks guarded per block
(one full-tile product) or, over the limit, pairwise per block (float64 differences, placed into
the tile by exact 0/1 selection products).  The scratch it writes is ``"row"``'s (the diagonal
inverses too with ``subst="rows"``), so the solve is unchanged.  Served at BT 32, 4 or 8 warps, with
BK <= 32 (sm_90 spills otherwise).  ``out_bv`` sets the read-out's value tile (0: the scan's BV):
at 128 each chunk's qd is read once instead of V / BV times.

Version 5 ran only in the search loop (session 3, results/runs/kda-h200-2): block_prog "chunk" with
out_bv 128 was 29-49 % slower than the defaults (255 registers: 2 programs per SM instead of 4).
Version 6 (prepared, not run on a GPU; kernels/notes/kda.md "Version 6"), aimed at per-token
throughput -- every stage's time grows with tokens x heads, the preparation most:
``au="bf16"`` stores Aqk u (readout "pre") in bf16, halving its write in the solve and its read in
the read-out (o's intra-chunk part rounded once more: +0.1-0.25e-3 relative on the CPU);
``fuse_prep=True`` is served again, at BT 32 with subst "rows" and 4 warps only: one program per
chunk runs both block rows and then the solve (one launch fewer; the solve's re-reads of q, k, g and
the Akk / Aqk scratch come from L1 / L2 instead of DRAM), with ``block_maxnreg`` 128 (4 programs per
SM, 168 B spilled) or 168 (3 per SM, no spill); ``block_maxnreg=168`` also gives 2-warp block rows
6 programs per SM with no spill (128 spilled 204 B).

Version 7 (prepared, not run on a GPU; kernels/notes/kda.md "Version 7"): ``pair="split"`` makes the
pairwise diagonal fallback of ``block_prog="row"`` (``_diag_split``) cheaper and still exact: the
BC x BC block is cut into 4 x 4 diagonal sub-blocks, taken pairwise ([BC/4, 4, 4, 32] elements in one
channel step instead of [BC, BC, 8] in four) with running sums local to each sub-block, and, per
level (8, then 4), the lower-left quarters of the 2h x 2h diagonal blocks are factored around the
quarter's first row m -- exp(E_i - E_m) x exp(E_m - E_j), both exponents <= 0, so nothing
overflows -- as one tf32 product pair per level.  ``"full"`` (the default) keeps version 4's code;
``block_prog="chunk"`` ignores the knob.

Version 8 (prepared, not run on a GPU; kernels/notes/kda.md "Version 8"), aimed at the solve's DRAM
time (Nsight Compute, session 4: 165 us at 48 % of the H200's bandwidth, loads not pipelined), two
knobs whose defaults keep version 7's code: ``solve_stages`` 2 / 3 is the solve launch's
``num_stages`` (the fused preparation's too): sm_90's pipeliner then prefetches the key-tile loop's
g and k tiles and the value loop's v tiles with cp.async (LDGSTS) through shared memory (22 / 35 KB
instead of 16 at the defaults, 128 registers, 8 B spilled: still 4 programs per SM; q and the
reversed-row loads stay plain).  The block rows keep num_stages 1 (their SASS is identical at 2 and 3:
no load of theirs feeds a product directly).  ``u_store="bf16"`` stores the WY factor u in bf16,
halving its write in the solve and its read in the scan (au is still formed from the float32 u): on
the CPU +0.05-0.4e-3 relative in o (worst 3.6e-3: zero gates, T 4096) and +0.5-0.8e-3 in the final
state (the state sums u's rounding).

Versions 9-9c (a state pass over pairs of chunks, ``scan_pair`` / ``pair_merge``) ran on the H200 in
session 6 and were removed: 9b computed wrong outputs there, 9c's scan alone was no faster than the
one-chunk scan (kernels/notes/kda.md, "Versions 9-9c measured on the H200").

Versions 10 (``scan_form="transition"``: S_next = gl S - P S + kd^T u with P = kd^T w from a fourth launch)
and 11 (``"lookahead"``: the next chunk's delta formed from this chunk's state and delta, so that a step's
products are independent) ran on the H200 in session 7 and were removed with the knob: their scans took
245 / 208 us (4 / 8 warps, plus 54 us for P's launch) and 371 / 401 us against the default's 209
(kernels/notes/kda.md, "Versions 10 and 11 measured on the H200").

Versions 12 (``overlap``: the scan launched beside a persistent, chunk-ordered solve, waiting on per-chunk
flags) and 12b (``out_beside``: the read-out launched beside the scan) ran on the H200 in session 8 and were
removed with their knobs: both computed bit-identical outputs, but sharing the SMs slowed the scan (and the
solve) by more than the overlap saved (kernels/notes/kda.md, "Versions 12 and 12b measured on the H200").

``scan_engine="wgmma"`` (session 10) replaces stages 3 and 4 with one Gluon kernel, ``_kda_scan_wgmma``.
- Layout: one warpgroup per (64 value columns, batch*head) holds S^T [64, K] as a wgmma accumulator.
- Products: its bf16 copy is the register operand of S^T w^T and of the read-out S^T qd'^T. delta^T (a bf16
  hi/lo pair in registers) is the register operand of the update, which accumulates into S^T in place.
  Nothing of the state goes through shared memory.
- Memory: each chunk's tiles arrive by TMA into a ring of ``scan_ring`` stages, and o leaves by TMA store.
- Where it runs: on Hopper where ``_wgmma_scan_applies`` (readout "pre", scan_dot "mixed", bf16 u and au,
  K 32/64/128, V a multiple of 64, BT 32). Elsewhere the stages above run, always on the CPU.
- Measured on the H200 (kernels/notes/kda.md, "Session 10"): 178 us at the headline with the 4-stage ring, against
  209 + 67 for the scan and read-out it replaces.
- ``scan_engine="wgmma_ws"`` (prepared in session 10, first run in session 11) is the same kernel warp-specialised
  (``_kda_scan_wgmma_ws``): one loader warp and one storer warp issue every TMA operation, so that the compute
  warpgroup's step loses the refill, the o store and one barrier (offline sm_90: 368 instructions per warp per step
  against 440). On the H200 it matched the one-warpgroup kernel's errors at every checked shape and took the scan
  from 177.2 to 163.4 us at the headline (kernels/notes/kda.md, "Session 11").

``diag_floor`` (session 11): with 30, ``_block_row`` raises the gates it loads to at least -30 before its running
sum, so that a reset (-1000) inside a diagonal block no longer fails the guard and sends the block to the pairwise
fallback (14.1 % -> 0.9 % of (block, key tile) pairs on the problem's gates at the headline). A decay over steps
(j, i] changes only when one of their gates is below -30, and then it is below e^-30 = 9.4e-14 before and after.
On the H200 the block rows went from 276.6 to 236.3 us at the headline, and with 2 warps per program to 196.7.

``kd_sum="f64"`` (session 11): the solve forms kd's decay exp(G_last - G_j) as total minus prefix of the forward key
tile's float64 running sum, instead of loading g and k again in reversed row order. Slower on the H200 (session 12:
solve 167.9 against 157.8 us at the headline).

Session 12 (kernels/notes/kda.md, "Session 12"; Nsight Compute: both preparation launches bound by L1 / shared memory):
- ``kd_sum="f32"``: one float32 running sum of gates floored at -30 (``_KD_FLOOR``) serves exp(G_i) and
  exp(G_last - G_j); solve 159.0 -> 136.1 us at the headline.
- ``inv_dot="bf16x3"``: the block rows' diagonal-block inverse by bf16 hi/lo tensor-core products instead of float32
  FMA ones (``_inv_dot``); block rows 196.0 -> 180.2 us.
- ``block_warps=1`` and ``solve_warps=2``: no cross-warp exchange in the running sums and reductions. With both, at 168
  registers, the loop's best (f380f090, 1.27x fla at the headline, 1.30-1.38x at fla's other shapes).
- ``scan_bv`` 128 / "auto": the wgmma scans with two compute warpgroups (M = 128). Right on the H200, but a step costs
  ~1.6x the one-warpgroup step; faster only where 64-wide programs need two waves (B1 T8192 H96: scan 327-333 against
  361 us).

Session 13 (kernels/notes/kda.md, "Session 13"; Nsight Compute: the uncapped 1-warp block rows latency-bound at 255
registers, 8 warps per SM; the solve near memory-bound):
- ``kd_sum="rows"``: the block rows store their floored running sums and block totals, and the solve takes none
  (``_solve_wy`` KD_SUM 3); solve 131.3 -> 108.6 us, block rows +19-20 us at the headline (the sums are 67 MB more
  stores), a few per cent faster at the large shapes.
- ``BK`` 16 at ``block_maxnreg`` 168: 12 block-row programs per SM; block rows -8 % at the four large shapes, level at the
  headline, slower at K 64. ``BK`` / ``block_maxnreg`` "auto" take 16 / 168 at K >= 128 and 32 / uncapped below: the
  loop's best (581efeab).
- ``row_prefetch``: the block rows issue the next key tile's loads early; -1 % at the large shapes, not promoted.

Session 14 (kernels/notes/kda.md, "Session 14"): ``scan_overlap`` runs the wgmma scan beside the solve on one stream.
The scan (32 programs at the headline, one per SM) is launched first and lets the solve launch at once as its
programmatic dependent (``launch_pdl``); the solve's programs, dispatched chunk by chunk across heads, flag each chunk
once stored (a release), and the scan's loader waits for the flags 8 chunks at a time (an acquire and a proxy fence)
before its TMA loads. The solve is compiled and loaded before the scan starts: CUDA's lazy loading at a first launch
waits for running kernels, here a scan that waits for the solve. Headline 469 -> 413 us on the H200; "auto" keeps it to
shapes where the scan is the longer stage. ``pair_elems`` sizes the pairwise fallback's tile by the block rows' warps.

Session 15 (kernels/notes/kda.md, "Session 15"): ``rows_engine`` "gluon" computes both block rows of a chunk in one Gluon
program (``_kda_rows_gluon``) with one key channel per thread: q, k and g in by TMA, each block's running sums a thread's
own loop, the products tf32 wgmma from shared memory, an exact level-by-level split where the midpoint guard fails.
It writes what the Triton rows write for the solve. H200: headline 409 -> 374 us beside fla's 611 (1.64x).
"""

import math

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    mma_v2,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

# kopt:knobs-begin
KNOBS = {
    "BT": 32,
    "BC": 16,
    "BK": 32,
    "BV": 16,
    "diag": "guarded",
    "recentre": "midpoint",
    "merge": "mma",
    "prec": "tf32",
    "readout": "pre",
    "subst": "rows",
    "fuse_prep": False,
    "fuse_output": False,
    "scan_dot": "mixed",
    "scan_layout": "kv",
    "block_warps": 4,
    "solve_warps": 4,
    "block_maxnreg": 128,
    "solve_maxnreg": 128,
    "scan_warps": 8,
    "scan_stages": 3,
    "out_warps": 4,
    "block_prog": "row",
    "out_bv": 128,
    "au": "bf16",
    "pair": "split",
    "solve_stages": 1,
    "u_store": "fp32",
    "off_tile": "chunk",
    "diag_cols": "load",
    "scan_engine": "triton",
    "scan_ring": 4,
    "diag_floor": 0,
    "kd_sum": "reversed",
    "scan_bv": 64,
    "inv_dot": "ieee",
    "row_prefetch": False,
    "scan_overlap": "off",
    "pair_elems": 2048,
    "rows_engine": "triton",
    "rows_fold": False,
    "rows_solve": False,
    "solve_mma": "v2",
}
# kopt:knobs-end
SPACE = {
    "BT": [32, 64],
    "BC": [16],
    # session 13: "auto" = 16 at K >= 128, else 32 (H200, 1-warp block rows: 16-wide key tiles at 168 registers were 3-5 %
    # faster at the four K = 128 shapes beyond the headline and 1.6 % slower at B8 T1024 H8 K 64)
    "BK": [16, 32, 64, "auto"],
    "BV": [16],
    "diag": ["guarded"],
    "recentre": ["start", "midpoint", "end"],
    "merge": ["mma"],
    "prec": ["bf16x3", "tf32"],
    "readout": ["pre", "aqk"],
    "subst": ["extract", "rows"],  # "direct" is refused: wrong on the H200 (see _plan)
    "fuse_prep": [False, True],  # version 6: True only at BT 32 with subst "rows", 4 block warps (see _plan)
    "fuse_output": [True, False],
    "scan_dot": ["mixed"],
    "scan_layout": ["kv", "vk"],
    # session 12: 1 warp (no CTA barrier or cross-warp exchange in the block rows' running sums, reductions and products)
    "block_warps": [1, 2, 4, 8],
    # 168 (version 6): 2-warp block rows and the fused preparation without spills; "auto" (session 13): 168 with 16-wide
    # key tiles, else none (sm_90, 1-warp rows: BK 16 spills 512 B at 168; BK 32 spills 28 KB at 168 and 3.7 KB uncapped)
    # "uncap_k128" (session 18, not yet timed as such): "auto", except the Gluon rows uncapped at K >= 128. The fused
    # program with the wgmma solve spills ~800 B at 168 registers at K 128, ~200 B uncapped (two programs per SM
    # instead of three), and ran faster uncapped at the headline and B2 T16384 (311.6 / 1182 us against 327.1 / 1243);
    # at K 64 it spills ~50 B at 168 and took 87.9 us at B8 T1024 capped against 96.8 uncapped
    "block_maxnreg": [0, 128, 168, "auto", "uncap_k128"],
    "solve_maxnreg": [0, 128, 168],
    "solve_warps": [2, 4, 8],  # 2 and 4 only with subst "rows" at BT 32 (see _plan; 2: session 12)
    "scan_warps": [1, 2, 4, 8],
    "scan_stages": [1, 2, 3],
    "out_warps": [4, 8],
    "block_prog": ["row", "chunk"],  # version 5: "chunk" = every block row of a chunk in one program
    "out_bv": [0, 64, 128],  # version 5: the read-out's value tile (0: the scan's BV)
    "au": ["fp32", "bf16"],  # version 6: storage of Aqk u (readout "pre"): bf16 halves its bytes
    "pair": ["full", "split"],  # version 7: the pairwise diagonal fallback of block_prog "row", split exactly
    # version 8: num_stages of the solve launch -- at 2 / 3 Triton turns the g, k (key-tile loop) and v
    # (value loop) loads into cp.async (LDGSTS) prefetches through shared memory (1: plain loads, as before)
    "solve_stages": [1, 2, 3],
    "u_store": ["fp32", "bf16"],  # version 8: storage of the WY factor u: bf16 halves its write and two reads
    # session 6: the width of a block row's off-diagonal tile (columns j < r of its chunk): "chunk" = BT
    # columns, "tight" = BT - BC (the most a block row can see; half the exps, loads and product at BT 32)
    "off_tile": ["chunk", "tight"],
    # session 6: the guarded diagonal's column factor k_j exp(ref - E_j): "load" = g and k loaded again
    # transposed and summed again; "trans" = tl.trans of the row side's tile (sm_90: -1.2 K of 16.3 K
    # warp-instructions per block-row program, benchmarks/sass_kda.py)
    "diag_cols": ["load", "trans"],
    # session 10: "wgmma" runs the state pass and the read-out as one Gluon kernel, _kda_scan_wgmma (the state
    # held transposed as a wgmma accumulator, 64 value columns per warpgroup), where it applies -- a Hopper GPU,
    # readout "pre", scan_dot "mixed", bf16 u and au, K 32/64/128, V a multiple of 64 -- else the Triton scan;
    # "wgmma_ws" the same warp-specialised, _kda_scan_wgmma_ws (a loader and a storer warp; session 11: right on the
    # H200 at every checked shape, scan 163.4 against 177.2 us at the headline)
    "scan_engine": ["triton", "wgmma", "wgmma_ws"],
    # session 10: chunks in the "wgmma" engine's TMA ring (one is consumed while the rest are in flight); dev rows
    # on the H200: 4 against 3, headline 621.3 against 644.0 us; 2 was far slower (831.6); 5 (210 KB of shared
    # memory at K 128) no faster in session 11 (624.6 against 619.1). Unused by the Triton scan.
    "scan_ring": [3, 4, 5],
    # session 11: a guarded diagonal block (block_prog "row") sees its gates raised to at least -diag_floor (0: as
    # they are). At 30 a reset (-1000) stops sending its block to the pairwise fallback: 14.1 % -> 0.9 % of (block,
    # key tile) pairs on the problem's gates at the headline. The decay it changes is below e^-30 = 9.4e-14 either way.
    "diag_floor": [0, 30],
    # session 11 (prepared, not run on a GPU): how the solve forms kd's decay exp(G_last - G_j). "reversed": a second,
    # row-reversed load of g and k per key tile and a forward running sum over it; "f64": total minus prefix of the
    # forward tile in float64 (exact for any gates), so each key tile loads g and k once
    # session 13: "rows" -- "f32"'s sums, formed by the block rows (block_prog "row", diag_floor 30: the same floor)
    # and stored for the solve (each 16-row block's running sums, float32, and its totals), so the solve takes no
    # running sum at all
    "kd_sum": ["reversed", "f64", "f32", "rows"],
    # session 12: value columns per program of the "wgmma" engines. 64: one compute warpgroup; 128: two (8 warps,
    # M = 128), sharing each chunk's w, kd, qd tiles -- half the programs; "auto": 128 where 64 would need more programs
    # than the GPU has SMs, else 64. H200: right, but a 128-wide step costs ~1.6x a 64-wide one (the tensor cores near
    # their rate), so only B1 T8192 H96 gained (scan 327-333 against 361 us); headline 261 against 163
    "scan_bv": [64, 128, "auto"],
    # session 12: the products of subst "rows"' diagonal-block inverse in the block rows: "ieee" float32 FMA (as
    # before); "bf16x3" three bf16 tensor-core products each (~16 bits). Nsight Compute (headline): the block rows are
    # bound by L1 / shared memory (84 %), and the FMA products made 26 % of their shared-memory wavefronts; bf16x3:
    # 199 -> 101 KB of shared-memory loads per program offline, block rows 196.0 -> 180.2 us on the H200
    "inv_dot": ["ieee", "bf16x3"],
    # session 13: the block rows (block_prog "row") load the next key tile's g, q, k before working on this one.
    # Nsight Compute (headline, 1-warp rows uncapped): 255 registers, 8 warps per SM, 67 % of cycles with no eligible
    # warp, and the wait for g's load the largest single line (16 % of stall samples)
    "row_prefetch": [False, True],
    # session 14: "pdl" launches the warp-specialised scan before the solve, as the solve's primary in a programmatic
    # dependent launch: the scan's 32 programs (headline) run beside the solve's, which take the other SMs chunk by
    # chunk across heads and flag each chunk once stored; the scan's loader waits for the flags 8 chunks at a time.
    # Only where every scan program fits on the GPU at once with SMs to spare; "auto" only where the scan has at most
    # SMs / 4 programs (_scan_beside_solve). H200: headline 469 -> 413 us; level at B2 T16384 H16 and 5 % slower at B8
    # T1024 H8 (beside under "pdl"). Elsewhere the solve runs first, unflagged (session 14's loop measured "pdl" with the
    # solve flagging on its chunk-major grid there too: +4-5 % at B1 T8192 H96, B4 T4096 H64 and B4 T2048 H16)
    "scan_overlap": ["off", "pdl", "auto"],
    # session 14: elements of pair "split"'s pairwise tile [BC/SB, SB, SB, DKS] (the fallback of 0.9 % of diagonal
    # blocks); 2048 was sized for 4-warp rows. Offline sm_90, 1-warp rows, kd_sum "rows": at 512, BK 32 uncapped stops
    # spilling (3.7 KB -> 0) and BK 16 fits 168 registers without a spill. "auto": 512 per warp of the block rows
    "pair_elems": [2048, 512, "auto"],
    # session 15: "gluon" computes both block rows of a chunk in one Gluon program (_kda_rows_gluon), one key channel per
    # thread, every load of the chunk issued at once, the products tf32 wgmma through shared memory; "gluon8" the same
    # with 8 warps (two rows per channel). A Hopper GPU and K 32-256 only (_gluon_rows_apply); elsewhere the Triton rows
    "rows_engine": ["triton", "gluon", "gluon8"],
    # session 15 (written after the device time ran out; not run on a GPU): the Gluon rows' product of rows 16.. against
    # columns ..15 folded into the diagonal blocks' product (one wgmma of N 2 BT instead of two of N BT: one hand-over
    # through shared memory fewer, the q and k operands stored once). Its column factor takes the diagonal's midpoint
    # reference, so the guard tightens to a span of 120 (a factor that underflows stands for a product below e^-27)
    "rows_fold": [False, True],
    # session 17: the Gluon rows' program also does the solve (_gl_solve) and writes the scan's inputs: Aqk, Akk, the
    # running sums and a second read of q and k no longer go through memory (~630 MB -> ~340 MB at the headline).
    # Where the wgmma scan runs (Hopper, u and au in bf16); elsewhere the Gluon rows and the Triton solve. "auto": only
    # where the scan runs beside it (scan_overlap) or K <= 64 (H200, session 17: -8 % at the headline and -8 % at B8
    # T1024 H8 K 64, +2..4 % at B1 T8192 H96, B2 T16384 H16 and B4 T4096 H64, where each kernel has the whole GPU: the
    # fused program executes about as many instructions as the two it replaces, at no better issue rate)
    "rows_solve": [False, True, "auto"],
    # session 18: how the fused program's solve takes its products. "v2": mma_v2 on [BT, BT] tiles, each operand
    # converted into its layout through shared memory (session 17: the conversions and hi / lo splits were a fifth
    # of the program's instructions). "wgmma": the inverse as doubling steps of one stacked [2 BT, BT] wgmma product
    # each (the rows stay in registers, the accumulator's layout being the operand's) and a merge of the two blocks,
    # and w, qd, u and Aqk u as two stacked products, qd's q exp(G) scale added inside the product (H200, session 18:
    # fastest at all six of fla's shapes, errors as the mma_v2 solve's)
    # "wgmma_st" (session 19): "wgmma" with the four outputs leaving through shared memory as 16-byte stores (Nsight
    # Compute, H200, session 19: the accumulators' 4-byte stores, 8 rows x 16 bytes per warp instruction, held ~10 %
    # of the fused program's stall samples, most of them throttled in the load / store unit)
    "solve_mma": ["v2", "wgmma", "wgmma_st"],
}
# What _plan refuses at every shape, as data the search agent reads (pytest_kopt/families.py): each
# (when, then) pair mirrors one of _plan's checks below, which stay the authority;
# tests/test_kda_chunked.py checks that the two agree on random combinations of SPACE.
REQUIRES = [
    ({"solve_warps": [2, 4]}, {"subst": ["rows"], "BT": [32]}),
    ({"scan_warps": [1, 2]}, {"BT": [32]}),
    ({"scan_warps": 1}, {"scan_layout": ["vk"]}),
    ({"block_prog": "chunk"}, {"BT": [32], "BK": [16, 32, "auto"], "block_warps": [4, 8]}),
    ({"fuse_prep": True}, {"BT": [32], "subst": ["rows"], "block_prog": ["row"], "block_warps": [4]}),
    ({"solve_stages": [2, 3], "BT": 64}, {"solve_maxnreg": [0]}),
    ({"off_tile": "tight"}, {"block_prog": ["row"], "BT": [32]}),
    ({"kd_sum": "rows"}, {"block_prog": ["row"], "diag_floor": [30]}),
    ({"scan_overlap": ["pdl", "auto"]}, {"fuse_prep": [False], "scan_engine": ["wgmma_ws"]}),
    ({"rows_fold": True}, {"rows_engine": ["gluon", "gluon8"]}),
    ({"rows_solve": [True, "auto"]}, {"rows_engine": ["gluon", "gluon8"], "readout": ["pre"], "u_store": ["bf16"],
                                      "au": ["bf16"]}),
    ({"solve_mma": ["wgmma", "wgmma_st"]}, {"rows_engine": ["gluon"], "rows_fold": [False]}),
    ({"rows_engine": ["gluon", "gluon8"]}, {"BT": [32], "fuse_prep": [False], "subst": ["rows"], "kd_sum": ["rows"],
                                            "recentre": ["midpoint"], "inv_dot": ["bf16x3"], "prec": ["tf32"]}),
]
# Measured by the search loop right after the defaults. Session 4 (results/runs/kda-h200-2, judge timer,
# geomean of three shapes): au bf16 + out_bv 128 781.5 us (vs 846.9 for version 4's defaults), then pair split
# + block_maxnreg 128 756.7 us (now the defaults); fuse_prep 799.9 / 806.6 (cap 168) and 2-warp block rows at
# 168 761.8 were slower. Session 5 (dev rows, results/h200-2026-11-29e): the pipelined solve (solve_stages 2/3)
# 770-771 vs 761 us at the headline, 2809 vs 2773 at B2 T16384, no faster anywhere, so it is not here; u in bf16 -2 us at the headline and -0.1..-0.5 % at
# the other shapes (noise-sized, +0.25e-3 error in o): left for the loop to judge on its own shapes.
# Session 6 (results/h200-2026-11-30): the 4-warp scan (765.4 vs 775.2 us at the headline in the paired-scan probe)
# led the loop to bbf1cbe1 (4-warp scan, bf16 u, out_bv 64; 717.1 us against 753.6); the block-row knobs
# off_tile "tight" + diag_cols "trans" on top of it gave 568beb4b (694.9 us, promoted); the same at 2 block
# warps / 168 registers tied (695.4); the 2-warp scan was far slower in the dev rows (scan 372.6 vs 216.4 us).
# Session 7: versions 10 and 11 (two other forms of the state pass's step) lost in the dev rows and the loop
# (scan 245-401 us against 209) and were removed. Session 8: versions 12 (the scan beside a persistent solve) and
# 12b (the read-out beside the scan) were right but slower (740-910 and 737 us against 716-725) and were removed.
# Session 10: the promoted knobs (568beb4b / 65248d91) with the state pass and read-out as one Gluon wgmma kernel
# (dev rows, results/h200-2026-11-30e: headline 666.8 us against 719.4, fla not in that run).
# The loop then promoted that (2534b9a6, 607.4 us on its geomean against 690.5) and the same with a 4-deep ring
# (6cae3b5c, 590.5 us). Session 11 (dev rows, results/h200-2026-11-30f/call1): the warp-specialised engine
# 605.4 us at the headline against 619.1 (scan 163.4 against 177.2), 1988.7 against 2018.5 at B2 T16384, no slower
# elsewhere; the ring 5 deep was no faster with either engine (624.6 / 608.9).
# The loop promoted that (ebacd585, 582.2 us against 590.5), then diag_floor 30 on it (05126c2c, 534.0; dev rows: block
# rows 276.6 -> 236.3 us, offline 14 511 -> 12 423 warp-instructions per program). Dev rows on top of that (call 4):
# 2-warp block rows 195.9 us at 168 registers, 196.7 at 128, against 234.1 at 4 warps; headline 523.6 / 524.5 / 559.6.
# The loop measured both: 496.2 (168) and 492.4 (128, 2df5bead, promoted).
# Session 12 (results/h200-2026-11-30g; kernels/notes/kda.md "Session 12"): kd_sum "f64" measured slower (solve 167.9
# against 157.8 us), scan_bv 128 faster only at B1 T8192 H96. After Nsight Compute showed the preparation L1-bound,
# kd_sum "f32" (solve 159.0 -> 136.1 us at the headline), inv_dot "bf16x3" (block rows 196.0 -> 180.2), then 1-warp block
# rows with 2-warp solves at 168 registers (H96 2103.6 -> 2019.7, B4 H64 2699.7 -> 2587.8); the loop promoted them in
# turn (311374a5, 466.7 us on its geomean; f380f090, 434.5). The entries: f380f090's knobs (timed first on the re-rendered
# family), then the same with the 1-warp block rows uncapped -- call 4's fastest block rows at all six shapes, beside a
# 4-warp solve only (170.7 against 188.3 us at the headline, 52.8 against 54.8 at B8 T1024 H8 D64, where f380f090 is
# 0.4 us short of 1.3x fla). Session 13 (results/h200-2026-11-30h): the loop measured those two and kd_sum "rows" on each
# (the solve's running sums from the block rows): 443.3 / 430.5 / 428.0 (uncapped, a3380400, promoted) / 442.8 us. The
# entries: a3380400's knobs, then with 16-wide key tiles in the block rows and / or row_prefetch (Nsight Compute on
# a3380400's block rows: 255 registers, 8 warps per SM, no eligible warp in 67 % of cycles, g's load wait the top line):
# 435.4 (a3380400 re-rendered), 460.6 (BK 16), 435.8 (row_prefetch), 433.2 (both); none promoted. The dev rows of that
# call found 16-wide key tiles at 168 registers (no spill offline) 3-5 % faster at the four largest shapes, level at the
# headline and 1.6 % slower at B8 T1024: the entries were that, with kd_sum "rows" (a3380400's) and "f32" (b70f3125's). The loop
# promoted the first (e8421d4b, 424.4 us against 428.0), which the benchmark then found 1.275x fla at B8 T1024 H8 K64 (a3380400:
# 1.314x). The entry: e8421d4b with BK and block_maxnreg "auto" (16 / 168 at K 128, a3380400's 32 / uncapped at K 64): the
# loop promoted it (581efeab, 421.7 us). Session 14 (results/h200-2026-11-30i): 581efeab's knobs with the scan beside the
# solve (scan_overlap "pdl") and / or the pairwise fallback's tile by warps (pair_elems "auto"; dev rows: -0.5 % at the
# four largest shapes, level elsewhere).
# The loop (399 -> 415 tool calls) measured them on its geomean (benchmark / profile timings): "pdl" + pair_elems "auto"
# 416.4 / 409.6 us (c4ab1b86, promoted), pair_elems "auto" alone 423.7 / 423.0 (581efeab: 421.7), "pdl" alone 419.9 / 415.3. Dev rows of c4ab1b86's knobs: headline 412.5 us
# against 469.1, level at B2 T16384 H16, +3-5 % at the three other K = 128 shapes (not beside: the solve's flags and
# chunk-major grid only) and 124.6 against 119.3 at B8 T1024 H8 K 64. The entry:
# scan_overlap "auto", beside only where the scan is the longer stage (at fla's six shapes: the headline alone).
# Session 15 (results/h200-2026-11-30j): the loop promoted it (7671e90b, 406.2 us; 1.33-1.50x fla at all six shapes in one
# run). The entry: 7671e90b with the block rows in Gluon (rows_engine "gluon"): 1.64x fla at the headline (373.7 us) and
# 1.56-1.64x at four other shapes in one benchmark run; the loop's one try at it was refused by the judge's policy (an
# import from Gluon's Ampere module, since moved to the Hopper module). Then the same with rows_fold (written after the
# device time ran out; offline sm_90: the guarded path 2544 -> 2288 SASS instructions per warp, one hand-over fewer).
# Session 16 (results/h200-2026-11-30k): the first entry gave inf at the headline (the running sums' store was waited
# for only at the program's end, and the compiler reused g's buffer as scratch meanwhile); the second was right and
# promoted (82b4c2a4). With the wait moved before the products, both entries were re-judged: the first was promoted
# (7bce82c4, 370.4 us on the loop's geomean against 372.1 for the second; 1.42-1.64x fla at all six shapes in one run).
# Session 17 (results/h200-2026-11-30l): 7bce82c4's knobs with the solve in the Gluon rows' program (rows_solve) at the
# rows' register cap (168) and uncapped: the loop promoted the first (bee16074, 356.3 us on its geomean against 370.4;
# uncapped 368.6). Nsight Compute on it (headline, not beside the scan): 259 us, 2.2 M local-memory spill requests,
# 0.33 issued per scheduler at 12 warps per SM. The entry: the same at 8 warps (rows_engine "gluon8", two rows per
# channel: offline sm_90 at K 128, 128 registers and 260 B spilled against 776 B, two programs of 8 warps per SM): slower
# (dev rows: headline 361.6 us against 343.6, +6 % at the three largest shapes; loop 380.2 us). The entry: bee16074 with
# rows_solve "auto" (fused only beside the scan or at K <= 64: dev rows, the fused form 3-4 % slower elsewhere).
# Session 18: that best with the solve as stacked wgmma products (solve_mma "wgmma"), and as it is (exp through one
# ex2 each: both re-rendered, so measured afresh); call 1 promoted the first (124b215f, 328.0 us on the loop's geomean
# against 348.9 for the second), but its solve (five doubling steps on the whole inverse) failed the judge at K 32 in
# call 2. Now, with the solve's blocks merged as the mma_v2 solve merges them: fused everywhere, uncapped (dev rows,
# call 2: 300.9 us at the headline against 321.1 at 168 registers) and capped, and "auto". Call 4: uncapped (07b3ab8c)
# 329.2 us on the geomean, capped (ec9f72a6) 329.4; uncapped faster at K 128, capped at K 64 (block_maxnreg above). So
# first now: uncapped at K 128 only (not yet measured).
# Session 19: call 1 measured "uncap_k128" (412b6b7f, 322.0 us on the geomean against 07b3ab8c's 329.2 re-timed in
# session 18: the headline unchanged, B8 T1024 96.8 -> 90.4 us) and the loop went on to 2e6c0948 (BK 64, scan_warps 2:
# 321.7, within noise). Nsight Compute on the fused program (headline, not beside the scan): 226 us, 0.29 issued per
# scheduler; ~10 % of stall samples on the solve's 4-byte output stores (load / store unit throttled), ~9 % waiting
# for the chunk's TMA loads. The entries: 2e6c0948 with those outputs through shared memory as 16-byte stores
# (solve_mma "wgmma_st"), and the same uncapped everywhere.
TRY_EARLY = [{"BK": 64, "block_warps": 8, "solve_warps": 2, "block_maxnreg": "uncap_k128", "solve_maxnreg": 168,
              "scan_warps": 2, "out_bv": 64, "u_store": "bf16", "off_tile": "tight", "diag_cols": "trans",
              "scan_engine": "wgmma_ws", "diag_floor": 30, "kd_sum": "rows", "scan_bv": "auto", "inv_dot": "bf16x3",
              "scan_overlap": "auto", "pair_elems": 512, "rows_engine": "gluon", "rows_solve": True,
              "solve_mma": "wgmma_st"},
             {"BK": 64, "block_warps": 8, "solve_warps": 2, "block_maxnreg": 0, "solve_maxnreg": 168,
              "scan_warps": 2, "out_bv": 64, "u_store": "bf16", "off_tile": "tight", "diag_cols": "trans",
              "scan_engine": "wgmma_ws", "diag_floor": 30, "kd_sum": "rows", "scan_bv": "auto", "inv_dot": "bf16x3",
              "scan_overlap": "auto", "pair_elems": 512, "rows_engine": "gluon", "rows_solve": True,
              "solve_mma": "wgmma_st"}]

# kd_sum "f32": the solve raises the gates it loads to at least -_KD_FLOOR, so that every running sum it forms is
# at most 30 BT in size and G_last - G_j, a float32 difference, is within ~1e-4 nats of the sum it stands for (kd is
# stored in bf16: 3.9e-3 relative). A decay over steps whose gates include one below -30 is below e^-30 = 9.4e-14
# before and after.
_KD_FLOOR = tl.constexpr(30.0)

# Factored diagonal blocks: the largest per-channel decay span (in nats) a block may have.
_GUARD_LIMIT = {"start": 80.0, "end": 80.0, "midpoint": 160.0}
# rows_fold's guard: the folded column factor k_j exp(G_16 - G_j + ref) has an exponent <= ref (the diagonal's midpoint,
# >= -span / 2); where it underflows (< -87) against a row factor <= e^(span / 2), the product it stands for is below
# e^(span - 87) = e^-27 at a span of 120
_FOLD_LIMIT = 120.0
_RECENTRE_CODE = {"start": 0, "midpoint": 1, "end": 2}
# pair "split": the side of the diagonal sub-blocks that stay pairwise
_SPLIT_SB = 4
# Pipelined tiles of the scan must fit in this much shared memory (the H200 has 227 KB).
_SCAN_SMEM_BUDGET = 200 * 1024


_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _exp(x):
    """e^x as one ex2.approx.ftz on the GPU. ``tl.exp`` adds a multiply-and-compare guard for subnormal results
    around its ex2 (five instructions instead of two); every decay here is either a normal number or negligible
    below e^-87, so flushing subnormals to zero changes nothing that matters."""
    return tl.exp2(x * _LOG2E)


@gluon.jit
def _gl_exp(x):
    """``_exp`` for the Gluon kernels."""
    return gl.exp2(x * 1.4426950408889634)


# ------------------------------------------------------------------------------------------
# Stage 1: chunk-parallel preparation
# ------------------------------------------------------------------------------------------
@triton.jit
def _diag_pairwise(q_ptr, k_ptr, g_ptr, row0, rows_ok, ks,
                   s_qt, s_kt, s_gt,
                   BC: tl.constexpr, BK: tl.constexpr, DK: tl.constexpr, SUM_DTYPE: tl.constexpr):
    """Aqk and Akk (unscaled) of one BC x BC diagonal block over key channels ks..ks+BK,
    with every decay exp(E_i - E_j) taken pairwise and masked to i >= j before the exp.  The gates'
    running sums are kept in SUM_DTYPE: float64 for ``block_prog="chunk"``, whose blocks may span
    gates far beyond float32's exact range."""
    ri = tl.arange(0, BC)
    causal = (ri[:, None] >= ri[None, :])[:, :, None]
    acc_q = tl.zeros([BC, BC], dtype=tl.float32)
    acc_k = tl.zeros([BC, BC], dtype=tl.float32)
    for c0 in range(0, BK, DK):
        cols = ks + c0 + tl.arange(0, DK)
        m = rows_ok[:, None]
        g = tl.load(g_ptr + (row0 + ri)[:, None] * s_gt + cols[None, :], mask=m, other=0.0).to(SUM_DTYPE)
        q = tl.load(q_ptr + (row0 + ri)[:, None] * s_qt + cols[None, :], mask=m, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + (row0 + ri)[:, None] * s_kt + cols[None, :], mask=m, other=0.0).to(tl.float32)
        # decay from the block's first step: E_i = sum_{r < t <= i} g_t (the first row's own
        # gate is left out, so a -1000 there never has to cancel against itself)
        e_loc = tl.cumsum(tl.where(ri[:, None] > 0, g, 0.0), axis=0)
        diff = (e_loc[:, None, :] - e_loc[None, :, :]).to(tl.float32)
        dec = _exp(tl.where(causal, diff, float("-inf")))
        kj = k[None, :, :] * dec
        acc_q += tl.sum(q[:, None, :] * kj, axis=2)
        acc_k += tl.sum(k[:, None, :] * kj, axis=2)
    return acc_q, acc_k


@triton.jit
def _split_level(q_b, k_b, e_b, HALF: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, TF32: tl.constexpr):
    """One level of ``_diag_split``: the lower-left HALF x HALF quarter of every 2 HALF x 2 HALF
    diagonal block, factored around that quarter's first row m: exp(E_i - E_m) (rows) times
    exp(E_m - E_j) (columns), exponents <= 0; everything else of the [BC, BC] result is 0."""
    ri = tl.arange(0, BC)
    m_row = (ri // (2 * HALF)) * (2 * HALF) + HALF  # the reference row of row i (and of column j = i)
    e_ref = tl.zeros([BC, BK], dtype=tl.float32)
    for b in tl.static_range(BC // (2 * HALF)):
        e_m = tl.sum(tl.where((ri == b * 2 * HALF + HALF)[:, None], e_b, 0.0), axis=0)  # E at row m
        e_ref = tl.where((m_row == b * 2 * HALF + HALF)[:, None], e_m[None, :], e_ref)
    in_row = (ri % (2 * HALF)) >= HALF  # rows of a later half
    in_col = (ri % (2 * HALF)) < HALF  # columns of an earlier half
    up = tl.where(in_row[:, None], _exp(tl.where(in_row[:, None], e_b - e_ref, 0.0)), 0.0)
    down = tl.where(in_col[:, None], k_b * _exp(tl.where(in_col[:, None], e_ref - e_b, 0.0)), 0.0)
    down_t = tl.trans(down)
    dq = _dotp(q_b * up, down_t, tl.zeros([BC, BC], dtype=tl.float32), TF32)
    dk = _dotp(k_b * up, down_t, tl.zeros([BC, BC], dtype=tl.float32), TF32)
    sel = in_row[:, None] & in_col[None, :] & ((ri // (2 * HALF))[:, None] == (ri // (2 * HALF))[None, :])
    return tl.where(sel, dq, 0.0), tl.where(sel, dk, 0.0)


@triton.jit
def _diag_split(q_b, k_b, e_b, q_ptr, k_ptr, g_ptr, row0, rows_ok, ks,
                s_qt, s_kt, s_gt,
                BC: tl.constexpr, BK: tl.constexpr, DK: tl.constexpr, SB: tl.constexpr, LOG_NS: tl.constexpr,
                TF32: tl.constexpr):
    """``pair="split"`` (version 7): the same Aqk and Akk (unscaled) of one BC x BC diagonal block
    over key channels ks..ks+BK as ``_diag_pairwise``, with the block cut exactly into SB x SB
    diagonal sub-blocks and the off-diagonal parts between them.  At each level h = BC/2, BC/4,
    .., SB the lower-left h x h quarter of every 2h x 2h diagonal block is factored around its
    own first row m (the later half's start): exp(E_i - E_m) for the rows and exp(E_m - E_j) for
    the columns, both exponents <= 0 (E non-increasing), so no factor overflows and one that
    underflows stands for a product below e^-87 -- one product pair per level, always exact.  Only
    the SB x SB diagonal sub-blocks are taken pairwise ([BC/SB, SB, SB, DK] instead of
    [BC, BC, DK] elements), with running sums local to each sub-block.  q_b, k_b, e_b: the
    block's [BC, BK] rows and running sums (first row's gate left out) that ``_block_row`` loaded."""
    NS: tl.constexpr = BC // SB
    ri = tl.arange(0, BC)
    acc_q = tl.zeros([BC, BC], dtype=tl.float32)
    acc_k = tl.zeros([BC, BC], dtype=tl.float32)
    for lv in tl.static_range(LOG_NS):
        dq, dk = _split_level(q_b, k_b, e_b, BC // (2 << lv), BC, BK, TF32)
        acc_q += dq
        acc_k += dk
    # the SB x SB diagonal sub-blocks, pairwise: [NS, SB, DK] tiles, sums local to each sub-block
    s3 = tl.arange(0, NS)[:, None, None]
    i3 = tl.arange(0, SB)[None, :, None]
    rows3 = row0 + s3 * SB + i3
    ok3 = tl.reshape(rows_ok, [NS, SB, 1])
    causal = (tl.arange(0, SB)[:, None] >= tl.arange(0, SB)[None, :])[None, :, :, None]
    blk_q = tl.zeros([NS, SB, SB], dtype=tl.float32)
    blk_k = tl.zeros([NS, SB, SB], dtype=tl.float32)
    for c0 in range(0, BK, DK):
        c3 = (ks + c0 + tl.arange(0, DK))[None, None, :]
        g = tl.load(g_ptr + rows3 * s_gt + c3, mask=ok3, other=0.0).to(tl.float32)
        q = tl.load(q_ptr + rows3 * s_qt + c3, mask=ok3, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + rows3 * s_kt + c3, mask=ok3, other=0.0).to(tl.float32)
        e_loc = tl.cumsum(tl.where(i3 > 0, g, 0.0), axis=1)
        diff = e_loc[:, :, None, :] - e_loc[:, None, :, :]
        dec = _exp(tl.where(causal, diff, float("-inf")))
        kj = k[:, None, :, :] * dec
        blk_q += tl.sum(q[:, :, None, :] * kj, axis=3)
        blk_k += tl.sum(k[:, :, None, :] * kj, axis=3)
    # place the sub-blocks on the diagonal: [NS, SB, NS, SB] -> [BC, BC], selection only
    same = (tl.arange(0, NS)[:, None, None, None] == tl.arange(0, NS)[None, None, :, None])
    acc_q += tl.reshape(tl.where(same, blk_q[:, :, None, :], 0.0), [BC, BC])
    acc_k += tl.reshape(tl.where(same, blk_k[:, :, None, :], 0.0), [BC, BC])
    return acc_q, acc_k


@triton.jit
def _recentre_ref(first, last, RECENTRE: tl.constexpr):
    """Where a span's decays are measured from: its start (0), midpoint (1) or end (2)."""
    ref = last
    if RECENTRE == 0:
        ref = first
    elif RECENTRE == 1:
        ref = first + 0.5 * (last - first)
    return ref


@triton.jit
def _split(x):
    """x ~= hi + lo with both halves bf16 (about 16 significant bits together)."""
    hi = x.to(tl.bfloat16)
    lo = (x - hi.to(tl.float32)).to(tl.bfloat16)
    return hi, lo


@triton.jit
def _dot3(a, b, acc):
    """acc + a @ b with float32 operands as bf16 hi/lo pairs: three bf16 tensor-core products
    (hi*hi + hi*lo + lo*hi), about 16 significant bits, no tf32 involved."""
    a_hi, a_lo = _split(a)
    b_hi, b_lo = _split(b)
    acc = tl.dot(a_hi, b_hi, acc)
    acc = tl.dot(a_hi, b_lo, acc)
    return tl.dot(a_lo, b_hi, acc)


@triton.jit
def _inv_dot(a, b, INV: tl.constexpr):
    """a @ b for the diagonal blocks' inverse (``inv_dot``): 0 float32 FMA ("ieee"); 1 three bf16 tensor-core
    products (``_dot3``, ~16 bits). The FMA form reads each operand element from shared memory once per output
    row or column it meets (session 12, Nsight Compute: 26 % of the block rows' shared-memory wavefronts for 6
    products of 16 x 16); a tensor-core product reads it about once. One tf32 product per step was tried on the
    CPU with the GPU's operand rounding emulated: its inverses were 2^-9.3 off, as far as one bf16 product's."""
    if INV == 0:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return _dot3(a, b, tl.zeros([a.shape[0], b.shape[1]], dtype=tl.float32))


@triton.jit
def _dotp(a, b, acc, TF32: tl.constexpr):
    """acc + a @ b for float32 operands that need more than bf16: one tf32 tensor-core product
    (10 explicit mantissa bits per operand, half the bf16 rate) when TF32, else ``_dot3``."""
    if TF32:
        return tl.dot(a, b, acc, input_precision="tf32")
    else:
        return _dot3(a, b, acc)


@triton.jit
def _block_row(q_ptr, k_ptr, g_ptr, beta_ptr, aqk_ptr, akk_ptr, scale, t0, T, bi, lo_off,
               s_qt, s_kt, s_gt, s_bt,
               K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, DK: tl.constexpr,
               RECENTRE: tl.constexpr, LIMIT: tl.constexpr, TF32: tl.constexpr, SUBST: tl.constexpr,
               LOG_BC: tl.constexpr, SB: tl.constexpr = 0, LOG_NS: tl.constexpr = 0, DKS: tl.constexpr = 1,
               OFFW: tl.constexpr = 0, DIAG_TRANS: tl.constexpr = False, FLOOR: tl.constexpr = 0.0,
               INV: tl.constexpr = 0, gs_ptr=None, gt_ptr=None, GSUM: tl.constexpr = False,
               PREFETCH: tl.constexpr = False):
    """Rows bi*BC .. bi*BC+BC-1 of one chunk's Aqk (scaled; hi and lo bf16 halves) and Akk
    (beta-scaled, strictly lower, float32), all BT columns, written to aqk_ptr / akk_ptr
    (pointers at the chunk's first row; the lo half of Aqk sits lo_off elements after).
    SUBST 2 (``subst="rows"``): the diagonal BC x BC block of Akk is replaced in the scratch by
    the inverse of (I + that block), computed here, so that the solve has no substitution left.
    OFFW: the off-diagonal tile's width (BT; ``off_tile="tight"``: BT - BC, every column a block
    row can see, so at BT 32 no half-masked tile).  DIAG_TRANS (``diag_cols="trans"``): the guarded
    diagonal's column factor is the row factor's registers transposed instead of a second, transposed
    load of g and k and a second running sum.  FLOOR (``diag_floor``, < 0 when on): the block's gates
    are raised to at least FLOOR before its running sum, so that a reset (-1000) no longer pushes the
    diagonal block past the guard.  A decay over steps i..j changes only if one of their gates is below
    FLOOR, and then it is below e^FLOOR both before and after.  INV (``inv_dot``): how the products of
    the diagonal block's inverse are taken (``_inv_dot``).  GSUM (``kd_sum="rows"``): the block's running
    sums of its floored gates, G_i - G_(r-1) (float32, gs_ptr: [BT, K] at the chunk's first row), and its
    total per channel (gt_ptr: [BT // BC, K]) are written for the solve, which then needs no running sum.
    PREFETCH (``row_prefetch``): the next key tile's g, q and k are loaded while this one is worked on (a 1-warp
    program has no other warp to hide its load latency behind)."""
    W: tl.constexpr = OFFW
    r = bi * BC
    ct = tl.arange(0, BT)
    cw = tl.arange(0, W)
    rc = tl.arange(0, BC)
    cc = tl.arange(0, BC)
    rb_ok = t0 + r + rc < T
    beta_r = tl.load(beta_ptr + (r + rc) * s_bt, mask=rb_ok, other=0.0).to(tl.float32)
    off_q = tl.zeros([BC, W], dtype=tl.float32)  # column i holds chunk column j = r - 1 - i
    off_k = tl.zeros([BC, W], dtype=tl.float32)
    dia_q = tl.zeros([BC, BC], dtype=tl.float32)
    dia_k = tl.zeros([BC, BC], dtype=tl.float32)
    mb = rb_ok[:, None]
    p_g = g_ptr + (r + rc)[:, None] * s_gt + tl.arange(0, BK)[None, :]
    p_q = q_ptr + (r + rc)[:, None] * s_qt + tl.arange(0, BK)[None, :]
    p_k = k_ptr + (r + rc)[:, None] * s_kt + tl.arange(0, BK)[None, :]
    if PREFETCH:  # the first key tile; each iteration below issues the next one's loads before its own work
        g_nx = tl.load(p_g, mask=mb, other=0.0)
        q_nx = tl.load(p_q, mask=mb, other=0.0)
        k_nx = tl.load(p_k, mask=mb, other=0.0)
    for ks in range(0, K, BK):
        ck = ks + tl.arange(0, BK)
        if PREFETCH:
            g_b = g_nx.to(tl.float32)
            q_b = q_nx.to(tl.float32)
            k_b = k_nx.to(tl.float32)
            nxt = mb & (ks + BK < K)
            g_nx = tl.load(p_g + ks + BK, mask=nxt, other=0.0)
            q_nx = tl.load(p_q + ks + BK, mask=nxt, other=0.0)
            k_nx = tl.load(p_k + ks + BK, mask=nxt, other=0.0)
        else:
            g_b = tl.load(p_g + ks, mask=mb, other=0.0).to(tl.float32)
            q_b = tl.load(p_q + ks, mask=mb, other=0.0).to(tl.float32)
            k_b = tl.load(p_k + ks, mask=mb, other=0.0).to(tl.float32)
        if FLOOR < 0:
            g_b = tl.maximum(g_b, FLOOR)
        # E_i = G_i - G_r inside the block (<= 0, non-increasing); the first row's own gate is
        # left out of the sum, so a -1000 there never has to cancel against itself
        e_b = tl.cumsum(tl.where(rc[:, None] > 0, g_b, 0.0), axis=0)
        if GSUM:  # the sums the solve needs: the first row's floored gate added back
            g_first = tl.maximum(tl.load(g_ptr + r * s_gt + ck, mask=(t0 + r) < T, other=0.0).to(tl.float32), FLOOR)
            tl.store(gs_ptr + (r + rc)[:, None] * K + ck[None, :], e_b + g_first[None, :], mask=mb)
        if bi > 0:
            # columns j < r, held transposed ([BK, W]) and in reverse order, i = r - 1 - j:
            # exp(G_r - G_j) = exp(g_r + sum_{j < t < r} g_t), the sum a forward running sum
            # of g[r - 1], g[r - 2], ... (no reverse scan, no large prefix to subtract)
            m_shift = (cw >= 1) & (cw < r) & (t0 + r - cw < T)
            gs = tl.load(g_ptr + (r - cw)[None, :] * s_gt + ck[:, None], mask=m_shift[None, :], other=0.0).to(tl.float32)
            m_col = (cw < r) & (t0 + r - 1 - cw < T)
            k_t = tl.load(k_ptr + (r - 1 - cw)[None, :] * s_kt + ck[:, None], mask=m_col[None, :], other=0.0).to(tl.float32)
            g_r = tl.load(g_ptr + r * s_gt + ck, mask=(t0 + r) < T, other=0.0).to(tl.float32)
            x_col = g_r[:, None] + tl.cumsum(gs, axis=1)
            kb = k_t * _exp(tl.where((cw < r)[None, :], x_col, float("-inf")))
            e_row = _exp(e_b)
            off_q = _dotp(q_b * e_row, kb, off_q, TF32)
            off_k = _dotp(k_b * e_row, kb, off_k, TF32)
        # the diagonal block
        e_last = tl.min(e_b, axis=0)  # [BK]; the block's decay span per channel is -e_last
        if GSUM:  # gates are <= 0, so the smallest running sum is the last row's: the block's total
            tl.store(gt_ptr + bi * K + ck, e_last + g_first)
        span = -tl.min(e_last, axis=0)
        if LIMIT < 0:  # diag="pairwise": the guard never passes; leave the factored form out
            span = LIMIT + 1.0
        if span <= LIMIT:
            if RECENTRE == 0:
                ref = tl.zeros([BK], dtype=tl.float32)
            elif RECENTRE == 1:
                ref = 0.5 * e_last
            else:
                ref = e_last
            up = _exp(e_b - ref[None, :])
            if DIAG_TRANS:  # the column side from the row side's registers, transposed
                down = tl.trans(k_b * _exp(ref[None, :] - e_b))
            else:  # the column side again, transposed ([BK, BC]) straight from memory
                g_bt = tl.load(g_ptr + (r + cc)[None, :] * s_gt + ck[:, None], mask=rb_ok[None, :], other=0.0).to(tl.float32)
                if FLOOR < 0:
                    g_bt = tl.maximum(g_bt, FLOOR)
                k_bt = tl.load(k_ptr + (r + cc)[None, :] * s_kt + ck[:, None], mask=rb_ok[None, :], other=0.0).to(tl.float32)
                e_bt = tl.cumsum(tl.where(cc[None, :] > 0, g_bt, 0.0), axis=1)
                down = k_bt * _exp(ref[:, None] - e_bt)
            dq = _dotp(q_b * up, down, tl.zeros([BC, BC], dtype=tl.float32), TF32)
            dk = _dotp(k_b * up, down, tl.zeros([BC, BC], dtype=tl.float32), TF32)
            # the upper triangle may hold inf / nan: select, never multiply
            dia_q += tl.where(rc[:, None] >= cc[None, :], dq, 0.0)
            dia_k += tl.where(rc[:, None] > cc[None, :], dk, 0.0)
        else:
            if LOG_NS > 0:  # pair="split" (version 7)
                dq, dk = _diag_split(q_b, k_b, e_b, q_ptr, k_ptr, g_ptr, r, rb_ok, ks, s_qt, s_kt, s_gt,
                                     BC, BK, DKS, SB, LOG_NS, TF32)
            else:
                dq, dk = _diag_pairwise(q_ptr, k_ptr, g_ptr, r, rb_ok, ks, s_qt, s_kt, s_gt, BC, BK, DK, tl.float32)
            dia_q += dq
            dia_k += tl.where(rc[:, None] > cc[None, :], dk, 0.0)
    # off-diagonal part (reversed columns j = r - 1 - i < r), zeros right of the block, and
    # the diagonal block: three disjoint stores
    p_row = (r + rc)[:, None] * BT
    before = (cw < r)[None, :]
    aq = off_q * scale
    aq_hi = aq.to(tl.bfloat16)
    aq_lo = (aq - aq_hi.to(tl.float32)).to(tl.bfloat16)
    tl.store(aqk_ptr + p_row + (r - 1 - cw)[None, :], aq_hi, mask=before)
    tl.store(aqk_ptr + lo_off + p_row + (r - 1 - cw)[None, :], aq_lo, mask=before)
    tl.store(akk_ptr + p_row + (r - 1 - cw)[None, :], off_k * beta_r[:, None], mask=before)
    after = (ct >= r + BC)[None, :]
    zero = tl.zeros([BC, BT], dtype=tl.float32)
    tl.store(aqk_ptr + p_row + ct[None, :], zero.to(tl.bfloat16), mask=after)
    tl.store(aqk_ptr + lo_off + p_row + ct[None, :], zero.to(tl.bfloat16), mask=after)
    tl.store(akk_ptr + p_row + ct[None, :], zero, mask=after)
    dq_s = dia_q * scale
    dq_hi = dq_s.to(tl.bfloat16)
    tl.store(aqk_ptr + p_row + r + cc[None, :], dq_hi)
    tl.store(aqk_ptr + lo_off + p_row + r + cc[None, :], (dq_s - dq_hi.to(tl.float32)).to(tl.bfloat16))
    akk_d = dia_k * beta_r[:, None]
    if SUBST == 2:
        # (I + L)^-1 = (I - L)(I + L^2)(I + L^4)...(I + L^(BC/2)), exact because the strictly
        # lower BC x BC block L is nilpotent of index BC: LOG_BC - 1 squarings and as many
        # products, float32 FMA (input_precision "ieee", as merge "fma" ran right on the H200).
        # A dependency chain of 2 (LOG_BC - 1) small products instead of BC substitution steps.
        eye_c = tl.where(rc[:, None] == cc[None, :], 1.0, 0.0)
        n_c = akk_d
        x_c = eye_c - n_c
        for _ in tl.static_range(LOG_BC - 1):
            n_c = _inv_dot(n_c, n_c, INV)
            x_c = _inv_dot(x_c, eye_c + n_c, INV)
        tl.store(akk_ptr + p_row + r + cc[None, :], x_c)
    else:
        tl.store(akk_ptr + p_row + r + cc[None, :], akk_d)


@triton.jit
def _block_chunk(q_ptr, k_ptr, g_ptr, beta_ptr, aqk_ptr, akk_ptr, scale, t0, T, lo_off,
                 s_qt, s_kt, s_gt, s_bt,
                 K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, DK: tl.constexpr,
                 RECENTRE: tl.constexpr, LIMIT: tl.constexpr, TF32: tl.constexpr, SUBST: tl.constexpr,
                 LOG_BC: tl.constexpr):
    """Every block row of one chunk at once (``block_prog="chunk"``, version 5): Aqk (scaled; hi
    and lo bf16 halves) and Akk (beta-scaled, strictly lower, float32; with SUBST 2 each diagonal
    block replaced by the inverse of I + that block), the same scratch contents as ``_block_row``
    run for every row block, but q, k, g read once per key tile and every product a [BT, BT] tile.

    Exponents: one float64 running sum G of the chunk's gates per key tile.  A float64 sum of at
    most BT float32 gates is exact to ~BT 2^-53 |G| (1e-8 nats at 64 gates of -3e4), so every
    difference G_i - G_j taken in float64 and rounded to float32 is as good as the forward sum of
    exactly the spanned gates that ``_block_row`` forms -- no reverse-ordered reloads needed.
    Off-diagonal part of row block b (rows r_b .. r_b + BC - 1, columns j < r_b):
    (q exp(G - G_r_b)) (k exp(G_r_b - G))^T, both factors <= 1, masked by zeroing the factors
    (so the product's other entries are exactly 0).  Diagonal blocks: the guarded factored form
    as one full-tile product around each block's reference (the entries outside the blocks and
    above the diagonal may be inf / nan: selected away with ``where``), or, if any block of the
    key tile is over the limit, the pairwise form for the whole tile."""
    rt = tl.arange(0, BT)
    ct = tl.arange(0, BT)
    cc = tl.arange(0, BC)
    rt_ok = t0 + rt < T
    blk_r = rt // BC
    blk_c = ct // BC
    same = blk_r[:, None] == blk_c[None, :]
    lower_eq = same & (rt[:, None] >= ct[None, :])
    lower = same & (rt[:, None] > ct[None, :])
    beta_r = tl.load(beta_ptr + rt * s_bt, mask=rt_ok, other=0.0).to(tl.float32)
    acc_q = tl.zeros([BT, BT], dtype=tl.float32)
    acc_k = tl.zeros([BT, BT], dtype=tl.float32)
    for ks in range(0, K, BK):
        ck = ks + tl.arange(0, BK)
        m = rt_ok[:, None]
        p = rt[:, None] * s_gt + ck[None, :]
        g_a = tl.load(g_ptr + p, mask=m, other=0.0)
        q_a = tl.load(q_ptr + rt[:, None] * s_qt + ck[None, :], mask=m, other=0.0).to(tl.float32)
        k_a = tl.load(k_ptr + rt[:, None] * s_kt + ck[None, :], mask=m, other=0.0).to(tl.float32)
        G = tl.cumsum(g_a.to(tl.float64), axis=0)  # [BT, BK], inclusive
        # fast path: one reference for the whole chunk when every channel's decay over the chunk
        # (after its first step) is within the guard: both factors then lie in e^+-80 (normal
        # float32 numbers, full relative precision) and the chunk is one product pair
        g_first = tl.sum(tl.where((rt == 0)[:, None], G, 0.0), axis=0)  # [BK]
        g_last = tl.sum(tl.where((rt == BT - 1)[:, None], G, 0.0), axis=0)
        span_c = tl.max((g_first - g_last).to(tl.float32), axis=0)
        if LIMIT < 0:
            span_c = LIMIT + 1.0
        if span_c <= LIMIT:
            ref_c = _recentre_ref(g_first, g_last, RECENTRE)
            xc = (G - ref_c[None, :]).to(tl.float32)
            kc = tl.trans(k_a * _exp(-xc))
            upc = _exp(xc)
            dq = _dotp(q_a * upc, kc, tl.zeros([BT, BT], dtype=tl.float32), TF32)
            dk = _dotp(k_a * upc, kc, tl.zeros([BT, BT], dtype=tl.float32), TF32)
            acc_q += tl.where(rt[:, None] >= ct[None, :], dq, 0.0)
            acc_k += tl.where(rt[:, None] > ct[None, :], dk, 0.0)
        else:
            # per row block b: its start G_r and end G_e (float64 [BK]); x = G - ref (float32) for
            # the diagonal's factors, ref = G_r / the midpoint / G_e of the row's own block
            x = tl.zeros([BT, BK], dtype=tl.float32)
            bad = rt < 0  # rows whose diagonal block is over the guard's limit (pairwise)
            for b in tl.static_range(BT // BC):
                gr_b = tl.sum(tl.where((rt == b * BC)[:, None], G, 0.0), axis=0)  # [BK]
                ge_b = tl.sum(tl.where((rt == b * BC + BC - 1)[:, None], G, 0.0), axis=0)
                span_b = tl.max((gr_b - ge_b).to(tl.float32), axis=0)
                if LIMIT < 0:
                    span_b = LIMIT + 1.0
                ref_b = _recentre_ref(gr_b, ge_b, RECENTRE)
                in_b = (blk_r == b)[:, None]
                x = tl.where(in_b, (G - ref_b[None, :]).to(tl.float32), x)
                if span_b > LIMIT:
                    # this diagonal block pairwise ([BC, BC, DK] from memory, float64 differences),
                    # placed into the [BT, BT] tile by exact 0/1 selection products
                    bad = bad | (blk_r == b)
                    rows_b = b * BC + cc
                    pq, pk = _diag_pairwise(q_ptr, k_ptr, g_ptr, b * BC, t0 + rows_b < T, ks,
                                            s_qt, s_kt, s_gt, BC, BK, DK, tl.float64)
                    sel = tl.where(rt[:, None] == rows_b[None, :], 1.0, 0.0)  # [BT, BC]
                    sel_t = tl.where(rows_b[:, None] == ct[None, :], 1.0, 0.0)  # [BC, BT]
                    acc_q += tl.dot(tl.dot(sel, pq, input_precision="ieee"), sel_t, input_precision="ieee")
                    acc_k += tl.where(lower, tl.dot(tl.dot(sel, pk, input_precision="ieee"), sel_t,
                                                    input_precision="ieee"), 0.0)
                if b > 0:
                    # row block b against every column before it
                    row_f = tl.where(in_b, _exp((G - gr_b[None, :]).to(tl.float32)), 0.0)
                    col_x = (gr_b[None, :] - G).to(tl.float32)
                    col_f = _exp(tl.where((rt < b * BC)[:, None], col_x, float("-inf")))
                    kc = tl.trans(k_a * col_f)  # [BK, BT]
                    acc_q = _dotp(q_a * row_f, kc, acc_q, TF32)
                    acc_k = _dotp(k_a * row_f, kc, acc_k, TF32)
            # the diagonal blocks within the limit: one full-tile product, each row around its own
            # block's reference; outside the blocks, above the diagonal and in the pairwise blocks'
            # rows (x zeroed there) the product is selected away, never multiplied
            x = tl.where(bad[:, None], 0.0, x)
            kd = tl.trans(k_a * _exp(-x))
            up = _exp(x)
            dq = _dotp(q_a * up, kd, tl.zeros([BT, BT], dtype=tl.float32), TF32)
            dk = _dotp(k_a * up, kd, tl.zeros([BT, BT], dtype=tl.float32), TF32)
            good = (~bad)[:, None]
            acc_q += tl.where(lower_eq & good, dq, 0.0)
            acc_k += tl.where(lower & good, dk, 0.0)
    p_t = rt[:, None] * BT + ct[None, :]
    aq = acc_q * scale
    aq_hi = aq.to(tl.bfloat16)
    tl.store(aqk_ptr + p_t, aq_hi)
    tl.store(aqk_ptr + lo_off + p_t, (aq - aq_hi.to(tl.float32)).to(tl.bfloat16))
    akk = acc_k * beta_r[:, None]
    if SUBST == 2:
        # (I + D)^-1 for the block-diagonal strictly lower part D of Akk, all blocks in one
        # [BT, BT] tile: D is nilpotent of index BC, so (I - D)(I + D^2)...(I + D^(BC/2)) is
        # exact; float32 FMA products as in ``_block_row``.  Block-diagonal stays block-diagonal.
        eye = tl.where(rt[:, None] == ct[None, :], 1.0, 0.0)
        n_c = tl.where(same, akk, 0.0)
        x_c = eye - n_c
        for _ in tl.static_range(LOG_BC - 1):
            n_c = tl.dot(n_c, n_c, input_precision="ieee")
            x_c = tl.dot(x_c, eye + n_c, input_precision="ieee")
        akk = tl.where(same, x_c, akk)
    tl.store(akk_ptr + p_t, akk)


@triton.jit
def _solve_wy(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, w_ptr, u_ptr, kd_ptr, qd_ptr, akk_ptr, gl_ptr,
              aqk_ptr, au_ptr, lo_off,
              scale, t0, T, s_qt, s_kt, s_vt, s_gt, s_bt,
              K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
              BVP: tl.constexpr, LOG_NC: tl.constexpr, MERGE: tl.constexpr, TF32: tl.constexpr,
              PRE: tl.constexpr, SUBST: tl.constexpr, HOIST: tl.constexpr, KD_SUM: tl.constexpr = 0,
              gs_ptr=None, gt_ptr=None):
    """A = (I + Akk)^-1 diag(beta) for one chunk, then w = A (exp(G) k), u = A v and the
    pre-decayed tiles kd, qd, gl of the scan (pointers at the chunk's first row).  With PRE the
    read-out's intra-chunk part is folded in here: qd holds qd - Aqk w (bf16, w as stored) and
    au = Aqk u (float32), so that the scan's read-out is o = qd S + au.  KD_SUM 1 (``kd_sum="f64"``):
    kd's decay exp(G_last - G_j) comes from the forward tile's float64 running sum (total minus
    prefix, exact in float64 for any gates) instead of a second, row-reversed load of g and k;
    KD_SUM 2 (``"f32"``): the same in float32 on gates raised to at least -30 (see ``_KD_FLOOR``); KD_SUM 3
    (``"rows"``): KD_SUM 2's sums, but from the block rows (each BC-row block's running sums at gs_ptr, its total
    at gt_ptr): G_i is its block's sum plus the totals of the blocks before, so no running sum is taken here."""
    rt = tl.arange(0, BT)
    ct = tl.arange(0, BT)
    rt_ok = t0 + rt < T
    # forward substitution inside the NC diagonal BC x BC blocks, all blocks side by side:
    # row s of every block is finished at step s; arow[c] = Akk[blk(c) * BC + s, c]
    same_blk = (rt[:, None] // BC) == (ct[None, :] // BC)
    if SUBST == 2:
        # the block rows stored each diagonal block's inverse in Akk's place: nothing to solve.
        # HOIST >= 1: the loads that do not depend on A are issued here too, so that their latency
        # overlaps the block merge instead of following it (the other paths keep their order)
        x = tl.load(akk_ptr + rt[:, None] * BT + ct[None, :], mask=same_blk, other=0.0)
    if HOIST >= 1:
        beta_c = tl.load(beta_ptr + ct * s_bt, mask=rt_ok, other=0.0).to(tl.float32)
        if PRE:
            aq_hi = tl.load(aqk_ptr + rt[:, None] * BT + ct[None, :])
            aq_lo = tl.load(aqk_ptr + rt[:, None] * BT + ct[None, :] + lo_off)
    if SUBST == 0:
        sc = tl.arange(0, BC)
        # arows[s, c] = Akk[blk(c) * BC + s, c], all BC steps' rows fetched at once
        arows = tl.load(akk_ptr + ((ct // BC) * BC)[None, :] * BT + sc[:, None] * BT + ct[None, :])
        x = tl.zeros([BT, BT], dtype=tl.float32)
        for s in range(BC):
            arow = tl.sum(tl.where((sc == s)[:, None], arows, 0.0), axis=0)
            contrib = tl.sum(arow[:, None] * x, axis=0)
            newrow = tl.where((ct % BC) == s, 1.0, -contrib)
            x = tl.where(((rt % BC) == s)[:, None] & same_blk, newrow[None, :], x)
    elif SUBST == 1:
        # the transpose xt[c, r] = X[r, c]: step s reduces along axis 1 with a tile of Akk loaded
        # straight in xt's shape (m[c, r] = Akk[blk(c) * BC + s, r], same block only) -- no
        # row extraction, no layout conversion inside the loop; the chunk's Akk tile is read
        # whole first (the block merge below uses it) so that the per-step loads hit L1
        akk_tile = tl.load(akk_ptr + rt[:, None] * BT + ct[None, :])
        xt = tl.zeros([BT, BT], dtype=tl.float32)
        first = (rt // BC) * BC
        for s in tl.static_range(BC):
            a_s = tl.load(akk_ptr + (first + s)[:, None] * BT + ct[None, :], mask=same_blk, other=0.0)
            contrib = tl.sum(a_s * xt, axis=1)
            newcol = tl.where((rt % BC) == s, 1.0, -contrib)
            xt = tl.where(((ct % BC) == s)[None, :] & same_blk, newcol[:, None], xt)
        x = tl.trans(xt)
    # across blocks: (D + L)^-1 = (I + N)^-1 D^-1, N = D^-1 L nilpotent of index NC, so
    # (I + N)^-1 = (I - N)(I + N^2)(I + N^4)... exactly.  MERGE 0: float32 FMA products;
    # MERGE 1: bf16 hi/lo tensor-core products (~16 bits)
    if LOG_NC > 0:
        if SUBST != 1:
            lower = tl.load(akk_ptr + rt[:, None] * BT + ct[None, :], mask=(rt[:, None] // BC) > (ct[None, :] // BC), other=0.0)
        else:
            lower = tl.where((rt[:, None] // BC) > (ct[None, :] // BC), akk_tile, 0.0)
        eye = tl.where(rt[:, None] == ct[None, :], 1.0, 0.0)
        zero = tl.zeros([BT, BT], dtype=tl.float32)
        if MERGE == 0:
            n = tl.dot(x, lower, input_precision="ieee")
        else:
            n = _dotp(x, lower, zero, TF32)
        p = eye - n
        for _ in tl.static_range(LOG_NC - 1):
            if MERGE == 0:
                n = tl.dot(n, n, input_precision="ieee")
                p = tl.dot(p, eye + n, input_precision="ieee")
            else:
                n = _dotp(n, n, zero, TF32)
                p = _dotp(p, eye + n, zero, TF32)
        if MERGE == 0:
            x = tl.dot(p, x, input_precision="ieee")
        else:
            x = _dotp(p, x, zero, TF32)
    if HOIST == 0:
        beta_c = tl.load(beta_ptr + ct * s_bt, mask=rt_ok, other=0.0).to(tl.float32)
    a_wy = (x * beta_c[None, :]).to(tl.bfloat16)  # A = (I + Akk)^-1 diag(beta)

    if PRE and HOIST == 0:
        p_aq = aqk_ptr + rt[:, None] * BT + ct[None, :]
        aq_hi = tl.load(p_aq)
        aq_lo = tl.load(p_aq + lo_off)
    # reversed rows for the decay to the chunk's end: row j = BT - 1 - i
    m_shift = (rt >= 1) & (t0 + BT - rt < T)
    m_rev = t0 + BT - 1 - rt < T
    for ks in range(0, K, BK):
        ck = ks + tl.arange(0, BK)
        m = rt_ok[:, None]
        if KD_SUM != 3:
            g_a = tl.load(g_ptr + rt[:, None] * s_gt + ck[None, :], mask=m, other=0.0).to(tl.float32)
        k_a = tl.load(k_ptr + rt[:, None] * s_kt + ck[None, :], mask=m, other=0.0).to(tl.float32)
        q_a = tl.load(q_ptr + rt[:, None] * s_qt + ck[None, :], mask=m, other=0.0).to(tl.float32)
        if HOIST == 2 and KD_SUM == 0:  # the reversed rows with the forward ones: one round trip per key tile
            gs = tl.load(g_ptr + (BT - rt)[:, None] * s_gt + ck[None, :], mask=m_shift[:, None], other=0.0).to(tl.float32)
            k_r = tl.load(k_ptr + (BT - 1 - rt)[:, None] * s_kt + ck[None, :], mask=m_rev[:, None], other=0.0)
        p_t = rt[:, None] * K + ck[None, :]
        if KD_SUM == 1:  # kd and gl first, so that the float64 sums are dead before the products
            g64 = tl.cumsum(g_a.to(tl.float64), axis=0)  # G_i, exact: no long float32 sum to cancel
            tot = tl.sum(g_a.to(tl.float64), axis=0)  # G_last
            dec = _exp(g64.to(tl.float32))  # exp(G_i) <= 1
            # exp(G_last - G_j): G_last - G_j in float64, then one rounding to float32
            kd_t = k_a * _exp((tot[None, :] - g64).to(tl.float32))
            tl.store(kd_ptr + p_t, kd_t.to(kd_ptr.dtype.element_ty))
            tl.store(gl_ptr + ck, _exp(tot.to(tl.float32)))
        elif KD_SUM == 2:  # one float32 running sum of floored gates serves exp(G_i) and exp(G_last - G_j)
            g_f = tl.maximum(g_a, -_KD_FLOOR)
            g32 = tl.cumsum(g_f, axis=0)
            tot32 = tl.sum(g_f, axis=0)
            dec = _exp(g32)
            kd_t = k_a * _exp(tot32[None, :] - g32)
            tl.store(kd_ptr + p_t, kd_t.to(kd_ptr.dtype.element_ty))
            tl.store(gl_ptr + ck, _exp(tot32))
        elif KD_SUM == 3:  # the block rows' sums: G_i = (its block's running sum) + (the earlier blocks' totals)
            g32 = tl.load(gs_ptr + rt[:, None] * K + ck[None, :], mask=m, other=0.0)
            tot32 = tl.zeros([BK], dtype=tl.float32)
            for b in tl.static_range(BT // BC):
                blk_tot = tl.load(gt_ptr + b * K + ck)
                if b < BT // BC - 1:
                    g32 += tl.where((rt // BC > b)[:, None], blk_tot[None, :], 0.0)
                tot32 += blk_tot
            dec = _exp(g32)
            kd_t = k_a * _exp(tot32[None, :] - g32)
            tl.store(kd_ptr + p_t, kd_t.to(kd_ptr.dtype.element_ty))
            tl.store(gl_ptr + ck, _exp(tot32))
        else:
            dec = _exp(tl.cumsum(g_a, axis=0))  # exp(G_i) <= 1
        w_t = tl.dot(a_wy, (k_a * dec).to(tl.bfloat16)).to(tl.bfloat16)
        tl.store(w_ptr + p_t, w_t)
        qd_t = q_a * (dec * scale)
        if PRE:
            # Aqk (hi + lo, ~16 bits) times w exactly as the scan reads it
            aw = tl.dot(aq_hi, w_t)
            aw = tl.dot(aq_lo, w_t, aw)
            qd_t = qd_t - aw
        tl.store(qd_ptr + p_t, qd_t.to(qd_ptr.dtype.element_ty))
        if KD_SUM == 0:
            tl.store(gl_ptr + ck, _exp(tl.sum(g_a, axis=0)))
            # exp(G_last - G_j) = exp(sum_{t > j} g_t): a forward sum of g[BT-1], g[BT-2], ...
            if HOIST < 2:
                gs = tl.load(g_ptr + (BT - rt)[:, None] * s_gt + ck[None, :], mask=m_shift[:, None], other=0.0).to(tl.float32)
                k_r = tl.load(k_ptr + (BT - 1 - rt)[:, None] * s_kt + ck[None, :], mask=m_rev[:, None], other=0.0).to(tl.float32)
            kd_r = k_r.to(tl.float32) * _exp(tl.cumsum(gs, axis=0))
            tl.store(kd_ptr + (BT - 1 - rt)[:, None] * K + ck[None, :], kd_r.to(kd_ptr.dtype.element_ty))
    for vs in range(0, V, BVP):
        cv = vs + tl.arange(0, BVP)
        v_a = tl.load(v_ptr + rt[:, None] * s_vt + cv[None, :], mask=rt_ok[:, None], other=0.0)
        u_t = tl.dot(a_wy, v_a.to(tl.bfloat16))
        # u as stored (float32, or bf16 with u_store="bf16"); au below takes the float32 u_t
        tl.store(u_ptr + rt[:, None] * V + cv[None, :], u_t.to(u_ptr.dtype.element_ty))
        if PRE:
            if TF32:
                au = tl.dot(aq_hi.to(tl.float32) + aq_lo.to(tl.float32), u_t, input_precision="tf32")
            else:
                u_hi, u_lo = _split(u_t)
                au = tl.dot(aq_hi, u_hi)
                au = tl.dot(aq_hi, u_lo, au)
                au = tl.dot(aq_lo, u_hi, au)
            tl.store(au_ptr + rt[:, None] * V + cv[None, :], au.to(au_ptr.dtype.element_ty))


@triton.jit
def _kda_prep_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,
    w_ptr, u_ptr, kd_ptr, qd_ptr, aqk_ptr, akk_ptr, gl_ptr, au_ptr, gs_ptr, gt_ptr, flag_ptr,
    scale, T, TP, NT, H, lo_off,
    s_qb, s_qt, s_qh,
    s_kb, s_kt, s_kh,
    s_vb, s_vt, s_vh,
    s_gb, s_gt, s_gh,
    s_bb, s_bt, s_bh,
    K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BKP: tl.constexpr, BVP: tl.constexpr, DK: tl.constexpr,
    LOG_NC: tl.constexpr, RECENTRE: tl.constexpr, LIMIT: tl.constexpr, MERGE: tl.constexpr,
    TF32: tl.constexpr, PRE: tl.constexpr, SUBST: tl.constexpr, STAGE: tl.constexpr, LOG_BC: tl.constexpr,
    HOIST: tl.constexpr, CHUNK: tl.constexpr, SB: tl.constexpr = 0, LOG_NS: tl.constexpr = 0, DKS: tl.constexpr = 1,
    OFFW: tl.constexpr = 0, DIAG_TRANS: tl.constexpr = False, FLOOR: tl.constexpr = 0.0, KD_SUM: tl.constexpr = 0, INV: tl.constexpr = 0,
    PREFETCH: tl.constexpr = False, FLAG: tl.constexpr = False,
):
    """STAGE 0: everything for one chunk (block rows, then the solve); 1: one block row of
    one chunk (grid NT * NC), or with CHUNK all block rows of one chunk (grid NT); 2: the solve
    and WY factors of one chunk. FLAG (scan_overlap, STAGE 2): the grid is (B*H, NT), so that
    programs are dispatched chunk by chunk across heads, and each marks its chunk done in flag_ptr
    once its tiles are stored, for a scan that is already running."""
    NC: tl.constexpr = BT // BC
    if STAGE == 1 and not CHUNK:
        i_t = tl.program_id(0).to(tl.int64) // NC
        bi = tl.program_id(0) % NC
    elif FLAG:
        i_t = tl.program_id(1).to(tl.int64)
        bi = 0
    else:
        i_t = tl.program_id(0).to(tl.int64)
        bi = 0
    if FLAG:
        i_bh = tl.program_id(0).to(tl.int64)
    else:
        i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    t0 = i_t * BT

    q_ptr += i_b * s_qb + i_h * s_qh + t0 * s_qt
    k_ptr += i_b * s_kb + i_h * s_kh + t0 * s_kt
    v_ptr += i_b * s_vb + i_h * s_vh + t0 * s_vt
    g_ptr += i_b * s_gb + i_h * s_gh + t0 * s_gt
    beta_ptr += i_b * s_bb + i_h * s_bh + t0 * s_bt
    row_base = i_bh * TP + t0  # first row of this chunk in the [B*H, TP, *] intermediates
    w_ptr += row_base * K
    kd_ptr += row_base * K
    qd_ptr += row_base * K
    u_ptr += row_base * V
    au_ptr += row_base * V
    aqk_ptr += row_base * BT
    akk_ptr += row_base * BT
    gl_ptr += (i_bh * NT + i_t) * K
    GSUM: tl.constexpr = KD_SUM == 3  # kd_sum "rows": the block rows hand their running sums to the solve
    if GSUM:
        gs_ptr += row_base * K
        gt_ptr += (i_bh * NT + i_t) * NC * K

    if STAGE == 0 and CHUNK:
        _block_chunk(q_ptr, k_ptr, g_ptr, beta_ptr, aqk_ptr, akk_ptr, scale, t0, T, lo_off,
                     s_qt, s_kt, s_gt, s_bt, K, BT, BC, BK, DK, RECENTRE, LIMIT, TF32, SUBST, LOG_BC)
        tl.debug_barrier()
    if STAGE == 0 and not CHUNK:
        for b in range(NC):
            _block_row(q_ptr, k_ptr, g_ptr, beta_ptr, aqk_ptr, akk_ptr, scale, t0, T, b, lo_off,
                       s_qt, s_kt, s_gt, s_bt, K, BT, BC, BK, DK, RECENTRE, LIMIT, TF32, SUBST, LOG_BC, SB, LOG_NS, DKS,
                       OFFW, DIAG_TRANS, FLOOR, INV, gs_ptr, gt_ptr, GSUM, PREFETCH)
        tl.debug_barrier()  # the block rows were written by other threads of this program
    if STAGE == 1 and CHUNK:
        _block_chunk(q_ptr, k_ptr, g_ptr, beta_ptr, aqk_ptr, akk_ptr, scale, t0, T, lo_off,
                     s_qt, s_kt, s_gt, s_bt, K, BT, BC, BK, DK, RECENTRE, LIMIT, TF32, SUBST, LOG_BC)
    if STAGE == 1 and not CHUNK:
        _block_row(q_ptr, k_ptr, g_ptr, beta_ptr, aqk_ptr, akk_ptr, scale, t0, T, bi, lo_off,
                   s_qt, s_kt, s_gt, s_bt, K, BT, BC, BK, DK, RECENTRE, LIMIT, TF32, SUBST, LOG_BC, SB, LOG_NS, DKS,
                   OFFW, DIAG_TRANS, FLOOR, INV, gs_ptr, gt_ptr, GSUM, PREFETCH)
    if STAGE != 1:
        _solve_wy(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, w_ptr, u_ptr, kd_ptr, qd_ptr, akk_ptr, gl_ptr,
                  aqk_ptr, au_ptr, lo_off,
                  scale, t0, T, s_qt, s_kt, s_vt, s_gt, s_bt, K, V, BT, BC, BKP, BVP, LOG_NC, MERGE, TF32, PRE, SUBST, HOIST,
                  KD_SUM, gs_ptr, gt_ptr)
    if STAGE == 2 and FLAG:
        # every thread's stores are done (the barrier), then one release at GPU scope publishes them: the scan's
        # loader reads the flag with an acquire before its TMA loads of this chunk
        tl.debug_barrier()
        tl.atomic_xchg(flag_ptr + i_bh * NT + i_t, 1, sem="release", scope="gpu")


# ------------------------------------------------------------------------------------------
# Stage 2: the sequential scan over chunks
# ------------------------------------------------------------------------------------------
@triton.jit
def _kda_scan_kernel(
    w_ptr, u_ptr, kd_ptr, qd_ptr, aqk_ptr, gl_ptr, au_ptr,
    h0_ptr, ht_ptr, o_ptr, hbuf_ptr, dbuf_ptr,
    T, TP, NT, H, lo_off,
    s_ob, s_ot, s_oh,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
    LAYOUT: tl.constexpr, FUSE_OUT: tl.constexpr, SPLIT_S: tl.constexpr,
    USE_H0: tl.constexpr, STORE_HT: tl.constexpr, PRE: tl.constexpr,
):
    """One program per (V-block, batch*head) walks the chunks in order.  LAYOUT 0 keeps the
    state as S [K, BV]; LAYOUT 1 as S^T [BV, K], so that the state and delta are the
    register-resident left operands of every product and the loaded tiles the right ones.
    Products with delta use a bf16 hi/lo split (two bf16 products, ~16 significant bits), the
    read-out's Aqk delta three (Aqk arrives as hi and lo halves); products with the state use
    the split too when SPLIT_S, else the state rounded to bf16.  No tf32 anywhere.  With PRE the
    read-out is o = qd' S + au (qd' = qd - Aqk w and au = Aqk u from the preparation): no Aqk
    tiles, no products with delta but the state update's."""
    i_v = tl.program_id(0).to(tl.int64)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    rk = tl.arange(0, K)
    cv = i_v * BV + tl.arange(0, BV)
    rt = tl.arange(0, BT)
    ct = tl.arange(0, BT)

    if LAYOUT == 0:
        state_off = (i_bh * K + rk[:, None]) * V + cv[None, :]  # [K, BV]
    else:
        state_off = (i_bh * K + rk[None, :]) * V + cv[:, None]  # [BV, K]
    if USE_H0:
        S = tl.load(h0_ptr + state_off).to(tl.float32)
    else:
        if LAYOUT == 0:
            S = tl.zeros([K, BV], dtype=tl.float32)
        else:
            S = tl.zeros([BV, K], dtype=tl.float32)

    w_ptr += i_bh * TP * K
    kd_ptr += i_bh * TP * K
    qd_ptr += i_bh * TP * K
    u_ptr += i_bh * TP * V
    au_ptr += i_bh * TP * V
    aqk_ptr += i_bh * TP * BT
    gl_ptr += i_bh * NT * K
    o_ptr += i_b * s_ob + i_h * s_oh
    dbuf_ptr += i_bh * TP * V
    hbuf_ptr += i_bh * NT * K * V

    for n in range(NT):
        # Everything the read-out needs is loaded first and the read-out computed last (from
        # the state entering the chunk), so that its loads -- au is not pipelined by Triton --
        # overlap the S -> delta -> S chain instead of stalling it.
        row = n * BT + rt
        p_k = row[:, None] * K + rk[None, :]
        w_n = tl.load(w_ptr + p_k)
        kd_n = tl.load(kd_ptr + p_k)
        gl_n = tl.load(gl_ptr + n * K + rk)
        if LAYOUT == 0:
            u_n = tl.load(u_ptr + row[:, None] * V + cv[None, :]).to(tl.float32)
            if FUSE_OUT:
                qd_n = tl.load(qd_ptr + p_k)
                if PRE:
                    o_n = tl.load(au_ptr + row[:, None] * V + cv[None, :]).to(tl.float32)
                else:
                    o_n = tl.zeros([BT, BV], dtype=tl.float32)
                    p_a = aqk_ptr + row[:, None] * BT + ct[None, :]
                    a_hi = tl.load(p_a)
                    a_lo = tl.load(p_a + lo_off)
            if SPLIT_S:
                s_hi, s_lo = _split(S)
                ws = tl.dot(w_n, s_hi)
                ws = tl.dot(w_n, s_lo, ws)
            else:
                s_hi = S.to(tl.bfloat16)
                ws = tl.dot(w_n, s_hi)
            d = u_n - ws  # [BT, BV]
            d_hi, d_lo = _split(d)
            if not FUSE_OUT:
                tl.store(hbuf_ptr + n * K * V + rk[:, None] * V + cv[None, :], S.to(hbuf_ptr.dtype.element_ty))
                if not PRE:
                    tl.store(dbuf_ptr + row[:, None] * V + cv[None, :], d)
            kt = tl.trans(kd_n)
            upd = tl.dot(kt, d_hi)
            upd = tl.dot(kt, d_lo, upd)
            S_next = S * gl_n[:, None] + upd
            if FUSE_OUT:
                o_n = tl.dot(qd_n, s_hi, o_n)
                if SPLIT_S:
                    o_n = tl.dot(qd_n, s_lo, o_n)
                if not PRE:
                    o_n = tl.dot(a_hi, d_hi, o_n)
                    o_n = tl.dot(a_hi, d_lo, o_n)
                    o_n = tl.dot(a_lo, d_hi, o_n)
                tl.store(o_ptr + row[:, None] * s_ot + cv[None, :], o_n.to(o_ptr.dtype.element_ty),
                         mask=(row < T)[:, None])
            S = S_next
        else:
            u_t = tl.load(u_ptr + row[None, :] * V + cv[:, None]).to(tl.float32)  # [BV, BT]
            if FUSE_OUT:
                qd_n = tl.load(qd_ptr + p_k)
                if PRE:
                    o_t = tl.load(au_ptr + row[None, :] * V + cv[:, None]).to(tl.float32)  # [BV, BT]
                else:
                    o_t = tl.zeros([BV, BT], dtype=tl.float32)
                    p_a = aqk_ptr + row[None, :] * BT + ct[:, None]  # Aqk^T, [BT(j), BT(i)]
                    a_hi = tl.load(p_a)
                    a_lo = tl.load(p_a + lo_off)
            wt = tl.trans(w_n)
            if SPLIT_S:
                s_hi, s_lo = _split(S)
                ws = tl.dot(s_hi, wt)
                ws = tl.dot(s_lo, wt, ws)
            else:
                s_hi = S.to(tl.bfloat16)
                ws = tl.dot(s_hi, wt)
            d = u_t - ws  # [BV, BT]
            d_hi, d_lo = _split(d)
            if not FUSE_OUT:
                tl.store(hbuf_ptr + n * K * V + rk[None, :] * V + cv[:, None], S.to(hbuf_ptr.dtype.element_ty))
                if not PRE:
                    tl.store(dbuf_ptr + row[None, :] * V + cv[:, None], d)
            upd = tl.dot(d_hi, kd_n)
            upd = tl.dot(d_lo, kd_n, upd)
            S_next = S * gl_n[None, :] + upd
            if FUSE_OUT:
                qt = tl.trans(qd_n)
                o_t = tl.dot(s_hi, qt, o_t)
                if SPLIT_S:
                    o_t = tl.dot(s_lo, qt, o_t)
                if not PRE:
                    o_t = tl.dot(d_hi, a_hi, o_t)
                    o_t = tl.dot(d_lo, a_hi, o_t)
                    o_t = tl.dot(d_hi, a_lo, o_t)
                tl.store(o_ptr + row[None, :] * s_ot + cv[:, None], o_t.to(o_ptr.dtype.element_ty),
                         mask=(row < T)[None, :])
            S = S_next

    if STORE_HT:
        tl.store(ht_ptr + state_off, S)


# ------------------------------------------------------------------------------------------
# scan_engine "wgmma" (session 10): the state pass and the read-out in one Gluon kernel, sm_90 only
# ------------------------------------------------------------------------------------------
WGMMA_BV = 64  # value columns per program: the wgmma M of its one warpgroup


@gluon.jit
def _wgmma_chunk(S, ws, wkq_stage, ua_stage, g_stage, LS: gl.constexpr, LD: gl.constexpr,
                 K: gl.constexpr, BT: gl.constexpr):
    """One chunk of the wgmma state pass, shared by both engines: returns the update of S^T still in flight
    (the caller waits for it), w's product, and o^T = au^T + S^T qd^T (complete)."""
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
def _kda_scan_wgmma(wkq_desc, ua_desc, g_desc, o_desc, h0_ptr, ht_ptr, TP, NT, H,
                    K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr, NS: gl.constexpr,
                    USE_H0: gl.constexpr, STORE_HT: gl.constexpr):
    """``_kda_scan_kernel`` with readout "pre", fused, scan_dot "mixed", for one (64 value columns,
    batch*head), written so that no step moves the state through shared memory.

    The state is held transposed, S^T [BV, K], as a wgmma accumulator of the program's one warpgroup. Its
    bf16 copy is the register operand A of both products that read it: S^T w^T (the chain) and S^T qd^T
    (the read-out). delta^T = u^T - S^T w^T is formed in registers and is the register operand of
    S^T <- gl (.) S^T + delta^T kd, which accumulates into the state itself. A chunk's w, kd and qd (one
    [3, BH, TP, K] buffer), u and au (one [2, BH, TP, V] buffer) and gl arrive by three TMA copies; o^T
    leaves through shared memory by TMA store (clipped at T). The read-out's epilogue and the refill of the
    previous chunk's stage run while the state update is in flight. Roundings as in the Triton scan: S to
    bf16 in its products, delta as a bf16 hi/lo pair (~16 bits; hi truncated here, rounded there), o
    rounded once."""
    LS: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[BV // 16, 1], instr_shape=[16, K, 16])
    LD: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[BV // 16, 1], instr_shape=[16, BT, 16])

    i_v = gl.program_id(0)
    i_bh = gl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    row0 = i_bh * TP
    g_row0 = i_bh * NT
    v0 = i_v * BV

    # the w, kd, qd box is 4 deep (a power of two): its fourth slot lies past the tensor, which TMA fills with
    # zeros without reading memory (and still counts in the transaction bytes)
    wkq_s = gl.allocate_shared_memory(gl.bfloat16, [NS, 4, BT, K], wkq_desc.layout)
    ua_s = gl.allocate_shared_memory(gl.bfloat16, [NS, 2, BT, BV], ua_desc.layout)
    g_s = gl.allocate_shared_memory(gl.float32, [NS, 1, K], g_desc.layout)
    o_s = gl.allocate_shared_memory(gl.bfloat16, [2, 1, BT, BV], o_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NS):
        mbarrier.init(ready.index(i), count=1)
    fence_async_shared()
    nbytes: gl.constexpr = (4 * BT * K + 2 * BT * BV) * 2 + K * 4
    for i in gl.static_range(NS):
        more = i < NT
        mbarrier.expect(ready.index(i), nbytes, pred=more)
        tma.async_copy_global_to_shared(wkq_desc, [0, row0 + i * BT, 0], ready.index(i), wkq_s.index(i), pred=more)
        tma.async_copy_global_to_shared(ua_desc, [0, row0 + i * BT, v0], ready.index(i), ua_s.index(i), pred=more)
        tma.async_copy_global_to_shared(g_desc, [g_row0 + i, 0], ready.index(i), g_s.index(i), pred=more)

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
        # ... while the update runs: o of this chunk ...
        ob = o_s.index(n % 2)
        ob.reshape([BT, BV]).permute((1, 0)).store(ot.to(gl.bfloat16))
        fence_async_shared()
        tma.store_wait(pendings=0)  # the store of chunk n - 1 has read its buffer (the one written next step)
        gl.thread_barrier()  # every warp's part of o is written, and every warp is done with chunk n - 1's stage
        tma.async_copy_shared_to_global(o_desc, [i_b, n * BT, i_h * V + v0], ob)
        # ... and the refill of chunk n - 1's stage with chunk n - 1 + NS
        nxt = n - 1 + NS
        if (n >= 1) & (nxt < NT):
            ps = (n - 1) % NS
            mbarrier.expect(ready.index(ps), nbytes)
            tma.async_copy_global_to_shared(wkq_desc, [0, row0 + nxt * BT, 0], ready.index(ps), wkq_s.index(ps))
            tma.async_copy_global_to_shared(ua_desc, [0, row0 + nxt * BT, v0], ready.index(ps), ua_s.index(ps))
            tma.async_copy_global_to_shared(g_desc, [g_row0 + nxt, 0], ready.index(ps), g_s.index(ps))
        S = warpgroup_mma_wait(num_outstanding=0, deps=(S,))
    tma.store_wait(pendings=0)
    for i in gl.static_range(NS):
        mbarrier.invalidate(ready.index(i))
    if STORE_HT:
        gl.store(ht_ptr + st_off, S)


@gluon.jit
def _ws_compute(wkq_s, ua_s, g_s, o_s, ready, empty, o_ready, o_free, h0_ptr, ht_ptr, i_bh, v0, NT,
                K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr, NS: gl.constexpr,
                USE_H0: gl.constexpr, STORE_HT: gl.constexpr):
    """scan_engine "wgmma_ws", the compute warpgroup: ``_kda_scan_wgmma``'s step, with every TMA operation
    left to the loader and storer warps (it only waits for a chunk, hands back its stage, and hands over o)."""
    LS: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[BV // 16, 1], instr_shape=[16, K, 16])
    LD: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[BV // 16, 1], instr_shape=[16, BT, 16])
    rv = gl.arange(0, BV, layout=gl.SliceLayout(1, LS))
    ck = gl.arange(0, K, layout=gl.SliceLayout(0, LS))
    st_off = (i_bh * K + ck[None, :]).to(gl.int64) * V + v0 + rv[:, None]
    if USE_H0:
        S = gl.load(h0_ptr + st_off).to(gl.float32)
    else:
        S = gl.zeros([BV, K], gl.float32, layout=LS)
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


# scan_overlap "pdl": chunks whose flags the loader checks with one load and one pair of fences
_WAIT_GROUP = gl.constexpr(8)


@gluon.jit
def _ws_wait_chunks(flags_ptr, n0, NT, G: gl.constexpr):
    """scan_overlap "pdl": spin until the solve has marked chunks n0 .. n0 + G - 1 done (flags past NT count as
    done), then order their stores before the TMA loads that follow: a strong load and a fence make the acquire, and
    the proxy fence covers the TMA's async proxy. One check per G chunks: checked per chunk, the flag's round trip
    and the fences (which wait for the TMA loads in flight) cost more than a scan step (H200, session 14: the scan
    beside the solve took 330 us at the headline against 163 alone).
    A solve that never runs beside the scan (programmatic launch not honoured, e.g. kernels serialised by a
    profiler) would leave the scan spinning: after ~2^24 polls (seconds) it traps, an error instead of a hang."""
    offs = n0 + gl.arange(0, G, layout=gl.BlockedLayout([1], [32], [1], [0]))
    done = gl.min(gl.load(flags_ptr + offs, mask=offs < NT, other=1, volatile=True), axis=0)
    polls = 0
    while done == 0:
        polls += 1
        if polls > 16777216:
            gl.inline_asm_elementwise("trap; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        done = gl.min(gl.load(flags_ptr + offs, mask=offs < NT, other=1, volatile=True), axis=0)
    gl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tfence.proxy.async.global; // $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _ws_loader(wkq_desc, ua_desc, g_desc, o_desc, wkq_s, ua_s, g_s, o_s, ready, empty, o_ready, o_free,
               row0, g_row0, v0, o_row, o_col, NT, flag_ptr, BT: gl.constexpr, NS: gl.constexpr, WAIT: gl.constexpr):
    """scan_engine "wgmma_ws", the loader warp: chunk n's tiles into stage n % NS once the compute warpgroup
    has handed that stage back (and, with WAIT, once the solve running beside the scan has stored them)."""
    nbytes: gl.constexpr = wkq_desc.block_type.nbytes + ua_desc.block_type.nbytes + g_desc.block_type.nbytes
    for n in range(NT):
        st = n % NS
        if WAIT:
            if n % _WAIT_GROUP == 0:
                _ws_wait_chunks(flag_ptr + g_row0, n, NT, _WAIT_GROUP)
        mbarrier.wait(empty.index(st), ((n // NS) & 1) ^ 1)  # barriers start with phase 1 complete: no wait at first
        mbarrier.expect(ready.index(st), nbytes)
        tma.async_copy_global_to_shared(wkq_desc, [0, row0 + n * BT, 0], ready.index(st), wkq_s.index(st))
        tma.async_copy_global_to_shared(ua_desc, [0, row0 + n * BT, v0], ready.index(st), ua_s.index(st))
        tma.async_copy_global_to_shared(g_desc, [g_row0 + n, 0], ready.index(st), g_s.index(st))


@gluon.jit
def _ws_storer(wkq_desc, ua_desc, g_desc, o_desc, wkq_s, ua_s, g_s, o_s, ready, empty, o_ready, o_free,
               row0, g_row0, v0, o_row, o_col, NT, flag_ptr, BT: gl.constexpr, NS: gl.constexpr, WAIT: gl.constexpr):
    """scan_engine "wgmma_ws", the storer warp: o of chunk n from its buffer by TMA store; a buffer is handed
    back once its store has read it (one store left in flight)."""
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
                       USE_H0: gl.constexpr, STORE_HT: gl.constexpr, WAIT: gl.constexpr = False):
    """``_kda_scan_wgmma`` warp-specialised (scan_engine "wgmma_ws", session 10, prepared and compiled for
    sm_90 only, not run on a GPU): one loader warp issues the TMA loads, one storer warp the o stores, and
    the compute warpgroup neither issues nor waits for any of them but through mbarriers -- ready / empty
    per ring stage, o_ready / o_free per o buffer. Aimed at what ncu showed of the one-warpgroup kernel:
    its refill, o store and their CTA barriers on the state's chain.

    WAIT (scan_overlap "pdl", session 14): the scan is launched before the solve and lets it launch at once
    (programmatic dependent launch); its loader waits for each chunk's flag (``_ws_wait_chunks``)."""
    if WAIT:
        # the solve (launched next, programmatically dependent) may start as soon as every scan program runs
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)
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
                   i_bh * TP, i_bh * NT, v0, i_bh // H, (i_bh % H) * V + v0, NT, flag_ptr, BT, NS, WAIT)
    gl.warp_specialize([
        (_ws_compute, (wkq_s, ua_s, g_s, o_s, ready, empty, o_ready, o_free, h0_ptr, ht_ptr, i_bh, v0, NT,
                       K, V, BT, BV, NS, USE_H0, STORE_HT)),
        (_ws_loader, worker_args),
        (_ws_storer, worker_args),
    ], [1, 1], [24, 24])


# ------------------------------------------------------------------------------------------
# Stage 3 (unfused read-out): o = qd h + Aqk delta, every chunk at once
# ------------------------------------------------------------------------------------------
# ------------------------------------------------------------------------------------------
# Stage 1 in Gluon (``rows_engine="gluon"``): both block rows of one chunk in one program
# ------------------------------------------------------------------------------------------
@gluon.jit
def _gl_seg_add(v1, f1, v2, f2):
    """Running sums that restart where a flag is set (each 16-row block's own sums)."""
    return gl.where(f2 > 0, v2, v1 + v2), gl.maximum(f1, f2)


@gluon.jit
def _gl_pair(a_s, b_s, top, bottom, cols, ACC: gl.constexpr, BT: gl.constexpr):
    """[top; bottom] @ cols^T for [BT, K] float32 tiles: one tf32 warpgroup product from shared memory
    ([2 BT, BT]: the q rows' products over the k rows' products)."""
    a_s.slice(0, BT).store(top)
    a_s.slice(BT, BT).store(bottom)
    b_s.store(cols)
    fence_async_shared()
    gl.thread_barrier()
    acc = warpgroup_mma(a_s, b_s.permute((1, 0)), gl.zeros([2 * BT, BT], gl.float32, ACC),
                        use_acc=False)  # float32 operands: tf32 (the compiler's default input precision)
    gl.thread_barrier()  # every warp has read the tiles before the next pair overwrites them
    return acc


@gluon.jit
def _gl_level(a_s, b_s, q, k, g, gn, ri, rr, cc, H: gl.constexpr, BT: gl.constexpr, ACC: gl.constexpr):
    """One level of the exact split inside the 16-row blocks (where a block's decay span is past the guard):
    the lower-left H x H quarter of every 2H x 2H diagonal block, factored around the later half's first row m:
    exp(G_i - G_m) for rows i >= m and k_j exp(G_m - G_j) for columns j < m, both exponents <= 0
    (``_split_level`` of the Triton rows). The exponents are running sums restarting at every H rows: forward
    over the gates after m, backward over the next rows' gates gn (gn_j = g_(j+1)) up to m. g, gn: floored
    gates; ri: the row index in their layout; rr, cc: row and column index of the [2 BT, BT] product (rows
    BT.. the k rows). Returns the quarters of Aqk and Akk stacked, zero elsewhere."""
    later = (ri % (2 * H)) >= H
    restart = gl.where(ri % H == 0, 1.0, 0.0) + gl.zeros_like(g)
    fwd, _ = gl.associative_scan((gl.where(ri % H == 0, 0.0, g), restart), 0, _gl_seg_add)
    restart_rev = gl.where(ri % H == H - 1, 1.0, 0.0) + gl.zeros_like(g)
    rev, _ = gl.associative_scan((gn, restart_rev), 0, _gl_seg_add, reverse=True)
    up = gl.where(later, _gl_exp(gl.minimum(fwd, 0.0)), 0.0)
    down = gl.where(later, 0.0, k * _gl_exp(gl.minimum(rev, 0.0)))
    p = _gl_pair(a_s, b_s, q * up, k * up, down, ACC, BT)
    i = rr % BT
    sel = ((i % (2 * H)) >= H) & ((cc % (2 * H)) < H) & (i // (2 * H) == cc // (2 * H))
    return gl.where(sel, p, 0.0)


@gluon.jit
def _gl_off(a_s, b_s, q, k, e, gs, c16, ri, BT: gl.constexpr, ACC: gl.constexpr):
    """Rows 16.. against columns ..15, factored around row 16: exp(G_i - G_16) = exp(E_i), and k_j exp(G_16 - G_j)
    with G_16 - G_j = c16 - (running sum at j), c16 = floored g_16 + block 0's total (both exponents <= 0); the
    [2 BT, BT] product is zero elsewhere."""
    BC: gl.constexpr = 16
    up = gl.where(ri >= BC, _gl_exp(e), 0.0)
    down = gl.where(ri < BC, k * _gl_exp(gl.minimum(c16[None, :] - gs, 0.0)), 0.0)
    return _gl_pair(a_s, b_s, q * up, k * up, down, ACC, BT)


@gluon.jit
def _gl_split(a_s, b_s, q, k, g, g_ptr, s_gt, t0, T, ri, c1, rr, cc, FLOOR: gl.constexpr, BT: gl.constexpr,
              ACC: gl.constexpr):
    """The diagonal blocks' strictly lower part by the exact split (``_gl_level`` at H = 8, 4, 2, 1: every pair of
    a 16-row block lies in one level's quarter, the highest bit where i and j differ), and Aqk's diagonal
    <q_i, k_i>. g_ptr: the chunk's first gate; gn below is the next row's gate, floored (0 past the chunk and T)."""
    gn = gl.load(g_ptr + (ri + 1) * s_gt + c1[None, :], mask=(ri + 1 < BT) & ((t0 + ri + 1) < T), other=0.0)
    gn = gl.maximum(gn.to(gl.float32), FLOOR)
    z = _gl_level(a_s, b_s, q, k, g, gn, ri, rr, cc, 8, BT, ACC)
    for lv in gl.static_range(1, 4):
        z += _gl_level(a_s, b_s, q, k, g, gn, ri, rr, cc, 8 >> lv, BT, ACC)
    return z, gl.sum(q * k, axis=1)


@gluon.jit
def _gl_extract(z, diag, a_flat, BT: gl.constexpr, MMA: gl.constexpr):
    """Aqk's and Akk's [BT, BT] tiles (unscaled) from a [2 BT, BT] product (q rows over k rows), through the first
    8 KB of the operand buffer into the small products' layout, Aqk's diagonal ``diag`` added."""
    z_s = a_flat.slice(0, 2 * BT * BT)._reinterpret(gl.float32, [2 * BT, BT], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    z_s.store(z)
    gl.thread_barrier()
    ri_m = gl.arange(0, BT, layout=gl.SliceLayout(1, MMA))[:, None]
    rj_m = gl.arange(0, BT, layout=gl.SliceLayout(0, MMA))[None, :]
    aq = z_s.slice(0, BT).load(MMA)
    aq += gl.where(ri_m == rj_m, gl.convert_layout(diag, gl.SliceLayout(1, MMA))[:, None], 0.0)
    return aq, z_s.slice(BT, BT).load(MMA)


@gluon.jit
def _gl_folded(a_s, b2_s, a_flat, q, k, e, gs, ref, c_off, ri, BT: gl.constexpr, WG: gl.constexpr,
               MMA: gl.constexpr):
    """``rows_fold`` where the guard holds: Aqk's and Akk's [BT, BT] tiles (unscaled) from one [2 BT, 2 BT] product.
    Rows: q exp(E - ref) over k exp(E - ref) (the diagonal's midpoint factors). Columns: k exp(ref - E) (the
    diagonal blocks), then k_j exp(G_16 - G_j + ref_1) for j < 16 (c_off = g_16 + block 0's total + ref_1 per
    channel; exponent <= ref_1 <= 0), whose products with rows 16.. are exp(G_i - G_j) exactly."""
    BC: gl.constexpr = 16
    ACC2: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WG], instr_shape=[16, 2 * BT // WG, 8])
    up = _gl_exp(e - ref)
    a_s.slice(0, BT).store(q * up)
    a_s.slice(BT, BT).store(k * up)
    b2_s.slice(0, BT).store(k * _gl_exp(ref - e))
    b2_s.slice(BT, BT).store(gl.where(ri < BC, k * _gl_exp(gl.minimum(c_off[None, :] - gs, 0.0)), 0.0))
    fence_async_shared()
    gl.thread_barrier()
    z = warpgroup_mma(a_s, b2_s.permute((1, 0)), gl.zeros([2 * BT, 2 * BT], gl.float32, ACC2), use_acc=False)
    gl.thread_barrier()  # every warp's product has read the operands before the result overwrites them
    z_s = a_flat.slice(0, 4 * BT * BT)._reinterpret(gl.float32, [2 * BT, 2 * BT], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    z_s.store(z)
    gl.thread_barrier()
    ri_m = gl.arange(0, BT, layout=gl.SliceLayout(1, MMA))[:, None]
    rj_m = gl.arange(0, BT, layout=gl.SliceLayout(0, MMA))[None, :]
    same = (ri_m // BC) == (rj_m // BC)
    off = (ri_m >= BC) & (rj_m < BC)
    # the upper triangle and the other block may hold inf / nan: select, never multiply
    aq = gl.where(same & (ri_m >= rj_m), z_s.slice(0, BT).slice(0, BT, 1).load(MMA), 0.0)
    aq += gl.where(off, z_s.slice(0, BT).slice(BT, BT, 1).load(MMA), 0.0)
    ak = gl.where(same & (ri_m > rj_m), z_s.slice(BT, BT).slice(0, BT, 1).load(MMA), 0.0)
    ak += gl.where(off, z_s.slice(BT, BT).slice(BT, BT, 1).load(MMA), 0.0)
    return aq, ak


@gluon.jit
def _gl_dot3(a, b, MMA: gl.constexpr):
    """a @ b for float32 [BT, BT] tiles as bf16 hi/lo pairs: three bf16 tensor-core products (~16 bits), as
    ``_dot3`` does for the Triton block rows."""
    A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    B: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    a_hi = a.to(gl.bfloat16)
    a_lo = (a - a_hi.to(gl.float32)).to(gl.bfloat16)
    b_hi = b.to(gl.bfloat16)
    b_lo = (b - b_hi.to(gl.float32)).to(gl.bfloat16)
    a_hi = gl.convert_layout(a_hi, A)
    b_hi = gl.convert_layout(b_hi, B)
    acc = mma_v2(a_hi, b_hi, gl.zeros(a.shape, gl.float32, MMA))
    acc = mma_v2(a_hi, gl.convert_layout(b_lo, B), acc)
    return mma_v2(gl.convert_layout(a_lo, A), b_hi, acc)


@gluon.jit
def _gl_solve(qdec_s, kdec_s, aq, ak, x, same, eye, beta_ptr, s_bt, v_ptr, s_vt, w_ptr, qd_ptr, u_ptr, au_ptr, t0, T,
              K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, NW: gl.constexpr, MMA: gl.constexpr):
    """``rows_solve``: the solve of ``_solve_wy`` (subst "rows", kd_sum "rows", readout "pre", u and au in bf16) on
    what the Gluon rows hold, so that no intermediate goes through global memory. aq: Aqk scaled; ak: Akk
    beta-scaled by rows; x: its diagonal blocks' inverses (all [BT, BT] in the small products' layout). qdec_s:
    q exp(G) scale (float32), kdec_s: k exp(G) (bf16), both [BT, K] in shared memory, set aside before the rows'
    products. Writes w, qd, u and au (bf16, pointers at the chunk's first row)."""
    A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    B: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    # across the two blocks: (D + L)^-1 = (I - D^-1 L) D^-1 (D^-1 L is nilpotent of index 2), then A = that diag(beta)
    n = _gl_dot3(x, gl.where(same, 0.0, ak), MMA)
    x = _gl_dot3(eye - n, x, MMA)
    cm = gl.arange(0, BT, layout=gl.SliceLayout(0, MMA))
    beta_c = gl.load(beta_ptr + cm * s_bt, mask=(t0 + cm) < T, other=0.0).to(gl.float32)
    a_wy = gl.convert_layout((x * beta_c[None, :]).to(gl.bfloat16), A)
    aq_hi = aq.to(gl.bfloat16)
    aq_lo = gl.convert_layout((aq - aq_hi.to(gl.float32)).to(gl.bfloat16), A)
    aq_hi = gl.convert_layout(aq_hi, A)
    rm = gl.arange(0, BT, layout=gl.SliceLayout(1, MMA))[:, None]
    ck = gl.arange(0, K, layout=gl.SliceLayout(0, MMA))[None, :]
    gl.thread_barrier()  # every warp's share of the set-aside tiles is in shared memory
    w = mma_v2(a_wy, kdec_s.load(B), gl.zeros([BT, K], gl.float32, MMA))
    w = w.to(gl.bfloat16)
    gl.store(w_ptr + rm * K + ck, w)
    w = gl.convert_layout(w, B)
    aw = mma_v2(aq_hi, w, gl.zeros([BT, K], gl.float32, MMA))
    aw = mma_v2(aq_lo, w, aw)
    gl.store(qd_ptr + rm * K + ck, (qdec_s.load(MMA) - aw).to(gl.bfloat16))
    # u = A v and Aqk u (bf16 hi / lo products, ~16 bits, from u before its rounding)
    TC: gl.constexpr = V // 8 if V < 256 else 32
    LV: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32 // TC, TC],
                                        warps_per_cta=[NW, 1], order=[1, 0])
    rv = gl.arange(0, BT, layout=gl.SliceLayout(1, LV))[:, None]
    cv = gl.arange(0, V, layout=gl.SliceLayout(0, LV))[None, :]
    v = gl.load(v_ptr + rv * s_vt + cv, mask=(t0 + rv) < T, other=0.0).to(gl.bfloat16)
    u = mma_v2(a_wy, gl.convert_layout(v, B), gl.zeros([BT, V], gl.float32, MMA))
    cu = gl.arange(0, V, layout=gl.SliceLayout(0, MMA))[None, :]
    u_hi = u.to(gl.bfloat16)
    gl.store(u_ptr + rm * V + cu, u_hi)
    u_lo = gl.convert_layout((u - u_hi.to(gl.float32)).to(gl.bfloat16), B)
    u_hi = gl.convert_layout(u_hi, B)
    au = mma_v2(aq_hi, u_hi, gl.zeros([BT, V], gl.float32, MMA))
    au = mma_v2(aq_hi, u_lo, au)
    au = mma_v2(aq_lo, u_hi, au)
    gl.store(au_ptr + rm * V + cu, au.to(gl.bfloat16))


@gluon.jit
def _gl_hilo(x):
    """x (float32) as a bf16 pair hi + lo, ~16 bits: hi truncated by masking (exact in bf16), lo the rounded rest."""
    hi = (x.to(gl.int32, bitcast=True) & -65536).to(gl.float32, bitcast=True)
    return hi.to(gl.bfloat16), (x - hi).to(gl.bfloat16)


@gluon.jit
def _gl_prod3(a, b, acc, HALF: gl.constexpr, bh_s, bl_s, BT: gl.constexpr, ACC: gl.constexpr):
    """acc + a @ b[HALF] for [2 BT, BT] float32 tiles in the wgmma accumulator layout ACC, where b[HALF] is b's
    BT x BT block of rows HALF * BT..: three bf16 wgmma of hi / lo pairs (~16 bits). b goes through shared memory
    (bh_s, bl_s: [2 BT, BT] bf16); a stays in registers, since a warpgroup's accumulator rows are its operand rows."""
    AOP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2)
    b_hi, b_lo = _gl_hilo(b)
    bh_s.store(b_hi)
    bl_s.store(b_lo)
    fence_async_shared()
    gl.thread_barrier()
    a_hi, a_lo = _gl_hilo(a)
    a_hi = gl.convert_layout(a_hi, AOP)
    bh = bh_s.slice(HALF * BT, BT)
    t = warpgroup_mma(a_hi, bh, acc, is_async=True)
    t = warpgroup_mma(gl.convert_layout(a_lo, AOP), bh, t, is_async=True)
    t = warpgroup_mma(a_hi, bl_s.slice(HALF * BT, BT), t, is_async=True)
    t = warpgroup_mma_wait(num_outstanding=0, deps=(t,))
    gl.thread_barrier()  # every warp's product has read b before the next one overwrites it
    return t


@gluon.jit
def _gl_store_stacked(acc, st_flat, top_ptr, bot_ptr, ld, BT: gl.constexpr, N: gl.constexpr):
    """Rows ..BT of the [2 BT, N] float32 accumulator acc to top_ptr, rows BT.. to bot_ptr (row stride ld), as bf16,
    through shared memory (st_flat: a flat float32 view of at least BT * N elements, free): the accumulator's layout
    holds 2 columns per thread, so a direct store is 8 rows x 16 bytes per warp instruction; read back 8 columns
    per thread, every store is 16 bytes and a warp instruction covers whole rows."""
    SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([2 * BT, N], gl.bfloat16)
    st = st_flat.slice(0, BT * N)._reinterpret(gl.bfloat16, [2 * BT, N], SL)
    st.store(acc.to(gl.bfloat16))
    gl.thread_barrier()
    TPR: gl.constexpr = N // 8 if N < 256 else 32
    LB: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32 // TPR, TPR], warps_per_cta=[4, 1],
                                        order=[1, 0])
    r = gl.arange(0, BT, layout=gl.SliceLayout(1, LB))[:, None]
    c = gl.arange(0, N, layout=gl.SliceLayout(0, LB))[None, :]
    gl.store(top_ptr + r * ld + c, st.slice(0, BT).load(LB))
    gl.store(bot_ptr + r * ld + c, st.slice(BT, BT).load(LB))
    gl.thread_barrier()  # every warp has read the tile before the next one overwrites it


@gluon.jit
def _gl_solve_wg(z, scale, beta_ptr, s_bt, t0, T, kdec_s, qh_s, ql_s, v_s, v_bar, bh_s, bl_s,
                 w_ptr, qd_ptr, u_ptr, au_ptr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, st_flat=None,
                 WST: gl.constexpr = False):
    """``solve_mma="wgmma"``: ``_gl_solve`` (and the diagonal blocks' inverse before it) as stacked warpgroup
    products. z: the rows' [2 BT, BT] product as it is (Aqk unscaled over Akk, both lower triangular, Akk strictly).

    The WY matrix A = (I + diag(beta) Akk)^-1 diag(beta). With P = -diag(beta) Akk and P_d its two diagonal 16 x 16
    blocks (strictly lower, so P_d^16 = 0), X = (I - P_d)^-1 = (I + P_d)(I + P_d^2)(I + P_d^4)(I + P_d^8): each doubling
    step is one product of the stacked rows [S_m; P_d^m] by P_d^m, giving [S_m P_d^m; P_d^2m], and S_2m = S_m +
    S_m P_d^m; four steps from S_1 = I reach X. Then (I - P)^-1 = X + X P_off X (P_off: P's lower-left block, and
    (X P_off)^2 = 0), two more products, the order ``_gl_solve`` merges in. (Five doubling steps on the whole of P
    reach the same inverse in one product fewer, but on the H200 its lower-left block came out a few per cent off at
    K 32, enough to fail the tolerance: session 18.) Then [Aqk; I] @ (that diag(beta)) gives [Aqk A; A], whose rows
    are the final products' operands:
    [qd; w] = [-Aqk A; A] @ [k exp(G)] + [I; 0] @ [q exp(G) scale] and [Aqk u; u] = [Aqk A; A] @ v
    (Aqk A as a bf16 hi / lo pair, A rounded to bf16 as ``_gl_solve`` rounds it). qh_s, ql_s: q exp(G) scale as a
    bf16 hi / lo pair; kdec_s: k exp(G) (bf16); v_s: v's tile, arriving on v_bar. WST: the outputs leave through
    st_flat (the rows' operand buffer, 2 BT x K float32, free once the inverse is formed) as 16-byte stores, where a
    [2 BT, 128]-at-most output tile fits in it."""
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
    r = gl.arange(0, 2 * BT, layout=gl.SliceLayout(1, ACC))[:, None]
    c = gl.arange(0, BT, layout=gl.SliceLayout(0, ACC))[None, :]
    top = r < BT
    i = r % BT
    eye = gl.where(i == c, 1.0, 0.0)
    z = gl.convert_layout(z, ACC)
    beta_r = gl.load(beta_ptr + i * s_bt, mask=(t0 + i) < T, other=0.0).to(gl.float32)
    p = -beta_r * z
    same = (i // 16) == (c // 16)
    x = gl.where(top, eye, gl.where(same, p, 0.0))
    for _ in gl.static_range(4):
        x = _gl_prod3(x, x, gl.where(top, x, 0.0), 1, bh_s, bl_s, BT, ACC)
    xp = _gl_prod3(gl.where(top, x, 0.0), gl.where(top | same, 0.0, p), gl.zeros_like(x), 1, bh_s, bl_s, BT, ACC)
    x = _gl_prod3(gl.where(top, xp, 0.0), x, gl.where(top, x, 0.0), 0, bh_s, bl_s, BT, ACC)
    beta_c = gl.load(beta_ptr + c * s_bt, mask=(t0 + c) < T, other=0.0).to(gl.float32)
    m = _gl_prod3(gl.where(top, z * scale, eye), x * beta_c, gl.zeros_like(x), 0, bh_s, bl_s, BT, ACC)
    # the operands' rows: [Aqk A; A] as hi (A rounded to nearest) and lo (zero under A) for u, negated above for
    # w and qd; [I; 0] for q exp(G) scale
    hi = gl.where(top, (m.to(gl.int32, bitcast=True) & -65536).to(gl.float32, bitcast=True),
                  m.to(gl.bfloat16).to(gl.float32))
    lo = gl.where(top, m - hi, 0.0)
    hi_n = gl.where(top, -hi, hi).to(gl.bfloat16)
    lo_n = (-lo).to(gl.bfloat16)
    hi = hi.to(gl.bfloat16)
    lo = lo.to(gl.bfloat16)
    ident = gl.where(top & (i == c), 1.0, 0.0).to(gl.bfloat16)
    AW: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, K, 16])
    OPW: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=AW, k_width=2)
    acc = warpgroup_mma(gl.convert_layout(hi_n, OPW), kdec_s, gl.zeros([2 * BT, K], gl.float32, AW), use_acc=False,
                        is_async=True)
    acc = warpgroup_mma(gl.convert_layout(lo_n, OPW), kdec_s, acc, is_async=True)
    acc = warpgroup_mma(gl.convert_layout(ident, OPW), qh_s, acc, is_async=True)
    acc = warpgroup_mma(gl.convert_layout(ident, OPW), ql_s, acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    if WST:
        _gl_store_stacked(acc, st_flat, qd_ptr, w_ptr, K, BT, K)
    else:
        rw = gl.arange(0, 2 * BT, layout=gl.SliceLayout(1, AW))[:, None]
        cw = gl.arange(0, K, layout=gl.SliceLayout(0, AW))[None, :]
        gl.store(gl.where(rw < BT, qd_ptr + rw * K + cw, w_ptr + (rw - BT) * K + cw), acc.to(gl.bfloat16))
    # u and Aqk u, at most 128 value columns at a time (the accumulator's registers)
    NB: gl.constexpr = V if V <= 128 else 128
    AU: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NB, 16])
    OPU: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=AU, k_width=2)
    hi_u = gl.convert_layout(hi, OPU)
    lo_u = gl.convert_layout(lo, OPU)
    ru = gl.arange(0, 2 * BT, layout=gl.SliceLayout(1, AU))[:, None]
    cu = gl.arange(0, NB, layout=gl.SliceLayout(0, AU))[None, :]
    mbarrier.wait(v_bar, 0)
    for n0 in gl.static_range(0, V, NB):
        vb = v_s.slice(n0, NB, 1)
        acc = warpgroup_mma(hi_u, vb, gl.zeros([2 * BT, NB], gl.float32, AU), use_acc=False, is_async=True)
        acc = warpgroup_mma(lo_u, vb, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        if WST and NB <= 2 * K:
            _gl_store_stacked(acc, st_flat, au_ptr + n0, u_ptr + n0, V, BT, NB)
        else:
            gl.store(gl.where(ru < BT, au_ptr + ru * V + n0 + cu, u_ptr + (ru - BT) * V + n0 + cu), acc.to(gl.bfloat16))


@gluon.jit
def _kda_rows_gluon(q_desc, k_desc, g_desc, gs_desc, g_ptr, beta_ptr, aqk_ptr, akk_ptr, gt_ptr,
                    scale, T, TP, NT, H, lo_off, s_gb, s_gt, s_gh, s_bb, s_bt, s_bh,
                    K: gl.constexpr, BT: gl.constexpr, FLOOR: gl.constexpr, LIMIT: gl.constexpr,
                    WR: gl.constexpr, WG: gl.constexpr, FOLD: gl.constexpr = False,
                    v_ptr=None, s_vb=0, s_vt=0, s_vh=0, w_ptr=None, kd_ptr=None, qd_ptr=None, u_ptr=None, au_ptr=None,
                    gl_ptr=None, flag_ptr=None, V: gl.constexpr = 0, SOLVE: gl.constexpr = False,
                    FLAG: gl.constexpr = False, v_desc=None, WGS: gl.constexpr = False, WST: gl.constexpr = False):
    """``rows_engine="gluon"``: both 16-row block rows of one chunk (BT 32) in one program, one key channel per
    thread (WR threads per channel, each over BT / WR rows), so that each running sum is mostly a thread's own
    loop over its rows and every load of the chunk is issued at once. (The Triton rows: a 1-warp program per
    block row stepping through 16-wide key tiles, latency-bound at 12 warps per SM.) Writes what ``_block_row``
    writes with subst "rows", kd_sum "rows", diag_floor, recentre "midpoint" and inv_dot "bf16x3": Aqk (scaled,
    bf16 hi + lo), Akk (beta-scaled, each diagonal block replaced by the inverse of I + that block), each
    block's running sums of its floored gates and their totals.

    q, k and g arrive by TMA ([1, BT, 1, K] boxes of the [B, T, H, K] tensors, rows past T zero-filled), and the
    running sums leave by TMA from the buffer g arrived in: no per-element addresses or masks in registers.
    The products are tf32 warpgroup products of [BT, K] tiles through shared memory, the q and k rows of one
    factorisation stacked into one [2 BT, K] operand. Rows 16.. against columns ..15: factored around row 16,
    both exponents <= 0. The diagonal blocks: factored around their midpoints where every channel's decay span
    over both blocks is within LIMIT (the Triton rows' guard), else split exactly level by level
    (``_gl_level``) down to the 2 x 2 blocks and the diagonal itself.

    FOLD (``rows_fold``): where the guard holds, rows 16.. against columns ..15 come from the diagonal's product, its
    row factors exp(E_i - ref) against the column factors k_j exp(G_16 - G_j + ref) (exponent <= ref <= 0), as the
    second half of one [2 BT, 2 BT] product; the separate factorisation around row 16 is taken only with the exact
    split. g's buffer then lies inside the column operand's (the running sums' store is waited for first).

    SOLVE (``rows_solve``): the same program then does the solve (``_gl_solve``) and writes the scan's inputs instead
    of Aqk, Akk and the running sums. FLAG: on grid (batch * heads, chunks), each chunk flagged once written, for a
    scan running beside (``scan_overlap``). WGS (``solve_mma="wgmma"``, without FOLD): the solve is ``_gl_solve_wg``,
    on the rows' product as it is; v arrives by TMA (v_desc) into the column operand's buffer once the rows' products
    are done, and q exp(G) scale is set aside as a bf16 hi / lo pair. WST (``solve_mma="wgmma_st"``): the solve's
    outputs leave through the rows' operand buffer as 16-byte stores."""
    BC: gl.constexpr = 16
    NW: gl.constexpr = 4 * WG
    L: gl.constexpr = gl.BlockedLayout(size_per_thread=[BT // WR, 1], threads_per_warp=[1, 32],
                                       warps_per_cta=[WR, NW // WR], order=[0, 1])
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WG], instr_shape=[16, BT // WG, 8])
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[2, NW // 2], instr_shape=[16, 8])
    ROW: gl.constexpr = gl.SliceLayout(1, L)
    COL: gl.constexpr = gl.SliceLayout(0, L)
    if FLAG:  # chunk-major dispatch: chunk 0 of every head first, as the scan beside wants them
        i_t = gl.program_id(1)
        i_bh = gl.program_id(0)
    else:
        i_t = gl.program_id(0)
        i_bh = gl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    t0 = i_t * BT
    row_base = i_bh.to(gl.int64) * TP + t0
    g_ptr += i_b.to(gl.int64) * s_gb + i_h * s_gh + t0.to(gl.int64) * s_gt
    beta_ptr += i_b.to(gl.int64) * s_bb + i_h * s_bh + t0.to(gl.int64) * s_bt
    aqk_ptr += row_base * BT
    akk_ptr += row_base * BT
    gt_ptr += (i_bh.to(gl.int64) * NT + i_t) * (BT // BC) * K

    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    # q and k arrive in the products' operand buffer (read into registers before the first product writes it):
    # 64 KB of shared memory per program at K 128, three programs per SM. Views at byte offsets go through a flat
    # view of the whole buffer: a row slice of a swizzled [2 BT, K] tile is not one contiguous range once a row is
    # wider than the swizzle (K > 32 at float32; H200, session 15: k's box landed over q's)
    a_s = gl.allocate_shared_memory(gl.float32, [2 * BT, K], gl.NVMMASharedLayout.get_default_for([2 * BT, K], gl.float32))
    a_flat = a_s._reinterpret(gl.float32, [2 * BT * K], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    q_s = a_flat.slice(0, BT * K // 2)._reinterpret(gl.bfloat16, [1, BT, 1, K], q_desc.layout)
    k_s = a_flat.slice(BT * K // 2, BT * K // 2)._reinterpret(gl.bfloat16, [1, BT, 1, K], k_desc.layout)
    if FOLD:  # the column operand holds both factors' columns; g's box in its second half
        b2_s = gl.allocate_shared_memory(gl.float32, [2 * BT, K], gl.NVMMASharedLayout.get_default_for([2 * BT, K], gl.float32))
        b_s = b2_s.slice(0, BT)
        g_s = b2_s._reinterpret(gl.float32, [2 * BT * K], gl.SwizzledSharedLayout(1, 1, 1, [0])).slice(
            BT * K, BT * K)._reinterpret(gl.float32, [1, BT, 1, K], g_desc.layout)
    else:
        b_s = gl.allocate_shared_memory(gl.float32, [BT, K], gl.NVMMASharedLayout.get_default_for([BT, K], gl.float32))
        g_s = gl.allocate_shared_memory(gl.float32, [1, BT, 1, K], g_desc.layout)
    if SOLVE:  # the solve's q exp(G) scale in g's buffer once g is in registers (its own without FOLD), k exp(G) beside
        if FOLD:
            qdec_s = gl.allocate_shared_memory(gl.float32, [BT, K], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        else:
            qdec_s = g_s.reshape([BT, K])
        kdec_s = gl.allocate_shared_memory(gl.bfloat16, [BT, K], gl.NVMMASharedLayout.get_default_for([BT, K], gl.bfloat16))
        if WGS:
            # views of buffers free by the time they are written: q exp(G) scale's hi / lo pair in g's buffer (once
            # g is in registers); the inverse's operand pairs in the rows' operand buffer and v's tile in the column
            # operand's (both once the rows' products are done), or in a buffer of its own where v is wider
            QL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, K], gl.bfloat16)
            g_flat = g_s._reinterpret(gl.float32, [BT * K], gl.SwizzledSharedLayout(1, 1, 1, [0]))
            qh_s = g_flat.slice(0, BT * K // 2)._reinterpret(gl.bfloat16, [BT, K], QL)
            ql_s = g_flat.slice(BT * K // 2, BT * K // 2)._reinterpret(gl.bfloat16, [BT, K], QL)
            IL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([2 * BT, BT], gl.bfloat16)
            bh_s = a_flat.slice(0, BT * BT)._reinterpret(gl.bfloat16, [2 * BT, BT], IL)
            bl_s = a_flat.slice(BT * BT, BT * BT)._reinterpret(gl.bfloat16, [2 * BT, BT], IL)
            if V <= 2 * K:
                b_flat = b_s._reinterpret(gl.float32, [BT * K], gl.SwizzledSharedLayout(1, 1, 1, [0]))
                v_s = b_flat.slice(0, BT * V // 2)._reinterpret(gl.bfloat16, [1, BT, 1, V], v_desc.layout)
            else:
                v_s = gl.allocate_shared_memory(gl.bfloat16, [1, BT, 1, V], v_desc.layout)
            v_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
            mbarrier.init(v_bar, count=1)
    fence_async_shared()
    mbarrier.expect(bar, BT * K * 8)
    tma.async_copy_global_to_shared(q_desc, [i_b, t0, i_h, 0], bar, q_s)
    tma.async_copy_global_to_shared(k_desc, [i_b, t0, i_h, 0], bar, k_s)
    tma.async_copy_global_to_shared(g_desc, [i_b, t0, i_h, 0], bar, g_s)

    r1 = gl.arange(0, BT, layout=ROW)
    c1 = gl.arange(0, K, layout=COL)
    ri = r1[:, None]
    rm = gl.arange(0, BT, layout=gl.SliceLayout(1, MMA))
    beta = gl.load(beta_ptr + rm * s_bt, mask=(t0 + rm) < T, other=0.0).to(gl.float32)
    gf0 = gl.maximum(gl.load(g_ptr + c1).to(gl.float32), FLOOR)
    gf16 = gl.maximum(gl.load(g_ptr + BC * s_gt + c1, mask=(t0 + BC) < T, other=0.0).to(gl.float32), FLOOR)
    mbarrier.wait(bar, 0)
    mbarrier.invalidate(bar)
    g = gl.maximum(g_s.reshape([BT, K]).load(L), FLOOR)
    # each block's running sums G_i - G_(r-1) (block start r; what the solve reads), and the block-relative sums
    # with the first row's gate left out, E_i = G_i - G_r (the Triton rows' e_b)
    first = gl.where(ri % BC == 0, 1.0, 0.0) + gl.zeros_like(g)
    gs, _ = gl.associative_scan((g, first), 0, _gl_seg_add)
    e = gs - gl.where(ri < BC, gf0[None, :], gf16[None, :])
    tot0 = gl.min(gl.where(ri < BC, gs, 0.0), axis=0)  # gates are <= 0: the last row's sum is the block's total
    tot1 = gl.min(gl.where(ri < BC, 0.0, gs), axis=0)
    if not SOLVE:
        # the sums leave through g's buffer (each thread overwrites only what it read); rows past T are padding
        g_s.reshape([BT, K]).store(gs)
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(gs_desc, [row_base.to(gl.int32), 0], g_s.reshape([BT, K]))
        gl.store(gt_ptr + c1, tot0)
        gl.store(gt_ptr + K + c1, tot1)
    q = q_s.reshape([BT, K]).load(L).to(gl.float32)
    k = k_s.reshape([BT, K]).load(L).to(gl.float32)
    if not SOLVE:
        # the sums' store must have read g's buffer before anything else writes shared memory: the compiler sees g's
        # buffer dead after the store's issue and may place its own scratch (layout conversions) there (H200, session
        # 16: a wait at the program's end gave inf at the headline, once many programs shared each SM)
        tma.store_wait(pendings=0)
    gl.thread_barrier()  # every warp has read q and k before the products overwrite their buffer
    if SOLVE:
        # what the solve needs of q, k and the sums is formed now and set aside (shared memory, or written out), so
        # that q, k and the sums are dead after the rows' products: the chunk's running sums G_i (block sums plus
        # the totals before) and the decays of the scan's tiles
        g_run = gs + gl.where(ri >= BC, tot0[None, :], 0.0)
        tot = tot0 + tot1
        dec = _gl_exp(g_run)
        if WGS:
            qh, ql = _gl_hilo(q * (dec * scale))
            qh_s.store(qh)
            ql_s.store(ql)
        else:
            qdec_s.store(q * (dec * scale))
        kdec_s.store((k * dec).to(gl.bfloat16))
        gl.store(kd_ptr + row_base * K + ri * K + c1[None, :], (k * _gl_exp(tot[None, :] - g_run)).to(gl.bfloat16))
        gl.store(gl_ptr + (i_bh.to(gl.int64) * NT + i_t) * K + c1, _gl_exp(tot))

    rr = gl.arange(0, 2 * BT, layout=gl.SliceLayout(1, ACC))[:, None]
    cc = gl.arange(0, BT, layout=gl.SliceLayout(0, ACC))[None, :]
    i = rr % BT
    last0 = tot0 - gf0  # E at each block's last row: minus its decay span, per channel
    last1 = tot1 - gf16
    span = -gl.min(gl.minimum(last0, last1), axis=0)
    if FOLD:  # g's buffer, read by the sums' store (waited for above), is now the column operand's second half
        if span <= LIMIT:
            ref = gl.where(ri < BC, 0.5 * last0[None, :], 0.5 * last1[None, :])
            aq, ak = _gl_folded(a_s, b2_s, a_flat, q, k, e, gs, ref, gf16 + tot0 + 0.5 * last1, ri, BT, WG, MMA)
        else:
            z = _gl_off(a_s, b_s, q, k, e, gs, gf16 + tot0, ri, BT, ACC)
            zl, diag = _gl_split(a_s, b_s, q, k, g, g_ptr, s_gt, t0, T, ri, c1, rr, cc, FLOOR, BT, ACC)
            aq, ak = _gl_extract(z + zl, diag, a_flat, BT, MMA)
    else:
        z = _gl_off(a_s, b_s, q, k, e, gs, gf16 + tot0, ri, BT, ACC)
        # the diagonal blocks
        if span <= LIMIT:
            ref = gl.where(ri < BC, 0.5 * last0[None, :], 0.5 * last1[None, :])
            up = _gl_exp(e - ref)
            down = k * _gl_exp(ref - e)
            d = _gl_pair(a_s, b_s, q * up, k * up, down, ACC, BT)
            # the upper triangle and the other block may hold inf / nan: select, never multiply
            sel = ((i // BC) == (cc // BC)) & ((i > cc) | ((i == cc) & (rr < BT)))
            z += gl.where(sel, d, 0.0)
            diag = gl.zeros([BT], gl.float32, ROW)
        else:
            zl, diag = _gl_split(a_s, b_s, q, k, g, g_ptr, s_gt, t0, T, ri, c1, rr, cc, FLOOR, BT, ACC)
            z += zl
            if WGS:  # Aqk's diagonal <q_i, k_i> goes into the product itself (z is taken as it is)
                z += gl.where((rr < BT) & (i == cc), _gl_pair(a_s, b_s, q, k, k, ACC, BT), 0.0)
        if not WGS:
            aq, ak = _gl_extract(z, diag, a_flat, BT, MMA)
    if WGS:
        # the rows' operand buffers are free (each product waited for, then a barrier): v's tile comes in while the
        # inverse is formed
        fence_async_shared()
        mbarrier.expect(v_bar, BT * V * 2)
        tma.async_copy_global_to_shared(v_desc, [i_b, t0, i_h, 0], v_bar, v_s)
        _gl_solve_wg(z, scale, beta_ptr, s_bt, t0, T, kdec_s, qh_s, ql_s, v_s.reshape([BT, V]), v_bar, bh_s, bl_s,
                     w_ptr + row_base * K, qd_ptr + row_base * K, u_ptr + row_base * V, au_ptr + row_base * V,
                     K, V, BT, a_flat, WST)
        mbarrier.invalidate(v_bar)
        if FLAG:
            gl.thread_barrier()
            gl.atomic_xchg(flag_ptr + i_bh * NT + i_t, 1, sem="release", scope="gpu")
    else:
        ri_m = gl.arange(0, BT, layout=gl.SliceLayout(1, MMA))[:, None]
        rj_m = gl.arange(0, BT, layout=gl.SliceLayout(0, MMA))[None, :]
        aq = aq * scale
        p_out = ri_m * BT + rj_m
        if not SOLVE:
            aq_hi = aq.to(gl.bfloat16)
            gl.store(aqk_ptr + p_out, aq_hi)
            gl.store(aqk_ptr + lo_off + p_out, (aq - aq_hi.to(gl.float32)).to(gl.bfloat16))
        # Akk, beta-scaled: each diagonal block L replaced by (I + L)^-1 = (I - L)(I + L^2)(I + L^4)(I + L^8), exact
        # for a strictly lower 16 x 16 block (nilpotent); block-diagonal in, block-diagonal out
        ak = ak * beta[:, None]
        same = (ri_m // BC) == (rj_m // BC)
        n = gl.where(same, ak, 0.0)
        eye = gl.where(ri_m == rj_m, 1.0, 0.0) + gl.zeros_like(ak)
        x = eye - n
        for _ in gl.static_range(3):
            n = _gl_dot3(n, n, MMA)
            x = _gl_dot3(x, eye + n, MMA)
        if SOLVE:
            v_ptr += i_b.to(gl.int64) * s_vb + i_h * s_vh + t0.to(gl.int64) * s_vt
            _gl_solve(qdec_s, kdec_s, aq, ak, x, same, eye, beta_ptr, s_bt, v_ptr, s_vt, w_ptr + row_base * K,
                      qd_ptr + row_base * K, u_ptr + row_base * V, au_ptr + row_base * V, t0, T, K, V, BT, NW, MMA)
            if FLAG:
                # every thread's stores are done (the barrier), then one release at GPU scope publishes them: the scan's
                # loader reads the flag with an acquire before its TMA loads of this chunk
                gl.thread_barrier()
                gl.atomic_xchg(flag_ptr + i_bh * NT + i_t, 1, sem="release", scope="gpu")
        else:
            gl.store(akk_ptr + p_out, x + gl.where(same, 0.0, ak))


@triton.jit
def _kda_out_kernel(
    qd_ptr, aqk_ptr, hbuf_ptr, dbuf_ptr, o_ptr, au_ptr,
    T, TP, NT, H, lo_off,
    s_ob, s_ot, s_oh,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, SPLIT_S: tl.constexpr,
    PRE: tl.constexpr,
):
    i_t = tl.program_id(0).to(tl.int64)
    i_v = tl.program_id(1).to(tl.int64)
    i_bh = tl.program_id(2).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    rk = tl.arange(0, K)
    cv = i_v * BV + tl.arange(0, BV)
    rt = tl.arange(0, BT)
    row = i_t * BT + rt
    qd = tl.load(qd_ptr + (i_bh * TP + row)[:, None] * K + rk[None, :])
    h = tl.load(hbuf_ptr + ((i_bh * NT + i_t) * K + rk)[:, None] * V + cv[None, :])
    if PRE:
        o = tl.load(au_ptr + (i_bh * TP + row)[:, None] * V + cv[None, :]).to(tl.float32)
    else:
        o = tl.zeros([BT, BV], dtype=tl.float32)
    if SPLIT_S:
        h_hi, h_lo = _split(h)
        o = tl.dot(qd, h_hi, o)
        o = tl.dot(qd, h_lo, o)
    else:
        o = tl.dot(qd, h, o)
    if not PRE:
        p_a = aqk_ptr + (i_bh * TP + row)[:, None] * BT + rt[None, :]
        a_hi = tl.load(p_a)
        a_lo = tl.load(p_a + lo_off)
        d_hi, d_lo = _split(tl.load(dbuf_ptr + (i_bh * TP + row)[:, None] * V + cv[None, :]))
        o = tl.dot(a_hi, d_hi, o)
        o = tl.dot(a_hi, d_lo, o)
        o = tl.dot(a_lo, d_hi, o)
    tl.store(o_ptr + i_b * s_ob + i_h * s_oh + row[:, None] * s_ot + cv[None, :],
             o.to(o_ptr.dtype.element_ty), mask=(row < T)[:, None])


# ------------------------------------------------------------------------------------------
# Host side
# ------------------------------------------------------------------------------------------
def _pow2(x: int) -> bool:
    return x >= 1 and (x & (x - 1)) == 0


def _plan(K: int, V: int, knobs: dict) -> dict:
    """Check a knob combination against a shape; return the launch plan or raise ValueError."""
    # knob dicts written before a knob existed lack it: each gets the value that keeps the code it had
    knobs = {"pair": "full", "solve_stages": 1, "u_store": "fp32", "off_tile": "chunk", "diag_cols": "load",
             "scan_engine": "triton", "scan_ring": 4, "diag_floor": 0, "kd_sum": "reversed", "scan_bv": 64,
             "inv_dot": "ieee", "row_prefetch": False, "scan_overlap": "off", "pair_elems": 2048,
             "rows_engine": "triton", "rows_fold": False, "rows_solve": False, "solve_mma": "v2", **knobs}
    # a name this file lacks would be ignored silently: version 9's scan_pair=True would time the default
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        raise ValueError(f"unknown knob(s) {unknown} (scan_pair and pair_merge were removed after session 6, "
                         "scan_form after session 7, overlap and out_beside after session 8; session 9's scan_engine 'gluon' is gone; "
                         "kernels/notes/kda.md)")
    # combinations the CPU interpreter passes but the H200 computed wrongly: refused by name
    if knobs.get("subst") == "direct":
        raise ValueError("subst='direct' computes wrong outputs on the H200 (results/runs/kda-h200: "
                         "three BT=64 candidates, o relative error 0.40-0.49; the CPU interpreter passes it)")
    if knobs.get("solve_warps") in (2, 4) and not (knobs.get("subst") == "rows" and knobs.get("BT") == 32):
        raise ValueError(f"solve_warps={knobs.get('solve_warps')}: a 4-warp solve computed a wrong w on the H200 at BT=64 "
                         "(run 3, relative error 1.25; the CPU interpreter passes it); 2 and 4 warps are allowed only "
                         "with subst='rows' at BT=32 (no substitution loop, [32, 32] tiles on mma.sync: the class of "
                         "the 4-warp BT=32 solve that passed on the H200)")
    # one- and two-warp scans (version 4) only where sm_90 keeps the step in registers: at BT 64
    # they spill 32 B - 11 KB per thread, and one warp with the kv layout 20 - 1300 B at BT 32
    if knobs.get("scan_warps") in (1, 2) and knobs.get("BT") != 32:
        raise ValueError(f"scan_warps={knobs.get('scan_warps')} is served at BT=32 only (at BT=64 the scan step "
                         "spills registers on sm_90: up to 11 KB per thread)")
    if knobs.get("scan_warps") == 1 and knobs.get("scan_layout") != "vk":
        raise ValueError("scan_warps=1 is served with scan_layout='vk' only (kv spills 20-1300 B per thread in "
                         "the scan step on sm_90)")
    # version 5's one-program-per-chunk block rows: [BT, BT] products at every step; sm_90 keeps
    # them in registers at BT 32 with 16- or 32-wide key tiles only
    if knobs.get("block_prog") == "chunk" and (knobs.get("BT") != 32 or knobs.get("BK") == 64
                                               or knobs.get("block_warps") in (1, 2)):
        raise ValueError("block_prog='chunk' is served at BT=32 with BK <= 32 and 4 or 8 block warps only (BT=64 "
                         "spills 0.5-4.7 KB, BK=64 280 B and 2 warps 348 B per thread on sm_90; 1 warp not tried)")
    # version 6's fused preparation (block rows, then the solve, in one program per chunk): served
    # only in the configuration class the H200 ran right as two launches (BT 32, subst "rows",
    # 4 warps: the 4-warp solve is known wrong at BT 64; 2 / 8 warps hold 242-246 registers in
    # the block rows, so one program per SM).  Run 1/3's fused preparation (BT 64, 8 warps) was slow
    if knobs.get("fuse_prep") and (knobs.get("BT") != 32 or knobs.get("subst") != "rows"
                                   or knobs.get("block_prog") != "row" or knobs.get("block_warps") != 4):
        raise ValueError("fuse_prep=True is served at BT=32 with subst='rows', block_prog='row' and 4 block warps "
                         "only (the fused program runs the solve at block_warps; a 4-warp solve is wrong on the "
                         "H200 at BT=64, and 2 or 8 warps leave one program per SM)")
    # version 8's pipelined solve: everywhere it compiles without a heavy spill on sm_90 (at most
    # 40 B per thread, 22-35 KB of shared memory at BT 32, 64-80 KB at BT 64); not where the solve
    # already spills 336-376 B per thread at 128 registers (BT 64): the prefetched tiles would
    # land in shared memory only to be spilled again on their way through registers
    if knobs.get("solve_stages") in (2, 3) and knobs.get("BT") == 64 and knobs.get("solve_maxnreg") != 0:
        raise ValueError(f"solve_stages={knobs.get('solve_stages')} is not served at BT=64 with solve_maxnreg="
                         f"{knobs.get('solve_maxnreg')} "
                         "(the solve spills 336-376 B per thread there on sm_90 at every stage count; pipelining "
                         "adds 16-32 KB of shared memory on top)")
    # session 13's kd_sum "rows": only _block_row writes the sums, and on gates floored as the solve's (at -30)
    if knobs.get("kd_sum") == "rows" and (knobs.get("block_prog") != "row" or knobs.get("diag_floor") != 30):
        raise ValueError("kd_sum='rows' is served with block_prog='row' and diag_floor=30 only (the block rows "
                         "write the solve's running sums; their gates must be floored as the solve's, at -30)")
    # session 14's scan_overlap: the solve flags chunks for the warp-specialised scan only, as its own launch
    if knobs.get("scan_overlap") in ("pdl", "auto") and (knobs.get("fuse_prep") or knobs.get("scan_engine") != "wgmma_ws"):
        raise ValueError(f"scan_overlap={knobs.get('scan_overlap')!r} is served with fuse_prep=False and "
                         "scan_engine='wgmma_ws' only (the solve must be its own launch, and only the warp-specialised "
                         "scan's loader waits for it)")
    # session 15's Gluon block rows implement one configuration of the Triton rows: what the solve reads from them
    # (subst "rows", kd_sum "rows" and so diag_floor 30), their guard (recentre "midpoint") and their products
    if knobs.get("rows_engine") in ("gluon", "gluon8") and (
            knobs.get("BT") != 32 or knobs.get("fuse_prep") or knobs.get("subst") != "rows" or knobs.get("kd_sum") != "rows"
            or knobs.get("recentre") != "midpoint" or knobs.get("inv_dot") != "bf16x3" or knobs.get("prec") != "tf32"):
        raise ValueError(f"rows_engine={knobs.get('rows_engine')!r} is served at BT=32 with fuse_prep=False, "
                         "subst='rows', kd_sum='rows', recentre='midpoint', inv_dot='bf16x3' and prec='tf32' only (the "
                         "Gluon block rows write what the Triton rows write in that configuration)")
    if knobs.get("rows_fold") and knobs.get("rows_engine") not in ("gluon", "gluon8"):
        raise ValueError("rows_fold=True is served with rows_engine 'gluon' or 'gluon8' only (it changes the Gluon "
                         "rows' products; the Triton rows have no such product)")
    if knobs.get("rows_solve") and (knobs.get("rows_engine") not in ("gluon", "gluon8") or knobs.get("readout") != "pre"
                                    or knobs.get("u_store") != "bf16" or knobs.get("au") != "bf16"):
        raise ValueError(f"rows_solve={knobs.get('rows_solve')!r} is served with rows_engine 'gluon' or 'gluon8', readout 'pre', u_store 'bf16' "
                         "and au 'bf16' only (the Gluon rows' solve writes the wgmma scan's inputs in that form)")
    if knobs.get("solve_mma") in ("wgmma", "wgmma_st") and (knobs.get("rows_engine") != "gluon" or knobs.get("rows_fold")):
        raise ValueError(f"solve_mma={knobs.get('solve_mma')!r} is served with rows_engine 'gluon' and rows_fold False only (one "
                         "warpgroup holds the stacked products' rows; it takes the rows' products unextracted)")
    for name, choices in SPACE.items():
        if knobs.get(name) not in choices:
            raise ValueError(f"knob {name}={knobs.get(name)!r} is not one of {choices}")
    BT, BC, BK, BV = knobs["BT"], knobs["BC"], knobs["BK"], knobs["BV"]
    if BK == "auto":
        BK = 16 if K >= 128 else 32
    if BC > BT:
        raise ValueError(f"sub-chunk BC={BC} must not exceed the chunk BT={BT}")
    if knobs["off_tile"] == "tight" and (knobs["block_prog"] != "row" or not _pow2(BT - BC)):
        raise ValueError(f"off_tile='tight' is served with block_prog='row' and BT - BC a power of two (a tl.arange "
                         f"width) only; BT={BT}, BC={BC} gives {BT - BC}")
    if not (_pow2(K) and _pow2(V) and 16 <= K <= 256 and 16 <= V <= 256):
        raise ValueError(f"K={K} and V={V} must be powers of two in [16, 256] (tl.dot tiles)")
    bk = min(BK, K)
    bv = min(BV, V)
    pair_elems = 512 * knobs["block_warps"] if knobs["pair_elems"] == "auto" else knobs["pair_elems"]
    limit = _GUARD_LIMIT[knobs["recentre"]] if knobs["diag"] == "guarded" else -1.0
    fuse = bool(knobs["fuse_output"])
    split = knobs["scan_dot"] == "split"
    # shared memory one pipeline stage of the scan holds (operand tiles it loads per chunk)
    pre = knobs["readout"] == "pre"
    per_stage = (BT * K * 2 * (3 if fuse else 2) + BT * bv * (2 if knobs["u_store"] == "bf16" else 4) + K * 4
                 + (0 if not fuse else BT * bv * 4 if pre else BT * BT * 4))
    # layout kv stages the state and delta (right-hand operands) through shared memory each step
    scratch = K * bv * 4 + BT * bv * 8 if knobs["scan_layout"] == "kv" else 0
    stages = knobs["scan_stages"]
    while stages > 1 and stages * per_stage + scratch > _SCAN_SMEM_BUDGET:
        stages -= 1
    return {
        # the solve's key and value tiles: as wide as the WY matrix's own products (64), so that
        # every product with A takes it in one register layout (a 4-warp solve with 32-wide key
        # tiles converted A between two wgmma layouts and computed a wrong w on the H200)
        "BT": BT, "BC": BC, "BK": bk, "BV": bv, "BKP": min(64, K), "BVP": min(64, V),
        "DK": max(1, min(bk, 2048 // (BC * BC))),
        "CHUNK": knobs["block_prog"] == "chunk",
        # pair "split" (version 7): the fallback's pairwise part on SB x SB sub-blocks only, with
        # its channel step widened to keep [BC/SB, SB, SB, DKS] at 2048 elements
        "SB": BC if knobs["pair"] == "full" else min(_SPLIT_SB, BC),
        "LOG_NS": 0 if knobs["pair"] == "full" else int(math.log2(BC // min(_SPLIT_SB, BC))),
        "DKS": max(1, min(bk, pair_elems // (BC * min(_SPLIT_SB, BC)))),
        "OFFW": BT - BC if knobs["off_tile"] == "tight" else BT,
        "DIAG_TRANS": knobs["diag_cols"] == "trans",
        "FLOOR": -float(knobs["diag_floor"]),
        "KD_SUM": {"reversed": 0, "f64": 1, "f32": 2, "rows": 3}[knobs["kd_sum"]],
        "INV": {"ieee": 0, "bf16x3": 1}[knobs["inv_dot"]],
        "PREFETCH": bool(knobs["row_prefetch"]),
        "OVERLAP": knobs["scan_overlap"] != "off",
        # Gluon block rows: warpgroups per program (0: the Triton rows); K 256 needs two (8 warps of 32 channels)
        "ROWS_WG": 0 if knobs["rows_engine"] == "triton" else max(2 if knobs["rows_engine"] == "gluon8" else 1, K // 128),
        # their register cap: block_maxnreg, with "auto" 168 at 4 warps and 128 at 8 (sm_90, K 128: 246 and 157
        # registers uncapped, so two programs per SM and one; at the cap three and two, spilling a little), none at
        # K 256 (8 warps of 32 rows each: 1.1 KB spilled at 128)
        # rows_fold: at K >= 64 (the [2 BT, 2 BT] result is read back through the operand buffer's first 16 KB)
        "ROWS_FOLD": bool(knobs["rows_fold"]) and K >= 64,
        "ROWS_SOLVE": knobs["rows_solve"] if knobs["rows_solve"] == "auto" else bool(knobs["rows_solve"]),
        "SOLVE_WG": knobs["solve_mma"] in ("wgmma", "wgmma_st"),
        "SOLVE_ST": knobs["solve_mma"] == "wgmma_st",
        "ROWS_MAXNREG": (0 if knobs["rows_engine"] == "triton" or K > 128 or (knobs["block_maxnreg"] == "uncap_k128" and K >= 128)
                         else 168 if knobs["rows_engine"] == "gluon" else 128)
                        if knobs["block_maxnreg"] in ("auto", "uncap_k128") else knobs["block_maxnreg"],
        # the block rows' register cap (0: none); "auto": 168 with 16-wide key tiles, else none
        "BLOCK_MAXNREG": (168 if bk == 16 else 0) if knobs["block_maxnreg"] in ("auto", "uncap_k128") else knobs["block_maxnreg"],
        "OUT_BV": min(V, knobs["out_bv"] or BV),
        "LOG_NC": int(math.log2(BT // BC)),
        "RECENTRE": _RECENTRE_CODE[knobs["recentre"]], "LIMIT": limit,
        "MERGE": 0 if knobs["merge"] == "fma" else 1,
        "TF32": knobs["prec"] == "tf32", "PRE": knobs["readout"] == "pre",
        "SUBST": {"extract": 0, "direct": 1, "rows": 2}[knobs["subst"]],
        "LOG_BC": int(math.log2(BC)),
        # subst "rows" at BT 32: the solve issues beta and Aqk with the inverses (HOIST 1), and
        # at 8 warps each key tile's reversed-row loads with its forward ones (HOIST 2: 112 regs, no
        # spill).  Not at 4 warps (100 B spilled at maxnreg 128; a spilled load waits anyway) nor
        # at BT 64 (504 B instead of 364 B spilled)
        # (the fused preparation runs its solve at block_warps)
        "HOIST": 0 if knobs["subst"] != "rows" or BT != 32 else
                 2 if (knobs["block_warps"] if knobs["fuse_prep"] else knobs["solve_warps"]) == 8 else 1,
        "fuse": fuse, "split": split, "scan_stages": stages,
        "solve_stages": knobs["solve_stages"], "u_bf16": knobs["u_store"] == "bf16",
        "layout": 0 if knobs["scan_layout"] == "kv" else 1,
    }


def _wgmma_scan_applies(q, K, V, plan, kn) -> bool:
    """Where scan_engine "wgmma" (and "wgmma_ws") runs: wgmma and TMA (Hopper), and the scan form it implements -- readout
    "pre" (o = qd' S + au), the state rounded to bf16 in its products, u and au stored bf16 (TMA tiles);
    K 32/64/128 (the state and its bf16 copy in one warpgroup's registers), V a multiple of 64 (the M of
    its products), BT 32 (at BT 64 it spills on sm_90 and its ring outgrows shared memory). Elsewhere,
    including always on the CPU, the Triton scan of the other knobs runs."""
    return (q.is_cuda and torch.cuda.get_device_capability(q.device)[0] == 9 and plan["PRE"] and not plan["split"]
            and plan["u_bf16"] and kn["au"] == "bf16" and K in (32, 64, 128) and V % WGMMA_BV == 0
            and plan["BT"] == 32)


def _gluon_rows_apply(q, k, g, beta, K: int, plan: dict) -> bool:
    """Where rows_engine "gluon" runs: a Hopper GPU (wgmma, TMA), K 32-256 (one key channel per lane of a warp, at
    most 8 warps), q and k in bf16 and g in float32 (the dtypes its TMA boxes hold), strides TMA can take (16-byte
    multiples). Elsewhere, including always on the CPU, the Triton block rows of the same knobs run."""
    if not (plan["ROWS_WG"] > 0 and q.is_cuda and torch.cuda.get_device_capability(q.device)[0] == 9 and 32 <= K <= 256):
        return False
    if q.dtype != torch.bfloat16 or k.dtype != torch.bfloat16 or g.dtype != torch.float32:
        return False
    return all(_tma_ok(x) for x in (q, k, g))


def _tma_ok(x) -> bool:
    """Whether a TMA descriptor can take x: 16-byte aligned, every stride but the last a 16-byte multiple."""
    return x.data_ptr() % 16 == 0 and all(st * x.element_size() % 16 == 0 for st in x.stride()[:-1])


def _gluon_rows_launch(q, k, g, beta, aqk, akk, g_sums, g_tots, scale, T, TP, NT, H, K, plan, solve=None,
                       flags=None, pdl=False, warmup=False):
    """_kda_rows_gluon on grid (chunks, batch * heads): WG warpgroups, each channel over BT / WR rows per thread;
    q, k, g read and the running sums written through TMA descriptors. solve (rows_solve): (v, w, kd, qd, u, au,
    g_last), the scan's inputs the program writes instead; flags: one per chunk, set once it is written (grid
    (batch * heads, chunks)), for a scan launched before it with pdl. warmup: compile and load only."""
    BH = aqk.shape[1]
    BT = plan["BT"]
    wg = plan["ROWS_WG"]

    def box(x, bits, width=K):
        return GluonDescriptor(x, list(x.shape), list(x.stride()), [1, BT, 1, width],
                               gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=4))

    sums = g_sums.view(BH * TP, K)
    gs_desc = GluonDescriptor(sums, [BH * TP, K], [K, 1], [BT, K],
                              gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))
    args = (box(q, 16), box(k, 16), box(g, 32), gs_desc, g, beta, aqk, akk, g_tots, float(scale), T, TP, NT, H,
            BH * TP * BT, g.stride(0), g.stride(1), g.stride(2), beta.stride(0), beta.stride(1), beta.stride(2))
    meta = dict(K=K, BT=BT, FLOOR=plan["FLOOR"], LIMIT=min(plan["LIMIT"], _FOLD_LIMIT) if plan["ROWS_FOLD"] else plan["LIMIT"],
                WR=4 * wg * 32 // K, WG=wg, FOLD=plan["ROWS_FOLD"], num_warps=4 * wg,
                **({"maxnreg": plan["ROWS_MAXNREG"]} if plan["ROWS_MAXNREG"] else {}))
    grid = (NT, BH)
    if solve is not None:
        v, w, kd, qd, u, au, g_last = solve
        # by name: they follow the constexprs in the kernel's signature
        meta.update(v_ptr=v, s_vb=v.stride(0), s_vt=v.stride(1), s_vh=v.stride(2), w_ptr=w, kd_ptr=kd, qd_ptr=qd,
                    u_ptr=u, au_ptr=au, gl_ptr=g_last, flag_ptr=flags if flags is not None else g_last,
                    V=v.shape[-1], SOLVE=True, FLAG=flags is not None, launch_pdl=pdl)
        if plan["SOLVE_WG"] and v.dtype == torch.bfloat16 and _tma_ok(v):  # else the mma_v2 solve, which loads v
            # swizzled: the products read v's tile from shared memory as it lands (an unswizzled value-major
            # operand has no wgmma layout)
            meta.update(v_desc=GluonDescriptor(v, list(v.shape), list(v.stride()), [1, BT, 1, v.shape[-1]],
                                               gl.NVMMASharedLayout.get_default_for([1, BT, 1, v.shape[-1]],
                                                                                    gl.bfloat16)), WGS=plan["SOLVE_WG"],
                        WST=plan["SOLVE_ST"])
        if flags is not None:
            grid = (BH, NT)
    if warmup:
        return _kda_rows_gluon.warmup(*args, grid=grid, **meta)
    _kda_rows_gluon[grid](*args, **meta)


def _wgmma_scan_bv(scan_bv, BH: int, V: int, sm_count: int) -> int:
    """The value columns per program of the "wgmma" engines: 128 (two compute warpgroups) where asked for, or
    with "auto" where 64 would need more programs than the GPU has SMs (one program per SM: its ring fills the
    shared memory); 64 where V is not a multiple of 128."""
    if V % 128 != 0:
        return WGMMA_BV
    if scan_bv == "auto":
        return 128 if BH * (V // WGMMA_BV) > sm_count else WGMMA_BV
    return int(scan_bv)


def _wgmma_scan_ring(ring: int, K: int, BT: int, BV: int) -> int:
    """The ring's depth, lowered until the program's shared memory fits sm_90's 227 KB (BV 128 at K 128: 4)."""
    def smem(ns):
        return ns * (4 * BT * K * 2 + 2 * BT * BV * 2 + K * 4) + 2 * BT * BV * 2 + 1024
    while ring > 2 and smem(ring) > 232448:
        ring -= 1
    return ring


def _wgmma_scan_launch(wkq, ua, g_last, h0, final, o, T, TP, NT, H, K, V, BT, ring, warp_specialised, BV=WGMMA_BV,
                       flags=None):
    """wkq: w, kd, qd as one [3, BH, TP, K] bf16 buffer; ua: u, au as one [2, BH, TP, V] (one TMA copy each).
    BV: value columns per program (64 or 128: one or two compute warpgroups). flags (warp-specialised only): the
    solve's per-chunk flags [BH * NT] int32, for a scan launched before the solve (scan_overlap "pdl")."""
    BH = wkq.shape[1]
    B = BH // H
    ring = _wgmma_scan_ring(ring, K, BT, BV)

    def desc(t, width, block_w):
        flat = t.view(t.shape[0], BH * TP, width)
        block = [triton.next_power_of_2(t.shape[0]), BT, block_w]
        return GluonDescriptor(flat, list(flat.shape), [BH * TP * width, width, 1], block,
                               gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16))

    g_flat = g_last.view(BH * NT, K)
    g_desc = GluonDescriptor(g_flat, list(g_flat.shape), [K, 1], [1, K],
                             gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))
    # o [B, T, H, V] (contiguous: kda_chunked made it) as [B, T, H * V]: a tile never runs past its batch's T
    o3 = o.view(B, T, H * V)
    o_desc = GluonDescriptor(o3, list(o3.shape), [T * H * V, H * V, 1], [1, BT, BV],
                             gl.NVMMASharedLayout.get_default_for([1, BT, BV], gl.bfloat16))
    args = (desc(wkq, K, K), desc(ua, V, BV), g_desc, o_desc,
            h0 if h0 is not None else g_last, final if final is not None else g_last, TP, NT, H)
    meta = dict(K=K, V=V, BT=BT, BV=BV, NS=ring, USE_H0=h0 is not None, STORE_HT=final is not None, num_warps=BV // 16)
    if warp_specialised:
        _kda_scan_wgmma_ws[(V // BV, BH)](*args, flags if flags is not None else g_last, WAIT=flags is not None, **meta)
    else:
        _kda_scan_wgmma[(V // BV, BH)](*args, **meta)


def _scan_beside_solve(wgmma: bool, kn: dict, scan_programs: int, sm_count: int) -> bool:
    """scan_overlap: whether the scan is launched before the solve and runs beside it. Only the warp-specialised
    Gluon scan waits for the solve's flags, and only when all its programs fit on the GPU at once (one per SM: its
    ring fills the shared memory) with SMs left for the solve: the solve may launch only once every scan program
    runs, and a scan program waiting for an SM would wait for the solve forever. "pdl": wherever that holds (16 SMs
    to spare); "auto": only where the scan has at most a quarter as many programs as the GPU has SMs, where its
    chain of chunk steps, not the solve, is the longer stage (H200, session 14, "pdl": -12 % at B1 T8192 H16, 32
    programs; level at B2 T16384 H16, 64; +5 % at B8 T1024 H8 K 64, 64 programs, where the solve takes twice the
    scan's time)."""
    if not (wgmma and kn["scan_engine"] == "wgmma_ws"):
        return False
    if kn["scan_overlap"] == "auto":
        return scan_programs <= sm_count // 4
    return kn["scan_overlap"] == "pdl" and scan_programs <= sm_count - 16


def kernel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
    """KDA forward. q, k, g [B,T,H,K]; v [B,T,H,V]; beta [B,T,H]; returns (o, final_state)."""
    return kda_chunked(q, k, v, g, beta, scale, initial_state, output_final_state, KNOBS)


def kda_chunked(q, k, v, g, beta, scale, initial_state, output_final_state, knobs, debug=None):
    """``kernel`` with the knobs given explicitly (a dict shaped like KNOBS).  A dict passed as
    ``debug`` receives the intermediates (w, u, kd, qd, aqk, akk, gl) for inspection."""
    kn = dict(knobs)
    B, T, H, K = q.shape
    V = v.shape[-1]
    if tuple(k.shape) != (B, T, H, K) or tuple(g.shape) != (B, T, H, K):
        raise ValueError("q, k and g must share the shape [B, T, H, K]")
    if tuple(v.shape[:3]) != (B, T, H) or tuple(beta.shape) != (B, T, H):
        raise ValueError("v must be [B, T, H, V] and beta [B, T, H]")
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous along its last dimension")
    plan = _plan(K, V, kn)
    if scale is None:
        scale = K ** -0.5
    BT = plan["BT"]
    NT = max(1, triton.cdiv(T, BT))
    TP = NT * BT
    BH = B * H
    dev = q.device

    o = torch.empty((B, T, H, V), dtype=v.dtype, device=dev)
    final = torch.empty((B, H, K, V), dtype=torch.float32, device=dev) if output_final_state else None
    h0 = None
    if initial_state is not None:
        if tuple(initial_state.shape) != (B, H, K, V) or not initial_state.is_contiguous():
            raise ValueError(f"initial_state must be a contiguous [B, H, K, V] = {(B, H, K, V)} tensor")
        h0 = initial_state
    if T == 0:
        if final is not None:
            raise ValueError("T must be positive")
        return o, final

    wgmma = kn.get("scan_engine") in ("wgmma", "wgmma_ws") and _wgmma_scan_applies(q, K, V, plan, kn)
    # scan_engine "wgmma": w, kd, qd (and u, au) as slices of one buffer, each fetched by one TMA copy
    wkq = torch.empty((3, BH, TP, K), dtype=torch.bfloat16, device=dev) if wgmma else None
    ua = torch.empty((2, BH, TP, V), dtype=torch.bfloat16, device=dev) if wgmma else None
    if wgmma:
        w, kd, qd = wkq[0], wkq[1], wkq[2]
    else:
        w = torch.empty((BH, TP, K), dtype=torch.bfloat16, device=dev)
        kd = torch.empty_like(w)
        qd = torch.empty_like(w)
    # u_store="bf16" (version 8): u in bf16, half the bytes of its write here and its read in the scan
    u = ua[0] if wgmma else torch.empty((BH, TP, V), dtype=torch.bfloat16 if plan["u_bf16"] else torch.float32, device=dev)
    aqk = torch.empty((2, BH, TP, BT), dtype=torch.bfloat16, device=dev)  # Aqk as bf16 hi, lo
    akk = torch.empty((BH, TP, BT), dtype=torch.float32, device=dev)
    g_last = torch.empty((BH, NT, K), dtype=torch.float32, device=dev)  # exp(G_last) per chunk
    # Aqk u (readout "pre"); au="bf16" (version 6) halves its write in the solve and its read in the
    # read-out, at one more bf16 rounding of o's intra-chunk part
    au_dtype = torch.bfloat16 if kn["au"] == "bf16" else torch.float32
    au = ua[1] if wgmma else torch.empty((BH, TP, V), dtype=au_dtype, device=dev) if plan["PRE"] else u
    # kd_sum "rows": the block rows' running sums of the floored gates and each block's totals, read by the solve
    gsum = plan["KD_SUM"] == 3
    g_sums = torch.empty((BH, TP, K), dtype=torch.float32, device=dev) if gsum else akk
    g_tots = torch.empty((BH, NT, BT // plan["BC"], K), dtype=torch.float32, device=dev) if gsum else akk
    scan_bv = WGMMA_BV
    beside = False  # scan_overlap: the scan launched first, the solve beside it
    if wgmma:
        sm_count = torch.cuda.get_device_properties(dev).multi_processor_count
        scan_bv = _wgmma_scan_bv(kn.get("scan_bv", 64), BH, V, sm_count)
        beside = _scan_beside_solve(wgmma, kn, BH * (V // scan_bv), sm_count)
    # one flag per (batch*head, chunk), set by the solve once that chunk's tiles are stored: where a scan waits for
    # them, and on the CPU (nothing waits there; the interpreter tests the solve's side of the hand-over)
    flag_solve = beside or (plan["OVERLAP"] and not q.is_cuda)
    flags = torch.zeros((BH * NT,), dtype=torch.int32, device=dev) if flag_solve else akk

    try:
        prep_args = (
            q, k, v, g, beta,
            w, u, kd, qd, aqk, akk, g_last, au, g_sums, g_tots, flags,
            float(scale), T, TP, NT, H, BH * TP * BT,
            q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            g.stride(0), g.stride(1), g.stride(2),
            beta.stride(0), beta.stride(1), beta.stride(2),
        )
        prep_meta = dict(
            K=K, V=V, BT=BT, BC=plan["BC"], BK=plan["BK"], BKP=plan["BKP"], BVP=plan["BVP"], DK=plan["DK"],
            LOG_NC=plan["LOG_NC"], RECENTRE=plan["RECENTRE"], LIMIT=plan["LIMIT"], MERGE=plan["MERGE"],
            TF32=plan["TF32"], PRE=plan["PRE"], SUBST=plan["SUBST"], LOG_BC=plan["LOG_BC"], HOIST=plan["HOIST"],
            CHUNK=plan["CHUNK"], SB=plan["SB"], LOG_NS=plan["LOG_NS"], DKS=plan["DKS"], OFFW=plan["OFFW"],
            DIAG_TRANS=plan["DIAG_TRANS"], FLOOR=plan["FLOOR"], KD_SUM=plan["KD_SUM"], INV=plan["INV"],
            PREFETCH=plan["PREFETCH"],
        )
        # block_maxnreg / solve_maxnreg: cap the registers per thread (ptxas spills the rest to
        # L1-backed local memory) so that more programs are resident: at 128, 4 block-row
        # programs (4 warps) or 2 solve programs (8 warps) per SM instead of 3 and 1
        block_regs = {"maxnreg": plan["BLOCK_MAXNREG"]} if plan["BLOCK_MAXNREG"] else {}
        solve_regs = {"maxnreg": kn["solve_maxnreg"]} if kn["solve_maxnreg"] else {}
        if debug is not None:
            debug.update(w=w, u=u, kd=kd, qd=qd, aqk=aqk, akk=akk, gl=g_last, BT=BT, NT=NT, TP=TP,
                         pre=plan["PRE"], au=au if plan["PRE"] else None, flags=flags if flag_solve else None,
                         scan_beside_solve=beside, gs=g_sums if gsum else None, gt=g_tots if gsum else None)
        if kn["fuse_prep"]:
            _kda_prep_kernel[(NT, BH)](*prep_args, STAGE=0, num_warps=kn["block_warps"], num_stages=plan["solve_stages"],
                                       **block_regs, **prep_meta)
        else:
            fused = plan["ROWS_SOLVE"] is True or (plan["ROWS_SOLVE"] == "auto" and (beside or K <= 64))
            if wgmma and fused and _gluon_rows_apply(q, k, g, beta, K, plan):
                # rows_solve: one Gluon program per chunk writes the scan's inputs; beside the scan as the solve is
                # (compiled and loaded first, for the same reason)
                solve = (v, w, kd, qd, u, au, g_last)
                rows_args = (q, k, g, beta, aqk, akk, g_sums, g_tots, scale, T, TP, NT, H, K, plan, solve)
                if beside:
                    if _gluon_rows_launch(*rows_args, flags=flags, pdl=True, warmup=True).run is None:
                        raise RuntimeError("the fused preparation's kernel did not load")
                    _wgmma_scan_launch(wkq, ua, g_last, h0, final, o, T, TP, NT, H, K, V, BT, kn.get("scan_ring", 4),
                                       True, scan_bv, flags=flags)
                    _gluon_rows_launch(*rows_args, flags=flags, pdl=True)
                    return o, final
                _gluon_rows_launch(*rows_args)
                _wgmma_scan_launch(wkq, ua, g_last, h0, final, o, T, TP, NT, H, K, V, BT, kn.get("scan_ring", 4),
                                   kn["scan_engine"] == "wgmma_ws", scan_bv)
                return o, final
            if _gluon_rows_apply(q, k, g, beta, K, plan):
                _gluon_rows_launch(q, k, g, beta, aqk, akk, g_sums, g_tots, scale, T, TP, NT, H, K, plan)
            else:
                rows_grid = NT if plan["CHUNK"] else NT * (BT // plan["BC"])
                # the block rows stay at num_stages 1: their loads feed no product directly, and sm_90's
                # SASS is identical at 2 and 3 (version 8, offline compile); solve_stages pipelines the solve
                _kda_prep_kernel[(rows_grid, BH)](*prep_args, STAGE=1, num_warps=kn["block_warps"], num_stages=1,
                                                  **block_regs, **prep_meta)
            if beside:
                # scan_overlap "pdl": the scan first (its programs let the solve launch at once and wait for each
                # chunk's flag), then the solve as its programmatic dependent, on the SMs the scan leaves. The solve
                # is compiled and loaded onto the GPU before the scan starts: a first call's compile (seconds, on the
                # host) would keep the scan spinning until it gives up, and CUDA's lazy loading of a kernel at its
                # first launch waits for the running scan, which waits for the solve (H200, session 14: "unspecified
                # launch failure" from the scan's trap). The compiled kernel's launcher property loads it.
                solve_meta = dict(STAGE=2, FLAG=True, launch_pdl=True, num_warps=kn["solve_warps"],
                                  num_stages=plan["solve_stages"], **solve_regs, **prep_meta)
                if _kda_prep_kernel.warmup(*prep_args, grid=(BH, NT), **solve_meta).run is None:
                    raise RuntimeError("the solve's kernel did not load")
                _wgmma_scan_launch(wkq, ua, g_last, h0, final, o, T, TP, NT, H, K, V, BT, kn.get("scan_ring", 4),
                                   True, scan_bv, flags=flags)
                _kda_prep_kernel[(BH, NT)](*prep_args, **solve_meta)
                return o, final
            solve_grid = (BH, NT) if flag_solve else (NT, BH)
            _kda_prep_kernel[solve_grid](*prep_args, STAGE=2, FLAG=flag_solve, num_warps=kn["solve_warps"],
                                         num_stages=plan["solve_stages"], **solve_regs, **prep_meta)
        if wgmma:
            _wgmma_scan_launch(wkq, ua, g_last, h0, final, o, T, TP, NT, H, K, V, BT, kn.get("scan_ring", 4),
                               kn["scan_engine"] == "wgmma_ws", scan_bv)
            return o, final
        fuse = plan["fuse"]
        if fuse:
            hbuf, dbuf = o, o  # unused
        else:
            # the state entering every chunk: bf16 when its products are bf16 anyway
            hbuf = torch.empty((BH, NT, K, V), dtype=torch.float32 if plan["split"] else torch.bfloat16, device=dev)
            dbuf = o if plan["PRE"] else torch.empty((BH, TP, V), dtype=torch.float32, device=dev)
        BV = plan["BV"]
        _kda_scan_kernel[(triton.cdiv(V, BV), BH)](
            w, u, kd, qd, aqk, g_last, au,
            h0 if h0 is not None else w, final if final is not None else w, o, hbuf, dbuf,
            T, TP, NT, H, BH * TP * BT,
            o.stride(0), o.stride(1), o.stride(2),
            K=K, V=V, BT=BT, BV=BV,
            LAYOUT=plan["layout"], FUSE_OUT=fuse, SPLIT_S=plan["split"],
            USE_H0=h0 is not None, STORE_HT=final is not None, PRE=plan["PRE"],
            num_warps=kn["scan_warps"], num_stages=plan["scan_stages"],
        )
        if not fuse:
            OBV = plan["OUT_BV"]
            _kda_out_kernel[(NT, triton.cdiv(V, OBV), BH)](
                qd, aqk, hbuf, dbuf, o, au,
                T, TP, NT, H, BH * TP * BT,
                o.stride(0), o.stride(1), o.stride(2),
                K=K, V=V, BT=BT, BV=OBV, SPLIT_S=plan["split"], PRE=plan["PRE"],
                num_warps=kn["out_warps"], num_stages=2,
            )
    except Exception as err:
        # Triton's OutOfResources (shared memory or registers) named without importing its module
        if type(err).__name__ == "OutOfResources":
            raise ValueError(f"knobs {kn} do not fit this GPU at K={K}, V={V}: {err}") from err
        raise
    return o, final
