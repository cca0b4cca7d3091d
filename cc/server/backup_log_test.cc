// BackupLog: writes delivered in any order are applied once each, in LSN
// order; stale epochs are refused; held writes are bounded. Threads that
// must block are waited for by observable state (held_writes), in bounded
// loops: nothing depends on timing.
#include "cc/server/backup_log.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kLong = absl::Seconds(60);

BackupLog::Write W(uint64_t epoch, uint64_t lsn, std::string request = "") {
  return {epoch, lsn, "SendGrads", request.empty() ? std::to_string(lsn) : request};
}

// Records what was applied, in order.
class Applied {
 public:
  BackupLog::Apply Fn() {
    return [this](const BackupLog::Write& w) {
      absl::MutexLock lock(&mu_);
      lsns_.push_back(w.lsn);
      return fail_at_ == w.lsn ? absl::InvalidArgumentError("no such parameter")
                               : absl::OkStatus();
    };
  }
  std::vector<uint64_t> lsns() {
    absl::MutexLock lock(&mu_);
    return lsns_;
  }
  void FailAt(uint64_t lsn) {
    absl::MutexLock lock(&mu_);
    fail_at_ = lsn;
  }

 private:
  absl::Mutex mu_;
  std::vector<uint64_t> lsns_;
  uint64_t fail_at_ = 0;
};

// Waits (bounded) until `log` holds `n` writes.
bool WaitHeld(const BackupLog& log, uint64_t n) {
  const absl::Time deadline = absl::Now() + kLong;
  while (log.held_writes() != n) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

TEST(BackupLogTest, WritesArrivingOutOfOrderAreAppliedInLsnOrder) {
  Applied applied;
  BackupLog log(1, 0, {}, applied.Fn());
  absl::Status s3, s2;
  std::thread t3([&] { s3 = log.Deliver(W(1, 3), absl::Now() + kLong); });
  ASSERT_TRUE(WaitHeld(log, 1));
  std::thread t2([&] { s2 = log.Deliver(W(1, 2), absl::Now() + kLong); });
  ASSERT_TRUE(WaitHeld(log, 2));
  EXPECT_THAT(applied.lsns(), ::testing::IsEmpty());  // 1 is missing: nothing applied
  EXPECT_OK(log.Deliver(W(1, 1), absl::Now() + kLong));
  t3.join();
  t2.join();
  EXPECT_OK(s3);
  EXPECT_OK(s2);
  EXPECT_THAT(applied.lsns(), ElementsAre(1, 2, 3));
  EXPECT_EQ(log.applied_lsn(), 3u);
  EXPECT_EQ(log.held_writes(), 0u);
  EXPECT_EQ(log.held_bytes(), 0u);
}

TEST(BackupLogTest, ARetryIsAcknowledgedAndNotAppliedTwice) {
  Applied applied;
  BackupLog log(1, 0, {}, applied.Fn());
  ASSERT_OK(log.Deliver(W(1, 1), absl::Now() + kLong));
  ASSERT_OK(log.Deliver(W(1, 1), absl::Now() + kLong));
  EXPECT_THAT(applied.lsns(), ElementsAre(1));
  // A log that starts past LSN 5 (a replica built from a snapshot) acks 5.
  BackupLog later(1, 5, {}, applied.Fn());
  EXPECT_OK(later.Deliver(W(1, 5), absl::Now() + kLong));
  EXPECT_THAT(applied.lsns(), ElementsAre(1));
}

// A write resent (its first connection broke) while its first copy is
// being applied waits for that apply, is acknowledged, is not applied twice,
// and leaves nothing held behind.
TEST(BackupLogTest, ARetryArrivingWhileItsFirstCopyIsAppliedLeavesNothingHeld) {
  absl::Notification applying, finish;
  std::vector<uint64_t> lsns;
  BackupLog log(1, 0, {}, [&](const BackupLog::Write& w) {
    lsns.push_back(w.lsn);
    if (w.lsn == 1) {
      applying.Notify();
      finish.WaitForNotification();
    }
    return absl::OkStatus();
  });
  absl::Status first;
  std::thread t([&] { first = log.Deliver(W(1, 1), absl::Now() + kLong); });
  applying.WaitForNotification();
  absl::Status retry;
  std::thread r([&] { retry = log.Deliver(W(1, 1), absl::Now() + kLong); });
  ASSERT_TRUE(WaitHeld(log, 1));  // the retry waits behind the apply
  finish.Notify();
  t.join();
  r.join();
  EXPECT_OK(first);
  EXPECT_OK(retry);
  EXPECT_THAT(lsns, ElementsAre(1));
  EXPECT_EQ(log.held_writes(), 0u);
  EXPECT_EQ(log.held_bytes(), 0u);
}

TEST(BackupLogTest, AStalePrimaryGetsNoAcknowledgement) {
  Applied applied;
  BackupLog log(3, 0, {}, applied.Fn());
  EXPECT_THAT(log.Deliver(W(2, 1), absl::Now() + kLong),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("epoch 2, older than this replica's epoch 3")));
  EXPECT_THAT(log.Deliver(W(4, 1), absl::Now() + kLong),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("newer than this replica")));
  EXPECT_THAT(applied.lsns(), ::testing::IsEmpty());
  log.SetEpoch(4);
  EXPECT_OK(log.Deliver(W(4, 1), absl::Now() + kLong));
  EXPECT_THAT(log.Deliver(W(3, 2), absl::Now() + kLong),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
  log.SetEpoch(2);  // older: ignored
  EXPECT_EQ(log.epoch(), 4u);
  EXPECT_THAT(applied.lsns(), ElementsAre(1));
}

