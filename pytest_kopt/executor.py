"""Where the loop's evaluations run: up to ``--kopt-workers`` at once, on this host or on a Ray cluster.

The toolbox hands each judge call to an executor and gets a ``Ticket`` back (its
``concurrent.futures.Future`` holds the judge's result); everything else a call does — its number,
its events, the best — stays in the loop's main thread (``pytest_kopt.tools``). Each evaluation is
its own ``pytest_kopt.judge.evaluate``: its own supervisor and runner pair, its own judge slot
(``2 * lane``: the candidate's runner; ``2 * lane + 1``: the incumbent's), so the judge's isolation
holds per evaluation as it does for one.

- ``LocalExecutor`` (``--kopt-executor=local``, the default): with one worker the evaluation runs
  in the calling thread, exactly as the loop always ran it; with N workers each evaluation runs in a
  thread of its own (the supervisor is a child process; the thread only waits for it). On a GPU
  machine each evaluation is pinned to one GPU (the judge's ``visible_devices``: the supervisor's
  ``CUDA_VISIBLE_DEVICES``), the least busy one; on the CPU the machine's cores are one shared device.
- ``RayExecutor`` (``--kopt-executor=ray``): each evaluation is a Ray task, ``num_gpus=1`` on a
  cluster with GPUs (Ray gives the task its own GPU through ``CUDA_VISIBLE_DEVICES``) and 0 on a CPU
  cluster. The task carries the candidate's (and the incumbent's) source, writes them to a scratch
  directory on its node and calls ``evaluate`` there: no shared file system is needed.

**Contention.** A timing taken while another evaluation of this loop ran on the same device is
*contended*: GPU time-slicing (or two interpreters on the same cores) disturbs both. The executor
says so per ticket (``contended``): two tickets on one device whose intervals (start to end of the
evaluation, as this process saw them) overlap. A Ray GPU task has a GPU to itself, so it is never
contended; a Ray CPU task is judged like a local one. The run state never lets a contended timing
become the best (``runstate.beats``), hence never a promotion.
"""

from __future__ import annotations

import functools
import importlib
import os
import platform
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

EXECUTORS = ("local", "ray")
CPU_DEVICE = "cpu"
LOCAL_OBJECT_STORE = 256 << 20  # bytes: a local Ray instance moves sources and results, nothing large


class ExecutorError(RuntimeError):
    """The executor cannot be set up as asked (the message says what to do)."""


