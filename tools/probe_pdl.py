"""What programmatic dependent launch does on this GPU, measured before the KDA family relies on it
(scan_overlap "pdl": the scan launched first, the solve as its programmatic dependent, beside it).

Three launches on one stream: a primary that lets its dependent launch at once and then spins for a
fixed time before writing a value; the dependent (Triton ``launch_pdl=True``), which records when it
ran; a plain third kernel that copies the primary's value. It answers:
1. does the dependent run while the primary still runs (its clock reading before the primary's end)?
2. does later work on the stream, and an event recorded after the dependent, wait for the primary too?

    source tools/device_setup.sh; python3 tools/probe_pdl.py      # on the H200
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import triton
import triton.language as tl


@triton.jit
def _clock():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _primary(out_ptr, spin_ns, TRIGGER: tl.constexpr):
    if TRIGGER:
        tl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)
    start = _clock()
    now = start
    while now - start < spin_ns:
        now = _clock()
    tl.store(out_ptr + 0, now)  # the primary's end
    tl.store(out_ptr + 1, 1)


@triton.jit
def _dependent(out_ptr):
    tl.store(out_ptr + 2, _clock())  # when the dependent ran


@triton.jit
def _after(out_ptr):
    tl.store(out_ptr + 3, tl.load(out_ptr + 1))  # 1 if the primary had finished before this ran


def probe(trigger: bool, pdl: bool, spin_ms: float = 20.0) -> dict:
    out = torch.zeros(4, dtype=torch.int64, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    _primary[(1,)](out, int(spin_ms * 1e6), TRIGGER=trigger)
    _dependent[(1,)](out, launch_pdl=pdl)
    end.record()
    _after[(1,)](out)
    torch.cuda.synchronize()
    primary_end, _, dependent_at, after_saw = out.tolist()
    return {"trigger": trigger, "pdl": pdl, "event_ms": round(start.elapsed_time(end), 3),
            "dependent_before_primary_end_ms": round((primary_end - dependent_at) / 1e6, 3),
            "after_saw_primary_done": bool(after_saw)}


def main() -> int:
    # each twice, the first call of each compiling its kernels (launch_pdl is a compile option): the second is kept
    rows = [[probe(t, p) for _ in range(2)][-1] for t, p in ((True, True), (False, True), (True, False))]
    for r in rows:
        print(r)
    out = os.environ.get("OUT")
    if out:
        Path(out, "probe_pdl.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
