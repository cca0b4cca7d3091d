#!/bin/bash
# On a machine WITH the CUDA toolkit (the GPU machine): compile cc/cuda's .cu
# files exactly as third_party/cuda/nvcc.bzl does, into a directory laid out
# like a CUDA_PATH that prebuilt_nvcc can serve from:
#   DIR/bin/nvcc (prebuilt_nvcc), DIR/lib64/libcudart_static.a, DIR/objs/*.o
# Then, on a machine without CUDA (same x86-64 ABI):
#   bazel build --repo_env=CUDA_PATH=DIR --config=cuda ...
# Usage (repository root): tools/gpu/compile_kernels.sh DIR
set -euo pipefail
dir=${1:?usage: compile_kernels.sh DIR}
cuda=${CUDA_PATH:-/usr/local/cuda}
mkdir -p "$dir/bin" "$dir/lib64" "$dir/objs" "$dir/include"
flags=$(sed -n '/^NVCC_FLAGS = \[/,/^\]/p' third_party/cuda/nvcc.bzl | grep -o '"[^"]*"' | tr -d '"' | tr '\n' ' ')
for cu in cc/cuda/*.cu; do
  echo "nvcc $cu"
  eval "$cuda/bin/nvcc $flags -I. -c $cu -o $dir/objs/$(basename "$cu" .cu).o"
done
cp "$cuda/lib64/libcudart_static.a" "$dir/lib64/"
cp tools/gpu/prebuilt_nvcc "$dir/bin/nvcc"
"$cuda/bin/nvcc" --version | tail -1 > "$dir/objs/VERSION"
