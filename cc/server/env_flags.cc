#include "cc/server/env_flags.h"

#include "absl/container/flat_hash_map.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace pserver {

std::string EnvironmentVariableForFlag(absl::string_view prefix, absl::string_view flag_name) {
  return absl::StrCat(prefix, absl::AsciiStrToUpper(flag_name));
}

absl::StatusOr<EnvFlagsApplied> ApplyFlagsFromEnvironment(
    absl::string_view prefix, char** environment,
    const std::function<bool(const absl::CommandLineFlag&)>& owned) {
  absl::flat_hash_map<std::string, absl::CommandLineFlag*> by_variable;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (owned(*flag)) by_variable[EnvironmentVariableForFlag(prefix, name)] = flag;
  }
  EnvFlagsApplied result;
  for (char** entry = environment; entry != nullptr && *entry != nullptr; ++entry) {
    const absl::string_view text = *entry;
    const size_t equals = text.find('=');
    if (equals == absl::string_view::npos) continue;
    const absl::string_view variable = text.substr(0, equals);
    if (!absl::StartsWith(variable, prefix)) continue;
    const auto it = by_variable.find(variable);
    if (it == by_variable.end()) {
      result.unknown.emplace_back(variable);
      continue;
    }
    const absl::string_view value = text.substr(equals + 1);
    std::string error;
    if (!it->second->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("environment variable ", variable, "='",
                                                     value, "' (for --", it->second->Name(),
                                                     "): ", error));
    }
    result.applied.emplace_back(variable);
  }
  return result;
}

}  // namespace pserver
