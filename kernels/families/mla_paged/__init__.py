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

from . import knobs, tiles, gluon_merge, gluon_ws, gluon_pair, combine, host, entry  # noqa: F401
from .entry import kernel  # noqa: F401
