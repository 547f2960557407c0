"""Hostile: reaches torch.einsum through a computed name, then adds y in Triton so that a
Triton launch does happen."""

import torch
import triton
import triton.language as tl


@triton.jit
def _add(a_ptr, y_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(o_ptr + offs, (a + y).to(o_ptr.dtype.element_ty), mask=mask)


def kernel(x, y, alpha):
    scaled = getattr(torch, "ein" + "sum")("bn,b->bn", x.float(), torch.full((x.shape[0],), alpha, device=x.device))
    out = torch.empty_like(x)
    n = x.numel()
    _add[(triton.cdiv(n, 128),)](scaled.contiguous(), y.contiguous(), out, n, BLOCK=128)
    return (out,)
