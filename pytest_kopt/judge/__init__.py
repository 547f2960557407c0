"""The judge: the only source of verdicts. Candidate code never runs where a verdict is decided.

``evaluate(problem, candidate)`` applies the static policy in this process (policy.py: a cheap
first filter with good messages), then starts a trusted **supervisor** process (supervisor.py)
that makes the inputs from seeds it keeps, computes the reference, checks, times and decides. The
candidate is imported only by an untrusted **runner** process (runner.py), isolated from the
supervisor by user id or namespaces (sandbox.py), which calls ``kernel`` on inputs handed to it
through shared memory (arena.py, channel.py, client.py). Timing: rounds.py and bench.py, with the
project's one timer module (timing.py). The result is a plain dict; its keys are pinned in
docs/architecture.md; the threat model is docs/judge.md.

``problem`` is a registry name (``kda``) or ``package.module:attribute``; a problem registered
only in this process is found by the supervisor through its class's module (problemref.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

STAGES = ("policy", "compile", "correctness", "benchmark", "profile")
METRICS = ("eager", "device", "graph")

# Imported once here, not inside evaluate(): callers evaluate from threads, and CPython 3.11's
# compile() is not thread-safe while pytest's assertion rewriting imports these modules
# ("AST constructor recursion depth mismatch").
from .policy import check_source  # noqa: E402
from .problemref import hints, resolve_problem  # noqa: E402
from .sandbox import remove_stale_workdirs, run_supervisor, tail  # noqa: E402


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
    metric: str = "eager",
    incumbent: str | Path | None = None,
    slot: int = 0,
    min_examples: int | None = None,
    visible_devices: str | None = None,
    baselines: bool = True,
    timing: bool = True,
) -> dict:
    """Judge one candidate file; returns the result dict (``verdict`` is "pass" or "fail").

    ``upto`` is the last stage to run (policy|compile|correctness|benchmark|profile); quick
    mode runs the first headline shape, fewer random shapes and fewer rounds. ``seed`` makes the
    hidden input seeds reproducible (default: fresh secret seeds). ``static_policy=False`` skips
    the AST policy, for tests that prove the runtime stands on its own. ``hypothesis=False``
    leaves out the random-shape sweep (for a file that already passed it). ``metric`` names the
    figure ``candidate_us`` and the speedup use (eager|device|graph). ``incumbent`` is another
    candidate file timed beside this one, interleaved round by round (``result["incumbent"]``).
    ``slot`` picks the runner's user (parallel evaluations use different slots);
    ``min_examples`` overrides how many random shapes the sweep must judge. ``visible_devices``
    pins the evaluation to GPUs: the supervisor (and so its runner, which keeps the variable) sees
    them as ``CUDA_VISIBLE_DEVICES`` (None: whatever this process sees), so parallel evaluations
    each get their own GPU (docs/parallel.md). ``baselines=False`` leaves the baselines' and the
    reference's timing out (the loop times them once, when its run starts); ``timing=False`` with
    ``upto="profile"`` profiles without timing again (the loop's profile of a candidate it timed).
    """

    if upto not in STAGES:
        raise ValueError(f"upto must be one of {', '.join(STAGES)}; got {upto!r}")
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}; got {metric!r}")
    started = time.monotonic()
    path = Path(candidate_path)
    result: dict[str, Any] = {
        "verdict": "fail", "stage": "policy", "reasons": [], "problem": problem_name, "candidate": str(path),
        "candidate_id": None, "device": None, "duration_s": None, "upto": upto, "quick": quick, "errors": [],
        "timings": None, "speedup": None, "roofline": None, "profile": None, "isolation": None,
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
            incumbent_source, incumbent_error = _incumbent(incumbent, static_policy)
            result.update(_supervise(problem_name, problem, source, upto=upto, quick=quick, timeout_s=timeout_s, seed=seed,
                                     hypothesis=hypothesis, metric=metric, incumbent=incumbent_source, slot=slot,
                                     min_examples=min_examples, visible_devices=visible_devices, baselines=baselines,
                                     timing=timing))
            if incumbent is not None and incumbent_error:
                result["incumbent"] = None
                result["incumbent_error"] = incumbent_error
    result["duration_s"] = time.monotonic() - started
    if json_out is not None:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(json.dumps(result, indent=1, default=str))
    return result


def _incumbent(path: str | Path | None, static_policy: bool) -> tuple[str | None, str | None]:
    """The incumbent's source when it can be timed, else (None, why)."""
    if path is None:
        return None, None
    try:
        source = Path(path).read_text()
    except OSError as exc:
        return None, f"cannot read the incumbent: {exc}"
    report = check_source(source, Path(path).name) if static_policy else None
    if report is not None and not report.ok:
        return None, "the incumbent fails the policy: " + "; ".join(report.reasons[:3])
    return source, None


def _supervise(problem_ref: str, problem: Any, source: str, *, upto: str, quick: bool, timeout_s: float, seed: int | None,
               hypothesis: bool, metric: str, incumbent: str | None, slot: int, min_examples: int | None,
               visible_devices: str | None = None, baselines: bool = True, timing: bool = True) -> dict:
    """Run the supervisor process on ``source``; its result, or a failure saying how it ended."""
    remove_stale_workdirs()
    workdir = Path(tempfile.mkdtemp(prefix=f"kopt-eval-{os.getpid()}-"))  # 0700: the supervisor's alone
    try:
        (workdir / "candidate.py").write_text(source)  # the text the policy saw, not whatever the path holds by now
        module, qualname = hints(problem)
        ref = problem_ref if ":" in problem_ref else problem.name
        argv = ["--problem", ref, "--problem-module", module, "--problem-class", qualname, "--candidate", str(workdir / "candidate.py"),
                "--upto", upto, "--metric", metric, "--deadline", repr(time.time() + timeout_s), "--slot", str(slot)]
        if incumbent is not None:
            (workdir / "incumbent.py").write_text(incumbent)
            argv += ["--incumbent", str(workdir / "incumbent.py")]
        if quick:
            argv.append("--quick")
        if seed is not None:
            argv += ["--seed", str(seed)]
        if not hypothesis:
            argv.append("--no-hypothesis")
        if not baselines:
            argv.append("--no-baselines")
        if not timing:
            argv.append("--no-timing")
        if min_examples is not None:
            argv += ["--min-examples", str(min_examples)]
        run, payload = run_supervisor(argv, timeout_s=timeout_s, workdir=workdir, visible_devices=visible_devices)
        if payload:
            try:
                result = json.loads(payload.decode())
                if isinstance(result, dict):
                    return result
            except (UnicodeDecodeError, ValueError):
                pass
        if run.timed_out:
            reason = f"timed out after {timeout_s:g} s: the evaluation was killed"
        else:
            reason = f"the judge's supervisor {run.death()} without a result"
        output = tail(run.stderr)
        return {"stage": "compile", "reasons": [reason] + ([f"output of the supervisor:\n{output}"] if output else [])}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _us(value: Any) -> str:
    return f"{value:.1f} us" if isinstance(value, (int, float)) else "n/a"


def summary(result: dict) -> str:
    """A few lines a person (or an agent) reads first."""
    lines = [f"{result.get('verdict', '?').upper()} at {result.get('stage')}  {result.get('problem')}  "
             f"{result.get('candidate')} [{result.get('candidate_id')}]  on {result.get('device')}"]
    lines += [f"  - {r}" for r in result.get("reasons") or []]
    isolation = result.get("isolation") or {}
    if isolation:
        lines.append(f"  isolation: {isolation.get('level')} ({isolation.get('detail')})")
    timings = result.get("timings") or {}
    if timings.get("candidate_us") is not None:
        figures = timings.get("figures") or {}
        lines.append(f"  time on {timings.get('case')} ({timings.get('metric', 'device')}): candidate {_us(timings['candidate_us'])}"
                     + (f"  [eager {_us(figures.get('eager'))}, device {_us(figures.get('device'))}, graph {_us(figures.get('graph'))}]" if figures else ""))
        for name, value in (timings.get("baselines") or {}).items():
            figs = (timings.get("baseline_figures") or {}).get(name) or {}
            lines.append(f"  baseline {name}: {_us(value)}" + (f"  [eager {_us(figs.get('eager'))}, device {_us(figs.get('device'))}, "
                                                               f"graph {_us(figs.get('graph'))}]" if figs else ""))
        if timings.get("reference_us"):
            lines.append(f"  reference: {_us(timings['reference_us'])}")
        if timings.get("host_us") is not None:
            lines.append(f"  host time per call (runner's report): {_us(timings['host_us'])}")
    if result.get("speedup"):
        lines.append(f"  speedup vs {timings.get('baseline')}: {result['speedup']:.3g}x")
    incumbent = result.get("incumbent")
    if incumbent and (incumbent.get("ratio") or {}).get("median"):
        ratio = incumbent["ratio"]
        lines.append(f"  vs incumbent {incumbent.get('candidate_id')}: {ratio['median']:.3f}x faster "
                     f"(95% interval {ratio['lo']:.3f}-{ratio['hi']:.3f}, {ratio['rounds']} rounds, {ratio['metric']})")
    elif result.get("incumbent_error"):
        lines.append(f"  incumbent not timed: {result['incumbent_error']}")
    roof = result.get("roofline") or {}
    if roof.get("floor_us") is not None:
        lines.append(f"  roofline: floor {roof['floor_us']:.2f} us, {roof.get('achieved_GBps') or 0:.1f} GB/s, "
                     f"{roof.get('achieved_TFLOPs') or 0:.3f} TFLOP/s, {100 * (roof.get('floor_fraction') or 0):.2f}% of the floor")
    for row in ((result.get("profile") or {}).get("kernels") or [])[:5]:
        lines.append(f"  kernel {row['name']}: {row['us']:.1f} us x{row['calls']:g}")
    for note in result.get("notes") or []:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


__all__ = ["METRICS", "STAGES", "candidate_id", "evaluate", "summary"]
