#include "cc/core/worker_clocks.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pserver/v1/table.pb.h"

namespace pserver {
namespace {

using ::pserver::testing::IsOk;
using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;

constexpr absl::Duration kLong = absl::Seconds(30);  // never reached when the code is right

// Waits (bounded) until `n` callers are blocked in WaitUntilAll.
bool AwaitWaiting(const WorkerClocks& clocks, size_t n) {
  const absl::Time deadline = absl::Now() + kLong;
  while (clocks.waiting() < n) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Microseconds(200));
  }
  return true;
}

void TickTimes(WorkerClocks& clocks, const std::string& worker, int n) {
  for (int i = 0; i < n; ++i) ASSERT_OK(clocks.Tick(worker));
}

TEST(WorkerClocksTest, JoinStartsAtTheMinimum) {
  WorkerClocks clocks("emb");
  EXPECT_EQ(clocks.MinClock(), -1);
  EXPECT_EQ(clocks.size(), 0u);
  ASSERT_OK_AND_ASSIGN(int64_t c0, clocks.Join("w0"));
  EXPECT_EQ(c0, 0);
  TickTimes(clocks, "w0", 2);
  ASSERT_OK_AND_ASSIGN(int64_t c1, clocks.Join("w1"));
  EXPECT_EQ(c1, 2);
  ASSERT_OK_AND_ASSIGN(int64_t t, clocks.Tick("w1"));
  EXPECT_EQ(t, 3);
  ASSERT_OK_AND_ASSIGN(int64_t c2, clocks.Join("w2"));
  EXPECT_EQ(c2, 2);  // w0 is the slowest, at 2
  // Joining again returns the clock and changes nothing.
  ASSERT_OK_AND_ASSIGN(int64_t again, clocks.Join("w1"));
  EXPECT_EQ(again, 3);
  EXPECT_EQ(clocks.size(), 3u);
  EXPECT_EQ(clocks.MinClock(), 2);
  EXPECT_THAT(clocks.Workers(), ElementsAre(Pair("w0", 2), Pair("w1", 3), Pair("w2", 2)));
  ASSERT_OK_AND_ASSIGN(int64_t of, clocks.ClockOf("w1"));
  EXPECT_EQ(of, 3);
}

TEST(WorkerClocksTest, MinimumRisesWhenTheSlowestLeaves) {
  WorkerClocks clocks;
  ASSERT_OK(clocks.Join("a"));
  ASSERT_OK(clocks.Join("b"));
  TickTimes(clocks, "b", 4);
  EXPECT_EQ(clocks.MinClock(), 0);
  ASSERT_OK(clocks.Leave("a"));
  EXPECT_EQ(clocks.MinClock(), 4);
  ASSERT_OK(clocks.Leave("b"));
  EXPECT_EQ(clocks.MinClock(), -1);
  ASSERT_OK_AND_ASSIGN(int64_t c, clocks.Join("c"));
  EXPECT_EQ(c, 0);
}

