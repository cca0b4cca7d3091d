// The compression group's driver across a limited link: bench:e2e runs it
// on one host of a NetnsCluster against a pserver on another (each host's
// link limited by `tc tbf`, bench/compression_group.cc), and reads one line
// per kind and encoding:
//   <dense|sparse> <encoding> <seconds of step 1> <seconds of step 2> ...
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/compression_step.h"

ABSL_FLAG(std::string, server, "", "The pserver's address; empty: one in this process.");
ABSL_FLAG(uint64_t, model_bytes, 16 << 20, "Bytes of the float32 model (dense steps).");
ABSL_FLAG(uint64_t, sparse_rows, 16384, "Rows pushed and pulled per sparse step.");
ABSL_FLAG(int, steps, 5, "Timed steps per encoding.");

namespace {

bool Print(const char* kind, const absl::StatusOr<pserver::bench::Steps>& seconds) {
  if (!seconds.ok()) {
    std::fprintf(stderr, "compression_link: %s: %s\n", kind, seconds.status().ToString().c_str());
    return false;
  }
  const auto encodings = pserver::bench::Encodings();
  for (size_t e = 0; e < encodings.size(); ++e) {
    std::printf("%s %s", kind, encodings[e].name.c_str());
    for (double s : (*seconds)[e]) std::printf(" %.6f", s);
    std::printf("\n");
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string server = absl::GetFlag(FLAGS_server);
  const int steps = absl::GetFlag(FLAGS_steps);
  if (!Print("dense",
             pserver::bench::MeasureSteps(server, absl::GetFlag(FLAGS_model_bytes), steps))) {
    return 1;
  }
  return Print("sparse",
               pserver::bench::MeasureSparseSteps(server, absl::GetFlag(FLAGS_sparse_rows), steps))
             ? 0
             : 1;
}
