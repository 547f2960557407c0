# Jobs for one device command, run in order on the GPU that CUDA_VISIBLE_DEVICES names:
#   bash tools/device_jobs.sh JOB SECONDS [JOB SECONDS ...]
# Source tools/device_setup.sh first. Each job gets at most SECONDS; a loop is stopped with
# SIGINT (a clean, resumable stop) and killed 30 s later if it is still running. Run directories
# stay under results/runs/ (tar them into $OUT in the calling command); logs go to stdout.
# Jobs:
#   gpu:EXPR                pytest tests/gpu -k EXPR (the GPU checks: judge, kda, mla, timer; `gpu:all` runs every one)
#   kda-dev | mla-dev       tools/dev_kda_chunked.py / dev_mla.py (flash-linear-attention importable)
#   kda-wgmma-dev           tools/dev_kda_wgmma.py (KDA_WG_ROWS, KDA_WG_FLA=0 as in its docstring)
#   loop:PROBLEM:RUN:BUDGET  the search loop on PROBLEM in results/runs/RUN (resumed if it exists; a packed
#                           results/runs/RUN.tar.xz is unpacked first: pack it again with `kopt pack` before committing),
#                           up to BUDGET tool calls, judge in quick mode, best promoted to kernels/best/
#                           (flash-linear-attention is NOT importable here: its first call autotunes
#                           for 85 s on a fresh machine; the judge caches that choice on disk, but a
#                           short loop still pays for it once; KOPT_EVAL_TIMEOUT overrides the 900 s
#                           limit on one evaluation)
#   bench:EXPR              benchmarks/test_headline.py -k EXPR, JSON to $OUT/bench-<EXPR>.json (stopped with
#                           SIGINT at the limit, so the tests that finished are still saved; `-k kda`
#                           needs ~400 s on a fresh machine: fla autotunes, references are slow at the big shapes)
set -u
# the plugin is loaded through its entry point where the package is installed, by -p elsewhere
PLUGIN="-p pytest_kopt.plugin"
python3 -c 'import importlib.metadata as m, sys; sys.exit(0 if m.entry_points(group="pytest11", name="kopt") else 1)' && PLUGIN=""
# the loop and the benchmarks import the carried wheels (jsonlines, optuna, pytest-benchmark 5): without them a
# loop dies at start-up with an ImportError after the machine's start-up time is already spent (session 10, call 7)
wheels_ok() {
  python3 -c 'import jsonlines, optuna, pytest_benchmark' 2>/dev/null && return 0
  echo "=== $job skipped: jsonlines / optuna / pytest-benchmark not importable -- carry=[\".whl\"] and source tools/device_setup.sh first"
  return 1
}
while [ $# -ge 2 ]; do
  job=$1; secs=$2; shift 2
  echo "=== $(date -u +%H:%M:%S) gpu=${CUDA_VISIBLE_DEVICES:-all} job=$job limit=${secs}s"
  case $job in
    gpu:*)
      expr=${job#gpu:}
      [ "$expr" = all ] && expr=""
      timeout -k 30 "$secs" python3 -m pytest -p no:cacheprovider -q -rs tests/gpu ${expr:+-k "$expr"} ;;
    kda-dev)
      PYTHONPATH=$KOPT_FLA_PATH:$PYTHONPATH KDA_DEV_BUDGET_S=$((secs - 20)) timeout -k 30 "$secs" python3 tools/dev_kda_chunked.py ;;
    kda-wgmma-dev)
      PYTHONPATH=$KOPT_FLA_PATH:$PYTHONPATH KDA_WG_BUDGET_S=$((secs - 20)) timeout -k 30 "$secs" python3 tools/dev_kda_wgmma.py ;;
    mla-dev)
      timeout -k 30 "$secs" python3 tools/dev_mla.py ;;
    loop:*)
      wheels_ok || continue
      IFS=: read -r _ problem run budget <<<"$job"
      resume=""
      if [ -f "results/runs/$run.tar.xz" ] && [ ! -d "results/runs/$run" ]; then  # a committed run is packed
        python3 -c 'import sys; from pytest_kopt.runstore import unpack; print("unpacked", unpack(sys.argv[1]))' "results/runs/$run.tar.xz" || continue
      fi
      [ -f "results/runs/$run/events.jsonl" ] && resume="--kopt-resume"
      timeout -s INT -k 30 "$secs" python3 -m pytest $PLUGIN -q -p no:cacheprovider \
        --kopt-optimize="$problem" --kopt-budget="$budget" --kopt-quick --kopt-promote \
        --kopt-eval-timeout="${KOPT_EVAL_TIMEOUT:-900}" \
        --kopt-run-dir="results/runs/$run" $resume ;;
    bench:*)
      wheels_ok || continue
      expr=${job#bench:}
      # SIGINT at the limit; benchmarks/conftest.py also rewrites the JSON after every test, so even a
      # session killed outright keeps the tests that finished (call 4 of session 5 lost its JSON)
      PYTHONPATH=$KOPT_FLA_PATH:$PYTHONPATH timeout -s INT -k 30 "$secs" python3 -m pytest $PLUGIN -p no:cacheprovider \
        benchmarks/test_headline.py -k "$expr" --benchmark-json="$OUT/bench-${expr//[^A-Za-z0-9_-]/_}.json" -q ;;
    *) echo "unknown job $job" ;;
  esac
  echo "=== $(date -u +%H:%M:%S) job=$job exit=$?"
done
