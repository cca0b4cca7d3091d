#include "cc/auth/authorizer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/core/status_macros.h"

namespace pserver {

absl::StatusOr<std::unique_ptr<Authorizer>> Authorizer::Create(const AuthOptions& options) {
  std::unique_ptr<Authorizer> auth(new Authorizer(options));
  if (!options.enabled()) return auth;
  if (options.job.empty()) {
    return absl::InvalidArgumentError(
        "--job is required with --auth_tokens_file or --auth_cert_rule: a principal of "
        "another job is refused");
  }
  if (!options.tokens_file.empty()) {
    PS_ASSIGN_OR_RETURN(auth->tokens_, TokenFile::Load(options.tokens_file));
  }
  if (!options.cert_rule.empty()) {
    PS_ASSIGN_OR_RETURN(CertRule rule, CertRule::Parse(options.cert_rule));
    auth->rule_ = std::move(rule);
  }
  return auth;
}

absl::StatusOr<Principal> Authorizer::Authenticate(const Credentials& credentials) const {
  if (!credentials.bearer_token.empty()) {
    if (tokens_ == nullptr) {
      return absl::UnauthenticatedError(
          "this server accepts no bearer tokens (no --auth_tokens_file)");
    }
    return tokens_->Find(credentials.bearer_token);
  }
  if (credentials.cert.has_value() && rule_.has_value()) return rule_->Match(*credentials.cert);
  return absl::UnauthenticatedError(absl::StrCat(
      "this server requires ",
      tokens_ != nullptr && rule_.has_value() ? "a bearer token or a client certificate"
      : tokens_ != nullptr                     ? "a bearer token (authorization: Bearer <token>)"
                                               : "a client certificate",
      " (auth is on for job ", options_.job, ")"));
}

absl::Status Authorizer::Authorize(const Principal& principal, absl::string_view method) const {
  PS_ASSIGN_OR_RETURN(Role need, RequiredRole(method));
  if (principal.job != options_.job) {
    return absl::PermissionDeniedError(
        absl::StrCat("role ", RoleName(principal.role), " of job ", principal.job,
                     " may not ", method, " on a server of job ", options_.job));
  }
  if (!RoleAllows(principal.role, need)) {
    return absl::PermissionDeniedError(absl::StrCat("role ", RoleName(principal.role),
                                                    " of job ", principal.job, " may not ",
                                                    method, " (it needs ", RoleName(need), ")"));
  }
  return absl::OkStatus();
}

absl::Status Authorizer::Check(const Credentials& credentials, absl::string_view method) const {
  if (!enabled()) return absl::OkStatus();
  PS_ASSIGN_OR_RETURN(Principal principal, Authenticate(credentials));
  return Authorize(principal, method);
}

}  // namespace pserver
