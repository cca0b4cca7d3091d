#!/bin/bash
# On the build machine: builds the CUDA tests and benchmarks against objects
# from compile_kernels.sh and copies them, with the shared libraries they load
# (all but the C/C++ runtime), into PKG, to run on a GPU machine that lacks
# this machine's libraries (tools/gpu/run_tests.sh).
# Usage (repository root): tools/gpu/package.sh CUDA_DIR PKG
set -euo pipefail
cuda=$(cd "${1:?usage: package.sh CUDA_DIR PKG}" && pwd); pkg=${2:?usage: package.sh CUDA_DIR PKG}
tests="cc/cuda/kernel_math_test cc/cuda/device_test cc/cuda/buffer_test cc/cuda/device_optimizer_test
  cc/cuda/device_rows_test cc/cuda/device_storage_test cc/cuda/device_server_test
  cc/cuda/pserver_device_flag_test cc/cuda/memory/memory_test cc/client/device_io_test
  cc/capi/device_capi_test"
bins="bench/cuda_bench bench/device_io_bench bench/e2e cc/server/pserver"
targets=$(for t in $tests $bins; do echo "//$(dirname "$t"):$(basename "$t")"; done)
bazel build -c opt --dynamic_mode=off --repo_env=CUDA_PATH="$cuda" --config=cuda $targets
rm -rf "$pkg"; mkdir -p "$pkg/lib" "$pkg/bin"
echo $tests | tr ' ' '\n' > "$pkg/tests.txt"
for b in $tests $bins; do
  mkdir -p "$pkg/$(dirname "$b")"; cp -L "bazel-bin/$b" "$pkg/$b"; strip "$pkg/$b"
done
for b in $tests $bins $(command -v iperf3 || true); do
  [ -f "$b" ] || b="bazel-bin/$b"; ldd "$b" | awk '/=>/ {print $3}'
done | sort -u | grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt)\.so' |
  while read -r lib; do cp -L "$lib" "$pkg/lib/"; done
strip --strip-unneeded "$pkg"/lib/*.so* 2>/dev/null || true
if command -v iperf3 >/dev/null; then cp "$(command -v iperf3)" "$pkg/bin/"; fi  # bench:e2e's ceiling
du -sh "$pkg"
