"""The trusted supervisor: decides the verdict of one evaluation and never runs candidate code.

    python -m pytest_kopt.judge.supervisor --result-fd N --problem P --candidate FILE [--incumbent FILE] ...

Started by ``evaluate`` (sandbox.run_supervisor). It makes every input from seeds it keeps,
computes the reference, starts the runner (the only process that imports the candidate,
isolated by sandbox.start_runner), hands it inputs through shared arenas, checks every output it
gets back, times rounds itself (rounds.py), and writes the result as JSON to ``--result-fd``, a
pipe only the caller reads. The runner's own reports (its honesty findings, CUDA-event times,
profile) are read as claims: they can fail a candidate, never pass one.

Stages: compile (the runner imports the file; first call on the smoke case), correctness
(explicit cases twice each, fresh data the second time at the same addresses; then hypothesis
shapes, at least ``min_examples`` of them, shrunk to the minimal failing one; on a GPU the runner's
warmers first compile every shape the stage will check, in parallel), benchmark (three
figures per timed case; baselines and the reference in this process), profile (the runner's
per-kernel breakdown, shown as reported).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import secrets
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

STAGES = ("policy", "compile", "correctness", "benchmark", "profile")
IMPOSSIBLE_MARGIN = 0.9  # a time below 0.9 x the physical floor cannot be real
MIN_EXAMPLES = {("cpu", False): 8, ("cpu", True): 4, ("cuda", False): 20, ("cuda", True): 6}
TARGET_EXAMPLES = {("cpu", False): 10, ("cpu", True): 5, ("cuda", False): 25, ("cuda", True): 8}


class StageFailed(Exception):
    def __init__(self, stage: str, reasons: list[str]) -> None:
        super().__init__("; ".join(reasons))
        self.stage = stage
        self.reasons = reasons


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


class Supervisor:
    """One evaluation. ``run()`` returns the result dict (docs/architecture.md pins its keys)."""

    def __init__(self, problem: Any, source: str, *, workdir: Path, upto: str, quick: bool, seed: int | None, metric: str,
                 incumbent: str | None, deadline: float, slot: int, hypothesis: bool, min_examples: int | None,
                 baselines: bool = True, time_cases: bool = True) -> None:
        import torch

        self.torch = torch
        self.problem = problem
        self.source = source
        self.workdir = workdir
        self.upto = upto
        self.quick = quick
        self.metric = metric
        self.incumbent_source = incumbent
        self.deadline = deadline
        self.slot = slot
        self.hypothesis = hypothesis
        self.time_baselines = baselines  # False: the baselines and the reference are not timed (the loop has them)
        self.time_cases = time_cases  # False: a profile without the benchmark stage (the loop timed it already)
        self.sweep_seed: int | None = None  # the random-shape sweep's (secret) seed, drawn when first needed
        self.problem_ref = problem.name  # how a runner's warmers name the problem (main() passes --problem)
        self.rng = random.Random(seed) if seed is not None else secrets.SystemRandom()
        self.cuda = torch.cuda.is_available()
        self.device = torch.device("cuda" if self.cuda else "cpu")
        kind = "cuda" if self.cuda else "cpu"
        self.min_examples = min_examples if min_examples is not None else MIN_EXAMPLES[(kind, quick)]
        self.target_examples = max(self.min_examples, TARGET_EXAMPLES[(kind, quick)])
        self.output_names = [o.name for o in problem.outputs]
        self.tolerance = {o.name: o.tolerance for o in problem.outputs}
        self.seconds: dict[str, float] = {}
        self._born = time.perf_counter()
        self.call_seconds: dict[str, float] = {}
        self._stage: tuple[str, float] | None = None
        self.client: Any = None
        self.prestarted: dict[int, Any] = {}
        self._round_trip_s: float | None = None  # ``echo_round_trip_s``, measured once when needed
        self.transport: Any = None  # the transport yardstick: a runner that loads no candidate (``transport_client``)
        self.result: dict[str, Any] = {
            "verdict": "fail", "stage": "compile", "reasons": [], "problem": problem.name,
            "device": torch.cuda.get_device_name() if self.cuda else "cpu (Triton interpreter)", "upto": upto, "quick": quick,
            "errors": [], "timings": None, "speedup": None, "roofline": None, "profile": None, "benchmarks": [], "notes": [],
            "isolation": None,
        }

    # ---- bookkeeping ---------------------------------------------------------------------
    def seed(self) -> int:
        return self.rng.getrandbits(62)

    def enter(self, stage: str) -> None:
        self.close_stage()
        self._stage = (stage, time.perf_counter())
        self.result["stage"] = stage
        self.trace(f"stage {stage}")

    def trace(self, what: str) -> None:
        """With KOPT_JUDGE_TRACE=<file>, a line appended there per stage, checked call and timed case:
        where an evaluation that ran out of time spent it."""
        path = os.environ.get("KOPT_JUDGE_TRACE")
        if path:
            with open(path, "a") as trace:
                trace.write(f"[{self.problem.name} pid {os.getpid()} {time.perf_counter() - self._born:7.1f} s] {what}\n")

    def close_stage(self) -> None:
        if self._stage is not None:
            stage, started = self._stage
            self.seconds[f"stage:{stage}"] = self.seconds.get(f"stage:{stage}", 0.0) + time.perf_counter() - started
            self._stage = None

    def spent(self, key: str, started: float) -> None:
        self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - started

    def make(self, case: dict) -> dict:
        started = time.perf_counter()
        try:
            return self.problem.make_inputs(case, device=str(self.device), seed=self.seed())
        finally:
            self.spent("inputs", started)

    def reference(self, inputs: dict) -> Any:
        started = time.perf_counter()
        try:
            return self.problem.reference(**inputs)
        finally:
            self.spent("reference", started)

    def timed_reference(self, inputs: dict) -> Any:
        started = time.perf_counter()
        try:
            return self.problem.timed_reference(**inputs)
        finally:
            self.spent("reference", started)

    def label(self, case: dict) -> str:
        return self.problem.describe(case)

    # ---- runners ---------------------------------------------------------------------------
    def start_client(self, source: str, slot: int) -> Any:
        """A client for the runner of ``source``: the one main() started early, or a new one."""
        from .client import RunnerClient, RunnerFailure

        process = self.prestarted.pop(slot, None) or start_process(source, slot, self.workdir)
        if slot == self.slot:
            self.result["isolation"] = {"level": process.level, "runner_uid": process.uid, "detail": process.detail,
                                        "why": process.notes[0] if process.notes else ""}
        client = RunnerClient(process, self.device, self.deadline, source)
        try:
            client.info = client.request("hello", timeout=180)
        except RunnerFailure:
            client.close()
            raise
        if client.info.get("device") != str(self.device):
            client.close()
            raise RunnerFailure(f"the runner sees device {client.info.get('device')!r}, the supervisor {self.device}")
        return client

    def echo_round_trip_s(self) -> float:
        """A trusted request round trip (rounds.echo_round_trip; none on the CPU), measured once and
        recorded in the result: part of the transport taken off when there is no yardstick."""
        if self._round_trip_s is None:
            from .rounds import echo_round_trip

            self._round_trip_s = echo_round_trip() if self.cuda else 0.0
            self.result["round_trip_us"] = self._round_trip_s * 1e6
        return self._round_trip_s

    def transport_client(self) -> Any:
        """The runner that measures the transport of a timed round (``Runner.do_null``: it loads no
        candidate), started once per evaluation (main() starts it early, beside the candidate's), as
        a user of its own. None, with a note, when it cannot start: rounds then fall back to the
        echo round trip and the store measured here."""
        from .client import RunnerFailure

        if not (self.cuda or os.environ.get("KOPT_TRANSPORT_YARDSTICK")):
            return None  # CPU timings are indicative only: no third process on a small machine (tests force it)
        if self.transport is None:
            try:
                self.transport = self.start_client(TRANSPORT_SOURCE, self.slot + 2)
                self.transport.request("null")
            except (RunnerFailure, OSError, RuntimeError) as exc:
                self.result["notes"].append(f"no transport yardstick ({getattr(exc, 'reason', None) or exc}): the echo round trip and "
                                            "the store are taken off each timed round instead")
                if self.transport is not None:
                    self.transport.close()
                self.transport = False
        return self.transport or None

    def load(self, client: Any, source: str) -> float:
        from .client import RunnerFailure

        try:
            return float(client.request("load", source=source)["import_s"])
        except RunnerFailure as failure:
            raise StageFailed("compile", [failure.reason]) from None

    # ---- one checked call --------------------------------------------------------------
    def checked_call(self, slots: Any, inputs: dict, expected: Any, label: str) -> list[str]:
        """Write ``inputs`` into slot 0, call, check the outputs; returns what was wrong."""
        from .client import RunnerFailure

        slots.write(0, inputs)
        if self.cuda:
            self.torch.cuda.synchronize()
        started = time.perf_counter()
        try:
            reply = self.client.request("call", slot=slots.slot_id(0), values=slots.values_for([0]))
        except RunnerFailure as failure:
            raise CandidateFault(failure.reason, fatal=failure.fatal) from None
        finally:
            self.spent("checked_calls", started)
        seconds = reply.get("seconds")
        if isinstance(seconds, (int, float)) and label not in self.call_seconds:
            self.call_seconds[label] = float(seconds)
        elif isinstance(seconds, (int, float)):
            self.call_seconds[label] = min(self.call_seconds[label], float(seconds))
        self.trace(f"checked call {label}: {time.perf_counter() - started:.2f} s (runner {seconds:.3f} s)"
                   if isinstance(seconds, (int, float)) else f"checked call {label}: the runner gave no time")
        slots.take_snapshot()
        outputs, problems = slots.outputs(0, reply.get("outputs"))
        honesty = reply.get("honesty")
        reasons = [str(r)[:500] for r in honesty[:10]] if isinstance(honesty, list) else ["the runner sent no honesty report"]
        reasons += problems
        changed = slots.inputs_intact(0, inputs)
        if changed:
            reasons.append(f"input(s) {', '.join(changed)} were modified by the call: inputs must be left unchanged")
        if not problems:
            errors = self.problem.compare(tuple(outputs), expected)
            for e in errors:
                self.result["errors"].append({"case": label, "output": e.name, "rel_rms": e.rel_rms if math.isfinite(e.rel_rms) else None,
                                              "tolerance": e.tolerance, "ok": e.ok})
            reasons += [e.reason for e in errors if not e.ok]
        return reasons

    def timed_errors(self, outputs: list[Any], expected: Any) -> list[str]:
        """What is wrong with a timed call's outputs: the problem's own comparison, computed on the
        device in float64 when the problem keeps the default one (timed outputs are many)."""
        from ..problems.base import Problem

        if type(self.problem).compare is not Problem.compare:
            return [e.reason for e in self.problem.compare(tuple(outputs), expected) if not e.ok]
        torch = self.torch
        wrong = []
        for spec, got, want in zip(self.problem.outputs, outputs, expected):
            if want is None or got is None:
                if (want is None) != (got is None):
                    wrong.append(f"{spec.name}: expected {'None' if want is None else 'a tensor'}")
                continue
            if tuple(got.shape) != tuple(want.shape):
                wrong.append(f"{spec.name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
                continue
            g, w = got.double(), want.to(got.device).double()
            if not bool(torch.isfinite(g).all()):
                wrong.append(f"{spec.name}: contains NaN or Inf")
                continue
            denom = w.norm().item()
            err = (g - w).norm().item() / denom if denom else (g - w).norm().item()
            if err > spec.tolerance:
                wrong.append(f"{spec.name}: relative RMS error {err:.3g} > tolerance {spec.tolerance:.3g}")
        return wrong

    def slots_for(self, sample: dict, expected: Any, tag: str) -> Any:
        from .client import CaseSlots

        return CaseSlots(self.client, sample, expected, self.output_names, self.problem.expected_dtypes(sample), 1, tag)

    def check_explicit(self, case: dict, tag: str) -> list[str]:
        """Two calls: fresh inputs, then new data at the same addresses."""
        label = self.label(case)
        inputs = self.make(case)
        expected = self.reference(inputs)
        slots = self.slots_for(inputs, expected, tag)
        try:
            reasons = [f"{label}: {r}" for r in self.checked_call(slots, inputs, expected, label)]
            if reasons:
                return reasons
            inputs = self.make(case)
            expected = self.reference(inputs)
            again = f"{label} (second call: new data at the same addresses)"
            return [f"{again}: {r}" for r in self.checked_call(slots, inputs, expected, label)]
        finally:
            slots.release()

    def check_example(self, case: dict, tag: str) -> list[str]:
        inputs = self.make(case)
        expected = self.reference(inputs)
        slots = self.slots_for(inputs, expected, tag)
        try:
            return self.checked_call(slots, inputs, expected, self.label(case))
        finally:
            slots.release()

    # ---- stages ------------------------------------------------------------------------
    def stage_compile(self) -> None:
        self.enter("compile")
        from .client import RunnerFailure

        try:
            self.client = self.start_client(self.source, self.slot)
        except RunnerFailure as failure:
            raise StageFailed("compile", [f"the runner could not start: {failure.reason}"]) from None
        import_s = self.load(self.client, self.source)
        case = self.problem.smoke_case
        started = time.perf_counter()
        try:
            inputs = self.make(case)
            expected = self.reference(inputs)
            self.smoke_slots = self.slots_for(inputs, expected, "smoke")
            self.first_reasons = [f"{self.label(case)}: {r}" for r in self.checked_call(self.smoke_slots, inputs, expected, self.label(case))]
        except CandidateFault as fault:
            raise StageFailed("compile", [f"first call on {self.label(case)}: {fault.reason}"]) from None
        self.result["compile"] = {"import_s": import_s, "first_call_s": time.perf_counter() - started}

    def stage_correctness(self) -> None:
        self.enter("correctness")
        problem = self.problem
        cases = [c for c in problem.correctness_cases(str(self.device), quick=self.quick)]
        reasons = list(self.first_reasons)
        try:
            if not reasons and self.hypothesis:  # without the sweep, the file was judged before: its cache is warm
                self.warm([*cases, *self.sweep_plan()])
            if not reasons:  # the smoke case's second call: new data at the same addresses
                inputs = self.make(problem.smoke_case)
                expected = self.reference(inputs)
                again = f"{self.label(problem.smoke_case)} (second call: new data at the same addresses)"
                reasons += [f"{again}: {r}" for r in self.checked_call(self.smoke_slots, inputs, expected, self.label(problem.smoke_case))]
            self.smoke_slots.release()
            for n, case in enumerate(cases):
                if reasons:
                    break
                reasons += self.check_explicit(case, f"explicit{n}")
        except CandidateFault as fault:
            raise StageFailed("correctness", [fault.reason]) from None
        if reasons:
            raise StageFailed("correctness", reasons)
        self.result["correctness"] = {"explicit_cases": [self.label(c) for c in [problem.smoke_case, *cases]]}
        if self.hypothesis:
            self.hypothesis_cases()
        else:
            self.result["correctness"].update(hypothesis_examples=0, hypothesis_skipped="this file passed the sweep in an earlier evaluation")

    def sweep(self, check: Any) -> Any:
        """``check`` as the random-shape sweep runs it: hypothesis over the problem's strategy, with
        this evaluation's secret sweep seed (the same shapes each time it is run, while they pass)."""
        from hypothesis import HealthCheck, Phase, given, settings
        from hypothesis import seed as hypothesis_seed

        if self.sweep_seed is None:
            self.sweep_seed = self.seed()
        test = given(self.problem.case_strategy(str(self.device)))(check)
        test = settings(max_examples=self.target_examples, deadline=None, database=None, derandomize=False, print_blob=False,
                        report_multiple_bugs=False, suppress_health_check=list(HealthCheck),
                        phases=[Phase.explicit, Phase.generate, Phase.shrink])(test)
        return hypothesis_seed(self.sweep_seed)(test)

    def sweep_plan(self) -> list[dict]:
        """The shapes the sweep will draw first (a dry run of it: nothing is called)."""
        planned: list[dict] = []
        seen: set[str] = set()

        def record(case: dict) -> None:
            key = json.dumps(case, sort_keys=True, default=str)
            if key not in seen:
                seen.add(key)
                planned.append(dict(case))

        try:
            self.sweep(record)()
        except Exception:  # noqa: BLE001 - a plan is only a hint for the warmers
            pass
        return planned

    def warm(self, cases: list[dict]) -> None:
        """Compile ahead: the runner's warmers (``Runner.do_warm``) call the candidate once on each
        shape the stage will check, in parallel, so the checked calls find its Triton cache full.
        On a GPU (``KOPT_WARM_WORKERS``: how many; 0 turns it off; it forces it on the CPU, for
        tests). Only a time saver: what is judged is the checked calls that follow."""
        from .client import RunnerFailure
        from .problemref import hints

        default = min(4, max(1, (os.cpu_count() or 2) // 4)) if self.cuda else 0
        try:
            workers = int(os.environ.get("KOPT_WARM_WORKERS", default))
        except ValueError:
            self.result["notes"].append(f"KOPT_WARM_WORKERS={os.environ['KOPT_WARM_WORKERS']!r} is not a whole number: "
                                        f"{default} warmers used")
            workers = default
        shapes: dict[str, dict] = {}
        for case in cases:
            shape = {k: v for k, v in case.items() if k != "dist"}  # a distribution changes values, not kernels
            shapes.setdefault(json.dumps(shape, sort_keys=True, default=str), case)
        if workers <= 0 or not shapes:
            return
        module, qualname = hints(self.problem)
        started = time.perf_counter()
        limit_s = min(120.0, self.deadline - time.monotonic() - 60.0)
        if limit_s < 10.0:
            return
        try:
            reply = self.client.request("warm", cases=list(shapes.values()), workers=workers, limit_s=limit_s, timeout=limit_s + 30.0,
                                        problem={"ref": self.problem_ref, "module": module, "qualname": qualname})
        except RunnerFailure as failure:
            if failure.fatal:
                raise CandidateFault(failure.reason, fatal=True) from None
            self.result["notes"].append(f"the compile-ahead warmers failed: {failure.reason}"[:300])
            return
        finally:
            self.spent("warm", started)
        rows = reply.get("warmed") if isinstance(reply.get("warmed"), list) else []
        failed = sum(1 for r in rows if isinstance(r, dict) and r.get("error"))  # the runner's word: shown, never weighed
        self.result["warm"] = {"shapes": [self.label(c) for c in shapes.values()], "workers": workers,
                               "seconds": time.perf_counter() - started, "failed": failed}
        self.trace(f"warmed {len(shapes)} shapes with {workers} workers in {time.perf_counter() - started:.1f} s ({failed} raised)")

    def hypothesis_cases(self) -> None:
        """Random shapes from the problem's strategy, at least ``min_examples`` of them; on failure
        hypothesis shrinks to the smallest failing case it can find in the time left."""
        budget_s = 90.0 if self.quick else 300.0
        deadline = min(time.monotonic() + budget_s, self.deadline - 30)
        outcomes: dict[str, list[str]] = {}
        fatal: list[str] = []
        tried: list[dict] = []
        cut_short = []

        class CaseFailed(Exception):
            pass

        def check(case: dict) -> None:
            key = json.dumps(case, sort_keys=True, default=str)
            if key not in outcomes:
                if fatal:
                    return
                if time.monotonic() > deadline:
                    cut_short.append(key)
                    return  # out of time: unseen cases are not judged (and a short sweep fails below)
                try:
                    outcomes[key] = self.check_example(case, f"h{len(tried)}")
                except CandidateFault as fault:
                    outcomes[key] = [fault.reason]
                    if fault.fatal:
                        fatal.append(f"{self.label(case)}: {fault.reason}")
                tried.append(case)
            if outcomes[key]:
                raise CaseFailed(key)

        test = self.sweep(check)
        started = time.perf_counter()
        try:
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
        finally:
            self.spent("hypothesis", started)
        if cut_short and len(tried) < self.min_examples:
            raise StageFailed("correctness", [f"the random-shape sweep judged only {len(tried)} shape(s) before its time ran out; "
                                              f"at least {self.min_examples} are required (a shape that stalls the kernel fails it)"])
        self.result["correctness"]["hypothesis_examples"] = len(tried)

    def stage_benchmark(self) -> None:
        from .bench import benchmark_stage

        self.enter("benchmark")
        benchmark_stage(self)

    def stage_profile(self) -> None:
        self.enter("profile")
        from .client import RunnerFailure

        case = self.problem.timed_cases(str(self.device))[0]
        inputs = self.make(case)
        expected = self.reference(inputs)
        slots = self.slots_for(inputs, expected, "profile")
        try:
            slots.write(0, inputs)
            reply = self.client.request("profile", slot=slots.slot_id(0), values=slots.values_for([0]))
        except RunnerFailure as failure:
            raise StageFailed("profile", [failure.reason]) from None
        finally:
            slots.release()
        kernels = []
        for row in reply.get("kernels") or []:
            if isinstance(row, dict) and isinstance(row.get("name"), str) and isinstance(row.get("us"), (int, float)):
                kernels.append({"name": row["name"][:200], "us": float(row["us"]), "calls": float(row.get("calls") or 0)})
        source = "torch.profiler device time" if self.cuda else "host time per Triton launch under the interpreter (indicative only)"
        self.result["profile"] = {"case": self.label(case), "kernels": kernels[:40], "source": source + ", as the runner reported it"}

    # ---- the whole evaluation -------------------------------------------------------------
    def run(self) -> dict:
        start = time.perf_counter()
        last = STAGES.index(self.upto)
        from . import candidate_id

        self.trace(f"evaluation of candidate {candidate_id(self.source)}: up to {self.upto}{', quick' if self.quick else ''}, metric {self.metric}")
        try:
            self.stage_compile()
            if last >= STAGES.index("correctness"):
                self.stage_correctness()
            elif self.first_reasons:
                raise StageFailed("compile", self.first_reasons)
            if last >= STAGES.index("benchmark") and (self.time_cases or self.upto != "profile"):
                self.stage_benchmark()
            if last >= STAGES.index("profile"):
                self.stage_profile()
            self.result["stage"] = self.upto
            self.result["verdict"] = "pass"
        except StageFailed as failure:
            self.result["stage"] = failure.stage
            self.result["reasons"] = failure.reasons
        except CandidateFault as fault:
            self.result["reasons"] = [fault.reason]
        except Exception as exc:  # noqa: BLE001 - a bug of the judge (or a problem) is reported, never a pass
            self.result["reasons"] = [f"judge error during {self.result['stage']}: {type(exc).__name__}: {exc}",
                                      traceback.format_exc(limit=8)[-2500:]]
        finally:
            for client in (self.client, getattr(self, "incumbent_client", None), self.transport):
                if client is not None:
                    client.close()
            for process in self.prestarted.values():
                process.close()
        self.close_stage()
        self.result["child_duration_s"] = time.perf_counter() - start
        self.result["seconds"] = {key: round(value, 6) for key, value in sorted(self.seconds.items())}
        return self.result


TRANSPORT_SOURCE = "# the transport yardstick: a runner that loads no candidate\n"


class CandidateFault(Exception):
    """A call through the runner failed (the candidate raised, crashed or hung)."""

    def __init__(self, reason: str, fatal: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.fatal = fatal


def start_process(source: str, slot: int, workdir: Path) -> Any:
    """Start a runner for ``source`` at the strongest isolation this machine allows."""
    import hashlib

    from .sandbox import choose_level, start_runner

    level, why = choose_level()
    # the Triton cache kept for this source: the whole digest names it (12 hex digits let two files be made to share
    # one, and so what the first one wrote run as the second)
    process = start_runner(device="auto", slot=slot, level=level, cache_key=hashlib.sha256(source.encode()).hexdigest(), private=workdir)
    process.notes.insert(0, why)
    return process


def main(argv: list[str] | None = None) -> int:
    from . import proctree
    from .sandbox import die_with_parent

    parser = argparse.ArgumentParser(prog="python -m pytest_kopt.judge.supervisor")
    parser.add_argument("--result-fd", type=int, required=True)
    parser.add_argument("--problem", required=True)
    parser.add_argument("--problem-module")
    parser.add_argument("--problem-class")
    parser.add_argument("--candidate", required=True, type=Path)
    parser.add_argument("--incumbent", type=Path)
    parser.add_argument("--upto", default="profile", choices=STAGES[1:])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--metric", default="eager", choices=("eager", "device", "graph"))
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds from now, when --deadline is not given")
    parser.add_argument("--deadline", type=float, help="wall-clock time (epoch seconds) by which the result must be written")
    parser.add_argument("--slot", type=int, default=0)
    parser.add_argument("--min-examples", type=int)
    parser.add_argument("--no-hypothesis", action="store_true")
    parser.add_argument("--no-baselines", action="store_true")
    parser.add_argument("--no-timing", action="store_true")
    args = parser.parse_args(argv)
    die_with_parent()
    proctree.become_subreaper()  # what a runner detaches is re-parented here, in view (proctree)
    wall_deadline = args.deadline if args.deadline is not None else time.time() + args.timeout
    # a margin for cleaning up and writing the result before the caller's kill
    deadline = time.monotonic() + max(wall_deadline - time.time() - 3.0, 1.0)
    result_pipe = os.fdopen(args.result_fd, "w")
    source = args.candidate.read_text()
    incumbent = args.incumbent.read_text() if args.incumbent else None
    # the runners import torch and Triton while this process does the same (seconds each)
    prestarted = {args.slot: start_process(source, args.slot, args.candidate.parent)}
    if STAGES.index(args.upto) >= STAGES.index("benchmark"):
        if os.path.exists("/dev/nvidiactl") or os.environ.get("KOPT_TRANSPORT_YARDSTICK"):  # a GPU, without importing torch yet
            prestarted[args.slot + 2] = start_process(TRANSPORT_SOURCE, args.slot + 2, args.candidate.parent)
        if incumbent is not None:
            prestarted[args.slot + 1] = start_process(incumbent, args.slot + 1, args.candidate.parent)

    from .. import interpret

    interpret.configure()
    from .problemref import resolve_problem

    problem = resolve_problem(args.problem, module=args.problem_module, qualname=args.problem_class)
    supervisor = Supervisor(problem, source, workdir=args.candidate.parent, upto=args.upto, quick=args.quick, seed=args.seed,
                            metric=args.metric, incumbent=incumbent, deadline=deadline, slot=args.slot,
                            hypothesis=not args.no_hypothesis, min_examples=args.min_examples,
                            baselines=not args.no_baselines, time_cases=not args.no_timing)
    supervisor.prestarted = prestarted
    supervisor.problem_ref = args.problem
    result = supervisor.run()
    from .channel import bounded, finite

    result_pipe.write(json.dumps(bounded(finite(result)), default=str))
    result_pipe.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":  # run through the package's module, so its classes are the ones bench.py raises
    from pytest_kopt.judge import supervisor as _supervisor

    sys.exit(_supervisor.main())
