"""MLA decode / MTP on a dense cache through the paged family's kernels (``mla_paged``: its stages, as they are).

    kernel(q, kv, scale) -> (o, lse)

q [B, Sq, H, 576] (512 latent + 64 rope), kv [B, Skv, 576] (one latent cache shared by all heads: the whole row
is the key, its first 512 columns the value), float ``scale``. Query s sees keys j <= s + Skv - Sq (bottom-right
causal). o [B, Sq, H, 512] in q's dtype, lse [B, H, Sq] float32 (natural log).

A dense cache is a paged one whose pages lie in order: a contiguous kv with Skv a multiple of 64 is B * Skv / 64
pages of 64 tokens (the layout FlashMLA is called with, and the one mla_paged's ENGINE "gluon" was built for);
any other kv is B pages of Skv tokens (the Triton tiles then, through its strides). The block table and the
lengths are made once per shape and device and reused: they depend on the shape alone. Everything else, the knobs
included, is mla_paged's (its package docstring says what each does): the scheduler balanced by tokens, FlashMLA's
packing of equal lengths, the warp-specialised Gluon kernel, the merge.
"""

from ..mla_paged import knobs, tiles, gluon_merge, gluon_ws, gluon_pair, combine, host  # noqa: F401
from . import dense  # noqa: F401
from .dense import kernel  # noqa: F401
