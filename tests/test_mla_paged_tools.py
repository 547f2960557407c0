"""tools/dev_mla_paged.py, the H200 script for the paged and dense MLA decode beside FlashMLA, runs
end to end on the CPU interpreter (--smoke): every row checked against the reference, the three
timings present where the CPU has them, FlashMLA's absence recorded with the reason, JSON written.
tools/probe_mla_host.py interleaves its implementations in orders that give none a fixed predecessor, and takes each one's
ratio to FlashMLA round by round."""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "dev_mla_paged.py"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("dev_mla_paged", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_run_checks_times_and_writes_json(tool, tmp_path, capsys):
    assert tool.main([str(tmp_path), "--smoke", "--variants", "best,paged", "--cases", "B2 Sq1,B3 Sq1", "--budget-s", "0.01"]) == 0
    report = json.loads((tmp_path / "dev_mla_paged.json").read_text())
    assert "flashmla" in report["absent"] and "--no-deps" in report["absent"]["flashmla"]
    labels = [entry["label"] for entry in report["results"]]
    assert labels == ["B3 Sq1 H16 len[65,1,30]", "B2 Sq1 H16 Skv40"]
    for entry in report["results"]:
        ours = "paged" if entry["problem"] == "mla-paged" else "best"
        assert set(entry["rows"]) == {ours, "torch-eager"}
        row = entry["rows"][ours]
        assert row["ok"] and row["rel_rms_o"] < 5e-3 and row["device_us"] > 0 and row["eager_us"] > 0
        assert row["graph_us"] is None and "CPU" in row["graph_error"]
    out = capsys.readouterr().out
    assert "vs FlashMLA" in out and out.rstrip().endswith("dev_mla_paged.json")


def test_unknown_variant_is_refused(tool, tmp_path):
    with pytest.raises(SystemExit):
        tool.main([str(tmp_path), "--smoke", "--variants", "fastest"])


def test_a_file_is_timed_beside_the_variants(tool, tmp_path):
    """--file NAME=PATH: a candidate file's kernel gets its own row at the paged cases, checked like the others (here the
    family's render under another name, and a file whose kernel is wrong: its row says so, the run goes on)."""
    from pytest_kopt.families import load_family

    good = tmp_path / "good.py"
    good.write_text(load_family("mla_paged").render({}))
    bad = tmp_path / "bad.py"
    bad.write_text(good.read_text() + "\n_right = kernel\n\ndef kernel(**inputs):\n    o, lse = _right(**inputs)\n    return o * 2, lse\n")
    out = tmp_path / "out"
    assert tool.main([str(out), "--smoke", "--only", "paged", "--variants", "paged", "--cases", "B3 Sq1", "--budget-s", "0.01",
                      "--file", f"mine={good}", "--file", f"wrong={bad}"]) == 0
    rows = json.loads((out / "dev_mla_paged.json").read_text())["results"][0]["rows"]
    assert set(rows) == {"paged", "mine", "wrong", "torch-eager"}
    assert rows["mine"]["ok"] and rows["paged"]["ok"] and rows["mine"]["rel_rms_o"] < 5e-3
    assert not rows["wrong"]["ok"] and rows["wrong"]["rel_rms_o"] > 0.5


def test_an_output_left_unwritten_does_not_pass_on_another_implementations_answer(tool):
    """An implementation that leaves its output unwritten gets memory the caching allocator handed back, which may hold
    the answer of the implementation before it (H200, session 34: a file skipping the merge read 1.8e-3 at B64). Here
    "lazy" returns exactly that answer: it must fail, because each implementation is checked on inputs of its own."""
    from pytest_kopt.problems.mla_paged import MLA_PAGED

    last = []

    def right(**inputs):
        o, lse = MLA_PAGED.reference(**inputs)
        if not last:  # its first call is its check: what it leaves behind for the next implementation
            last[:] = [o.to(inputs["q"].dtype), lse]
        return o.to(inputs["q"].dtype), lse

    def lazy(**inputs):
        return tuple(last)

    entry = tool.measure(MLA_PAGED, tool.SMOKE_PAGED[1], {"right": right, "lazy": lazy}, "cpu", 0.01, seed=5)
    assert entry["rows"]["right"]["ok"]
    assert not entry["rows"]["lazy"]["ok"] and entry["rows"]["lazy"]["rel_rms_o"] > 0.5


def test_the_host_probe_gives_no_implementation_a_fixed_predecessor():
    """Every round is a permutation, the same seed gives the same rounds, and each implementation follows more than
    one other over the rounds (a rotated fixed order left each the same predecessor, and the one after FlashMLA paid
    for it)."""
    spec = importlib.util.spec_from_file_location("probe_mla_host", TOOL.with_name("probe_mla_host.py"))
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    names = ["new", "old", "copy", "baseline:flashmla"]
    rounds = probe.round_orders(names, 40, seed=3)
    assert len(rounds) == 40 and all(sorted(r) == sorted(names) for r in rounds)
    assert rounds == probe.round_orders(names, 40, seed=3)
    flat = [name for r in rounds for name in r]
    before = {name: {a for a, b in zip(flat, flat[1:]) if b == name} for name in names}
    assert all(len(before[name]) >= 2 for name in names), before
    assert len({r[0] for r in rounds}) == len(names)  # each one first in some round


def test_probe_summary_takes_ratios_round_by_round():
    """Each round's figure over FlashMLA's in the same round: a drift that moves both cancels, the median and the 10th
    and 90th percentiles of the ratios are reported, FlashMLA gets no ratio to itself, host time none, an unused timer
    nothing."""
    spec = importlib.util.spec_from_file_location("probe_mla_host", TOOL.with_name("probe_mla_host.py"))
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    drift = [100.0 + 10 * i for i in range(20)]  # both slow down round by round
    flash = "baseline:flashmla"
    samples = {flash: {"host": [], "eager": [], "device": drift},
               "ours": {"host": [5.0] * 20, "eager": [], "device": [0.98 * d for d in drift[:19]] + [1.5 * drift[19]]}}
    rows = probe.summarise(samples, flash)
    assert rows["ours"]["device_over_flashmla"] == pytest.approx(0.98)  # 100 to 290 us of drift, and the ratio holds
    low, high = rows["ours"]["device_over_flashmla_p10_p90"]
    assert low == pytest.approx(0.98) and high == pytest.approx(0.98)  # the one outlier round is past the 90th
    assert rows["ours"]["device_us"] == statistics.median(samples["ours"]["device"])
    assert "eager_us" not in rows["ours"] and "host_over_flashmla" not in rows["ours"] and rows["ours"]["host_us"] == 5.0
    assert "device_over_flashmla" not in rows[flash]
    with pytest.raises(ValueError):  # rounds that do not pair up are a bug, not a figure
        probe.summarise({flash: {"device": drift}, "ours": {"device": drift[:5]}}, flash)
