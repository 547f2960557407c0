"""A fast stand-in world for loop tests: a fake problem, two fake families, a fake judge.

The judge here reads a candidate's knobs and returns a deterministic verdict and time, so a
run's course depends only on the seed: a resumed run can be compared with an uninterrupted one.
Run as a script it is the child process the kill-and-resume tests start and kill::

    python tests/kopt_fake_run.py RUN_DIR BUDGET [--resume] [--seed N] [--delay S] [--workers N] [--executor local|ray]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_kopt.families import parse_family  # noqa: E402

SLOW = '''"""Fake family: the slow baseline."""
# kopt:knobs-begin
KNOBS = {"BLOCK": 32, "num_warps": 4}
# kopt:knobs-end
SPACE = {"BLOCK": [16, 32, 64, 128], "num_warps": [1, 2, 4, 8]}


def kernel(x):
    return x
'''

FAST = '''"""Fake family: a faster pipeline with a chunk size."""
# kopt:knobs-begin
KNOBS = {"CHUNK": 64, "num_warps": 4, "fuse": False}
# kopt:knobs-end
SPACE = {"CHUNK": [16, 32, 64, 128], "num_warps": [2, 4, 8], "fuse": [False, True]}


def kernel(x):
    return x
'''

BROKEN = '''"""Fake family whose every candidate fails to compile (the fake judge says so)."""
# kopt:knobs-begin
KNOBS = {"BLOCK": 32}
# kopt:knobs-end
SPACE = {"BLOCK": [16, 32]}


def kernel(x):
    raise SyntaxError("pretend this does not compile")
'''


def fake_time(source: str) -> tuple[str, str, float | None]:
    """(verdict, stage, us) of a candidate, from its knobs alone."""
    try:
        fam = parse_family(source)
    except Exception:
        return "fail", "compile", None
    k = fam.knobs
    if "CHUNK" in k:
        if k["CHUNK"] == 128 and k["num_warps"] == 2:
            return "fail", "correctness", None  # "the kernel cannot serve this combination"
        return "pass", "benchmark", 100.0 + abs(k["CHUNK"] - 32) * 1.5 + (8 - k["num_warps"]) * 3 - (7.0 if k["fuse"] else 0.0)
    if "BLOCK" in k and "num_warps" in k:
        if k["BLOCK"] == 128 and k["num_warps"] == 1:
            return "fail", "correctness", None
        return "pass", "benchmark", 1000.0 - k["BLOCK"] * 2 + k["num_warps"] * 5
    return "fail", "compile", None


class FakeJudge:
    """Deterministic judge; counts its calls; ``delay`` seconds per evaluation (``spread``: 1 to 3 times
    that, by candidate and stage, so that evaluations in flight together land out of order)."""

    def __init__(self, delay: float = 0.0, spread: bool = False):
        self.delay = delay
        self.spread = spread
        self.calls: list[tuple[str, str]] = []

    def __call__(self, problem_name: str, candidate_path: str, *, upto: str = "profile", timeout_s: float = 900.0, **_: object) -> dict:
        source = Path(candidate_path).read_text()
        self.calls.append((Path(candidate_path).stem, upto))
        if self.delay:
            time.sleep(self.delay * (1 + int(hashlib.sha256(f"{candidate_path}{upto}".encode()).hexdigest(), 16) % 3 if self.spread else 1))
        verdict, stage, us = fake_time(source)
        if verdict == "fail":
            return {"verdict": "fail", "stage": stage, "reasons": [f"fake {stage} failure"], "errors": [{"case": "c", "output": "o", "rel_rms": float("inf"), "tolerance": 0.01, "ok": False}] if stage == "correctness" else []}
        result = {"verdict": "pass", "stage": "correctness", "reasons": [], "errors": [{"case": "c", "output": "o", "rel_rms": 1e-4, "tolerance": 0.01, "ok": True}]}
        if upto in ("benchmark", "profile"):
            result.update(stage="benchmark", timings={"case": "fake B1", "candidate_us": us, "baselines": {"eager": 500.0}, "reference_us": 2000.0, "compile_s": 0.1}, speedup=500.0 / us, roofline={"floor_us": 50.0, "floor_fraction": 50.0 / us})
        if upto == "profile":
            result.update(stage="profile", profile={"kernels": [{"name": "k", "us": us, "calls": 1}]})
        return result


class IncumbentJudge(FakeJudge):
    """A FakeJudge with the supervisor's interface: it takes ``metric`` and ``incumbent`` and answers with
    the three figures and, beside an incumbent, the interleaved ratio incumbent time / candidate time.
    ``ratios`` overrides that ratio per candidate id (what a noisy timer would have measured):
    ``{cid: (median, lo, hi)}``; ``incumbent_error`` makes the incumbent untimeable."""

    def __init__(self, delay: float = 0.0, ratios: dict | None = None, incumbent_error: str | None = None):
        super().__init__(delay)
        self.ratios = dict(ratios or {})
        self.incumbent_error = incumbent_error
        self.asked: list[dict] = []  # the keywords of every call

    def __call__(self, problem_name: str, candidate_path: str, *, upto: str = "profile", timeout_s: float = 900.0,
                 metric: str = "eager", incumbent: str | None = None, **kwargs: object) -> dict:
        self.asked.append({"candidate": Path(candidate_path).stem, "upto": upto, "metric": metric, "incumbent": incumbent, **kwargs})
        result = super().__call__(problem_name, candidate_path, upto=upto, timeout_s=timeout_s)
        timings = result.get("timings")
        if timings is not None and kwargs.get("timing") is False:  # a profile without the benchmark stage
            result.update(timings=None, speedup=None, roofline=None)
            return result
        if timings is None:
            return result
        if kwargs.get("baselines") is False:  # the baselines and the reference not timed
            timings.update(baselines={}, reference_us=None)
            result["speedup"] = None
        us = timings["candidate_us"]
        timings.update(metric=metric, figures={"eager": us * 1.25, "device": us, "graph": us * 0.5})
        timings["candidate_us"] = timings["figures"][metric]
        result["isolation"] = {"level": "process", "runner_uid": None, "detail": "fake"}
        if incumbent is not None:
            if self.incumbent_error:
                result.update(incumbent=None, incumbent_error=self.incumbent_error)
            else:
                cid = Path(incumbent).stem
                _, _, inc_us = fake_time(Path(incumbent).read_text())
                ratio = inc_us / us
                median, lo, hi = self.ratios.get(Path(candidate_path).stem, (ratio, ratio * 0.995, ratio * 1.005))
                result["incumbent"] = {"candidate_id": cid, "figures": {"eager": inc_us * 1.25, "device": inc_us, "graph": inc_us * 0.5},
                                       "ratio": {"metric": metric, "median": median, "lo": lo, "hi": hi, "rounds": 20}}
        return result


class FakeProblem:
    """Just what the loop and the search agent read from a problem (no torch import)."""

    name = "fake"

    def __init__(self, directory: Path, broken: bool = False):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "slow.py").write_text(SLOW)
        (directory / "fast.py").write_text(FAST)
        (directory / "broken.py").write_text(BROKEN)
        (directory / "reference.py").write_text("def reference(x):\n    return x\n")
        self.baseline_candidate_path = directory / "slow.py"
        self.reference_path = directory / "reference.py"
        names = ["slow", "fast"] + (["broken"] if broken else [])
        self.families = tuple(str(directory / f"{n}.py") for n in names)

    def summary(self) -> dict:
        return {"problem": self.name, "description": "a fake problem", "signature": "kernel(x)", "outputs": [], "headline": ["fake B1"], "rules": []}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("budget", type=int)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--executor", default="local")
    parser.add_argument("--spread", action="store_true", help="evaluations take 1-3x --delay, so they land out of order")
    args = parser.parse_args(argv)

    from pytest_kopt.agents.search import SearchAgent
    from pytest_kopt.progress import Progress
    from pytest_kopt.run import Run, RunOptions

    problem = FakeProblem(args.run_dir.parent / "fake-problem", broken=True)
    options = RunOptions(problem="fake", budget=args.budget, run_dir=args.run_dir, resume=args.resume, seed=args.seed,
                         workers=args.workers, executor=args.executor)
    try:
        with Run(options, problem=problem, evaluate=FakeJudge(args.delay, spread=args.spread), progress=Progress(lambda line: print(line, flush=True))) as run:
            agent = SearchAgent(problem=problem, seed=run.options.seed, profile=True)
            outcome = run.execute(agent)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        return 130
    print(f"outcome {outcome.status} {outcome.reason} {outcome.budget_used}/{outcome.budget}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
