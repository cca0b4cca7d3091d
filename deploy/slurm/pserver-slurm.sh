#!/usr/bin/env bash
# pserver on a Slurm allocation: etcd on the first node, the servers and the
# trainers as job steps. pserver.sbatch runs `pserver-slurm.sh launch`; each
# step runs this script again on its nodes (`etcd`, `server`, `trainer`).
#
#   sbatch --nodes=4 deploy/slurm/pserver.sbatch                 # or, by hand,
#   salloc --nodes=4 deploy/slurm/pserver-slurm.sh launch
#
# Settings (environment; srun passes the environment on to every step):
#   PS_SLURM_SERVERS       servers, one per node on the first nodes   [all nodes]
#   PS_SLURM_TRAINERS      trainer tasks, spread over all nodes        [all nodes]
#   PS_SLURM_TRAINER       the trainer command [python3 <repo>/deploy/trainer/train.py]
#   PS_SLURM_ETCD_PORT     etcd's client port on the first node        [2379]
#   PS_SLURM_ETCD_PEER_PORT etcd's peer port (loopback only)           [2380]
#   PS_SLURM_ETCD_DATA     etcd's data directory        [/tmp/pserver-etcd-$SLURM_JOB_ID]
#   PS_SLURM_PSERVER       the pserver binary                          [pserver]
# and any pserver flag as PSERVER_<FLAG> (PSERVER_PORT [7000],
# PSERVER_CHECKPOINT_DIR, PSERVER_TLS_*...): the servers read them. This
# script sets PSERVER_ETCD, PSERVER_CLUSTER [slurm-$SLURM_JOB_ID],
# PSERVER_NUM_SERVERS, PSERVER_HOST [0.0.0.0] and, on each server's node,
# PSERVER_ADVERTISE_HOST [that node's name, $SLURMD_NODENAME].
#
# The exit status is the trainers' step's. When the trainers end, the
# servers get SIGTERM (they save a last checkpoint with a
# PSERVER_CHECKPOINT_DIR), then etcd.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
self="$here/$(basename "${BASH_SOURCE[0]}")"
say() { printf '[pserver-slurm] %s\n' "$*" >&2; }
die() { say "$*"; exit 2; }

# The allocation's node names, one per line, in Slurm's order.
job_nodes() {
  [ -n "${SLURM_JOB_NODELIST:-}" ] || die "SLURM_JOB_NODELIST is not set: run inside sbatch or salloc"
  scontrol show hostnames "$SLURM_JOB_NODELIST"
}

