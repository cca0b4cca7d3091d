// The timeout poll(2) takes to wait until `deadline`: milliseconds from now,
// at least 0, at most about 12 days. Pure, thread-safe.
#ifndef PSERVER_CC_METRICS_POLL_DEADLINE_H_
#define PSERVER_CC_METRICS_POLL_DEADLINE_H_

#include <algorithm>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pserver {
namespace metrics {

inline int PollMillisUntil(absl::Time deadline) {
  const int64_t millis = absl::ToInt64Milliseconds(deadline - absl::Now());
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(millis, int64_t{1} << 30)));
}

}  // namespace metrics
}  // namespace pserver

#endif  // PSERVER_CC_METRICS_POLL_DEADLINE_H_
