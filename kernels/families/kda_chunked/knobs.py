"""The knobs. ``launch``: how a call launches its kernels once its plan is built (host.py): "compiled" straight through
the compiled kernels, "jit" through ``JITFunction.run`` (binding and specialising every argument again: tens of
microseconds); the CPU interpreter always takes the second. The family's other choices were measured on the H200 and
retired (kernels/notes/kda/README.md)."""

# kopt:knobs-begin
KNOBS = {"launch": "compiled"}
# kopt:knobs-end
SPACE = {"launch": ["compiled", "jit"]}
