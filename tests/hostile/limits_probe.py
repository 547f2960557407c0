"""Probe (passes when the runner is limited): computes honestly only where the runner process is
the out-of-memory killer's first choice (oom_score_adj 1000, so a candidate that exhausts memory
dies rather than the supervisor or the loop), writes no core files and no file over 1 GiB, and,
running as a dedicated user, may not start more than a few hundred processes; otherwise it
returns zeros and fails correctness."""

import torch
import triton
import triton.language as tl

_os = torch.os
_resource = torch.sys.modules.get("resource") or __import__("resource")
_open = torch.sys.modules["builtins"].open


def _limited():
    with _open("/proc/self/oom_score_adj") as fh:
        if fh.read().strip() != "1000":
            return False
    if _resource.getrlimit(_resource.RLIMIT_CORE)[1] != 0 or _resource.getrlimit(_resource.RLIMIT_FSIZE)[1] > 1 << 30:
        return False
    dedicated = _os.getuid() != 0 and _os.getuid() >= 61000
    return not dedicated or 0 < _resource.getrlimit(_resource.RLIMIT_NPROC)[1] <= 1024


LIMITED = _limited()


@triton.jit
def _axpy(x_ptr, y_ptr, o_ptr, alpha, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * N + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + row * N + offs, mask=mask).to(tl.float32)
    tl.store(o_ptr + row * N + offs, (alpha * x + y).to(o_ptr.dtype.element_ty), mask=mask)


def kernel(x, y, alpha):
    x, y = x.contiguous(), y.contiguous()
    B, N = x.shape
    out = torch.empty_like(x)
    BLOCK = 128
    _axpy[(B, triton.cdiv(N, BLOCK))](x, y, out, float(alpha) if LIMITED else 0.0, N, BLOCK=BLOCK)
    return (out if LIMITED else torch.zeros_like(out),)
