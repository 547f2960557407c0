"""The judge's child process: compile, honesty checks, correctness, benchmark and profile.

    python -m pytest_kopt.judge.child --problem NAME --candidate FILE --out RESULT.json
        [--problem-module M --problem-class C] [--progress P.jsonl] [--upto STAGE] [--quick] [--seed N]

The first line of stdin is a key; the result is written as ``{"result": ..., "hmac": ...}`` so
the parent can tell the judge's own result from a file the candidate forged. Everything the
verdict depends on is set up before the candidate is imported (launch monitor, namespace
snapshot, secret seeds), and the verdict is computed from data: outputs against the
reference, inputs against their copies, what the dispatch mode and launch monitor recorded.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import importlib.util
import json
import math
import os
import random
import secrets
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from . import STAGES

IMPOSSIBLE_MARGIN = 0.9  # a time below 0.9 x the physical floor cannot be real
FATAL_MARKERS = ("CUDA error", "illegal memory access", "AcceleratorError", "device-side assert", "CUBLAS_STATUS", "misaligned address")


class CandidateError(Exception):
    """The candidate raised (or broke the device); ``fatal`` when the process cannot go on."""

    def __init__(self, reason: str, fatal: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.fatal = fatal


class StageFailed(Exception):
    def __init__(self, stage: str, reasons: list[str]) -> None:
        super().__init__("; ".join(reasons))
        self.stage = stage
        self.reasons = reasons


def describe_exception(exc: BaseException, candidate: Path, limit: int = 1500) -> str:
    """``ValueError: msg (candidate line 12: `x = ...`)``, trimmed, naming the candidate's lines."""
    text = f"{type(exc).__name__}: {exc}".strip()
    if len(text) > limit:
        text = text[:limit] + " ..."
    lines = []
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename).name == candidate.name:
            lines.append(f"candidate line {frame.lineno}: `{(frame.line or '').strip()}`")
    if lines:
        text += " (" + "; ".join(lines[-3:]) + ")"
    return text


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def sign(result: dict, key: bytes) -> str:
    payload = json.dumps(result, sort_keys=True, default=str)
    return hmac.new(key, payload.encode(), "sha256").hexdigest()


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def combine_cases(label: str, per_case: list[tuple[dict, dict]]) -> tuple[dict, dict]:
    """One figure for several timed cases: geometric means of the candidate's, each baseline's
    and the reference's times (a baseline missing at any case is left out) and of the floors;
    every case's own timings and roofline are kept under ``cases``."""
    timings = [t for t, _ in per_case]
    roofs = [r for _, r in per_case]
    names = [n for n in timings[0]["baselines"] if all(n in t["baselines"] for t in timings)]
    combined: dict[str, Any] = {
        "case": label,
        "candidate_us": geomean([t["candidate_us"] for t in timings]),
        "baselines": {n: geomean([t["baselines"][n] for t in timings]) for n in names},
        "reference_us": geomean([t["reference_us"] for t in timings]) if all(t.get("reference_us") for t in timings) else None,
        "compile_s": timings[0].get("compile_s"),
        "rounds": min(t["rounds"] for t in timings),
        "timer": timings[0]["timer"],
        "host_us": max((t["host_us"] for t in timings if t.get("host_us") is not None), default=None),
        "cases": timings,
    }
    if names:
        combined["baseline"] = names[0]
    errors = {k: v for t in timings for k, v in (t.get("baseline_errors") or {}).items()}
    if errors:
        combined["baseline_errors"] = errors
    floor_us = geomean([r["floor_us"] for r in roofs])
    roof = {"floor_us": floor_us, "floor_fraction": floor_us / combined["candidate_us"], "achieved_GBps": None,
            "achieved_TFLOPs": None, "ceilings": roofs[0].get("ceilings"), "cases": roofs}
    return combined, roof


