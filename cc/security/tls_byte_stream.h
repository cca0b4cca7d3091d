// TLS on the bulk channel: a ByteStream (cc/rpc/byte_stream.h) over OpenSSL
// wrapping a connected TCP socket, with the same mutual TLS as the gRPC data
// plane (cc/security/tls.h): TLS 1.3 only, AES-GCM (AES-128 preferred), the server requires a
// client certificate chaining to its CA, the client checks the server's
// certificate against its CA and the name dialled (or options.server_name).
//
//   PS_ASSIGN_OR_RETURN(auto plain, ConnectTcp(host, port, timeout));
//   PS_ASSIGN_OR_RETURN(auto stream, StartTlsClient(std::move(plain), tls, host, deadline));
//
// The three files are read for every new connection, so replaced files
// (rotation) take effect on the next connection; connections already made
// keep their certificates.
//
// One thread may write while another reads (each OpenSSL call is made under
// a lock on a non-blocking socket; waiting happens outside it); Shutdown may
// be called from any thread. Records are gathered into a 256 KiB buffer and
// sent when it fills and at the end of each Write. A write to a peer that
// has hung up fails (UNAVAILABLE); it raises no SIGPIPE. A read waits at
// most the socket's receive timeout (SO_RCVTIMEO) when one is set, as a
// plain socket's read does.
#ifndef PSERVER_CC_SECURITY_TLS_BYTE_STREAM_H_
#define PSERVER_CC_SECURITY_TLS_BYTE_STREAM_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cc/auth/cert_rule.h"
#include "cc/rpc/byte_stream.h"
#include "cc/rpc/spill_writer.h"
#include "cc/security/tls.h"

namespace pserver {

// Server side of the handshake on accepted socket `fd` (taken over: closed
// on failure too), finished by `deadline`. With options.bulk_aead (and
// AES-NI) the server also reads the client's first 8 bytes by `deadline`:
// the AEAD switch is answered and the stream sealed from then on; any other
// bytes stay plain TLS and are the stream's first bytes. UNAVAILABLE naming the cause when
// the peer presents no certificate, one the CA did not sign, or speaks no
// TLS. `options` must have passed CheckTlsOptions. `peer`, when set, gets
// the verified client certificate's names as gRPC's AuthContext gives them
// (common name; DNS, URI, email and IP subject alternative names), for the
// role rule (cc/auth/cert_rule.h).
absl::StatusOr<std::unique_ptr<ByteStream>> StartTlsServer(int fd, const TlsOptions& options,
                                                           absl::Time deadline,
                                                           CertNames* peer = nullptr);

// Client side over a stream from ConnectTcp (its socket is taken over),
// checking the server's certificate for options.server_name or else `host`.
// `server_offers_aead` (OpenChannelResponse.bulk_aead): with
// options.bulk_aead too and AES-NI here, the client switches the stream to
// the AEAD layer (cc/security/bulk_aead.h) after the handshake.
absl::StatusOr<std::unique_ptr<ByteStream>> StartTlsClient(std::unique_ptr<ByteStream> tcp,
                                                           const TlsOptions& options,
                                                           const std::string& host,
                                                           absl::Time deadline,
                                                           bool server_offers_aead = false);

// The TLS 1.3 suite `stream` (from StartTlsServer or StartTlsClient)
// negotiated, by its standard name: "TLS_AES_128_GCM_SHA256" between two
// pserver ends (the server prefers it to TLS_AES_256_GCM_SHA384); "" for a
// stream that is not TLS.
std::string TlsCipherSuite(ByteStream& stream);

// Whether `stream` switched to the bulk AEAD layer after its handshake.
bool TlsUsesBulkAead(ByteStream& stream);
// The writer of one frame written while it is produced, sealed by the AEAD
// layer (AeadStream::StartFrame), when `stream` switched to it; else null.
std::unique_ptr<FrameWriter> StartSealedFrame(ByteStream& stream, uint64_t head_bytes,
                                              uint64_t frame_bytes);
// Fingerprints of the AEAD layer's send and receive keys (8 bytes of
// SHA-256 over key and nonce prefix, hex), for tests; empty without it.
std::pair<std::string, std::string> BulkAeadKeyIds(ByteStream& stream);

}  // namespace pserver

#endif  // PSERVER_CC_SECURITY_TLS_BYTE_STREAM_H_
