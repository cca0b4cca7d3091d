#include "cc/client/executor.h"

#include <algorithm>
#include <utility>

namespace pserver {

Executor::Executor(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Loop(); });
}

Executor::~Executor() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& thread : threads_) thread.join();
}

void Executor::Schedule(std::function<void()> closure) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(closure));
}

void Executor::Loop() {
  while (true) {
    std::function<void()> closure;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Executor* e)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) { return e->stopping_ || !e->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // stopping, and nothing left to run
      closure = std::move(queue_.front());
      queue_.pop_front();
    }
    closure();
  }
}

}  // namespace pserver
