// What the wire compression examples share (compressed_digits,
// compressed_embeddings): one training run per encoding from the same start
// on the same batches, and the check that no compressed run ends more than
// a tolerance below float32's test accuracy.
#ifndef PSERVER_EXAMPLES_ENCODING_RUNS_H_
#define PSERVER_EXAMPLES_ENCODING_RUNS_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "pserver/v1/config.pb.h"

namespace pserver {

struct EncodingRun {
  std::string label;
  v1::WireCompression compression;
  double accuracy = 0;
  uint64_t bytes = 0;  // what the compressed pushes carried
};

// Prints each run's accuracy and bytes (`bytes_what` names them), then
// "every encoding within <tolerance> of float32 accuracy <a>" if no run is
// more than `tolerance` below runs[0]'s (float32); else INTERNAL naming the
// first that is.
inline absl::Status ReportRuns(const std::vector<EncodingRun>& runs, double tolerance,
                               const char* bytes_what) {
  for (const EncodingRun& run : runs) {
    std::printf("%-14s test accuracy %.4f  %s %llu\n", run.label.c_str(), run.accuracy, bytes_what,
                static_cast<unsigned long long>(run.bytes));
  }
  for (const EncodingRun& run : runs) {
    if (run.accuracy < runs[0].accuracy - tolerance) {
      return absl::InternalError(absl::StrCat(run.label, " accuracy ", run.accuracy,
                                              " is more than ", tolerance, " below float32's ",
                                              runs[0].accuracy));
    }
  }
  std::printf("every encoding within %.3f of float32 accuracy %.4f\n", tolerance, runs[0].accuracy);
  return absl::OkStatus();
}

}  // namespace pserver

#endif  // PSERVER_EXAMPLES_ENCODING_RUNS_H_
