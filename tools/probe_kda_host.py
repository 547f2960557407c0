"""Where one call of the chunked KDA family spends its host (CPU) time, piece by piece (developer probe, H200).

    PYTHONPATH=. python3 tools/probe_kda_host.py OUT_DIR [--shape headline] [--file CANDIDATE.py] [--knobs JSON]
                                                 [--calls 300] [--burst 50] [--sets 2] [--profile-calls 200]
    PYTHONPATH=. python3 tools/probe_kda_host.py OUT_DIR --smoke     # CPU interpreter, tiny shape: the plumbing only

The family rendered at its defaults (``--knobs`` overrides some; ``--file`` probes a candidate file instead) is
written to OUT_DIR/kda_candidate.py and imported. After warm-up calls (the first compiles and builds the plan), every
figure is per call, in microseconds, median and p90 of ``--calls`` calls timed one by one with
``time.perf_counter_ns``, the GPU left running behind them (synchronised only between bursts of ``--burst`` calls,
outside the timed calls: the headline's device time, ~250 us, is twice its host time, and a long burst would fill
the launch queue and time the GPU instead):

- ``whole``: ``kernel(**inputs)`` as a caller makes it;
- ``wrapped``: the same calls with the plan's launch objects wrapped: each ``_Launch.__call__`` timed, and the rest;
- ``steps``: a replica of ``kernel`` and ``_Plan.__call__`` (host.py), each step timed: the stream
  (``torch.cuda.current_stream(device).cuda_stream``, looked up once and passed to every launch), the cache key,
  the plan look-up (``_PLANS.get``), the two allocations, the values, the descriptors' ``base`` (set, cleared), and
  every launch as ``_Launch.__call__`` makes it with launch "compiled": the slot writes (and their clearing), then
  the launcher ``run(*grid, stream, function, packed_metadata, None, None, None, *args)`` as a whole (Triton 3.6's
  ``CudaLauncher.__call__``; no ``CompiledKernel[grid]`` runner, launch metadata nor hooks). Its outputs are
  compared with ``kernel``'s (``replica_matches``);
- ``launcher_apart``: a second pass of the replica in which each launcher is taken apart as ``CudaLauncher.__call__``
  and the nvidia driver's ``wrap_handle_tensordesc`` (``run.launch``) run it: the slots, the scratch, the argument
  conversion (each TMA descriptor's ``make_tensordesc_arg``, which encodes a CUtensorMap by
  ``fill_tma_descriptor``, timed on its own) and the C launcher. Outputs compared (``launcher_apart_matches``);
- ``micro``: pieces timed alone in tight loops, nothing launched but the old path's ``flags.zero_()`` (mean per
  call): each descriptor's encoding, the conversion of each launch's arguments, the stream look-ups, the key, the
  plan look-up, the allocations, ``data_ptr``; rows marked "old path only" are what the former host paid per call
  (Triton's driver device and stream look-ups, the launch hook, zeroing the flags) and the present one does not;
- ``direct``: what a host path that skips the remaining per-launch Python could reach, the stream, key and plan
  look-up kept as ``kernel`` makes them: each C launcher called straight with its flat arguments, the descriptors
  whose base is a plan buffer encoded once, pointers passed as integers (the plan's own buffers by the addresses
  the plan holds; no ``data_ptr`` call nor ``cuPointerGetAttribute`` in the launcher), no launch hooks (as the
  host), the stream cached. ``direct_encode`` re-encodes the caller's descriptors (q, k, g, v, o) every call;
  ``direct_cached`` keeps their CUtensorMaps by address (a map holds only the address and the plan's geometry);
  ``direct_cached_tensors`` passes the caller's tensors as tensors (as the host does), not integers;
  ``direct_cached_rawstream`` builds the key with ``torch._C._cuda_getCurrentRawStream`` (the same integer as
  ``torch.cuda.current_stream(device).cuda_stream``). ``direct_encode_steps`` takes its body apart. Outputs compared
  with ``kernel``'s (``direct_matches``);
- cProfile of ``--profile-calls`` calls: OUT_DIR/cprofile.txt (top 40 by cumulative time, then by own time).

Writes OUT_DIR/probe_kda_host.json and prints a compact table. A probe of Triton 3.6's internals: what it cannot
take apart (another Triton, the CPU interpreter, the "jit" launch knob) is reported as skipped, with the reason.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import platform
import pstats
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_kopt.families import load_family  # noqa: E402
from pytest_kopt.gate import load_module  # noqa: E402
from pytest_kopt.problems import get_problem  # noqa: E402

PROBLEM = get_problem("kda")
SHAPES = {
    "headline": dict(PROBLEM.headline_cases[0]),  # B1 T8192 H16 K=V=128, +hT
    "smoke": {"B": 1, "T": 32, "H": 1, "K": 16, "V": 16, "initial_state": False, "output_final_state": True},
}
ns = time.perf_counter_ns


# ---- figures ------------------------------------------------------------------------------------------------------
def stats(samples_ns: list[int]) -> dict:
    """median, p90 (nearest rank), mean and min of per-call samples, in microseconds."""
    if not samples_ns:
        return {"n": 0}
    s = sorted(samples_ns)
    p90 = s[min(len(s) - 1, max(0, int(round(0.9 * len(s))) - 1))]
    return {"n": len(s), "median_us": statistics.median(s) / 1e3, "p90_us": p90 / 1e3,
            "mean_us": sum(s) / len(s) / 1e3, "min_us": s[0] / 1e3}


class Samples(dict):
    """name -> list of per-call ns, in the order first seen."""

    def add(self, name: str, value: int) -> None:
        self.setdefault(name, []).append(value)

    def report(self) -> dict:
        return {name: stats(values) for name, values in self.items()}


def micro_us(fn, reps: int, repeats: int = 5) -> float:
    """Mean us per call of fn() over reps calls, the median of ``repeats`` such loops (after one warm call)."""
    fn()
    means = []
    for _ in range(repeats):
        t0 = ns()
        for _ in range(reps):
            fn()
        means.append((ns() - t0) / reps / 1e3)
    return statistics.median(means)


def bursts(calls: int, burst: int):
    """(start, count) of each burst."""
    done = 0
    while done < calls:
        n = min(burst, calls - done)
        yield done, n
        done += n


# ---- the family's call, mirrored ----------------------------------------------------------------------------------
def current_stream(q):
    """The stream as host.py's ``kernel`` looks it up (once per call; in the key and passed to every launch)."""
    return torch.cuda.current_stream(q.device).cuda_stream if q.is_cuda else None


