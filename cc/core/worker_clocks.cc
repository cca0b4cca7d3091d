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

absl::StatusOr<int64_t> WorkerClocks::Join(absl::string_view worker) {
  if (worker.empty()) return absl::InvalidArgumentError("worker id is empty");
  absl::MutexLock lock(&mu_);
  auto it = clocks_.find(worker);
  if (it != clocks_.end()) return it->second;
  const int64_t clock = std::max<int64_t>(MinClockLocked(), 0);
  clocks_.emplace(std::string(worker), clock);
  AddClock(clock);
  return clock;
}

absl::Status WorkerClocks::Leave(absl::string_view worker) {
  absl::MutexLock lock(&mu_);
  auto it = clocks_.find(worker);
  if (it == clocks_.end()) return NotJoined(worker);
  RemoveClock(it->second);
  clocks_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> WorkerClocks::Tick(absl::string_view worker) {
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
  return it->second;
}

absl::StatusOr<int64_t> WorkerClocks::ClockOf(absl::string_view worker) const {
  absl::MutexLock lock(&mu_);
  auto it = clocks_.find(worker);
  if (it == clocks_.end()) return NotJoined(worker);
  return it->second;
}

absl::Status WorkerClocks::WaitUntilAll(int64_t target, absl::Time deadline) {
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&mu_);
  // The condition is evaluated with mu_ held, whenever mu_ is released by a
  // writer: Tick, Leave and Restore wake us without an explicit signal.
  auto done = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shutdown_ || clock_counts_.empty() || clock_counts_.begin()->first >= target;
  };
  ++waiting_;
  mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  --waiting_;
  if (shutdown_) return ShuttingDown();
  if (done()) return absl::OkStatus();

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
      "waited ", absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))),
      " for every worker to reach clock ", target, "; behind: ", absl::StrJoin(listed, ", "));
  if (behind.size() > kMaxListed) {
    absl::StrAppend(&message, " and ", behind.size() - kMaxListed, " more");
  }
  return absl::DeadlineExceededError(message);
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
  return waiting_;
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

absl::Status WorkerClocks::Restore(absl::string_view bytes) {
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
      return absl::InvalidArgumentError(absl::StrCat(
          "worker clocks snapshot has worker '", w.id(), "' at negative clock ", w.clock()));
    }
    if (!clocks.emplace(w.id(), w.clock()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker clocks snapshot has worker '", w.id(), "' twice"));
    }
    ++counts[w.clock()];
  }
  absl::MutexLock lock(&mu_);
  clocks_ = std::move(clocks);
  clock_counts_ = std::move(counts);
  return absl::OkStatus();
}

void WorkerClocks::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
}

}  // namespace pserver
