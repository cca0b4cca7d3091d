#!/usr/bin/env bash
# //deploy/image:container_test (manual): builds the image (build.sh:
# mmdebstrap + podman import) unless PSERVER_TEST_IMAGE names one, then runs
# etcd, 3 servers (configured by PSERVER_* environment variables) and the
# Python trainer, each in a container of the image on the host's loopback
# (--network=host, free 127.0.0.1 ports), checks `psctl health` (from the
# image) sees 3 SERVING servers, so does the probe script pserver-health in
# each server's container, that training lowers the loss, and that the
# servers stop cleanly (exit 0) on `podman stop` (SIGTERM).
# Skips, saying why, without root, podman or mmdebstrap, or where podman
# cannot run a container here (the first error is printed).
set -euo pipefail
here="$PWD/deploy/image"
skip() { echo "SKIP: $*"; exit 0; }
fail() { echo "FAIL: $*" >&2; exit 1; }
say() { echo "[container_test] $*"; }

[ "$(id -u)" -eq 0 ] || skip "needs root (rootful podman)"
command -v podman >/dev/null || skip "podman is not installed (./setup.sh --containers)"
command -v etcdctl >/dev/null || skip "etcdctl is not installed"

containers=()
built_image=""
cleanup() {
  local id
  for id in "${containers[@]}"; do timeout 60 podman rm -f -t 0 "$id" >/dev/null 2>&1 || true; done
  if [ -n "$built_image" ]; then timeout 60 podman rmi -f "$built_image" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

image="${PSERVER_TEST_IMAGE:-}"
if [ -z "$image" ]; then
  command -v mmdebstrap >/dev/null || skip "mmdebstrap is not installed (./setup.sh --containers)"
  image="localhost/pserver:container-test-$$"
  built_image="$image"
  say "building $image"
  PSERVER_STAGE="$here/stage" timeout 1500 "$here/build.sh" --tag "$image" ||
    fail "build.sh failed"
fi

# The podman options that run a container here: the default runtime first,
# then runc (crun refuses cgroups v1+v2 "hybrid" hosts). Limits are given
# explicitly at or under this shell's: a container engine without
# CAP_SYS_RESOURCE cannot raise them.
limits=(--ulimit="nofile=$(ulimit -Sn):$(ulimit -Hn)" --ulimit=nproc=4096:4096)
run_opts=()
probe_error=""
for runtime in "" "--runtime=runc"; do
  opts=(--network=host "${limits[@]}")
  [ -n "$runtime" ] && opts+=("$runtime")
  if out="$(timeout 120 podman run --rm "${opts[@]}" "$image" --help 2>&1)"; then
    run_opts=("${opts[@]}")
    break
  fi
  probe_error+="podman run ${opts[*]}: $(tail -1 <<< "$out"); "
done
[ ${#run_opts[@]} -gt 0 ] || skip "podman cannot run a container here: $probe_error"
say "containers run with: podman run ${run_opts[*]}"

free_ports() {  # free_ports N: N free TCP ports on 127.0.0.1
  /usr/bin/python3 - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}
read -r client_port peer_port port0 port1 port2 <<< "$(free_ports 5)"
server_ports=("$port0" "$port1" "$port2")
etcd="127.0.0.1:$client_port"
cluster="container-test"

start() {  # start NAME ARGS...: a detached container; its id joins `containers`
  local id
  id="$(timeout 120 podman run -d --name "$1-$$" "${run_opts[@]}" "${@:2}")" || fail "cannot start $1"
  containers+=("$id")
}

start etcd --entrypoint etcd "$image" --name e0 --data-dir /tmp/etcd \
  --listen-client-urls "http://$etcd" --advertise-client-urls "http://$etcd" \
  --listen-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-cluster "e0=http://127.0.0.1:$peer_port"
for i in $(seq 1 120); do
  etcdctl --endpoints="$etcd" --dial-timeout=2s endpoint health >/dev/null 2>&1 && break
  [ "$i" -lt 120 ] || fail "etcd in a container did not become healthy: $(podman logs etcd-$$ 2>&1 | tail -5)"
  sleep 0.5
done
say "etcd healthy at $etcd"

# The servers: configuration from the environment only (no flags).
for s in 0 1 2; do
  start "server$s" -e PSERVER_ETCD="$etcd" -e PSERVER_CLUSTER="$cluster" \
    -e PSERVER_NUM_SERVERS=3 -e PSERVER_HOST=127.0.0.1 -e PSERVER_PORT="${server_ports[s]}" "$image"
done
for s in 0 1 2; do
  for i in $(seq 1 240); do
    podman logs "server$s-$$" 2>/dev/null | grep -q "listening on 127.0.0.1:${server_ports[s]}$" && break
    [ "$i" -lt 240 ] || fail "server$s did not start: $(podman logs "server$s-$$" 2>&1 | tail -5)"
    sleep 0.5
  done
done
say "3 servers listening"

health=""
for i in $(seq 1 60); do
  if health="$(timeout 60 podman run --rm "${run_opts[@]}" --entrypoint psctl "$image" \
      health -etcd "$etcd" -cluster "$cluster" 2>&1)"; then
    break
  fi
  [ "$i" -lt 60 ] || fail "psctl health never saw every server SERVING: $health"
  sleep 1
done
[ "$(grep -c ' SERVING$' <<< "$health")" -eq 3 ] || fail "want 3 SERVING servers: $health"
say "psctl health: 3 SERVING"
# The Kubernetes probe script, inside each server's container.
for s in 0 1 2; do
  out="$(timeout 60 podman exec "server$s-$$" /opt/pserver/bin/pserver-health 2>&1)" ||
    fail "pserver-health in server$s: $out"
  grep -q " SERVING$" <<< "$out" || fail "pserver-health in server$s: $out"
done
say "pserver-health: SERVING in each server's container"

trained="$(timeout 300 podman run --rm "${run_opts[@]}" -e PSERVER_ETCD="$etcd" \
  -e PSERVER_CLUSTER="$cluster" --entrypoint python3 "$image" \
  /opt/pserver/trainer/train.py --steps=100 2>&1)" || fail "the trainer failed: $trained"
grep -q "^trained 100 steps: loss" <<< "$trained" || fail "no training summary: $trained"
say "$(tail -1 <<< "$trained")"

for s in 0 1 2; do
  timeout 120 podman stop -t 30 "server$s-$$" >/dev/null
  code="$(podman inspect --format '{{.State.ExitCode}}' "server$s-$$")"
  [ "$code" = 0 ] || fail "server$s exited $code on SIGTERM: $(podman logs "server$s-$$" 2>&1 | tail -5)"
  podman logs "server$s-$$" 2>/dev/null | grep -q ": stopped$" || fail "server$s did not say it stopped"
done
say "servers stopped cleanly"
echo "PASS: etcd + 3 servers + a trainer in containers"
