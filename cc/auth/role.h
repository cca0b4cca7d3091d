// Roles of a secured cluster (docs/security.md) and the role every server
// method needs, defined once.
//
//   reader   reads: GetParam(s), GetParamInfo, TablePull, stats, OpenChannel
//   trainer  a reader's methods, plus pushes, InitParam, tables, clocks and
//            collectives
//   admin    a trainer's methods, plus Save (what changes the cluster)
//
//   absl::StatusOr<Role> need = RequiredRole("SendGrads");   // kTrainer
//   if (!RoleAllows(principal.role, *need)) ...
//
// Thread safety: plain functions of their arguments.
#ifndef PSERVER_CC_AUTH_ROLE_H_
#define PSERVER_CC_AUTH_ROLE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pserver {

// Ordered: each role may do everything the roles before it may.
enum class Role {
  kReader = 0,
  kTrainer = 1,
  kAdmin = 2,
};

// "reader", "trainer", "admin".
absl::string_view RoleName(Role role);
// The role named `name`; INVALID_ARGUMENT naming it and the known roles.
absl::StatusOr<Role> ParseRole(absl::string_view name);

// Whether `have` may call a method that needs `need`.
inline bool RoleAllows(Role have, Role need) {
  return static_cast<int>(have) >= static_cast<int>(need);
}

// The role a pserver.v1.ParameterServer method (its short name, e.g.
// "SendGrads") needs; NOT_FOUND for a method the table does not know, which
// a server refuses (a new method must be added here: role_test checks every
// method of the service).
absl::StatusOr<Role> RequiredRole(absl::string_view method);

// Every method of the table, for tests.
std::vector<std::string> MethodsWithRoles();

// Who is calling: the role and job of a bearer token or client certificate.
struct Principal {
  Role role = Role::kReader;
  std::string job;
  // How it was established, for messages: "token", "certificate".
  std::string source;
};

}  // namespace pserver

#endif  // PSERVER_CC_AUTH_ROLE_H_
