"""The judge: the one place candidate code runs, and the only source of verdicts.

``evaluate(problem, candidate)`` applies the static policy in this process (policy.py), then
runs everything else in a child process (child.py, via sandbox.py): compile, runtime honesty
checks (checks.py), correctness on explicit and hypothesis-generated shapes, a benchmark with
the project's one timer (timing.py) against the problem's baselines and reference, and a
per-kernel profile with roofline figures (profile.py). The result is a plain dict; its keys
are pinned in docs/architecture.md.

``problem`` is a registry name (``kda``) or ``package.module:attribute``; a problem registered
only in this process is found by the child through its class's module (problemref.py).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

STAGES = ("policy", "compile", "correctness", "benchmark", "profile")

# Imported once here, not inside evaluate(): callers evaluate from threads, and CPython 3.11's
# compile() is not thread-safe while pytest's assertion rewriting imports these modules
# ("AST constructor recursion depth mismatch").  child needs STAGES, hence the placement.
from .child import sign  # noqa: E402
from .policy import check_source  # noqa: E402
from .problemref import hints, resolve_problem  # noqa: E402
from .sandbox import run_child, tail  # noqa: E402


def candidate_id(source: str) -> str:
    """First 12 hex digits of the sha256 of the candidate's source text."""
    return hashlib.sha256(source.encode()).hexdigest()[:12]


def evaluate(
    problem_name: str,
    candidate_path: str | Path,
    *,
    upto: str = "profile",
    quick: bool = False,
    timeout_s: float = 900.0,
    json_out: str | Path | None = None,
    seed: int | None = None,
    static_policy: bool = True,
    hypothesis: bool = True,
) -> dict:
    """Judge one candidate file; returns the result dict (``verdict`` is "pass" or "fail").

    ``upto`` is the last stage to run (policy|compile|correctness|benchmark|profile); quick
    mode runs the first headline shape, few random shapes and fewer rounds (the command-line
    front ends also stop quick evaluations before the profile unless told otherwise). ``seed`` makes the hidden input seeds
    reproducible (default: fresh secret seeds). ``static_policy=False`` skips the AST policy,
    for tests that prove the runtime checks hold on their own. ``hypothesis=False`` leaves out the
    random-shape sweep (the explicit cases still run, on fresh inputs): for a file that already
    passed it, so that timing it again does not pay for the sweep again.
    """

    if upto not in STAGES:
        raise ValueError(f"upto must be one of {', '.join(STAGES)}; got {upto!r}")
    started = time.monotonic()
    path = Path(candidate_path)
    result: dict[str, Any] = {
        "verdict": "fail", "stage": "policy", "reasons": [], "problem": problem_name, "candidate": str(path),
        "candidate_id": None, "device": None, "duration_s": None, "upto": upto, "quick": quick, "errors": [],
        "timings": None, "speedup": None, "roofline": None, "profile": None,
    }
    try:
        source = path.read_text()
    except OSError as exc:
        source = None
        result["reasons"] = [f"cannot read the candidate: {exc}"]
    try:
        problem = resolve_problem(problem_name)
        result["problem"] = problem.name
    except Exception as exc:  # noqa: BLE001
        problem = None
        result["reasons"].append(f"unknown problem {problem_name!r}: {exc}")
    if source is not None:
        result["candidate_id"] = candidate_id(source)
    if source is not None and problem is not None:
        report = check_source(source, path.name) if static_policy else None
        if report is not None and not report.ok:
            result["reasons"] = [f"{path.name} {reason}" for reason in report.reasons]
        elif upto == "policy":
            result.update(verdict="pass", stage="policy")
        else:
            result.update(_run_in_child(problem_name, problem, hints(problem), source, upto=upto, quick=quick,
                                        timeout_s=timeout_s, seed=seed, hypothesis=hypothesis))
    result["duration_s"] = time.monotonic() - started
    if json_out is not None:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(json.dumps(result, indent=1, default=str))
    return result


