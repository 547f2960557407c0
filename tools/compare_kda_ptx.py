"""Offline check (no GPU): the KDA kernels a candidate launches on an H200 compile to the same sm_90 PTX as the
promoted kernel's, launched with the same arguments.

Both files' hosts run on the CPU with a pretend Hopper GPU (tensors that say ``is_cuda``, capability 9.0, 132 SMs);
every launch (and warmup) is recorded instead of run: kernel, grid, arguments by name, options. Launch by launch,
each is compiled for sm_90 with the specialisation Triton's launcher would give those arguments, and the PTX is
compared with debug lines dropped and parameter names replaced by the arguments they hold; the arguments' values
(integers, floats, and a tensor's shape, strides and dtype) must agree too.

    python tools/compare_kda_ptx.py [OLD.py [NEW.py]]   (default: results/runs/kda-h200-2/candidates/2a739a2d23dc.py
                                                         against kernels/best/kda.py)

Prints one line per launch and exits non-zero if any launch differs. Expected differences (the retired paths,
kernels/notes/kda/README.md): at K 256 or V not a multiple of 64 (and with v not bf16) the Triton block rows run
where the Gluon ones did.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import os
import re
import sys
import types
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.compiler.compiler import make_backend  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402
from triton.runtime import jit as tjit  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGET = GPUTarget("cuda", 90, 32)
SHAPES = [  # fla's six, then small ones through every path (h0: an initial state; no final state where ht=False)
    dict(B=1, T=8192, H=16, K=128, V=128), dict(B=1, T=8192, H=96, K=128, V=128), dict(B=2, T=16384, H=16, K=128, V=128),
    dict(B=4, T=4096, H=64, K=128, V=128), dict(B=4, T=2048, H=16, K=128, V=128), dict(B=8, T=1024, H=8, K=64, V=64),
    dict(B=1, T=70, H=2, K=32, V=64, h0=True), dict(B=1, T=100, H=1, K=32, V=128, h0=True, ht=False),
    dict(B=2, T=40, H=1, K=16, V=64, h0=True), dict(B=1, T=45, H=1, K=32, V=32), dict(B=1, T=64, H=2, K=256, V=64),
]


class FakeCuda(torch.Tensor):
    """A CPU tensor that says it is on a GPU (views of it too)."""

    @property
    def is_cuda(self):
        return True


class Recorded:
    """A launch as made, or (from a warmup) the compiled kernel a host launches through: ``run`` is its launcher,
    called with the grid, stream, function, metadata, launch metadata and hooks, then the arguments (a host may pass
    its own buffers as addresses: recorded as the tensors the warmup saw)."""

    function, packed_metadata = "function", "metadata"

    def __init__(self, fn, grid, args, options):
        self.fn, self.grid, self.args, self.options = fn, (*grid, *(1,) * (3 - len(grid))), args, options

    def run(self, gx, gy, gz, stream, function, metadata, launch_metadata, enter_hook, exit_hook, *args):
        values = bind(self.fn, args, {})[0]
        values = {k: self.args[k] if isinstance(v, int) and isinstance(self.args.get(k), torch.Tensor) else v
                  for k, v in values.items()}
        LAUNCHES.append(Recorded(self.fn, (gx, gy, gz), values, self.options))

    def __getitem__(self, grid):
        assert len(grid) == 3, "CompiledKernel's launcher reads grid[0], grid[1] and grid[2]"

        def launch(*args):
            LAUNCHES.append(Recorded(self.fn, grid, bind(self.fn, args, {})[0], self.options))
        return launch


LAUNCHES: list[Recorded] = []


def bind(fn, args, kwargs):
    """Arguments by name (TMA descriptors copied: a host may point them elsewhere after the launch) and options."""
    params = inspect.signature(fn.fn).parameters
    named = {k: v for k, v in kwargs.items() if k in params}
    options = {k: v for k, v in kwargs.items() if k not in params}
    bound = inspect.signature(fn.fn).bind(*args, **named)
    bound.apply_defaults()
    return {k: copy.copy(v) if hasattr(v, "block_shape") else v for k, v in bound.arguments.items()}, options


def fake_run(self, *args, grid, warmup, **kwargs):
    values, options = bind(self, args, kwargs)
    record = Recorded(self, grid, values, options)
    if not warmup:
        LAUNCHES.append(record)
    return record


def load(path):
    spec = importlib.util.spec_from_file_location(f"kda_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def launches(module, shape, seed=0):
    """The launches one call makes on the pretend H200 (the call after the first, for a host that caches). shape:
    B, T, H, K, V, and optionally h0 (an initial state), ht (False: no final state), dtype (of q, k, v)."""
    torch.manual_seed(seed)
    B, T, H, K, V = (shape[n] for n in "BTHKV")
    h0 = torch.randn(B, H, K, V) if shape.get("h0") else None
    dtype = shape.get("dtype", torch.bfloat16)
    mk = lambda *s, dt=dtype: torch.Tensor._make_subclass(FakeCuda, torch.randn(*s).to(dt))  # noqa: E731
    x = dict(q=mk(B, T, H, K), k=mk(B, T, H, K), v=mk(B, T, H, V), g=-mk(B, T, H, K, dt=torch.float32).abs(),
             beta=mk(B, T, H), scale=None, initial_state=h0 if h0 is None else torch.Tensor._make_subclass(FakeCuda, h0),
             output_final_state=shape.get("ht", True))
    LAUNCHES.clear()
    module.kernel(**x)
    LAUNCHES.clear()
    module.kernel(**x)
    return list(LAUNCHES)


def compile_launch(record):
    """The launch compiled for sm_90 as Triton's launcher would compile it for those arguments: (kernel, signature)."""
    fn = record.fn
    backend = make_backend(TARGET)
    binder = tjit.create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(**record.args, **record.options)
    opts, signature, constexprs, attrs = fn._pack_args(backend, dict(record.options), bound, specialization, options)
    source = (GluonASTSource if fn.is_gluon() else ASTSource)(fn, signature, constexprs, attrs)
    return triton.compile(source, target=TARGET, options=opts.__dict__), signature


