#include "cc/auth/cert_rule.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace pserver {
namespace {

constexpr absl::string_view kRole = "<role>";
constexpr absl::string_view kJob = "<job>";

bool IsPlaceholder(absl::string_view piece) { return piece == kRole || piece == kJob; }

bool IsNameChar(char c) { return absl::ascii_isalnum(c) || c == '-' || c == '_'; }

absl::Status BadRule(absl::string_view rule, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "--auth_cert_rule '", rule, "': ", why,
      " (e.g. cn:<role>.<job> or san:spiffe://<job>/<role>)"));
}

}  // namespace

absl::StatusOr<CertRule> CertRule::Parse(absl::string_view rule) {
  CertRule parsed;
  parsed.text_ = std::string(rule);
  absl::string_view pattern = rule;
  if (absl::ConsumePrefix(&pattern, "san:")) {
    parsed.san_ = true;
  } else if (!absl::ConsumePrefix(&pattern, "cn:")) {
    return BadRule(rule, "starts with neither cn: nor san:");
  }
  int roles = 0, jobs = 0;
  while (!pattern.empty()) {
    size_t next = pattern.find('<');
    if (next == 0) {
      absl::string_view placeholder =
          absl::StartsWith(pattern, kRole) ? kRole
          : absl::StartsWith(pattern, kJob) ? kJob
                                            : absl::string_view();
      if (placeholder.empty()) return BadRule(rule, "'<' starts neither <role> nor <job>");
      if (!parsed.pieces_.empty() && IsPlaceholder(parsed.pieces_.back())) {
        return BadRule(rule, "two placeholders need a separator between them");
      }
      (placeholder == kRole ? roles : jobs)++;
      parsed.pieces_.emplace_back(placeholder);
      pattern.remove_prefix(placeholder.size());
      continue;
    }
    absl::string_view literal = pattern.substr(0, next);
    if (!parsed.pieces_.empty() && IsPlaceholder(parsed.pieces_.back()) &&
        IsNameChar(literal[0])) {
      return BadRule(rule, "a placeholder must be followed by a character other than "
                           "letters, digits, '-' and '_'");
    }
    parsed.pieces_.emplace_back(literal);
    pattern.remove_prefix(literal.size());
  }
  if (roles != 1 || jobs != 1) return BadRule(rule, "needs <role> and <job>, once each");
  return parsed;
}

bool CertRule::MatchOne(absl::string_view name, Principal* principal) const {
  std::string role;
  for (const std::string& piece : pieces_) {
    if (!IsPlaceholder(piece)) {
      if (!absl::ConsumePrefix(&name, piece)) return false;
      continue;
    }
    size_t length = 0;
    while (length < name.size() && IsNameChar(name[length])) ++length;
    if (length == 0) return false;
    (piece == kRole ? role : principal->job) = std::string(name.substr(0, length));
    name.remove_prefix(length);
  }
  if (!name.empty()) return false;
  absl::StatusOr<Role> parsed = ParseRole(role);
  if (!parsed.ok()) return false;
  principal->role = *parsed;
  principal->source = "certificate";
  return true;
}

absl::StatusOr<Principal> CertRule::Match(const CertNames& names) const {
  std::vector<std::string> candidates;
  if (san_) {
    candidates = names.alt_names;
  } else if (!names.common_name.empty()) {
    candidates.push_back(names.common_name);
  }
  for (const std::string& name : candidates) {
    Principal principal;
    if (MatchOne(name, &principal)) return principal;
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "the client certificate's ", san_ ? "subject alternative names" : "common name", " (",
      candidates.empty() ? "none" : absl::StrJoin(candidates, ", "), ") do not match ", text_));
}

}  // namespace pserver