positive() {  # positive NAME VALUE
  [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '$2'"
}

port() {  # port NAME VALUE
  [[ "$2" =~ ^[1-9][0-9]*$ ]] && [ "$2" -le 65535 ] || die "$1 must be a port (1-65535), got '$2'"
}

# Works out the addresses and exports the settings every step reads.
configure() {
  mapfile -t NODES < <(job_nodes)
  [ "${#NODES[@]}" -gt 0 ] || die "no nodes in SLURM_JOB_NODELIST='$SLURM_JOB_NODELIST'"
  export PS_SLURM_SERVERS="${PS_SLURM_SERVERS:-${#NODES[@]}}"
  export PS_SLURM_TRAINERS="${PS_SLURM_TRAINERS:-${#NODES[@]}}"
  export PS_SLURM_ETCD_PORT="${PS_SLURM_ETCD_PORT:-2379}"
  export PS_SLURM_ETCD_PEER_PORT="${PS_SLURM_ETCD_PEER_PORT:-2380}"
  export PS_SLURM_ETCD_DATA="${PS_SLURM_ETCD_DATA:-/tmp/pserver-etcd-${SLURM_JOB_ID:-0}}"
  positive PS_SLURM_SERVERS "$PS_SLURM_SERVERS"
  positive PS_SLURM_TRAINERS "$PS_SLURM_TRAINERS"
  port PS_SLURM_ETCD_PORT "$PS_SLURM_ETCD_PORT"
  port PS_SLURM_ETCD_PEER_PORT "$PS_SLURM_ETCD_PEER_PORT"
  [ "$PS_SLURM_SERVERS" -le "${#NODES[@]}" ] ||
    die "PS_SLURM_SERVERS=$PS_SLURM_SERVERS servers need as many nodes (one each); the job has ${#NODES[@]}"
  ETCD_HOST="${NODES[0]}"
  export PSERVER_ETCD="$ETCD_HOST:$PS_SLURM_ETCD_PORT"
  export PSERVER_CLUSTER="${PSERVER_CLUSTER:-slurm-${SLURM_JOB_ID:-0}}"
  export PSERVER_NUM_SERVERS="$PS_SLURM_SERVERS"
  export PSERVER_HOST="${PSERVER_HOST:-0.0.0.0}"
  export PSERVER_PORT="${PSERVER_PORT:-7000}"
  port PSERVER_PORT "$PSERVER_PORT"
}

# Waits (bounded) until etcd answers.
wait_for_etcd() {
  local i
  for i in $(seq 1 60); do
    if etcdctl --endpoints="$PSERVER_ETCD" --dial-timeout=2s endpoint health >/dev/null 2>&1; then
      return 0
    fi
    sleep 1
  done
  die "etcd at $PSERVER_ETCD did not become healthy within 60 attempts"
}

launch() {
  configure
  say "nodes: ${NODES[*]}; etcd on $PSERVER_ETCD; $PS_SLURM_SERVERS servers on ${NODES[*]:0:$PS_SLURM_SERVERS} port $PSERVER_PORT; $PS_SLURM_TRAINERS trainers; cluster $PSERVER_CLUSTER"
  local server_nodes
  server_nodes="$(IFS=,; echo "${NODES[*]:0:$PS_SLURM_SERVERS}")"
  srun --job-name=etcd --nodes=1 --ntasks=1 --nodelist="$ETCD_HOST" --overlap \
    "$self" etcd &
  local etcd_step=$!
  wait_for_etcd
  srun --job-name=pserver --nodes="$PS_SLURM_SERVERS" --ntasks="$PS_SLURM_SERVERS" \
    --ntasks-per-node=1 --nodelist="$server_nodes" --overlap --kill-on-bad-exit=1 \
    "$self" server &
  local server_step=$!
  local status=0
  srun --job-name=trainer --nodes="${#NODES[@]}" --ntasks="$PS_SLURM_TRAINERS" --overlap \
    "$self" trainer || status=$?
  say "trainers exited with status $status; stopping the servers, then etcd"
  kill -TERM "$server_step" 2>/dev/null || true
  wait "$server_step" || say "the servers' step exited with status $?"
  kill -TERM "$etcd_step" 2>/dev/null || true
  wait "$etcd_step" || true
  return "$status"
}

# --- steps (one task each) ---

run_etcd() {
  local host="${SLURMD_NODENAME:-$(hostname)}"
  mkdir -p "$PS_SLURM_ETCD_DATA"
  exec etcd --name e0 --data-dir "$PS_SLURM_ETCD_DATA" \
    --listen-client-urls "http://0.0.0.0:$PS_SLURM_ETCD_PORT" \
    --advertise-client-urls "http://$host:$PS_SLURM_ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$PS_SLURM_ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$PS_SLURM_ETCD_PEER_PORT" \
    --initial-cluster "e0=http://127.0.0.1:$PS_SLURM_ETCD_PEER_PORT" \
    --initial-cluster-state new --initial-cluster-token "$PSERVER_CLUSTER"
}

run_server() {
  export PSERVER_ADVERTISE_HOST="${PSERVER_ADVERTISE_HOST:-${SLURMD_NODENAME:?SLURMD_NODENAME is not set: run as a job step}}"
  exec "${PS_SLURM_PSERVER:-pserver}"
}

run_trainer() {
  export TRAINER_SEED="${SLURM_PROCID:-0}"
  # shellcheck disable=SC2086  # a command line, split on purpose
  exec ${PS_SLURM_TRAINER:-python3 $here/../trainer/train.py}
}

case "${1:-}" in
  launch) launch ;;
  etcd) run_etcd ;;
  server) run_server ;;
  trainer) run_trainer ;;
  *) die "usage: $(basename "$0") launch | etcd | server | trainer" ;;
esac
