// Authorizer: who may call what on a server of one job (docs/security.md).
//
// A caller is identified by a bearer token (TokenFile, --auth_tokens_file)
// or by its verified client certificate (CertRule, --auth_cert_rule); its
// role must allow the method (role.h RequiredRole) and its job must be the
// server's (--job). With neither a tokens file nor a cert rule, auth is off
// and every call is allowed, as without this class.
//
//   AuthOptions options;
//   options.job = "job-a";
//   options.tokens_file = "/etc/pserver/tokens";
//   PS_ASSIGN_OR_RETURN(auto auth, Authorizer::Create(options));
//   Credentials who;
//   who.bearer_token = "3f9c...";
//   PS_RETURN_IF_ERROR(auth->Check(who, "SendGrads"));
//
// Errors: UNAUTHENTICATED without credentials or with a token the server
// does not accept; PERMISSION_DENIED naming role, job and method ("role
// reader of job a may not SendGrads") or a certificate the rule does not
// match.
//
// Thread-safe.
#ifndef PSERVER_CC_AUTH_AUTHORIZER_H_
#define PSERVER_CC_AUTH_AUTHORIZER_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cc/auth/cert_rule.h"
#include "cc/auth/role.h"
#include "cc/auth/token_file.h"

namespace pserver {

struct AuthOptions {
  // This server's job; a principal of another job is refused. Required
  // when auth is on.
  std::string job;
  // Bearer tokens (TokenFile's format); empty: none accepted.
  std::string tokens_file;
  // How a client certificate names role and job (CertRule); empty: client
  // certificates give no role.
  std::string cert_rule;

  bool enabled() const { return !tokens_file.empty() || !cert_rule.empty(); }
};

// What a caller presented.
struct Credentials {
  std::string bearer_token;         // "": none
  std::optional<CertNames> cert;    // a verified client certificate's names
};

// The metadata key and scheme a client presents its token with.
inline constexpr char kAuthorizationMetadataKey[] = "authorization";
inline constexpr char kBearerPrefix[] = "Bearer ";
// The metadata key a client names the server instance etcd gave it with
// (registry fencing: cc/etcd/keys.h ServerEntry).
inline constexpr char kInstanceMetadataKey[] = "ps-instance-id";

class Authorizer {
 public:
  // INVALID_ARGUMENT for a bad rule, an empty job with auth on, or a tokens
  // file that does not parse (NOT_FOUND when it cannot be read).
  static absl::StatusOr<std::unique_ptr<Authorizer>> Create(const AuthOptions& options);

  bool enabled() const { return options_.enabled(); }
  const std::string& job() const { return options_.job; }

  // Who `credentials` name (a token first, else the certificate).
  absl::StatusOr<Principal> Authenticate(const Credentials& credentials) const;
  // Whether `principal` may call `method` here.
  absl::Status Authorize(const Principal& principal, absl::string_view method) const;
  // Both; OK for anything when auth is off.
  absl::Status Check(const Credentials& credentials, absl::string_view method) const;

 private:
  explicit Authorizer(AuthOptions options) : options_(std::move(options)) {}

  const AuthOptions options_;
  std::unique_ptr<TokenFile> tokens_;  // null: no tokens file
  std::optional<CertRule> rule_;
};

}  // namespace pserver

#endif  // PSERVER_CC_AUTH_AUTHORIZER_H_
