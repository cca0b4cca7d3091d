#include "cc/testing/run_program.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cc/testing/child_process.h"

namespace pserver {

absl::StatusOr<std::string> FindProgram(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::vector<std::string> dirs = absl::StrSplit(path ? path : "", ':', absl::SkipEmpty());
  for (const char* dir : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"}) dirs.push_back(dir);
  for (const std::string& dir : dirs) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return absl::NotFoundError(absl::StrCat("program '", name, "' not found in $PATH or /usr/sbin"));
}

absl::StatusOr<std::string> RunProgram(const std::string& path,
                                       const std::vector<std::string>& args, absl::Time deadline) {
  auto child = ChildProcess::Spawn(path, args);
  if (!child.ok()) return child.status();
  const std::string command = absl::StrCat(path, " ", absl::StrJoin(args, " "));
  absl::StatusOr<int> status = (*child)->WaitForExit(deadline);
  if (!status.ok()) {
    kill((*child)->pid(), SIGKILL);  // the destructor reaps it
    return absl::DeadlineExceededError(
        absl::StrCat("'", command, "' did not finish in time; its output: ",
                     absl::StripAsciiWhitespace((*child)->output())));
  }
  if (*status != 0) {
    return absl::InternalError(absl::StrCat("'", command, "' ", DescribeWaitStatus(*status),
                                            ": ", absl::StripAsciiWhitespace((*child)->output())));
  }
  return (*child)->out();
}

}  // namespace pserver
