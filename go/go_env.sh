# Sourced with the workspace root (a runfiles tree or the source tree) as $1:
# the environment that builds the Go module offline against libpserver.so.
# Sets GO_MODULE_COPY to a writable copy of the module under $2.
# Also defines pserver_abi_version and pserver_write_pc, which
# `bazel run //:install` (packaging/install.sh) uses too.

# pserver_abi_version PSERVER_H: "0.5.0", the C ABI's version, from the header.
pserver_abi_version() {
  local v="" part
  for part in MAJOR MINOR PATCH; do
    v="$v${v:+.}$(sed -n "s/^#define PSERVER_VERSION_$part \([0-9]*\)$/\1/p" "$1")"
  done
  case "$v" in [0-9]*.[0-9]*.[0-9]*) echo "$v" ;;
    *) echo "no PSERVER_VERSION_MAJOR/MINOR/PATCH in $1" >&2; return 1 ;; esac
}

# pserver_write_pc FILE PREFIX INCLUDEDIR LIBDIR VERSION: a pkg-config file for
# libpserver.so. Libs carries an rpath to LIBDIR, so a program linked with
# `pkg-config --libs pserver` runs without LD_LIBRARY_PATH.
pserver_write_pc() {
  cat > "$1" <<PC
prefix=$2
includedir=$3
libdir=$4

Name: pserver
Description: C ABI of pserver, a distributed parameter server (libpserver.so)
Version: $5
Cflags: -I\${includedir}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lpserver
PC
}

pserver_go_env() {
  local root="$1" tmp="$2"
  local lib
  lib="$(dirname "$(readlink -f "$root/cc/capi/libpserver.so")")"
  export CGO_ENABLED=1
  # cgo finds the library through pkg-config (`#cgo pkg-config: pserver`), as
  # outside Bazel: a pserver.pc over the headers and the library's real
  # directory (not the runfiles symlink), so the rpath stays valid for as
  # long as the build output does.
  mkdir -p "$tmp/pkgconfig"
  pserver_write_pc "$tmp/pkgconfig/pserver.pc" "$root" '${prefix}/cc/capi' "$lib" \
    "$(pserver_abi_version "$root/cc/capi/pserver.h")"
  export PKG_CONFIG_PATH="$tmp/pkgconfig"
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
