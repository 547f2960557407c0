source benchmarks/device_setup.sh >/dev/null; export KOPT_EVAL_TIMEOUT=240; O=$OUT
K3="$(cat .whl/ncu_knobs3.json)"
mkdir -p /tmp/rb && cp -r benchmarks kernels pytest_kopt tests pyproject.toml conftest.py /tmp/rb/
(cd /tmp/rb && CUDA_VISIBLE_DEVICES=1 OUT=$O bash benchmarks/device_jobs.sh "bench:kda and (best or fla)" 340 > $O/bench.log 2>&1
 CUDA_VISIBLE_DEVICES=1 OUT=$O/ncu NCU_REGEX='_kda_rows_gluon' KDA_DEV_NCU_KNOBS="$K3" timeout 170 bash benchmarks/ncu_prep.sh > $O/ncu-log.txt 2>&1) &
CUDA_VISIBLE_DEVICES=0 bash benchmarks/device_jobs.sh loop:kda:kda-h200-2:640 520 > $O/loop.log 2>&1; tar czf $O/loop.tgz results/runs/kda-h200-2 kernels/best/kda.py
wait
tail -4 $O/ncu-log.txt | cut -c1-200; ls $O/ncu; grep -E "^\[(5[6-9][0-9]|6[0-4][0-9])/" $O/loop.log | cut -c1-160; tail -2 $O/loop.log; tail -25 $O/bench.log | cut -c1-160
