#include "cc/client/cancellation.h"

#include <algorithm>
#include <utility>

namespace pserver {
namespace {
thread_local Cancellation* current_cancellation = nullptr;
}  // namespace

void Cancellation::Cancel() {
  std::map<uint64_t, std::function<void()>> callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return;
    cancelled_ = true;
    callbacks.swap(callbacks_);
  }
  // Outside the lock: a callback may complete a call whose completion
  // removes its own registration.
  for (auto& [id, fn] : callbacks) fn();
}

bool Cancellation::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

absl::Status Cancellation::Check() const {
  return cancelled() ? absl::CancelledError("the call was cancelled") : absl::OkStatus();
}

bool Cancellation::WaitFor(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  AwaitChecking(this, mu_, absl::Condition(&cancelled_), timeout);
  return cancelled_;
}

void Cancellation::SetCheck(std::function<bool()> check, absl::Duration every) {
  check_ = std::move(check);
  check_every_ = check_ ? std::max(every, absl::Milliseconds(1)) : absl::InfiniteDuration();
}

void Cancellation::RunCheck() {
  if (!cancelled() && check_()) Cancel();
}

bool Cancellation::Await(absl::Mutex& mu, const absl::Condition& condition,
                         absl::Duration timeout) {
  return AwaitChecking(Current(), mu, condition, timeout);
}

bool Cancellation::AwaitChecking(Cancellation* cancel, absl::Mutex& mu,
                                 const absl::Condition& condition, absl::Duration timeout) {
  if (cancel == nullptr || !cancel->check_) return mu.AwaitWithTimeout(condition, timeout);
  const absl::Time end = absl::Now() + timeout;
  while (!mu.AwaitWithTimeout(condition, std::min(cancel->check_every_, end - absl::Now()))) {
    // Unlocked: the check may take its time, and cancelling completes calls
    // whose callbacks take `mu`. It runs also when the wait ends by its
    // timeout, so that a caller waiting in slices shorter than check_every_
    // (Client's retry wait) still has it run once per slice.
    mu.Unlock();
    cancel->RunCheck();
    mu.Lock();
    if (absl::Now() >= end) return condition.Eval();
  }
  return true;
}

Cancellation::Registration Cancellation::OnCancel(std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    if (!cancelled_) {
      const uint64_t id = next_id_++;
      callbacks_.emplace(id, std::move(fn));
      return Registration(this, id);
    }
  }
  fn();
  return Registration();
}

Cancellation::Registration& Cancellation::Registration::operator=(Registration&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = std::exchange(other.owner_, nullptr);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

void Cancellation::Registration::Reset() {
  if (owner_ == nullptr) return;
  std::function<void()> fn;  // destroyed outside the lock
  {
    absl::MutexLock lock(&owner_->mu_);
    auto it = owner_->callbacks_.find(id_);
    if (it != owner_->callbacks_.end()) {
      fn = std::move(it->second);
      owner_->callbacks_.erase(it);
    }
  }
  owner_ = nullptr;
  id_ = 0;
}

Cancellation* Cancellation::Current() { return current_cancellation; }

Cancellation::Scope::Scope(Cancellation* cancel) : previous_(current_cancellation) {
  if (cancel != nullptr) current_cancellation = cancel;
}

Cancellation::Scope::~Scope() { current_cancellation = previous_; }

}  // namespace pserver
