// bench:e2e's compression group: wire compression (cc/core/compression.h)
// codec speed, and time per push+pull step with each encoding over loopback
// and over a 1 Gbit/s link (`tc tbf` on the loopback of a network namespace
// the group creates with `unshare -n`, skipped with the reason where that is
// not allowed). The namespace has no name and dies with its last process, so
// nothing is left behind, even on failure.
#ifndef PSERVER_BENCH_COMPRESSION_GROUP_H_
#define PSERVER_BENCH_COMPRESSION_GROUP_H_

#include <string>

#include "absl/status/status.h"
#include "harness.h"

namespace pserver::bench {

// `argv0` finds the driver binary (bench/compression_link) in the runfiles.
absl::Status CompressionGroup(Harness& h, const std::string& argv0);

}  // namespace pserver::bench

#endif  // PSERVER_BENCH_COMPRESSION_GROUP_H_
