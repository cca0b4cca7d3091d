#!/usr/bin/env bash
# bazel test //python:wheel_venv_test: installs the wheel (//python:wheel) as
# users do, with pip and nothing downloaded (--no-index), and runs README.md's
# Python examples against it from a directory outside the repository:
#  1. into a fresh venv, with README's commands as written
#     (`/usr/bin/python3 -m venv --system-site-packages ~/venv && ~/venv/bin/pip
#     install --no-index ...`; numpy, and torch where installed, come from
#     Debian's dist-packages: pip cannot download them here);
#  2. with `pip install --user` into a temporary HOME's user site, for
#     Debian's /usr/bin/python3 (Debian 12 marks its Python externally
#     managed, so pip asks for --break-system-packages even with --user).
set -euo pipefail
repo="$PWD"
wheels=(python/wheel/pserver-*.whl)
[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] || { echo "want one wheel, have: ${wheels[*]}"; exit 1; }
wheel="$repo/${wheels[0]}"
readme="$repo/README.md"
tmp="$TEST_TMPDIR"
outside="$tmp/outside"   # not the repository: nothing importable by accident
mkdir -p "$outside"
cd "$outside"
unset PYTHONPATH
# An empty HOME: a pserver in the real user site (bazel run //python:install)
# must not shadow the venv's (a --system-site-packages venv reads the user site).
export HOME="$tmp/venv-home"
mkdir -p "$HOME"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_NO_CACHE_DIR=1

# Asserts, with interpreter $1, that `pserver` comes from under $2 and that
# the installed distribution is whole: version, numpy declared, py.typed,
# and pip's RECORD check.
check_installed() {
  "$1" - "$2" <<'PY'
import importlib.metadata as md, os, sys
import pserver
where = os.path.realpath(pserver.__file__)
assert where.startswith(os.path.realpath(sys.argv[1])), f"pserver imported from {where}"
dist = md.distribution("pserver")
assert dist.version == pserver.version(), (dist.version, pserver.version())
assert "numpy" in (dist.requires or []), dist.requires
assert os.path.exists(os.path.join(os.path.dirname(where), "py.typed"))
assert os.path.exists(os.path.join(os.path.dirname(where), "libpserver.so"))
print(f"pserver {dist.version} from {os.path.dirname(where)}; requires {dist.requires}")
PY
}

echo "== venv: README's commands as written"
# The ```sh block that starts with `bazel build //python:wheel` (Bazel built
# the wheel already: that line is left out), run with ~ a temporary folder
# from a folder whose bazel-bin/python/wheel is the wheel's.
mkdir -p "$tmp/ws/bazel-bin/python"
ln -s "$repo/python/wheel" "$tmp/ws/bazel-bin/python/wheel"
commands="$(/usr/bin/python3 - "$readme" <<'PY'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
match = re.search(r"```sh\n(bazel build //python:wheel.*?)```", text, re.S)
assert match, "README.md: no ```sh block starting with `bazel build //python:wheel`"
lines = [l for l in match.group(1).splitlines() if not l.startswith("bazel ")]
assert any("venv" in l for l in lines), lines
print("\n".join(lines))
PY
)"
echo "$commands"
(cd "$tmp/ws" && bash -euo pipefail -c "$commands")
venv="$HOME/venv"
check_installed "$venv/bin/python" "$venv"
# pip check: nothing about pserver (Debian's own packages may report theirs).
if "$venv/bin/pip" check 2>&1 | grep -i '^pserver'; then exit 1; fi
"$venv/bin/python" "$repo/python/readme_test.py" "$readme"
# pip uninstall removes every file it put there (RECORD is complete).
"$venv/bin/pip" uninstall -y pserver
if "$venv/bin/python" -c 'import pserver' 2>/dev/null; then
  echo "pserver still importable after pip uninstall"; exit 1
fi

echo "== pip install --user (HOME=$tmp/home)"
mkdir -p "$tmp/home"
HOME="$tmp/home" /usr/bin/python3 -m pip install --user --no-index \
  --break-system-packages "$wheel"
user_site="$(HOME="$tmp/home" /usr/bin/python3 -c 'import site; print(site.getusersitepackages())')"
HOME="$tmp/home" check_installed /usr/bin/python3 "$user_site"
HOME="$tmp/home" /usr/bin/python3 "$repo/python/readme_test.py" "$readme"
echo "wheel $(basename "$wheel"): installs into a venv and a user site; README's examples run"
