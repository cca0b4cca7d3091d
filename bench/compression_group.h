// bench:e2e's compression group: wire compression (cc/core/compression.h)
// codec and top-k selection speed, and time per step with each encoding, for
// a dense parameter (push+pull) and a sparse table (push and pull of rows),
// over loopback and between two hosts of a NetnsCluster (cc/testing/netns.h:
// the server on one, the driver bench/compression_link on the other, each
// host's link limited to 1 Gbit/s by `tc tbf`; skipped with the reason where
// namespaces cannot be made). The cluster removes what it made, by PID and
// by name, also on failure.
#ifndef PSERVER_BENCH_COMPRESSION_GROUP_H_
#define PSERVER_BENCH_COMPRESSION_GROUP_H_

#include <string>

#include "absl/status/status.h"
#include "harness.h"

namespace pserver::bench {

// `pserver_binary` is the server; `argv0` finds the driver binary
// (bench/compression_link) in the runfiles.
absl::Status CompressionGroup(Harness& h, const std::string& pserver_binary,
                              const std::string& argv0);

}  // namespace pserver::bench

#endif  // PSERVER_BENCH_COMPRESSION_GROUP_H_
