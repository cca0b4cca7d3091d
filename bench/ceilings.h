// The ceilings a parameter server's data path is compared with, measured by
// the benchmark itself on this machine: memory copy, a raw TCP stream over
// loopback (as this harness always did, and the way iperf3 does: large
// socket buffers, 1 MiB writes, several seconds; and iperf3 itself when it is
// installed), and a raw gRPC bytes echo with default settings.
//
// Each function runs one repetition and returns bytes per second.
#ifndef PSERVER_BENCH_CEILINGS_H_
#define PSERVER_BENCH_CEILINGS_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace pserver::bench {

// memcpy of `bytes` (pre-touched buffers), `rounds` times: bytes copied / s.
double MemcpyBandwidth(size_t bytes, int rounds);

// A reader thread drains a loopback TCP connection while this thread writes
// `total` bytes in `write_size` writes: bytes / s.
absl::StatusOr<double> SocketStreamBandwidth(size_t total, size_t write_size);

// The same stream measured the way iperf3 does: SO_SNDBUF and SO_RCVBUF set to
// `buffer_bytes` on both ends, `write_size` writes for `seconds` (the writer
// stops then; bounded), bytes received / s from the first write to EOF.
absl::StatusOr<double> SocketStreamBandwidthFor(double seconds, size_t write_size,
                                                int buffer_bytes);

// iperf3 itself: a one-off `iperf3 -s` on 127.0.0.1 and a free port, and
// `iperf3 -c ... -t seconds -J` against it (both stopped by PID at a
// deadline); bits received / 8 / s. NOT_FOUND when iperf3 is not installed.
absl::StatusOr<double> Iperf3Bandwidth(double seconds);

// A gRPC server on 127.0.0.1 whose one generic method echoes its request.
class GrpcEcho {
 public:
  static absl::StatusOr<std::unique_ptr<GrpcEcho>> Start();
  ~GrpcEcho();
  // `calls` sequential echoes of `bytes`: payload bytes (one way) / s.
  absl::StatusOr<double> Bandwidth(size_t bytes, int calls);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pserver::bench

#endif  // PSERVER_BENCH_CEILINGS_H_
