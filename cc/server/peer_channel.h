// How a server dials another server of its cluster: a standby its primary
// (AttachStandby), a primary its backups (Replicate), a standby probing its
// primary. On a secured cluster the server presents its own credentials:
// its TLS certificate and key (--tls_cert, --tls_key) as the client
// certificate, verified by the peer like any client's, and the peer's
// certificate checked against --tls_ca and the host dialled; and, where
// roles come from tokens, the bearer token of --peer_token_file. The peer
// authorizes the call like any other: AttachStandby and Replicate need the
// admin role of the same job (cc/auth/role.h, docs/security.md).
//
//   PeerCredentials peer{.tls = options.tls, .token = token};
//   auto stub = v1::ParameterServer::NewStub(PeerChannel(address, peer));
//   grpc::ClientContext context;
//   AddPeerMetadata(peer, &context);
//
// Thread safety: plain functions of their arguments.
#ifndef PSERVER_CC_SERVER_PEER_CHANNEL_H_
#define PSERVER_CC_SERVER_PEER_CHANNEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cc/security/tls.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/channel_arguments.h"

namespace pserver {

struct PeerCredentials {
  TlsOptions tls;     // this server's own; off: plaintext
  std::string token;  // "": no authorization metadata
};

// A channel to the server at `address` ("host:port") with `peer`'s TLS
// (plaintext when off). `arguments` are kept (e.g. a message size bound).
std::shared_ptr<grpc::Channel> PeerChannel(const std::string& address,
                                           const PeerCredentials& peer,
                                           grpc::ChannelArguments arguments = {});

// Adds `peer`'s bearer token, if any, to a call's metadata.
void AddPeerMetadata(const PeerCredentials& peer, grpc::ClientContext* context);

// The token in the file at `path` (--peer_token_file): its content without
// surrounding whitespace. NOT_FOUND naming the file when it cannot be read;
// INVALID_ARGUMENT naming it when the token is empty or holds whitespace or
// a control character.
absl::StatusOr<std::string> ReadPeerToken(const std::string& path);

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_PEER_CHANNEL_H_
