// StepTrainer: a thread that runs training steps one after another, for
// tests that train while something happens to the cluster (a live move, a
// kill). Each step is the caller's function of the step number; the
// trainer counts the steps acknowledged and stops at the first error.
//
//   StepTrainer trainer([&](int step) { return client->SendGrads(Grads(step)); });
//   ASSERT_TRUE(trainer.Advance(3)) << trainer.Stop();
//   ...
//   ASSERT_OK(trainer.Stop());
//   const int steps = trainer.steps();  // the model holds steps 0 .. steps-1
#ifndef PSERVER_TESTS_STEP_TRAINER_H_
#define PSERVER_TESTS_STEP_TRAINER_H_

#include <functional>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pserver {

class StepTrainer {
 public:
  // Runs step(first_step), step(first_step + 1), ... on a thread of its own.
  explicit StepTrainer(std::function<absl::Status(int step)> step, int first_step = 0)
      : step_(std::move(step)), steps_(first_step) {
    thread_ = std::thread([this] { Run(); });
  }
  StepTrainer(const StepTrainer&) = delete;
  StepTrainer& operator=(const StepTrainer&) = delete;
  ~StepTrainer() { Stop().IgnoreError(); }

  // The steps acknowledged, counting from 0.
  int steps() const {
    absl::MutexLock lock(&mu_);
    return steps_;
  }
  // Waits until `n` more steps than now are acknowledged; false after
  // `timeout` or an error.
  bool Advance(int n, absl::Duration timeout = absl::Seconds(90)) {
    absl::MutexLock lock(&mu_);
    const int target = steps_ + n;
    auto reached = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return steps_ >= target || !error_.ok();
    };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout) && error_.ok();
  }
  // Stops after the step under way; its error, if any.
  absl::Status Stop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
    absl::MutexLock lock(&mu_);
    return error_;
  }

 private:
  void Run() {
    for (int i = 0; i < 1000000; ++i) {
      int step = 0;
      {
        absl::MutexLock lock(&mu_);
        if (stop_) return;
        step = steps_;
      }
      absl::Status status = step_(step);
      absl::MutexLock lock(&mu_);
      if (!status.ok()) {
        error_ = status;
        return;
      }
      ++steps_;
    }
  }

  const std::function<absl::Status(int step)> step_;
  mutable absl::Mutex mu_;
  int steps_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace pserver

#endif  // PSERVER_TESTS_STEP_TRAINER_H_
