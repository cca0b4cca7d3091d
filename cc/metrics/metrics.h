// Metrics a process exports in Prometheus's text format: counters and
// histograms cheap enough for every request (relaxed atomics, no lock per
// call), a writer of the text exposition format (text_format.h) and a
// registry of collectors that write them at scrape time.
//
//   metrics::Counter pushes;
//   metrics::Histogram latency(metrics::LatencyBoundsNanos());
//   pushes.Add();
//   latency.Observe(elapsed_nanos);
//
//   metrics::Registry registry;
//   registry.Add([&](metrics::TextWriter& out) {
//     out.Family("pserver_pushes_total", "Pushes applied.", metrics::Type::kCounter);
//     out.Sample("pserver_pushes_total", {}, pushes.value());
//   });
//   std::string text = registry.Render();
//
// Counter and Histogram are thread-safe and lock-free. A histogram read while
// it is observed may be off by the observations in flight, never torn: its
// count is the sum of the buckets read, so _count equals the +Inf bucket.
// A Registry is thread-safe; its collectors run one scrape at a time.
#ifndef PSERVER_CC_METRICS_METRICS_H_
#define PSERVER_CC_METRICS_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "cc/metrics/text_format.h"

namespace pserver {
namespace metrics {

class Counter {
 public:
  void Add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// Observations are integers (e.g. nanoseconds); TextWriter::Histogram scales
// them into the exported unit (e.g. / 1e9 for seconds).
class Histogram {
 public:
  // `bounds`: the buckets' inclusive upper bounds, strictly ascending; a
  // last +Inf bucket is implied.
  explicit Histogram(std::vector<uint64_t> bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  void Observe(uint64_t value);

  struct Snapshot {
    std::vector<uint64_t> buckets;  // per bucket (not cumulative); bounds().size() + 1
    uint64_t count = 0;             // the sum of buckets
    uint64_t sum = 0;
  };
  Snapshot Read() const;
  absl::Span<const uint64_t> bounds() const { return bounds_; }

 private:
  const std::vector<uint64_t> bounds_;
  const std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<uint64_t> sum_{0};
};

// Request latency buckets, in nanoseconds: 50 us to 60 s.
std::vector<uint64_t> LatencyBoundsNanos();

class Registry {
 public:
  using Collector = std::function<void(TextWriter&)>;

  // Collectors run in the order added, at every Render.
  void Add(Collector collector);
  // Every collector's families, in the text exposition format (version 0.0.4).
  std::string Render() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<Collector> collectors_ ABSL_GUARDED_BY(mu_);
};

}  // namespace metrics
}  // namespace pserver

#endif  // PSERVER_CC_METRICS_METRICS_H_
