"""The chunked KDA family's kernels compiled for sm_90 (no GPU needed), exactly as its host launches them on an H200:
the family rendered at its defaults, its host run on a pretend Hopper (tools/compare_kda_ptx.py's harness), every
launch compiled with the specialisation Triton's launcher would give its arguments. The CPU's only check of the
Gluon code, and what made it fast: TMA in and out, the products on wgmma, the solve's outputs as 16-byte stores,
registers and shared memory for two or three programs per SM, the scan's state never leaving registers, no wgmma
serialised by ptxas, and the hand-over flags where the scan runs beside the preparation. The H200 checks the rest
(the judge, tools/compare_kda_ptx.py against the promoted kernel's PTX)."""

from __future__ import annotations

import json

import pytest
from family_modules import compile_in_child
from test_kda_chunked import FAMILY

from pytest_kopt import KERNELS_DIR

TOOL = KERNELS_DIR.parent / "tools" / "compare_kda_ptx.py"

# (pretend SM count, shape, the kernels to compile): every decision the host takes at fla's shapes, on small shapes
CASES = [
    (132, dict(B=1, T=64, H=1, K=128, V=128), None),  # the scan runs beside: its loader waits, the preparation flags
    (4, dict(B=1, T=64, H=4, K=128, V=128), None),  # one after the other; two compute warpgroups per scan program
    (4, dict(B=1, T=64, H=2, K=64, V=64), None),  # the preparation capped at 168 registers
    (132, dict(B=1, T=64, H=1, K=32, V=128, h0=True), None),  # v wider than 2 K: a buffer of its own, direct stores
    (132, dict(B=1, T=64, H=2, K=128, V=32), None),  # V 32: the Triton path
    (132, dict(B=1, T=64, H=1, K=16, V=64), ["_kda_rows_kernel"]),  # 16-wide key tiles, 168 registers
]