TEST(WorkerClocksTest, BadInputsChangeNothing) {
  WorkerClocks clocks("emb");
  ASSERT_OK(clocks.Join("w0"));
  EXPECT_THAT(clocks.Join(""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  EXPECT_THAT(clocks.Tick("ghost"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("worker 'ghost' has not joined table 'emb'")));
  EXPECT_THAT(clocks.Leave("ghost"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("'ghost'")));
  EXPECT_THAT(clocks.ClockOf("ghost"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("'ghost'")));
  EXPECT_THAT(clocks.Workers(), ElementsAre(Pair("w0", 0)));
  WorkerClocks unnamed;
  EXPECT_THAT(unnamed.Tick("x"), StatusIs(absl::StatusCode::kNotFound,
                                          HasSubstr("worker 'x' has not joined this table")));
}

TEST(WorkerClocksTest, WaitReturnsAtOnceWhenSatisfied) {
  WorkerClocks clocks;
  // No worker: nothing to wait for, even with a deadline long past.
  EXPECT_OK(clocks.WaitUntilAll(100, absl::InfinitePast()));
  ASSERT_OK(clocks.Join("w0"));
  ASSERT_OK(clocks.Join("w1"));
  TickTimes(clocks, "w0", 3);
  TickTimes(clocks, "w1", 2);
  EXPECT_OK(clocks.WaitUntilAll(2, absl::InfinitePast()));
  EXPECT_OK(clocks.WaitUntilAll(-5, absl::InfinitePast()));
  EXPECT_THAT(clocks.WaitUntilAll(3, absl::InfinitePast()),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("w1 at clock 2")));
}

TEST(WorkerClocksTest, WaitBlocksUntilTheSlowWorkerTicks) {
  WorkerClocks clocks;
  ASSERT_OK(clocks.Join("fast"));
  ASSERT_OK(clocks.Join("slow"));
  TickTimes(clocks, "fast", 2);
  std::atomic<bool> ticked{false};
  absl::Status status = absl::UnknownError("not returned");
  bool ticked_when_returned = false;
  std::thread waiter([&] {
    status = clocks.WaitUntilAll(1, absl::Now() + kLong);
    ticked_when_returned = ticked.load();
  });
  ASSERT_TRUE(AwaitWaiting(clocks, 1));
  ticked.store(true);
  ASSERT_OK(clocks.Tick("slow"));
  waiter.join();
  EXPECT_OK(status);
  EXPECT_TRUE(ticked_when_returned);
  EXPECT_EQ(clocks.waiting(), 0u);
}

TEST(WorkerClocksTest, DeadlineNamesTheLaggardsSlowestFirst) {
  WorkerClocks clocks;
  for (const char* w : {"w0", "w1", "w3"}) ASSERT_OK(clocks.Join(w));
  TickTimes(clocks, "w0", 6);
  TickTimes(clocks, "w1", 4);
  TickTimes(clocks, "w3", 2);
  absl::Status status = clocks.WaitUntilAll(5, absl::Now() + absl::Milliseconds(20));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kDeadlineExceeded,
                               AllOf(HasSubstr("for every worker to reach clock 5; "
                                               "behind: w3 at clock 2, w1 at clock 4"),
                                     HasSubstr("waited "), Not(HasSubstr("w0")))));
}

TEST(WorkerClocksTest, DeadlineListsAtMostTenLaggards) {
  WorkerClocks clocks;
  for (int i = 0; i < 15; ++i) ASSERT_OK(clocks.Join(absl::StrCat("w", i)));
  absl::Status status = clocks.WaitUntilAll(1, absl::Now());
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kDeadlineExceeded,
                               AllOf(HasSubstr("w0 at clock 0, w1 at clock 0"),
                                     HasSubstr(" and 5 more"))));
}

TEST(WorkerClocksTest, LeaveUnblocksWaiters) {
  WorkerClocks clocks;
  ASSERT_OK(clocks.Join("w0"));
  ASSERT_OK(clocks.Join("gone"));
  TickTimes(clocks, "w0", 3);
  absl::Status status = absl::UnknownError("not returned");
  std::thread waiter([&] { status = clocks.WaitUntilAll(3, absl::Now() + kLong); });
  ASSERT_TRUE(AwaitWaiting(clocks, 1));
  ASSERT_OK(clocks.Leave("gone"));
  waiter.join();
  EXPECT_OK(status);
}

TEST(WorkerClocksTest, ShutdownWakesWaitersWithUnavailable) {
  WorkerClocks clocks;
  ASSERT_OK(clocks.Join("w0"));
  std::vector<absl::Status> statuses(3, absl::UnknownError("not returned"));
  std::vector<std::thread> waiters;
  for (int i = 0; i < 3; ++i) {
    waiters.emplace_back([&, i] { statuses[i] = clocks.WaitUntilAll(5, absl::Now() + kLong); });
  }
  ASSERT_TRUE(AwaitWaiting(clocks, 3));
  clocks.Shutdown();
  for (std::thread& t : waiters) t.join();
  for (const absl::Status& s : statuses) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("server shutting down")));
  }
  EXPECT_THAT(clocks.WaitUntilAll(0, absl::Now() + kLong),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("server shutting down")));
  // The clocks themselves still work, for a last checkpoint.
  EXPECT_OK(clocks.Tick("w0"));
}

