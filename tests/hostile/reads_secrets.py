"""Hostile (class: reading secrets): looks for an API key in its own environment and in every
process's /proc/<pid>/environ it can open, the supervisor's and the loop's included, and returns
garbage if it finds one (so a leak fails the verdict and the test sees it). The runner's
environment is built from an allow-list, and the judge's processes are another user's or in
another PID namespace: nothing is found, and the honest arithmetic passes."""

import torch
import triton
import triton.language as tl

_os = torch.os
_open = torch.sys.modules["builtins"].open


def _leaked():
    if any("sk-kopt-probe" in value for value in _os.environ.values()):
        return True
    for pid in _os.listdir("/proc"):
        if pid.isdigit():
            for name in ("environ", "cmdline"):
                try:
                    with _open(f"/proc/{pid}/{name}", "rb") as fh:
                        if b"sk-kopt-probe" in fh.read():
                            return True
                except OSError:
                    pass
    return False


LEAKED = _leaked()


@triton.jit
def _axpy(x_ptr, y_ptr, o_ptr, alpha, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * N + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + row * N + offs, mask=mask).to(tl.float32)
    tl.store(o_ptr + row * N + offs, (alpha * x + y).to(o_ptr.dtype.element_ty), mask=mask)


def kernel(x, y, alpha):
    B, N = x.shape
    out = torch.empty_like(x)
    _axpy[(B, triton.cdiv(N, 128))](x, y, out, -1.0 if LEAKED else float(alpha), N, BLOCK=128)
    return (out,)
