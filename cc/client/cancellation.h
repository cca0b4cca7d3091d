// Cancellation: ends a blocking client call from another thread.
//
//   Cancellation cancel;
//   CallOptions call;
//   call.cancel = &cancel;
//   std::thread t([&] { status = group.Barrier(BarrierScope::kWorkers, call); });
//   cancel.Cancel();  // e.g. from a Ctrl-C handler's thread
//   t.join();         // status is CANCELLED, promptly
//
// A call given a Cancellation (CallOptions::cancel) checks it before every
// attempt and while it backs off between retries, and every gRPC request it
// has in flight is cancelled (ClientContext::TryCancel) the moment Cancel()
// is called: the call then returns CANCELLED "the call was cancelled".
// Cancelling is one-way and sticky, like a Go context: every later call
// given the same Cancellation ends at once. Requests to in-process servers
// (InProcessTransport) that wait for other workers (barrier, all-reduce,
// broadcast, consistent table reads) hold no thread while they wait and are
// withdrawn the moment Cancel() is called; the others are short and run to
// the end on the caller's thread.
//
// Inside the client, the cancellation of the call running on a thread is
// found through Cancellation::Current(), installed for the call's extent by
// a Cancellation::Scope; transports register their in-flight requests with
// OnCancel.
//
// Thread-safe: Cancel() may be called from any thread, at any time, any
// number of times.
#ifndef PSERVER_CC_CLIENT_CANCELLATION_H_
#define PSERVER_CC_CLIENT_CANCELLATION_H_

#include <cstdint>
#include <functional>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pserver {

class Cancellation {
 public:
  Cancellation() = default;
  Cancellation(const Cancellation&) = delete;
  Cancellation& operator=(const Cancellation&) = delete;

  // Cancels: runs every registered callback (once, on this thread) and
  // wakes every WaitFor. Idempotent.
  void Cancel();
  bool cancelled() const;

  // CANCELLED "the call was cancelled" once cancelled, else OK.
  absl::Status Check() const;

  // Waits up to `timeout` or until cancelled; returns cancelled(). Runs the
  // check (SetCheck) while it waits.
  bool WaitFor(absl::Duration timeout);

  // A check that calls given this Cancellation run on their own thread
  // while they wait (for replies, or between retries): every `every`, and
  // the first time it returns true the call is cancelled, as by Cancel().
  // For bindings whose interrupts can be seen only on the calling thread
  // (Python runs its Ctrl-C handler on the main thread only), so that a call
  // need not move to another thread to stay interruptible. Set it before
  // the calls that use it start; a null `check` removes it.
  void SetCheck(std::function<bool()> check, absl::Duration every);

  // Waits on `mu` (held) until `condition` holds, like mu.Await. With a
  // Current() that has a check, waits in slices of its period and runs the
  // check between them, `mu` released. Returns false if `timeout` passed
  // first (mu.AwaitWithTimeout's meaning).
  static bool Await(absl::Mutex& mu, const absl::Condition& condition,
                    absl::Duration timeout = absl::InfiniteDuration())
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Removes its callback when destroyed or reset. A callback already
  // running on another thread may still be running then: it must hold (by
  // value) whatever it touches.
  class Registration {
   public:
    Registration() = default;
    Registration(Registration&& other) noexcept { *this = std::move(other); }
    Registration& operator=(Registration&& other) noexcept;
    ~Registration() { Reset(); }
    void Reset();

   private:
    friend class Cancellation;
    Registration(Cancellation* owner, uint64_t id) : owner_(owner), id_(id) {}
    Cancellation* owner_ = nullptr;
    uint64_t id_ = 0;
  };

  // Runs `fn` when Cancel() is called; at once (on this thread) when
  // already cancelled. The Cancellation must outlive the Registration.
  [[nodiscard]] Registration OnCancel(std::function<void()> fn);

  // The cancellation of the call running on this thread (null: none).
  static Cancellation* Current();

  // Makes `cancel` this thread's Current() until destroyed (restoring the
  // previous one). A null `cancel` keeps the current one.
  class Scope {
   public:
    explicit Scope(Cancellation* cancel);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Cancellation* previous_;
  };

 private:
  // Runs the check unless cancelled already; cancels when it says so.
  void RunCheck();
  // Await, running `cancel`'s check (null: none).
  static bool AwaitChecking(Cancellation* cancel, absl::Mutex& mu,
                            const absl::Condition& condition, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  std::function<bool()> check_;  // set before the calls: not guarded
  absl::Duration check_every_ = absl::InfiniteDuration();
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_CANCELLATION_H_
