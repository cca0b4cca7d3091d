// The compression group's driver for a limited link: bench:e2e runs it inside
// a network namespace of its own whose loopback is shaped by `tc tbf`
// (bench/compression_group.cc), and reads one line per encoding:
//   <encoding> <seconds of step 1> <seconds of step 2> ...
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/compression_step.h"

ABSL_FLAG(uint64_t, model_bytes, 16 << 20, "Bytes of the float32 model.");
ABSL_FLAG(int, steps, 5, "Timed steps per encoding.");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto seconds = pserver::bench::MeasureSteps(absl::GetFlag(FLAGS_model_bytes),
                                              absl::GetFlag(FLAGS_steps));
  if (!seconds.ok()) {
    std::fprintf(stderr, "compression_link: %s\n", seconds.status().ToString().c_str());
    return 1;
  }
  const auto encodings = pserver::bench::Encodings();
  for (size_t e = 0; e < encodings.size(); ++e) {
    std::printf("%s", encodings[e].name.c_str());
    for (double s : (*seconds)[e]) std::printf(" %.6f", s);
    std::printf("\n");
  }
  return 0;
}
