#!/bin/sh
# pserver-health [TIMEOUT]: this container's server's gRPC health
# (grpc.health.v1, through `psctl health`), for Kubernetes probes; exit 0
# only when it is SERVING. Reads the server's own settings from its
# environment: PSERVER_PORT [7000] and, with mutual TLS, PSERVER_TLS_CERT,
# PSERVER_TLS_KEY, PSERVER_TLS_CA (the server's certificate is presented as
# the client's: it needs the clientAuth key usage) and PSERVER_ADVERTISE_HOST
# (the name its certificate carries). TIMEOUT: a Go duration [5s].
set -eu
set -- health -servers "127.0.0.1:${PSERVER_PORT:-7000}" -timeout "${1:-5s}"
if [ -n "${PSERVER_TLS_CERT:-}" ]; then
  set -- "$@" -tls_cert "$PSERVER_TLS_CERT" -tls_key "${PSERVER_TLS_KEY:?PSERVER_TLS_KEY is not set}" \
    -tls_ca "${PSERVER_TLS_CA:?PSERVER_TLS_CA is not set}" \
    -tls_server_name "${PSERVER_ADVERTISE_HOST:-localhost}"
fi
exec psctl "$@"
