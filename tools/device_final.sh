#!/usr/bin/env bash
# Session 20's last device call: the benchmark suite's three timers for KDA (ours, the previous
# render, fla) and MLA decode (ours, the family's direct-launch renders, FlashMLA), then the judge
# on both bests (quick). JSON and logs under $OUT. Needs carry [".whl", "bench_extra"].
set -uo pipefail
source tools/device_setup.sh
export KOPT_BENCH_SECONDS=0.6
t0=$(date +%s)
PYTHONPATH=$KOPT_FLA_PATH:$PYTHONPATH KOPT_BENCH_EXTRA="kda=bench_extra/kda_2a739a2d.py" timeout 170 python3 -m pytest benchmarks -q -p no:cacheprovider \
  -k "kda and (best or fla or file)" --benchmark-json $OUT/bench-kda.json 2>&1 | grep -v "^benchmarks" | grep -v "^\s*$" | tail -62
echo "== kda bench at $(( $(date +%s) - t0 )) s"
KOPT_BENCH_EXTRA="mla=bench_extra/mla_direct.py,mla=bench_extra/mla_balanced_direct.py" timeout 80 python3 -m pytest benchmarks -q -p no:cacheprovider \
  -k "mla-B and (best or flashmla or file)" --benchmark-json $OUT/bench-mla.json 2>&1 | grep -v "^benchmarks" | grep -v "^\s*$" | tail -52
echo "== mla bench at $(( $(date +%s) - t0 )) s"
timeout 60 python3 -m pytest_kopt.cli eval --problem kda kernels/best/kda.py --quick --upto correctness --json $OUT/judge-kda.json 2>&1 | tail -4
echo "== judge kda at $(( $(date +%s) - t0 )) s"
timeout 60 python3 -m pytest_kopt.cli eval --problem mla kernels/best/mla.py --quick --json $OUT/judge-mla.json 2>&1 | tail -9
python3 -c "
import json, os
r = json.load(open(os.environ['OUT'] + '/judge-mla.json'))
print('round trip', r.get('round_trip_us'))
for label, rows in (r.get('timelines') or {}).items():
    print(label, [(x['mode'], x['n'], x['window_us'], round(x['runner_us'] or 0)) for x in rows[:9]])
"
echo "== judge mla at $(( $(date +%s) - t0 )) s"
