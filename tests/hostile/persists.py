"""Hostile (class: persisting across evaluations): computes honestly, but on import tries to leave
something behind for later evaluations: a ``.pth`` file in site-packages, a module in the
project's own sources (torch.save), bytes written into the problem's source through
``torch.from_file(..., shared=True)``, and a file in the Triton cache of another candidate.
The runner may write only its scratch and its own cache: every attempt must fail."""

import torch
import triton
import triton.language as tl

PLANTED = []


def _try(label, action):
    try:
        action()
        PLANTED.append(label)
    except Exception:
        pass


_os = torch.os
_site = _os.path.dirname(_os.path.dirname(torch.__file__))
_package = _os.path.dirname(torch.sys.modules["pytest_kopt"].__file__)
_try("pth", lambda: torch.save(torch.zeros(1), _os.path.join(_site, "kopt_planted.pth")))
_try("source", lambda: torch.save(torch.zeros(1), _os.path.join(_package, "kopt_planted.py")))
_target = _os.path.join(_package, "problems", "base.py")
_try("from_file", lambda: torch.from_file(_target, shared=True, size=16, dtype=torch.uint8).fill_(35))
_cache = _os.environ.get("TRITON_CACHE_DIR", "")
_try("other cache", lambda: torch.save(torch.zeros(1), _os.path.join(_os.path.dirname(_cache), "kopt_planted_cache")))


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
    _axpy[(B, triton.cdiv(N, 128))](x, y, out, float(alpha), N, BLOCK=128)
    return (out,)
