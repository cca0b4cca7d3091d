#!/usr/bin/env bash
# Runs the compressed_digits example: it exits non-zero unless float16,
# bfloat16 and top-k training end within 0.01 of float32's test accuracy.
set -euo pipefail
out="$("$1" 2>&1)" || { echo "$out"; exit 1; }
echo "$out"
grep -q "every encoding within 0.010 of float32 accuracy" <<<"$out"