class Judge:
    """One evaluation. ``run()`` returns the result dict (see docs/architecture.md)."""

    def __init__(self, problem: Any, candidate: Path, *, upto: str, quick: bool, seed: int | None, progress: Path | None,
                 hypothesis: bool = True) -> None:
        import torch

        from . import checks

        self.torch = torch
        self.problem = problem
        self.candidate = candidate
        self.upto = upto
        self.quick = quick
        self.hypothesis = hypothesis  # False: the file passed the random-shape sweep in an earlier evaluation
        self.progress = progress
        self.rng = random.Random(seed) if seed is not None else secrets.SystemRandom()
        self.cuda = torch.cuda.is_available()
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.device_name = torch.cuda.get_device_name() if self.cuda else "cpu (Triton interpreter)"
        self.monitor = checks.LaunchMonitor()
        self.monitor.install()
        self.tamper: checks.TamperCheck | None = None
        self.kernel: Any = None
        self.first_call_s: dict[str, float] = {}
        self.timed: tuple[dict, dict] | None = None  # (case, live inputs) the profile stage reuses
        self.output_names = [o.name for o in problem.outputs]
        # where the child's time goes (result["seconds"]): a loop's throughput is candidates per hour
        self.seconds: dict[str, float] = {}
        self._stage_started: tuple[str, float] | None = None
        self.tolerance = {o.name: o.tolerance for o in problem.outputs}
        self.result: dict[str, Any] = {
            "verdict": "fail", "stage": "compile", "reasons": [], "problem": problem.name, "device": self.device_name,
            "upto": upto, "quick": quick, "errors": [], "timings": None, "speedup": None, "roofline": None,
            "profile": None, "benchmarks": [], "notes": [],
        }

    # ---- small helpers ------------------------------------------------------------------
    def seed(self) -> int:
        return self.rng.getrandbits(62)

    def enter(self, stage: str) -> None:
        self.close_stage()
        self._stage_started = (stage, time.perf_counter())
        self.result["stage"] = stage
        if self.progress is not None:
            with open(self.progress, "a") as fh:
                fh.write(json.dumps({"stage": stage, "time": time.time()}) + "\n")

    def close_stage(self) -> None:
        if self._stage_started is not None:
            stage, started = self._stage_started
            self.seconds[f"stage:{stage}"] = self.seconds.get(f"stage:{stage}", 0.0) + time.perf_counter() - started
            self._stage_started = None

    @contextlib.contextmanager
    def spent(self, key: str):
        """Add the wall time of the block to ``seconds[key]``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - start

    def reference(self, inputs: dict) -> Any:
        with self.spent("reference"):
            return self.problem.reference(**inputs)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def make(self, case: dict) -> dict:
        with self.spent("inputs"):
            return self.problem.make_inputs(case, device=str(self.device), seed=self.seed())

    def label(self, case: dict) -> str:
        return self.problem.describe(case)

    def tampered(self) -> list[str]:
        changes = self.tamper.changes() if self.tamper else []
        return [f"the candidate patched the harness: {', '.join(changes[:5])}"] if changes else []

    def add_errors(self, case_label: str, errors: list) -> list[str]:
        reasons = []
        for e in errors:
            self.result["errors"].append({"case": case_label, "output": e.name, "rel_rms": e.rel_rms if math.isfinite(e.rel_rms) else None,
                                          "tolerance": e.tolerance, "ok": e.ok})
            if not e.ok:
                reasons.append(e.reason)
        return reasons

    # ---- one guarded call ----------------------------------------------------------------
    def call(self, inputs: dict) -> Any:
        """Call the candidate under the dispatch guard; returns (outputs, honesty reasons, seconds)."""
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        from .checks import CallGuard, inspect_call, snapshot_inputs

        torch = self.torch
        before = snapshot_inputs(inputs)
        self.sync()
        self.monitor.reset()
        guard = CallGuard(poison_fresh=True)
        stream = torch.cuda.current_stream() if self.cuda else None
        guard.expected_stream = self.monitor.expected_stream = stream
        start = time.perf_counter()
        mode_lost = False
        try:
            with self.spent("checked_calls"):
                with guard:
                    outputs = self.kernel(**inputs)
                    mode_lost = guard not in _get_current_dispatch_mode_stack()
                self.sync()
        except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are candidate faults too
            text = describe_exception(exc, self.candidate)
            raise CandidateError(f"the candidate raised {text}", fatal=any(m in text for m in FATAL_MARKERS)) from None
        finally:
            self.monitor.expected_stream = None
        seconds = time.perf_counter() - start
        outputs, malformed = self.plain_outputs(outputs)
        if outputs is None:
            return None, malformed, seconds
        reasons = inspect_call(outputs=outputs, output_names=self.output_names, inputs=inputs, before=before, guard=guard,
                               monitor=self.monitor, expected_dtypes=self.problem.expected_dtypes(inputs), device=self.device)
        if mode_lost:
            reasons.append("the candidate switched off the judge's dispatch guard")
        reasons += self.tampered()
        return outputs, reasons, seconds

    def plain_outputs(self, outputs: Any) -> tuple[Any, list[str]]:
        """Outputs as a plain tuple of plain tensors (or None). A tensor subclass or a tuple
        subclass could answer the judge's own arithmetic with anything, so neither is read."""
        torch = self.torch
        if type(outputs) is torch.Tensor:
            outputs = (outputs,)
        if type(outputs) not in (tuple, list):
            return None, [f"kernel(...) returned a {type(outputs).__name__}: it must return a tuple of tensors ({', '.join(self.output_names)})"]
        reasons = []
        for name, out in zip(self.output_names, outputs):
            if out is not None and type(out) is not torch.Tensor:
                reasons.append(f"output {name} is of type {type(out).__name__}, not a plain torch.Tensor")
        if reasons:
            return None, reasons
        return tuple(outputs), []

    def clone_outputs(self, outputs: Any) -> Any:
        torch = self.torch
        if isinstance(outputs, (tuple, list)):
            return tuple(o.detach().clone() if isinstance(o, torch.Tensor) else o for o in outputs)
        return outputs.detach().clone() if isinstance(outputs, torch.Tensor) else outputs

    # ---- stages ----------------------------------------------------------------------------
    def stage_compile(self, smoke_inputs: dict) -> Any:
        self.enter("compile")
        from . import checks

        self.tamper = checks.TamperCheck(checks.judge_namespaces(self.problem))
        start = time.perf_counter()
        try:
            spec = importlib.util.spec_from_file_location("kopt_candidate", self.candidate)
            module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            sys.modules["kopt_candidate"] = module
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        except BaseException as exc:  # noqa: BLE001
            raise StageFailed("compile", [f"importing the candidate failed: {describe_exception(exc, self.candidate)}"]) from None
        import_s = time.perf_counter() - start
        self.kernel = getattr(module, "kernel", None)
        if not callable(self.kernel):
            raise StageFailed("compile", ["the candidate defines no callable kernel(...)"])
        patched = self.tampered()
        if patched:
            raise StageFailed("compile", patched)
        try:
            first = self.call(smoke_inputs)
        except CandidateError as exc:
            raise StageFailed("compile", [f"first call on {self.label(self.problem.smoke_case)}: {exc.reason}"]) from None
        self.first_call_s[self.label(self.problem.smoke_case)] = first[2]
        self.result["compile"] = {"import_s": import_s, "first_call_s": first[2]}
        return first

    def check_explicit(self, case: dict, inputs: dict | None = None, first: Any = None) -> list[str]:
        """Two calls: fresh inputs, then the reference, then new data at the same addresses."""
        torch = self.torch
        label = self.label(case)
        if inputs is None:
            inputs = self.make(case)
        if first is None:
            first = self.call(inputs)
            self.first_call_s.setdefault(label, first[2])
        outputs, honesty, _ = first
        saved = self.clone_outputs(outputs)
        del outputs, first
        reasons = [f"{label}: {r}" for r in honesty]
        if saved is None:
            return reasons
        expected = self.reference(inputs)
        reasons += [f"{label}: {r}" for r in self.add_errors(label, self.problem.compare(saved, expected))]
        del expected, saved
        if reasons:
            return reasons
        fresh = self.make(case)
        for key, value in fresh.items():
            if isinstance(value, torch.Tensor) and isinstance(inputs.get(key), torch.Tensor):
                inputs[key].copy_(value)
            else:
                inputs[key] = value
        del fresh
        expected = self.reference(inputs)
        again = f"{label} (second call: new data at the same addresses)"
        outputs, honesty, _ = self.call(inputs)
        reasons += [f"{again}: {r}" for r in honesty]
        if outputs is not None:
            reasons += [f"{again}: {r}" for r in self.add_errors(again, self.problem.compare(outputs, expected))]
        return reasons

    def check_example(self, case: dict) -> list[str]:
        label = self.label(case)
        inputs = self.make(case)
        outputs, honesty, _ = self.call(inputs)
        if outputs is None:
            return honesty
        saved = self.clone_outputs(outputs)
        del outputs
        expected = self.reference(inputs)
        errors = self.problem.compare(saved, expected)
        bad = [e.reason for e in errors if not e.ok]
        if honesty or bad:
            self.add_errors(label, errors)
        return honesty + bad

    def stage_correctness(self, smoke_inputs: dict, first: Any) -> None:
        self.enter("correctness")
        problem = self.problem
        cases = [problem.smoke_case]
        if self.cuda and problem.headline_cases:
            explicit = list(problem.headline_cases[:1] if self.quick else problem.headline_cases)
            cases += explicit + [c for c in problem.timed_cases(str(self.device)) if c not in explicit]
        reasons: list[str] = []
        try:
            reasons += self.check_explicit(problem.smoke_case, smoke_inputs, first)
            for case in cases[1:]:
                if reasons:
                    break
                reasons += self.check_explicit(case)
        except CandidateError as exc:
            raise StageFailed("correctness", [f"{exc.reason}"]) from None
        if reasons:
            raise StageFailed("correctness", reasons)
        self.result["correctness"] = {"explicit_cases": [self.label(c) for c in cases]}
        if self.hypothesis:
            self.hypothesis_cases()
        else:
            self.result["correctness"].update(hypothesis_examples=0, hypothesis_skipped="this file passed the sweep in an earlier evaluation")

    def hypothesis_cases(self) -> None:
        """Random shapes from the problem's strategy; on failure, hypothesis shrinks to the
        smallest failing case it can find within the time budget."""
        from hypothesis import HealthCheck, Phase, given, settings
        from hypothesis import seed as hypothesis_seed

        examples = (3 if self.quick else 10) if not self.cuda else (6 if self.quick else 25)
        budget_s = 60.0 if self.quick else 240.0
        deadline = time.monotonic() + budget_s
        outcomes: dict[str, list[str]] = {}
        fatal: list[str] = []
        tried = []

        class CaseFailed(Exception):
            pass

        def check(case: dict) -> None:
            key = json.dumps(case, sort_keys=True, default=str)
            if key not in outcomes:
                if fatal or time.monotonic() > deadline:
                    return  # out of time (or device lost): unseen cases are not judged
                try:
                    outcomes[key] = self.check_example(case)
                except CandidateError as exc:
                    outcomes[key] = [exc.reason]
                    if exc.fatal:
                        fatal.append(f"{self.label(case)}: {exc.reason}")
                tried.append(case)
            if outcomes[key]:
                raise CaseFailed(key)

        test = given(self.problem.case_strategy(str(self.device)))(check)
        test = settings(max_examples=examples, deadline=None, database=None, derandomize=False, print_blob=False,
                        report_multiple_bugs=False, suppress_health_check=list(HealthCheck),
                        phases=[Phase.explicit, Phase.generate, Phase.shrink])(test)
        test = hypothesis_seed(self.seed())(test)
        try:
            with self.spent("hypothesis"):
                test()
        except CaseFailed as exc:
            key = exc.args[0]
            case = json.loads(key)
            if fatal:
                raise StageFailed("correctness", fatal[:1]) from None
            lines = [f"{self.label(case)} {key}: {r}" for r in outcomes[key]]
            raise StageFailed("correctness", [f"minimal failing shape found by hypothesis: {self.label(case)}"] + lines) from None
        except Exception as exc:  # hypothesis itself gave up (e.g. flaky): report it, do not pass
            raise StageFailed("correctness", [f"property-based check could not complete: {type(exc).__name__}: {exc}"]) from None
        self.result.setdefault("correctness", {})["hypothesis_examples"] = len(tried)

    def stage_benchmark(self) -> None:
        """Time the problem's timed cases; with several, the figures are geometric means."""
        self.enter("benchmark")
        from .profile import measure_ceilings
        from ..problems.base import H200_BF16_FLOPS_PER_S, H200_COPY_BYTES_PER_S

        problem = self.problem
        if not self.cuda:
            self.result["notes"].append("CPU: timings are of the smoke case under the Triton interpreter, indicative only; "
                                        "the physical-floor check is skipped and roofline figures use the H200 ceilings")
        ceilings = {"bytes_per_s": H200_COPY_BYTES_PER_S, "flops_per_s": H200_BF16_FLOPS_PER_S, "source": "H200 defaults"}
        if self.cuda and not self.quick:
            try:
                measured = measure_ceilings(self.device)
                ceilings = {"bytes_per_s": measured["bytes_per_s"], "flops_per_s": measured["flops_per_s"], "source": "measured in this run"}
            except Exception as exc:  # keep the defaults
                self.result["notes"].append(f"could not measure ceilings: {exc}")
        per_case = []
        for case in problem.timed_cases(str(self.device)):
            timings, roof, live = self.benchmark_case(case, ceilings)
            per_case.append((timings, roof))
            if self.timed is None:
                self.timed = (case, live)  # the profile looks at the first timed case
            del live
        if len(per_case) == 1:
            self.result["timings"], self.result["roofline"] = per_case[0]
        else:
            self.result["timings"], self.result["roofline"] = combine_cases(problem.timed_label(str(self.device)), per_case)
        timings = self.result["timings"]
        if timings.get("baseline"):
            self.result["speedup"] = timings["baselines"][timings["baseline"]] / timings["candidate_us"]

    def benchmark_case(self, case: dict, ceilings: dict) -> tuple[dict, dict, dict]:
        """(timings, roofline, live inputs) of one case: the candidate on two alternating input
        sets with every timed output checked, then the baselines and the reference."""
        from . import timing
        from .profile import roofline
        from ..problems.base import H200_BF16_FLOPS_PER_S, H200_COPY_BYTES_PER_S

        torch, problem = self.torch, self.problem
        label = self.label(case)
        group = f"{problem.name} {label}"
        sets = [self.make(case), self.make(case)]
        expected = [self.reference(s) for s in sets]
        live = dict(sets[0])
        stash = [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()} for s in sets]
        del sets

        def load(which: int) -> None:
            """Set ``which``'s data into the live inputs: same tensors (addresses), new values."""
            for key, value in stash[which].items():
                if isinstance(value, torch.Tensor):
                    live[key].copy_(value)
                else:
                    live[key] = value
        state: dict[str, Any] = {"round": 0, "set": 0, "out": None, "prev": (), "first": [None, None], "bad": []}

        def setup() -> None:
            which = state["round"] % 2
            state["set"] = which
            load(which)

        def target() -> Any:
            state["out"] = self.kernel(**live)
            return state["out"]

        def teardown() -> None:
            self.sync()
            out, which = state["out"], state["set"]
            out, malformed = self.plain_outputs(out)
            if out is None:
                out = ()
                if not state["bad"]:
                    state["bad"].append(f"timed call {state['round'] + 1}: {'; '.join(malformed)}")
            if state["bad"]:
                pass
            elif any(o is not None and any(o is p for p in state["prev"]) for o in out):
                state["bad"].append(f"timed call {state['round'] + 1} returned the same object as the call before (cached result)")
            elif state["first"][which] is None:
                errors = problem.compare(out, expected[which])
                wrong = [e.reason for e in errors if not e.ok]
                if wrong:
                    state["bad"].append(f"timed call {state['round'] + 1} on {label}: {'; '.join(wrong)} (outputs of timed calls are checked too)")
                state["first"][which] = self.clone_outputs(out)
            else:
                wrong = self.timed_mismatch(out, state["first"][which], expected[which])
                if wrong:
                    state["bad"].append(f"timed call {state['round'] + 1} on {label}: {wrong} (outputs of timed calls are checked too)")
            state["prev"] = out
            state["round"] += 1

        try:
            with self.spent("timing:candidate"):
                setup()
                self.sync()
                start = time.perf_counter()
                target()
                self.sync()
                estimate = time.perf_counter() - start
                teardown()
                if self.cuda:
                    rounds = timing.rounds_for(estimate, budget_s=0.3 if self.quick else 1.0, lo=5, hi=50 if self.quick else 200)
                    warmup = 3
                else:
                    rounds, warmup = (2, 1) if self.quick else (3, 1)
                meta = timing.benchmark(target, device=self.device, name="candidate", group=group, fullname=f"{group}::candidate",
                                        rounds=rounds, warmup_rounds=warmup, setup=setup, teardown=teardown, extra_info={"role": "candidate", "case": case})
        except CandidateError as exc:
            raise StageFailed("benchmark", [exc.reason]) from None
        except BaseException as exc:  # noqa: BLE001
            text = describe_exception(exc, self.candidate)
            raise StageFailed("benchmark", [f"the candidate raised during timing: {text}"]) from None
        bad = state["bad"] + self.tampered()
        if bad:
            raise StageFailed("benchmark", bad)
        candidate_s = meta.stats.median
        self.result["benchmarks"].append(meta.as_dict(include_data=True))

        # The same inputs, timer, flush and rounds for the baselines and the reference.
        load(0)
        baselines: dict[str, float] = {}
        reference_us: float | None = None
        baseline_errors: dict[str, str] = {}
        others = [(b.name, b.fn) for b in problem.baselines(str(self.device))] + [("reference", problem.reference)]
        with self.spent("timing:baselines"):
            for name, fn in others:
                try:
                    self.sync()
                    start = time.perf_counter()
                    fn(**live)
                    self.sync()
                    one = time.perf_counter() - start
                    n = timing.rounds_for(one, budget_s=0.3 if self.quick else 1.0, lo=3, hi=rounds) if self.cuda else max(2, rounds)
                    m = timing.benchmark(lambda fn=fn: fn(**live), device=self.device, name=name, group=group, fullname=f"{group}::{name}",
                                         rounds=n, warmup_rounds=1, extra_info={"role": "reference" if name == "reference" else "baseline", "case": case})
                    self.result["benchmarks"].append(m.as_dict(include_data=True))
                    if name == "reference":
                        reference_us = m.stats.median * 1e6
                    else:
                        baselines[name] = m.stats.median * 1e6
                except Exception as exc:  # a baseline that cannot run here is reported, not fatal
                    baseline_errors[name] = f"{type(exc).__name__}: {exc}"[:300]
        candidate_us = candidate_s * 1e6
        timings = {
            "case": label, "candidate_us": candidate_us, "baselines": baselines, "reference_us": reference_us,
            "compile_s": self.first_call_s.get(label), "rounds": rounds, "timer": "cuda-events" if self.cuda else "perf_counter",
            "host_us": meta.extra_info.get("host_us"),
            "candidate_stats": {k: meta.stats.as_dict()[k] for k in ("min", "median", "mean", "iqr", "max", "rounds")},
        }
        if baseline_errors:
            timings["baseline_errors"] = baseline_errors
        if baselines:
            timings["baseline"] = next(iter(baselines))
        cost = problem.cost(case)
        roof = roofline(cost, candidate_s, bytes_per_s=ceilings["bytes_per_s"], flops_per_s=ceilings["flops_per_s"])
        roof["ceilings"]["source"] = ceilings["source"]
        if self.cuda:
            # The impossibility check uses the larger of measured and default ceilings: a fast
            # but honest kernel is never rejected because one measurement came out low.
            floor_s = cost.floor_seconds(max(ceilings["bytes_per_s"], H200_COPY_BYTES_PER_S), max(ceilings["flops_per_s"], H200_BF16_FLOPS_PER_S))
            if candidate_s < IMPOSSIBLE_MARGIN * floor_s:
                raise StageFailed("benchmark", [f"impossible time: {candidate_us:.2f} us is below the physical floor of {floor_s * 1e6:.2f} us "
                                                f"({cost.bytes / 1e6:.1f} MB / bandwidth, {cost.flops / 1e9:.2f} GFLOP / peak) for {label}"])
        return timings, roof, live

    def timed_mismatch(self, out: Any, first: Any, expected: Any) -> str | None:
        """Why a timed call's outputs are wrong: bit-identical to the checked first call is
        fine; otherwise each output must be finite and within tolerance of the reference."""
        torch = self.torch
        outs = out if isinstance(out, (tuple, list)) else (out,)
        firsts = first if isinstance(first, (tuple, list)) else (first,)
        wants = expected if isinstance(expected, (tuple, list)) else (expected,)
        if len(outs) != len(wants):
            return f"returned {len(outs)} outputs"
        from .checks import _same_bits

        for name, got, ref, want in zip(self.output_names, outs, firsts, wants):
            if want is None or got is None:
                if (want is None) != (got is None):
                    return f"{name}: None mismatch"
                continue
            if isinstance(got, torch.Tensor) and isinstance(ref, torch.Tensor) and _same_bits(got, ref):
                continue
            if not isinstance(got, torch.Tensor) or got.shape != want.shape:
                return f"{name}: wrong type or shape"
            g, w = got.double(), want.to(got.device).double()
            if not bool(torch.isfinite(g).all()):
                return f"{name}: contains NaN or Inf"
            denom = w.norm().item()
            err = (g - w).norm().item() / denom if denom else (g - w).norm().item()
            if err > self.tolerance[name]:
                return f"{name}: relative RMS error {err:.3g} > tolerance {self.tolerance[name]:.3g}"
        return None

    def stage_profile(self) -> None:
        self.enter("profile")
        from .profile import profile_kernels

        case, live = self.timed
        try:
            kernels = profile_kernels(lambda: self.kernel(**live), device=self.device, monitor=self.monitor)
        except BaseException as exc:  # noqa: BLE001
            raise StageFailed("profile", [f"the candidate raised while profiled: {describe_exception(exc, self.candidate)}"]) from None
        source = "torch.profiler device time" if self.cuda else "host time per Triton launch under the interpreter (indicative only)"
        self.result["profile"] = {"case": self.label(case), "kernels": kernels, "source": source}

    # ---- the whole evaluation -------------------------------------------------------------
    def run(self) -> dict:
        start = time.perf_counter()
        stop_after = self.upto  # quick mode trims shapes and rounds, never a stage that was asked for
        last = STAGES.index(stop_after)
        try:
            smoke_inputs = self.make(self.problem.smoke_case)
            first = self.stage_compile(smoke_inputs)
            if last >= STAGES.index("correctness"):
                self.stage_correctness(smoke_inputs, first)
            del first
            if last >= STAGES.index("benchmark"):
                self.stage_benchmark()
            if last >= STAGES.index("profile"):
                self.stage_profile()
            self.result["stage"] = stop_after
            self.result["verdict"] = "pass"
        except StageFailed as failure:
            self.result["stage"] = failure.stage
            self.result["reasons"] = failure.reasons
        except Exception as exc:  # noqa: BLE001 - a bug of the judge (or a problem) is reported, never a pass
            self.result["reasons"] = [f"judge error during {self.result['stage']}: {type(exc).__name__}: {exc}",
                                      traceback.format_exc(limit=6)[-2000:]]
        self.close_stage()
        self.result["child_duration_s"] = time.perf_counter() - start
        self.result["seconds"] = {key: round(value, 6) for key, value in sorted(self.seconds.items())}
        return self.result


