#!/usr/bin/env bash
# Installs the pserver Python package (pure Python + capi.py + _capi.so +
# libpserver.so) for Debian's /usr/bin/python3 and its Jupyter kernel.
#
#   bazel run //python:install                         # into the user site-packages
#   bazel run //python:install -- --target DIR         # into DIR (then PYTHONPATH=DIR)
#
# Files are copied, so the install survives later builds; run it again after
# changing the code. `--quiet` prints nothing on success.
set -euo pipefail

python=/usr/bin/python3
target=""
quiet=0
while [ $# -gt 0 ]; do
  case "$1" in
    --target) target="$2"; shift 2 ;;
    --target=*) target="${1#--target=}"; shift ;;
    --quiet) quiet=1; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

# Inputs: from Bazel's runfiles (bazel run / bazel test), found from the
# workspace-relative paths.
runfiles="${RUNFILES_DIR:-$0.runfiles}"
if [ -d "$runfiles/pserver" ]; then root="$runfiles/pserver"; else root="$PWD"; fi
for f in bindings/python/capi.py bindings/python/_capi.so cc/capi/libpserver.so \
         python/pserver/__init__.py; do
  [ -e "$root/$f" ] || { echo "install: $root/$f is missing (run through bazel)" >&2; exit 1; }
done

if [ -z "$target" ]; then
  target="$("$python" -c 'import site; print(site.getusersitepackages())')"
fi
case "$target" in /*) ;; *) target="${BUILD_WORKING_DIRECTORY:-$PWD}/$target" ;; esac
dest="$target/pserver"
mkdir -p "$dest"
rm -f "$dest"/*.py "$dest"/*.so "$dest/py.typed"
install -m 0644 "$root"/python/pserver/*.py "$root/python/pserver/py.typed" \
  "$root/bindings/python/capi.py" "$dest/"
install -m 0755 "$root/bindings/python/_capi.so" "$root/cc/capi/libpserver.so" "$dest/"

# Check it from a neutral directory, as a user would.
version="$(cd / && PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}" "$python" -c \
  'import pserver; print(pserver.version())')"
if [ "$quiet" -eq 0 ]; then
  echo "installed pserver $version into $dest"
  echo "for $python and its Jupyter kernel ('import pserver')"
fi
