"""Processes of an evaluation: the trusted supervisor and the isolated runner.

``evaluate`` (this package's ``__init__``) starts a **supervisor** (``supervisor.py``), a child
of the caller in its own session that dies with it (``PR_SET_PDEATHSIG``) and enforces its own
wall-clock limit. The supervisor starts a **runner** (``runner.py``), the only process that
imports candidate code, isolated as well as the machine allows:

- ``uid`` (the judge runs as root and the Python install and checkout are readable by others):
  the runner runs as a dedicated unprivileged user (``KOPT_RUNNER_UID``, default 61000 + slot),
  with its own HOME, TMPDIR and Triton cache, in its own mount, PID, IPC, network, UTS and cgroup
  namespaces, set up by ``confine.py`` as at the namespace level before it becomes that user. It cannot write the checkout, the Python
  installation or the supervisor's files, read ``/proc/<supervisor>/environ``, signal or trace
  the supervisor. Before each evaluation every process of that user is killed, so no orphan of
  an earlier evaluation overlaps this one.
- ``namespace`` (not root, or root with a checkout others cannot read): new user, mount, PID, IPC,
  network, UTS and cgroup namespaces (``unshare``); inside, ``confine.py`` hides other users' and
  evaluations' directories, remounts every mount read-only except the scratch and cache
  directories, locks the mounts and drops every capability before the candidate is imported.
- ``process``: a separate process and nothing more, where neither is available.

The level reached is recorded in every result (``isolation``). ``KOPT_ISOLATION=uid|namespace|
process`` asks for one level; a level that cannot be had is an error, not a silent downgrade.
Scratch directories are named after their supervisor's pid; the next evaluation removes those
whose supervisor is gone.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import proctree

# Names that look like credentials: API keys, tokens, passwords, cloud and CI secrets.
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|SIGNATURE|CERT", re.I)
SECRET_PREFIXES = ("OPENAI_", "ANTHROPIC_", "AWS_", "AZURE_", "GOOGLE_", "GCP_", "HF_", "HUGGING", "GITHUB_", "GH_", "WANDB_")
# What a runner's environment keeps of the supervisor's: nothing else crosses.
RUNNER_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "TRITON_INTERPRET",
                   "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                   "NVSHMEM_DISABLE_NVLS", "TRITON_PTXAS_PATH", "TRITON_CUDACRT_PATH", "TRITON_CUDART_PATH")
RUNNER_UID_BASE = 61000
RUNNER_USER = "kopt-runner"  # LOGNAME and USER of the runner (its uid has no passwd entry)
PR_SET_PDEATHSIG = 1
LEVELS = ("uid", "namespace", "process")
CACHE_KEEP = 128  # per-candidate Triton caches kept for re-evaluations of the same file
CACHE_MAX_BYTES = 1 << 30  # a cache larger than this after its evaluation is not kept (a runner may fill it)
_RUNNER_PIDS: set[int] = set()  # this process's live runners (each in a session of its own)


def scrub_env(env: dict[str, str]) -> dict[str, str]:
    """A copy of ``env`` without anything named like a secret."""
    return {k: v for k, v in env.items() if not SECRET_NAME.search(k) and not k.upper().startswith(SECRET_PREFIXES)}


def die_with_parent() -> None:
    """In a child: receive SIGKILL when the parent exits (set again after any change of user)."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def tail(text: str, limit: int = 3000) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def python_path() -> str:
    """The caller's import path, for children that must import what it can."""
    paths = [os.path.abspath(p) for p in sys.path if p and os.path.isdir(p)]
    return os.pathsep.join(dict.fromkeys(paths))


# ---- the supervisor process -----------------------------------------------------------------
@dataclass
class ChildRun:
    returncode: int | None
    timed_out: bool
    stderr: str
    duration_s: float

    def death(self) -> str:
        """How the child ended, in words."""
        if self.timed_out:
            return "timed out"
        code = self.returncode
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"was killed by {name}" + (" (out of memory?)" if -code == signal.SIGKILL else "")
        return f"exited with code {code}"


