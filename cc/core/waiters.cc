#include "cc/core/waiters.h"

#include <memory>
#include <utility>

#include "absl/time/clock.h"

namespace pserver {

DeadlineTimer::~DeadlineTimer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    wake_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

uint64_t DeadlineTimer::Schedule(absl::Time when, std::function<void()> fn) {
  if (when == absl::InfiniteFuture()) return 0;
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  queue_.emplace(std::make_pair(when, id), std::move(fn));
  when_.emplace(id, when);
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  wake_.SignalAll();
  return id;
}

bool DeadlineTimer::Cancel(uint64_t id) {
  if (id == 0) return false;
  absl::MutexLock lock(&mu_);
  auto it = when_.find(id);
  if (it == when_.end()) return false;
  queue_.erase(std::make_pair(it->second, id));
  when_.erase(it);
  return true;
}

void DeadlineTimer::Quiesce() {
  absl::MutexLock lock(&mu_);
  while (running_) wake_.Wait(&mu_);
}

size_t DeadlineTimer::scheduled() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

void DeadlineTimer::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    if (queue_.empty()) {
      wake_.Wait(&mu_);
      continue;
    }
    const absl::Time first = queue_.begin()->first.first;
    if (absl::Now() < first) {
      wake_.WaitWithDeadline(&mu_, first);
      continue;
    }
    std::function<void()> fn = std::move(queue_.begin()->second);
    when_.erase(queue_.begin()->first.second);
    queue_.erase(queue_.begin());
    running_ = true;
    mu_.Unlock();
    fn();
    fn = nullptr;  // whatever it captured goes before Quiesce() returns
    mu_.Lock();
    running_ = false;
    wake_.SignalAll();
  }
}

void Completions::Run() {
  // A completion may add more; take them in turns.
  while (!pending_.empty()) {
    std::vector<std::function<void()>> now;
    now.swap(pending_);
    for (std::function<void()>& fn : now) fn();
  }
}

WaitDone BlockingWait::Done() {
  return [this](absl::Status status) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
    done_ = true;
  };
}

absl::Status BlockingWait::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
  return status_;
}

DeadlineTimer& TimerRef::get() {
  if (shared_ != nullptr) return *shared_;
  absl::MutexLock lock(&mu_);
  if (own_ == nullptr) own_ = std::make_unique<DeadlineTimer>();
  return *own_;
}

void TimerRef::Quiesce() {
  DeadlineTimer* timer = shared_;
  if (timer == nullptr) {
    absl::MutexLock lock(&mu_);
    timer = own_.get();
  }
  if (timer != nullptr) timer->Quiesce();
}

}  // namespace pserver
