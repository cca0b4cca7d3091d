// Fence: whether this server may still acknowledge a write to its shard.
// It holds its index (/ps/<i>) under an etcd lease; while the lease lives
// nobody else can hold the index. etcd counts the lease's TTL from when it
// received a renewal, so the last renewal etcd granted, sent at `sent`
// (CLOCK_BOOTTIME, which also counts time the process was stopped), proves
// the index ours until sent + TTL. The fence takes a margin off that
// (FenceOptions::margin_fraction of the TTL) and past it treats the server
// as unconfirmed: every write is refused with UNAVAILABLE naming why, and
// `on_unconfirmed` asks the server to re-check etcd (/shards/<i>). A server
// that finds another holder or a newer epoch there steps down for good:
// StepDown, after which every call but the stats is refused
// (docs/replication.md).
//
//   FenceOptions options;
//   options.shard = 3;
//   options.renewal = [&] { return registration->LastRenewal(); };
//   options.on_unconfirmed = [&] { recheck.Notify(); };
//   Fence fence(std::move(options));
//   PS_RETURN_IF_ERROR(fence.CheckWrite());  // before applying a write
//   ... apply ...
//   PS_RETURN_IF_ERROR(fence.CheckWrite());  // and again before acknowledging it
//
// What it cannot close: a pause after the last check and before the reply
// leaves the process (the write was applied while the lease was confirmed).
//
// Thread-safe. The fast path (confirmed) is one clock read and one atomic
// load.
#ifndef PSERVER_CC_SERVER_FENCE_H_
#define PSERVER_CC_SERVER_FENCE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cc/core/boot_clock.h"
#include "cc/etcd/etcd_client.h"

namespace pserver {

struct FenceOptions {
  uint32_t shard = 0;  // named in messages
  // Taken off the TTL: a renewal sent at `sent` confirms the index until
  // sent + ttl * (1 - margin_fraction). In [0, 1).
  double margin_fraction = 0.25;
  // The clock renewals are sent on (tests inject one).
  std::function<absl::Duration()> now = BootClockNow;
  // The last renewal etcd granted of the lease the index is held under;
  // nullopt when there is none (lost). Asked only when the last one known
  // no longer confirms the index.
  std::function<std::optional<LeaseRenewal>()> renewal;
  // Called (on the calling thread; keep it short) whenever a write is
  // refused for want of confirmation: the server re-checks etcd.
  std::function<void()> on_unconfirmed;
};

class Fence {
 public:
  explicit Fence(FenceOptions options);
  Fence(const Fence&) = delete;
  Fence& operator=(const Fence&) = delete;

  // OK while the index is confirmed; UNAVAILABLE otherwise: "lease for
  // /ps/<i> not confirmed for N s (...); another server may hold shard <i>",
  // or the step-down message.
  absl::Status CheckWrite();
  // OK unless stepped down (then UNAVAILABLE with the step-down message).
  absl::Status CheckServing() const;
  // Whether the index is confirmed now (asks `renewal` if needed).
  bool Confirmed();

  // Steps down for good: every later check fails with a message naming
  // `reason`. True for the call that stepped down, false if it had already.
  bool StepDown(const std::string& reason);
  bool stepped_down() const { return stepped_down_.load(std::memory_order_acquire); }
  // The message every refused call gets once stepped down ("" before).
  std::string step_down_message() const;

 private:
  // Takes the latest renewal from options_.renewal; true if it confirms `now`.
  bool Refresh(absl::Duration now);
  absl::Status Unconfirmed(absl::Duration now);

  const FenceOptions options_;
  // Boot-clock nanoseconds until which the index is confirmed; 0: never was.
  std::atomic<int64_t> confirmed_until_ns_{0};
  std::atomic<bool> stepped_down_{false};
  mutable absl::Mutex mu_;
  std::optional<LeaseRenewal> last_ ABSL_GUARDED_BY(mu_);
  std::string step_down_message_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_FENCE_H_
