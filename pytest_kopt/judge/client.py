"""The supervisor's side of a runner: requests over the channel, and the slots that carry a case's
inputs and outputs through shared arenas.

``RunnerClient.request`` wakes the runner (SIGCONT), sends one command, waits for the answer
within the evaluation's deadline and stops the runner again (SIGSTOP), so no candidate code runs
on the host while the supervisor prepares inputs or checks outputs. Whatever the runner sends is
data to validate: an answer that is not ``{"ok": true, ...}`` is a ``RunnerFailure``; a runner that
dies or stops answering is a ``RunnerFailure`` with its exit status and the end of its stderr.

``CaseSlots`` lays out M copies of one case's inputs in a read-only arena and M regions for its
outputs in a writable one; ``write`` puts fresh inputs in a slot, ``outputs`` turns what the
runner reported into tensors the supervisor reads from its own snapshot of the output arena.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

import torch

from .arena import Arena, Layout, TensorSpec, aligned, dtype_name
from .channel import Channel, ChannelError
from .sandbox import RunnerProcess, tail


class RunnerFailure(Exception):
    """The runner answered with an error, died, or did not answer in time."""

    def __init__(self, reason: str, *, fatal: bool = False, died: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.fatal = fatal or died
        self.died = died


class RunnerClient:
    def __init__(self, process: RunnerProcess, device: torch.device, deadline: float, source: str) -> None:
        self.process = process
        self.channel = Channel(process.sock)
        self.device = device
        self.deadline = deadline
        self.source_lines = source.splitlines()
        self.arenas: dict[int, Arena] = {}
        self._next_arena = 1
        self.info: dict = {}

    # ---- requests ----------------------------------------------------------------------
    def request(self, cmd: str, *, fds: tuple[int, ...] = (), timeout: float | None = None, sweep: bool = True,
                **fields: Any) -> dict:
        """Send one command and wait for its answer; the runner runs only meanwhile. ``sweep=False``
        (a timed round) stops just its process group when the answer is in: call ``sweep`` once the
        round's window has closed."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise RunnerFailure(f"timed out: the evaluation's time ran out before {cmd!r}", fatal=True)
        wait = left if timeout is None else min(left, timeout)
        self.process.cont()
        try:
            self.channel.send({"cmd": cmd, **fields}, list(fds))
            reply, extra = self.channel.recv(timeout=wait)
        except ChannelError as exc:
            raise self._death(cmd, str(exc)) from None
        finally:
            self.process.stop(sweep=sweep)
        self.check_left_behind(cmd)
        for fd in extra:  # the runner has no business sending descriptors
            os.close(fd)
        if reply.get("ok") is not True:
            error = reply.get("error")
            raise RunnerFailure(str(error)[:4000] if error else f"the runner answered {cmd!r} without a result",
                                fatal=bool(reply.get("fatal")))
        return reply

    def sweep(self, cmd: str) -> None:
        """Stop every process of the runner, wherever it went, after a request made with ``sweep=False``."""
        self.process.sweep()
        self.check_left_behind(cmd)

    def check_left_behind(self, cmd: str) -> None:
        if self.process.left_behind:
            pids = ", ".join(str(pid) for pid in sorted(self.process.left_behind)[:5])
            raise RunnerFailure(f"the candidate's process left processes running outside its calls (pid {pids}, after {cmd!r}; "
                                "killed): a candidate may not start background processes", fatal=True)

    def _death(self, cmd: str, why: str) -> RunnerFailure:
        proc = self.process.proc
        if why == "no answer in time":
            return RunnerFailure(f"timed out: the candidate's process did not answer {cmd!r} before the evaluation's deadline", died=True)
        try:
            proc.wait(timeout=5)
        except Exception:  # noqa: BLE001
            pass
        code = proc.returncode
        if code is None:
            how = f"stopped answering ({why})"
        elif code < 0:
            import signal

            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        stderr = self.process.stderr()
        reason = f"the candidate's process {how} during {cmd!r}" + self.candidate_lines(stderr)
        if code is not None and code < 0 and -code in (11, 7):  # SIGSEGV, SIGBUS
            reason += " (note: inputs are mapped read-only, so a kernel that writes to an input faults)"
        if stderr.strip():
            reason += f"\noutput of the process:\n{tail(stderr)}"
        return RunnerFailure(reason, died=True)

    def candidate_lines(self, text: str) -> str:
        """" (candidate line 12: `...`)" for the candidate's frames in a crash dump."""
        found: list[tuple[int, str]] = []
        for match in re.finditer(r'candidate\.py", line (\d+)', text):
            n = int(match.group(1))
            line = self.source_lines[n - 1].strip() if 0 < n <= len(self.source_lines) else ""
            if (n, line) not in found:
                found.append((n, line))
        return (" (" + "; ".join(f"candidate line {n}: `{t}`" for n, t in found[:3]) + ")") if found else ""

    # ---- arenas ------------------------------------------------------------------------
    def arena(self, nbytes: int, *, writable: bool) -> Arena:
        arena = Arena.create(self._next_arena, nbytes, self.device)
        self._next_arena += 1
        fd = arena.export_fd(writable)
        try:
            self.request("arena", fds=(fd,), id=arena.id, nbytes=arena.nbytes, writable=writable)
        finally:
            if fd != arena.fd:
                os.close(fd)
        self.arenas[arena.id] = arena
        return arena

    def release(self, *arenas: Arena) -> None:
        ids = [a.id for a in arenas]
        for arena in arenas:
            self.arenas.pop(arena.id, None)
        try:
            self.request("release", arenas=ids)
        finally:
            for arena in arenas:
                arena.close()

    def close(self) -> None:
        for arena in list(self.arenas.values()):
            arena.close()
        self.arenas.clear()
        self.process.close()


