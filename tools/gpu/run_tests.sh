#!/bin/bash
# On the GPU machine: runs what package.sh put in PKG (the CUDA tests, then
# cuda_bench and device_io_bench); logs go to LOGS.
# Usage: tools/gpu/run_tests.sh PKG LOGS
pkg=$(cd "${1:?usage: run_tests.sh PKG LOGS}" && pwd); logs=${2:?usage: run_tests.sh PKG LOGS}
mkdir -p "$logs"; logs=$(cd "$logs" && pwd); cd "$pkg" || exit 1
export LD_LIBRARY_PATH=$pkg/lib:/usr/local/cuda/lib64 PATH=$pkg/bin:$PATH
export TEST_TMPDIR=${TEST_TMPDIR:-$(mktemp -d)}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
pass=0; fail=0
for t in $(cat tests.txt); do
  log="$logs/$(basename "$t").log"
  timeout 300 "./$t" > "$log" 2>&1; rc=$?
  echo "$t: rc=$rc"; grep -E '^\[  (PASSED|FAILED|SKIPPED) +\]' "$log" | head -12
  if [ $rc = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); tail -20 "$log"; fi
done
echo "$pass passed, $fail failed"
timeout 200 ./bench/cuda_bench 2>&1 | tee "$logs/cuda_bench.txt"
timeout 120 ./bench/device_io_bench 2>&1 | tee "$logs/device_io_bench.txt"
[ $fail = 0 ]