def main(argv: list[str] | None = None) -> int:
    key = sys.stdin.buffer.readline().strip()
    parser = argparse.ArgumentParser(prog="python -m pytest_kopt.judge.child")
    parser.add_argument("--problem", required=True)
    parser.add_argument("--problem-module")
    parser.add_argument("--problem-class")
    parser.add_argument("--candidate", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--progress", type=Path)
    parser.add_argument("--upto", default="profile", choices=STAGES[1:])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--no-hypothesis", action="store_true", help="explicit cases only: the file passed the random shapes before")
    args = parser.parse_args(argv)

    from .. import interpret

    interpret.configure()  # before any @triton.jit is defined: the candidate's kernels too
    from .problemref import resolve_problem

    problem = resolve_problem(args.problem, module=args.problem_module, qualname=args.problem_class)
    import hypothesis  # noqa: F401  - imported before the namespace snapshot, like everything the judge uses
    import pytest_benchmark.fixture  # noqa: F401

    from . import profile, timing  # noqa: F401

    result = Judge(problem, args.candidate.resolve(), upto=args.upto, quick=args.quick, seed=args.seed, progress=args.progress,
                   hypothesis=not args.no_hypothesis).run()
    result = json.loads(json.dumps(_finite(result), default=str))  # the form the parent will parse and check
    document = {"result": result, "hmac": sign(result, key)}
    args.out.write_text(json.dumps(document, default=str))
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave now: no interpreter teardown, which would run the candidate's finalizers and, after an
    # illegal address, free memory in a dead CUDA context.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
