"""The transport of a timed round: what the runner does with its outputs, and the supervisor's own
measure of it, taken off every round."""

from __future__ import annotations

import pytest
import torch

from pytest_kopt.judge import rounds, runner
from pytest_kopt.judge.runner import CandidateFault, store_outputs


def slot(shapes):
    regions = [{"name": f"out{i}", "expected": {"dtype": "float32", "shape": list(s)}} for i, s in enumerate(shapes)]
    return {"regions": regions, "destinations": [torch.zeros(s) for s in shapes]}


def test_store_copies_matching_outputs_and_refuses_anything_but_plain_tensors():
    slots = [slot([(3, 4), (2,)]), slot([(3, 4), (2,)])]
    results = [(torch.randn(3, 4), torch.randn(2)) for _ in slots]
    described = store_outputs(results, slots, torch.device("cpu"), {})
    assert described == [[{"dtype": "float32", "shape": [3, 4]}, {"dtype": "float32", "shape": [2]}]] * 2
    for (a, b), s in zip(results, slots):
        assert torch.equal(s["destinations"][0], a) and torch.equal(s["destinations"][1], b)

    class Sneaky(tuple):
        pass

    with pytest.raises(CandidateFault, match="tuple of 2"):
        store_outputs([Sneaky(results[0])], slots[:1], torch.device("cpu"), {})
    with pytest.raises(CandidateFault, match="expected 2"):
        store_outputs([results[0][:1]], slots[:1], torch.device("cpu"), {})


def test_the_supervisor_times_the_runners_whole_store_over_a_rounds_slots(monkeypatch):
    """copyout_seconds runs store_outputs itself (checks and copy, not the copy alone) on as many
    slots as a round uses, with outputs of the expected shapes; the result is a real duration."""
    seen = []
    real = runner.store_outputs

    def counting(results, slots, device, arenas):
        seen.append((len(results), [tuple(o.shape) for o in results[0]]))
        return real(results, slots, device, arenas)

    monkeypatch.setattr(runner, "store_outputs", counting)

    class Slots:
        count = 5
        regions = [[{"name": "o", "dtype": "bfloat16", "shape": [2, 8]}, {"name": "lse", "dtype": "float32", "shape": [2]}]] * 5

    bench = object.__new__(rounds.CaseBench)
    bench.device, bench.use = "cpu", 3
    seconds = bench.copyout_seconds(Slots())
    assert seen == [(3, [(2, 8), (2,)])] * 3  # three tries, each over the round's 3 slots
    assert 0 < seconds < 1


def test_the_yardstick_runner_never_loads_a_candidate_and_a_candidates_runner_never_becomes_one(tmp_path):
    """``null`` only before a load, and no load after ``null``: a runner is either the
    supervisor's transport yardstick or a candidate's, never both."""
    import time

    from pytest_kopt.judge import sandbox
    from pytest_kopt.judge.client import RunnerClient, RunnerFailure

    level, _why = sandbox.choose_level()
    clients = []
    try:
        for slot, private in ((11, tmp_path / "a"), (12, tmp_path / "b")):
            private.mkdir()
            process = sandbox.start_runner(device="cpu", slot=slot, level=level, cache_key=f"null-{slot}", private=private)
            clients.append(RunnerClient(process, torch.device("cpu"), time.monotonic() + 120, ""))
        yardstick, candidate = clients
        assert yardstick.request("null")["ok"]
        with pytest.raises(RunnerFailure, match="loads no candidate"):
            yardstick.request("load", source="def kernel(x):\n    return (x,)\n")
        candidate.request("load", source="def kernel(x):\n    return (x,)\n")
        with pytest.raises(RunnerFailure, match="cannot be the transport yardstick"):
            candidate.request("null")
    finally:
        for client in clients:
            client.close()


