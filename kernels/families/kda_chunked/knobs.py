"""The knobs. ``launch``: how a call launches its kernels once its plan is built (host.py): "compiled" straight through
the compiled kernels, "jit" through ``JITFunction.run`` (binding and specialising every argument again: tens of
microseconds); the CPU interpreter always takes the second. ``beside``: where the scan runs beside the preparation
(host.py), "quarter" where its 64-wide programs number at most a quarter of the SMs (the headline's 32 of the H200's
132), "wide" also where 128-wide programs would (then 128-wide: B2 T16384 H16's 32 programs). The family's other
choices were measured on the H200 and retired (kernels/notes/kda/README.md)."""

# kopt:knobs-begin
KNOBS = {"launch": "compiled", "beside": "quarter"}
# kopt:knobs-end
SPACE = {"launch": ["compiled", "jit"], "beside": ["quarter", "wide"]}
TRY_EARLY = [{"beside": "wide"}]
