#!/usr/bin/env bash
# bazel test //python:pytest (and :torch_examples_test): installs the package
# into a temporary directory with the install script users run, then runs
# pytest against it on the paths given as arguments (default python/tests).
set -euo pipefail
site="$TEST_TMPDIR/site"
python/install.sh --target "$site" --quiet
export PYTHONPATH="$site"
export MPLBACKEND=Agg
export PSERVER_BINARY="$PWD/cc/server/pserver"  # for tests/test_etcd.py
# The one test certificate generator (cc/testing/test_certs.h), for tls_certs.py.
export PSERVER_TEST_CERT_TOOL="$PWD/cc/testing/test_cert_tool"
# One XML test case per pytest case, for CI's "N passed, N failed" line.
junit=()
if [ -n "${XML_OUTPUT_FILE:-}" ]; then junit=(--junitxml="$XML_OUTPUT_FILE"); fi
if [ $# -eq 0 ]; then set -- python/tests; fi
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider "${junit[@]}" "$@"