TEST(BackupLogTest, ANewEpochDropsTheOldPrimarysHeldWrites) {
  Applied applied;
  BackupLog log(1, 0, {}, applied.Fn());
  absl::Status held;
  std::thread t([&] { held = log.Deliver(W(1, 2), absl::Now() + kLong); });
  ASSERT_TRUE(WaitHeld(log, 1));
  log.SetEpoch(2);
  t.join();
  EXPECT_THAT(held, StatusIs(absl::StatusCode::kFailedPrecondition,
                             HasSubstr("LSN 2 was dropped: this replica moved to epoch 2")));
  EXPECT_EQ(log.held_writes(), 0u);
  // The new primary's LSNs continue from what was applied.
  EXPECT_OK(log.Deliver(W(2, 1), absl::Now() + kLong));
  EXPECT_OK(log.Deliver(W(2, 2, "other"), absl::Now() + kLong));
  EXPECT_THAT(applied.lsns(), ElementsAre(1, 2));
}

TEST(BackupLogTest, AWriteWaitingPastItsDeadlineStaysHeldForItsRetry) {
  Applied applied;
  BackupLog log(1, 0, {}, applied.Fn());
  EXPECT_THAT(log.Deliver(W(1, 2), absl::Now()),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("LSN 2 is held waiting for LSN 1")));
  EXPECT_EQ(log.held_writes(), 1u);
  ASSERT_OK(log.Deliver(W(1, 1), absl::Now() + kLong));
  EXPECT_THAT(applied.lsns(), ElementsAre(1, 2));
  EXPECT_OK(log.Deliver(W(1, 2), absl::Now() + kLong));  // the retry: acknowledged
  EXPECT_THAT(applied.lsns(), ElementsAre(1, 2));
}

TEST(BackupLogTest, HeldWritesAreBoundedInCountAndBytes) {
  Applied applied;
  BackupLog::Options options;
  options.max_held_writes = 2;
  options.max_held_bytes = 1000;
  BackupLog log(1, 0, options, applied.Fn());
  EXPECT_THAT(log.Deliver(W(1, 2), absl::Now()), StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
  EXPECT_THAT(log.Deliver(W(1, 3), absl::Now()), StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
  EXPECT_THAT(log.Deliver(W(1, 4), absl::Now() + kLong),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("replica holds 2 writes (20 bytes) waiting for LSN 1, at its "
                                 "bound of 2 writes")));
  BackupLog small(1, 0, options, applied.Fn());
  EXPECT_THAT(small.Deliver(W(1, 2, std::string(1000, 'x')), absl::Now() + kLong),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("1000 bytes; retry")));
  EXPECT_EQ(small.held_writes(), 0u);
  // The next LSN itself is never refused for room: it drains what is held.
  ASSERT_OK(log.Deliver(W(1, 1), absl::Now() + kLong));
  EXPECT_THAT(applied.lsns(), ElementsAre(1, 2, 3));
}

TEST(BackupLogTest, AFailedApplyBreaksTheReplicaForGood) {
  Applied applied;
  applied.FailAt(2);
  BackupLog log(1, 0, {}, applied.Fn());
  ASSERT_OK(log.Deliver(W(1, 1), absl::Now() + kLong));
  EXPECT_THAT(log.Deliver(W(1, 2), absl::Now() + kLong),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("applying replicated write LSN 2 (SendGrads) failed where the "
                                 "primary's succeeded: no such parameter")));
  EXPECT_THAT(log.Deliver(W(1, 3), absl::Now() + kLong),
              StatusIs(absl::StatusCode::kDataLoss, ::testing::_));
  EXPECT_EQ(log.applied_lsn(), 1u);
}

TEST(BackupLogTest, BadWritesAreRefused) {
  Applied applied;
  BackupLog log(1, 0, {}, applied.Fn());
  EXPECT_THAT(log.Deliver(W(1, 0), absl::Now() + kLong),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("LSN 0")));
  EXPECT_THAT(log.Deliver(W(1, 2, "a"), absl::Now()),
              StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
  EXPECT_THAT(log.Deliver(W(1, 2, "b"), absl::Now() + kLong),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("differs from the write already held")));
  EXPECT_THAT(applied.lsns(), ::testing::IsEmpty());
}

TEST(BackupLogTest, AppliedWritesAreRetainedForASuccessorWithinTheirBound) {
  Applied applied;
  BackupLog::Options options;
  options.max_retained_bytes = 30;  // three writes of 10 bytes ("SendGrads" + 1 digit)
  BackupLog log(1, 0, options, applied.Fn());
  for (uint64_t lsn = 1; lsn <= 5; ++lsn) ASSERT_OK(log.Deliver(W(1, lsn), absl::Now() + kLong));
  ASSERT_OK_AND_ASSIGN(std::vector<BackupLog::Write> since, log.AppliedSince(3));
  ASSERT_EQ(since.size(), 2u);
  EXPECT_EQ(since[0].lsn, 4u);
  EXPECT_EQ(since[1].lsn, 5u);
  EXPECT_EQ(since[1].request, "5");
  ASSERT_OK_AND_ASSIGN(since, log.AppliedSince(2));
  EXPECT_EQ(since.size(), 3u);
  ASSERT_OK_AND_ASSIGN(since, log.AppliedSince(5));
  EXPECT_TRUE(since.empty());
  EXPECT_THAT(log.AppliedSince(1).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no longer retains LSN 2 (it keeps LSNs from 3")));
  // By default (as BackupReplication, the server's, builds it) none is kept.
  BackupLog none(1, 0, BackupLog::Options{}, applied.Fn());
  ASSERT_OK(none.Deliver(W(1, 1), absl::Now() + kLong));
  EXPECT_THAT(none.AppliedSince(0).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("it keeps none")));
}

}  // namespace
}  // namespace pserver
