#include "cc/core/worker_clocks.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/core/names.h"
#include "pserver/v1/table.pb.h"

namespace pserver {
namespace {

constexpr size_t kMaxListed = 10;  // laggards named in a deadline message

absl::Status ShuttingDown() { return absl::UnavailableError("server shutting down"); }

}  // namespace

absl::Status WorkerClocks::NotJoined(absl::string_view worker) const {
  return absl::NotFoundError(absl::StrCat(
      "worker '", worker, "' has not joined ",
      table_.empty() ? std::string("this table") : absl::StrCat("table '", table_, "'")));
}

void WorkerClocks::AddClock(int64_t clock) { ++clock_counts_[clock]; }

void WorkerClocks::RemoveClock(int64_t clock) {
  auto it = clock_counts_.find(clock);
  if (it != clock_counts_.end() && --it->second == 0) clock_counts_.erase(it);
}

int64_t WorkerClocks::MinClockLocked() const {
  return clock_counts_.empty() ? -1 : clock_counts_.begin()->first;
}

WorkerClocks::~WorkerClocks() {
  Shutdown();
  // A deadline callback already started may still be about to look us up.
  timer_.Quiesce();
}

absl::StatusOr<int64_t> WorkerClocks::Join(absl::string_view worker) {
  if (worker.empty()) return absl::InvalidArgumentError("worker id is empty");
  if (worker.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("worker id of ", worker.size(),
                                                   " bytes is longer than ", kMaxNameBytes));
  }
  absl::MutexLock lock(&mu_);
  auto it = clocks_.find(worker);
  if (it != clocks_.end()) return it->second;
  if (clocks_.size() >= max_workers_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        table_.empty() ? std::string("this table") : absl::StrCat("table '", table_, "'"),
        " has ", clocks_.size(), " workers joined, the most --max_workers_per_table allows; ",
        "one must leave before another joins"));
  }
  // Joining at the minimum (or at 0 with nobody registered, when every wait
  // has been let through already) holds no waiter back.
  const int64_t clock = std::max<int64_t>(MinClockLocked(), 0);
  clocks_.emplace(std::string(worker), clock);
  AddClock(clock);
  return clock;
}

absl::Status WorkerClocks::Leave(absl::string_view worker, Completions* released) {
  Completions local;  // declared before the lock: runs after it is released
  absl::MutexLock lock(&mu_);
  auto it = clocks_.find(worker);
  if (it == clocks_.end()) return NotJoined(worker);
  RemoveClock(it->second);
  clocks_.erase(it);
  Release(released != nullptr ? *released : local);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> WorkerClocks::Tick(absl::string_view worker, Completions* released) {
  Completions local;  // declared before the lock: runs after it is released
  absl::MutexLock lock(&mu_);
  auto it = clocks_.find(worker);
  if (it == clocks_.end()) return NotJoined(worker);
  if (it->second == std::numeric_limits<int64_t>::max()) {
    return absl::OutOfRangeError(
        absl::StrCat("worker '", worker, "' is at the largest clock there is"));
  }
  RemoveClock(it->second);
  ++it->second;
  AddClock(it->second);
  Release(released != nullptr ? *released : local);
  return it->second;
}

absl::StatusOr<int64_t> WorkerClocks::ClockOf(absl::string_view worker) const {
  absl::MutexLock lock(&mu_);
  auto it = clocks_.find(worker);
  if (it == clocks_.end()) return NotJoined(worker);
  return it->second;
}

void WorkerClocks::Release(Completions& released) {
  const bool all = clock_counts_.empty();
  const int64_t min_clock = MinClockLocked();
  while (!by_target_.empty() && (all || by_target_.begin()->first <= min_clock)) {
    auto waiter = waiters_.find(by_target_.begin()->second);
    by_target_.erase(by_target_.begin());
    timer_.get().Cancel(waiter->second.timer);
    released.Add([done = std::move(waiter->second.done)] { done(absl::OkStatus()); });
    waiters_.erase(waiter);
  }
}

std::string WorkerClocks::Behind(int64_t target, absl::Duration waited) const {
  std::vector<std::pair<int64_t, absl::string_view>> behind;
  for (const auto& [id, clock] : clocks_) {
    if (clock < target) behind.emplace_back(clock, id);
  }
  std::sort(behind.begin(), behind.end());
  std::vector<std::string> listed;
  for (size_t i = 0; i < behind.size() && i < kMaxListed; ++i) {
    listed.push_back(absl::StrCat(behind[i].second, " at clock ", behind[i].first));
  }
  std::string message = absl::StrCat(
      "waited ", absl::FormatDuration(absl::Trunc(waited, absl::Milliseconds(1))),
      " for every worker to reach clock ", target, "; behind: ", absl::StrJoin(listed, ", "));
  if (behind.size() > kMaxListed) {
    absl::StrAppend(&message, " and ", behind.size() - kMaxListed, " more");
  }
  return message;
}

absl::Status WorkerClocks::WaitUntilAll(int64_t target, absl::Time deadline) {
  BlockingWait wait;
  WaitUntilAllAsync(target, deadline, wait.Done());
  return wait.Wait();
}

CancelWait WorkerClocks::WaitUntilAllAsync(int64_t target, absl::Time deadline, WaitDone done) {
  Completions completions;  // declared before the lock: runs after it is released
  absl::MutexLock lock(&mu_);
  if (shutdown_ || clock_counts_.empty() || MinClockLocked() >= target) {
    completions.Add([done = std::move(done), shutdown = shutdown_] {
      done(shutdown ? ShuttingDown() : absl::OkStatus());
    });
    return [] {};
  }
  const uint64_t id = next_waiter_++;
  Waiter& waiter = waiters_[id];
  waiter.target = target;
  waiter.start = absl::Now();
  waiter.done = std::move(done);
  by_target_.emplace(target, id);
  waiter.timer = timer_.get().Schedule(deadline, [this, id] { GiveUp(id, /*cancelled=*/false); });
  return [this, id] { GiveUp(id, /*cancelled=*/true); };
}

void WorkerClocks::GiveUp(uint64_t id, bool cancelled) {
  WaitDone done;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    auto it = waiters_.find(id);
    if (it == waiters_.end()) return;  // completed already
    Waiter waiter = std::move(it->second);
    waiters_.erase(it);
    auto [first, last] = by_target_.equal_range(waiter.target);
    for (auto t = first; t != last; ++t) {
      if (t->second == id) {
        by_target_.erase(t);
        break;
      }
    }
    if (cancelled) timer_.get().Cancel(waiter.timer);
    const std::string behind = Behind(waiter.target, absl::Now() - waiter.start);
    status = cancelled ? absl::CancelledError(absl::StrCat(behind, "; the caller cancelled"))
                       : absl::DeadlineExceededError(behind);
    done = std::move(waiter.done);
  }
  done(std::move(status));
}

