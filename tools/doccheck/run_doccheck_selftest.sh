#!/usr/bin/env bash
# bazel test //tools/doccheck:doccheck_selftest
set -euo pipefail
exec /usr/bin/python3 tools/doccheck/doccheck_selftest.py -v
