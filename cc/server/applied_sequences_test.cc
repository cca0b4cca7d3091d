#include "cc/server/applied_sequences.h"

#include <string>

#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pserver/v1/registry.pb.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusCodeIs;

TEST(AppliedSequencesTest, EachSequenceIsNewOnce) {
  AppliedSequences applied;
  EXPECT_EQ(applied.Begin(7, 1), AppliedSequences::kNew);
  EXPECT_EQ(applied.Begin(7, 1), AppliedSequences::kInProgress);
  applied.Finish(7, 1);
  EXPECT_EQ(applied.Begin(7, 1), AppliedSequences::kApplied);
  // Another client's numbers are its own.
  EXPECT_EQ(applied.Begin(8, 1), AppliedSequences::kNew);
}

TEST(AppliedSequencesTest, AnAbandonedSequenceIsNewAgain) {
  AppliedSequences applied;
  EXPECT_EQ(applied.Begin(7, 1), AppliedSequences::kNew);
  applied.Abandon(7, 1);
  EXPECT_EQ(applied.Begin(7, 1), AppliedSequences::kNew);
  applied.Finish(7, 1);
  EXPECT_EQ(applied.Begin(7, 1), AppliedSequences::kApplied);
  applied.Abandon(9, 1);  // an unknown client: nothing to do
  EXPECT_EQ(applied.num_clients(), 1u);
}

// A client whose every request was refused (abandoned) is not kept: refused
// pushes from many client ids grow nothing.
TEST(AppliedSequencesTest, AClientWithOnlyAbandonedRequestsIsForgotten) {
  AppliedSequences applied;
  for (uint64_t client = 1; client <= 100; ++client) {
    ASSERT_EQ(applied.Begin(client, 1), AppliedSequences::kNew);
    applied.Abandon(client, 1);
  }
  EXPECT_EQ(applied.num_clients(), 0u);
  // One with a request still in progress, or one applied, stays.
  ASSERT_EQ(applied.Begin(5, 1), AppliedSequences::kNew);
  ASSERT_EQ(applied.Begin(5, 2), AppliedSequences::kNew);
  applied.Abandon(5, 1);
  EXPECT_EQ(applied.num_clients(), 1u);
  applied.Finish(5, 2);
  ASSERT_EQ(applied.Begin(5, 3), AppliedSequences::kNew);
  applied.Abandon(5, 3);
  EXPECT_EQ(applied.num_clients(), 1u);
  EXPECT_EQ(applied.Begin(5, 2), AppliedSequences::kApplied);
  EXPECT_EQ(applied.Begin(5, 1), AppliedSequences::kNew);
}

TEST(AppliedSequencesTest, OutOfOrderCompletionAdvancesTheLowWaterMark) {
  AppliedSequences applied;
  for (uint64_t s : {3, 1, 4, 2}) ASSERT_EQ(applied.Begin(1, s), AppliedSequences::kNew);
  applied.Finish(1, 3);
  applied.Finish(1, 4);
  EXPECT_EQ(applied.Begin(1, 3), AppliedSequences::kApplied);
  EXPECT_EQ(applied.Begin(1, 1), AppliedSequences::kInProgress);
  applied.Finish(1, 1);
  applied.Finish(1, 2);
  v1::AppliedSequences state;
  ASSERT_TRUE(state.ParseFromString(applied.Serialize()));
  ASSERT_EQ(state.clients_size(), 1);
  EXPECT_EQ(state.clients(0).low_water(), 4u);
  EXPECT_EQ(state.clients(0).applied_size(), 0);
  EXPECT_EQ(applied.Begin(1, 5), AppliedSequences::kNew);
}

TEST(AppliedSequencesTest, SurvivesSerializeAndRestore) {
  AppliedSequences applied;
  for (uint64_t s : {1, 2, 5, 9}) {
    ASSERT_EQ(applied.Begin(42, s), AppliedSequences::kNew);
    applied.Finish(42, s);
  }
  AppliedSequences restored;
  ASSERT_OK(restored.Restore(applied.Serialize()));
  for (uint64_t s : {1, 2, 5, 9}) EXPECT_EQ(restored.Begin(42, s), AppliedSequences::kApplied) << s;
  for (uint64_t s : {3, 4, 6, 10}) EXPECT_EQ(restored.Begin(42, s), AppliedSequences::kNew) << s;
  EXPECT_EQ(restored.Serialize(), applied.Serialize() + std::string()) << "in progress not saved";
}

TEST(AppliedSequencesTest, GarbageDoesNotRestore) {
  AppliedSequences applied;
  EXPECT_THAT(applied.Restore("\xff\xff\xff"), StatusCodeIs(absl::StatusCode::kInvalidArgument));
}

TEST(AppliedSequencesTest, GapsAreBounded) {
  AppliedSequences applied(/*max_pending=*/4);
  // 1 never arrives (lost with a server restarted from an older checkpoint).
  for (uint64_t s = 2; s <= 10; ++s) {
    ASSERT_EQ(applied.Begin(5, s), AppliedSequences::kNew);
    applied.Finish(5, s);
  }
  v1::AppliedSequences state;
  ASSERT_TRUE(state.ParseFromString(applied.Serialize()));
  ASSERT_EQ(state.clients_size(), 1);
  EXPECT_LE(state.clients(0).applied_size(), 4);
  EXPECT_EQ(state.clients(0).low_water(), 10u) << "the gap was given up and the run absorbed";
  EXPECT_EQ(applied.Begin(5, 11), AppliedSequences::kNew);
}

}  // namespace
}  // namespace pserver
