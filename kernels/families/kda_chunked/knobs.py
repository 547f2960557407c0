"""The knobs. ``launch``: how a call launches its kernels once its plan is built (host.py): "compiled" straight
through the compiled kernels (``CompiledKernel[grid](*args)``), "jit" through ``JITFunction.run``, which binds and
specialises every argument again (tens of microseconds for the fused program). The CPU interpreter always takes the
second. The other choices this family had were measured on the H200 and retired (kernels/notes/kda/README.md)."""

# kopt:knobs-begin
KNOBS = {"launch": "compiled"}
# kopt:knobs-end
SPACE = {"launch": ["compiled", "jit"]}
