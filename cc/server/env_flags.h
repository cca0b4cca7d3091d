// Flags from the environment: every flag a program owns can also be given as
// <PREFIX><FLAG NAME IN UPPER CASE>, e.g. PSERVER_CHECKPOINT_DIR=/ckpt for
// --checkpoint_dir (containers and Kubernetes configure by environment).
//
//   PS_ASSIGN_OR_RETURN(EnvFlagsApplied applied,
//                       ApplyFlagsFromEnvironment("PSERVER_", environ, IsOurs));
//   absl::ParseCommandLine(argc, argv);   // afterwards: the command line wins
//
// A value that does not parse is an error naming the variable and its flag;
// an environment variable with the prefix that names no flag is reported
// (it may be a client's, e.g. PSERVER_TRACE) and otherwise ignored.
// Not thread-safe: it sets flags, so call it from main before other threads
// read them (as absl::ParseCommandLine).
#ifndef PSERVER_CC_SERVER_ENV_FLAGS_H_
#define PSERVER_CC_SERVER_ENV_FLAGS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pserver {

// "PSERVER_" + "checkpoint_dir" -> "PSERVER_CHECKPOINT_DIR".
std::string EnvironmentVariableForFlag(absl::string_view prefix, absl::string_view flag_name);

struct EnvFlagsApplied {
  std::vector<std::string> applied;  // the variables set a flag, e.g. "PSERVER_PORT"
  std::vector<std::string> unknown;  // with the prefix but no flag of ours
};

// Sets each flag `owned` accepts from its variable in `environment` (a
// null-terminated "NAME=value" array, as environ). INVALID_ARGUMENT naming
// the variable and the flag when a value does not parse; flags set before
// that keep their values (the program is expected to exit).
absl::StatusOr<EnvFlagsApplied> ApplyFlagsFromEnvironment(
    absl::string_view prefix, char** environment,
    const std::function<bool(const absl::CommandLineFlag&)>& owned);

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_ENV_FLAGS_H_