def replica_key(q, k, v, g, beta, h0, output_final_state, stream):
    """The plan key exactly as host.py's ``kernel`` builds it (checked against the plan cache in ``probe``)."""
    tensors = (q, k, v, g, beta) if h0 is None else (q, k, v, g, beta, h0)
    return (q.shape, k.shape, v.shape, g.shape, beta.shape, q.dtype, k.dtype, v.dtype, g.dtype, beta.dtype,
            q.stride(), k.stride(), v.stride(), g.stride(), beta.stride(), bool(output_final_state),
            tuple((t.get_device(), t.data_ptr() % 16 == 0) for t in tensors),
            None if h0 is None else (h0.shape, h0.stride(), h0.dtype), stream)


def key_of(x: dict, stream=None):
    """The key of a call on ``x``, the stream looked up as ``kernel`` does unless given."""
    stream = current_stream(x["q"]) if stream is None else stream
    return replica_key(x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], x["output_final_state"], stream)


def make_values(plan, x, o, final) -> dict:
    K = plan.shape[3]
    scale = x["scale"]
    return {"q": x["q"], "k": x["k"], "v": x["v"], "g": x["g"], "beta": x["beta"], "h0": x["initial_state"], "o": o,
            "ht": final, "scale": float(K ** -0.5 if scale is None else scale)}


def launch_name(i: int, launch) -> str:
    fn = getattr(launch, "fn", None)
    return f"launch{i}:{getattr(fn, '__name__', type(launch).__name__)}"


def is_descriptor(arg) -> bool:
    return hasattr(arg, "block_shape") and hasattr(arg, "base")


# ---- Triton 3.6's launch, taken apart -----------------------------------------------------------------------------
def closure_vars(fn) -> dict:
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or not cells:
        return {}
    return {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells)}


def launcher_parts(launch_fn):
    """(the C launch function, the positions of the descriptor arguments among the kernel's, their metadata) of a
    ``CudaLauncher.launch``: the nvidia driver's ``wrap_handle_tensordesc`` closure where the kernel takes
    descriptors, else the C function itself."""
    free = closure_vars(launch_fn)
    if not free:
        return launch_fn, frozenset(), []
    if not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= set(free):
        raise RuntimeError(f"unexpected launcher closure {sorted(free)} (not Triton 3.6's wrap_handle_tensordesc)")
    return free["launcher"], free["tensordesc_indices"], list(free["tensordesc_meta"])


def convert_args(args, indices, meta, make_arg, timings=None, names=None) -> list:
    """The kernel arguments as ``wrap_handle_tensordesc``'s ``inner`` hands them to the C launcher: each descriptor
    expanded by ``make_arg`` (``make_tensordesc_arg``). ``timings`` (a list) gets (name, ns) per descriptor."""
    out, j = [], 0
    for i, arg in enumerate(args):
        if i in indices:
            if timings is None:
                out.extend(make_arg(arg, meta[j]))
            else:
                t0 = ns()
                out.extend(make_arg(arg, meta[j]))
                timings.append((f"desc {names[i] if names else i}", ns() - t0))
            j += 1
        else:
            out.append(arg)
    return out


