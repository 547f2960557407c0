#!/usr/bin/env bash
# Device diagnostic: where a judge round's time goes (MLA decode best, quick).
set -uo pipefail
source tools/device_setup.sh
timeout 200 python3 -m pytest_kopt.cli eval --problem mla kernels/best/mla.py --quick --json $OUT/mla.json 2>&1 | tail -6
python3 - <<'PY'
import json, os
r = json.load(open(os.environ["OUT"] + "/mla.json"))
for label, rows in (r.get("timelines") or {}).items():
    print(label)
    for row in rows:
        print("  ", row)
PY
echo "== without SIGSTOP"
KOPT_NO_SIGSTOP=1 timeout 200 python3 -m pytest_kopt.cli eval --problem mla kernels/best/mla.py --quick --json $OUT/mla2.json 2>&1 | tail -3
python3 - <<'PY'
import json, os
r = json.load(open(os.environ["OUT"] + "/mla2.json"))
for label, rows in (r.get("timelines") or {}).items():
    print(label)
    for row in rows[:12]:
        print("  ", row)
PY
