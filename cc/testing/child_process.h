// ChildProcess: a program started as a child with its output captured, for
// tests and benchmarks that run the real pserver binary. Every wait has a
// deadline, and the destructor kills (SIGKILL) and reaps a child still running.
//
//   PS_ASSIGN_OR_RETURN(auto child, ChildProcess::Spawn(RunfilesPath("cc/server/pserver"),
//                                                       {"--port=0"}));
//   PS_ASSIGN_OR_RETURN(std::string address, WaitForPserverAddress(*child, 0, deadline));
//   kill(child->pid(), SIGTERM);
//   PS_ASSIGN_OR_RETURN(int status, child->WaitForExit(deadline));
//
// A ChildProcess is not thread-safe.
#ifndef PSERVER_CC_TESTING_CHILD_PROCESS_H_
#define PSERVER_CC_TESTING_CHILD_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace pserver {

// Where Bazel puts a data dependency at `relative` (e.g. "cc/server/pserver"):
// tests run in the runfiles root of the "pserver" workspace
// ($TEST_SRCDIR/pserver); `bazel run` binaries find it under
// $RUNFILES_DIR/pserver or <argv0>.runfiles/pserver.
std::string RunfilesPath(const std::string& relative, const std::string& argv0 = "");

// A child process with its stdout and stderr captured through pipes.
class ChildProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(const std::string& path,
                                                             const std::vector<std::string>& args);

  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  ~ChildProcess();

  pid_t pid() const { return pid_; }
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }
  std::string output() const { return absl::StrCat(out_, err_); }

  // Reads output until a complete stdout line starts with `prefix` and
  // returns the rest of that line. DEADLINE_EXCEEDED at `deadline`, or
  // FAILED_PRECONDITION if the child exits or closes stdout first.
  absl::StatusOr<std::string> WaitForLine(absl::string_view prefix, absl::Time deadline);

  // Waits for the child to exit, reading its output meanwhile, and returns
  // its wait status; DEADLINE_EXCEEDED at `deadline`.
  absl::StatusOr<int> WaitForExit(absl::Time deadline);

 private:
  ChildProcess() = default;

  // Waits up to kPollMillis (never past `deadline`) for output and appends
  // what came; closes a pipe at its end. False if nothing was readable.
  bool ReadAvailable(absl::Time deadline);

  pid_t pid_ = -1;
  int fds_[2] = {-1, -1};  // the read ends of stdout and stderr
  std::string out_;
  std::string err_;
  std::optional<int> exit_status_;
};

// "exited with status 1", "killed by signal 9".
std::string DescribeWaitStatus(int status);

// Waits for `pserver <index> listening on <address>` and returns the address.
absl::StatusOr<std::string> WaitForPserverAddress(ChildProcess& child, uint32_t index,
                                                  absl::Time deadline);

}  // namespace pserver

#endif  // PSERVER_CC_TESTING_CHILD_PROCESS_H_