def tma_fill_params(desc, meta):
    """fill_tma_descriptor's arguments after the address, as the nvidia driver's make_tensordesc_arg makes them."""
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST

    shape = list(desc.shape)
    if meta["fp4_padded"]:
        shape[-1] *= 2
    return (meta["swizzle"], meta["elem_size"], TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]], meta["block_size"], shape,
            list(desc.strides), 1 if desc.padding == "nan" else 0), shape


class Parts:
    """One compiled launch (``launch.kernel`` is ``(run, function, packed_metadata)``, ``run`` Triton 3.6's
    ``CudaLauncher``), run the way ``_Launch.__call__`` runs it: the launcher called whole, or taken apart as
    ``CudaLauncher.__call__`` and ``wrap_handle_tensordesc`` (its ``launch``) run it."""

    def __init__(self, launch):
        from triton.backends.nvidia.driver import make_tensordesc_arg
        from triton.runtime import _allocation

        kernel = launch.kernel
        if not (isinstance(kernel, tuple) and len(kernel) == 3):
            raise RuntimeError(f"launch.kernel is a {type(kernel).__name__}, not (run, function, packed_metadata)")
        self.launch = launch
        self.cl, self.function, self.packed = kernel  # the CudaLauncher, the CUfunction, the packed metadata
        self.c_launch, self.indices, self.meta = launcher_parts(self.cl.launch)
        self.make_arg, self.allocation = make_tensordesc_arg, _allocation
        self.names = list(launch.fn.arg_names)

    def scratch(self, size, align, allocator, stream):
        if size > 0:  # as CudaLauncher.__call__'s allocate_scratch
            g = self.launch.grid
            return allocator.get()(g[0] * g[1] * g[2] * self.cl.num_ctas * size, align, stream)
        return None

    def run(self, values, stream, acc: Samples, prefix: str, apart: bool) -> None:
        launch, cl = self.launch, self.cl
        args, grid = launch.args, launch.grid
        t0 = ns()
        for i, role in launch.slots:
            args[i] = values[role]
        t1 = ns()
        if apart:
            descs = []
            gs = self.scratch(cl.global_scratch_size, cl.global_scratch_align, self.allocation._allocator, stream)
            ps = self.scratch(cl.profile_scratch_size, cl.profile_scratch_align, self.allocation._profile_allocator,
                              stream)
            t2 = ns()
            flat = [grid[0], grid[1], grid[2], stream, self.function, cl.launch_cooperative_grid, cl.launch_pdl, gs, ps,
                    self.packed, None, None, None]
            flat += convert_args(args, self.indices, self.meta, self.make_arg, descs, self.names)
            t3 = ns()
            self.c_launch(*flat)
            t4 = ns()
            rows = [("scratch", t2 - t1), ("convert_args", t3 - t2)]
            rows += [(f"convert_args/{desc}", dt) for desc, dt in descs]
            rows.append(("c_launch", t4 - t3))
        else:  # _Launch.__call__'s launch, as it makes it
            cl(*grid, stream, self.function, self.packed, None, None, None, *args)
            t4 = ns()
            rows = [("run", t4 - t1)]
        for i, _ in launch.slots:
            args[i] = None
        t5 = ns()
        acc.add(f"{prefix}/total", t5 - t0)
        acc.add(f"{prefix}/slots", t1 - t0 + t5 - t4)
        for name, dt in rows:
            acc.add(f"{prefix}/{name}", dt)


def stepped_call(mod, plan, x, acc: Samples, parts: dict, key_ok: bool, apart: bool = False):
    """kernel(**x) as host.py makes it, each step timed into ``acc``; returns (o, final). ``apart``: the compiled
    launches' launchers taken apart (else called whole)."""
    t0 = ns()
    stream = current_stream(x["q"])
    t1 = ns()
    key = key_of(x, stream)
    t2 = ns()
    if key_ok and mod._PLANS.get(key) is not plan:
        raise RuntimeError("the plan cache gave another plan than the probe's")
    t3 = ns()
    B, T, H, K, V = plan.shape
    o = torch.empty((B, T, H, V), dtype=x["v"].dtype, device=x["q"].device)
    t4 = ns()
    final = torch.empty((B, H, K, V), dtype=torch.float32, device=x["q"].device) if plan.want_final else None
    t5 = ns()
    values = make_values(plan, x, o, final)
    t6 = ns()
    for role, desc in plan.descs:
        desc.base = values[role]
    t7 = ns()
    for name, dt in (("stream", t1 - t0), ("key", t2 - t1), ("plan_lookup", t3 - t2), ("empty_o", t4 - t3),
                     ("empty_final", t5 - t4), ("values_dict", t6 - t5), ("desc_base_set", t7 - t6)):
        acc.add(name, dt)
    for i, launch in enumerate(plan.launches):
        name = launch_name(i, launch)
        if name in parts:
            parts[name].run(values, stream, acc, name, apart)
        else:
            ta = ns()
            launch(values, stream)
            acc.add(f"{name}/total", ns() - ta)
    t8 = ns()
    for _, desc in plan.descs:
        desc.base = None
    t9 = ns()
    acc.add("desc_base_clear", t9 - t8)
    acc.add("total", t9 - t0)
    return o, final


