#include "bindings_driver.h"

#include <signal.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cc/core/status_macros.h"
#include "cc/testing/child_process.h"
#include "google/protobuf/util/json_util.h"
#include "results.pb.h"

namespace pserver::bench {

absl::StatusOr<DriverResults> RunDriver(const std::string& program,
                                        const std::vector<std::string>& args,
                                        absl::Time deadline) {
  PS_ASSIGN_OR_RETURN(auto child, ChildProcess::Spawn(program, args));
  return WaitForDriver(*child, program, deadline);
}

absl::StatusOr<DriverResults> WaitForDriver(ChildProcess& child, const std::string& program,
                                            absl::Time deadline) {
  absl::StatusOr<int> status = child.WaitForExit(deadline);
  if (!status.ok()) {
    kill(child.pid(), SIGKILL);
    return absl::DeadlineExceededError(
        absl::StrCat(program, " did not finish in time; its output:\n", child.output()));
  }
  if (*status != 0) {
    return absl::InternalError(absl::StrCat(program, " ", DescribeWaitStatus(*status),
                                            "; its output:\n", child.output()));
  }
  return ParseDriverResults(program, child.out());
}

absl::StatusOr<DriverResults> ParseDriverResults(const std::string& program,
                                                 const std::string& out) {
  DriverResults results;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipWhitespace())) {
    DriverResult r;
    if (!google::protobuf::util::JsonStringToMessage(std::string(line), &r).ok()) {
      return absl::InternalError(
          absl::StrCat(program, " printed a line that is not a DriverResult: ", line));
    }
    results[{r.op(), r.payload_bytes()}].assign(r.values().begin(), r.values().end());
  }
  return results;
}

}  // namespace pserver::bench
