// The ceilings a parameter server's data path is compared with, measured by
// the benchmark itself on this machine: memory copy, a raw TCP stream over
// loopback, and a raw gRPC bytes echo with default settings.
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
