// Waiters: what the core's waiting calls (barriers, all-reduces, broadcasts,
// consistent table reads) need so that a waiting caller holds no thread.
//
// A waiting call registers a completion callback and returns at once; the
// callback runs exactly once, on whichever thread completes the wait (the
// caller that completes a round, a clock change, the DeadlineTimer's thread
// at the deadline, or the thread that cancels). The call returns a
// CancelWait: calling it completes a wait that is still pending with
// CANCELLED and frees what it holds at once.
//
//   DeadlineTimer timer;  // one thread for every deadline of a server
//   uint64_t id = timer.Schedule(absl::Now() + absl::Seconds(5), [] { ... });
//   timer.Cancel(id);     // false if it already ran (or is running)
//
// Thread-safe: every method of DeadlineTimer and Completions may be called
// from any thread.
#ifndef PSERVER_CC_CORE_WAITERS_H_
#define PSERVER_CC_CORE_WAITERS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pserver {

// Completes a waiting call: runs once with its result.
using WaitDone = std::function<void(absl::Status)>;
// Cancels a waiting call (CANCELLED, its buffers freed). A no-op once the
// call has completed; may be called more than once and from any thread.
using CancelWait = std::function<void()>;

// Runs callbacks at their deadlines on one thread of its own, started on the
// first Schedule and joined by the destructor (pending callbacks are dropped).
class DeadlineTimer {
 public:
  DeadlineTimer() = default;
  ~DeadlineTimer();
  DeadlineTimer(const DeadlineTimer&) = delete;
  DeadlineTimer& operator=(const DeadlineTimer&) = delete;

  // Runs `fn` at `when` (at once, on the timer's thread, if it has passed).
  // Returns an id for Cancel; 0 (and `fn` never runs) for an infinite
  // deadline.
  uint64_t Schedule(absl::Time when, std::function<void()> fn);

  // Drops the callback `id` if it has not started; true if it was dropped.
  bool Cancel(uint64_t id);

  // Returns once no callback is running. After every callback of an owner
  // has been cancelled, Quiesce() makes sure none of them still runs, so the
  // owner can be destroyed. Never call it from a callback.
  void Quiesce();

  size_t scheduled() const;  // callbacks waiting for their deadline

 private:
  void Loop();

  mutable absl::Mutex mu_;
  absl::CondVar wake_;
  std::map<std::pair<absl::Time, uint64_t>, std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, absl::Time> when_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // a callback runs now
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // started under mu_ by the first Schedule
};

// Completions collected under a lock and run once it is released: when
// Run() is called or the object is destroyed, in the order added.
class Completions {
 public:
  Completions() = default;
  ~Completions() { Run(); }
  Completions(const Completions&) = delete;
  Completions& operator=(const Completions&) = delete;

  void Add(std::function<void()> fn) { pending_.push_back(std::move(fn)); }
  void Run();

 private:
  std::vector<std::function<void()>> pending_;
};

// Turns an asynchronous wait back into a blocking one, on the caller's own
// thread: pass Done() to the asynchronous call, then Wait().
class BlockingWait {
 public:
  WaitDone Done();
  absl::Status Wait();

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// Where a class's waits get their deadlines: the timer passed in (shared by a
// server's tables and collectives), or one of its own made on first use.
class TimerRef {
 public:
  explicit TimerRef(DeadlineTimer* shared) : shared_(shared) {}
  DeadlineTimer& get();
  // Quiesces the timer in use, if any (see DeadlineTimer::Quiesce).
  void Quiesce();

 private:
  DeadlineTimer* const shared_;
  absl::Mutex mu_;
  std::unique_ptr<DeadlineTimer> own_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pserver

#endif  // PSERVER_CC_CORE_WAITERS_H_
