"""tools/proto_mla_gluon.py, the warp-specialised Gluon prototype of the paged MLA decode, compiled for sm_90 on the CPU
as its host would launch it at B64 Sq1 (the H200 checks its numbers: results/h200-2026-12-02c): three partitions with
their register budgets, the products on wgmma, every tile by TMA, and its shared memory within what one block may
have on sm_90 (one program per SM)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from family_modules import compile_in_child

TOOLS = Path(__file__).resolve().parents[1] / "tools"
SMEM_LIMIT = 232448  # bytes of shared memory a block may opt into on sm_90


_COMPILE = r"""
import importlib.util, json, subprocess, sys, tempfile, types
from pathlib import Path
import torch, triton

def load(path):
    spec = importlib.util.spec_from_file_location(Path(path).stem + "_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

proto, tool = load(sys.argv[1]), load(sys.argv[2])
B, H, pages = 64, 64, 8192
q2 = torch.empty(B * H, 576, dtype=torch.bfloat16)
kv2 = torch.empty(pages * 64, 576, dtype=torch.bfloat16)
desc = lambda t, r, c: proto.TensorDescriptor(t, list(t.shape), list(t.stride()), [r, c], proto._layout([r, c]))
i32 = lambda n: torch.empty(n, dtype=torch.int32)
args = dict(q_n=desc(q2, 64, 256), q_r=desc(q2, 64, 64), kv_n=desc(kv2, 64, 256), kv_r=desc(kv2, 64, 64),
            table=i32(B * 128), lens=i32(B), o=torch.empty(16, dtype=torch.bfloat16), lse=torch.empty(16),
            part_o=torch.empty(16), part_lse=torch.empty(16), meta=i32(16), stride_tb=128, B=B, Sq=1, H=H,
            capacity=8192, qk_scale=0.1, PAGE=64, B_P2=64)
kernel, _ = tool.compile_launch(types.SimpleNamespace(fn=proto._mla_paged_ws, args=args, options=dict(num_warps=4)))
ptx = kernel.asm["ptx"]
ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
with tempfile.TemporaryDirectory() as tmp:
    (Path(tmp) / "k.ptx").write_text(ptx)
    notes = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(Path(tmp) / "k.ptx"), "-o", str(Path(tmp) / "k.cubin")],
                           capture_output=True, text=True).stderr
print(json.dumps({"ptx": ptx, "notes": notes, "shared": kernel.metadata.shared}))
"""


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    pytest.importorskip("triton.backends.nvidia.compiler")
    out = compile_in_child(_COMPILE, str(TOOLS / "proto_mla_gluon.py"), str(TOOLS / "compare_kda_ptx.py"),
                           cache_dir=tmp_path_factory.mktemp("proto_cache"))
    return json.loads(out)


def test_three_partitions_with_their_registers(compiled):
    ptx = compiled["ptx"]
    budgets = set(re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+);", ptx))
    assert {"232", "40"} <= budgets, budgets  # warpgroup 1 and the loader, as warp_specialize asks


def test_products_on_wgmma_and_tiles_by_tma(compiled):
    ptx = compiled["ptx"]
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16") > 0  # scores: [64 rows, 64 keys]
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16") > 0  # P V: 256 value columns a warpgroup
    assert ptx.count("cp.async.bulk.tensor.2d.shared::cluster.global") >= 6  # q's three boxes, each tile's three


def test_shared_memory_fits_one_program_per_sm(compiled):
    assert 200_000 < compiled["shared"] <= SMEM_LIMIT
    assert "C7515" not in compiled["notes"] and "Used " in compiled["notes"]
