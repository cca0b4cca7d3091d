// CertRule: how a client certificate names its role and job
// (--auth_cert_rule), as a pattern over the certificate's common name or one
// of its subject alternative names, with the placeholders <role> and <job>:
//
//   cn:<role>.<job>            CN "trainer.job-a"
//   san:spiffe://<job>/<role>  URI SAN "spiffe://job-a/trainer"
//
// A placeholder matches one or more of [A-Za-z0-9_-]; the rest of the
// pattern must match exactly. The role must be a known one.
//
//   PS_ASSIGN_OR_RETURN(CertRule rule, CertRule::Parse("cn:<role>.<job>"));
//   absl::StatusOr<Principal> who = rule.Match({"trainer.job-a"}, {});
//
// Thread safety: immutable after Parse.
#ifndef PSERVER_CC_AUTH_CERT_RULE_H_
#define PSERVER_CC_AUTH_CERT_RULE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cc/auth/role.h"

namespace pserver {

// What a verified client certificate says about its subject.
struct CertNames {
  std::string common_name;             // "" when none
  std::vector<std::string> alt_names;  // SANs (DNS, URI, ...) as gRPC gives them
};

class CertRule {
 public:
  // INVALID_ARGUMENT naming what is wrong: no "cn:" or "san:", a pattern
  // without both <role> and <job>, or two placeholders with nothing between.
  static absl::StatusOr<CertRule> Parse(absl::string_view rule);

  // The principal the certificate names; PERMISSION_DENIED naming the names
  // seen when none matches.
  absl::StatusOr<Principal> Match(const CertNames& names) const;

  const std::string& text() const { return text_; }

 private:
  // Pieces of the pattern: literals, and the placeholders "<role>", "<job>".
  bool MatchOne(absl::string_view name, Principal* principal) const;

  std::string text_;
  bool san_ = false;
  std::vector<std::string> pieces_;
};

}  // namespace pserver

#endif  // PSERVER_CC_AUTH_CERT_RULE_H_
