#include "cc/server/peer_channel.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "cc/auth/authorizer.h"
#include "cc/auth/token_file.h"
#include "grpcpp/create_channel.h"

namespace pserver {

std::shared_ptr<grpc::Channel> PeerChannel(const std::string& address,
                                           const PeerCredentials& peer,
                                           grpc::ChannelArguments arguments) {
  AddTlsChannelArguments(peer.tls, &arguments);
  return grpc::CreateCustomChannel(address, MakeChannelCredentials(peer.tls), arguments);
}

void AddPeerMetadata(const PeerCredentials& peer, grpc::ClientContext* context) {
  if (peer.token.empty()) return;
  context->AddMetadata(kAuthorizationMetadataKey, absl::StrCat(kBearerPrefix, peer.token));
}

absl::StatusOr<std::string> ReadPeerToken(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--peer_token_file ", path, ": cannot read it"));
  std::ostringstream text;
  text << in.rdbuf();
  const std::string token(absl::StripAsciiWhitespace(text.str()));
  if (const std::string problem = TokenProblem(token); !problem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--peer_token_file ", path, ": ", problem));
  }
  return token;
}

}  // namespace pserver
