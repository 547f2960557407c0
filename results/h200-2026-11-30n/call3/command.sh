source benchmarks/device_setup.sh >/dev/null; O=$OUT
mkdir -p /tmp/rb && cp -r benchmarks kernels pytest_kopt tests pyproject.toml conftest.py /tmp/rb/
cd /tmp/rb && OUT=$O bash benchmarks/device_jobs.sh "bench:kda and (best or fla)" 430 > $O/bench.log 2>&1
tail -8 $O/bench.log | cut -c1-160
