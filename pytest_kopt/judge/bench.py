"""The benchmark stage of the supervisor: every timed case's three figures, the baselines' and the
reference's beside them, an incumbent's ratio when one is given, and the verdict's checks on the
figures (below the physical floor is impossible; a device-time report below the supervisor's
own graph figure is not believed). With several timed cases each figure is the geometric mean.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from . import timing
from .client import RunnerFailure
from .rounds import GRAPH_MARGIN, CaseBench, Series, TimedFailure, bootstrap_ratio, schedule

TIMERS = {
    "cuda": {"eager": "supervisor wall clock, back-to-back calls", "graph": "supervisor wall clock, CUDA-graph replays",
             "device": "runner CUDA events after an L2 flush, checked against the graph figure"},
    "cpu": {"eager": "supervisor wall clock (Triton interpreter)", "graph": "n/a", "device": "same as eager on the CPU"},
}


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _stage_failed(reasons: list[str]) -> Exception:
    from .supervisor import StageFailed

    return StageFailed("benchmark", reasons)


def benchmark_stage(sup: Any) -> None:
    from .profile import measure_ceilings
    from ..problems.base import H200_BF16_FLOPS_PER_S, H200_COPY_BYTES_PER_S

    problem, result = sup.problem, sup.result
    if not sup.cuda:
        result["notes"].append("CPU: timings are of the smoke case under the Triton interpreter, indicative only; "
                               "the physical-floor check is skipped and roofline figures use the H200 ceilings")
    ceilings = {"bytes_per_s": H200_COPY_BYTES_PER_S, "flops_per_s": H200_BF16_FLOPS_PER_S, "source": "H200 defaults"}
    if sup.cuda and not sup.quick:
        try:
            measured = measure_ceilings(sup.device)
            ceilings = {"bytes_per_s": measured["bytes_per_s"], "flops_per_s": measured["flops_per_s"], "source": "measured in this run"}
        except Exception as exc:  # noqa: BLE001 - keep the defaults
            result["notes"].append(f"could not measure ceilings: {exc}")
    if not sup.time_baselines:
        result["notes"].append("baselines not timed in this evaluation (the loop timed them once, at its start)")
    incumbent = _start_incumbent(sup)
    per_case = []
    ratios: list[list[float]] = []
    for case in problem.timed_cases(str(sup.device)):
        timings, roof, case_ratios = time_case(sup, case, ceilings, incumbent)
        per_case.append((timings, roof))
        ratios.append(case_ratios)
    timings, roof = per_case[0] if len(per_case) == 1 else combine_cases(problem.timed_label(str(sup.device)), per_case)
    result["timings"], result["roofline"] = timings, roof
    if timings.get("baseline"):
        result["speedup"] = timings["baselines"][timings["baseline"]] / timings["candidate_us"]
    if sup.incumbent_source is not None:
        _incumbent_result(sup, incumbent, ratios, per_case)


def _start_incumbent(sup: Any) -> dict | None:
    if sup.incumbent_source is None:
        return None
    from .supervisor import StageFailed

    try:
        client = sup.incumbent_client = sup.start_client(sup.incumbent_source, sup.slot + 1)
        sup.load(client, sup.incumbent_source)
    except (RunnerFailure, StageFailed) as failure:
        sup.result["incumbent_error"] = f"the incumbent could not be loaded: {getattr(failure, 'reason', None) or failure}"
        return None
    from . import candidate_id

    return {"client": client, "id": candidate_id(sup.incumbent_source), "series": [], "alive": True}


def time_case(sup: Any, case: dict, ceilings: dict, incumbent: dict | None) -> tuple[dict, dict, list[float]]:
    """(timings, roofline, incumbent ratios per round) of one case."""
    from .profile import roofline
    from ..problems.base import H200_BF16_FLOPS_PER_S, H200_COPY_BYTES_PER_S

    problem = sup.problem
    label = sup.label(case)
    bench = CaseBench(sup, case)
    series, inc_series, ratios = Series(), Series(), []
    slots = inc_slots = None
    started = time.perf_counter()
    try:
        slots = bench.open_slots(sup.client, "bench")
        bench.calibrate(sup.client, slots)  # warm-up rounds, not counted
        transport = sup.transport_client()
        if transport is not None:
            bench.measure_transport(transport)
        else:
            bench.fallback_transport(slots)
        graph_safe, why = bench.capture(sup.client, slots)
        modes = [m for m in bench.modes if graph_safe or m != "graph"]
        effective = effective_metric(sup.metric, modes, graph_safe)
        if effective != sup.metric:
            sup.result["notes"].append(f"the {sup.metric} metric needs a CUDA graph; {label}: not graph-safe ({why}), the eager figure stands in")
        order = schedule(effective, modes, sup.quick, sup.cuda)
        # the incumbent's rounds: the metric's, and with device time its graph figure too, to check its reports against
        paired = {effective} | ({"graph"} if effective == "device" else set())
        if incumbent and incumbent["alive"]:
            try:
                inc_slots = bench.open_slots(incumbent["client"], "incumbent")
                if effective != "eager":
                    inc_safe, inc_why = bench.capture(incumbent["client"], inc_slots)
                    if not inc_safe:
                        raise TimedFailure([f"the incumbent is not graph-safe ({inc_why}): the {effective} metric cannot compare it"])
                bench.runner_round(incumbent["client"], inc_slots, "eager", "the incumbent")
            except (RunnerFailure, TimedFailure) as failure:
                _incumbent_failed(sup, incumbent, failure)
        for mode in order:
            seconds, reply = bench.runner_round(sup.client, slots, mode, "the candidate")
            _record(series, mode, seconds, reply, bench.use)
            if mode in paired and incumbent and incumbent["alive"] and inc_slots is not None:
                try:
                    inc_seconds, inc_reply = bench.runner_round(incumbent["client"], inc_slots, mode, "the incumbent")
                    _record(inc_series, mode, inc_seconds, inc_reply, min(bench.use, inc_slots.count))
                except (RunnerFailure, TimedFailure) as failure:
                    _incumbent_failed(sup, incumbent, failure)
        if incumbent and incumbent["alive"]:
            ratios = round_ratios(series, inc_series, effective)
    except TimedFailure as failure:
        raise _stage_failed(failure.reasons) from None
    except RunnerFailure as failure:
        raise _stage_failed([failure.reason]) from None
    finally:
        for s in (slots, inc_slots):
            if s is not None:
                try:
                    s.release()
                except RunnerFailure:
                    pass
        sup.spent("timing:candidate", started)
        sup.trace(f"timed {label}: {time.perf_counter() - started:.1f} s")
    if not sup.cuda:
        series.rounds["device"] = list(series.rounds["eager"])
    figures = {m: series.median_us(m) for m in timing.METRICS}
    sup.result.setdefault("timelines", {})[label] = bench.timeline[:40]
    believed = True
    if sup.cuda and not graph_safe and figures["device"] is not None:
        # nothing of the supervisor's to check the runner's report against: shown as reported, never used
        believed = False
        figures["device_reported"], figures["device"] = figures["device"], None
    if graph_safe and figures["graph"] and figures["device"] is not None and figures["device"] < GRAPH_MARGIN * figures["graph"]:
        # The device figure is the runner's report; below the supervisor's own graph figure it is not
        # believed: the verdict then uses the graph figure for it (never the report).
        believed = False
        sup.result["notes"].append(f"{label}: the runner reported {figures['device']:.2f} us of device time per call, below "
                                   f"{GRAPH_MARGIN:g} x the supervisor's graph figure ({figures['graph']:.2f} us): the graph figure "
                                   "stands in for it")
        figures["device_reported"] = figures["device"]
        figures["device"] = figures["graph"]
    candidate_us = figures[effective]
    kind = "cuda" if sup.cuda else "cpu"
    sup.result["benchmarks"] += bench.entries("candidate", series, "candidate", TIMERS[kind])
    if incumbent is not None and inc_series.rounds[effective]:
        incumbent["series"].append({m: inc_series.median_us(m) for m in timing.METRICS})
    baselines, baseline_figures, baseline_errors = {}, {}, {}
    reference_figures: dict | None = None
    started = time.perf_counter()
    timed_locally = [(b.name, b.fn) for b in problem.baselines(str(sup.device))] + [("reference", problem.reference)]
    for name, fn in timed_locally if sup.time_baselines else []:
        try:
            figs, entries = bench.local_figures(name, fn, order)
        except Exception as exc:  # noqa: BLE001 - a baseline that cannot run here is reported, not fatal
            baseline_errors[name] = f"{type(exc).__name__}: {exc}"[:300]
            continue
        sup.result["benchmarks"] += entries
        if name == "reference":
            reference_figures = figs
        else:
            baseline_figures[name] = figs
            value = figs.get(effective) or figs.get("eager")
            if value:
                baselines[name] = value
    sup.spent("timing:baselines", started)
    sup.trace(f"baselines on {label}: {time.perf_counter() - started:.1f} s")
    host = series.host_us
    timings = {
        "case": label, "metric": effective, "candidate_us": candidate_us, "figures": figures, "graph_safe": graph_safe,
        "device_believed": believed,
        "baselines": baselines, "baseline_figures": baseline_figures,
        "reference_us": (reference_figures or {}).get(effective) or (reference_figures or {}).get("eager"),
        "reference_figures": reference_figures, "compile_s": sup.call_seconds.get(label), "slots": bench.use,
        "runner_batch_us": series.batch_us, "timed_reference_s": bench.reference_s,
        "transport_us": bench.transport_s * 1e6 if bench.transport_s is not None else None,
        "rounds": {m: len(v) for m, v in series.rounds.items()}, "timer": TIMERS[kind],
        "host_us": statistics.median(host) if host else None,
        "candidate_stats": _stats(series.rounds[effective]),
    }
    if not graph_safe:
        timings["graph_unsafe_reason"] = why
    if baseline_errors:
        timings["baseline_errors"] = baseline_errors
    if baselines:
        timings["baseline"] = next(iter(baselines))
    cost = problem.cost(case)
    roof = roofline(cost, candidate_us / 1e6, bytes_per_s=ceilings["bytes_per_s"], flops_per_s=ceilings["flops_per_s"])
    roof["ceilings"]["source"] = ceilings["source"]
    if sup.cuda:
        floor_s = cost.floor_seconds(max(ceilings["bytes_per_s"], H200_COPY_BYTES_PER_S), max(ceilings["flops_per_s"], H200_BF16_FLOPS_PER_S))
        for mode, value in figures.items():
            if mode in ("eager", "device", "graph") and value is not None and value / 1e6 < IMPOSSIBLE_MARGIN * floor_s:
                raise _stage_failed([f"impossible time: {mode} {value:.2f} us is below the physical floor of {floor_s * 1e6:.2f} us "
                                     f"({cost.bytes / 1e6:.1f} MB / bandwidth, {cost.flops / 1e9:.2f} GFLOP / peak) for {label}"])
    return timings, roof, ratios


IMPOSSIBLE_MARGIN = 0.9


def effective_metric(metric: str, modes: list[str], graph_safe: bool) -> str:
    """The metric the verdict uses for a case: the objective's, or eager where it cannot be had. Graph time needs a
    CUDA graph; so does device time, which is the runner's report, believed only beside the supervisor's own graph
    figure: without a graph there is nothing to check it against."""
    needs_graph = metric in ("graph", "device")
    return metric if metric in modes and (graph_safe or not needs_graph) else "eager"


def believed_rounds(series: Series, mode: str) -> list[float]:
    """A side's rounds of ``mode`` as the verdict may use them: device-time reports (the runner's) raised to
    GRAPH_MARGIN x that side's own graph figure (the supervisor's clock), so a report below it counts for no more."""
    rounds = series.rounds[mode]
    graph = series.rounds["graph"]
    if mode != "device" or not graph:
        return list(rounds)
    floor = GRAPH_MARGIN * statistics.median(graph)
    return [max(r, floor) for r in rounds]


def round_ratios(mine: Series, theirs: Series, mode: str) -> list[float]:
    """Per-round ratios, incumbent over candidate, of ``mode``, each side's rounds as believed (``believed_rounds``)."""
    return [t / m if m > 0 else math.inf for m, t in zip(believed_rounds(mine, mode), believed_rounds(theirs, mode))]


