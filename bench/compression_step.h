// Time per training step with each wire compression (cc/core/compression.h):
// a dense step is one push+pull of a float32 model, a sparse step one push
// and one pull of rows of a float32 table (TableConfig.wire_compression).
// Shared by bench:e2e's compression group (loopback, in process) and the
// compression_link driver it runs on one host of a NetnsCluster against a
// server on another, each host's link limited to 1 Gbit/s.
#ifndef PSERVER_BENCH_COMPRESSION_STEP_H_
#define PSERVER_BENCH_COMPRESSION_STEP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pserver/v1/config.pb.h"

namespace pserver::bench {

struct Encoding {
  std::string name;  // "float32", "float16", "bfloat16", "topk1%", "topk1%+float16"
  v1::WireCompression compression;
};
std::vector<Encoding> Encodings();

// Values per row of the sparse steps' table.
inline constexpr uint32_t kSparseDim = 64;

// Payload bytes one step moves for a model of `model_bytes` (gradient
// values and indices up, values down), without message headers.
uint64_t WireBytesPerStep(const v1::WireCompression& compression, uint64_t model_bytes,
                          uint64_t block_bytes);
// The same for a sparse step of `rows` distinct rows (keys and rows up,
// rows down; top-k sends k rows).
uint64_t SparseWireBytesPerStep(const v1::WireCompression& compression, uint64_t rows);

// Seconds of `steps` steps per encoding (after one warm-up step), in
// Encodings() order: result[e][step]. `server`: a pserver's address; empty:
// a one-server LocalCluster in this process.
using Steps = std::vector<std::vector<double>>;
absl::StatusOr<Steps> MeasureSteps(const std::string& server, uint64_t model_bytes, int steps);
absl::StatusOr<Steps> MeasureSparseSteps(const std::string& server, uint64_t rows, int steps);

}  // namespace pserver::bench

#endif  // PSERVER_BENCH_COMPRESSION_STEP_H_
