#!/usr/bin/env bash
# One device call: the judge (supervisor + isolated runner) on the H200 against the promoted kernels
# and the GPU-only hostile tests; results land in $OUT. From the repository root on the device:
#   bash tools/device_judge_check.sh [quick|full]
set -uo pipefail
source tools/device_setup.sh
export PYTHONPATH=$KOPT_FLA_PATH:$PYTHONPATH  # fla's chunk_kda: the KDA baseline
MODE=${1:-full}
# seconds per step (the device call's 600 s must hold them all; 0 skips a step): each problem's evaluation, then the hostile GPU tests
declare -A LIMIT=([mla]=${MLA_S:-300} [kda]=${KDA_S:-300})
Q=""; [ "$MODE" = quick ] && Q="--quick"
t0=$(date +%s)
for p in mla kda; do
  [ "${LIMIT[$p]}" = 0 ] && continue  # 0: skip this problem
  timeout ${LIMIT[$p]} python3 -m pytest_kopt.cli eval --problem $p kernels/best/$p.py $Q --json $OUT/$p.json --benchmark-json $OUT/$p-bench.json 2>&1 | tee $OUT/$p.log | tail -25
  echo "== $p done at $(( $(date +%s) - t0 )) s"
done
python3 - <<'PY'
import json, os
for p in ("mla", "kda"):
    try:
        r = json.load(open(os.environ["OUT"] + f"/{p}.json"))
    except OSError:
        continue
    print(p, r["verdict"], r["stage"], "round trip us", r.get("round_trip_us"), "seconds", r.get("seconds"))
    for label, rows in (r.get("timelines") or {}).items():
        print(" ", label, [(x["mode"], x["n"], x["window_us"], round(x["runner_us"] or 0)) for x in rows[:8]])
    t = r.get("timings") or {}
    for c in t.get("cases", [t]):
        print("  ", c.get("case"), c.get("figures"), "slots", c.get("slots"), "host", c.get("host_us"), "batch", c.get("runner_batch_us"))
PY
[ "${HOSTILE_S:-150}" = 0 ] || timeout ${HOSTILE_S:-150} python3 -m pytest tests/test_judge_hostile.py -q -p no:cacheprovider -k "side_stream or illegal" 2>&1 | tail -4
echo "== hostile done at $(( $(date +%s) - t0 )) s"
