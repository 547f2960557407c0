"""Hostile (class: running while something else is timed): on its first timed call (it reads the
runner's frames: a timed round is the runner's ``do_batch``), starts a daemon that
leaves the runner's process group and session (fork, setsid, fork again) and keeps the CPU busy
for a minute, so that whatever the supervisor times while the runner is stopped (the incumbent's
rounds, the baselines) would run slower and this candidate look faster. Its own arithmetic is
honest. The timed round's group stop misses the daemon; the sweep of the runner's tree after
the round's window finds it re-parented to the supervisor and fails the evaluation."""

import torch
import triton
import triton.language as tl

_os = torch.os
_time = torch.sys.modules["time"]


def _spin_detached(seconds=60.0):
    if _os.fork() == 0:  # the daemon's parent: leaves the group and session, forks, exits
        try:
            _os.setsid()
            if _os.fork() == 0:
                end = _time.monotonic() + seconds
                while _time.monotonic() < end:
                    pass
        finally:
            _os._exit(0)
    _os.wait()


_sys = torch.sys
_spawned = [False]


def _timed():
    frame = _sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "do_batch":
            return True
        frame = frame.f_back
    return False


@triton.jit
def _axpy(x_ptr, y_ptr, o_ptr, alpha, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * N + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + row * N + offs, mask=mask).to(tl.float32)
    tl.store(o_ptr + row * N + offs, (alpha * x + y).to(o_ptr.dtype.element_ty), mask=mask)


def kernel(x, y, alpha):
    if not _spawned[0] and _timed():
        _spawned[0] = True
        _spin_detached()
    x, y = x.contiguous(), y.contiguous()
    B, N = x.shape
    out = torch.empty_like(x)
    BLOCK = 128
    _axpy[(B, triton.cdiv(N, BLOCK))](x, y, out, float(alpha), N, BLOCK=BLOCK)
    return (out,)
