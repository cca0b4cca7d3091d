#include "cc/metrics/metrics.h"

#include <algorithm>
#include <utility>

namespace pserver {
namespace metrics {

Histogram::Histogram(std::vector<uint64_t> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(uint64_t value) {
  // The first bound >= value: buckets are inclusive upper bounds ("le").
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot snapshot;
  snapshot.buckets.resize(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    snapshot.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
    snapshot.count += snapshot.buckets[i];
  }
  snapshot.sum = sum_.load(std::memory_order_relaxed);
  return snapshot;
}

std::vector<uint64_t> LatencyBoundsNanos() {
  constexpr uint64_t kMicro = 1000, kMilli = 1000 * kMicro, kSecond = 1000 * kMilli;
  return {50 * kMicro,  100 * kMicro, 250 * kMicro, 500 * kMicro, 1 * kMilli,
          2500 * kMicro, 5 * kMilli,  10 * kMilli,  25 * kMilli,  50 * kMilli,
          100 * kMilli, 250 * kMilli, 500 * kMilli, 1 * kSecond,  2500 * kMilli,
          5 * kSecond,  10 * kSecond, 30 * kSecond, 60 * kSecond};
}

void Registry::Add(Collector collector) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collector));
}

std::string Registry::Render() const {
  absl::MutexLock lock(&mu_);
  TextWriter out;
  for (const Collector& collector : collectors_) collector(out);
  return out.Take();
}

}  // namespace metrics
}  // namespace pserver
