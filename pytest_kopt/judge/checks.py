"""Runtime honesty checks the runner makes around a checked call (advisory: the runner is the
candidate's process, so these catch honest mistakes and the naive cheats; the verdict's data
and times are the supervisor's).

Static policy is bypassed by computed names, so the runner also watches the call itself:
- ``LaunchMonitor`` wraps Triton's launch entry points (``JITFunction.run``, the interpreter's
  ``InterpretedFunction.run`` and, on a GPU, the driver's launcher that compiled kernels a family
  keeps launch through): how many kernels ran, on which stream, how long each took on the host
  (the CPU profile);
- ``CallGuard`` is a ``TorchDispatchMode`` that sees every aten op of the call: torch math is
  recorded (only allocation, views, copies and fills are allowed), fresh allocations are
  remembered (outputs must be among them) and ``empty`` memory is filled with a NaN pattern,
  so an output element nobody wrote is found exactly;
- ``inspect_call`` turns all of that, plus inputs before/after and the outputs, into reasons.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Any, Iterable, Mapping

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# aten ops a candidate may run on the host: allocation, views and reshapes, copies and fills.
ALLOWED_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "ones",
    "ones_like", "full", "full_like", "new_zeros", "new_ones", "new_full", "scalar_tensor", "arange",
    "zero_", "fill_", "copy_", "_to_copy", "clone", "contiguous", "detach", "detach_", "alias", "lift_fresh",
    "lift_fresh_copy", "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "expand", "permute",
    "transpose", "t", "unsqueeze", "squeeze", "flatten", "unflatten", "select", "slice", "narrow", "split",
    "split_with_sizes", "chunk", "unbind", "movedim", "view_as", "set_", "resize_", "cat", "stack",
    "constant_pad_nd", "_local_scalar_dense", "is_nonzero", "sym_size", "sym_stride", "sym_numel",
    "sym_storage_offset", "size", "stride", "numel", "dim", "is_contiguous", "resolve_conj", "resolve_neg",
    "_has_compatible_shallow_copy_type", "empty_permuted",
})
ALLOCATING_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"})
# ops whose schema claims a fresh result but that may return memory shared with an argument
ALIASING_DESPITE_SCHEMA = frozenset({"_unsafe_view", "lift_fresh", "alias", "detach"})

# Bit patterns written into fresh ``empty`` memory: NaNs with a payload no kernel produces.
POISON = {1: -85, 2: 0x7FAB, 4: 0x7FABCDEF, 8: 0x7FFBADC0FFEE0123}
INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """[start, stop) of the bytes a tensor can touch (contiguous envelope of its strides)."""
    if t.numel() == 0:
        return (0, 0)
    start = t.data_ptr()
    span = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride())) + 1
    return (start, start + span * t.element_size())


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    (a0, a1), (b0, b1) = _byte_range(a), _byte_range(b)
    return a0 < b1 and b0 < a1 and a1 > a0 and b1 > b0


def poison(t: torch.Tensor) -> None:
    """Fill fresh memory with the NaN pattern (float and integer tensors; others left alone)."""
    size = t.element_size()
    if t.numel() == 0 or t.dtype in (torch.bool,) or t.is_complex() or size not in POISON:
        return
    t.view(INT_OF_SIZE[size]).fill_(POISON[size])


def unwritten(t: torch.Tensor) -> int:
    """How many elements still hold the poison pattern."""
    size = t.element_size()
    if t.numel() == 0 or t.dtype in (torch.bool,) or t.is_complex() or size not in POISON:
        return 0
    return int((t.view(INT_OF_SIZE[size]) == POISON[size]).sum().item())


# ---------------------------------------------------------------------------------------
class LaunchMonitor:
    """Counts Triton launches and records per-kernel host time; checks the launch stream."""

    def __init__(self) -> None:
        self.launches = 0
        self.names: Counter[str] = Counter()
        self.host_seconds: Counter[str] = Counter()
        self.side_stream: list[str] = []
        self.expected_stream: Any = None  # set by the guard during a call on a GPU
        self.enabled = True  # off for timed calls: its bookkeeping would be timed too
        self.timed_launches = 0  # launches while off: one increment each (a timed call must launch a kernel)
        self._installed = False

    def install(self) -> None:
        """Wrap the launch entry points; must run before any candidate code is imported."""
        if self._installed:
            return
        self._installed = True
        targets = []
        from triton.runtime import jit

        targets.append(jit.JITFunction)
        try:
            from triton.runtime import interpreter

            targets.append(interpreter.InterpretedFunction)
        except Exception:  # pragma: no cover - older triton without the interpreter class
            pass
        current_stream = torch.cuda.current_stream if torch.cuda.is_available() else None
        perf_counter = time.perf_counter
        monitor = self
        # On a GPU every launch, through JITFunction.run or a compiled kernel a family keeps (its
        # host path cut to the bone), ends in the driver's launcher: count launches there.
        launcher = None
        if current_stream is not None:
            try:
                from triton.backends.nvidia.driver import CudaLauncher as launcher
            except Exception:  # pragma: no cover - another backend: count at JITFunction.run
                launcher = None

        def wrap(original):
            def run(self, *args, grid, warmup, **kwargs):
                if warmup or not monitor.enabled:
                    if not warmup and launcher is None:
                        monitor.timed_launches += 1
                    return original(self, *args, grid=grid, warmup=warmup, **kwargs)
                name = getattr(getattr(self, "fn", None), "__name__", None) or getattr(self, "__name__", "kernel")
                monitor.names[name] += 1
                if launcher is None:
                    monitor.launches += 1
                    if monitor.expected_stream is not None and current_stream is not None:
                        if current_stream() != monitor.expected_stream:
                            monitor.side_stream.append(name)
                start = perf_counter()
                try:
                    return original(self, *args, grid=grid, warmup=warmup, **kwargs)
                finally:
                    monitor.host_seconds[name] += perf_counter() - start

            run.__wrapped__ = original  # type: ignore[attr-defined]
            return run

        for cls in targets:
            cls.run = wrap(cls.run)
        if launcher is not None:
            # count at the bottom: each launcher's C entry (``self.launch``) wrapped as the launcher is made, so a
            # launch through ``__call__`` and one that calls ``.run.launch`` straight are both seen, stream and all
            original_init = launcher.__init__

            def init(self, *args, **kwargs):
                original_init(self, *args, **kwargs)
                self.launch = monitor.counted_launch(self.launch)

            init.__wrapped__ = original_init  # type: ignore[attr-defined]
            launcher.__init__ = init

    def counted_launch(self, raw: Any) -> Any:
        """``raw`` (a launcher's C entry: grid, stream, function, then the rest) with each call counted and its
        stream checked while the monitor is enabled."""
        monitor = self

        def launch(gridX, gridY, gridZ, stream, *rest):
            if monitor.enabled:
                monitor.launches += 1
                expected = monitor.expected_stream
                if expected is not None and stream != expected.cuda_stream:
                    monitor.side_stream.append("a compiled kernel")
            else:
                monitor.timed_launches += 1
            return raw(gridX, gridY, gridZ, stream, *rest)

        launch.__wrapped__ = raw  # type: ignore[attr-defined]
        return launch

    def reset(self) -> None:
        self.launches = 0
        self.names.clear()
        self.host_seconds.clear()
        self.side_stream.clear()


class CallGuard(TorchDispatchMode):
    """Watches every aten op of one candidate call (see the module docstring)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # never compiled; and True would import torch._dynamo (seconds) on first use

    def __init__(self, poison_fresh: bool = True) -> None:
        super().__init__()
        self.poison_fresh = poison_fresh
        self.forbidden: Counter[str] = Counter()
        self.fresh: set[int] = set()
        self.side_stream_ops: Counter[str] = Counter()
        self.expected_stream: Any = None
        self._current_stream = torch.cuda.current_stream if torch.cuda.is_available() else None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name not in ALLOWED_OPS:
            self.forbidden[str(func.overloadpacket)] += 1
        if self.expected_stream is not None and self._current_stream is not None:
            if self._current_stream() != self.expected_stream:
                self.side_stream_ops[str(func.overloadpacket)] += 1
        if name not in ALIASING_DESPITE_SCHEMA:
            returns = func._schema.returns
            leaves = tree_leaves(out)
            if len(returns) == 1 and len(leaves) > 1:  # Tensor[] result: one schema entry
                fresh_flags = [returns[0].alias_info is None] * len(leaves)
            else:
                fresh_flags = [r.alias_info is None for r in returns]
            for leaf, is_fresh in zip(leaves, fresh_flags):
                if is_fresh and isinstance(leaf, torch.Tensor) and leaf.numel():
                    self.fresh.add(_storage_key(leaf))
                    if self.poison_fresh and name in ALLOCATING_OPS:
                        poison(leaf)
        return out


# ---------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------
def snapshot_inputs(inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    size = a.element_size()
    if size in INT_OF_SIZE and not a.is_complex() and a.dtype != torch.bool:
        return bool(torch.equal(a.view(INT_OF_SIZE[size]), b.view(INT_OF_SIZE[size])))
    return bool(torch.equal(a, b))


def inspect_call(
    *,
    outputs: Any,
    output_names: list[str],
    inputs: Mapping[str, Any],
    before: Mapping[str, torch.Tensor],
    guard: CallGuard | None,
    monitor: LaunchMonitor,
    expected_dtypes: Mapping[str, torch.dtype],
    device: torch.device,
) -> list[str]:
    """Reasons this call was dishonest or malformed (empty list: fine)."""
    reasons: list[str] = []
    if monitor.launches == 0:
        reasons.append("no Triton kernel was launched during the call: the math must run in a @triton.jit kernel")
    if monitor.side_stream:
        reasons.append(f"Triton kernels launched on a side stream ({', '.join(sorted(set(monitor.side_stream)))}): work must run on the caller's current stream")
    if guard is not None:
        if guard.forbidden:
            ops = ", ".join(f"{op} x{n}" for op, n in guard.forbidden.most_common(6))
            reasons.append(f"torch computed during the call ({ops}): torch may only allocate, view and copy; do the math in Triton")
        if guard.side_stream_ops:
            reasons.append(f"torch ops ran on a side stream ({', '.join(guard.side_stream_ops)}): work must run on the caller's current stream")

    outs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    input_tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    if input_tensors:  # "cuda" and "cuda:0" name one device: compare with where the inputs really are
        device = next(iter(input_tensors.values())).device
    seen: list[tuple[str, torch.Tensor]] = []
    for name, out in zip(output_names, outs):
        if not isinstance(out, torch.Tensor):
            continue
        if out.device != device:
            reasons.append(f"output {name} is on {out.device}, the inputs on {device}")
            continue
        for in_name, tensor in input_tensors.items():
            if overlaps(out, tensor):
                reasons.append(f"output {name} aliases input {in_name}: outputs must be freshly allocated")
        for other_name, other in seen:
            if overlaps(out, other):
                reasons.append(f"outputs {other_name} and {name} share memory")
        seen.append((name, out))
        if guard is not None and out.numel() and _storage_key(out) not in guard.fresh:
            reasons.append(f"output {name} was not allocated during this call (cached or reused from an earlier call)")
        if guard is not None and guard.poison_fresh:
            missing = unwritten(out)
            if missing:
                reasons.append(f"output {name}: {missing} of {out.numel()} elements were never written (uninitialised memory)")
        want = expected_dtypes.get(name)
        if want is not None and out.dtype != want:
            reasons.append(f"output {name} has dtype {out.dtype}, expected {want}")
    for name, old in before.items():
        now = inputs[name]
        if not _same_bits(now, old):
            reasons.append(f"input {name} was modified by the call: inputs must be left unchanged")
    return reasons