class CaseSlots:
    """``count`` slots of one case: inputs in a read-only arena, outputs in a writable one."""

    def __init__(self, client: RunnerClient, sample: dict, expected: tuple, output_names: list[str],
                 expected_dtypes: dict[str, torch.dtype], count: int, tag: str) -> None:
        self.client = client
        self.count = count
        self.tag = tag
        self.output_names = output_names
        self.expected_shapes = [None if e is None else tuple(e.shape) for e in expected]
        self.expected_dtypes = expected_dtypes
        ins, outs = Layout(0), Layout(0)
        self.input_specs: list[dict[str, Any]] = []
        for _ in range(count):
            specs: dict[str, Any] = {}
            for name, value in sample.items():
                specs[name] = ins.place(tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else value
            self.input_specs.append(specs)
        self.regions: list[list[dict]] = []
        for _ in range(count):
            regions = []
            for name, shape, want in zip(output_names, self.expected_shapes, expected):
                itemsize = torch.empty((), dtype=expected_dtypes[name]).element_size() if name in expected_dtypes else 8
                numel = 1
                for n in shape or ():
                    numel *= n
                capacity = aligned(max(numel * itemsize, 1))
                regions.append({"name": name, "offset": outs.nbytes, "capacity": capacity,
                                "dtype": dtype_name(expected_dtypes[name]) if name in expected_dtypes else None,
                                "shape": list(shape) if shape is not None else None})
                outs.nbytes += capacity
            self.regions.append(regions)
        self.inputs_arena = client.arena(ins.nbytes, writable=False)
        self.outputs_arena = client.arena(outs.nbytes, writable=True)
        for regions in self.regions:
            for region in regions:
                region["arena"] = self.outputs_arena.id
        for i in range(count):
            message_inputs = {}
            for name, spec in self.input_specs[i].items():
                if isinstance(spec, TensorSpec):
                    message_inputs[name] = {"tensor": TensorSpec(self.inputs_arena.id, spec.offset, spec.dtype, spec.shape, spec.strides).as_json()}
                else:
                    message_inputs[name] = {"value": spec}
            client.request("prepare", slot=self.slot_id(i), inputs=message_inputs, outputs=self.regions[i])
        self.snapshot = torch.empty_like(self.outputs_arena.tensor)
        self.values: list[dict[str, Any]] = [{} for _ in range(count)]  # non-tensor inputs of each slot's current draw

    def slot_id(self, i: int) -> str:
        return f"{self.tag}:{i}"

    def input_view(self, i: int, name: str) -> torch.Tensor:
        spec = self.input_specs[i][name]
        return self.inputs_arena.view(TensorSpec(self.inputs_arena.id, spec.offset, spec.dtype, spec.shape, spec.strides))

    def write(self, i: int, inputs: dict) -> None:
        """Put ``inputs`` (the layout's shapes) into slot ``i``; non-tensor inputs (a scale, a flag)
        travel with the next request (``values``)."""
        for name, value in inputs.items():
            if isinstance(value, torch.Tensor):
                view = self.input_view(i, name)
                if tuple(view.shape) != tuple(value.shape) or view.dtype != value.dtype:
                    raise ValueError(f"input {name} does not match the slot's layout")
                view.copy_(value)
            else:
                self.values[i][name] = value

    def values_for(self, indices: list[int]) -> dict[str, dict]:
        return {self.slot_id(i): self.values[i] for i in indices}

    def inputs_intact(self, i: int, inputs: dict) -> list[str]:
        """Names of inputs whose slot no longer holds exactly what was written."""
        from .checks import _same_bits

        return [name for name, value in inputs.items() if isinstance(value, torch.Tensor) and not _same_bits(self.input_view(i, name), value)]

    def take_snapshot(self) -> None:
        """Copy the output arena into supervisor-private memory: what is judged is this copy."""
        self.snapshot.copy_(self.outputs_arena.tensor)
        if self.snapshot.device.type == "cuda":
            torch.cuda.synchronize()

    def outputs(self, i: int, described: Any) -> tuple[list[Any], list[str]]:
        """Slot ``i``'s outputs (views of the snapshot) from the runner's description, and what is
        wrong with the description itself (wrong count, shape or dtype)."""
        problems: list[str] = []
        if not isinstance(described, list) or len(described) != len(self.output_names):
            return [], [f"the runner described {len(described) if isinstance(described, list) else 'no'} outputs, expected {len(self.output_names)}"]
        outs: list[Any] = []
        for name, item, region, shape in zip(self.output_names, described, self.regions[i], self.expected_shapes):
            if item is None:
                outs.append(None)
                continue
            try:
                spec = TensorSpec.from_json({"arena": self.outputs_arena.id, "offset": region["offset"], "dtype": item.get("dtype"),
                                             "shape": item.get("shape"), "strides": list(_strides(item.get("shape")))},
                                            arenas={self.outputs_arena.id: self.outputs_arena})
            except (ValueError, AttributeError, TypeError) as exc:
                problems.append(f"output {name}: {exc}")
                outs.append(None)
                continue
            if spec.end() - spec.offset > region["capacity"]:
                problems.append(f"output {name} does not fit its region")
                outs.append(None)
                continue
            if shape is not None and tuple(spec.shape) != shape:
                problems.append(f"output {name} has shape {tuple(spec.shape)}, expected {shape}")
            want = self.expected_dtypes.get(name)
            if want is not None and spec.dtype != dtype_name(want):
                problems.append(f"output {name} has dtype {spec.dtype}, expected {dtype_name(want)}")
            outs.append(_view(self.snapshot, spec))
        return outs, problems

    def release(self) -> None:
        self.client.release(self.inputs_arena, self.outputs_arena)


def _strides(shape: Any) -> tuple[int, ...]:
    from .arena import contiguous_strides

    if not isinstance(shape, list) or not all(isinstance(n, int) for n in shape):
        raise ValueError("bad shape")
    return contiguous_strides(tuple(shape))


def _view(buffer: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    from .arena import DTYPES

    dtype = DTYPES[spec.dtype]
    if any(n == 0 for n in spec.shape):
        return torch.empty(spec.shape, dtype=dtype, device=buffer.device)
    raw = buffer[spec.offset:spec.end()]
    return torch.as_strided(raw.view(dtype), spec.shape, spec.strides)
