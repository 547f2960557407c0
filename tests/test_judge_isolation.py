"""The judge's processes: the supervisor and the runner die with their caller, orphans and stale
scratch of an earlier evaluation are cleaned up, secrets stay out of the runner's environment,
and the isolation level is chosen as documented (docs/judge.md)."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pytest_kopt.judge import sandbox

HOSTILE = Path(__file__).resolve().parent / "hostile"
TESTS = Path(__file__).resolve().parent


def _alive(pid: int) -> bool:
    """Running or sleeping; a zombie waiting for its reaper is dead."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _processes(fragment: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if fragment in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_scrub_env_drops_anything_named_like_a_secret() -> None:
    env = {"PATH": "/bin", "HOME": "/root", "OPENAI_API_KEY": "sk-1", "GITHUB_TOKEN": "t", "MY_SECRET": "s",
           "DB_PASSWORD": "p", "AWS_REGION": "x", "HF_HOME": "h", "CUDA_VISIBLE_DEVICES": "0", "OPENAI_BASE_URL": "u"}
    assert sandbox.scrub_env(env) == {"PATH": "/bin", "HOME": "/root", "CUDA_VISIBLE_DEVICES": "0"}


def test_a_level_is_chosen_and_an_unknown_one_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    level, why = sandbox.choose_level()
    assert level in sandbox.LEVELS and why
    monkeypatch.setenv("KOPT_ISOLATION", "chroot")
    with pytest.raises(ValueError, match="KOPT_ISOLATION"):
        sandbox.choose_level()
    monkeypatch.setenv("KOPT_ISOLATION", "process")
    assert sandbox.choose_level()[0] == "process"


def test_each_source_has_a_triton_cache_of_its_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The kept Triton cache is named by the source's whole digest: two files sharing a short one could share a cache,
    and what the first wrote would run as the second (red team, session 50: 48 bits collided in a minute)."""
    import hashlib

    from pytest_kopt.judge import supervisor

    keys: list[str] = []

    class Started:
        notes: list[str] = []

    def fake_start(**options: object) -> Started:
        keys.append(str(options["cache_key"]))
        return Started()

    monkeypatch.setattr(sandbox, "start_runner", fake_start)
    for source in ("def kernel(): pass\n", "def kernel(): pass\n# another\n"):
        supervisor.start_process(source, slot=0, workdir=tmp_path)
    assert keys == [hashlib.sha256(s.encode()).hexdigest() for s in ("def kernel(): pass\n", "def kernel(): pass\n# another\n")]


def test_stale_scratch_of_a_dead_supervisor_is_removed() -> None:
    base = sandbox.runner_base()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = base / f"s0-{dead.pid}-leftover"
    stale.mkdir()
    (stale / "junk").write_text("x")
    mine = base / f"s0-{os.getpid()}-alive"
    mine.mkdir()
    try:
        sandbox.remove_stale_scratch(base)
        assert not stale.exists() and mine.exists()
    finally:
        mine.rmdir()


def test_supervisor_and_runner_die_with_their_caller(tmp_path: Path) -> None:
    """kill -9 of the loop mid-evaluation takes the supervisor and the runner with it."""
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        import judge_toy_problem
        from pytest_kopt.judge import evaluate
        evaluate(judge_toy_problem.AXPY.name, {str(HOSTILE / 'hangs.py')!r}, quick=True, upto="correctness", timeout_s=600)
    """))
    caller = subprocess.Popen([sys.executable, str(script)], start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        supervisors = runners = []
        while time.monotonic() < deadline:
            supervisors = _processes(f"kopt-eval-{caller.pid}-")
            runners = [pid for s in supervisors for pid in _processes(f"s0-{s}-")] if supervisors else []
            if runners and all(_alive(p) for p in runners):
                break
            time.sleep(0.5)
        assert supervisors and runners, "the evaluation never reached its runner"
        time.sleep(2)  # the runner is inside the candidate's endless loop by now
        os.kill(caller.pid, signal.SIGKILL)
        caller.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(p) for p in supervisors + runners):
            time.sleep(0.2)
        assert not [p for p in supervisors + runners if _alive(p)], "a judge process outlived its caller"
    finally:
        if caller.poll() is None:
            os.killpg(caller.pid, signal.SIGKILL)


def test_a_runner_of_a_dedicated_uid_has_a_login_name(tmp_path: Path) -> None:
    """The runner's uid has no passwd entry, so getpass.getuser() there (torch's profiler asks)
    must find LOGNAME in its environment, or the profile stage fails with KeyError from getpwuid
    (seen on the H200)."""
    import getpass

    level, _why = sandbox.choose_level()
    runner = sandbox.start_runner(device="cpu", slot=7, level=level, cache_key="login-name", private=tmp_path)
    try:
        environ = dict(item.split("=", 1) for item in
                       Path(f"/proc/{runner.proc.pid}/environ").read_text().split("\0") if "=" in item)
    finally:
        runner.close()
    assert environ.get("LOGNAME") == environ.get("USER") == sandbox.RUNNER_USER
    if runner.uid is not None:
        with pytest.raises(KeyError):  # why it is needed: the uid is no user of this machine
            pwd.getpwuid(runner.uid)
    assert getpass.getuser()  # the supervisor's own lookup is untouched


def test_the_scratch_stays_writable_when_the_import_path_holds_tmp() -> None:
    """A caller with /tmp itself on its import path (a script run from /tmp) keeps /tmp in the runner's view, so the
    scratch inside it is not bound back on its own; it is still a writable mount of its own there (it was read-only,
    and every candidate failed to load)."""
    level, _ = sandbox.choose_level()
    if level == "process":
        pytest.skip("the process level has no mount namespace")
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = ["/tmp", {str(TESTS)!r}]
        import judge_toy_problem
        from pytest_kopt.judge import evaluate
        r = evaluate("judge-toy-axpy", {str(HOSTILE / "good_axpy.py")!r}, quick=True, upto="correctness", timeout_s=300)
        print(r["verdict"], (r.get("reasons") or [""])[0][:300])
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=400,
                         env={**os.environ, "TRITON_INTERPRET": "1"}, cwd="/tmp")
    assert run.stdout.strip().splitlines()[-1].startswith("pass"), run.stdout[-600:] + run.stderr[-600:]
