"""Judge the KDA families in quick mode on a GPU (headline shape plus a few hypothesis shapes),
printing verdict, reasons, time and the baseline's time from the same evaluation.

    PYTHONPATH=. python3 tools/judge_kda_quick.py [FAMILY ...]
"""

import sys

from pytest_kopt.judge import evaluate

families = sys.argv[1:] or ["kda_chunked", "kda_recurrent"]
for name in families:
    result = evaluate("kda", f"kernels/families/{name}.py", quick=True, upto="benchmark", timeout_s=100)
    timings = result.get("timings") or {}
    print(f"{name}: {result['verdict']} at {result['stage']}  case {timings.get('case')}  "
          f"candidate {timings.get('candidate_us')} us  baselines {timings.get('baselines')}", flush=True)
    for reason in result["reasons"][:4]:
        print("   ", reason[:400], flush=True)
    for error in result.get("errors", [])[:6]:
        print("   ", error, flush=True)
