#!/bin/sh
# etcd-member: one member of an etcd StatefulSet. The pod's host name
# (<set>-<ordinal>) names the member; ETCD_REPLICAS members <set>-0 ..
# <set>-N-1 form the initial cluster, reached through the headless Service
# ETCD_SERVICE (<member>.<service>). Data in ETCD_DATA_DIR [/var/lib/etcd/data];
# ports ETCD_CLIENT_PORT [2379], ETCD_PEER_PORT [2380]. Extra arguments go to etcd.
set -eu
name="$(hostname)"
set_name="${name%-*}"
replicas="${ETCD_REPLICAS:?ETCD_REPLICAS is not set}"
service="${ETCD_SERVICE:?ETCD_SERVICE is not set}"
client_port="${ETCD_CLIENT_PORT:-2379}"
peer_port="${ETCD_PEER_PORT:-2380}"
case "$replicas" in ''|*[!0-9]*|0) echo "etcd-member: ETCD_REPLICAS must be a positive integer, got '$replicas'" >&2; exit 2 ;; esac
initial=""
i=0
while [ "$i" -lt "$replicas" ]; do
  initial="${initial:+$initial,}$set_name-$i=http://$set_name-$i.$service:$peer_port"
  i=$((i + 1))
done
exec etcd --name "$name" --data-dir "${ETCD_DATA_DIR:-/var/lib/etcd/data}" \
  --listen-client-urls "http://0.0.0.0:$client_port" \
  --advertise-client-urls "http://$name.$service:$client_port" \
  --listen-peer-urls "http://0.0.0.0:$peer_port" \
  --initial-advertise-peer-urls "http://$name.$service:$peer_port" \
  --initial-cluster "$initial" --initial-cluster-state new \
  --initial-cluster-token "$service" "$@"
