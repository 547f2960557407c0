"""Device probe: can an unprivileged runner process share GPU memory with a root supervisor?

    python3 tools/probe_isolation.py [--json OUT.json]

Checks, each printed as one line and written to the JSON:
  env        who we are, the runtime, /dev/nvidia* modes, where torch lives and whether others can read it
  legacy     cuIpcGetMemHandle / cuIpcOpenMemHandle between two root processes, and root -> uid 65534
  vmm        cuMemCreate with a POSIX file-descriptor handle, the fd passed over a Unix socket
             (SCM_RIGHTS) to a uid-65534 process that maps it read-only (inputs) or read-write (outputs)
  triton     a Triton kernel compiled and run by the uid-65534 process with its own HOME and cache
It is a feasibility probe for the judge's supervisor/runner split, not part of the judge.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNNER_UID = 65534

_cuda = None


def cuda():
    global _cuda
    if _cuda is None:
        _cuda = ctypes.CDLL("libcuda.so.1")
    return _cuda


def check(rc, what):
    if rc != 0:
        name = ctypes.c_char_p()
        cuda().cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError(f"{what} failed: {rc} {name.value}")


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class AllocProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", AllocFlags)]


class AccessDesc(ctypes.Structure):
    _fields_ = [("location", Location), ("flags", ctypes.c_int)]


def prop(dev=0):
    p = AllocProp()
    p.type = 1  # PINNED
    p.requestedHandleTypes = 1  # POSIX_FILE_DESCRIPTOR
    p.location.type = 1  # DEVICE
    p.location.id = dev
    return p


def granularity(dev=0):
    g = ctypes.c_size_t()
    p = prop(dev)
    check(cuda().cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(p), 0), "granularity")
    return g.value


def vmm_export(size):
    g = granularity()
    size = (size + g - 1) // g * g
    h = ctypes.c_ulonglong()
    p = prop()
    check(cuda().cuMemCreate(ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(p), ctypes.c_ulonglong(0)), "cuMemCreate")
    fd = ctypes.c_int()
    check(cuda().cuMemExportToShareableHandle(ctypes.byref(fd), h, 1, ctypes.c_ulonglong(0)), "export")
    ptr = vmm_map(h, size, 3)
    return ptr, size, fd.value


def vmm_map(h, size, flags):
    ptr = ctypes.c_ulonglong()
    check(cuda().cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)), "reserve")
    check(cuda().cuMemMap(ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), h, ctypes.c_ulonglong(0)), "map")
    d = AccessDesc()
    d.location.type = 1
    d.location.id = 0
    d.flags = flags
    check(cuda().cuMemSetAccess(ptr, ctypes.c_size_t(size), ctypes.byref(d), ctypes.c_size_t(1)), "setaccess")
    return ptr.value


def vmm_import(fd, size, flags):
    h = ctypes.c_ulonglong()
    check(cuda().cuMemImportFromShareableHandle(ctypes.byref(h), ctypes.c_void_p(fd), 1), "import")
    return vmm_map(h, size, flags)


def as_tensor(ptr, nbytes, readonly=False):
    import torch

    class Wrap:
        __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, readonly), "version": 3, "strides": None}

    return torch.as_tensor(Wrap(), device="cuda")


def drop(uid):
    def fn():
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    return fn


# ---- the child side ---------------------------------------------------------------------
def child_main(mode):
    import torch

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    out = {"uid": os.getuid()}
    sock = socket.socket(fileno=int(sys.argv[3]))
    if mode == "vmm":
        msg, fds, _, _ = socket.recv_fds(sock, 4096, 4)
        info = json.loads(msg)
        try:
            rptr = vmm_import(fds[0], info["size"], 1)  # read-only
            t_in = as_tensor(rptr, info["size"], readonly=True)
            out["read_sum"] = int(t_in[:1024].to(torch.int64).sum())
            try:
                t_in[0] = 7
                torch.cuda.synchronize()
                out["write_to_readonly"] = "no error"
            except Exception as exc:  # noqa: BLE001
                out["write_to_readonly"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        except Exception as exc:  # noqa: BLE001
            out["import_ro"] = f"{type(exc).__name__}: {exc}"
        try:
            wptr = vmm_import(fds[1], info["size"], 3)
            t_out = as_tensor(wptr, info["size"])
            t_out.fill_(3)
            torch.cuda.synchronize()
            out["wrote"] = True
        except Exception as exc:  # noqa: BLE001
            out["import_rw"] = f"{type(exc).__name__}: {exc}"
    elif mode == "legacy":
        msg = sock.recv(4096)
        info = json.loads(msg)
        handle = (ctypes.c_char * 64).from_buffer_copy(bytes.fromhex(info["handle"]))
        ptr = ctypes.c_ulonglong()
        fn = getattr(cuda(), "cuIpcOpenMemHandle_v2", None) or cuda().cuIpcOpenMemHandle
        try:
            check(fn(ctypes.byref(ptr), handle, ctypes.c_uint(1)), "cuIpcOpenMemHandle")
            t = as_tensor(ptr.value, info["size"])
            out["read_sum"] = int(t[:1024].to(torch.int64).sum())
        except Exception as exc:  # noqa: BLE001
            out["open"] = str(exc)
    elif mode == "triton":
        import triton
        import triton.language as tl

        @triton.jit
        def add(x, y, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y + i, tl.load(x + i, mask=i < n) + 1, mask=i < n)

        x = torch.arange(1000, device="cuda", dtype=torch.float32)
        y = torch.empty_like(x)
        add[(4,)](x, y, 1000, BLOCK=256)
        out["triton_ok"] = bool((y == x + 1).all())
        try:
            Path(sys.argv[0]).with_name("written_by_runner").write_text("x")
            out["write_checkout"] = "WROTE"
        except OSError as exc:
            out["write_checkout"] = f"refused: {exc.strerror}"
        try:
            out["parent_environ"] = Path(f"/proc/{os.getppid()}/environ").read_bytes()[:20].hex()
        except OSError as exc:
            out["parent_environ"] = f"refused: {exc.strerror}"
    sock.sendall(json.dumps(out).encode())
    os._exit(0)


def spawn(mode, uid, env_extra=None):
    parent, child = socket.socketpair()
    os.set_inheritable(child.fileno(), True)
    home = tempfile.mkdtemp(prefix="runner-home-")
    os.chown(home, uid, uid) if uid else None
    env = {k: v for k, v in os.environ.items() if "KEY" not in k}
    env.update(HOME=home, TRITON_CACHE_DIR=f"{home}/triton", TMPDIR=home, PYTHONDONTWRITEBYTECODE="1")
    env.update(env_extra or {})
    proc = subprocess.Popen([sys.executable, __file__, "--child", mode, str(child.fileno())], pass_fds=(child.fileno(),),
                            user=uid or None, group=uid or None, extra_groups=[] if uid else None, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.close()
    return proc, parent


def finish(proc, sock, timeout=120):
    sock.settimeout(timeout)
    try:
        data = sock.recv(65536)
    except Exception as exc:  # noqa: BLE001
        data = b""
        err = str(exc)
    try:
        out, errs = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, errs = proc.communicate()
    try:
        return json.loads(data)
    except ValueError:
        return {"error": (errs or b"").decode(errors="replace")[-1500:]}


def main():
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    report = {}

    def say(key, value):
        report[key] = value
        print(f"{key}: {json.dumps(value)[:800]}", flush=True)

    say("env", {
        "uid": os.getuid(), "uname": os.uname().release, "python": sys.executable,
        "torch_file": torch.__file__, "torch_dir_mode": oct(os.stat(Path(torch.__file__).parent).st_mode & 0o777),
        "nvidia": {p: oct(os.stat(p).st_mode & 0o777) for p in sorted(map(str, Path("/dev").glob("nvidia*")))[:6]},
        "unshare": subprocess.run(["sh", "-c", "command -v unshare setpriv"], capture_output=True, text=True).stdout.split(),
        "cwd_mode": oct(os.stat(".").st_mode & 0o777), "cwd_owner": os.stat(".").st_uid,
    })
    userns = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "--pid", "--fork", "sh", "-c", "id -u; mount -t tmpfs none /tmp && echo tmpfs-ok"],
                            capture_output=True, text=True, user=RUNNER_UID, group=RUNNER_UID, extra_groups=[])
    say("userns_as_65534", {"rc": userns.returncode, "out": userns.stdout, "err": userns.stderr[-300:]})
    torch.cuda.init()
    x = torch.arange(1 << 20, device="cuda", dtype=torch.int32).view(torch.uint8)
    torch.cuda.synchronize()

    # legacy IPC to a root child, then to an unprivileged one
    for uid in (0, RUNNER_UID):
        try:
            handle = (ctypes.c_char * 64)()
            base = ctypes.c_ulonglong()
            size = ctypes.c_size_t()
            check(cuda().cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_ulonglong(x.data_ptr())), "range")
            check(cuda().cuIpcGetMemHandle(handle, base), "cuIpcGetMemHandle")
            proc, sock = spawn("legacy", uid)
            sock.sendall(json.dumps({"handle": bytes(handle).hex(), "size": 4096}).encode())
            say(f"legacy_uid{uid}", finish(proc, sock))
        except Exception as exc:  # noqa: BLE001
            say(f"legacy_uid{uid}", {"error": str(exc)})

    # VMM with fds
    for uid in (0, RUNNER_UID):
        try:
            t0 = time.perf_counter()
            iptr, size, ifd = vmm_export(4 << 20)
            optr, _, ofd = vmm_export(4 << 20)
            export_s = time.perf_counter() - t0
            tin = as_tensor(iptr, size)
            tin.fill_(1)
            tout = as_tensor(optr, size)
            tout.zero_()
            torch.cuda.synchronize()
            proc, sock = spawn("vmm", uid)
            socket.send_fds(sock, [json.dumps({"size": size}).encode()], [ifd, ofd])
            res = finish(proc, sock)
            torch.cuda.synchronize()
            res["supervisor_sees_output_sum"] = int(tout[:1024].to(torch.int64).sum())
            res["input_first_byte_after"] = int(tin[0])
            res["export_ms"] = export_s * 1e3
            say(f"vmm_uid{uid}", res)
        except Exception as exc:  # noqa: BLE001
            say(f"vmm_uid{uid}", {"error": str(exc)})

    try:
        proc, sock = spawn("triton", RUNNER_UID)
        say("triton_uid65534", finish(proc, sock, timeout=300))
    except Exception as exc:  # noqa: BLE001
        say("triton_uid65534", {"error": str(exc)})

    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child_main(sys.argv[2])
    else:
        main()