TEST(WorkerClocksTest, SerializeRestoreRoundTrip) {
  WorkerClocks clocks;
  ASSERT_OK(clocks.Join("a"));
  ASSERT_OK(clocks.Join("b"));
  TickTimes(clocks, "b", 7);
  const std::string bytes = clocks.Serialize();

  WorkerClocks restored;
  ASSERT_OK(restored.Join("stale"));
  ASSERT_OK(restored.Restore(bytes));
  EXPECT_THAT(restored.Workers(), ElementsAre(Pair("a", 0), Pair("b", 7)));
  EXPECT_EQ(restored.MinClock(), 0);
  EXPECT_EQ(restored.Serialize(), bytes);
  // The minimum index was rebuilt too: the next join lands at it.
  TickTimes(restored, "a", 3);
  ASSERT_OK_AND_ASSIGN(int64_t c, restored.Join("c"));
  EXPECT_EQ(c, 3);

  // An empty snapshot means no workers.
  ASSERT_OK(restored.Restore(""));
  EXPECT_EQ(restored.size(), 0u);
}

TEST(WorkerClocksTest, RestoreRejectsBadSnapshotsAndChangesNothing) {
  WorkerClocks clocks;
  ASSERT_OK(clocks.Join("keep"));
  ASSERT_OK(clocks.Tick("keep"));
  EXPECT_THAT(clocks.Restore("\xff\xff\xff"), StatusIs(absl::StatusCode::kDataLoss,
                                                      HasSubstr("does not parse")));
  auto snapshot = [](std::vector<std::pair<std::string, int64_t>> workers) {
    v1::WorkerClocksSnapshot s;
    for (auto& [id, clock] : workers) {
      auto* w = s.add_workers();
      w->set_id(id);
      w->set_clock(clock);
    }
    return s.SerializeAsString();
  };
  EXPECT_THAT(clocks.Restore(snapshot({{"a", 1}, {"a", 2}})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'a' twice")));
  EXPECT_THAT(clocks.Restore(snapshot({{"", 1}})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty id")));
  EXPECT_THAT(clocks.Restore(snapshot({{"a", -1}})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative clock")));
  EXPECT_THAT(clocks.Workers(), ElementsAre(Pair("keep", 1)));
  EXPECT_EQ(clocks.MinClock(), 1);
}

TEST(WorkerClocksTest, RestoreWakesWaiters) {
  WorkerClocks clocks;
  ASSERT_OK(clocks.Join("w0"));
  absl::Status status = absl::UnknownError("not returned");
  std::thread waiter([&] { status = clocks.WaitUntilAll(5, absl::Now() + kLong); });
  ASSERT_TRUE(AwaitWaiting(clocks, 1));
  v1::WorkerClocksSnapshot snapshot;
  auto* w = snapshot.add_workers();
  w->set_id("w0");
  w->set_clock(5);
  ASSERT_OK(clocks.Restore(snapshot.SerializeAsString()));
  waiter.join();
  EXPECT_OK(status);
}

// Stale synchronous parallel training: 4 workers, staleness 2, 30 clocks
// each. A worker "pushes" its updates for a clock (publishes them in
// `pushed`) and then ticks; before reading at clock c it waits for clock
// c - s, after which it must see every other worker's pushes through c - s.
// The last worker is slow: its first tick waits until someone is blocked on
// it, so waiting is sure to happen, and it yields on every clock.
TEST(WorkerClocksTest, StaleSynchronousParallelSimulation) {
  constexpr int kWorkers = 4;
  constexpr int kClocks = 30;
  constexpr int64_t kStaleness = 2;
  WorkerClocks clocks("ssp");
  std::array<std::atomic<int64_t>, kWorkers> pushed{};
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_OK(clocks.Join(absl::StrCat("w", w)));
    pushed[w].store(0);
  }
  std::atomic<int> violations{0};
  std::atomic<int> failures{0};
  std::atomic<int> blocked_reads{0};  // reads that found the minimum too low
  std::atomic<bool> saw_waiter{true};
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      const std::string id = absl::StrCat("w", w);
      const bool slow = w == kWorkers - 1;
      int64_t clock = 0;
      for (int i = 0; i < kClocks; ++i) {
        // Read at `clock`.
        const int64_t need = clock - kStaleness;
        if (clocks.MinClock() < need) blocked_reads.fetch_add(1);
        if (!clocks.WaitUntilAll(need, absl::Now() + kLong).ok()) {
          failures.fetch_add(1);
          return;
        }
        for (int other = 0; other < kWorkers; ++other) {
          if (pushed[other].load() < need) violations.fetch_add(1);
        }
        // Push this clock's updates, then tick.
        pushed[w].store(clock + 1);
        if (slow && i == 0 && !AwaitWaiting(clocks, 1)) saw_waiter.store(false);
        if (slow) std::this_thread::yield();
        absl::StatusOr<int64_t> ticked = clocks.Tick(id);
        if (!ticked.ok() || *ticked != clock + 1) {
          failures.fetch_add(1);
          return;
        }
        clock = *ticked;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(violations.load(), 0);
  EXPECT_TRUE(saw_waiter.load());
  EXPECT_GT(blocked_reads.load(), 0);
  EXPECT_EQ(clocks.MinClock(), kClocks);
  for (int w = 0; w < kWorkers; ++w) EXPECT_EQ(pushed[w].load(), kClocks);
}

TEST(WorkerClocksTest, AsyncWaitsCompleteOnTheTickAndCancelAtOnce) {
  WorkerClocks clocks("t");
  ASSERT_OK(clocks.Join("w0").status());
  ASSERT_OK(clocks.Join("w1").status());
  absl::Mutex mu;
  std::vector<absl::Status> got;
  auto done = [&](absl::Status s) {
    absl::MutexLock lock(&mu);
    got.push_back(std::move(s));
  };
  auto count = [&] {
    absl::MutexLock lock(&mu);
    return got.size();
  };
  const absl::Time later = absl::Now() + absl::Seconds(60);
  CancelWait first = clocks.WaitUntilAllAsync(1, later, done);
  CancelWait second = clocks.WaitUntilAllAsync(2, later, done);
  EXPECT_EQ(clocks.waiting(), 2u);
  EXPECT_EQ(count(), 0u);
  ASSERT_OK(clocks.Tick("w0").status());
  EXPECT_EQ(count(), 0u);  // w1 is still at 0
  // The tick that lets the first through completes it before returning;
  // a collector delays that until the caller runs it.
  {
    Completions released;
    ASSERT_OK(clocks.Tick("w1", &released).status());
    EXPECT_EQ(count(), 0u);
  }
  EXPECT_EQ(count(), 1u);
  EXPECT_OK(got[0]);
  second();
  ASSERT_EQ(count(), 2u);
  EXPECT_THAT(got[1], StatusIs(absl::StatusCode::kCancelled,
                               AllOf(HasSubstr("clock 2"), HasSubstr("behind: w0 at clock 1"))));
  first();  // completed already: a no-op
  EXPECT_EQ(count(), 2u);
  EXPECT_EQ(clocks.waiting(), 0u);
}

// Many worker ids, or one huge id, cannot grow a table's clocks without
// bound: ids are at most kMaxNameBytes, joins past max_workers are refused
// naming the flag until one leaves, and a refused join changes nothing.
TEST(WorkerClocksTest, JoinsPastTheBoundAndOverlongIdsAreRefused) {
  WorkerClocks clocks("t", nullptr, /*max_workers=*/3);
  EXPECT_THAT(clocks.Join(std::string(1025, 'w')),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("1024")));
  EXPECT_THAT(clocks.Join(std::string(1024, 'w')), IsOk());
  EXPECT_THAT(clocks.Join("a"), IsOk());
  EXPECT_THAT(clocks.Join("b"), IsOk());
  EXPECT_THAT(clocks.Join("c"), StatusIs(absl::StatusCode::kResourceExhausted,
                                         ::testing::HasSubstr("--max_workers_per_table")));
  EXPECT_THAT(clocks.ClockOf("c"), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_THAT(clocks.Join("a"), IsOk()) << "joining again is not a new worker";
  ASSERT_THAT(clocks.Leave("a"), IsOk());
  EXPECT_THAT(clocks.Join("c"), IsOk());
}

}  // namespace
}  // namespace pserver