def _record(series: Series, mode: str, seconds: float, reply: dict, count: int) -> None:
    batch = reply.get("batch_us")
    if isinstance(batch, (int, float)) and mode != "device":  # the runner's own view, for diagnosis only
        series.batch_us.setdefault(mode, []).append(round(float(batch) / count, 3))
    if mode != "device":
        series.rounds[mode].append(seconds)
        return
    events = reply.get("event_us")
    if not (isinstance(events, list) and len(events) == count and all(isinstance(e, (int, float)) and 0 < e < 1e9 for e in events)):
        raise TimedFailure(["the runner's device-time report is malformed"])
    series.rounds["device"].append(statistics.median(events) / 1e6)
    hosts = reply.get("host_us")
    if isinstance(hosts, list):
        series.host_us.extend(float(h) for h in hosts if isinstance(h, (int, float)) and 0 <= h < 1e9)


def _stats(values: list[float]) -> dict | None:
    if not values:
        return None
    ordered = sorted(values)
    q1, q3 = ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4]
    return {"min": ordered[0], "median": statistics.median(ordered), "mean": statistics.fmean(ordered), "iqr": q3 - q1,
            "max": ordered[-1], "rounds": len(ordered)}


def _incumbent_failed(sup: Any, incumbent: dict, failure: Exception) -> None:
    incumbent["alive"] = False
    reasons = getattr(failure, "reasons", None) or [getattr(failure, "reason", str(failure))]
    sup.result["incumbent_error"] = "; ".join(reasons)[:2000]


