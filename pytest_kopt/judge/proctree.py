"""A runner's processes, wherever they went: its descendants, and any process it left behind.

Between requests the supervisor stops its runners (SIGSTOP), so that no candidate code runs while
it prepares inputs, times another runner (the incumbent) or times the baselines in its own
process. A process group is not enough for that: any process can leave it (``setsid``,
``setpgid``), and a daemon that forks twice is re-parented away from the runner. So:

- the supervisor is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): a process a runner detaches
  is re-parented to the supervisor, not to init, and stays in view whatever user or session it
  is in;
- stopping a runner walks its process tree from ``/proc`` (parents, not groups) and stops every
  process in it, again until none is left running (a stopped process cannot fork);
- a process of the tree that left the runner's process group (``setsid``, ``setpgid``), and a
  process re-parented to the supervisor that is in none of its own sessions (the supervisor's own
  helpers stay in its session; a runner's session is its own, and a process can only start a new
  one, never join another), were put out of a plain stop's reach on purpose: they are killed with
  their descendants, and the evaluation fails, since a candidate has no business running anything
  outside its calls. (Triton's compiler subprocesses stay in the runner's group.)
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from dataclasses import dataclass

PR_SET_CHILD_SUBREAPER = 36
MAX_SWEEPS = 50  # rounds of stopping a tree that keeps forking, before it is killed instead
GONE = frozenset("ZXx")  # zombie or dead: nothing to signal
STOPPED = frozenset("Tt") | GONE  # stopped or traced too: nothing more runs there
_subreaper = False  # whether this process became a subreaper: only then are its strays a runner's


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str


def become_subreaper() -> bool:
    """Make this process the subreaper of its descendants; whether the kernel agreed."""
    global _subreaper
    try:
        _subreaper = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        _subreaper = False
    return _subreaper


def snapshot() -> dict[int, Proc]:
    """Every process this one can see: pid, parent, session and state, from ``/proc/<pid>/stat``."""
    procs: dict[int, Proc] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # the name in parentheses may hold spaces
        if len(fields) >= 4:
            procs[int(entry.name)] = Proc(int(entry.name), int(fields[1]), int(fields[2]), int(fields[3]), fields[0])
    return procs


def descendants(root: int, procs: dict[int, Proc]) -> set[int]:
    """``root`` and every process below it, by parent links."""
    children: dict[int, list[int]] = {}
    for proc in procs.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found, todo = set(), [root] if root in procs else []
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def left_behind(procs: dict[int, Proc], runners: set[int]) -> set[int]:
    """Processes re-parented to this (subreaper) process from outside its sessions, with their
    descendants: what a runner left running. ``runners``: the pids of this process's runners.
    Empty unless this process is a subreaper (elsewhere its children in other sessions are its own)."""
    if not _subreaper:
        return set()
    me, my_session = os.getpid(), os.getsid(0)
    roots = [p.pid for p in procs.values()
             if p.ppid == me and p.sid != my_session and p.pid not in runners and p.state not in GONE]
    found: set[int] = set()
    for root in roots:
        found |= descendants(root, procs)
    return found


def stop_tree(root: int, runners: set[int]) -> tuple[set[int], set[int]]:
    """SIGSTOP ``root`` and its descendants until none runs; SIGKILL what the runners left behind
    and every descendant that left ``root``'s process group (the group is what a plain stop reaches).
    Returns (the processes of the tree, the pids killed as left behind). A tree still forking
    after ``MAX_SWEEPS`` rounds is killed whole and reported as left behind."""
    killed: set[int] = set()
    for _ in range(MAX_SWEEPS):
        procs = snapshot()
        tree = descendants(root, procs)
        group = procs[root].pgid if root in procs else None
        escaped = {pid for pid in tree if procs[pid].pgid != group and procs[pid].state not in GONE}
        stray = left_behind(procs, runners) | set().union(*(descendants(pid, procs) for pid in escaped))
        tree -= stray
        running = [pid for pid in tree if procs[pid].state not in STOPPED]
        for pid in stray:
            _signal(pid, signal.SIGKILL)
        killed |= stray
        for pid in running:
            _signal(pid, signal.SIGSTOP)
        if not running and not stray:
            _reap(killed)
            return {pid for pid in tree - killed if procs[pid].state not in GONE}, killed
        time.sleep(0.0002)  # let the signals land before looking again
    procs = snapshot()
    tree = descendants(root, procs) - {root}
    for pid in tree | left_behind(procs, runners):
        _signal(pid, signal.SIGKILL)
    killed |= tree
    _reap(killed)
    return {root}, killed


def signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        _signal(pid, sig)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(pids: set[int]) -> None:
    """Collect the killed processes that are now this process's children (no zombies left)."""
    deadline = time.monotonic() + 1.0
    for pid in pids:
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break  # not our child (a descendant of one): its own parent reaps it
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.001)
