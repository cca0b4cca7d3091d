#!/usr/bin/env bash
# Runs the quickstart example; it exits non-zero unless the loss falls clearly.
set -euo pipefail
out="$("$1" --epochs=4 2>&1)" || { echo "$out"; exit 1; }
echo "$out"
grep -q "loss fell from" <<<"$out"
