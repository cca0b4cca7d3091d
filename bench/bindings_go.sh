#!/usr/bin/env bash
# Runs bench/go/bindings_bench.go (e2e's `bindings` group), built with
# Debian's go (offline, standard library only) against libpserver.so; go's
# build cache under ~/.cache/pserver-bench makes later builds a link only.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/pserver-bench"
mkdir -p "$cache"
tmp="$(mktemp -d "$cache/run.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
source "$root/go/go_env.sh"
GOCACHE="$cache/gocache" pserver_go_env "$root" "$tmp"
mkdir -p "$GO_MODULE_COPY/cmd/bindings_bench"
cp -L "$root/bench/go/bindings_bench.go" "$GO_MODULE_COPY/cmd/bindings_bench/main.go"
(cd "$GO_MODULE_COPY" && /usr/bin/go build -trimpath -o "$tmp/bindings_bench" ./cmd/bindings_bench)
"$tmp/bindings_bench" "$@"