def _run_in_child(problem_ref: str, problem: Any, problem_hints: tuple[str, str], source: str, *, upto: str, quick: bool,
                  timeout_s: float, seed: int | None, hypothesis: bool = True) -> dict:

    scratch = Path(tempfile.mkdtemp(prefix="kopt-eval-"))
    try:
        candidate = scratch / "candidate.py"
        candidate.write_text(source)  # the text the policy saw, not whatever the path holds by now
        out, progress = scratch / "result.json", scratch / "progress.jsonl"
        key = secrets.token_hex(32)
        ref = problem_ref if ":" in problem_ref else problem.name
        argv = ["-m", "pytest_kopt.judge.child", "--problem", ref, "--problem-module", problem_hints[0],
                "--problem-class", problem_hints[1], "--candidate", str(candidate), "--out", str(out),
                "--progress", str(progress), "--upto", upto]
        if quick:
            argv.append("--quick")
        if seed is not None:
            argv += ["--seed", str(seed)]
        if not hypothesis:
            argv.append("--no-hypothesis")
        run = run_child(argv, scratch=scratch, timeout_s=timeout_s, stdin=(key + "\n").encode())
        forged = False
        if out.exists():  # a signed result counts even if the process died afterwards (e.g. CUDA teardown)
            try:
                document = json.loads(out.read_text())
                result = document["result"]
                if isinstance(result, dict) and secrets.compare_digest(str(document["hmac"]), sign(result, key.encode())):
                    return result
            except (ValueError, KeyError, TypeError):
                pass
            forged = True
        stage = _last_stage(progress)
        if run.timed_out:
            reason = f"timed out after {timeout_s:g} s during {stage}: the whole process group was killed"
        else:
            reason = f"the evaluation process {run.death()} during {stage} without writing a result"
        reason += _candidate_lines(run.stderr, source)
        output = tail(run.stderr) or tail(run.stdout)
        reasons = [reason] + ([f"output of the process:\n{output}"] if output else [])
        if forged:
            reasons.insert(0, "a result file the judge did not sign was found (forged result)")
        return {"stage": stage, "reasons": reasons}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _candidate_lines(stderr: str, source: str) -> str:
    """" (candidate line 12: `...`)" for the candidate's frames in a crash dump, innermost first."""
    lines = source.splitlines()
    found = []
    for match in re.finditer(r'candidate\.py", line (\d+)', stderr):
        number = int(match.group(1))
        text = lines[number - 1].strip() if 0 < number <= len(lines) else ""
        if (number, text) not in found:
            found.append((number, text))
    return (" (" + "; ".join(f"candidate line {n}: `{t}`" for n, t in found[:3]) + ")") if found else ""


def _last_stage(progress: Path) -> str:
    stage = "compile"
    try:
        for line in progress.read_text().splitlines():
            stage = json.loads(line).get("stage", stage)
    except (OSError, ValueError):
        pass
    return stage if stage in STAGES else "compile"


def summary(result: dict) -> str:
    """A few lines a person (or an agent) reads first."""
    lines = [f"{result.get('verdict', '?').upper()} at {result.get('stage')}  {result.get('problem')}  "
             f"{result.get('candidate')} [{result.get('candidate_id')}]  on {result.get('device')}"]
    lines += [f"  - {r}" for r in result.get("reasons") or []]
    timings = result.get("timings") or {}
    if timings.get("candidate_us") is not None:
        base = ", ".join(f"{k} {v:.1f} us" for k, v in (timings.get("baselines") or {}).items())
        lines.append(f"  time on {timings.get('case')}: candidate {timings['candidate_us']:.1f} us; {base}"
                     + (f"; reference {timings['reference_us']:.1f} us" if timings.get("reference_us") else ""))
    if result.get("speedup"):
        lines.append(f"  speedup vs {timings.get('baseline')}: {result['speedup']:.3g}x")
    roof = result.get("roofline") or {}
    if roof.get("floor_us") is not None:
        lines.append(f"  roofline: floor {roof['floor_us']:.2f} us, {roof.get('achieved_GBps') or 0:.1f} GB/s, "
                     f"{roof.get('achieved_TFLOPs') or 0:.3f} TFLOP/s, {100 * (roof.get('floor_fraction') or 0):.2f}% of the floor")
    for row in ((result.get("profile") or {}).get("kernels") or [])[:5]:
        lines.append(f"  kernel {row['name']}: {row['us']:.1f} us x{row['calls']:g}")
    for note in result.get("notes") or []:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


__all__ = ["STAGES", "candidate_id", "evaluate", "summary"]
