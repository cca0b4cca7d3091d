// Time per training step with each wire compression (cc/core/compression.h):
// one push+pull of a float32 model through a one-server LocalCluster over
// gRPC, shared by bench:e2e's compression group (loopback) and the
// compression_link driver it runs inside a network namespace whose loopback
// is limited to 1 Gbit/s.
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

// Payload bytes one step moves for a model of `model_bytes` (gradient
// values and indices up, values down), without message headers.
uint64_t WireBytesPerStep(const v1::WireCompression& compression, uint64_t model_bytes,
                          uint64_t block_bytes);

// Seconds of `steps` push+pull steps per encoding (after one warm-up step),
// in Encodings() order: result[e][step].
absl::StatusOr<std::vector<std::vector<double>>> MeasureSteps(uint64_t model_bytes, int steps);

}  // namespace pserver::bench

#endif  // PSERVER_BENCH_COMPRESSION_STEP_H_
