"""Hostile (GPU only): launches its kernel on a private stream and returns without making the
caller's stream wait, so a timer on the caller's stream sees almost nothing and the caller may
read the output before it is written. The policy refuses torch.cuda.stream by name; the
runtime check (launch stream != caller's stream) is tested with the policy switched off."""

import torch
import triton
import triton.language as tl

_SIDE = []


@triton.jit
def _axpy(x_ptr, y_ptr, o_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(o_ptr + offs, (alpha * x + y).to(o_ptr.dtype.element_ty), mask=mask)


def kernel(x, y, alpha):
    if not _SIDE:
        _SIDE.append(torch.cuda.Stream(device=x.device))
    side = _SIDE[0]
    out = torch.empty_like(x)
    n = x.numel()
    side.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(side):
        _axpy[(triton.cdiv(n, 1024),)](x, y, out, float(alpha), n, BLOCK=1024)
    return (out,)
