#include "cc/server/reply_budget.h"

#include "absl/strings/str_cat.h"

namespace pserver {

absl::Status ReplyBudget::Exhausted(uint64_t bytes) {
  refused_.fetch_add(1, std::memory_order_relaxed);
  if (bytes > limit_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a ", names_.one, " of ", bytes, " bytes is larger than the server's whole ",
                     "budget for ", names_.many, " in flight (", names_.flag, "=", limit_, "); ",
                     names_.advice));
  }
  // Transient: the room frees as the others are done.
  return absl::UnavailableError(absl::StrCat(
      "the server holds ", held(), " ", names_.held, " (limit ", limit_, ", ", names_.flag, ")",
      bytes > 0 ? absl::StrCat("; this one needs ", bytes) : std::string(), "; retry later"));
}

absl::Status ReplyBudget::Acquire(uint64_t bytes) {
  uint64_t held = held_.load(std::memory_order_acquire);
  do {
    if (bytes > limit_ || held > limit_ - bytes) return Exhausted(bytes);
  } while (!held_.compare_exchange_weak(held, held + bytes, std::memory_order_acq_rel));
  return absl::OkStatus();
}

}  // namespace pserver