def takes_keyword(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` accepts the keyword ``name`` (a judge replaced by a fixture may not)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def gpu_devices() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries (indices or UUIDs); [] without one."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    if os.environ.get("TRITON_INTERPRET") == "1":
        return []
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - no torch, no driver: no GPU
        return []


@dataclass
class Ticket:
    """One evaluation handed to an executor."""

    future: Future
    lane: int  # the worker it runs on (0 .. workers - 1)
    device: str | None  # what it shares: "cuda:<id>", "cpu"; None: a device of its own (a Ray GPU task)
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None  # set by whoever runs it, when the judge returned
    contended: bool = False  # set by the executor when it is collected
    collected: bool = False
    ref: Any = None  # the Ray object reference

    def placement(self, executor: str) -> dict:
        """What the verdict event records of where it ran."""
        out: dict[str, Any] = {"executor": executor, "lane": self.lane, "device": self.device}
        result = self.future.result() if self.future.done() and not self.future.exception() else None
        if isinstance(result, dict) and isinstance(result.get("worker"), dict):
            out["worker"] = result["worker"]
        return out


class Executor:
    """What the toolbox needs of an executor (see the module docstring)."""

    name = "local"

    def __init__(self, workers: int = 1):
        if int(workers) < 1:
            raise ExecutorError(f"--kopt-workers must be 1 or more, got {workers}")
        self.workers = int(workers)
        self.tickets: list[Ticket] = []  # not yet collected, and recent ones that may overlap them
        self.problem_modules: dict[str, str] = {}  # problem name -> the module that registers it (for a Ray task)

    # ---- what subclasses provide ------------------------------------------------------------------
    def _start(self, evaluate: Callable[..., dict], problem: str, path: str, kwargs: dict, ticket: Ticket) -> None:
        raise NotImplementedError

    def _device(self) -> str | None:
        return CPU_DEVICE

    def describe(self) -> dict:
        """The executor as the run's log records it."""
        return {"executor": self.name, "workers": self.workers}

    def remote_gpu(self) -> tuple[str, str | None] | None:
        """(GPU name, driver) of the machines that run the evaluations when they are not this one; else None."""
        return None

    def close(self) -> None:
        """Let go of the workers; evaluations still running are abandoned (their calls are redone on resume)."""

    # ---- the toolbox's side -------------------------------------------------------------------------
    def submit(self, evaluate: Callable[..., dict], problem: str, path: str, kwargs: dict) -> Ticket:
        """Start one evaluation on a free lane; its ticket's future holds the judge's result."""
        busy = {t.lane for t in self.tickets if t.finished is None}
        lane = next(i for i in range(self.workers + len(busy)) if i not in busy)
        ticket = Ticket(Future(), lane, self._device())
        self.tickets.append(ticket)
        self._start(evaluate, problem, path, dict(kwargs), ticket)
        return ticket

    def collect(self, ticket: Ticket) -> Ticket:
        """Mark a finished ticket contended or not; forget tickets nothing running can overlap any more."""
        if ticket.finished is None:
            ticket.finished = time.monotonic()
        ticket.contended = ticket.device is not None and any(
            other is not ticket and other.device == ticket.device and other.started < ticket.finished
            and (other.finished is None or other.finished > ticket.started)
            for other in self.tickets)
        ticket.collected = True
        horizon = min((t.started for t in self.tickets if not t.collected), default=time.monotonic())
        self.tickets = [t for t in self.tickets if not t.collected or (t.finished or 0.0) >= horizon]
        return ticket

    def run(self, evaluate: Callable[..., dict], problem: str, path: str, **kwargs: Any) -> dict:
        """One evaluation, waited for (the loop's own: the baseline, a promotion)."""
        ticket = self.submit(evaluate, problem, path, kwargs)
        try:
            return ticket.future.result()
        finally:
            self.collect(ticket)

    def evaluator(self, evaluate: Callable[..., dict]) -> Callable[..., dict]:
        """``evaluate`` run through this executor, with its signature (so callers see what it takes)."""

        @functools.wraps(evaluate)
        def through(problem: str, path: str, **kwargs: Any) -> dict:
            return self.run(evaluate, problem, path, **kwargs)

        return through

    @staticmethod
    def placed(evaluate: Callable[..., dict], kwargs: dict, lane: int, devices: str | None) -> dict:
        """The judge's keywords for a lane: its slots, and its GPU where it takes them."""
        if takes_keyword(evaluate, "slot"):
            kwargs.setdefault("slot", 2 * lane)
        if devices is not None and takes_keyword(evaluate, "visible_devices"):
            kwargs.setdefault("visible_devices", devices)
        return kwargs


class LocalExecutor(Executor):
    """Evaluations on this host: inline with one worker, one thread each with several (module docstring)."""

    name = "local"

    def __init__(self, workers: int = 1, devices: list[str] | None = None):
        super().__init__(workers)
        self.devices = gpu_devices() if devices is None else list(devices)

    def describe(self) -> dict:
        return {**super().describe(), "devices": [f"cuda:{d}" for d in self.devices] or [CPU_DEVICE]}

    def _device(self) -> str | None:
        if not self.devices:
            return CPU_DEVICE
        load = {f"cuda:{d}": 0 for d in self.devices}
        for t in self.tickets:
            if t.finished is None and t.device in load:
                load[t.device] += 1
        return min(load, key=lambda d: load[d])  # the least busy; the first on a tie

    def _start(self, evaluate: Callable[..., dict], problem: str, path: str, kwargs: dict, ticket: Ticket) -> None:
        # one worker is not pinned: the judge sees what the loop sees, as it always did
        pin = ticket.device.removeprefix("cuda:") if self.workers > 1 and ticket.device != CPU_DEVICE else None
        kwargs = self.placed(evaluate, kwargs, ticket.lane, pin)

        def work() -> None:
            try:
                ticket.future.set_result(evaluate(problem, path, **kwargs))
            except Exception as exc:  # noqa: BLE001 - the toolbox turns it into a failed verdict
                ticket.future.set_exception(exc)
            finally:
                ticket.finished = time.monotonic()

        if self.workers == 1:  # Ctrl-C reaches the judge (which kills its supervisor) as it always did
            work()
        else:  # a daemon: an abandoned evaluation never holds up the process's exit
            threading.Thread(target=work, name=f"kopt-worker-{ticket.lane}", daemon=True).start()


class RayExecutor(Executor):
    """Evaluations as Ray tasks (module docstring); ``address`` None starts a local Ray instance."""

    name = "ray"

    def __init__(self, workers: int = 1, address: str | None = None):
        super().__init__(workers)
        try:
            import ray
        except ImportError:
            raise ExecutorError("--kopt-executor=ray needs Ray: pip install 'pytest-kopt[ray]' (on every host of the cluster)") from None
        self.ray = ray
        self.address = address or None
        self.started_here = False
        if not ray.is_initialized():
            if self.address:
                ray.init(address=self.address, log_to_driver=False)
            else:  # a local instance: room for every worker, a small object store, and its workers import what this process imports
                ray.init(include_dashboard=False, log_to_driver=False, num_cpus=max(self.workers, os.cpu_count() or 1),
                         object_store_memory=LOCAL_OBJECT_STORE,
                         runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in map(os.path.abspath, _sys_path()) if os.path.isdir(p))}})
                self.started_here = True
        self.gpus = int(ray.cluster_resources().get("GPU", 0))
        self.num_gpus = 1 if self.gpus else 0
        # a node that dies mid-evaluation: Ray runs the task again elsewhere, up to twice
        self.task = ray.remote(_ray_evaluate).options(num_gpus=self.num_gpus, num_cpus=1, max_retries=2)
        self._gpu: tuple[str, str | None] | None = None
        if self.num_gpus:
            probe = ray.remote(_gpu_name).options(num_gpus=1, num_cpus=0)
            self._gpu = ray.get(probe.remote())

    def remote_gpu(self) -> tuple[str, str | None] | None:
        return self._gpu

    def describe(self) -> dict:
        return {**super().describe(), "address": self.address or "local instance", "cluster_gpus": self.gpus, "num_gpus_per_task": self.num_gpus}

    def _device(self) -> str | None:
        return None if self.num_gpus else CPU_DEVICE  # a GPU task has its GPU to itself

    def _start(self, evaluate: Callable[..., dict], problem: str, path: str, kwargs: dict, ticket: Ticket) -> None:
        kwargs = self.placed(evaluate, kwargs, ticket.lane, None)
        source = Path(path).read_text(encoding="utf-8")
        incumbent = kwargs.pop("incumbent", None)
        incumbent_source = Path(incumbent).read_text(encoding="utf-8") if incumbent else None
        ticket.ref = self.task.remote(evaluate, problem, self.problem_modules.get(problem), Path(path).name, source, str(path),
                                      Path(incumbent).name if incumbent else None, incumbent_source, kwargs)
        future = ticket.ref.future()

        def done(f: Future) -> None:
            ticket.finished = time.monotonic()
            if f.exception() is not None:
                ticket.future.set_exception(f.exception())
            else:
                ticket.future.set_result(f.result())

        future.add_done_callback(done)

    def close(self) -> None:
        for t in self.tickets:
            if t.finished is None and t.ref is not None:
                try:
                    self.ray.cancel(t.ref, force=True)
                except Exception:  # noqa: BLE001 - best effort: the task may have ended meanwhile
                    pass
        if self.started_here:
            self.ray.shutdown()


def _gpu_name() -> tuple[str, str | None]:
    """A Ray task on a GPU worker: its GPU's name and driver (what the run's environment records)."""
    import subprocess

    try:
        line = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
        name, driver = (part.strip() for part in line.split(",", 1))
        return name, driver
    except (OSError, IndexError, ValueError, subprocess.SubprocessError):
        import torch

        return torch.cuda.get_device_name(0), None


def _sys_path() -> list[str]:
    import sys

    return [p for p in sys.path if p]


def _ray_evaluate(evaluate: Callable[..., dict], problem: str, module: str | None, name: str, source: str, shown: str,
                  incumbent_name: str | None, incumbent_source: str | None, kwargs: dict) -> dict:
    """A Ray task: write the sources on this node, judge them with ``evaluate`` (supervisor and runner
    as anywhere), and say where it ran."""
    if module and module not in ("__main__", "builtins"):
        try:
            importlib.import_module(module)  # registers a problem only the loop's process registered
        except ImportError:
            pass
    with tempfile.TemporaryDirectory(prefix="kopt-ray-") as scratch:
        path = Path(scratch) / name
        path.write_text(source, encoding="utf-8")
        if incumbent_source is not None:
            incumbent = Path(scratch) / "incumbent" / (incumbent_name or "incumbent.py")
            incumbent.parent.mkdir()
            incumbent.write_text(incumbent_source, encoding="utf-8")
            kwargs["incumbent"] = str(incumbent)
        result = evaluate(problem, str(path), **kwargs)
    if isinstance(result, dict):
        result["candidate"] = shown
        result["worker"] = {"host": platform.node(), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}
    return result


def make_executor(kind: str = "local", workers: int = 1, address: str | None = None) -> Executor:
    """The executor ``--kopt-executor`` names."""
    if kind == "local":
        return LocalExecutor(workers)
    if kind == "ray":
        return RayExecutor(workers, address)
    raise ExecutorError(f"--kopt-executor must be one of {', '.join(EXECUTORS)}, got {kind!r}")
