#include "cc/auth/role.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pserver {
namespace {

struct MethodRole {
  const char* method;
  Role role;
};

// Every method of pserver.v1.ParameterServer (proto/pserver/v1/service.proto).
constexpr MethodRole kMethodRoles[] = {
    {"GetParam", Role::kReader},       {"GetParams", Role::kReader},
    {"GetParamInfo", Role::kReader},   {"GetStats", Role::kReader},
    {"ListWorkers", Role::kReader},    {"TablePull", Role::kReader},
    {"TableStats", Role::kReader},     {"OpenChannel", Role::kReader},
    {"ListParams", Role::kReader},
    {"InitParam", Role::kTrainer},     {"FinishInitParams", Role::kTrainer},
    {"SendGrad", Role::kTrainer},      {"SendGrads", Role::kTrainer},
    {"PushPull", Role::kTrainer},      {"CreateTable", Role::kTrainer},
    {"TablePush", Role::kTrainer},     {"Clock", Role::kTrainer},
    {"Barrier", Role::kTrainer},       {"AllReduce", Role::kTrainer},
    {"Broadcast", Role::kTrainer},     {"Save", Role::kAdmin},
    // Replication between servers (docs/replication.md): servers call these
    // with admin credentials.
    {"AttachStandby", Role::kAdmin},   {"Replicate", Role::kAdmin},
    // Live moves (docs/elastic.md): the coordinator and servers call these.
    {"MoveBlocks", Role::kAdmin},      {"ReceiveBlocks", Role::kAdmin},
};

constexpr std::pair<Role, absl::string_view> kRoleNames[] = {
    {Role::kReader, "reader"}, {Role::kTrainer, "trainer"}, {Role::kAdmin, "admin"}};

}  // namespace

absl::string_view RoleName(Role role) {
  for (const auto& [r, name] : kRoleNames) {
    if (r == role) return name;
  }
  return "unknown";
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  for (const auto& [role, known] : kRoleNames) {
    if (known == name) return role;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown role '", name, "' (reader, trainer or admin)"));
}

absl::StatusOr<Role> RequiredRole(absl::string_view method) {
  for (const MethodRole& entry : kMethodRoles) {
    if (method == entry.method) return entry.role;
  }
  return absl::NotFoundError(absl::StrCat("method ", method, " has no role (cc/auth/role.cc)"));
}

std::vector<std::string> MethodsWithRoles() {
  std::vector<std::string> methods;
  for (const MethodRole& entry : kMethodRoles) methods.push_back(entry.method);
  return methods;
}

}  // namespace pserver
