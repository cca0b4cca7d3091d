#!/usr/bin/env bash
# bazel test //tools/doccheck:doccheck_test: README.md and docs/*.md against
# the source tree they sit in (README.md in the runfiles links into it) and
# the pserver binary built from it.
set -euo pipefail
readme="$(readlink -f README.md)"
exec /usr/bin/python3 tools/doccheck/doccheck.py --root "$(dirname "$readme")" \
  --pserver cc/server/pserver
