#!/usr/bin/env bash
# bazel run //:install -- --prefix DIR: installs pserver for C and Go programs
# built outside this repository.
#
#   DIR/lib/libpserver.so.<version>   the C ABI (version from pserver.h), and
#   DIR/lib/libpserver.so             a link to it: its soname, what programs load
#   DIR/include/pserver.h             with pserver_tables.h, pserver_cluster.h
#   DIR/lib/pkgconfig/pserver.pc      prefix-relative (${pcfiledir}): a moved DIR still works
#   DIR/bin/pserver, DIR/bin/psctl    the server and the orchestrator (psctl finds
#                                     pserver beside itself)
#   DIR/share/pserver/go              the Go module github.com/pserver-project/pserver/go
#                                     (its library package, without tests), for a
#                                     go.mod `replace` where nothing can be fetched
#
# Then: PKG_CONFIG_PATH=DIR/lib/pkgconfig pkg-config --cflags --libs pserver.
# Files are copied; run it again after changing the code. --quiet prints
# nothing on success. psctl is built here with Debian's go (cgo, offline).
set -euo pipefail

prefix=""
quiet=0
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || { echo "install: --prefix needs a directory" >&2; exit 2; }
              prefix="$2"; shift 2 ;;
    --prefix=*) prefix="${1#--prefix=}"; shift ;;
    --quiet) quiet=1; shift ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$prefix" ] || { echo "install: --prefix DIR is required (e.g. --prefix /usr/local)" >&2; exit 2; }

runfiles="${RUNFILES_DIR:-$0.runfiles}"
if [ -d "$runfiles/pserver" ]; then root="$runfiles/pserver"; else root="$PWD"; fi
root="$(cd "$root" && pwd)"
for f in cc/capi/libpserver.so cc/capi/pserver.h cc/server/pserver go/go.mod go/go_env.sh; do
  [ -e "$root/$f" ] || { echo "install: $root/$f is missing (run through bazel)" >&2; exit 1; }
done
case "$prefix" in /*) ;; *) prefix="${BUILD_WORKING_DIRECTORY:-$PWD}/$prefix" ;; esac
mkdir -p "$prefix"
prefix="$(cd "$prefix" && pwd)"

source "$root/go/go_env.sh"
version="$(pserver_abi_version "$root/cc/capi/pserver.h")"
mkdir -p "$prefix/bin" "$prefix/include" "$prefix/lib/pkgconfig" "$prefix/share/pserver"

install -m 0755 "$root/cc/capi/libpserver.so" "$prefix/lib/libpserver.so.$version"
ln -sfn "libpserver.so.$version" "$prefix/lib/libpserver.so"
install -m 0644 "$root"/cc/capi/pserver*.h "$prefix/include/"
pserver_write_pc "$prefix/lib/pkgconfig/pserver.pc" '${pcfiledir}/../..' \
  '${prefix}/include' '${prefix}/lib' "$version"
install -m 0755 "$root/cc/server/pserver" "$prefix/bin/pserver"

go_src="$prefix/share/pserver/go"
rm -rf "$go_src"
mkdir -p "$go_src/pserver"
install -m 0644 "$root/go/go.mod" "$go_src/"
for f in "$root"/go/pserver/*.go; do
  case "$f" in *_test.go) ;; *) install -m 0644 "$f" "$go_src/pserver/" ;; esac
done

# psctl, built as any Go program outside Bazel would be: through the
# installed pserver.pc, with an rpath relative to bin/ as well.
tmp="$(mktemp -d)"
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
# The Go build cache persists between installs, as psctl.sh's does.
GOCACHE="${GOCACHE:-${XDG_CACHE_HOME:-${HOME:-$tmp}/.cache}/pserver-psctl/gocache}" \
  pserver_go_env "$root" "$tmp"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
export CGO_LDFLAGS="-Wl,-rpath,\$ORIGIN/../lib"
(cd "$GO_MODULE_COPY" && /usr/bin/go build -trimpath -o "$prefix/bin/psctl" ./cmd/psctl)

# Check it as a user would: pkg-config finds it, both binaries start.
found="$(pkg-config --modversion pserver)"
[ "$found" = "$version" ] || { echo "install: pkg-config says $found, want $version" >&2; exit 1; }
"$prefix/bin/psctl" --help > /dev/null
"$prefix/bin/pserver" --help > /dev/null
if [ "$quiet" -eq 0 ]; then
  echo "installed pserver $version into $prefix (bin, include, lib, lib/pkgconfig, share/pserver/go)"
  echo "C and cgo: PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs pserver"
fi
