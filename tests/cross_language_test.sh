#!/usr/bin/env bash
# bazel test //tests:cross_language_test: one cluster, three languages.
#
#  1. two pserver processes (C++) on 127.0.0.1 free ports with --checkpoint_dir;
#  2. a Python trainer initializes and trains six parameters (every element
#     type, one cut over both shards) and dumps what it reads back;
#  3. a Go client reads them: the same bytes as Python;
#  4. Go asks for a checkpoint; the Python and Go checkpoint readers return
#     bit-identical arrays, equal to what the servers served;
#  5. the servers are killed (SIGKILL: nothing more is written) and restarted
#     with the same --checkpoint_dir and indexes; each loads the checkpoint
#     Go asked for, and Go and Python read the same bytes again.
# Every process is stopped by its PID.
set -euo pipefail
root="$PWD"
T="$TEST_TMPDIR"
PSERVER="$root/cc/server/pserver"
PY=/usr/bin/python3

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# start_servers TAG: starts servers 0 and 1, waits (bounded) until each
# prints its address; sets $servers ("a,b") and $server_pids.
start_servers() {
  local tag="$1" i log addr
  server_pids=()
  for i in 0 1; do
    "$PSERVER" --host=127.0.0.1 --port=0 --index=$i --checkpoint_dir="$T/ckpt" \
      > "$T/server$i.$tag.log" 2>&1 &
    server_pids+=($!)
    pids+=($!)
  done
  local addrs=()
  for i in 0 1; do
    log="$T/server$i.$tag.log"
    addr=""
    for _ in $(seq 1 600); do  # at most 30 s
      addr="$(sed -n 's/^pserver [0-9]* listening on \([0-9.:]*\).*/\1/p' "$log")"
      [ -n "$addr" ] && break
      kill -0 "${server_pids[$i]}" 2>/dev/null || { cat "$log" >&2; fail "server $i exited"; }
      sleep 0.05
    done
    [ -n "$addr" ] || { cat "$log" >&2; fail "server $i did not start"; }
    addrs+=("$addr")
  done
  servers="${addrs[0]},${addrs[1]}"
  echo "servers ($tag): $servers"
}

# stop_servers [KILL]: SIGTERM (a clean stop, which also writes a final
# checkpoint) or SIGKILL (nothing more is written), then wait for each PID.
stop_servers() {
  local pid sig="${1:-TERM}"
  for pid in "${server_pids[@]}"; do kill -"$sig" "$pid"; done
  for pid in "${server_pids[@]}"; do
    if [ "$sig" = TERM ]; then wait "$pid" || fail "server $pid exited with $?"; else wait "$pid" || true; fi
  done
}

# The Python package, installed as users install it.
python/install.sh --target "$T/site" --quiet
export PYTHONPATH="$T/site"

# The Go client, built against libpserver.so from runfiles.
source go/go_env.sh
pserver_go_env "$root" "$T"
mkdir -p "$GO_MODULE_COPY/cmd/xlang"
cp -L tests/cross_language_test_go/main.go "$GO_MODULE_COPY/cmd/xlang/"
(cd "$GO_MODULE_COPY" && /usr/bin/go build -trimpath -o "$T/xlang" ./cmd/xlang)
names="bias count emb ids steps w"

start_servers first
$PY tests/cross_language_test.py train --servers "$servers" --out "$T/py_get"
"$T/xlang" get -servers "$servers" -out "$T/go_get" $names
echo "Python get == Go get:"
$PY tests/cross_language_test.py compare "$T/py_get" "$T/go_get"

"$T/xlang" save -servers "$servers"
"$T/xlang" ckpt -path "$T/ckpt" -out "$T/go_ckpt"
$PY tests/cross_language_test.py ckpt --path "$T/ckpt" --out "$T/py_ckpt"
echo "Python checkpoint reader == Go checkpoint reader:"
$PY tests/cross_language_test.py compare "$T/py_ckpt" "$T/go_ckpt"
echo "checkpoint == what the servers served:"
$PY tests/cross_language_test.py compare "$T/go_ckpt" "$T/go_get"
# SIGKILL: no final checkpoint, so the restart can only load the one Go asked for.
saved=("$T"/ckpt/shard-0/ckpt-*)
stop_servers KILL
[ "$(ls -d "$T"/ckpt/shard-0/ckpt-*)" = "$(printf '%s\n' "${saved[@]}")" ] || fail "a checkpoint appeared after SIGKILL"

start_servers restarted
for i in 0 1; do
  newest="$(ls -d "$T"/ckpt/shard-$i/ckpt-* | tail -1)"
  grep -q "loaded checkpoint $newest" "$T/server$i.restarted.log" ||
    { cat "$T/server$i.restarted.log" >&2; fail "server $i did not load $newest"; }
done
"$T/xlang" get -servers "$servers" -out "$T/go_get2" $names
$PY tests/cross_language_test.py get --servers "$servers" --out "$T/py_get2"
echo "restarted servers (Go) == before the restart:"
$PY tests/cross_language_test.py compare "$T/go_get2" "$T/go_get"
echo "restarted servers (Python) == before the restart:"
$PY tests/cross_language_test.py compare "$T/py_get2" "$T/go_get"
stop_servers
echo "PASS"
