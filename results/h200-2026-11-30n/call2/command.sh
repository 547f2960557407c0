source benchmarks/device_setup.sh >/dev/null; export KOPT_EVAL_TIMEOUT=240; O=$OUT
K4="$(cat .whl/ncu_knobs4.json)"
mkdir -p /tmp/rb && cp -r benchmarks kernels pytest_kopt tests pyproject.toml conftest.py /tmp/rb/
(cd /tmp/rb && CUDA_VISIBLE_DEVICES=1 KDA_WG_ROWS=glw_k,glst_k,glst_0 KDA_WG_FLA=0 OUT=$O bash benchmarks/device_jobs.sh kda-wgmma-dev 300 > $O/dev.log 2>&1
 CUDA_VISIBLE_DEVICES=1 OUT=$O/ncu NCU_REGEX='_kda_rows_gluon' KDA_DEV_NCU_KNOBS="$K4" timeout 120 bash benchmarks/ncu_prep.sh > $O/ncu-log.txt 2>&1) &
CUDA_VISIBLE_DEVICES=0 bash benchmarks/device_jobs.sh loop:kda:kda-h200-2:640 420 > $O/loop.log 2>&1; tar czf $O/loop.tgz results/runs/kda-h200-2 kernels/best/kda.py
wait
tail -3 $O/ncu-log.txt | cut -c1-200; grep -A8 "^shape" $O/dev.log; grep "checks failing" $O/dev.log | cut -c1-900; grep -E "^\[(59[3-9]|6[0-4][0-9])/" $O/loop.log | cut -c1-160; tail -2 $O/loop.log
