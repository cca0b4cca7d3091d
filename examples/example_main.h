// What every example shares: a main() that parses the flags, runs the
// example and turns its status into the exit code, and the check that the
// loss fell clearly (the examples' tests rely on both).
#ifndef PSERVER_EXAMPLES_EXAMPLE_MAIN_H_
#define PSERVER_EXAMPLES_EXAMPLE_MAIN_H_

#include <cstdio>

#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace pserver {

// OK, printing "<what> fell from <first> to <last>", when last < factor *
// first; INTERNAL otherwise.
inline absl::Status CheckFell(absl::string_view what, double first, double last, double factor) {
  if (!(last < factor * first)) {
    return absl::InternalError(absl::StrCat(what, " did not fall clearly: ", first, " -> ", last));
  }
  std::printf("%s fell from %.4f to %.4f\n", std::string(what).c_str(), first, last);
  return absl::OkStatus();
}

// Parses the flags, runs `run`, and returns the exit code: 0, or 1 after
// printing the error prefixed by the example's `name`.
inline int ExampleMain(const char* name, int argc, char** argv, absl::Status (*run)()) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = run();
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", name, status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace pserver

#endif  // PSERVER_EXAMPLES_EXAMPLE_MAIN_H_
