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

// Pushes `sequence` of `client` to the end (Begin and Finish).
void Apply(AppliedSequences& applied, uint64_t client, uint64_t sequence) {
  ASSERT_EQ(applied.Begin(client, sequence), AppliedSequences::kNew) << client << "/" << sequence;
  applied.Finish(client, sequence);
}

// An outsider pushing under many client ids (one push each) grows nothing
// past max_clients: the client whose last push is the oldest is forgotten.
TEST(AppliedSequencesTest, ClientsAreBoundedAndTheLongestIdleIsForgotten) {
  AppliedSequences applied(/*max_pending=*/4096, /*max_clients=*/3);
  for (uint64_t client = 1; client <= 3; ++client) Apply(applied, client, 1);
  Apply(applied, 1, 2);  // 1 is used again: 2 is now the longest idle
  Apply(applied, 4, 1);
  EXPECT_EQ(applied.num_clients(), 3u);
  EXPECT_EQ(applied.clients_forgotten(), 1u);
  EXPECT_EQ(applied.Begin(1, 2), AppliedSequences::kApplied);
  EXPECT_EQ(applied.Begin(3, 1), AppliedSequences::kApplied);
  EXPECT_EQ(applied.Begin(4, 1), AppliedSequences::kApplied);
  EXPECT_EQ(applied.Begin(2, 1), AppliedSequences::kNew) << "2 was forgotten";
  applied.Abandon(2, 1);

  for (uint64_t client = 100; client < 10100; ++client) Apply(applied, client, 1);
  EXPECT_EQ(applied.num_clients(), 3u);
  v1::AppliedSequences state;
  ASSERT_TRUE(state.ParseFromString(applied.Serialize()));
  EXPECT_EQ(state.clients_size(), 3);
  for (uint64_t client = 10097; client < 10100; ++client) {
    EXPECT_EQ(applied.Begin(client, 1), AppliedSequences::kApplied) << client;
  }
}

TEST(AppliedSequencesTest, AClientWithARequestInProgressIsNotForgotten) {
  AppliedSequences applied(/*max_pending=*/4096, /*max_clients=*/2);
  ASSERT_EQ(applied.Begin(1, 1), AppliedSequences::kNew);  // being applied
  for (uint64_t client = 2; client <= 10; ++client) Apply(applied, client, 1);
  EXPECT_EQ(applied.num_clients(), 2u);
  applied.Finish(1, 1);
  EXPECT_EQ(applied.Begin(1, 1), AppliedSequences::kApplied);
  // Every client in progress: none can be forgotten, the bound waits.
  AppliedSequences busy(/*max_pending=*/4096, /*max_clients=*/2);
  for (uint64_t client = 1; client <= 4; ++client) {
    ASSERT_EQ(busy.Begin(client, 1), AppliedSequences::kNew);
  }
  EXPECT_EQ(busy.num_clients(), 4u);
  for (uint64_t client = 1; client <= 4; ++client) busy.Finish(client, 1);
  EXPECT_EQ(busy.num_clients(), 2u);
}

// Many clients each leaving gaps (sequences kept above their marks) are
// bounded over all clients, not only per client.
TEST(AppliedSequencesTest, SequencesKeptOverAllClientsAreBounded) {
  constexpr size_t kMaxKept = 10000;
  AppliedSequences applied(/*max_pending=*/4096, AppliedSequences::kDefaultMaxClients, kMaxKept);
  constexpr uint64_t kGapsPerClient = 4000;
  constexpr uint64_t clients = 10;
  for (uint64_t client = 1; client <= clients; ++client) {
    // Sequence 1 never arrives: 2 .. kGapsPerClient+1 stay above the mark.
    for (uint64_t s = 2; s <= kGapsPerClient + 1; ++s) Apply(applied, client, s);
    ASSERT_LE(applied.num_sequences_kept(), kMaxKept) << client;
  }
  EXPECT_EQ(applied.num_sequences_kept(), 2 * kGapsPerClient);
  EXPECT_LT(applied.num_clients(), clients);
  EXPECT_GT(applied.clients_forgotten(), 0u);
  EXPECT_EQ(applied.Begin(clients, kGapsPerClient), AppliedSequences::kApplied);
}

TEST(AppliedSequencesTest, ARestoredStateLargerThanTheBoundKeepsWhatFits) {
  AppliedSequences large;
  for (uint64_t client = 1; client <= 10; ++client) Apply(large, client, 1);
  AppliedSequences small(/*max_pending=*/4096, /*max_clients=*/4);
  ASSERT_OK(small.Restore(large.Serialize()));
  EXPECT_EQ(small.num_clients(), 4u);
  for (uint64_t client = 7; client <= 10; ++client) {
    EXPECT_EQ(small.Begin(client, 1), AppliedSequences::kApplied) << client;
  }
  // Lowering the bound forgets the longest idle.
  small.set_max_clients(1);
  EXPECT_EQ(small.num_clients(), 1u);
}

}  // namespace
}  // namespace pserver
