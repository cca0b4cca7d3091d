// Finding and running system programs (ip, tc, iperf3) from tests and
// benchmarks, with a deadline on every run.
//
//   PS_ASSIGN_OR_RETURN(std::string ip, FindProgram("ip"));
//   PS_ASSIGN_OR_RETURN(std::string out,
//                       RunProgram(ip, {"netns", "list"}, absl::Now() + absl::Seconds(10)));
//
// Thread-safe (no shared state).
#ifndef PSERVER_CC_TESTING_RUN_PROGRAM_H_
#define PSERVER_CC_TESTING_RUN_PROGRAM_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pserver {

// The path of `name` in $PATH, then /usr/sbin, /sbin, /usr/bin, /bin;
// NOT_FOUND naming it when none is executable.
absl::StatusOr<std::string> FindProgram(const std::string& name);

// Runs `path` with `args` to completion and returns its stdout. An error
// quotes the command and its output when it exits non-zero (INTERNAL) or
// runs past `deadline` (DEADLINE_EXCEEDED; the child is killed by PID).
absl::StatusOr<std::string> RunProgram(const std::string& path,
                                       const std::vector<std::string>& args, absl::Time deadline);

}  // namespace pserver

#endif  // PSERVER_CC_TESTING_RUN_PROGRAM_H_