_COMPILE = r"""
import importlib.util, json, re, subprocess, sys, tempfile
from pathlib import Path
import triton

spec = importlib.util.spec_from_file_location("compare_kda_ptx", sys.argv[1])
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)
ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
out = []
for sms, shape, only in json.loads(sys.argv[3]):
    tool.pretend_hopper(sms)
    family = tool.load(sys.argv[2])
    for record in tool.launches(family, shape):
        name = record.fn.__name__
        if only and name not in only:
            continue
        compiled, _ = tool.compile_launch(record)
        ptx = compiled.asm["ptx"]
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "k.ptx").write_text(ptx)
            notes = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(Path(tmp) / "k.ptx"), "-o",
                                    str(Path(tmp) / "k.cubin")], capture_output=True, text=True).stderr
        count = ptx.count
        out.append({
            "kernel": name, "shape": shape, "sms": sms, "options": record.options,
            "args": {k: v for k, v in record.args.items() if isinstance(v, (bool, int, float))},
            "shared": compiled.metadata.shared, "regs": int(notes.split("Used ")[1].split(" registers")[0]),
            "spills": "0 bytes spill stores, 0 bytes spill loads" not in notes, "serialised": "C7515" in notes,
            "tma_loads": count("cp.async.bulk.tensor.4d.shared::cluster.global") + count("cp.async.bulk.tensor.3d.shared::cluster.global") + count("cp.async.bulk.tensor.2d.shared::cluster.global"),
            "tma_stores": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta", ptx)),
            "wgmma": count("wgmma.mma_async"), "wgmma_tf32": count("wgmma.mma_async") if ".tf32" in ptx else 0,
            "wgmma_bf16_n": {n: count(f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16") for n in (32, 64, 128)},
            "waits": count("wgmma.wait_group"), "mma_bf16": count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"),
            "mma": count("mma.sync") + count("wgmma.mma_async"),
            "flag_release": count("atom.global.gpu.release.exch"), "ticket": count("atom.global.gpu.acq_rel.add"),
            "one_thread_ticket": len(re.findall(r"@%p\d+ atom\.global\.gpu\.acq_rel\.add", ptx)), "launch_dependents": count("griddepcontrol.launch_dependents"),
            "acquire": count("fence.acq_rel.gpu"), "proxy_fence": count("fence.proxy.async.global"),
            "volatile": count("ld.volatile.global"), "st_v4": count("st.global.v4.b32"), "st_b32": count("st.global.b32"),
            "arrives": len(re.findall(r"bar\.sync\s+0, \d+;\s+(?://[^\n]*\s+)?@%p\d+ mbarrier\.arrive\.shared::cta", ptx)),
            "notes": notes[-300:]})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    pytest.importorskip("triton.backends.nvidia.compiler")
    directory = tmp_path_factory.mktemp("kda_sm90")
    family = directory / "kda_chunked.py"
    family.write_text(FAMILY.render({}))
    stdout = compile_in_child(_COMPILE, str(TOOL), str(family), json.dumps(CASES), cache_dir=directory / "cache",
                              timeout=1500)
    return json.loads(stdout.strip().splitlines()[-1])


def kernels(compiled, name):
    found = [c for c in compiled if c["kernel"] == name]
    assert found, name
    return found


def test_fused_preparation(compiled):
    for c in kernels(compiled, "_kda_prep_gluon"):
        K, V, flag = c["shape"]["K"], c["shape"]["V"], c["args"]["FLAG"]
        where = (K, V, flag, c["notes"])
        # q, k, g and v by four TMA boxes; nothing of the rows leaves; one release flags each chunk for a scan beside
        assert c["tma_loads"] == 4 and c["tma_stores"] == 0, where
        assert c["flag_release"] == int(flag), where
        # with it, the flag's value: the call's generation, read with a strong load
        assert (c["volatile"] >= 1) == flag, where
        # the rows' products tf32 wgmma; the solve seven stacked steps of three bf16 wgmma (four doubling, two
        # merging, Aqk A: two k16 instructions each), the outputs four ([qd; w]) and two ([Aqk u; u]) more; no mma_v2
        assert c["wgmma_tf32"] > 0 and c["mma_bf16"] == 0, where
        nb = min(V, 128)
        want = {32: 7 * 3 * 2, 64: 0, 128: 0}
        want[K] += 4 * 2
        want[nb] += 2 * 2 * (V // nb)
        assert c["wgmma_bf16_n"] == {str(n): v for n, v in want.items()}, (where, c["wgmma_bf16_n"])
        # the outputs as 16-byte stores through shared memory: [qd; w] always, [Aqk u; u] where a tile fits (V <= 2 K,
        # else straight from the accumulator, a 4-byte bf16 pair per store); gl's one float32 store per channel
        staged = K // 16 + (V // 16 if V <= 2 * K else 0)
        assert c["st_v4"] == staged, (where, c["st_v4"])
        assert c["st_b32"] == 1 if V <= 2 * K else c["st_b32"] >= V // 4, (where, c["st_b32"])
        # registers: capped at 168 below K 128 (three programs per SM), uncapped at K 128 (two)
        assert c["options"].get("maxnreg") == (168 if K < 128 else None) and c["regs"] <= (168 if K < 128 else 255), where
        # shared memory: the rows' [2 BT, K] operand buffer (q and k land in it), the [BT, K] column operand (v's tile
        # lands in it where it fits), g's box, k exp(G) in bf16, the barriers and some scratch: 72 KB at K 128
        assert c["shared"] <= 16 * 32 * K + 2 * 32 * K + (0 if V <= 2 * K else 2 * 32 * V) + 2048 + 64, (where, c["shared"])
        assert c["shared"] * 3 <= 232448, where


def test_gluon_scan(compiled):
    for c in kernels(compiled, "_kda_scan_wgmma_ws"):
        K, bv, wait = c["shape"]["K"], c["args"]["BV"], c["args"]["WAIT"]
        where = (K, bv, wait, c["notes"])
        assert not c["serialised"] and not c["spills"], where
        # per chunk step: S^T w^T and S^T qd^T (K / 16 k-steps each), the update (BT / 16 for delta's hi and lo);
        # three waits (w's product, the read-out's, the update)
        assert c["wgmma"] == 2 * K // 16 + 2 * 32 // 16 and c["waits"] == 3, where
        assert c["shared"] <= 232448 and c["args"]["NS"] == 4, where
        assert c["options"] == {"num_warps": bv // 16}, where
        # the compute partition hands a stage back and o over with one thread's arrive, after a barrier of its warps
        assert c["arrives"] == 2, where
        # beside the preparation: it lets the preparation launch at once and polls each chunk's flag with a strong
        # load, an acquire fence and the proxy fence before the TMA loads; nothing of it otherwise
        assert c["launch_dependents"] == int(wait), where
        assert (c["acquire"] >= 1 and c["proxy_fence"] >= 1 and c["volatile"] >= 1) == wait, where
        # and takes one ticket per program (one thread's atomic), the last of the call moving the generation on
        assert c["ticket"] == c["one_thread_ticket"] == int(wait), where
    assert {(c["args"]["BV"], c["args"]["WAIT"]) for c in kernels(compiled, "_kda_scan_wgmma_ws")} >= {(64, True), (128, False)}


def test_triton_kernels(compiled):
    for name in ("_kda_rows_kernel", "_kda_solve_kernel", "_kda_scan_kernel", "_kda_out_kernel"):
        for c in kernels(compiled, name):
            assert c["shared"] <= 227 * 1024 and c["mma"] > 0, (name, c["shape"])
    rows = {c["shape"]["K"]: c for c in kernels(compiled, "_kda_rows_kernel")}
    assert rows[16]["options"].get("maxnreg") == 168 and rows[16]["regs"] <= 168
    assert "maxnreg" not in rows[128]["options"]
    solve = kernels(compiled, "_kda_solve_kernel")[0]
    assert solve["options"]["maxnreg"] == 168 and solve["regs"] <= 168
