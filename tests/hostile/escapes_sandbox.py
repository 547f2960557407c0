"""Probe (passes when the sandbox holds): at import it tries to get out of the runner's confinement, and raises,
naming what worked, if anything did; otherwise it computes honestly.

Each attempt is one the red team of session 49 made work at the namespace level, or of the same kind:
- make a mount writable again (remount read-write, or unmount what covers a hidden directory);
- write outside the scratch: next to torch, into the judge's package, in /dev, in /tmp;
- open the kernel's knobs for writing (/proc/sys, /proc/sysrq-trigger, sysfs; nothing is written);
- keep a capability;
- read another evaluation's files (the supervisors' work directories, other runners' scratch);
- reach the host's loopback network (tests/test_judge_hostile.py listens on PORT) or its System V IPC (the test
  looks for KEY from outside).
"""

import torch
import triton
import triton.language as tl

_os = torch.os
_sys = torch.sys
_ctypes = _sys.modules.get("ctypes") or __import__("ctypes")
_socket = __import__("socket")
_glob = __import__("glob")

PORT = 47312
KEY = 0x6B6F7075
MS_REMOUNT, MS_BIND, MNT_DETACH = 32, 4096, 2
# a mount's own flags, kept by the remount (only read-only is dropped): where the probe does get through, nothing but
# the read-only flag changes
KEEP = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21}
IPC_CREAT = 0o1000
_libc = _ctypes.CDLL(None, use_errno=True)
ESCAPED = []


def _mounts():
    """(mount point, its flags but read-only) of every mount."""
    with open("/proc/self/mountinfo") as fh:
        fields = [line.split() for line in fh]
    return [(f[4], sum(KEEP.get(option, 0) for option in f[5].split(","))) for f in fields]


def _try_write(path):
    try:
        fd = _os.open(path, _os.O_WRONLY | _os.O_CREAT | _os.O_TRUNC, 0o644)
    except OSError:
        return False
    _os.write(fd, b"kopt escape probe\n")
    _os.close(fd)
    return True


def _try_open_for_writing(path):
    try:
        fd = _os.open(path, _os.O_WRONLY)
    except OSError:
        return False
    _os.close(fd)
    return True


def _probe():
    for target, flags in _mounts():
        if _libc.mount(None, target.encode(), None, _ctypes.c_ulong(MS_REMOUNT | MS_BIND | flags), None) == 0:
            ESCAPED.append(f"remounted {target} read-write")
    for target in ("/tmp", "/root", "/home", "/run"):
        if target in dict(_mounts()) and _libc.umount2(target.encode(), MNT_DETACH) == 0:
            ESCAPED.append(f"unmounted {target}")
    torch_dir = _os.path.dirname(_os.path.dirname(torch.__file__))
    judge_dir = _os.path.dirname(_sys.modules["pytest_kopt.judge.runner"].__file__)
    for path in (_os.path.join(torch_dir, "kopt_escape_probe.pth"), _os.path.join(judge_dir, "kopt_escape_probe.py"),
                 "/dev/kopt_escape_probe", "/tmp/kopt_escape_probe", "/var/tmp/kopt_escape_probe"):
        if _try_write(path):
            ESCAPED.append(f"wrote {path}")
    for path in ("/proc/sys/vm/swappiness", "/proc/sysrq-trigger", "/sys/kernel/mm/transparent_hugepage/enabled",
                 "/proc/sys/kernel/core_pattern"):
        if _os.path.exists(path) and _try_open_for_writing(path):
            ESCAPED.append(f"opened {path} for writing")
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("CapEff", "CapPrm")) and line.split()[1].strip("0"):
                ESCAPED.append(f"holds capabilities: {line.strip()}")
    own = _os.getcwd()
    for path in _glob.glob("/tmp/kopt-eval-*") + _glob.glob("/tmp/kopt-runner-*/s*"):
        if not own.startswith(path) and _os.access(path, _os.R_OK | _os.X_OK):
            try:
                _os.listdir(path)
                ESCAPED.append(f"read {path}")
            except OSError:
                pass
    try:
        _socket.create_connection(("127.0.0.1", PORT), timeout=2).close()
        ESCAPED.append(f"connected to 127.0.0.1:{PORT}")
    except OSError:
        pass
    _libc.shmget(KEY, 4096, IPC_CREAT | 0o600)  # the test looks for it from outside


_probe()
if ESCAPED:
    raise RuntimeError("escaped the sandbox: " + "; ".join(ESCAPED))


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
    _axpy[(B, triton.cdiv(N, BLOCK))](x, y, out, float(alpha), N, BLOCK=BLOCK)
    return (out,)
