#!/usr/bin/env bash
# Builds the pserver container image offline from Debian 12 packages:
#
#   deploy/image/build.sh [--tag localhost/pserver:dev]   # mmdebstrap rootfs + podman import
#   deploy/image/build.sh --context DIR                   # a Docker build context instead
#
# 1. stage: the binaries, the Python package and packages.txt (stage.sh, run
#    through `bazel run //deploy/image:stage`, or $PSERVER_STAGE when set);
# 2. a root filesystem with mmdebstrap from the Debian archive
#    ($PSERVER_IMAGE_MIRROR, default http://deb.debian.org/debian) holding
#    those packages and /opt/pserver;
# 3. `podman import` with the Dockerfile's ENV, EXPOSE, USER and ENTRYPOINT.
# Needs root, mmdebstrap and podman (./setup.sh --containers installs them).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tag="localhost/pserver:dev"
context=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag="$2"; shift 2 ;;
    --tag=*) tag="${1#--tag=}"; shift ;;
    --context) context="$2"; shift 2 ;;
    --context=*) context="${1#--context=}"; shift ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
say() { printf '[image] %s\n' "$*"; }

stage() {  # stage DIR
  if [ -n "${PSERVER_STAGE:-}" ]; then
    "$PSERVER_STAGE" "$1"
  else
    (cd "$here/../.." && bazel run //deploy/image:stage -- "$1")
  fi
}

# The Dockerfile's instructions that `podman import --change` takes.
import_changes() {
  grep -E '^(ENV|EXPOSE|USER|ENTRYPOINT) ' "$here/Dockerfile" | while IFS= read -r line; do
    printf -- '--change\n%s\n' "$line"
  done
}

if [ -n "$context" ]; then
  mkdir -p "$context"
  context="$(cd "$context" && pwd)"
  stage "$context"
  cp "$here/Dockerfile" "$context/Dockerfile"
  say "Docker build context in $context: docker build -t pserver $context"
  exit 0
fi

for tool in mmdebstrap podman; do
  command -v "$tool" >/dev/null || { echo "build.sh: $tool not found (./setup.sh --containers)" >&2; exit 1; }
done
work="$(mktemp -d "${TMPDIR:-/tmp}/pserver-image.XXXXXX")"
trap 'rm -rf "$work"' EXIT
stage "$work/stage"
mirror="${PSERVER_IMAGE_MIRROR:-http://deb.debian.org/debian}"
say "root filesystem: Debian bookworm from $mirror with $(paste -sd' ' "$work/stage/packages.txt")"
mmdebstrap --quiet --variant=minbase --mode=root \
  --include="$(paste -sd, "$work/stage/packages.txt")" \
  --customize-hook="copy-in $work/stage/opt/pserver /opt" \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
  bookworm "$work/rootfs.tar" "deb $mirror bookworm main"
mapfile -t changes < <(import_changes)
podman import "${changes[@]}" "$work/rootfs.tar" "$tag" >/dev/null
say "built $tag ($(podman image inspect --format '{{.Size}}' "$tag") bytes)"
