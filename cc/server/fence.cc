#include "cc/server/fence.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/etcd/keys.h"

namespace pserver {

Fence::Fence(FenceOptions options) : options_(std::move(options)) {}

bool Fence::Refresh(absl::Duration now) {
  std::optional<LeaseRenewal> renewal;
  if (options_.renewal) renewal = options_.renewal();
  if (!renewal.has_value()) return false;
  const absl::Duration until =
      renewal->sent + renewal->ttl - renewal->ttl * options_.margin_fraction;
  {
    absl::MutexLock lock(&mu_);
    if (!last_.has_value() || renewal->sent >= last_->sent) last_ = renewal;
  }
  // Only ever forward: a renewal read late must not shorten what a newer
  // one proved.
  const int64_t until_ns = absl::ToInt64Nanoseconds(until);
  int64_t seen = confirmed_until_ns_.load(std::memory_order_relaxed);
  while (until_ns > seen &&
         !confirmed_until_ns_.compare_exchange_weak(seen, until_ns, std::memory_order_release,
                                                    std::memory_order_relaxed)) {
  }
  return now < until;
}

bool Fence::Confirmed() {
  if (stepped_down()) return false;
  const absl::Duration now = options_.now();
  if (absl::ToInt64Nanoseconds(now) < confirmed_until_ns_.load(std::memory_order_acquire)) {
    return true;
  }
  return Refresh(now);
}

absl::Status Fence::CheckWrite() {
  if (stepped_down()) return CheckServing();
  const absl::Duration now = options_.now();
  if (absl::ToInt64Nanoseconds(now) < confirmed_until_ns_.load(std::memory_order_acquire)) {
    return absl::OkStatus();
  }
  if (Refresh(now)) return absl::OkStatus();
  return Unconfirmed(now);
}

absl::Status Fence::Unconfirmed(absl::Duration now) {
  if (options_.on_unconfirmed) options_.on_unconfirmed();
  std::optional<LeaseRenewal> last;
  {
    absl::MutexLock lock(&mu_);
    last = last_;
  }
  const std::string key = etcd_keys::ServerKey(options_.shard);
  std::string why;
  if (last.has_value()) {
    why = absl::StrCat("lease for ", key, " not confirmed for ",
                       absl::FormatDuration(absl::Trunc(now - last->sent, absl::Milliseconds(1))),
                       " (the last renewal etcd granted was sent then, TTL ",
                       absl::FormatDuration(last->ttl), ")");
  } else {
    why = absl::StrCat("lease for ", key, " not confirmed: etcd granted no renewal yet");
  }
  return absl::UnavailableError(
      absl::StrCat(why, "; another server may hold shard ", options_.shard, "; retry"));
}

absl::Status Fence::CheckServing() const {
  if (!stepped_down()) return absl::OkStatus();
  return absl::UnavailableError(step_down_message());
}

bool Fence::StepDown(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (stepped_down_.load(std::memory_order_relaxed)) return false;
  step_down_message_ = absl::StrCat("this server stepped down from shard ", options_.shard, ": ",
                                    reason, "; it acknowledges nothing more");
  stepped_down_.store(true, std::memory_order_release);
  return true;
}

std::string Fence::step_down_message() const {
  absl::MutexLock lock(&mu_);
  return step_down_message_;
}

}  // namespace pserver
