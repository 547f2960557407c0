"""The entry point with mla-paged's signature (a family that takes the other stages, as mla_decode_paged does for
the dense cache, brings its own)."""

from .host import paged_attention


def kernel(q, kv_cache, block_table, cache_seqlens, scale):
    """o [B, Sq, H, 512] in q's dtype and lse [B, H, Sq] float32 (the family's docstring says how)."""
    return paged_attention(q, kv_cache, block_table, cache_seqlens, scale)