def run_supervisor(argv: list[str], *, timeout_s: float, workdir: Path, visible_devices: str | None = None) -> tuple[ChildRun, bytes]:
    """Run ``python -m pytest_kopt.judge.supervisor argv`` to completion; returns how it ended and
    what it wrote to its result pipe. It dies with this process and is killed, with its whole
    session, at the wall-clock limit (the supervisor enforces a slightly shorter one itself).
    ``visible_devices``: the supervisor's ``CUDA_VISIBLE_DEVICES`` (its runner keeps it), else this process's."""
    read_end, write_end = os.pipe()
    env = scrub_env(dict(os.environ))
    if visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(visible_devices)
    env["PYTHONPATH"] = python_path()
    env["PYTHONFAULTHANDLER"] = "1"
    err_path = workdir / "supervisor.stderr"
    start = time.monotonic()
    timed_out = False
    chunks: list[bytes] = []
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-P", "-m", "pytest_kopt.judge.supervisor", "--result-fd", str(write_end), *argv],
                                cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                pass_fds=(write_end,), start_new_session=True, preexec_fn=die_with_parent)
        os.close(write_end)
        try:
            deadline = start + timeout_s
            os.set_blocking(read_end, False)
            while True:
                try:
                    data = os.read(read_end, 1 << 20)
                    if not data:
                        break
                    chunks.append(data)
                    continue
                except BlockingIOError:
                    pass
                if proc.poll() is not None and not _readable(read_end):
                    break
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                time.sleep(0.02)
        finally:
            os.close(read_end)
            _kill_session(proc.pid)
            proc.wait()
    return ChildRun(proc.returncode, timed_out, err_path.read_text(errors="replace"), time.monotonic() - start), b"".join(chunks)


def remove_stale_workdirs() -> None:
    """The caller's ``kopt-eval-<pid>-*`` directories whose process is gone (killed with -9)."""
    for entry in Path(tempfile.gettempdir()).glob("kopt-eval-*-*"):
        try:
            pid = int(entry.name.split("-")[2])
            if entry.stat().st_uid != os.geteuid():
                continue
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(entry, ignore_errors=True)
        except (ValueError, IndexError, OSError):
            continue


def _readable(fd: int) -> bool:
    import select

    return bool(select.select([fd], [], [], 0)[0])


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ---- isolation levels -----------------------------------------------------------------------
def _others_can_read(path: Path) -> bool:
    """Whether a user other than the owner can reach ``path`` (x on every ancestor, r on it)."""
    try:
        path = path.resolve()
        if not path.exists():
            return True
        if not os.stat(path).st_mode & stat.S_IROTH:
            return False
        for parent in path.parents:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
    except OSError:
        return False
    return True


def unreadable_paths() -> list[str]:
    """The import paths an unprivileged runner could not read."""
    needed = {Path(p) for p in sys.path if p and os.path.isdir(p)} | {Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).parent}
    return sorted(str(p) for p in needed if not _others_can_read(p))


_NAMESPACES_WORK: bool | None = None
# the runner's namespaces: its own mounts, processes, System V IPC, network (loopback only, down), host name and cgroup
# view; inside, confine.py locks the mounts and drops every capability before the candidate is imported
UNSHARE = ("unshare", "--user", "--map-root-user", "--mount", "--pid", "--ipc", "--net", "--uts", "--cgroup", "--fork",
           "--mount-proc")
UNSHARE_AS_ROOT = tuple(flag for flag in UNSHARE if flag not in ("--user", "--map-root-user"))  # the uid level's


def namespaces_work() -> bool:
    """Whether ``unshare`` can give a runner user, mount and PID namespaces here (checked once)."""
    global _NAMESPACES_WORK
    if _NAMESPACES_WORK is None:
        try:
            probe = subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=20)
            _NAMESPACES_WORK = probe.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            _NAMESPACES_WORK = False
    return _NAMESPACES_WORK


def choose_level() -> tuple[str, str]:
    """(level, why) for this machine: the strongest available, or the one KOPT_ISOLATION names."""
    wanted = os.environ.get("KOPT_ISOLATION", "").strip().lower()
    if wanted and wanted not in LEVELS:
        raise ValueError(f"KOPT_ISOLATION={wanted!r}: choose one of {', '.join(LEVELS)}")
    root = os.geteuid() == 0
    unreadable = unreadable_paths() if root else []
    if wanted == "uid" or (not wanted and root and not unreadable):
        if not root:
            raise RuntimeError("KOPT_ISOLATION=uid needs the judge to run as root (it switches the runner to another user)")
        if unreadable:
            raise RuntimeError(f"KOPT_ISOLATION=uid: the runner's user could not read {', '.join(unreadable[:3])} (make them world-readable)")
        return "uid", "runner as a dedicated unprivileged user"
    if wanted in ("", "namespace") and namespaces_work():
        why = "runner in its own namespaces, every mount read-only and locked but its scratch, no capabilities"
        if unreadable:
            why += f" (not a separate user: {unreadable[0]} is not readable by others)"
        return "namespace", why
    if wanted == "namespace":
        raise RuntimeError("KOPT_ISOLATION=namespace: this kernel does not let unshare create user namespaces")
    return "process", "runner in a separate process only (not root, and no user namespaces here)"


