#include "cc/auth/grpc_credentials.h"

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "grpcpp/security/auth_context.h"

namespace pserver {

std::string BearerToken(absl::string_view authorization) {
  if (!absl::ConsumePrefix(&authorization, kBearerPrefix)) return "";
  return std::string(absl::StripAsciiWhitespace(authorization));
}

Credentials CredentialsOf(const grpc::ServerContextBase& context) {
  Credentials credentials;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthorizationMetadataKey);
  if (it != metadata.end()) {
    credentials.bearer_token = BearerToken(absl::string_view(it->second.data(), it->second.size()));
  }
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    CertNames names;
    for (const grpc::string_ref& cn : auth->FindPropertyValues("x509_common_name")) {
      names.common_name = std::string(cn.data(), cn.size());
    }
    for (const grpc::string_ref& san :
         auth->FindPropertyValues("x509_subject_alternative_name")) {
      names.alt_names.emplace_back(san.data(), san.size());
    }
    credentials.cert = std::move(names);
  }
  return credentials;
}

}  // namespace pserver