class TimedLaunch:
    """Stands in a plan's launch list for one launch object, timing its ``__call__``."""

    def __init__(self, inner, name: str, acc: Samples):
        self.inner, self.name, self.acc = inner, name, acc

    def __call__(self, values, stream):
        t0 = ns()
        self.inner(values, stream)
        self.acc.add(self.name, ns() - t0)


# ---- the direct path (what a host could reach) --------------------------------------------------------------------
class Direct:
    """The plan's launches through the C launchers straight: fixed arguments converted once (the plan's buffers by
    the addresses the plan holds, their descriptors encoded once), per call only the caller's tensors (as integers)
    and descriptors. ``ints`` False: the caller's tensors passed as tensors, as the host passes them (the C launcher
    then calls data_ptr and cuPointerGetAttribute). No launch hooks, as the host."""

    def __init__(self, plan, parts: dict, ints: bool = True):
        from triton.runtime.driver import driver

        self.plan, self.fill, self.ints = plan, driver.active.utils.fill_tma_descriptor, ints
        stream = torch.cuda.current_stream().cuda_stream  # the plan's (its key holds the stream)
        per_call = {id(desc): role for role, desc in plan.descs}
        self.launches = []
        for i, launch in enumerate(plan.launches):
            name = launch_name(i, launch)
            p = parts.get(name)
            if p is None:
                raise RuntimeError(f"{name} has no compiled kernel to call")
            cl = p.cl
            if cl.global_scratch_size or cl.profile_scratch_size:
                raise RuntimeError(f"{name} needs scratch memory")
            roles = dict(launch.slots)
            flat = [launch.grid[0], launch.grid[1], launch.grid[2], stream, p.function, cl.launch_cooperative_grid,
                    cl.launch_pdl, None, None, p.packed, None, None, None]
            ptr_slots, desc_slots, j = [], [], 0
            for pos, arg in enumerate(launch.args):
                if pos in p.indices:
                    meta = p.meta[j]
                    j += 1
                    if meta is None:
                        raise RuntimeError("a descriptor without TMA metadata (not lowered to a CUtensorMap)")
                    params, shape = tma_fill_params(arg, meta)
                    if id(arg) in per_call:
                        desc_slots.append((len(flat), per_call[id(arg)], params, {}))
                        flat.append(None)
                    else:  # a plan buffer: encoded once, kept alive in flat
                        flat.append(self.fill(arg.base.data_ptr(), *params))
                    flat += [*shape, *arg.strides]
                elif pos in roles:
                    ptr_slots.append((len(flat), roles[pos]))
                    flat.append(None)
                elif isinstance(arg, torch.Tensor):  # not so with launch "compiled": the plan holds addresses
                    flat.append(arg.data_ptr())
                else:
                    flat.append(arg)
            self.launches.append((name, p.c_launch, flat, ptr_slots, desc_slots))

    def __call__(self, x, cached: bool, acc: Samples | None = None):
        plan, ints = self.plan, self.ints
        B, T, H, K, V = plan.shape
        t0 = ns()
        o = torch.empty((B, T, H, V), dtype=x["v"].dtype, device=x["q"].device)
        final = torch.empty((B, H, K, V), dtype=torch.float32, device=x["q"].device) if plan.want_final else None
        values = make_values(plan, x, o, final)
        t1 = ns()
        if acc is not None:
            acc.add("empty_o+final+values", t1 - t0)
        fill = self.fill
        for name, c_launch, flat, ptr_slots, desc_slots in self.launches:
            t3 = ns()
            for pos, role in ptr_slots:
                value = values[role]
                flat[pos] = value.data_ptr() if ints and isinstance(value, torch.Tensor) else value
            t4 = ns()
            for pos, role, params, cache in desc_slots:
                ptr = values[role].data_ptr()
                if cached:
                    tmap = cache.get(ptr)
                    if tmap is None:
                        if len(cache) >= 8:
                            cache.clear()
                        tmap = cache[ptr] = fill(ptr, *params)
                    flat[pos] = tmap
                else:
                    flat[pos] = fill(ptr, *params)
            t5 = ns()
            c_launch(*flat)
            if acc is not None:
                t6 = ns()
                acc.add(f"{name}/pointer slots", t4 - t3)
                acc.add(f"{name}/descriptors ({len(desc_slots)} per call)", t5 - t4)
                acc.add(f"{name}/c_launch", t6 - t5)
        for _, c_launch, flat, ptr_slots, desc_slots in self.launches:
            for pos, _ in ptr_slots:
                flat[pos] = None
            for pos, *_ in desc_slots:
                flat[pos] = None
        return o, final


