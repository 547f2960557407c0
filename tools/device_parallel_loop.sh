#!/usr/bin/env bash
# Issue 34 on one H200: a short KDA search loop with one worker, then the same with two workers on
# the same GPU (--kopt-workers=2: two judges at once, both pinned to GPU 0, so their timings are
# contended). Prints each loop's tool calls per hour and what the contended flag did: the N=2 loop's
# overlapping timings are marked contended, none of them is a best, the search agent re-times a
# contended leader alone, and nothing contended is promoted. From the repository root on the device,
# with carry=[".whl"] (tools/device_setup.sh says how to fill it):
#   source tools/device_setup.sh && bash tools/device_parallel_loop.sh [SECONDS_EACH=300] [BUDGET=60]
# Device time: about 2 x SECONDS_EACH plus start-up. The run directories land in $OUT/runs/.
set -u
SECS=${1:-300}
BUDGET=${2:-60}
OUT=${OUT:-/tmp/kopt-out}
mkdir -p "$OUT/runs"
PLUGIN="-p pytest_kopt.plugin"  # the plugin by -p where the package is not installed (the device copy)
python3 -c 'import importlib.metadata as m, sys; sys.exit(0 if m.entry_points(group="pytest11", name="kopt") else 1)' && PLUGIN=""
python3 -c 'import jsonlines, optuna, pytest_benchmark' || { echo "jsonlines / optuna / pytest-benchmark missing: carry .whl and source tools/device_setup.sh"; exit 1; }
nvidia-smi --query-gpu=index,name --format=csv,noheader
for n in 1 2; do
  run="$OUT/runs/kda-workers$n"
  echo "=== $(date -u +%H:%M:%S) KDA loop, --kopt-workers=$n, at most ${SECS}s and $BUDGET calls"
  # SIGINT at the limit: a clean stop (run_interrupted), the calls in flight left for a resume
  timeout -s INT -k 30 "$SECS" python3 -m pytest $PLUGIN -q -p no:cacheprovider \
    --kopt-optimize=kda --kopt-budget="$BUDGET" --kopt-quick --kopt-workers="$n" \
    --kopt-eval-timeout="${KOPT_EVAL_TIMEOUT:-600}" --kopt-run-dir="$run" 2>&1 | tail -30
  echo "=== $(date -u +%H:%M:%S) workers=$n exit=${PIPESTATUS[0]}"
done
python3 - "$OUT/runs/kda-workers1" "$OUT/runs/kda-workers2" <<'PY'
"""Per run: calls charged, calls per hour, evaluations in flight at once, contended timings, bests."""
import sys
from pytest_kopt import events as ev
from pytest_kopt.runstate import RunState, seconds

for run in sys.argv[1:]:
    try:
        events = ev.read_events(f"{run}/events.jsonl")
    except OSError as exc:
        print(run, "no log:", exc)
        continue
    state = RunState.fold(events)
    calls = [e for e in events if e["kind"] in (ev.TOOL_CALL, ev.TOOL_RESULT)]
    span = (seconds(calls[-1]["time"]) - seconds(calls[0]["time"])) if len(calls) > 1 else 0.0
    open_, most = set(), 0
    for e in calls:
        if e["kind"] == ev.TOOL_CALL and e["tool"] in ("run_tests", "benchmark", "profile"):
            open_.add(e["call"]); most = max(most, len(open_))
        elif e["kind"] == ev.TOOL_RESULT:
            open_.discard(e["call"])
    verdicts = [e for e in events if e["kind"] == ev.VERDICT and e.get("call")]
    timed = [v for v in verdicts if v.get("candidate_us") is not None]
    contended = [v for v in timed if v.get("contended")]
    by_call = {(v["candidate_id"], v["call"]): v for v in verdicts}
    bests = [e for e in events if e["kind"] == ev.BEST and e.get("call")]
    contended_bests = [b for b in bests if by_call.get((b["candidate_id"], b["call"]), {}).get("contended")]
    started = next((e for e in events if e["kind"] == ev.RUN_STARTED), {})
    print(f"{run}: workers {started.get('workers')} ({(started.get('executor') or {}).get('devices')}), "
          f"{state.budget_used} calls charged in {span / 60:.1f} min = {3600 * state.budget_used / span if span else 0:.0f} tool calls/hour; "
          f"at most {most} evaluations at once; {len(timed)} timings, {len(contended)} contended; "
          f"{len(bests)} changes of best, {len(contended_bests)} from a contended timing (must be 0); "
          f"best {state.best and state.best['candidate_id']} {state.best and state.best.get('candidate_us')} us")
    for v in contended[:5]:
        print(f"    contended: call {v['call']} {v['candidate_id']} {v['upto']} {v['candidate_us']:.1f} us on {v.get('placement', {}).get('device')}")
    print("    devices:", sorted({str(v.get("placement", {}).get("device")) for v in verdicts}))
PY
