// RequestMetrics: per-operation counts, errors, bytes and latency of a
// server's requests, recorded by the Dispatcher (so both faces, gRPC and
// in-process, count alike) and written at scrape time as
//
//   pserver_requests_total{method}            requests answered
//   pserver_request_errors_total{method}      of them, answered with an error
//   pserver_request_received_bytes_total{method}  request payload bytes
//   pserver_request_sent_bytes_total{method}  reply payload bytes
//   pserver_request_duration_seconds{method}  histogram, receipt to answer
//
// `method` is the control method's name ("TablePush", "Barrier", ...), or
// "Push" / "Read" for bulk pushes and reads (SendGrads, GetParams, PushPull
// over gRPC or the bulk channel). Bytes are those of the protobuf messages
// for control methods and of tensor contents for bulk ones.
//
// Recording is a few relaxed atomic adds: no lock. Operations are added at
// construction only; thread-safe after that.
#ifndef PSERVER_CC_SERVER_REQUEST_METRICS_H_
#define PSERVER_CC_SERVER_REQUEST_METRICS_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "cc/metrics/metrics.h"

namespace pserver {

struct OpMetrics {
  using Clock = std::chrono::steady_clock;

  metrics::Counter calls;
  metrics::Counter errors;
  metrics::Counter received_bytes;
  metrics::Counter sent_bytes;
  metrics::Histogram latency{metrics::LatencyBoundsNanos()};

  // Counts one answered request that started at `start`.
  void Finish(const absl::Status& status, Clock::time_point start, uint64_t sent = 0) {
    calls.Add();
    if (!status.ok()) errors.Add();
    if (sent != 0) sent_bytes.Add(sent);
    latency.Observe(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count()));
  }
};

class RequestMetrics {
 public:
  // The metrics of `method`, created on first use; call while setting up
  // only (the map is not locked).
  OpMetrics* Add(const std::string& method);
  // The families above, one sample (or histogram) per method.
  void Collect(metrics::TextWriter& out) const;
  // `method`'s metrics; null if never added.
  const OpMetrics* Find(const std::string& method) const;

 private:
  std::map<std::string, std::unique_ptr<OpMetrics>> ops_;
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_REQUEST_METRICS_H_