def direct_call(mod, direct: Direct, cached: bool, key_ok: bool, raw_stream: bool = False):
    """A whole call on the direct path: the stream and plan key (as kernel builds them, or with the raw stream handle
    in place of ``torch.cuda.current_stream(...).cuda_stream``: the same integer), the plan cache, then ``direct``."""
    def stream_raw(q):
        return torch._C._cuda_getCurrentRawStream(q.device.index)  # a CUDA tensor's device has its index

    find_stream = stream_raw if raw_stream else current_stream

    def call(x):
        key = key_of(x, find_stream(x["q"]))
        if key_ok and mod._PLANS.get(key) is None:
            raise KeyError("the key is not the plan's")
        return direct(x, cached)

    return call


# ---- the probe ----------------------------------------------------------------------------------------------------
def same(a, b) -> dict:
    """Whether two (o, final) pairs are equal, and their largest difference."""
    diff = 0.0
    equal = True
    for x, y in zip(a, b):
        if x is None or y is None:
            equal &= x is None and y is None
            continue
        equal &= bool(torch.equal(x, y))
        diff = max(diff, float((x.float() - y.float()).abs().max()))
    return {"equal": equal, "max_abs_diff": diff}


def environment(device: str) -> dict:
    import triton

    env = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
           "device": device, "machine": platform.machine(), "processor": platform.processor()}
    try:
        env["cpu"] = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except Exception:  # noqa: BLE001 - informational
        pass
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
    return env


def plan_summary(plan, parts: dict) -> dict:
    out = {"shape": list(plan.shape), "want_final": plan.want_final, "flags": plan.flags is not None,
           "descs_set_per_call": [role for role, _ in plan.descs], "launches": []}
    for i, launch in enumerate(plan.launches):
        name = launch_name(i, launch)
        args = getattr(launch, "args", [])
        entry = {"name": name, "grid": list(getattr(launch, "grid", ())), "options": getattr(launch, "options", {}),
                 "args": len(args), "descriptors": sum(map(is_descriptor, args)),
                 "tensors": sum(isinstance(a, torch.Tensor) for a in args),
                 "buffers_by_address": len(getattr(launch, "owned", [])),
                 "per_call_slots": [role for _, role in getattr(launch, "slots", [])],
                 "compiled": getattr(launch, "kernel", None) is not None}
        if name in parts:
            p = parts[name]
            entry["tensordesc_meta"] = [None if m is None else {k: m[k] for k in ("swizzle", "elem_size", "block_size")}
                                        for m in p.meta]
            entry["global_scratch"], entry["launch_pdl"] = p.cl.global_scratch_size, p.cl.launch_pdl
        out["launches"].append(entry)
    return out


def run_micro(plan, parts: dict, x: dict, device: str, reps: int, key_ok: bool, mod) -> dict:
    """Pieces alone, nothing launched but the old path's flags.zero_ (on a spare buffer; mean us per call)."""
    out = {}
    q = x["q"]
    B, T, H, K, V = plan.shape
    tensors = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    out["time.perf_counter_ns() (the probe's own clock)"] = micro_us(ns, reps)
    out["stream + key (replica of kernel's)"] = micro_us(lambda: key_of(x), reps)
    stream = current_stream(q)
    out["key, the stream given"] = micro_us(lambda: key_of(x, stream), reps)
    out["key: (get_device, data_ptr alignment) tuple"] = micro_us(
        lambda: tuple((t.get_device(), t.data_ptr() % 16 == 0) for t in tensors), reps)
    out["key: 5 x stride()"] = micro_us(lambda: (q.stride(), x["k"].stride(), x["v"].stride(), x["g"].stride(),
                                                 x["beta"].stride()), reps)
    out["key: 5 x shape"] = micro_us(lambda: (q.shape, x["k"].shape, x["v"].shape, x["g"].shape, x["beta"].shape), reps)
    key = key_of(x)
    out["key: hash(key)"] = micro_us(lambda: hash(key), reps)
    if key_ok:
        out["plan cache get"] = micro_us(lambda: mod._PLANS.get(key), reps)
    out["tensor.data_ptr()"] = micro_us(q.data_ptr, reps)
    out["tensor.get_device()"] = micro_us(q.get_device, reps)
    out["torch.empty(o)"] = micro_us(lambda: torch.empty((B, T, H, V), dtype=x["v"].dtype, device=q.device), reps)
    out["torch.empty(final)"] = micro_us(lambda: torch.empty((B, H, K, V), dtype=torch.float32, device=q.device), reps)
    if device == "cuda":
        idx = q.device.index
        out["torch.cuda.current_stream(dev).cuda_stream (kernel's)"] = micro_us(
            lambda: torch.cuda.current_stream(q.device).cuda_stream, reps)
        out["torch._C._cuda_getCurrentRawStream(idx) (alternative)"] = micro_us(
            lambda: torch._C._cuda_getCurrentRawStream(idx), reps)
        if plan.flags is not None:  # not the plan's: its flags carry the generation the scan keeps
            spare = torch.zeros_like(plan.flags)
            out["flags.zero_() (old path only; a buffer of the flags' size)"] = micro_us(spare.zero_, reps)
            torch.cuda.synchronize()
    if not parts:
        return out
    from triton import knobs
    from triton.runtime.driver import driver

    out["driver.active.get_current_device() (old path only)"] = micro_us(driver.active.get_current_device, reps)
    dev = driver.active.get_current_device()
    out["driver.active.get_current_stream(dev) (old path only)"] = micro_us(
        lambda: driver.active.get_current_stream(dev), reps)
    out["launch_enter_hook(None) (old path only; HookChain, empty)"] = micro_us(
        lambda: knobs.runtime.launch_enter_hook(None), reps)
    o = torch.empty((B, T, H, V), dtype=x["v"].dtype, device=q.device)
    final = torch.empty((B, H, K, V), dtype=torch.float32, device=q.device) if plan.want_final else None
    values = make_values(plan, x, o, final)
    for role, desc in plan.descs:
        desc.base = values[role]
    try:
        for name, p in parts.items():
            launch, args = p.launch, p.launch.args
            for i, role in launch.slots:
                args[i] = values[role]
            out[f"{name}: convert_args (all {len(p.meta)} descriptors)"] = micro_us(
                lambda: convert_args(args, p.indices, p.meta, p.make_arg), reps)
            j = 0
            for pos, arg in enumerate(args):
                if pos not in p.indices:
                    continue
                meta = p.meta[j]
                j += 1
                out[f"{name}: make_tensordesc_arg({p.names[pos]})"] = micro_us(lambda: p.make_arg(arg, meta), reps)
                if meta is not None:
                    params, _ = tma_fill_params(arg, meta)
                    ptr = arg.base.data_ptr()
                    fill = driver.active.utils.fill_tma_descriptor
                    out[f"{name}: fill_tma_descriptor({p.names[pos]}) alone"] = micro_us(lambda: fill(ptr, *params), reps)
            ptr_args = [a for a in args if isinstance(a, torch.Tensor)]
            out[f"{name}: data_ptr() of its {len(ptr_args)} tensor args (the caller's)"] = micro_us(
                lambda: [a.data_ptr() for a in ptr_args], reps)
            for i, _ in launch.slots:
                args[i] = None
    finally:
        for _, desc in plan.descs:
            desc.base = None
    return out


