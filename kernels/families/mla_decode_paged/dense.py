"""The dense cache as pages, then mla_paged's ``paged_attention``."""

import torch

from .host import paged_attention
from .knobs import D_NOPE, D_ROPE

_PAGES = {}


def _as_pages(kv):
    """(page size, block table [B, pages a sequence] int32, lengths [B] int32) for a dense kv, made once per
    (B, Skv, page size, device): 64-token pages in order where kv is contiguous and Skv a multiple of 64, else one
    page a sequence."""
    B, Skv = kv.shape[0], kv.shape[1]
    page = 64 if Skv % 64 == 0 and kv.is_contiguous() else Skv
    key = (B, Skv, page, kv.device)
    found = _PAGES.get(key)
    if found is None:
        table = torch.arange(B * (Skv // page), dtype=torch.int32, device=kv.device).view(B, Skv // page)
        lengths = torch.full((B,), Skv, dtype=torch.int32, device=kv.device)
        found = _PAGES[key] = (page, table, lengths)
    return found


def kernel(q, kv, scale):
    if kv.dim() != 3 or kv.shape[-1] != D_NOPE + D_ROPE or kv.shape[1] < 1:
        raise ValueError(f"kv must be [B, Skv >= 1, {D_NOPE + D_ROPE}], got {tuple(kv.shape)}")
    if q.dim() != 4 or q.shape[0] != kv.shape[0]:
        raise ValueError(f"q must be [B={kv.shape[0]}, Sq, H, {D_NOPE + D_ROPE}] for kv {tuple(kv.shape)}, got {tuple(q.shape)}")
    if q.shape[1] > kv.shape[1]:
        raise ValueError(f"need Sq <= Skv (the new tokens are the cache's last), got Sq={q.shape[1]}, Skv={kv.shape[1]}")
    page, table, lengths = _as_pages(kv)
    pages = kv if page == kv.shape[1] else kv.view(-1, page, kv.shape[2])
    return paged_attention(q, pages, table, lengths, scale)
