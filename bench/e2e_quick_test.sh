#!/usr/bin/env bash
# Runs the benchmark in --quick form and checks the report is complete.
# Figures are not asserted: speed is judged from bench/RESULTS.md.
set -euo pipefail
e2e="$1"
report="$2"
json="${TEST_UNDECLARED_OUTPUTS_DIR:-${TEST_TMPDIR:-/tmp}}/e2e_quick.json"
"$e2e" --quick --json="$json"
/usr/bin/python3 "$report" "$json" --check