def compile_ptx(record):
    compiled, signature = compile_launch(record)
    return compiled.asm["ptx"], signature


def pretend_hopper(sms=132):
    """Launches recorded instead of run, on an H200 as the hosts see it (capability 9.0, ``sms`` SMs)."""
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    torch.cuda.get_device_properties = lambda device=None: types.SimpleNamespace(multi_processor_count=sms)
    torch.cuda.current_stream = lambda device=None: types.SimpleNamespace(cuda_stream=0)
    tjit.JITFunction.run = fake_run


def param_names(signature):
    """The PTX parameters of a compiled kernel, by the argument each holds: a TMA descriptor of rank r is the
    descriptor, its r sizes and its r strides; two scratch pointers close the list."""
    names = []
    for name, ty in signature.items():
        if ty == "constexpr":
            continue
        if ty.startswith("tensordesc"):
            rank = ty.split("[", 1)[1].split("]", 1)[0].count(",") + 1
            names += [name] + [f"{name}.shape{i}" for i in range(rank)] + [f"{name}.stride{i}" for i in range(rank)]
        else:
            names.append(name)
    return names + ["(global scratch)", "(profile scratch)"]


def normalise(ptx, kernel, signature):
    """The body without debug lines and without its parameter loads, and which register each argument is loaded into
    (the loads follow the parameter list's order, which differs where an unused parameter went)."""
    names = param_names(signature)
    body = ptx[ptx.index(".entry"):]
    body = body[body.index(")") + 1:]
    body = re.sub(r"\.section\s+\.debug.*", "", body, flags=re.S)
    loads, lines = {}, []
    for line in body.splitlines():
        if re.match(r"\s*(\.loc|\.file|//|\$L__tmp|\.reg\s)", line) or not line.strip():
            continue
        m = re.match(rf"\s*ld\.param\.\S+\s+(%\w+), \[{re.escape(kernel)}_param_(\d+)(\+\d+)?\];", line)
        if m:
            loads[m.group(1) + (m.group(3) or "")] = names[int(m.group(2))]
            continue
        lines.append(re.sub(rf"{re.escape(kernel)}_param_(\d+)", lambda n: "param:" + names[int(n.group(1))], line))
    text = "\n".join(lines)
    if loads:  # registers a parameter was loaded into, by the parameter's name
        text = re.sub("|".join(re.escape(r) + r"\b" for r in sorted(loads, key=len, reverse=True)),
                      lambda m: "%<" + loads[m.group(0)] + ">", text)
    # the other registers renumbered by first appearance (fewer parameter loads shift the numbering)
    seen: dict[str, str] = {}
    counts: dict[str, int] = {}

    def canonical(m):
        if m.group(0) not in seen:
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
            seen[m.group(0)] = f"%{m.group(1)}{counts[m.group(1)]}"
        return seen[m.group(0)]

    text = re.sub(r"%([a-z]+)(\d+)\b", canonical, text)
    return text, loads


