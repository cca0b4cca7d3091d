#!/usr/bin/env bash
# bazel run //go/cmd/psctl -- <command> ...: builds psctl with Debian's go
# (offline, standard library only) into ~/.cache/pserver-psctl once per
# version of its sources, then runs it.
set -euo pipefail
runfiles="${RUNFILES_DIR:-$0.runfiles}"
if [ -d "$runfiles/pserver" ]; then root="$runfiles/pserver"; else root="$PWD"; fi
root="$(cd "$root" && pwd)"
cache="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/pserver-psctl"
mkdir -p "$cache"
key="$( (cd "$root" && find go -name '*.go' -o -name go.mod | sort | xargs cat; cat cc/capi/pserver*.h;
         readlink -f cc/capi/libpserver.so) | sha256sum | cut -c1-16)"
bin="$cache/psctl-$key"
if [ ! -x "$bin" ]; then
  tmp="$(mktemp -d "$cache/build.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  source "$root/go/go_env.sh"
  GOCACHE="$cache/gocache" pserver_go_env "$root" "$tmp"
  (cd "$GO_MODULE_COPY" && /usr/bin/go build -trimpath -o "$tmp/psctl" ./cmd/psctl)
  mv "$tmp/psctl" "$bin"
  rm -rf "$tmp"
  trap - EXIT
fi
export PSCTL_PSERVER="${PSCTL_PSERVER:-$root/cc/server/pserver}"
exec "$bin" "$@"
