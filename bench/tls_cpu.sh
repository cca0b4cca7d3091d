#!/bin/bash
# CPU seconds per GB of a TLS bulk channel op on loopback, both ends, for
# comparing builds in alternation on a loaded machine (bench/RESULTS.md, TLS
# section, "The AEAD path beyond the cipher"). Wall-clock GB/s is printed too
# but on a shared machine only the CPU figures compare.
#
#   bench/tls_cpu.sh BINDIR MODE OP [ROUNDS]
#     BINDIR  a folder with -c opt `pserver` and `tls_link` (copy them out of
#             bazel-bin/cc/server and bazel-bin/bench to keep a build)
#     MODE    plain (TCP, --bulk_unix_socket=false) | aead (mutual TLS, the
#             AEAD layer) | records (mutual TLS, --tls_bulk_aead=false)
#     OP      push | pull | pushpull
#   e.g. for r in 1 2 3; do for d in /tmp/main /tmp/branch; do
#          bench/tls_cpu.sh $d aead push; done; done
#
# Each round: one pserver on a free port, then tls_link with 5 repetitions of
# 128 MiB of 16 MiB ops (40 ops); `perf stat` counts both processes. Prints
# one line: CPU s/GB (client + server), system calls and context switches per
# op at each end, and the median GB/s. Needs perf and openssl.
set -euo pipefail
D=$1; MODE=$2; OP=$3; ROUNDS=${4:-1}
SIZE=16777216; REPS=5; BYTES=134217728
WORK=$(mktemp -d)
SERVER_PID=""; STAT_PID=""
cleanup() {
  [ -n "$STAT_PID" ] && kill -INT "$STAT_PID" 2>/dev/null || true
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
# A CA, a server and a client certificate (127.0.0.1), valid for a day.
(
  cd "$WORK"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key \
    -out ca.pem -days 1 -subj /CN=tls-cpu-ca 2>/dev/null
  printf "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n" > ext.cnf
  for n in server client; do
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout $n.key \
      -out $n.csr -subj /CN=$n 2>/dev/null
    openssl x509 -req -in $n.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $n.pem -days 1 \
      -extfile ext.cnf 2>/dev/null
  done
)
case $MODE in
  plain) SF=(--bulk_unix_socket=false); CF=() ;;
  aead|records)
    AEAD=true; [ "$MODE" = records ] && AEAD=false
    SF=(--tls_cert=$WORK/server.pem --tls_key=$WORK/server.key --tls_ca=$WORK/ca.pem --tls_bulk_aead=$AEAD)
    CF=(--tls_cert=$WORK/client.pem --tls_key=$WORK/client.key --tls_ca=$WORK/ca.pem --tls_bulk_aead=$AEAD) ;;
  *) echo "MODE: plain, aead or records" >&2; exit 2 ;;
esac
EVENTS=task-clock,context-switches,raw_syscalls:sys_enter
OPS=$(( REPS * BYTES / SIZE ))
for round in $(seq "$ROUNDS"); do
  PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  "$D/pserver" --port=$PORT "${SF[@]}" > "$WORK/server.log" 2>&1 &
  SERVER_PID=$!
  for i in $(seq 150); do ss -ltn | grep -q ":$PORT " && break; sleep 0.2; done
  perf stat -x, -e $EVENTS -p $SERVER_PID -o "$WORK/server.stat" & STAT_PID=$!
  sleep 0.3
  perf stat -x, -e $EVENTS -o "$WORK/client.stat" "$D/tls_link" --servers=127.0.0.1:$PORT \
    --sizes=$SIZE --repetitions=$REPS --bytes_per_repetition=$BYTES --ops=$OP "${CF[@]}" \
    > "$WORK/link.out"
  kill -INT $STAT_PID; wait $STAT_PID || true; STAT_PID=""
  kill $SERVER_PID; wait $SERVER_PID 2>/dev/null || true; SERVER_PID=""
  python3 - "$WORK" "$OPS" "$SIZE" "$(basename "$D")" "$MODE" "$OP" <<'PY'
import json, statistics, sys
work, ops, size, name, mode, op = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:]
def counts(path):
    c = {}
    for line in open(path):
        f = line.strip().split(',')
        if len(f) > 2 and f[0] and f[0][0].isdigit():
            c[f[2]] = float(f[0])
    return c
s, c = counts(f'{work}/server.stat'), counts(f'{work}/client.stat')
cpu = (s['task-clock'] + c['task-clock']) / 1e3 / ops  # ms of task-clock -> s per op
values = [v for l in open(f'{work}/link.out') for v in json.loads(l).get('values', [])]
print(f"{name} {mode} {op}: cpu_s_per_GB={cpu / (size / 1e9):.2f} "
      f"server syscalls/op={s['raw_syscalls:sys_enter'] / ops:.0f} cs/op={s['context-switches'] / ops:.0f} "
      f"client syscalls/op={c['raw_syscalls:sys_enter'] / ops:.0f} cs/op={c['context-switches'] / ops:.0f} "
      f"median_GB/s={statistics.median(values):.3f}")
PY
done