def _incumbent_result(sup: Any, incumbent: dict | None, ratios: list[list[float]], per_case: list) -> None:
    if incumbent is None or not incumbent["alive"] or not all(ratios):
        sup.result["incumbent"] = None
        sup.result.setdefault("incumbent_error", "the incumbent was not timed")
        return
    rounds = min(len(r) for r in ratios)
    combined = [geomean([r[k] for r in ratios]) for k in range(rounds)]
    metric = per_case[0][0]["metric"]
    figures = {m: _geomean_or_none([s.get(m) for s in incumbent["series"]]) for m in timing.METRICS}
    sup.result["incumbent"] = {"candidate_id": incumbent["id"], "figures": figures,
                               "ratio": {"metric": metric, **bootstrap_ratio(combined, seed=len(combined))}}


def _geomean_or_none(values: list[float | None]) -> float | None:
    return geomean(values) if values and all(v for v in values) else None  # type: ignore[arg-type]


def combine_cases(label: str, per_case: list[tuple[dict, dict]]) -> tuple[dict, dict]:
    """One figure for several timed cases: geometric means of every figure (an implementation
    missing at any case is left out); each case's own timings and roofline under ``cases``."""
    timings = [t for t, _ in per_case]
    roofs = [r for _, r in per_case]
    names = [n for n in timings[0]["baselines"] if all(n in t["baselines"] for t in timings)]
    figures = {m: _geomean_or_none([t["figures"].get(m) for t in timings]) for m in timing.METRICS}
    combined: dict[str, Any] = {
        "case": label,
        "metric": timings[0]["metric"] if all(t["metric"] == timings[0]["metric"] for t in timings) else "eager",
        "candidate_us": geomean([t["candidate_us"] for t in timings]),
        "figures": figures,
        "graph_safe": all(t["graph_safe"] for t in timings),
        "baselines": {n: geomean([t["baselines"][n] for t in timings]) for n in names},
        "baseline_figures": {n: {m: _geomean_or_none([t["baseline_figures"][n].get(m) for t in timings]) for m in timing.METRICS}
                             for n in names if all(n in t["baseline_figures"] for t in timings)},
        "reference_us": geomean([t["reference_us"] for t in timings]) if all(t.get("reference_us") for t in timings) else None,
        "compile_s": timings[0].get("compile_s"),
        "rounds": timings[0]["rounds"],
        "timer": timings[0]["timer"],
        "host_us": max((t["host_us"] for t in timings if t.get("host_us") is not None), default=None),
        "cases": timings,
    }
    if names:
        combined["baseline"] = names[0]
    errors = {k: v for t in timings for k, v in (t.get("baseline_errors") or {}).items()}
    if errors:
        combined["baseline_errors"] = errors
    floor_us = geomean([r["floor_us"] for r in roofs])
    roof = {"floor_us": floor_us, "floor_fraction": floor_us / combined["candidate_us"], "achieved_GBps": None,
            "achieved_TFLOPs": None, "ceilings": roofs[0].get("ceilings"), "cases": roofs}
    return combined, roof
