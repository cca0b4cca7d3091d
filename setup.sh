#!/usr/bin/env bash
# Installs every Debian package pserver needs to build and test, offline-friendly.
# Idempotent: packages already present are skipped; safe to run again.
#   ./setup.sh               # what builds and tests need (CI)
#   ./setup.sh --containers  # also mmdebstrap, podman and runc: the container image
#                            # (deploy/image/build.sh) and //deploy/image:container_test
set -euo pipefail

PACKAGES=(
  # build
  bazel-bootstrap bazel-rules-java pkg-config g++ git
  # rpc and serialization
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  # checkpoints: CRC32C (crc32_iscsi) from Intel ISA-L
  libisal-dev
  # mTLS: certificate checks (libcrypto) and the openssl CLI that makes test certificates
  libssl-dev openssl
  # the bulk channel's AEAD layer: AES-128-GCM with AVX-512/VAES (cc/security/bulk_aead)
  libipsec-mb-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # the socket ceiling iperf3 measures; network namespaces and tc (cc/testing/netns)
  iperf3 iproute2
  # python bindings and notebooks
  python3-dev python3-numpy python3-pytest swig jupyter-nbconvert python3-nbclient
  python3-ipykernel python3-matplotlib
  # the wheel (//python:wheel) installed by pip into a venv and a user site
  python3-pip python3-venv
  # pserver.torch and its examples (PyTorch 1.13, CPU; scikit-learn's digits)
  python3-torch python3-sklearn
  # metrics: promtool checks the exposition format, prometheus scrapes a test cluster
  prometheus
  # go bindings and coordination
  golang-go golang-etcd-server-dev etcd-server etcd-client
  # etcd's v3 protos import these (gogoproto, google/api annotations)
  golang-github-gogo-protobuf-dev golang-github-grpc-ecosystem-grpc-gateway-dev
  # deploy: //deploy:manifests_test reads the Kubernetes manifests
  python3-yaml
)
# Opt-in (slow to install, not needed by CI): the container image. runc
# beside podman's crun, which refuses hosts with cgroups v1 and v2 mixed.
CONTAINER_PACKAGES=(mmdebstrap podman runc)
for arg in "$@"; do
  case "$arg" in
    --containers) PACKAGES+=("${CONTAINER_PACKAGES[@]}") ;;
    *) echo "setup.sh: unknown argument $arg (--containers)" >&2; exit 2 ;;
  esac
done

say() { printf '[setup] %s\n' "$*"; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  say "all ${#PACKAGES[@]} packages already installed"
else
  say "installing ${#missing[@]} package(s): ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [ -x /usr/local/cuda/bin/nvcc ]; then
  say "CUDA found at /usr/local/cuda: GPU targets can build (--config=cuda)"
else
  say "no CUDA at /usr/local/cuda: GPU targets are skipped"
fi
say "done. Build and test with: bazel test //..."
