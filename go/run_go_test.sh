#!/usr/bin/env bash
# bazel test //go:go_test: copies the module into $TEST_TMPDIR and runs
# `go test ./...` against the libpserver.so and pserver binary in runfiles,
# writing one JUnit test case per Go test to $XML_OUTPUT_FILE.
set -euo pipefail
root="$PWD"
source go/go_env.sh
pserver_go_env "$root" "$TEST_TMPDIR"
export TMPDIR="$TEST_TMPDIR"
export PSCTL_PSERVER="$root/cc/server/pserver"
export PSCTL_README="$root/README.md"
cd "$GO_MODULE_COPY"
rc=0
/usr/bin/go test -trimpath -count=1 -timeout 240s -json ./... "$@" > "$TEST_TMPDIR/go_test.json" || rc=$?
/usr/bin/python3 "$root/go/gotest_junit.py" "$TEST_TMPDIR/go_test.json" "${XML_OUTPUT_FILE:-}"
exit "$rc"