def describe(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), tuple(value.stride()), value.dtype)
    if hasattr(value, "block_shape"):
        return ("desc", tuple(value.shape), tuple(value.strides), tuple(value.block_shape), repr(value.layout),
                value.base.dtype)
    return value


def main() -> int:
    old_path = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "results/runs/kda-h200-2/candidates/2a739a2d23dc.py")
    new_path = Path(sys.argv[2] if len(sys.argv) > 2 else ROOT / "kernels/best/kda.py")
    pretend_hopper()
    old, new = load(old_path), load(new_path)
    differences = 0
    for shape in SHAPES[int(os.environ.get("KDA_PTX_FROM", "0")):]:
        a, b = launches(old, shape), launches(new, shape)
        label = " ".join(f"{k}{v}" for k, v in shape.items() if k in ("B", "T", "H", "K", "V")) + "".join(
            f" {k}={v}" for k, v in shape.items() if k not in ("B", "T", "H", "K", "V"))
        if [(r.grid, r.options) for r in a] != [(r.grid, r.options) for r in b]:
            print(f"{label}: DIFFERENT launches: {[(r.fn.__name__, r.grid, r.options) for r in a]} against "
                  f"{[(r.fn.__name__, r.grid, r.options) for r in b]}")
            differences += 1
            continue
        for ra, rb in zip(a, b):
            pa, sig_a = compile_ptx(ra)
            pb, sig_b = compile_ptx(rb)
            (ta, la), (tb, lb) = normalise(pa, ra.fn.__name__, sig_a), normalise(pb, rb.fn.__name__, sig_b)
            used = sorted(set(la.values()))
            values_a = {n: describe(ra.args[n.split(".")[0]]) for n in used if n.split(".")[0] in ra.args}
            values_b = {n: describe(rb.args[n.split(".")[0]]) for n in used if n.split(".")[0] in rb.args}
            same = ta == tb and sorted(la.values()) == sorted(lb.values()) and values_a == values_b
            print(f"{label}: {ra.fn.__name__} -> {rb.fn.__name__} grid {rb.grid}: "
                  f"{'same' if same else 'DIFFERENT'} PTX and arguments ({len(ta.splitlines())} lines, {len(used)} "
                  f"parameters read)")
            if not same:
                Path("/tmp/ptx_old.txt").write_text(ta)
                Path("/tmp/ptx_new.txt").write_text(tb)
                print("parameters read:", sorted(la.values()), sorted(lb.values()))
                print("values differ:", {n: (values_a.get(n), values_b.get(n)) for n in set(values_a) | set(values_b)
                                         if values_a.get(n) != values_b.get(n)})
                differences += 1
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
