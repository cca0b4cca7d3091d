#!/usr/bin/env bash
# bazel test //python:readme_test: installs the package as users do, then runs
# README.md's Python example as written (python/readme_test.py).
set -euo pipefail
site="$TEST_TMPDIR/site"
python/install.sh --target "$site" --quiet
export PYTHONPATH="$site"
exec /usr/bin/python3 python/readme_test.py