def run_profile(fn, sets, calls, sync, path: Path) -> list[dict]:
    """cProfile of ``calls`` calls: path gets the top 40 by cumulative time in microseconds per call, then pstats'
    own listings (cumulative, then own time); returns the top 25 by own time."""
    fn(sets[0])
    sync()
    prof = cProfile.Profile()
    prof.enable()
    for i in range(calls):
        fn(sets[i % len(sets)])
    prof.disable()
    sync()
    st = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (file, line, func), (cc, nc, tt, ct, _callers) in st.stats.items():
        where = "~" if file == "~" else f"{Path(file).parent.name}/{Path(file).name}:{line}"
        rows.append({"function": f"{where}({func})", "ncalls": nc, "calls_per_kernel_call": nc / calls,
                     "tottime_us_per_call": tt / calls * 1e6, "cumtime_us_per_call": ct / calls * 1e6})
    text = io.StringIO()
    text.write(f"cProfile of {calls} calls of kernel(**inputs) (profiling slows every Python call: compare pieces, "
               "not totals, with the timings).\nNote: C functions of the same name share one row (the two kernels' "
               "__triton_launcher.launch: one of them is missing).\n\n")
    text.write(f"{'us/call cum':>11s} {'us/call own':>11s} {'n/call':>7s}  function (top 40 by cumulative time)\n")
    for r in sorted(rows, key=lambda r: -r["cumtime_us_per_call"])[:40]:
        text.write(f"{r['cumtime_us_per_call']:11.2f} {r['tottime_us_per_call']:11.2f} {r['calls_per_kernel_call']:7.2f}"
                   f"  {r['function']}\n")
    st.stream = text
    text.write("\n\n==== pstats, by cumulative time (seconds over all calls) ====\n")
    st.sort_stats("cumulative").print_stats(40)
    text.write("\n\n==== pstats, by own time ====\n")
    st.sort_stats("tottime").print_stats(40)
    path.write_text(text.getvalue())
    rows.sort(key=lambda r: -r["tottime_us_per_call"])
    return rows[:25]


def timed_loop(fn, sets, calls, burst, sync, acc: Samples | None = None, name: str = "whole") -> dict:
    per, loop = [], []
    for start, n in bursts(calls, burst):
        sync()
        t_loop = ns()
        for i in range(start, start + n):
            x = sets[i % len(sets)]
            t0 = ns()
            fn(x)
            per.append(ns() - t0)
        loop.append((ns() - t_loop) / n)
        sync()
    if acc is not None:
        acc.setdefault(name, []).extend(per)
    out = stats(per)
    out["loop_us_per_call"] = statistics.median(loop) / 1e3
    head, tail = per[: min(20, len(per))], per[-min(20, len(per)):]
    out["first20_median_us"], out["last20_median_us"] = statistics.median(head) / 1e3, statistics.median(tail) / 1e3
    return out