def runner_uid(slot: int) -> int:
    """A uid no account uses, for runner slot ``slot`` (KOPT_RUNNER_UID moves the base)."""
    uid = int(os.environ.get("KOPT_RUNNER_UID", RUNNER_UID_BASE)) + slot
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1000


def claim_uid(base: Path, slot: int) -> tuple[int, int]:
    """(uid, lock fd): the first runner uid from ``slot`` on that no live evaluation holds. The
    lock (flock on ``base/uid-N.lock``) lives as long as the fd, i.e. as long as this process
    holds it; then every process of that uid is an orphan and may be killed."""
    import fcntl

    for k in range(slot, slot + 512):
        uid = runner_uid(k)
        fd = os.open(base / f"uid-{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        kill_user_processes(uid)
        return uid, fd
    raise RuntimeError("every runner uid is in use by a live evaluation")


def kill_user_processes(uid: int) -> int:
    """SIGKILL every process of ``uid`` (an orphaned runner of an earlier evaluation); how many."""
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid == uid:
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
        except (OSError, ValueError):
            continue
    return killed


def runner_base() -> Path:
    """Where scratch and cache directories live: owned by the judge's user, not writable by runners."""
    base = Path(os.environ.get("KOPT_RUNNER_DIR") or Path(tempfile.gettempdir()) / f"kopt-runner-{os.geteuid()}")
    base.mkdir(mode=0o711, parents=True, exist_ok=True)
    info = base.lstat()
    if info.st_uid != os.geteuid() or stat.S_ISLNK(info.st_mode) or info.st_mode & 0o022:
        raise RuntimeError(f"{base} is not a private directory of this user: refusing to put runner files there")
    os.chmod(base, 0o711)
    (base / "cache").mkdir(mode=0o711, exist_ok=True)
    return base


def remove_stale_scratch(base: Path) -> None:
    """Scratch directories whose supervisor has died (name ``s<slot>-<pid>-...``)."""
    for entry in base.glob("s*-*-*"):
        try:
            pid = int(entry.name.split("-")[1])
            os.kill(pid, 0)
            continue  # its supervisor is alive
        except ProcessLookupError:
            pass
        except (ValueError, IndexError, PermissionError):
            continue
        shutil.rmtree(entry, ignore_errors=True)


def _chown_tree(path: Path, uid: int) -> None:
    for root, dirs, files in os.walk(path):
        os.lchown(root, uid, uid)
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, uid)


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (links not followed)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _evict_caches(cache_root: Path) -> None:
    caches = sorted(cache_root.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in caches[CACHE_KEEP:]:
        shutil.rmtree(old, ignore_errors=True)


# ---- the runner process ---------------------------------------------------------------------
@dataclass
class RunnerProcess:
    """A started runner: ``sock`` is the supervisor's end of the channel."""

    proc: subprocess.Popen
    sock: socket.socket
    level: str
    uid: int | None
    scratch: Path
    cache: Path
    stderr_path: Path
    detail: str
    uid_lock: int | None = None
    stopped: bool = False
    notes: list[str] = field(default_factory=list)
    tree: set[int] = field(default_factory=set)  # the runner's processes when last stopped
    left_behind: set[int] = field(default_factory=set)  # pids of processes it left running, killed

    def stop(self, sweep: bool = True) -> None:
        """SIGSTOP: no host code of the candidate runs while the supervisor prepares a round or
        times something else. The process group at once; with ``sweep``, then every process of the
        runner's tree wherever it went, and what it left behind is killed (``proctree``).
        A timed round stops the group only and sweeps once its window has closed."""
        if os.environ.get("KOPT_NO_SIGSTOP"):
            return
        if not self.stopped and self.proc.poll() is None:
            self._signal(signal.SIGSTOP)
            self.stopped = True
        if sweep:
            self.sweep()

    def sweep(self) -> None:
        """Stop the runner's whole tree and kill what it left behind (recorded in ``left_behind``)."""
        if os.environ.get("KOPT_NO_SIGSTOP") or not self.stopped:
            return
        self.tree, killed = proctree.stop_tree(self.proc.pid, set(_RUNNER_PIDS))
        self.left_behind |= killed

    def cont(self) -> None:
        if self.stopped:
            self._signal(signal.SIGCONT)
            proctree.signal_all(self.tree - {self.proc.pid}, signal.SIGCONT)
            self.stopped = False

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stderr(self) -> str:
        try:
            with open(self.stderr_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - 20000))
                return fh.read().decode(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        procs = proctree.snapshot()
        doomed = proctree.descendants(self.proc.pid, procs) - {self.proc.pid}
        self.cont()
        self._signal(signal.SIGKILL)
        proctree.signal_all(doomed, signal.SIGKILL)
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()
        _RUNNER_PIDS.discard(self.proc.pid)
        stray = proctree.left_behind(proctree.snapshot(), set(_RUNNER_PIDS))  # its orphans, now this process's
        proctree.signal_all(stray, signal.SIGKILL)
        self.sock.close()
        if self.uid is not None:
            kill_user_processes(self.uid)
            try:
                _chown_tree(self.cache, os.geteuid())  # at rest, no runner user may write it
            except OSError:
                pass
        if tree_bytes(self.cache) > CACHE_MAX_BYTES:
            shutil.rmtree(self.cache, ignore_errors=True)
        shutil.rmtree(self.scratch, ignore_errors=True)
        if self.uid_lock is not None:
            os.close(self.uid_lock)  # releases the uid for the next evaluation
            self.uid_lock = None


def start_runner(*, device: str, slot: int, level: str, cache_key: str, private: Path) -> RunnerProcess:
    """Start a runner for one candidate (``cache_key``: its id, naming its Triton cache)."""
    base = runner_base()
    remove_stale_scratch(base)
    uid, uid_lock = claim_uid(base, slot) if level == "uid" else (None, None)
    scratch = Path(tempfile.mkdtemp(prefix=f"s{slot}-{os.getpid()}-", dir=base))
    cache = base / "cache" / re.sub(r"[^0-9A-Za-z_.-]", "_", cache_key)[:64]
    cache.mkdir(mode=0o755, exist_ok=True)
    os.utime(cache)
    _evict_caches(base / "cache")
    for sub in ("home", "tmp"):
        (scratch / sub).mkdir()
    if uid is not None:
        _chown_tree(scratch, uid)
        _chown_tree(cache, uid)
        os.chmod(scratch, 0o700)
    env = {k: v for k, v in os.environ.items() if k in RUNNER_ENV_KEEP}
    env.update(HOME=str(scratch / "home"), TMPDIR=str(scratch / "tmp"), TRITON_CACHE_DIR=str(cache), TRITON_HOME=str(scratch / "home"),
               TRITON_CACHE_AUTOTUNING="1", PYTHONPATH=python_path(), PYTHONNOUSERSITE="1", PYTHONDONTWRITEBYTECODE="1",
               PYTHONFAULTHANDLER="1", PYTHONUNBUFFERED="1",
               # a dedicated uid has no passwd entry: getpass.getuser() (torch's profiler and caches
               # ask) reads these first and would otherwise raise KeyError from getpwuid
               LOGNAME=RUNNER_USER, USER=RUNNER_USER)
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    parent.set_inheritable(False)
    argv = [sys.executable, "-s", "-P", "-m", "pytest_kopt.judge.runner", "--fd", str(child.fileno()), "--device", device,
            "--scratch", str(scratch), "--parent-pid", str(os.getpid())]
    kwargs: dict = {}
    confine = [sys.executable, "-s", "-P", str(Path(__file__).with_name("confine.py")), "--writable", str(scratch), "--writable",
               str(cache)]
    if level == "uid":
        # root makes the namespaces (no user namespace: the host's root sets them up), confine.py hides and remounts,
        # then becomes the runner's user, which can change none of it, and execs the runner
        argv = [*UNSHARE_AS_ROOT, "--kill-child", *confine, "--user", str(uid), "--", *argv, "--namespace", "--dedicated-user"]
        kwargs = dict(preexec_fn=die_with_parent)
        detail = (f"runner as uid {uid} in its own namespaces: no write access to the checkout, the Python installation or "
                  "the supervisor, every mount read-only but its scratch and cache, no network")
    elif level == "namespace":
        argv = [*UNSHARE, "--kill-child", *confine, "--", *argv, "--namespace"]
        kwargs = dict(preexec_fn=die_with_parent)
        detail = "runner in its own namespaces: every mount read-only and locked but its scratch and cache, no capabilities"
    else:
        kwargs = dict(preexec_fn=die_with_parent)
        detail = "runner in a separate process (same user): it could write what this user can"
    stderr_path = private / f"runner-{slot}-{os.urandom(4).hex()}.stderr"
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(argv, cwd=scratch, env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                pass_fds=(child.fileno(),), start_new_session=True, **kwargs)
    child.close()
    _RUNNER_PIDS.add(proc.pid)
    return RunnerProcess(proc, parent, level, uid, scratch, cache, stderr_path, detail, uid_lock)
