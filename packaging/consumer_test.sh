#!/usr/bin/env bash
# bazel test //packaging:c_consumer_test (arg c) and :go_consumer_test (arg go):
# `bazel run //:install -- --prefix DIR` as users run it, then a program
# built outside the repository against DIR alone.
set -euo pipefail
kind="$1"
repo="$PWD"
tmp="$TEST_TMPDIR"
unset CGO_CFLAGS CGO_LDFLAGS PKG_CONFIG_PATH LD_LIBRARY_PATH
# The install keeps its Go build cache under $XDG_CACHE_HOME (else ~/.cache,
# read-only inside the test sandbox on a machine where it does not exist yet).
export XDG_CACHE_HOME="$tmp/cache"
packaging/install.sh --prefix "$tmp/stage" --quiet
source go/go_env.sh
version="$(pserver_abi_version cc/capi/pserver.h)"

fail() { echo "FAIL: $*" >&2; exit 1; }

# The library a program loads must be the prefix's: ldd's line for it.
loads_from() { # loads_from BINARY LIBDIR
  local line path
  line="$(ldd "$1" | grep 'libpserver\.so')" || fail "$1 does not link libpserver.so"
  path="$(echo "$line" | sed -n 's/.*=> \(.*\) (0x.*/\1/p')"
  [ -n "$path" ] && [ "$(readlink -f "$path")" = "$(readlink -f "$2/libpserver.so")" ] ||
    fail "$1 loads: $line (want $2/libpserver.so)"
}

if [ "$kind" = c ]; then
  # pserver.pc is prefix-relative: the prefix still works once moved.
  mv "$tmp/stage" "$tmp/prefix"
  prefix="$tmp/prefix"
  [ "$(readlink "$prefix/lib/libpserver.so")" = "libpserver.so.$version" ] ||
    fail "lib/libpserver.so is not a link to libpserver.so.$version"
  for f in include/pserver.h include/pserver_tables.h include/pserver_cluster.h \
           lib/pkgconfig/pserver.pc bin/pserver bin/psctl share/pserver/go/go.mod \
           share/pserver/go/pserver/client.go; do
    [ -f "$prefix/$f" ] || fail "$f is not installed"
  done
  if ls "$prefix"/share/pserver/go/pserver/*_test.go >/dev/null 2>&1; then
    fail "Go tests were installed"
  fi
  export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
  [ "$(pkg-config --modversion pserver)" = "$version" ] || fail "pkg-config --modversion"
  cflags="$(pkg-config --cflags pserver | sed "s/ *$//")"
  [ "$(readlink -f "${cflags#-I}")" = "$prefix/include" ] || fail "pkg-config --cflags: $cflags"
  mkdir -p "$tmp/app"
  cp packaging/consumer.c "$tmp/app/"
  cd "$tmp/app"
  # shellcheck disable=SC2046  # pkg-config's words are meant to split
  cc -std=c11 -Wall -Wextra -Werror -o consumer consumer.c $(pkg-config --cflags --libs pserver)
  loads_from ./consumer "$prefix/lib"
  got="$(timeout 120 ./consumer)"
  echo "consumer printed:"; echo "$got"
  want="pserver $version: w = -0.25 0.25
unknown parameter: code 5"
  [ "$got" = "$want" ] || fail "want:
$want"
  loads_from "$prefix/bin/psctl" "$prefix/lib"
  "$prefix/bin/psctl" --help > /dev/null
  "$prefix/bin/pserver" --help > /dev/null
  echo "a C program builds with pkg-config against the installed (and moved) prefix and runs"
  exit 0
fi

[ "$kind" = go ] || fail "usage: consumer_test.sh c|go"
prefix="$tmp/stage"
app="$tmp/app"   # outside the repository
mkdir -p "$app"
want="$(/usr/bin/python3 go/readme_example.py README.md go/examples/quickstart/main.go "$app/main.go")"
# README's go.mod for a program that requires the module: the ```text block
# under "## Using it from Go" that starts with `module`; its replace names a
# prefix's share/pserver/go, here this test's prefix; it requires pserver.h's version.
/usr/bin/python3 - README.md "$prefix" "$app/go.mod" "$version" <<'PY'
import re, sys
readme, prefix, out, version = sys.argv[1:]
text = open(readme, encoding="utf-8").read()
section = text[text.index("## Using it from Go"):]
section = section[:section.index("\n## ", 1)]
match = re.search(r"```text\n(module .*?)```", section, re.S)
assert match, "README.md: no ```text block starting with `module` under 'Using it from Go'"
gomod = match.group(1)
assert f"require github.com/pserver-project/pserver/go v{version}\n" in gomod, \
    f"README.md's go.mod should require v{version} (pserver.h's version): {gomod}"
gomod, n = re.subn(r"(replace github.com/pserver-project/pserver/go => )\S+/share/pserver/go\n",
                   lambda m: m.group(1) + prefix + "/share/pserver/go\n", gomod)
assert n == 1, "README.md's go.mod has no replace to <prefix>/share/pserver/go"
open(out, "w", encoding="utf-8").write(gomod)
PY
cat "$app/go.mod"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
export CGO_ENABLED=1 GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local GOTELEMETRY=off
export GOPATH="$tmp/gopath" GOCACHE="$tmp/gocache" HOME="$tmp/home"
mkdir -p "$GOPATH" "$GOCACHE" "$HOME"
cd "$app"
/usr/bin/go build -trimpath -o quickstart .
loads_from ./quickstart "$prefix/lib"
got="$(timeout 300 ./quickstart)"
echo "the Go quickstart printed:"; echo "$got"
[ "$got" = "$want" ] || fail "README.md says it prints:
$want"
echo "README's Go example builds outside the repository against the installed prefix and runs"