int64_t WorkerClocks::MinClock() const {
  absl::MutexLock lock(&mu_);
  return MinClockLocked();
}

size_t WorkerClocks::size() const {
  absl::MutexLock lock(&mu_);
  return clocks_.size();
}

size_t WorkerClocks::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

std::vector<std::pair<std::string, int64_t>> WorkerClocks::Workers() const {
  absl::MutexLock lock(&mu_);
  return {clocks_.begin(), clocks_.end()};
}

std::string WorkerClocks::Serialize() const {
  v1::WorkerClocksSnapshot snapshot;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, clock] : clocks_) {
      v1::WorkerClocksSnapshot::Worker* w = snapshot.add_workers();
      w->set_id(id);
      w->set_clock(clock);
    }
  }
  return snapshot.SerializeAsString();
}

absl::Status WorkerClocks::Restore(absl::string_view bytes, Completions* released) {
  v1::WorkerClocksSnapshot snapshot;
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !snapshot.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError(
        absl::StrCat("worker clocks snapshot of ", bytes.size(), " bytes does not parse"));
  }
  std::map<std::string, int64_t, std::less<>> clocks;
  std::map<int64_t, size_t> counts;
  for (const v1::WorkerClocksSnapshot::Worker& w : snapshot.workers()) {
    if (w.id().empty()) {
      return absl::InvalidArgumentError("worker clocks snapshot has a worker with an empty id");
    }
    if (w.clock() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("worker clocks snapshot has worker '", w.id(),
                                                     "' at negative clock ", w.clock()));
    }
    if (!clocks.emplace(w.id(), w.clock()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker clocks snapshot has worker '", w.id(), "' twice"));
    }
    ++counts[w.clock()];
  }
  Completions local;  // declared before the lock: runs after it is released
  absl::MutexLock lock(&mu_);
  clocks_ = std::move(clocks);
  clock_counts_ = std::move(counts);
  Release(released != nullptr ? *released : local);
  return absl::OkStatus();
}

void WorkerClocks::Shutdown() {
  Completions completions;  // declared before the lock: runs after it is released
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  for (auto& [id, waiter] : waiters_) {
    timer_.get().Cancel(waiter.timer);
    completions.Add([done = std::move(waiter.done)] { done(ShuttingDown()); });
  }
  waiters_.clear();
  by_target_.clear();
}

}  // namespace pserver
