"""proctree: a runner's processes are stopped wherever they went, and what left its reach is killed.

Each check runs in a fresh Python process that becomes a subreaper, as the supervisor does (a
subreaper test process would adopt every orphan of the test session)."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r'''
import json, os, signal, subprocess, sys, time
from pytest_kopt.judge import proctree

assert proctree.become_subreaper()
# a "runner" in its own session, with an honest child in its group, a child that left the group
# (setpgid) and a daemon that left the session and was re-parented (fork, setsid, fork, exit)
runner_code = """
import os, sys, time
def spin():
    while True:
        time.sleep(0.01)
honest = os.fork()
if honest == 0:
    spin()
left_group = os.fork()
if left_group == 0:
    os.setpgid(0, 0)
    spin()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        spin()
    os._exit(0)
os.wait()
sys.stdout.write(f'{honest} {left_group}\\n'); sys.stdout.flush()
spin()
"""
runner = subprocess.Popen([sys.executable, "-c", runner_code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          start_new_session=True, text=True)
honest, left_group = map(int, runner.stdout.readline().split())
time.sleep(0.2)
before = proctree.snapshot()
mine = {p.pid for p in before.values() if p.ppid == os.getpid() and p.pid != runner.pid}
tree, killed = proctree.stop_tree(runner.pid, {runner.pid})
time.sleep(0.1)
after = proctree.snapshot()
states = {pid: after[pid].state for pid in tree if pid in after}
alive_killed = [pid for pid in killed if pid in after and after[pid].state not in "ZXx"]
proctree.signal_all(tree, signal.SIGCONT)
time.sleep(0.1)
resumed = {pid: proctree.snapshot()[pid].state for pid in tree}
proctree.signal_all(tree, signal.SIGKILL)
runner.wait()
print(json.dumps({"tree": sorted(tree), "killed": sorted(killed), "states": states, "alive_killed": alive_killed,
                  "resumed": resumed, "adopted": sorted(mine), "runner": runner.pid, "honest": honest, "left_group": left_group}))
'''


def test_a_runner_tree_is_stopped_and_what_left_its_group_or_session_is_killed():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    # the runner and its honest child stay, stopped; the setpgid child and the adopted daemon are killed
    assert set(out["tree"]) == {out["runner"], out["honest"]}
    assert set(out["states"].values()) == {"T"}
    assert out["adopted"] and set(out["adopted"]) | {out["left_group"]} <= set(out["killed"])
    assert out["alive_killed"] == []
    assert "T" not in out["resumed"].values()  # SIGCONT to the tree resumes it
