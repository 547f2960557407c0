#!/usr/bin/env bash
# Session 20's last device call: the benchmark suite's three timers for MLA decode (ours, the
# family's direct-launch renders, FlashMLA) and KDA (ours, the previous render, fla), then the judge
# on the MLA decode best. JSON and logs under $OUT.
set -uo pipefail
source benchmarks/device_setup.sh
export KOPT_BENCH_SECONDS=1.0
t0=$(date +%s)
KOPT_BENCH_EXTRA="mla=bench_extra/mla_direct.py,mla=bench_extra/mla_balanced_direct.py" timeout 150 python3 -m pytest benchmarks -q -p no:cacheprovider \
  -k "mla-B and (best or flashmla or file)" --benchmark-json $OUT/bench-mla.json 2>&1 | grep -v "^benchmarks" | tail -45
echo "== mla bench at $(( $(date +%s) - t0 )) s"
PYTHONPATH=$KOPT_FLA_PATH:$PYTHONPATH KOPT_BENCH_EXTRA="kda=bench_extra/kda_2a739a2d.py" timeout 220 python3 -m pytest benchmarks -q -p no:cacheprovider \
  -k "kda and (best or fla or file)" --benchmark-json $OUT/bench-kda.json 2>&1 | grep -v "^benchmarks" | tail -70
echo "== kda bench at $(( $(date +%s) - t0 )) s"
timeout 90 python3 -m pytest_kopt.cli eval --problem mla kernels/best/mla.py --quick --json $OUT/judge-mla.json 2>&1 | tail -12
python3 - <<'PY'
import json, os
r = json.load(open(os.environ["OUT"] + "/judge-mla.json"))
print("round trip", r.get("round_trip_us"))
for label, rows in (r.get("timelines") or {}).items():
    print(label, [(x["mode"], x["n"], x["window_us"], round(x["runner_us"] or 0)) for x in rows[:8]])
PY
echo "== judge at $(( $(date +%s) - t0 )) s"
