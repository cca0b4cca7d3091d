// ReplyBudget: a server-wide bound on the bytes of replies built but not yet
// sent. A client that asks for large replies and never reads them (or reads
// them slowly) otherwise makes the server hold every reply in memory.
//
//   ReplyBudget budget(/*limit=*/1 << 30);
//   if (absl::Status s = budget.Acquire(reply_bytes); !s.ok()) return s;
//   ...                                  // the reply is sent
//   budget.Release(reply_bytes);         // in the call's OnDone
//
// Thread-safe.
#ifndef PSERVER_CC_SERVER_REPLY_BUDGET_H_
#define PSERVER_CC_SERVER_REPLY_BUDGET_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"

namespace pserver {

// What a budget's errors call its bytes and its flag (the defaults: replies).
struct BudgetNames {
  const char* one = "reply";  // "a reply of N bytes is larger than ..."
  const char* many = "replies";
  const char* held = "bytes of replies not yet read by their clients";
  const char* flag = "--max_reply_bytes_in_flight";
  const char* advice = "read fewer blocks per call";
};

class ReplyBudget {
 public:
  explicit ReplyBudget(uint64_t limit, BudgetNames names = {}) : limit_(limit), names_(names) {}

  // Takes `bytes` from the budget. When that would hold more than the limit
  // nothing is taken, and the error names the limit, the bytes held and the
  // flag: UNAVAILABLE ("retry later", which clients retry with backoff) while
  // other replies hold the room, RESOURCE_EXHAUSTED for a reply larger than
  // the whole limit (it can never fit).
  absl::Status Acquire(uint64_t bytes);
  // Returns what an Acquire took.
  void Release(uint64_t bytes) { held_.fetch_sub(bytes, std::memory_order_acq_rel); }

  // False when the budget is already spent: a read need not even be built.
  bool Available() const { return held() < limit_; }
  // Counts a refusal and returns its error (as Acquire's) for a reply of
  // `bytes` (0: not yet built).
  absl::Status Exhausted(uint64_t bytes);

  uint64_t limit() const { return limit_; }
  uint64_t held() const { return held_.load(std::memory_order_acquire); }
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  const uint64_t limit_;
  const BudgetNames names_;
  std::atomic<uint64_t> held_{0};
  std::atomic<uint64_t> refused_{0};
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_REPLY_BUDGET_H_
