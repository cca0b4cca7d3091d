#include "cc/server/recent_writes.h"

#include <string>

#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;

BackupLog::Write W(uint64_t lsn, size_t request_bytes = 6) {
  BackupLog::Write write;
  write.epoch = 3;
  write.lsn = lsn;
  write.method = "SendGrad";  // 8 bytes
  write.request = std::string(request_bytes, static_cast<char>('a' + lsn % 26));
  return write;
}

std::vector<uint64_t> Lsns(const std::vector<RecentWrites::Kept>& writes) {
  std::vector<uint64_t> lsns;
  for (const RecentWrites::Kept& write : writes) lsns.push_back(write->lsn);
  return lsns;
}

TEST(RecentWritesTest, WritesAddedOutOfOrderComeBackInLsnOrder) {
  RecentWrites recent(1 << 20);
  for (uint64_t lsn : {3, 1, 2, 5, 4}) recent.Add(W(lsn));
  ASSERT_OK_AND_ASSIGN(std::vector<RecentWrites::Kept> after, recent.Since(1, 5));
  EXPECT_THAT(Lsns(after), ::testing::ElementsAre(2, 3, 4, 5));
  EXPECT_EQ(after[0]->request, W(2).request);
  EXPECT_EQ(after[0]->epoch, 3u);
  ASSERT_OK_AND_ASSIGN(after, recent.Since(5, 5));
  EXPECT_TRUE(after.empty());
  ASSERT_OK_AND_ASSIGN(after, recent.Since(0, 3));  // up to `last` only
  EXPECT_THAT(Lsns(after), ::testing::ElementsAre(1, 2, 3));
  EXPECT_EQ(recent.bytes(), 5u * 14u);
}

TEST(RecentWritesTest, TheLowestGoFirstPastTheBoundAndAreThenMissing) {
  RecentWrites recent(3 * 14);  // three writes of 14 bytes
  for (uint64_t lsn = 1; lsn <= 5; ++lsn) recent.Add(W(lsn));
  EXPECT_EQ(recent.bytes(), 3u * 14u);
  ASSERT_OK_AND_ASSIGN(std::vector<RecentWrites::Kept> after, recent.Since(2, 5));
  EXPECT_THAT(Lsns(after), ::testing::ElementsAre(3, 4, 5));
  EXPECT_THAT(recent.Since(1, 5).status(),
              testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                HasSubstr("write 2 is no longer kept (the primary keeps LSNs 3-5")));
}

TEST(RecentWritesTest, ReleasedWritesAreLetGoAndNotKeptAgain) {
  RecentWrites recent(1 << 20);
  for (uint64_t lsn : {1, 2, 3, 4}) recent.Add(W(lsn));
  recent.Release(2);  // every backup holds 1-2
  EXPECT_EQ(recent.bytes(), 2u * 14u);
  ASSERT_OK_AND_ASSIGN(std::vector<RecentWrites::Kept> after, recent.Since(2, 4));
  EXPECT_THAT(Lsns(after), ::testing::ElementsAre(3, 4));
  EXPECT_THAT(recent.Since(1, 4), testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                           HasSubstr("write 2 is no longer kept")));
  // A write added late at or below the release keeps nothing; above it does.
  recent.Add(W(2));
  recent.Add(W(5));
  EXPECT_EQ(recent.bytes(), 3u * 14u);
  recent.Release(1);  // lower than before: nothing changes
  ASSERT_OK_AND_ASSIGN(after, recent.Since(2, 5));
  EXPECT_THAT(Lsns(after), ::testing::ElementsAre(3, 4, 5));
  recent.Release(5);
  EXPECT_EQ(recent.bytes(), 0u);
  ASSERT_OK_AND_ASSIGN(after, recent.Since(5, 5));
  EXPECT_TRUE(after.empty());
}

TEST(RecentWritesTest, AWriteLargerThanTheBoundIsNotKeptAndLeavesAHole) {
  RecentWrites recent(100);
  recent.Add(W(1));
  recent.Add(W(2, 200));  // too large to keep
  recent.Add(W(3));
  EXPECT_EQ(recent.bytes(), 28u);
  EXPECT_THAT(recent.Since(0, 3).status(),
              testing::StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("write 2")));
  ASSERT_OK_AND_ASSIGN(std::vector<RecentWrites::Kept> after, recent.Since(2, 3));
  EXPECT_THAT(Lsns(after), ::testing::ElementsAre(3));
  // A write not numbered yet is missing too.
  EXPECT_THAT(recent.Since(2, 4).status(),
              testing::StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("write 4")));
  recent.Add(W(3));  // added twice: kept once
  EXPECT_EQ(recent.bytes(), 28u);
}

}  // namespace
}  // namespace pserver
