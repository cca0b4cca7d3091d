#!/usr/bin/env bash
# Runs bench/bindings_bench.py (e2e's `bindings` group) against the pserver
# package installed, as users install it, into a temporary directory.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
site="$(mktemp -d "${TMPDIR:-/tmp}/pserver-bench-py.XXXXXX")"
trap 'rm -rf "$site"' EXIT
(cd "$root" && python/install.sh --target "$site" --quiet)
PYTHONPATH="$site" /usr/bin/python3 "$root/bench/bindings_bench.py" "$@"
