// bench:e2e's tls group: what mutual TLS costs. Push, pull and push+pull of
// one parameter (4 KiB, 1, 16 and 64 MiB; --quick: up to 16 MiB) from a
// client process (bench/tls_link) to a pserver process, in the same run:
//   plain       plaintext, with the bulk channel (the default)
//   plain_grpc  plaintext, gRPC only (--bulk_channel off in the client)
//   tls         mutual TLS with TLS records (gRPC and the bulk channel over
//               TLS, TCP; --tls_bulk_aead=false on both ends)
//   tls_aead    mutual TLS, the bulk channel switched to its AEAD layer
//               (the default; cc/security/bulk_aead.h)
// first over loopback, then between two hosts of a NetnsCluster whose links
// `tc tbf` limits to 10 Gbit/s (skipped, saying why, without the rights to
// make namespaces). Each tls and tls_aead result carries vs_plain,
// vs_plain_tcp and vs_plain_grpc: its median over theirs. Certificates are made with the openssl CLI at run time.
#ifndef PSERVER_BENCH_TLS_GROUP_H_
#define PSERVER_BENCH_TLS_GROUP_H_

#include <string>

#include "absl/status/status.h"
#include "harness.h"

namespace pserver::bench {

// `argv0` finds bench/tls_link in the runfiles.
absl::Status TlsGroup(Harness& h, const std::string& pserver_binary, const std::string& argv0);

}  // namespace pserver::bench

#endif  // PSERVER_BENCH_TLS_GROUP_H_