def probe(args) -> dict:
    device = "cpu" if args.smoke else "cuda"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out_dir = args.out_dir
    if args.file:
        path = Path(args.file)
    else:
        path = out_dir / "kda_candidate.py"
        path.write_text(load_family("kda_chunked").render(json.loads(args.knobs) if args.knobs else {}))
    mod = load_module(path)
    shape = dict(SHAPES[args.shape])
    report = {"environment": environment(device), "candidate": str(path), "knobs": getattr(mod, "KNOBS", None),
              "case": PROBLEM.describe(shape), "calls": args.calls, "burst": args.burst, "sets": args.sets,
              "skipped": {}}
    sets = [PROBLEM.make_inputs(shape, device=device, seed=seed) for seed in range(args.sets)]

    def call(x):
        return mod.kernel(**x)

    for x in sets:  # compile, plan, load
        call(x)
        call(x)
    sync()
    key = key_of(sets[0])
    key_ok = key in mod._PLANS
    plan = mod._PLANS[key] if key_ok else next(reversed(mod._PLANS.values()))
    report["key_replica_matches"] = key_ok
    if len(mod._PLANS) != 1:
        report["skipped"]["plans"] = f"{len(mod._PLANS)} plans cached after the warm-up (expected one)"

    parts, why = {}, None
    for i, launch in enumerate(plan.launches):
        if getattr(launch, "kernel", None) is None:
            why = "no compiled kernel on the launch (CPU interpreter or the 'jit' launch knob): launched whole"
            continue
        try:
            parts[launch_name(i, launch)] = Parts(launch)
        except Exception as exc:  # noqa: BLE001 - another Triton: report, time the launch whole
            why = f"{type(exc).__name__}: {exc}"
    if why:
        report["skipped"]["launch_breakdown"] = why
    report["plan"] = plan_summary(plan, parts)

    # 1. the whole call
    print(f"{report['case']} on {device}: timing {args.calls} calls ...", flush=True)
    report["whole"] = timed_loop(call, sets, args.calls, args.burst, sync)

    # 2. the plan's launches wrapped
    acc = Samples()
    original = list(plan.launches)
    plan.launches[:] = [TimedLaunch(launch, launch_name(i, launch), acc) for i, launch in enumerate(original)]
    try:
        report["wrapped"] = {"whole": timed_loop(call, sets, args.calls, args.burst, sync, acc)}
    finally:
        plan.launches[:] = original
    n = len(acc["whole"])
    launch_names = [launch_name(i, launch) for i, launch in enumerate(original)]
    rest = [acc["whole"][c] - sum(acc[name][c] for name in launch_names) for c in range(n)]
    report["wrapped"].update({name: stats(acc[name]) for name in launch_names})
    report["wrapped"]["rest (stream, key, plan look-up, allocations, descriptors)"] = stats(rest)

    # 3. the steps, each launcher called whole; then (3b) a second pass with the launchers taken apart
    steps, apart = Samples(), Samples()
    reference = call(sets[0])
    replica = stepped_call(mod, plan, sets[0], Samples(), parts, key_ok)
    sync()
    report["replica_matches"] = same(reference, replica)
    del replica
    timed_loop(lambda x: stepped_call(mod, plan, x, steps, parts, key_ok), sets, args.calls, args.burst, sync)
    report["steps"] = steps.report()
    if parts:
        replica = stepped_call(mod, plan, sets[0], Samples(), parts, key_ok, apart=True)
        sync()
        report["launcher_apart_matches"] = same(reference, replica)
        del replica
        timed_loop(lambda x: stepped_call(mod, plan, x, apart, parts, key_ok, apart=True), sets, args.calls,
                   args.burst, sync)
        report["launcher_apart"] = {name: s for name, s in apart.report().items() if name.split("/")[0] in parts}
    del reference

    # 4. pieces alone
    report["micro_us"] = run_micro(plan, parts, sets[0], device, args.micro_reps, key_ok, mod)

    # 5. the direct path
    if parts and len(parts) == len(plan.launches):
        try:
            direct, tensors = Direct(plan, parts), Direct(plan, parts, ints=False)
            reference = call(sets[0])
            report["direct_matches"] = {"encode": same(reference, direct(sets[0], False)),
                                        "cached": same(reference, direct(sets[0], True)),
                                        "tensors": same(reference, tensors(sets[0], True))}
            del reference
            variants = {
                "direct_encode": direct_call(mod, direct, False, key_ok),
                "direct_cached": direct_call(mod, direct, True, key_ok),
                "direct_cached_tensors": direct_call(mod, tensors, True, key_ok),
                "direct_cached_rawstream": direct_call(mod, direct, True, key_ok, raw_stream=True),
            }
            for name, fn in variants.items():
                try:
                    report[name] = timed_loop(fn, sets, args.calls, args.burst, sync)
                except Exception as exc:  # noqa: BLE001 - e.g. a raw-stream key that is not the plan's
                    report["skipped"][name] = f"{type(exc).__name__}: {exc}"
            acc = Samples()
            timed_loop(lambda x: direct(x, False, acc), sets, args.calls, args.burst, sync)
            report["direct_encode_steps"] = acc.report()
        except Exception as exc:  # noqa: BLE001 - a probe: say why and go on
            report["skipped"]["direct"] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
    else:
        report["skipped"]["direct"] = "needs every launch compiled and taken apart (a GPU with Triton 3.6)"

    # 6. cProfile
    report["cprofile"] = {"file": "cprofile.txt", "calls": args.profile_calls,
                          "top_by_own_time": run_profile(call, sets, args.profile_calls, sync, out_dir / "cprofile.txt")}
    return report


