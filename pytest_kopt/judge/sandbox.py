"""Run one evaluation in a child process that can die without taking the judge with it.

A candidate may hang, segfault, exhaust memory or leave the GPU context unusable (after an
illegal address, every later CUDA call in that process fails). Each evaluation therefore gets
a fresh child in its own process group (killed as a whole at the wall-clock limit and on the
way out, so nothing it spawned survives), an environment without secrets, and a scratch
directory as its working directory.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# Names that look like credentials: API keys, tokens, passwords, cloud and CI secrets.
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|SIGNATURE|CERT", re.I)
SECRET_PREFIXES = ("OPENAI_", "ANTHROPIC_", "AWS_", "AZURE_", "GOOGLE_", "GCP_", "HF_", "HUGGING", "GITHUB_", "GH_", "WANDB_")


def scrub_env(env: dict[str, str]) -> dict[str, str]:
    """A copy of ``env`` without anything named like a secret."""
    return {k: v for k, v in env.items() if not SECRET_NAME.search(k) and not k.upper().startswith(SECRET_PREFIXES)}


def child_env(scratch: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """Scrubbed environment whose PYTHONPATH lets the child import whatever the parent can."""
    env = scrub_env(dict(os.environ if base is None else base))
    paths = [os.path.abspath(p) for p in sys.path if p and os.path.isdir(p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"  # a segfault prints the Python stack, candidate line included
    env["TMPDIR"] = str(scratch)
    if "TRITON_CACHE_DIR" not in env:  # keep compiled kernels across evaluations
        env["TRITON_CACHE_DIR"] = str(Path(os.path.expanduser("~")) / ".triton" / "cache")
    # keep autotuning results across evaluations too: every evaluation is a fresh process, and a
    # baseline such as flash-linear-attention's chunk_kda autotunes for over a minute on its first
    # call in each one (Triton keys the cached choice by kernel source, tuning key and device)
    env.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    return env


@dataclass
class ChildRun:
    returncode: int | None
    timed_out: bool
    stdout: str
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
            hint = " (out of memory?)" if -code == signal.SIGKILL else ""
            return f"was killed by {name}{hint}"
        return f"exited with code {code}"


def tail(text: str, limit: int = 3000) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def run_child(argv: list[str], *, scratch: Path, timeout_s: float, stdin: bytes = b"", env: dict[str, str] | None = None) -> ChildRun:
    """Run ``python argv`` in ``scratch`` in a new process group; kill the group on timeout."""
    out_path, err_path = scratch / "child.stdout", scratch / "child.stderr"
    start = time.monotonic()
    timed_out = False
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, *argv], cwd=scratch, env=env if env is not None else child_env(scratch),
            stdin=subprocess.PIPE, stdout=out, stderr=err, start_new_session=True,
        )
        try:
            try:
                proc.stdin.write(stdin)  # type: ignore[union-attr]
                proc.stdin.close()  # type: ignore[union-attr]
            except BrokenPipeError:
                pass
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
        finally:
            _kill_group(proc.pid)
            proc.wait()
    read = lambda p: p.read_text(errors="replace") if p.exists() else ""  # noqa: E731
    return ChildRun(proc.returncode, timed_out, read(out_path), read(err_path), time.monotonic() - start)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
