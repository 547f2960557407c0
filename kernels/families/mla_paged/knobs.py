"""The knobs and their choices (the package docstring says what each does), CONFIG "auto"'s regimes, and the
constants the kernels and the host share."""

# kopt:knobs-begin
KNOBS = {"CONFIG": "auto", "BLOCK_H": 64, "BLOCK_N": 64, "KEYS_AS_M": False, "VALUES_AS_M": False, "QK_SPLIT": True, "num_warps": 8, "num_stages": 2, "KV_LOAD": "tma", "OVERHEAD": 5, "WAVES": 1, "MERGE": "auto", "PARTIAL_DTYPE": "float32", "PDL": 1, "LAUNCH": "direct", "ENGINE": "triton", "TMA_DESC": "host", "GRID_MERGE": 0, "GLUON_PDL": 0, "PAIR": 0, "MERGE_ROWS": 0}
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
LN2 = 0.6931471805599453
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