# ---- the table ----------------------------------------------------------------------------------------------------
def table(report: dict) -> str:
    lines = [f"{report['case']}  torch {report['environment']['torch']}  triton {report['environment']['triton']}  "
             f"{report['environment'].get('gpu', report['environment']['device'])}", "",
             f"{'per call (us)':62s} {'median':>8s} {'p90':>8s}"]

    def row(name, s, indent=0):
        if s and s.get("n"):
            lines.append(f"{' ' * indent + name:62s} {s['median_us']:8.2f} {s['p90_us']:8.2f}")

    row("whole kernel(**inputs)", report["whole"])
    lines.append(f"{'  (loop wall per call; first 20 / last 20 medians)':62s} {report['whole']['loop_us_per_call']:8.2f} "
                 f"{report['whole']['first20_median_us']:8.2f} / {report['whole']['last20_median_us']:.2f}")
    lines.append("wrapped launches:")
    for name, s in report["wrapped"].items():
        row(name, s, 2)
    def steps(rows):
        for name, s in rows.items():
            if name.endswith("/total"):  # a launch: its name, then its parts indented
                row(name[: -len("/total")], s, 2)
            else:
                depth = name.count("/")
                row(name.rsplit("/", 1)[-1] if depth else name, s, 2 + 2 * depth)

    lines.append(f"steps (replica; outputs match kernel's: {report['replica_matches']['equal']}):")
    steps(report["steps"])
    if "launcher_apart" in report:
        lines.append("launchers taken apart as CudaLauncher.__call__ and wrap_handle_tensordesc run them (second pass; "
                     f"outputs match: {report['launcher_apart_matches']['equal']}):")
        steps(report["launcher_apart"])
    if "direct_matches" in report:
        lines.append("direct path (kernel's key and plan look-up, then the C launchers straight; outputs match "
                     f"kernel's: {all(m['equal'] for m in report['direct_matches'].values())}):")
        for name in ("direct_encode", "direct_cached", "direct_cached_tensors", "direct_cached_rawstream"):
            row(name, report.get(name), 2)
        lines.append("  direct_encode's body, taken apart (no key):")
        for name, s in report.get("direct_encode_steps", {}).items():
            row(name, s, 4)
    lines.append("")
    lines.append(f"{'pieces alone (mean us per call)':62s} {'us':>8s}")
    for name, us in report["micro_us"].items():
        lines.append(f"  {name[:60]:60s} {us:8.2f}")
    lines.append("")
    lines.append("cProfile, top by own time (us per kernel call):")
    for r in report["cprofile"]["top_by_own_time"][:12]:
        lines.append(f"  {r['function'][:60]:60s} {r['tottime_us_per_call']:8.2f}")
    for what, why in report["skipped"].items():
        lines.append(f"skipped {what}: {why}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), help="default: headline (smoke with --smoke)")
    parser.add_argument("--file", help="probe this candidate file instead of the family rendered")
    parser.add_argument("--knobs", help="knob overrides for the render, as JSON (e.g. '{\"launch\": \"jit\"}')")
    parser.add_argument("--calls", type=int, default=300, help="timed calls per figure")
    parser.add_argument("--burst", type=int, default=50, help="calls between synchronisations")
    parser.add_argument("--sets", type=int, default=2, help="input sets, rotated")
    parser.add_argument("--profile-calls", type=int, default=200)
    parser.add_argument("--micro-reps", type=int, default=2000, help="calls per loop of a piece timed alone")
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shape: checks the script only")
    args = parser.parse_args(argv)
    if args.smoke:
        from pytest_kopt import interpret

        interpret.configure(force_interpreter=True)
    elif not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (or --smoke)")
    args.shape = args.shape or ("smoke" if args.smoke else "headline")
    if min(args.calls, args.burst, args.sets, args.profile_calls, args.micro_reps) < 1:
        parser.error("counts must be positive")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    report = probe(args)
    out_path = args.out_dir / "probe_kda_host.json"
    out_path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(table(report))
    print(f"\nwritten: {out_path}, {args.out_dir / 'cprofile.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
