# Sourced with the workspace root (a runfiles tree or the source tree) as $1:
# the environment that builds the Go module offline against libpserver.so.
# Sets GO_MODULE_COPY to a writable copy of the module under $2.
pserver_go_env() {
  local root="$1" tmp="$2"
  local lib
  lib="$(dirname "$(readlink -f "$root/cc/capi/libpserver.so")")"
  export CGO_ENABLED=1
  export CGO_CFLAGS="-I$root/cc/capi"
  # The library's real directory (not the runfiles symlink), so the rpath
  # stays valid for as long as the build output does.
  export CGO_LDFLAGS="-L$lib -Wl,-rpath,$lib"
  export GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local GOTELEMETRY=off
  export GOPATH="$tmp/gopath"
  export GOCACHE="${GOCACHE:-$tmp/gocache}"
  [ -n "${HOME:-}" ] && [ -w "${HOME:-/nonexistent}" ] || export HOME="$tmp/home"
  mkdir -p "$GOPATH" "$GOCACHE" "$HOME"
  GO_MODULE_COPY="$tmp/module"
  rm -rf "$GO_MODULE_COPY"
  mkdir -p "$GO_MODULE_COPY"
  # Dereference runfiles symlinks: go wants real files in a module.
  (cd "$root/go" && find . -name '*.go' -o -name go.mod | while read -r f; do
     mkdir -p "$GO_MODULE_COPY/$(dirname "$f")"
     cp -L "$f" "$GO_MODULE_COPY/$f"
   done)
}
