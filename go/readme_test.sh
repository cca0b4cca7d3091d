#!/usr/bin/env bash
# bazel test //go:readme_test: runs README.md's Go example as written (the
# body of main, wrapped with the imports of go/examples/quickstart/main.go),
# checks that it is gofmt-clean, 10 lines, the same as the quickstart, and
# that it prints what the README says.
set -euo pipefail
root="$PWD"
source go/go_env.sh
pserver_go_env "$root" "$TEST_TMPDIR"
mkdir -p "$GO_MODULE_COPY/readme_example"
want="$(/usr/bin/python3 go/readme_example.py README.md go/examples/quickstart/main.go \
        "$GO_MODULE_COPY/readme_example/main.go")"
cd "$GO_MODULE_COPY"
unformatted="$(/usr/bin/gofmt -l readme_example)"
if [ -n "$unformatted" ]; then
  echo "README.md's Go example is not gofmt-clean:"; /usr/bin/gofmt -d readme_example; exit 1
fi
got="$(timeout 300 /usr/bin/go run -trimpath ./readme_example)"
echo "README.md's Go example printed:"; echo "$got"
if [ "$got" != "$want" ]; then
  echo "README.md says it prints:"; echo "$want"; exit 1
fi
