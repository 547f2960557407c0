"""The dense cache as pages, then mla_paged's plan and launches."""

import torch

from .host import plan_for, plan_key, run_plan
from .knobs import D_NOPE, D_ROPE, PLANS_KEPT

_DENSE = {}  # (q, kv) key -> (plan, page size, block table, lengths, their addresses), oldest first


def _check(q, kv):
    if kv.dim() != 3 or kv.shape[-1] != D_NOPE + D_ROPE or kv.shape[1] < 1:
        raise ValueError(f"kv must be [B, Skv >= 1, {D_NOPE + D_ROPE}], got {tuple(kv.shape)}")
    if q.dim() != 4 or q.shape[0] != kv.shape[0]:
        raise ValueError(f"q must be [B={kv.shape[0]}, Sq, H, {D_NOPE + D_ROPE}] for kv {tuple(kv.shape)}, got {tuple(q.shape)}")
    if q.shape[1] > kv.shape[1]:
        raise ValueError(f"need Sq <= Skv (the new tokens are the cache's last), got Sq={q.shape[1]}, Skv={kv.shape[1]}")


def _as_pages(q, kv, ptrs):
    """The entry of a dense (q, kv): 64-token pages in order where kv is contiguous and Skv a multiple of 64, else one
    page a sequence; the block table and lengths that say so (they depend on the shape alone); mla_paged's plan for
    them."""
    _check(q, kv)
    B, Skv = kv.shape[0], kv.shape[1]
    page = 64 if Skv % 64 == 0 and kv.is_contiguous() else Skv
    table = torch.arange(B * (Skv // page), dtype=torch.int32, device=kv.device).view(B, Skv // page)
    lengths = torch.full((B,), Skv, dtype=torch.int32, device=kv.device)
    pages = kv if page == Skv else kv.view(-1, page, kv.shape[2])
    ptrs = (ptrs[0], ptrs[1], table.data_ptr(), lengths.data_ptr())
    plan = plan_for(q, pages, table, lengths, plan_key(q, pages, table, lengths, ptrs))
    return plan, page, table, lengths, ptrs[2:]


def kernel(q, kv, scale):
    """The entry of (q, kv)'s key (made once per key, the oldest dropped past PLANS_KEPT), then ``run_plan`` with the
    cache as pages: once the plan's kernels are compiled, kv itself (only its address is read), else a view."""
    ptrs = (q.data_ptr(), kv.data_ptr())
    key = (q.shape, q.stride(), q.dtype, q.device, kv.shape, kv.stride(), kv.dtype, kv.device, (ptrs[0] | ptrs[1]) % 16 == 0)
    entry = _DENSE.get(key)
    if entry is None:
        entry = _as_pages(q, kv, ptrs)
        while len(_DENSE) >= PLANS_KEPT:
            _DENSE.pop(next(iter(_DENSE)))
        _DENSE[key] = entry
    plan, page, table, lengths, table_ptrs = entry
    pages = kv if page == kv.shape[1] or plan["compiled"] is not None and key[-1] else kv.view(-1, page, kv.shape[2])
    return run_plan(plan, q, pages, table, lengths, scale, (*ptrs, *table_ptrs))
