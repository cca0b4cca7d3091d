// WorkerClocks: the logical clocks of the workers of one table, for stale
// synchronous parallel (SSP) and bulk synchronous (BSP) training.
//
// Each worker joins, then ticks its clock once per iteration. Before reading
// at clock c with staleness s, a worker waits until every registered worker
// has reached clock c - s (s = 0 is BSP). A worker that joins late starts at
// the current minimum clock, so it neither holds the others back nor lets
// them run ahead of it.
//
//   WorkerClocks clocks("embeddings");
//   PS_ASSIGN_OR_RETURN(int64_t c, clocks.Join("w0"));
//   ...                                         // compute, push gradients
//   PS_ASSIGN_OR_RETURN(c, clocks.Tick("w0"));
//   PS_RETURN_IF_ERROR(clocks.WaitUntilAll(c - staleness,
//                                          absl::Now() + absl::Seconds(30)));
//
// Errors: an empty worker id is INVALID_ARGUMENT; a worker that has not joined
// is NOT_FOUND "worker 'w' has not joined table 't'"; a wait that runs out is
// DEADLINE_EXCEEDED naming the workers behind with their clocks; any wait
// after Shutdown() is UNAVAILABLE "server shutting down". A call that fails
// changes nothing. Join, Leave, Tick and Restore still work after Shutdown
// (a final checkpoint may want the clocks); only waiting is refused.
//
// Waiting holds no thread: WaitUntilAllAsync registers a callback that runs
// on the thread whose Tick, Leave or Restore lets it through (after the
// clocks' lock is released; a caller may collect these completions in a
// Completions of its own to run them later, e.g. after its own lock), on the
// deadline timer's thread, or on the thread that cancels it.
//
// Thread-safe: every method may be called from any thread; a blocked
// WaitUntilAll does not hold up the other methods.
#ifndef PSERVER_CC_CORE_WORKER_CLOCKS_H_
#define PSERVER_CC_CORE_WORKER_CLOCKS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cc/core/waiters.h"

namespace pserver {

class WorkerClocks {
 public:
  // Workers registered at once, by default (--max_workers_per_table).
  static constexpr size_t kDefaultMaxWorkers = 16384;

  // `table` only names the table in error messages. `timer` runs the
  // deadlines of waits (null: a timer of its own); it must outlive this.
  // `max_workers`: workers registered at once (>= 1).
  WorkerClocks() : WorkerClocks(std::string()) {}
  explicit WorkerClocks(std::string table, DeadlineTimer* timer = nullptr,
                        size_t max_workers = kDefaultMaxWorkers)
      : table_(std::move(table)), max_workers_(max_workers), timer_(timer) {}
  ~WorkerClocks();
  WorkerClocks(const WorkerClocks&) = delete;
  WorkerClocks& operator=(const WorkerClocks&) = delete;

  // Registers `worker` at the current minimum clock of the registered workers
  // (0 when there are none) and returns its clock. Joining again returns its
  // current clock and changes nothing. INVALID_ARGUMENT for an empty id or
  // one longer than kMaxNameBytes (1024); RESOURCE_EXHAUSTED naming
  // --max_workers_per_table when `max_workers` are registered already.
  absl::StatusOr<int64_t> Join(absl::string_view worker);

  // Unregisters `worker`; waiters see the new minimum (which may rise).
  // NOT_FOUND naming the worker if it has not joined.
  // `released`: where the waits this lets through are completed (null: at
  // once, after the lock is released); likewise for Tick and Restore.
  absl::Status Leave(absl::string_view worker, Completions* released = nullptr);

  // Advances the worker's clock by one and returns the new clock; wakes
  // waiters. NOT_FOUND if the worker has not joined.
  absl::StatusOr<int64_t> Tick(absl::string_view worker, Completions* released = nullptr);

  // The worker's clock; NOT_FOUND if it has not joined.
  absl::StatusOr<int64_t> ClockOf(absl::string_view worker) const;

  // Returns OK once every registered worker's clock is >= `target`: at once
  // when no worker is registered or target <= MinClock(), and also when the
  // last laggards leave. At `deadline`: DEADLINE_EXCEEDED naming the workers
  // behind, slowest first, e.g. "waited 2s for every worker to reach clock 5;
  // behind: w3 at clock 2, w1 at clock 4" (at most 10, then "and N more").
  // After Shutdown(): UNAVAILABLE.
  absl::Status WaitUntilAll(int64_t target, absl::Time deadline);

  // WaitUntilAll without a thread: `done` gets its result (possibly before
  // this returns). The CancelWait completes a wait still pending with
  // CANCELLED; it must not be called after the WorkerClocks is destroyed.
  CancelWait WaitUntilAllAsync(int64_t target, absl::Time deadline, WaitDone done);

  int64_t MinClock() const;  // -1 when no worker is registered
  size_t size() const;       // registered workers
  size_t waiting() const;    // callers waiting (WaitUntilAll or its async form) now
  std::vector<std::pair<std::string, int64_t>> Workers() const;  // sorted by id

  // Checkpoint payload: a serialized v1::WorkerClocksSnapshot.
  std::string Serialize() const;

  // Replaces the workers and clocks with the snapshot's and wakes waiters.
  // DATA_LOSS for bytes that do not parse; INVALID_ARGUMENT for a snapshot
  // with an empty or repeated worker id or a negative clock. Nothing changes
  // when it fails.
  absl::Status Restore(absl::string_view bytes, Completions* released = nullptr);

  // Wakes every waiter with UNAVAILABLE "server shutting down"; later waits
  // fail the same way. Idempotent.
  void Shutdown();

 private:
  absl::Status NotJoined(absl::string_view worker) const;
  void AddClock(int64_t clock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveClock(int64_t clock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t MinClockLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Moves the waits that may now complete into `released`.
  void Release(Completions& released) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives up wait `id` (deadline or cancellation); a no-op if it completed.
  void GiveUp(uint64_t id, bool cancelled);
  std::string Behind(int64_t target, absl::Duration waited) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  struct Waiter {
    int64_t target = 0;
    absl::Time start;
    uint64_t timer = 0;
    WaitDone done;
  };

  const std::string table_;
  const size_t max_workers_;
  mutable absl::Mutex mu_;
  std::map<std::string, int64_t, std::less<>> clocks_ ABSL_GUARDED_BY(mu_);
  // How many workers are at each clock: its first key is the minimum.
  std::map<int64_t, size_t> clock_counts_ ABSL_GUARDED_BY(mu_);
  // Waits by id, and their ids by target clock (lowest first).
  std::map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  std::multimap<int64_t, uint64_t> by_target_ ABSL_GUARDED_BY(mu_);
  uint64_t next_waiter_ ABSL_GUARDED_BY(mu_) = 1;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  TimerRef timer_;
};

}  // namespace pserver

#endif  // PSERVER_CC_CORE_WORKER_CLOCKS_H_
