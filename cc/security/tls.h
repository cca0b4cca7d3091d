// TLS for pserver's gRPC data plane: mutual TLS between clients and servers.
//
// Each side names three PEM files: its own certificate (chain), its private
// key, and the CA bundle it trusts for the peer's certificate. A server
// requires a client certificate and verifies it against its CA; a client
// verifies the server's certificate against its CA and the host it dials (or
// `server_name`). The files are re-read every `reload_interval` while the
// process runs, so replacing them (atomically: write beside, then rename)
// rotates the certificates without a restart: new connections get the new
// ones, connections already made keep theirs until they reconnect.
//
//   TlsOptions tls{.cert = "server.pem", .key = "server.key", .ca = "ca.pem"};
//   PS_RETURN_IF_ERROR(CheckTlsOptions(tls));   // all three or none, readable
//   builder.AddListeningPort(address, MakeServerCredentials(tls), &port);
//
// Thread-safe: the functions share no state.
#ifndef PSERVER_CC_SECURITY_TLS_H_
#define PSERVER_CC_SECURITY_TLS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace grpc {
class ChannelArguments;
class ChannelCredentials;
class ServerCredentials;
}  // namespace grpc

namespace pserver {

struct TlsOptions {
  std::string cert;  // this side's certificate chain (PEM file)
  std::string key;   // its private key (PEM file)
  std::string ca;    // the CAs the peer's certificate must chain to (PEM file)
  // Client only: the name the server's certificate must carry (a DNS or IP
  // subject alternative name); empty: the host part of the address dialled.
  std::string server_name;
  // How often the files are checked for changes (at least 1s).
  absl::Duration reload_interval = absl::Minutes(1);
  // Bulk channel only: after the TLS handshake, seal bulk bytes with the
  // AEAD layer (cc/security/bulk_aead.h, AES-128-GCM from ipsec-mb, keys
  // from the TLS exporter) when both ends set this (the default) and have
  // AES-NI; otherwise TLS records (a CPU without AES-NI says so once). A
  // server offers it in OpenChannelResponse.bulk_aead. Off: server
  // --tls_bulk_aead=false, or false here on the client.
  bool bulk_aead = true;

  // Any of the three files named: TLS is on (CheckTlsOptions then asks for
  // all three).
  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// OK when TLS is off, or when all three files are named, readable and hold
// what they should (a PEM certificate, a PEM private key, a PEM CA
// certificate), the certificate is valid now and the key is its key.
// Otherwise INVALID_ARGUMENT naming the missing option
// (`<prefix>cert`, e.g. "--tls_cert" with prefix "tls_"), or NOT_FOUND /
// INVALID_ARGUMENT naming the file that cannot be read or holds no such PEM
// block.
absl::Status CheckTlsOptions(const TlsOptions& options, const std::string& prefix = "tls_");

// mTLS server credentials: client certificates required and verified
// against options.ca. options must have passed CheckTlsOptions.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TlsOptions& options);

// Client credentials: plaintext when TLS is off; otherwise the client's
// certificate and key presented, the server's certificate verified against
// options.ca and the server's name (see AddTlsChannelArguments).
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const TlsOptions& options);

// Sets the name the server's certificate is checked against, when
// options.server_name is set.
void AddTlsChannelArguments(const TlsOptions& options, grpc::ChannelArguments* args);

// Why a connection failed, in words, when gRPC's message `grpc_message`
// shows a TLS cause (or, for a plaintext client (`tls` false), a server that
// hung up at once, as a TLS server does); empty otherwise. gRPC's own words
// name none: "Socket closed" is what a client whose certificate the server
// refused sees.
std::string DescribeTlsFailure(absl::string_view grpc_message, bool tls);

}  // namespace pserver

#endif  // PSERVER_CC_SECURITY_TLS_H_
