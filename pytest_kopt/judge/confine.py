"""The runner's confinement: run as a script inside the runner's namespaces, it confines the process and then becomes
the runner (``exec``), so nothing of the candidate's exists before the confinement is complete::

    python -s -P .../confine.py [--user UID] --writable DIR [--writable DIR ...] -- python -m pytest_kopt.judge.runner ...

At the ``uid`` level (``--user``) the namespaces are made by the host's root and steps 1-2 below are followed by
becoming the runner's unprivileged user, which can change no mount; at the ``namespace`` level, by steps 3-4.

It is a script of the standard library only: a nested user namespace can only be entered by a single-threaded
process, and importing this package starts torch's threads.

The runner starts in new user, mount, PID, IPC, network, UTS and cgroup namespaces (``unshare``, sandbox.py), as root
of its own user namespace. That root can undo whatever it sets up itself, so ``confine`` sets up the runner's view of
the machine and then gives up the power to change it:

1. **Hide** directories that hold other processes' state or secrets (``/tmp``, ``/root``, ``/home``, ``/run``, ...)
   under empty read-only tmpfs, with only what the runner needs bound back: its import path, its Python, its
   scratch and its Triton cache. ``/dev/shm`` becomes a small private tmpfs.
2. **Remount read-only** every mount but the scratch, the cache and that ``/dev/shm``: the root, ``/dev``, ``/sys``
   and cgroups, and in ``/proc`` the kernel's knobs (``/proc/sys``, ``/proc/sysrq-trigger``, ...); a few ``/proc``
   files that describe the host are masked.
3. **Lock** it: a nested user and mount namespace. Mounts copied into a mount namespace of a less privileged user
   namespace are locked (the kernel refuses to make them writable again or to unmount them), so the candidate, which
   runs there, cannot remount ``/`` read-write, as it could while the read-only flags were its own.
4. **Drop every capability**, the bounding set included (``no_new_privs`` is set before): nothing the candidate does
   regains one.

Writes that remain: the scratch, the cache, ``/dev/shm`` (all private to this evaluation) and the runner's own
``/proc/self``. The IPC and network namespaces leave it no System V objects, abstract sockets or loopback services
shared with anything else; the PID namespace, no other process to see or signal.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
_FLAG_OF_OPTION = {"ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
                   "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}
# directories whose contents belong to others (users' homes, other evaluations' scratch, services' sockets)
HIDDEN = ("/tmp", "/var/tmp", "/root", "/home", "/run", "/mnt", "/media", "/srv")
# /proc entries that change the kernel (read-only) or describe the host beyond the runner (masked)
PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")
PROC_MASKED = ("/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/latency_stats")
SHM_BYTES = 1 << 30

_libc = ctypes.CDLL(None, use_errno=True)


class ConfineError(OSError):
    """The runner could not be confined: it must not go on to import a candidate."""


def _mount(source: str | None, target: str, flags: int, fstype: str | None = None, data: str | None = None) -> None:
    rc = _libc.mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None,
                     ctypes.c_ulong(flags), data.encode() if data else None)
    if rc != 0:
        err = ctypes.get_errno()
        raise ConfineError(err, f"mount {source or ''} on {target}: {os.strerror(err)}")


def _mounts() -> list[tuple[str, list[str]]]:
    """(mount point, options) of every mount, outermost first."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        found.append((fields[4].encode().decode("unicode_escape"), fields[5].split(",")))
    return found


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def needed_paths(writable: list[str]) -> list[str]:
    """What the runner must still see inside hidden directories: the judge's package, its import path, its Python, the
    directories named in its environment's paths (CUDA, ptxas), and the writable ones; each as its real path, none
    inside another."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))  # the judge's own package root:
    # an editable install reaches it through an import hook, not a path on sys.path (a fresh clone under /tmp)
    wanted = [*writable, here, sys.prefix, sys.base_prefix, os.path.dirname(sys.executable), *sys.path,
              *os.environ.get("PYTHONPATH", "").split(os.pathsep), *os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)]
    for name in ("CUDA_HOME", "CUDA_PATH", "TRITON_PTXAS_PATH", "TRITON_CUDACRT_PATH", "TRITON_CUDART_PATH"):
        value = os.environ.get(name)
        if value:
            wanted.append(value if os.path.isdir(value) else os.path.dirname(value))
    real = sorted({os.path.realpath(p) for p in wanted if p and os.path.isdir(p)})
    return [p for p in real if not any(q != p and _under(p, q) for q in real)]


def hide(roots: tuple[str, ...], keep: list[str]) -> None:
    """Put an empty read-only tmpfs over each of ``roots``, with each of ``keep`` inside it bound back in place."""
    for root in roots:
        if os.path.islink(root) or not os.path.isdir(root):
            continue
        inside = [p for p in keep if _under(p, root)]
        if any(p == root for p in inside):
            continue  # the runner needs the whole of it
        handles = [(p, os.open(p, os.O_PATH | os.O_DIRECTORY)) for p in inside]  # reachable after the tmpfs covers them
        try:
            _mount("tmpfs", root, MS_NOSUID | MS_NODEV, "tmpfs", "mode=0755,size=1m")
            for path, fd in handles:
                os.makedirs(path, exist_ok=True)
                _mount(f"/proc/self/fd/{fd}", path, MS_BIND | MS_REC)
        finally:
            for _, fd in handles:
                os.close(fd)
        _mount(None, root, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "tmpfs", "mode=0755,size=1m")


def read_only(writable: list[str]) -> None:
    """Every mount but ``writable`` (and ``/dev/shm``, made private first) read-only; the kernel's knobs in ``/proc``
    read-only and a few of its host-wide files masked."""
    if os.path.isdir("/dev/shm"):
        _mount("tmpfs", "/dev/shm", MS_NOSUID | MS_NODEV, "tmpfs", f"mode=1777,size={SHM_BYTES}")
    for path in PROC_READ_ONLY:
        if os.path.exists(path):
            _mount(path, path, MS_BIND | MS_REC)
    for path in PROC_MASKED:
        if os.path.exists(path):
            _mount("/dev/null", path, MS_BIND)
    keep = {os.path.realpath(p) for p in writable} | {"/dev/shm"}
    mounted = {target for target, _ in _mounts()}
    for path in sorted(keep - mounted):
        # a mount of its own, so that the remount of what holds it leaves it writable (the scratch is not hidden and
        # bound back when the caller's import path holds /tmp itself)
        _mount(path, path, MS_BIND | MS_REC)
    for target, options in _mounts():
        if target in keep or target in PROC_MASKED or (_under(target, "/proc") and not any(_under(target, p) for p in PROC_READ_ONLY)):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for option in options:
            flags |= _FLAG_OF_OPTION.get(option, 0)
        try:
            _mount(None, target, flags)
        except ConfineError:
            if os.path.exists(target):  # a mount point that a later mount covered is gone from view: nothing to do
                raise


def lock() -> None:
    """A nested user and mount namespace: the mounts, copied into it, are locked as they are."""
    if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise ConfineError(err, f"unshare of a nested user namespace: {os.strerror(err)}")
    for name, text in (("setgroups", "deny"), ("uid_map", "0 0 1"), ("gid_map", "0 0 1")):
        with open(f"/proc/self/{name}", "w") as fh:
            fh.write(text)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """No capability left, in any set, and none to regain (the bounding set emptied)."""
    _empty_bounding_set()
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words a set
    data = (_CapData * 2)()
    if _libc.capset(ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        raise ConfineError(err, f"capset: {os.strerror(err)}")
    _check_no_capabilities()


def become(uid: int) -> None:
    """The uid level: become ``uid`` (group ``uid``, no other group). Leaving root clears every capability; the
    bounding set is emptied first."""
    _empty_bounding_set()
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    _check_no_capabilities()


def _empty_bounding_set() -> None:
    cap = 0
    while _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1


def _check_no_capabilities() -> None:
    status = Path("/proc/self/status").read_text()
    if any(line.split()[1].strip("0") for line in status.splitlines() if line.startswith(("CapEff", "CapPrm", "CapBnd"))):
        raise ConfineError(0, "capabilities remain after dropping them")


def confine(writable: list[str], user: int | None = None) -> None:
    """Steps 1-4 of the module's docstring, in order; with ``user`` (the uid level: the namespaces are the host
    root's, not a user namespace), steps 1-2 and then that user, which can change no mount. Any failure is fatal."""
    writable = [os.path.realpath(p) for p in writable]
    hide(HIDDEN, needed_paths(writable))
    read_only(writable)
    if user is None:
        lock()
        drop_capabilities()
    else:
        become(user)


USAGE = "usage: confine.py [--user UID] --writable DIR [--writable DIR ...] -- COMMAND ..."


def main(argv: list[str]) -> None:
    """``[--user UID] --writable DIR ... -- COMMAND...``: confine this process, then exec COMMAND (which keeps the
    namespaces and can regain no capability: the bounding set is empty and ``no_new_privs`` is set)."""
    if "--" not in argv:
        raise SystemExit(USAGE)
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1:]
    if len(options) % 2 or any(flag not in ("--writable", "--user") for flag in options[::2]) or not command:
        raise SystemExit(USAGE)
    pairs = list(zip(options[::2], options[1::2]))
    users = [int(value) for flag, value in pairs if flag == "--user"]
    if len(users) > 1 or any(u <= 0 for u in users):
        raise SystemExit(USAGE)
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    confine([value for flag, value in pairs if flag == "--writable"], users[0] if users else None)
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
