#!/usr/bin/env bash
# Checks that libpserver.so exports the C ABI and nothing else: every
# function the headers (the arguments after the library) declare.
set -euo pipefail
# Lookups read a here-string, not a pipe: grep -q quitting early must not
# fail the writer with SIGPIPE under pipefail.
lib="$1"
shift
defined="$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^$')"
others="$(printf '%s\n' "$defined" | grep -v '^pserver_' || true)"
if [ -n "$others" ]; then
  echo "FAIL: libpserver.so exports symbols outside pserver_*:"; echo "$others" | head -20
  exit 1
fi
for sym in pserver_version pserver_client_new pserver_local_cluster_client \
           pserver_checkpoint_reader_read pserver_status_message \
           pserver_client_options_set_etcd pserver_etcd_new pserver_etcd_get \
           pserver_etcd_get_prefix pserver_etcd_put pserver_buffer_delete \
           pserver_client_create_table pserver_table_pull pserver_kv_worker_join \
           pserver_group_all_reduce pserver_cancel_new pserver_cancel_cancel \
           pserver_status_set_cancel; do
  grep -qx "$sym" <<<"$defined" || { echo "FAIL: $sym is not exported"; exit 1; }
done
declared="$(cat "$@" | grep '^PSERVER_EXPORT' | grep -o 'pserver_[a-z0-9_]*(' | tr -d '(' | sort -u)"
[ -n "$declared" ] || { echo "FAIL: no PSERVER_EXPORT function in the headers: $*"; exit 1; }
for sym in $declared; do
  grep -qx "$sym" <<<"$defined" || { echo "FAIL: $sym is declared but not exported"; exit 1; }
done
echo "OK: $(printf '%s\n' "$defined" | wc -l) symbols, all pserver_*"
