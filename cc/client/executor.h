// Executor: a fixed set of threads that run queued closures, first in first
// out: where a client's asynchronous calls run.
//
//   Executor executor(/*threads=*/4);
//   executor.Schedule([] { ... });
//
// Thread-safe. The destructor runs every closure still queued, then joins
// the threads.
#ifndef PSERVER_CC_CLIENT_EXECUTOR_H_
#define PSERVER_CC_CLIENT_EXECUTOR_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace pserver {

class Executor {
 public:
  explicit Executor(int threads);  // at least 1 thread
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void Schedule(std::function<void()> closure);

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_EXECUTOR_H_
