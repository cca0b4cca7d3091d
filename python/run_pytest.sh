#!/usr/bin/env bash
# bazel test //python:pytest: installs the package into a temporary directory
# with the install script users run, then runs the pytest suite against it.
set -euo pipefail
site="$TEST_TMPDIR/site"
python/install.sh --target "$site" --quiet
export PYTHONPATH="$site"
export MPLBACKEND=Agg
export PSERVER_BINARY="$PWD/cc/server/pserver"  # for tests/test_etcd.py
# One XML test case per pytest case, for CI's "N passed, N failed" line.
junit=()
if [ -n "${XML_OUTPUT_FILE:-}" ]; then junit=(--junitxml="$XML_OUTPUT_FILE"); fi
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider "${junit[@]}" python/tests "$@"
