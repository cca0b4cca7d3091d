#!/usr/bin/env bash
# bazel run //deploy/image:stage -- DIR: writes what the container image holds
# into DIR/opt/pserver (bin/pserver, bin/psctl, bin/pserver-health and
# bin/etcd-member for Kubernetes, lib/libpserver.so, the Python
# package under python/, the example trainer under trainer/), and the Debian
# packages they need at run time into DIR/packages.txt (from ldd and dpkg -S
# of the binaries, plus etcd and python3-numpy). build.sh turns DIR into a
# root filesystem (mmdebstrap) and the Dockerfile into an image.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: stage DIR" >&2; exit 2; }
out="$1"
case "$out" in /*) ;; *) out="${BUILD_WORKING_DIRECTORY:-$PWD}/$out" ;; esac
runfiles="${RUNFILES_DIR:-$0.runfiles}"
if [ -d "$runfiles/pserver" ]; then root="$runfiles/pserver"; else root="$PWD"; fi
root="$(cd "$root" && pwd)"
prefix="$out/opt/pserver"
rm -rf "$prefix"
mkdir -p "$prefix/bin" "$prefix/lib" "$prefix/python" "$prefix/trainer"

install -m 0755 "$root/cc/server/pserver" "$prefix/bin/pserver"
install -m 0755 "$root/cc/capi/libpserver.so" "$prefix/lib/libpserver.so"
"$root/python/install.sh" --target "$prefix/python" --quiet
install -m 0644 "$root/deploy/trainer/train.py" "$prefix/trainer/train.py"
install -m 0755 "$root/deploy/image/pserver-health.sh" "$prefix/bin/pserver-health"
install -m 0755 "$root/deploy/image/etcd-member.sh" "$prefix/bin/etcd-member"

# psctl: Debian's go, offline, linked against the library where the image has it.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
source "$root/go/go_env.sh"
pserver_go_env "$root" "$tmp"
lib="$(dirname "$(readlink -f "$root/cc/capi/libpserver.so")")"
export CGO_LDFLAGS="-L$lib -Wl,-rpath,/opt/pserver/lib"
(cd "$GO_MODULE_COPY" && /usr/bin/go build -trimpath -o "$prefix/bin/psctl" ./cmd/psctl)

# The Debian packages that hold every shared library the binaries load (one
# dpkg -S for all of them; a library no package holds is an error).
packages() {
  local libs
  libs="$(for f in "$@"; do ldd "$f"; done |
    awk '$2 == "=>" && $3 ~ /^\// {print $3}' | grep -v "^$prefix/" |
    awk -F/ '{print $(NF-1) "/" $NF}' | sort -u)"  # e.g. x86_64-linux-gnu/libc.so.6
  local found
  found="$(dpkg -S $(sed 's|^|*/|' <<< "$libs") 2>/dev/null | grep -v '^diversion' || true)"
  local lib
  for lib in $libs; do
    grep -q "/$lib\$" <<< "$found" || { echo "stage: no Debian package holds $lib" >&2; return 1; }
  done
  cut -d: -f1 <<< "$found" | tr -d ' ' | tr ',' '\n' | sort -u
}
{
  LD_LIBRARY_PATH="$prefix/lib" packages "$prefix/bin/pserver" "$prefix/bin/psctl" \
    "$prefix/python/pserver/_capi.so" "$prefix/lib/libpserver.so"
  # etcd for a one-image cluster; python3 and numpy for the package; psctl
  # health for probes needs nothing more.
  printf '%s\n' ca-certificates etcd-server etcd-client python3 python3-numpy
} | sort -u > "$out/packages.txt"
echo "staged $(du -sh "$prefix" | cut -f1) into $prefix; $(wc -l < "$out/packages.txt") Debian packages in $out/packages.txt"
