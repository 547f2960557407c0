"""The optimization loop: start or resume a run, let the agent act until the budget is spent,
and leave a run directory that is a complete record (see docs/architecture.md, Runs).

A new run times the baseline candidate first (not charged: it fixes the objective), records the
objective and the environment in ``run_started``, then hands the toolbox to the agent. A resumed
run repairs a torn log tail, rebuilds the toolbox and the agent from the log, and redoes the
tool call that was in flight when the last process died (under its own call number, so it is
charged once). Ctrl-C (or SIGTERM, as sent by ``timeout``) ends with ``run_interrupted`` and a
summary; either way the run can be continued with ``--kopt-resume``, which also starts the run
when its directory holds none yet, so a long run can be driven by repeating one command. One process owns a run at a time: ``RUN_DIR/lock`` is held
with ``fcntl.flock`` (released by the kernel when the owner dies, even by ``kill -9``).

``run_started`` and ``run_resumed`` record the agent's settings (``agent_settings``: model,
endpoint, the *name* of the key's variable, ...; never a key); a resumed run gets the last ones
recorded for its agent as defaults, so ``--kopt-resume`` needs no ``--kopt-model`` again.

The budget is the run's total of tool calls, also on resume (``--kopt-budget=+N``: N more than
the log has used). The objective's timer metric (eager, device or graph) is fixed when the run
starts; a resumed run keeps its own. A resume also logs the ``best`` event a kill between a
verdict and its best left out, so every reader of the log agrees with ``best.json``.

A run directory that cannot be written (a full disk, a read-only mount) stops the run with a
``RunError`` that says so and how to continue, after a ``run_interrupted`` event where the log
can still take one. ``--kopt-promote`` hands the best to ``pytest_kopt.promote`` when the run ends.

``--kopt-workers=N`` lets up to N evaluations run at once, each its own judge on its own worker
(``--kopt-executor=local``: threads of this process, one GPU each; ``ray``: tasks on a Ray cluster,
``--kopt-ray-address``), the rest of the loop unchanged: the agent issues calls, results land in any
order, the log records each as it lands, the best is decided in call order, and a resume redoes every
call that was in flight (docs/parallel.md). ``run_started`` and ``run_resumed`` record ``workers`` and
the ``executor``; the run ends once every call in flight is answered.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from . import KERNELS_DIR, REPO_ROOT, runstore
from . import events as ev
from .events import EventLog, dumps, is_storage_error, read_events
from .executor import EXECUTORS, Executor, ExecutorError, make_executor
from .families import FamilyError, parse_family
from .progress import Progress, fmt_us
from .promote import Promotion, promote
from .runstate import TIMER_METRICS, RunState, agent_name, machine_name, metric_of
from .tools import BudgetExhausted, Toolbox, atomic_write, candidate_id, remove_stale_temp_files

DEFAULT_BUDGET = 100
DEFAULT_SEED = 0
DEFAULT_METRIC = "eager"
DEFAULT_RESULTS_DIR = Path("results/local")  # gitignored: a new run never lands untracked beside the committed ones
IDLE_ACTS = 10  # consecutive acts without a tool call before the loop gives up on the agent
METRIC_TEXT = {
    "eager": "per-call time of back-to-back calls on fresh inputs, host time included (what a caller without CUDA graphs pays)",
    "device": "GPU time of one call with the L2 cache flushed before it (host time hidden)",
    "graph": "time of one replay of the call captured in a CUDA graph (eager where the call cannot be captured)",
}


class RunError(RuntimeError):
    """The run cannot start or continue as asked (the message says what to do)."""


class RunLocked(RunError):
    """Another process owns the run directory."""


class RunStorageError(RunError):
    """The run directory cannot be written (disk full, read-only, no permission): the run stopped."""


def pytest_command() -> str:
    """How to run pytest with the interpreter running now (a venv's, when it is one): what the hints print."""
    python = Path(sys.executable)
    try:
        shown = str(python.relative_to(Path.cwd()))
    except ValueError:
        shown = str(python)
    return f"{shlex.quote(shown)} -m pytest"


def resume_command(problem: str, run_dir: Path | str, extra: str = "") -> str:
    """The command that continues a run, as it can be typed here."""
    return f"{pytest_command()} --kopt-optimize={problem} --kopt-resume --kopt-run-dir={shlex.quote(str(run_dir))}" + (f" {extra}" if extra else "")


@dataclass
class RunOptions:
    problem: str
    budget: int | None = None  # the run's total of tool calls; None: DEFAULT_BUDGET, or the log's on resume
    budget_more: int | None = None  # --kopt-budget=+N: N calls more than the log has used
    run_dir: Path | None = None  # None: <results_dir>/<problem>-<UTC timestamp>
    resume: bool = False
    agent: str | None = None  # None: "search", or the log's on resume
    seed: int | None = None  # None: DEFAULT_SEED, or the log's on resume
    eval_timeout: float = 900.0
    min_gain: float = 0.01  # fraction a candidate must beat the best by; fixed in a new run's objective
    metric: str | None = None  # eager | device | graph; None: DEFAULT_METRIC, or the log's on resume
    promote: str | bool | None = None  # "check" (True) or "force": see pytest_kopt.promote
    retract: tuple[str, str] | None = None  # (candidate id, reason): taken out of the running for best on resume
    results_dir: Path = DEFAULT_RESULTS_DIR
    started: dict | None = field(default=None, repr=False)  # the log's run_started, once resolved
    agent_settings: dict | None = None  # the agent's settings, never a key; None: the log's last ones for the agent on resume
    workers: int = 1  # evaluations in flight at once (--kopt-workers)
    executor: str = "local"  # where they run: local | ray (--kopt-executor)
    ray_address: str | None = None  # --kopt-ray-address; None: start a local Ray instance


@dataclass
class Outcome:
    status: str  # "finished" | "interrupted"
    reason: str
    run_dir: Path
    budget: int
    budget_used: int
    best: dict | None
    best_path: Path | None = None
    promoted: Path | None = None
    promotion: Promotion | None = None  # what --kopt-promote did, or why not
    logged: bool = True  # False: the run directory could not take the end event (storage_error says why)
    storage_error: OSError | None = None

    @property
    def ok(self) -> bool:
        return self.status == "finished" and self.best is not None


def default_run_dir(problem: str, results_dir: Path) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path(results_dir) / f"{problem}-{stamp}"


def _events(run_dir: Path) -> list[dict]:
    log = run_dir / "events.jsonl"
    return read_events(log) if log.is_file() else []


def recorded_settings(events: list[dict], agent: str) -> dict | None:
    """The settings ``agent`` last ran with in this log (``run_started`` or ``run_resumed``)."""
    return RunState.fold(events).agent_settings.get(agent)


def _check_options(options: RunOptions) -> None:
    for name, value in (("--kopt-budget", options.budget), ("--kopt-budget=+N", options.budget_more)):
        if value is not None and value < 0:
            raise RunError(f"{name} must be a number of tool calls (0 or more), got {value}")
    if options.metric is not None and options.metric not in TIMER_METRICS:
        raise RunError(f"--kopt-metric must be one of {', '.join(TIMER_METRICS)}, got {options.metric!r}")
    if options.promote not in (None, False, True, "check", "force"):
        raise RunError(f"--kopt-promote takes check (the default) or force, got {options.promote!r}")
    if not isinstance(options.workers, int) or options.workers < 1:
        raise RunError(f"--kopt-workers must be a whole number of evaluations in flight (1 or more), got {options.workers!r}")
    if options.executor not in EXECUTORS:
        raise RunError(f"--kopt-executor must be one of {', '.join(EXECUTORS)}, got {options.executor!r}")


def resolve(options: RunOptions) -> RunOptions:
    """Fill in the run directory, budget, agent, seed and metric (from the log when resuming); check them."""
    _check_options(options)
    run_dir = Path(options.run_dir) if options.run_dir else None
    if options.retract and not options.resume:
        raise RunError("--kopt-retract takes a candidate out of a recorded run: pass --kopt-resume --kopt-run-dir=DIR")
    if options.resume:  # a run directory with no run in it yet starts one: one command for every call
        if run_dir is None:
            raise RunError("--kopt-resume needs --kopt-run-dir=DIR (the run to continue)")
    else:
        run_dir = run_dir or default_run_dir(options.problem, options.results_dir)
    packed = runstore.packed_message(run_dir)
    if packed:  # a packed run is read-only: resuming it, or starting another in its place, would lose it
        raise RunError(packed)
    state = RunState.fold(_events(run_dir))
    started = state.started
    if started is None:  # a new run (or one killed before it recorded its start)
        budget = options.budget_more if options.budget_more is not None else options.budget
        return replace(
            options, run_dir=run_dir, started=None, budget=DEFAULT_BUDGET if budget is None else budget, budget_more=None,
            agent=options.agent or "search", seed=DEFAULT_SEED if options.seed is None else options.seed,
            metric=options.metric or DEFAULT_METRIC,
        )
    if not options.resume:
        raise RunError(f"{run_dir} already holds a run; pass --kopt-resume to continue it, or choose another --kopt-run-dir")
    if started.get("problem") != options.problem:
        raise RunError(f"{run_dir} is a run of {started.get('problem')!r}, not {options.problem!r}")
    metric = metric_of(state.objective)
    if options.metric is not None and options.metric != metric:
        raise RunError(f"{run_dir} is scored on {metric} time (fixed in its objective when it started) and a resumed run keeps "
                       f"its own metric: drop --kopt-metric={options.metric}, or start a new run for {options.metric} time")
    used = state.budget_used
    if options.budget_more is not None:
        budget = used + options.budget_more
    elif options.budget is not None:
        budget = options.budget
        if budget < used:
            raise RunError(f"--kopt-budget is the run's total of tool calls, and {run_dir} has used {used} already: "
                           f"pass a total of {used} or more, or --kopt-budget=+N for N calls more")
    else:
        budget = state.budget if isinstance(state.budget, int) else started["budget"]
    agent = options.agent or agent_name(started.get("agent")) or "search"
    return replace(
        options, run_dir=run_dir, started=started, agent=agent, budget=budget, budget_more=None, metric=metric,
        seed=started.get("seed", DEFAULT_SEED) if options.seed is None else options.seed,
        agent_settings=state.agent_settings.get(agent) if options.agent_settings is None else options.agent_settings,
    )


def _run_quiet(args: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def environment() -> dict:
    """Where the run happens: GPU, driver, torch, Triton, Python, commit (no heavy imports)."""

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    gpu = driver = None
    if shutil.which("nvidia-smi"):
        first = (_run_quiet(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]) or "").splitlines()
        if first and "," in first[0]:
            gpu, driver = (part.strip() for part in first[0].split(",", 1))
    commit = _run_quiet(["git", "rev-parse", "HEAD"], REPO_ROOT)
    dirty = _run_quiet(["git", "status", "--porcelain", "--untracked-files=no"], REPO_ROOT)
    return {
        "gpu": gpu, "driver": driver, "interpreter": os.environ.get("TRITON_INTERPRET") == "1",
        "torch": version("torch"), "triton": version("triton"), "optuna": version("optuna"),
        "python": platform.python_version(), "platform": platform.platform(), "host": platform.node(),
        "commit": commit, "dirty": bool(dirty) if dirty is not None else None,
    }


class RunLock:
    """Exclusive ownership of a run directory (``RUN_DIR/lock``, fcntl.flock, holder's pid inside)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "lock"
        self.fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise RunLocked(f"{self.path.parent} is being written by another process (pid {holder}); wait for it or stop it first") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:  # else the previous owner removed the file between our open and flock
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                self.fd = fd
                return
            os.close(fd)

    def release(self) -> None:
        if self.fd is not None:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
            os.close(self.fd)
            self.fd = None


def _shown(path: Path) -> str:
    """A path relative to the repository when it lies inside it (logs travel between machines)."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _sigterm_as_ctrl_c() -> Any:
    """Make SIGTERM (``timeout``, a scheduler) stop the loop like Ctrl-C; returns the old handler."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt("SIGTERM")

    return signal.signal(signal.SIGTERM, handler)


class Run:
    """One run directory, owned for the life of the ``with`` block.

    ``problem`` defaults to ``get_problem(options.problem)``, ``evaluate`` to the judge's
    ``evaluate``: tests inject a fake of either.
    """

    def __init__(
        self, options: RunOptions, *, problem: Any = None, evaluate: Callable[..., dict] | None = None,
        promote_dir: Path | None = None, progress: Progress | None = None,
    ):
        self.options = resolve(options)
        if problem is None:
            from .problems import get_problem

            problem = get_problem(self.options.problem)
        self.problem = problem
        self.evaluate = evaluate
        self.promote_dir = Path(promote_dir) if promote_dir else KERNELS_DIR / "best"
        self.run_dir = Path(self.options.run_dir)
        self.lock = RunLock(self.run_dir)
        self.log: EventLog | None = None
        self.tools: Toolbox | None = None
        self.resumed = False
        self.progress = progress
        self.outcome: Outcome | None = None
        self.environment: dict = {}
        self.machine: str | None = None  # this machine's kind: its GPU, or "cpu"
        self.executor: Executor | None = None

    # ---- ownership --------------------------------------------------------------------------
    def __enter__(self) -> "Run":
        try:
            self.lock.acquire()
        except OSError as exc:
            if is_storage_error(exc):
                raise RunStorageError(self.storage_message(exc)) from None
            raise
        try:
            self._open()
        except BaseException as exc:
            if self.executor is not None:
                self.executor.close()
            if self.log is not None:
                self.log.close()
            self.lock.release()
            if is_storage_error(exc):
                raise RunStorageError(self.storage_message(exc)) from None
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.executor is not None:
            self.executor.close()
        if self.log is not None:
            self.log.close()
        self.lock.release()

    def storage_message(self, exc: OSError, logged: bool = False) -> str:
        """What to tell a person whose run directory cannot be written, and how to go on."""
        where = f" ({exc.filename})" if exc.filename else ""
        return (f"kopt: the run directory {self.run_dir} cannot be written: {exc.strerror or exc}{where}. "
                + ("The interruption is in its log. " if logged else "")
                + f"Free some space (or make it writable), then continue with: {resume_command(self.problem.name, self.run_dir)}")

    def _open(self) -> None:
        opts = self.options
        remove_stale_temp_files(self.run_dir)  # a kill -9 between write and rename leaves one; we own the run now
        try:
            self.executor = make_executor(opts.executor, opts.workers, opts.ray_address)
        except ExecutorError as exc:
            raise RunError(str(exc)) from None
        self.environment = environment()
        if self.executor.remote_gpu() is not None:  # on a Ray cluster: the GPU of the workers that time the candidates
            self.environment["gpu"], self.environment["driver"] = self.executor.remote_gpu()
        self.machine = machine_name(self.environment)
        self.log = EventLog(self.run_dir / "events.jsonl", run_id=self.run_dir.name)
        events = read_events(self.log.path)
        started = next((e for e in events if e.get("kind") == ev.RUN_STARTED), None)
        objective = started["objective"] if started else {}
        self.tools = Toolbox(self.problem, objective, self.log, self.run_dir, int(opts.budget), evaluate=self.evaluate,
                             eval_timeout=opts.eval_timeout, executor=self.executor)
        if self.progress is not None:
            self.progress.tools = self.tools
            self.tools.listeners.append(self.progress)
        if started is None:
            if opts.retract:
                raise RunError(f"--kopt-retract: {self.run_dir} holds no recorded run to retract a candidate from")
            self._start()
        elif not opts.resume:  # another process started it after we looked
            raise RunError(f"{self.run_dir} already holds a run; pass --kopt-resume to continue it")
        else:
            self.resumed = True
            self.tools.restore(events)
            if self.tools.budget_left > 0:  # with no call left nothing is timed here: a retraction or a promotion may
                self._check_objective(objective)  # be made on any machine
            in_flight = self.tools.in_flight
            self.tools.emit(
                ev.RUN_RESUMED, budget_used=self.tools.budget_used, budget=self.tools.budget, agent=opts.agent,
                agent_settings=opts.agent_settings, seed=opts.seed,
                in_flight=in_flight["call"] if in_flight else None, in_flight_calls=[e["call"] for e in self.tools.unfinished],
                repaired_bytes=self.log.repaired_bytes, environment=self.environment, workers=opts.workers, executor=self.executor.describe(),
            )
            if self.tools.budget_left > 0:
                self._recover_baseline(events)
            recovered = self.tools.recover_best()
            if recovered is not None and self.progress is not None:
                self.progress.say(f"kopt: the log had lost the best event of {recovered['candidate_id']} (a kill between its verdict and it); recorded now")
            if opts.retract:
                try:
                    best = self.tools.retract(*opts.retract)
                except ValueError as exc:
                    raise RunError(str(exc)) from None
                if self.progress is not None:
                    self.progress.say(f"kopt: retracted {opts.retract[0]}; best now {best['candidate_id'] if best else 'none'}")

    def _timed_label(self) -> str | None:
        """What the problem is timed on, on this machine (None for a problem object without it)."""
        timed_label = getattr(self.problem, "timed_label", None)
        if timed_label is None:
            return None
        if self.executor is not None and self.executor.remote_gpu() is not None:
            return timed_label("cuda")  # the cluster's workers time it
        import torch

        return timed_label("cuda" if torch.cuda.is_available() else "cpu")

    def _check_objective(self, objective: dict) -> None:
        """Goal conditioning: a resumed run must be timed on what its objective was fixed on."""
        recorded, now = objective.get("timed"), self._timed_label()
        if recorded and now and now != recorded:
            raise RunError(f"{self.run_dir} was started with its objective timed on {recorded!r}, but here {self.problem.name} "
                           f"is timed on {now!r} (another machine, or another version of the problem): start a new run")

    def _start(self) -> None:
        """Time the baseline candidate, fix the objective, record the start (nothing charged)."""
        opts, tools, problem = self.options, self.tools, self.problem
        source = Path(problem.baseline_candidate_path).read_text(encoding="utf-8")
        cid = candidate_id(source)
        path = self.run_dir / "candidates" / f"{cid}.py"
        atomic_write(path, source)
        tools.objective["metric"] = opts.metric  # the baseline is timed under it too
        if self.progress:
            self.progress.say(f"kopt: new run {self.run_dir}: timing the baseline candidate {cid} ({Path(problem.baseline_candidate_path).name}) to fix the objective")
            self.progress.waiting(f"baseline {cid}")
        try:
            result = tools.judge(path, "benchmark")
        finally:
            if self.progress:
                self.progress.done()
        timings = result.get("timings") if isinstance(result.get("timings"), dict) else {}
        roofline = result.get("roofline") if isinstance(result.get("roofline"), dict) else {}
        passed = result.get("verdict") == "pass"
        tools.objective.update(problem.summary())
        tools.objective.update({
            "min_gain": opts.min_gain,
            "metric": opts.metric,
            "score": objective_text(opts.metric, bool(timings.get("cases"))),
            "case": timings.get("case"),
            "timed": self._timed_label(),
            "baseline_candidate": cid,
            "baseline_path": _shown(Path(problem.baseline_candidate_path)),
            "baseline_us": timings.get("candidate_us") if passed else None,
            "baselines_us": timings.get("baselines"),
            "reference_us": timings.get("reference_us"),
            "floor_us": roofline.get("floor_us"),
            "baseline_verdict": result.get("verdict"),
            "baseline_reasons": list(result.get("reasons") or [])[:3],
        })
        tools.emit(
            ev.RUN_STARTED, problem=problem.name, objective=tools.objective, environment=self.environment,
            budget=tools.budget, agent=opts.agent, agent_settings=opts.agent_settings, seed=opts.seed, eval_timeout=opts.eval_timeout,
            workers=opts.workers, executor=self.executor.describe(),
        )
        self._record_baseline(source, result)

    def _recover_baseline(self, events: list[dict]) -> None:
        """A kill between ``run_started`` and the baseline candidate's call-0 verdict leaves a run
        without the loop's own timing of its baseline, which the search agent takes as given (it
        would walk the baseline itself, and the run would go another way than an uninterrupted
        one). Time it again (not charged) and record it as ``_start`` does."""
        cid = self.tools.objective.get("baseline_candidate")
        if not cid or any(e.get("kind") == ev.VERDICT and e.get("candidate_id") == cid and e.get("call") == 0 for e in events):
            return
        path = self.run_dir / "candidates" / f"{cid}.py"
        if not path.is_file():  # written before run_started: only a damaged run lacks it
            raise RunError(f"{self.run_dir}: the baseline candidate {cid} named in the objective is missing from candidates/")
        source = path.read_text(encoding="utf-8")
        if self.progress:
            self.progress.say(f"kopt: the log had lost the baseline candidate's timing (a kill right after the run started); timing {cid} again")
            self.progress.waiting(f"baseline {cid}")
        try:
            result = self.tools.judge(path, "benchmark")
        finally:
            if self.progress:
                self.progress.done()
        self._record_baseline(source, result)

    def _record_baseline(self, source: str, result: dict) -> None:
        """The baseline candidate and its verdict, call 0 (not charged)."""
        try:
            family = parse_family(source, Path(self.problem.baseline_candidate_path).stem)
            strategy, knobs = family.name, family.knobs
        except FamilyError:
            strategy, knobs = "baseline", None
        cid = self.tools.add_candidate(source, notes="the baseline candidate, timed by the loop to fix the objective (not charged)",
                                       strategy=strategy, knobs=knobs)
        self.tools.record(cid, "benchmark", result, call=0)

    # ---- the loop ---------------------------------------------------------------------------
    def execute(self, agent: Any) -> Outcome:
        """Let ``agent`` act until the budget is spent or it is done; finish or record the interruption."""
        tools = self.tools
        if self.progress:
            obj = tools.objective
            self.progress.say(
                f"kopt: {'resumed' if self.resumed else 'started'} run {self.run_dir} ({self.problem.name}, agent {self.options.agent}, seed {self.options.seed}): "
                f"{tools.budget_used}/{tools.budget} tool calls used; baseline {fmt_us(obj.get('baseline_us'))} on {obj.get('case') or '?'} ({tools.metric} time)"
                + (f"; {tools.workers} evaluations at once ({self.executor.name})" if tools.workers > 1 or self.executor.name != "local" else "")
            )
        previous = _sigterm_as_ctrl_c()
        try:
            if self.resumed:
                tools.redo_in_flight()
            agent.restore(read_events(self.log.path))
            idle = 0
            while True:
                if tools.calls_left <= 0:
                    reason = "budget exhausted"
                    break
                before = (tools.state.issued, tools.budget_used)
                try:
                    more = agent.act(tools)
                except BudgetExhausted:
                    reason = "budget exhausted"
                    break
                if not more:
                    reason = f"agent {getattr(agent, 'name', 'agent')} has nothing left to try"
                    break
                idle = idle + 1 if (tools.state.issued, tools.budget_used) == before else 0
                if idle >= IDLE_ACTS:
                    reason = f"agent made no tool call in {IDLE_ACTS} turns"
                    break
            tools.drain()  # every call issued is answered before the run ends
        except KeyboardInterrupt as exc:
            self.outcome = self._end("interrupted", "stopped by SIGTERM" if str(exc) == "SIGTERM" else "stopped by Ctrl-C")
            raise
        except BaseException as exc:
            if is_storage_error(exc):
                self.outcome = self._end("interrupted", f"the run directory cannot be written: {exc}")
                raise RunStorageError(self.storage_message(exc, logged=self.outcome.logged)) from None
            self.outcome = self._end("interrupted", f"{type(exc).__name__}: {exc}")
            raise
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        self.outcome = self._end("finished", reason)
        if not self.outcome.logged:
            raise RunStorageError(self.storage_message(self.outcome.storage_error))
        return self.outcome

    def _end(self, status: str, reason: str) -> Outcome:
        """Write best.py / best.json, promote if asked, log the end; a disk that cannot take them is
        noted in the outcome (``logged``), never a second traceback."""
        tools = self.tools
        outcome = Outcome(status, reason, self.run_dir, tools.budget, tools.budget_used, tools.best)
        try:
            if tools.best:
                outcome.best_path = self.write_best()
            # an interrupted run promotes too: its best is as verified, and a device job's time limit
            # (SIGINT) is how long runs usually end
            if self.options.promote and outcome.best_path:
                outcome.promotion = self._promote()
                outcome.promoted = outcome.promotion.path if outcome.promotion.promoted else None
            kind = ev.RUN_FINISHED if status == "finished" else ev.RUN_INTERRUPTED
            self.log.append(kind, reason=reason, budget_used=tools.budget_used, budget=tools.budget, best=tools.best)
        except OSError as exc:
            if not is_storage_error(exc):
                raise
            outcome.status, outcome.logged, outcome.storage_error = "interrupted", False, exc
            if status == "finished":
                outcome.reason = f"the run directory cannot be written: {exc}"
        return outcome

    def _promote(self) -> Promotion:
        """--kopt-promote: hand the best (its candidate file) to pytest_kopt.promote; log and say what it did."""
        tools, best = self.tools, self.tools.best
        cid = best["candidate_id"]
        recorded = next((tools.results[(cid, u)] for u in ("profile", "benchmark") if (cid, u) in tools.results), None)
        mode = "force" if self.options.promote == "force" else "check"
        if self.progress:
            self.progress.waiting(f"promotion of {cid}")
        try:
            promotion = promote(
                problem=self.problem.name, mode=mode, best=best, best_path=self.run_dir / "candidates" / f"{cid}.py", attempt=tools.candidates.get(cid),
                run_shown=_shown(self.run_dir), objective=tools.objective, promote_dir=self.promote_dir, machine=self.machine,
                environment=self.environment, evaluate=tools.evaluator, timeout_s=self.options.eval_timeout, recorded_result=recorded,
            )
        except KeyboardInterrupt:
            promotion = Promotion("refused", "interrupted while timing the best beside the promoted kernel; nothing replaced",
                                  cid, self.promote_dir / f"{self.problem.name}.py", fields={"mode": mode})
        finally:
            if self.progress:
                self.progress.done()
        fields = promotion.event() | {"path": _shown(promotion.path)}
        if promotion.result is not None:
            fields["result_path"] = f"evals/{cid}-promotion.json"
            atomic_write(self.run_dir / fields["result_path"], dumps(promotion.result) + "\n")
        tools.emit(ev.PROMOTE, **fields)
        if self.progress:
            self.progress.say(f"kopt: --kopt-promote={mode}: {promotion.action}: {promotion.reason}")
        return promotion

    def write_best(self) -> Path:
        """``best.py`` and ``best.json`` (the best's deepest evaluation) in the run directory."""
        tools, best = self.tools, self.tools.best
        cid = best["candidate_id"]
        evaluation = next((tools.results[(cid, u)] for u in ("profile", "benchmark") if (cid, u) in tools.results), None)
        atomic_write(self.run_dir / "best.py", (self.run_dir / "candidates" / f"{cid}.py").read_text(encoding="utf-8"))
        meta = tools.candidates[cid].meta if cid in tools.candidates else {}
        record = {**best, "problem": self.problem.name, "run_id": self.log.run_id, "strategy": meta.get("strategy"), "knobs": meta.get("knobs"), "objective": tools.objective, "evaluation": evaluation}
        atomic_write(self.run_dir / "best.json", json.dumps(json.loads(dumps(record)), indent=2) + "\n")
        return self.run_dir / "best.py"


def objective_text(metric: str, several_cases: bool) -> str:
    """What the objective's number is, in words (the LLM's system message states it)."""
    where = "the geometric mean over the timed cases (the objective's case)" if several_cases else "the time on the timed case (the objective's case)"
    return (f"{where} of the {metric} time of one kernel(...) call, in microseconds, lower is better; {metric} = {METRIC_TEXT[metric]}; "
            "only candidates that pass the judge's correctness checks count")
