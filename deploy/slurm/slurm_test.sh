#!/usr/bin/env bash
# //deploy/slurm:slurm_test: runs pserver-slurm.sh's launch with a fake srun
# (a stub that records its arguments and runs each task's command with the
# SLURMD_NODENAME and SLURM_PROCID Slurm would give it), fake scontrol,
# etcd, etcdctl, pserver and trainer, and checks the steps and commands it
# would run, the addresses they get, the exit status, and that bad settings
# are refused before any step starts. Every PSERVER_* variable the script sets
# must be a flag of the real pserver binary (--help).
set -euo pipefail
script="$PWD/deploy/slurm/pserver-slurm.sh"
pserver_bin="$PWD/cc/server/pserver"
tmp="${TEST_TMPDIR:-$(mktemp -d)}/slurm"
rm -rf "$tmp"; mkdir -p "$tmp/bin" "$tmp/log"
fail() { echo "FAIL: $*" >&2; exit 1; }

cat > "$tmp/bin/scontrol" <<'STUB'
#!/usr/bin/env bash
echo "$*" >> "$FAKE_LOG/scontrol"
[ "$1 $2" = "show hostnames" ] || exit 1
printf '%s\n' $FAKE_HOSTNAMES
STUB
cat > "$tmp/bin/srun" <<'STUB'
#!/usr/bin/env bash
# Records "srun ARGS", then runs the command once per task. A SIGTERM (the
# launcher stopping a step) lets the tasks finish, as srun forwards it to
# tasks that here end on their own.
echo "srun $*" >> "$FAKE_LOG/srun"
trap ':' TERM
ntasks=1; nodelist=""
while [ $# -gt 0 ]; do
  case "$1" in
    --ntasks=*) ntasks="${1#--ntasks=}" ;;
    --nodelist=*) nodelist="${1#--nodelist=}" ;;
    --*) ;;
    *) break ;;
  esac
  shift
done
IFS=, read -r -a nodes <<< "${nodelist:-$(echo $FAKE_HOSTNAMES | tr ' ' ,)}"
status=0
for ((i = 0; i < ntasks; i++)); do
  SLURMD_NODENAME="${nodes[i % ${#nodes[@]}]}" SLURM_PROCID="$i" "$@" || status=$?