def test_an_evaluation_takes_the_yardsticks_transport_off_every_round(monkeypatch, tmp_path):
    """With the yardstick (forced on the CPU), the result names the transport taken off each
    round, and the candidate's figure is the median of its rounds' windows less that transport."""
    import json

    from pytest_kopt.cli import main

    monkeypatch.setenv("KOPT_TRANSPORT_YARDSTICK", "1")
    out = tmp_path / "result.json"
    code = main(["eval", "--problem", "judge_toy_problem:AXPY", "tests/hostile/good_axpy.py", "--quick", "--upto", "benchmark",
                 "--json", str(out)])
    result = json.loads(out.read_text())
    assert code == 0, result["reasons"]
    timings = result["timings"]
    transport = timings["transport_us"]
    assert transport is not None and 0 < transport < 1e6
    rows = [row for rows in result["timelines"].values() for row in rows if row["mode"] == "eager"]
    assert rows and all(row["n"] == 1 for row in rows)  # one slot a round on the CPU
    per_round = sorted(row["window_us"] - transport for row in rows)
    assert timings["candidate_us"] == pytest.approx((per_round[(len(per_round) - 1) // 2] + per_round[len(per_round) // 2]) / 2, rel=1e-3)


@pytest.mark.parametrize("per_calls, use", [
    ([0.75e-3, 6.8e-3], 14),  # the second round's first use of its slots was slow: sized by the first
    ([2e-3, 1e-3, 1e-3], 10),  # the second round was faster and changed the size: a third warms the new slots
    ([20e-3, 30e-3], 2),  # slower than a round's target: two slots
])
def test_calibration_sizes_rounds_by_the_fastest_warm_up_round(monkeypatch, per_calls, use):
    """A round's size comes from the least per-call time of the warm-up rounds, not the last one's."""
    bench = object.__new__(rounds.CaseBench)
    bench.cuda, bench.count, bench.use = True, 64, 4
    seen = []

    def runner_round(client, slots, mode, who):
        seen.append(bench.use)
        return per_calls[len(seen) - 1], None

    monkeypatch.setattr(bench, "runner_round", runner_round, raising=False)
    monkeypatch.setattr(rounds.timing, "host_window_cycles", lambda per_call: per_call)
    bench.calibrate(None, None)
    assert len(seen) == len(per_calls) and bench.use == use and bench.window == min(per_calls)


def test_a_result_is_bounded_whatever_a_runner_answered() -> None:
    """What reaches the caller is cut to size (red team, session 49: a runner answered timed rounds with 30 MB strings
    that the result carried, 120 MB in all): long strings are cut with a note, long lists shortened, numbers kept."""
    from pytest_kopt.judge.channel import RESULT_LIST_LIMIT, RESULT_STRING_LIMIT, bounded
    from pytest_kopt.judge.rounds import _number

    result = bounded({"reasons": ["x" * (RESULT_STRING_LIMIT * 3)], "timelines": {"c": list(range(RESULT_LIST_LIMIT * 2))},
                      "figure": 1.5, "ok": True})
    assert len(result["reasons"][0]) < RESULT_STRING_LIMIT + 100 and result["reasons"][0].endswith("characters cut)")
    assert len(result["timelines"]["c"]) == RESULT_LIST_LIMIT
    assert (result["figure"], result["ok"]) == (1.5, True)
    assert [_number(v) for v in (3, 2.5, "x" * 10, float("nan"), True, [1])] == [3.0, 2.5, None, None, None, None]


def test_a_cache_is_measured_without_following_links(tmp_path) -> None:
    from pytest_kopt.judge.sandbox import tree_bytes

    (tmp_path / "a").write_bytes(b"x" * 1000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y" * 24)
    big = tmp_path.parent / f"{tmp_path.name}-outside"
    big.write_bytes(b"z" * 100_000)
    (tmp_path / "link").symlink_to(big)
    assert tree_bytes(tmp_path) == 1024 + len(str(big))  # the link's own size, not its target's