done
exit "$status"
STUB
cat > "$tmp/bin/etcdctl" <<'STUB'
#!/usr/bin/env bash
echo "$*" >> "$FAKE_LOG/etcdctl"
STUB
cat > "$tmp/bin/etcd" <<'STUB'
#!/usr/bin/env bash
echo "$SLURMD_NODENAME $*" >> "$FAKE_LOG/etcd"
STUB
cat > "$tmp/bin/fake-pserver" <<'STUB'
#!/usr/bin/env bash
{ echo "args:$*"; env | grep '^PSERVER_' | sort; } > "$FAKE_LOG/pserver.$SLURMD_NODENAME"
STUB
cat > "$tmp/bin/fake-trainer" <<'STUB'
#!/usr/bin/env bash
echo "$SLURMD_NODENAME seed=$TRAINER_SEED etcd=$PSERVER_ETCD cluster=$PSERVER_CLUSTER args=$*" >> "$FAKE_LOG/trainer"
exit "${FAKE_TRAINER_STATUS:-0}"
STUB
chmod +x "$tmp/bin"/*

# run_launch [VAR=value...]: a fresh log, then launch in a clean environment.
run_launch() {
  rm -rf "$tmp/log"; mkdir -p "$tmp/log"
  env -i PATH="$tmp/bin:/usr/bin:/bin" FAKE_LOG="$tmp/log" \
    FAKE_HOSTNAMES="node01 node02 node03" SLURM_JOB_NODELIST="node[01-03]" SLURM_JOB_ID=42 \
    PS_SLURM_PSERVER="$tmp/bin/fake-pserver" PS_SLURM_TRAINER="$tmp/bin/fake-trainer --steps=5" \
    "$@" "$script" launch > "$tmp/out" 2>&1
}
expect_line() {  # expect_line FILE LINE
  grep -qxF -- "$2" "$1" || { echo "--- $1:"; cat "$1"; fail "no line '$2' in $1"; }
}

# 1. Three nodes, two servers, five trainers.
run_launch PS_SLURM_SERVERS=2 PS_SLURM_TRAINERS=5 || { cat "$tmp/out"; fail "launch failed"; }
expect_line "$tmp/log/scontrol" "show hostnames node[01-03]"
[ "$(wc -l < "$tmp/log/srun")" -eq 3 ] || fail "want 3 job steps, got: $(cat "$tmp/log/srun")"
expect_line "$tmp/log/srun" "srun --job-name=etcd --nodes=1 --ntasks=1 --nodelist=node01 --overlap $script etcd"
expect_line "$tmp/log/srun" "srun --job-name=pserver --nodes=2 --ntasks=2 --ntasks-per-node=1 --nodelist=node01,node02 --overlap --kill-on-bad-exit=1 $script server"
expect_line "$tmp/log/srun" "srun --job-name=trainer --nodes=3 --ntasks=5 --overlap $script trainer"
expect_line "$tmp/log/etcdctl" "--endpoints=node01:2379 --dial-timeout=2s endpoint health"
expect_line "$tmp/log/etcd" "node01 --name e0 --data-dir /tmp/pserver-etcd-42 --listen-client-urls http://0.0.0.0:2379 --advertise-client-urls http://node01:2379 --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 --initial-cluster e0=http://127.0.0.1:2380 --initial-cluster-state new --initial-cluster-token slurm-42"
for node in node01 node02; do
  f="$tmp/log/pserver.$node"
  [ -f "$f" ] || fail "no server ran on $node"
  expect_line "$f" "args:"
  expect_line "$f" "PSERVER_ADVERTISE_HOST=$node"
  expect_line "$f" "PSERVER_ETCD=node01:2379"
  expect_line "$f" "PSERVER_CLUSTER=slurm-42"
  expect_line "$f" "PSERVER_NUM_SERVERS=2"
  expect_line "$f" "PSERVER_HOST=0.0.0.0"
  expect_line "$f" "PSERVER_PORT=7000"
done
[ ! -e "$tmp/log/pserver.node03" ] || fail "a server ran on node03 (PS_SLURM_SERVERS=2)"
[ "$(wc -l < "$tmp/log/trainer")" -eq 5 ] || fail "want 5 trainers: $(cat "$tmp/log/trainer")"
for seed in 0 1 2 3 4; do
  grep -q " seed=$seed etcd=node01:2379 cluster=slurm-42 args=--steps=5$" "$tmp/log/trainer" ||
    fail "no trainer with seed $seed: $(cat "$tmp/log/trainer")"
done

# Every PSERVER_* the servers got names a flag of the real binary.
help="$("$pserver_bin" --help)"
for var in $(cut -d= -f1 "$tmp/log/pserver.node01" | grep '^PSERVER_'); do
  flag="--$(echo "${var#PSERVER_}" | tr 'A-Z' 'a-z')"
  grep -qE -- "^ +$flag \(" <<< "$help" || fail "$var: pserver has no flag $flag"
done

# 2. Defaults: a server per node, a trainer per node; settings passed through.
run_launch PSERVER_PORT=7100 PSERVER_CLUSTER=exp PS_SLURM_ETCD_PORT=2400 || { cat "$tmp/out"; fail "launch failed"; }
expect_line "$tmp/log/srun" "srun --job-name=pserver --nodes=3 --ntasks=3 --ntasks-per-node=1 --nodelist=node01,node02,node03 --overlap --kill-on-bad-exit=1 $script server"
expect_line "$tmp/log/srun" "srun --job-name=trainer --nodes=3 --ntasks=3 --overlap $script trainer"
expect_line "$tmp/log/pserver.node03" "PSERVER_PORT=7100"
expect_line "$tmp/log/pserver.node03" "PSERVER_ETCD=node01:2400"
expect_line "$tmp/log/pserver.node03" "PSERVER_CLUSTER=exp"

# 3. The trainers' exit status is the job's.
status=0; run_launch FAKE_TRAINER_STATUS=3 || status=$?
[ "$status" -eq 3 ] || { cat "$tmp/out"; fail "want exit 3 from failing trainers, got $status"; }
grep -q "trainers exited with status 3" "$tmp/out" || fail "no line saying the trainers failed"

# 4. Bad settings: refused with a message, before any step.
check_refused() {  # check_refused MESSAGE VAR=value...
  local message="$1"; shift
  local status=0; run_launch "$@" || status=$?
  [ "$status" -eq 2 ] || { cat "$tmp/out"; fail "$*: want exit 2, got $status"; }
  grep -qF -- "$message" "$tmp/out" || { cat "$tmp/out"; fail "$*: no '$message'"; }
  [ ! -e "$tmp/log/srun" ] || fail "$*: a step started: $(cat "$tmp/log/srun")"
}
check_refused "PS_SLURM_SERVERS=4 servers need as many nodes (one each); the job has 3" PS_SLURM_SERVERS=4
check_refused "PS_SLURM_TRAINERS must be a positive integer, got '0'" PS_SLURM_TRAINERS=0
check_refused "PS_SLURM_ETCD_PORT must be a port (1-65535), got 'x'" PS_SLURM_ETCD_PORT=x
check_refused "PSERVER_PORT must be a port (1-65535), got '70000'" PSERVER_PORT=70000
check_refused "SLURM_JOB_NODELIST is not set" SLURM_JOB_NODELIST=
status=0
env -i PATH="$tmp/bin:/usr/bin:/bin" "$script" server > "$tmp/out" 2>&1 || status=$?
[ "$status" -ne 0 ] && grep -q "SLURMD_NODENAME is not set" "$tmp/out" || fail "server step outside Slurm: $(cat "$tmp/out")"

# 5. The batch script hands over to the helper found from the submit directory.
grep -qx 'exec "${PS_SLURM_HOME:-${SLURM_SUBMIT_DIR:-.}/deploy/slurm}/pserver-slurm.sh" launch' \
  deploy/slurm/pserver.sbatch || fail "pserver.sbatch does not run the helper"
rm -rf "$tmp/log"; mkdir -p "$tmp/log"
env -i PATH="$tmp/bin:/usr/bin:/bin" FAKE_LOG="$tmp/log" FAKE_HOSTNAMES="n1" SLURM_JOB_NODELIST=n1 \
  SLURM_SUBMIT_DIR="$PWD" PS_SLURM_PSERVER="$tmp/bin/fake-pserver" PS_SLURM_TRAINER="$tmp/bin/fake-trainer" \
  bash deploy/slurm/pserver.sbatch > "$tmp/out" 2>&1 || { cat "$tmp/out"; fail "pserver.sbatch failed"; }
expect_line "$tmp/log/pserver.n1" "PSERVER_ADVERTISE_HOST=n1"
echo "PASS: slurm launcher"
