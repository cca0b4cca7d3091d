#include "cc/etcd/shard_config.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ShardConfigTest, RoundTrips) {
  v1::ShardConfig config;
  config.set_epoch(7);
  config.set_holder("0123456789abcdef");
  config.set_holder_address("127.0.0.1:7000");
  const std::string value = FormatShardConfig(config);
  ASSERT_OK_AND_ASSIGN(v1::ShardConfig back, ParseShardConfig(3, value));
  EXPECT_EQ(back.epoch(), 7u);
  EXPECT_EQ(back.holder(), "0123456789abcdef");
  EXPECT_EQ(back.holder_address(), "127.0.0.1:7000");
}

TEST(ShardConfigTest, MalformedValuesAreRefusedNamingTheKeyAndWhy) {
  const struct {
    std::string value;
    const char* why;
  } cases[] = {
      {"", "not ShardConfig JSON"},
      {"garbage", "not ShardConfig JSON"},
      {"{\"epoch\":\"x\"}", "not ShardConfig JSON"},
      {"{\"epoch\":\"-1\",\"holder\":\"ab\"}", "not ShardConfig JSON"},
      {"{\"holder\":\"0123456789abcdef\"}", "epoch is 0"},
      {"{\"epoch\":\"18446744073709551615\",\"holder\":\"ab\"}", "cannot be bumped"},
      {"{\"epoch\":\"2\"}", "is not an instance id"},
      {"{\"epoch\":\"2\",\"holder\":\"a b\"}", "is not an instance id"},
      {"{\"epoch\":\"2\",\"holder\":\"ab\",\"replicas\":[\"\"]}", "replica"},
      {"{\"epoch\":\"2\",\"holder\":\"ab\",\"replicas\":[\"cd\",\"ab\"]}",
       "lists its holder ab among its replicas"},
      {"{\"epoch\":\"2\",\"holder\":\"ab\",\"replicas\":[\"cd\",\"cd\"]}",
       "lists replica cd twice"},
      {"{\"epoch\":\"2\",\"holder\":\"ab\",\"holderAddress\":\"h:1\\nx\"}",
       "not a printable host:port"},
      {std::string(kMaxShardConfigBytes + 1, ' '), "more than"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<v1::ShardConfig> parsed = ParseShardConfig(4, c.value);
    EXPECT_THAT(parsed.status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("etcd /shards/4 does not hold a shard")))
        << c.value.substr(0, 60);
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.why)) << c.value.substr(0, 60);
  }
}

TEST(ShardConfigTest, UnknownFieldsOfALaterReleaseAreIgnored) {
  ASSERT_OK_AND_ASSIGN(v1::ShardConfig config,
                       ParseShardConfig(0, "{\"epoch\":\"2\",\"holder\":\"ab\",\"later\":1}"));
  EXPECT_EQ(config.epoch(), 2u);
}

TEST(ShardConfigTest, AClaimBumpsTheEpochGuardedByTheRevisionRead) {
  ASSERT_OK_AND_ASSIGN(ShardClaim first, NextShardClaim(2, nullptr, "aaaa", "h:1"));
  EXPECT_EQ(first.config.epoch(), 1u);
  EXPECT_EQ(first.unchanged.key, "/shards/2");
  EXPECT_EQ(first.unchanged.number, 0);  // the key must still be absent
  EXPECT_EQ(first.put.key, "/shards/2");
  EXPECT_EQ(first.put.value, first.value);

  KeyValue current;
  current.key = "/shards/2";
  current.value = first.value;
  current.mod_revision = 41;
  ASSERT_OK_AND_ASSIGN(ShardClaim second, NextShardClaim(2, &current, "bbbb", "h:2"));
  EXPECT_EQ(second.config.epoch(), 2u);
  EXPECT_EQ(second.config.holder(), "bbbb");
  EXPECT_EQ(second.unchanged.number, 41);

  // Epochs already on disk (etcd lost its data): the claim goes above them.
  ASSERT_OK_AND_ASSIGN(ShardClaim above, NextShardClaim(2, nullptr, "cccc", "h:3", 9));
  EXPECT_EQ(above.config.epoch(), 10u);
  ASSERT_OK_AND_ASSIGN(ShardClaim below, NextShardClaim(2, &current, "cccc", "h:3", 1));
  EXPECT_EQ(below.config.epoch(), 2u);

  current.value = "{broken";
  EXPECT_THAT(NextShardClaim(2, &current, "bbbb", "h:2").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/shards/2")));
}

using ::testing::ElementsAre;

KeyValue Current(uint32_t shard, uint64_t epoch, const std::string& holder,
                 std::vector<std::string> replicas, int64_t mod_revision) {
  v1::ShardConfig config;
  config.set_epoch(epoch);
  config.set_holder(holder);
  config.set_holder_address("h:0");
  for (std::string& r : replicas) config.add_replicas(std::move(r));
  KeyValue kv;
  kv.key = absl::StrCat("/shards/", shard);
  kv.value = FormatShardConfig(config);
  kv.mod_revision = mod_revision;
  return kv;
}

TEST(ShardConfigTest, InitialReplicaSetsWrapAroundAndInvertEachOther) {
  EXPECT_THAT(*InitialReplicaIndices(0, 3, 2), ElementsAre(0, 1));
  EXPECT_THAT(*InitialReplicaIndices(2, 3, 2), ElementsAre(2, 0));
  EXPECT_THAT(*InitialReplicaIndices(1, 3, 3), ElementsAre(1, 2, 0));
  EXPECT_THAT(*InitialReplicaIndices(4, 5, 1), ElementsAre(4));
  EXPECT_THAT(*ShardsStartingOn(0, 3, 2), ElementsAre(0, 2));
  EXPECT_THAT(*ShardsStartingOn(1, 3, 3), ElementsAre(1, 0, 2));
  // Every (shard, server) pair appears in both views or in neither.
  for (uint32_t n = 1; n <= 5; ++n) {
    for (uint32_t r = 1; r <= n; ++r) {
      for (uint32_t shard = 0; shard < n; ++shard) {
        ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> servers, InitialReplicaIndices(shard, n, r));
        EXPECT_EQ(servers.size(), r);
        EXPECT_EQ(servers[0], shard);
        for (uint32_t server : servers) {
          ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> shards, ShardsStartingOn(server, n, r));
          EXPECT_NE(std::find(shards.begin(), shards.end(), shard), shards.end())
              << "n=" << n << " r=" << r << " shard=" << shard << " server=" << server;
        }
      }
    }
  }
}

TEST(ShardConfigTest, ReplicaCountsOutsideOneToTheServerCountAreRefused) {
  EXPECT_THAT(InitialReplicaIndices(0, 3, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--replicas=0")));
  EXPECT_THAT(InitialReplicaIndices(0, 3, 4).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("server count 3")));
  EXPECT_THAT(ShardsStartingOn(3, 3, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("index 3")));
  EXPECT_THAT(InitialReplicaIndices(0, 0, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

TEST(ShardConfigTest, ATakeoverBumpsTheEpochAndDropsTheOldHolder) {
  const KeyValue current = Current(1, 4, "aaaa", {"bbbb", "cccc"}, 17);
  ASSERT_OK_AND_ASSIGN(ShardClaim takeover, NextTakeover(1, current, "bbbb", "h:2"));
  EXPECT_EQ(takeover.config.epoch(), 5u);
  EXPECT_EQ(takeover.config.holder(), "bbbb");
  EXPECT_EQ(takeover.config.holder_address(), "h:2");
  EXPECT_THAT(takeover.config.replicas(), ElementsAre("cccc"));
  EXPECT_EQ(takeover.unchanged.key, "/shards/1");
  EXPECT_EQ(takeover.unchanged.number, 17);
  EXPECT_EQ(takeover.put.value, takeover.value);
  ASSERT_OK_AND_ASSIGN(v1::ShardConfig written, ParseShardConfig(1, takeover.value));
  EXPECT_EQ(written.holder(), "bbbb");

  // The last backup may take over too; the old holder is never kept.
  ASSERT_OK_AND_ASSIGN(ShardClaim last, NextTakeover(1, current, "cccc", "h:3"));
  EXPECT_THAT(last.config.replicas(), ElementsAre("bbbb"));

  // A successor that drops the other backups (they copy its state anew).
  ASSERT_OK_AND_ASSIGN(ShardClaim alone,
                       NextTakeover(1, current, "bbbb", "h:2", /*drop_other_backups=*/true));
  EXPECT_EQ(alone.config.epoch(), 5u);
  EXPECT_EQ(alone.config.holder(), "bbbb");
  EXPECT_TRUE(alone.config.replicas().empty());
}

TEST(ShardConfigTest, OnlyAListedBackupTakesOver) {
  const KeyValue current = Current(1, 4, "aaaa", {"bbbb"}, 17);
  EXPECT_THAT(NextTakeover(1, current, "dddd", "h:4").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("/shards/1 at epoch 4 does not list dddd as a replica")));
  EXPECT_THAT(NextTakeover(1, current, "aaaa", "h:1").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
  KeyValue broken = current;
  broken.value = "{";
  EXPECT_THAT(NextTakeover(1, broken, "bbbb", "h:2").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/shards/1")));
}

TEST(ShardConfigTest, TheHolderDropsAnUnreachableBackup) {
  const KeyValue current = Current(0, 2, "aaaa", {"bbbb", "cccc"}, 9);
  ASSERT_OK_AND_ASSIGN(ShardClaim dropped, NextWithoutReplica(0, current, "aaaa", "bbbb"));
  EXPECT_EQ(dropped.config.epoch(), 3u);
  EXPECT_EQ(dropped.config.holder(), "aaaa");
  EXPECT_THAT(dropped.config.replicas(), ElementsAre("cccc"));
  EXPECT_EQ(dropped.unchanged.number, 9);

  // A stale primary (not the holder any more) changes nothing.
  EXPECT_THAT(NextWithoutReplica(0, current, "bbbb", "cccc").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("held by aaaa, not bbbb: only the holder drops a replica")));
  EXPECT_THAT(NextWithoutReplica(0, current, "aaaa", "dddd").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("does not list replica dddd")));

  // Two at once: one epoch up, neither left.
  ASSERT_OK_AND_ASSIGN(ShardClaim both, NextWithoutReplicas(0, current, "aaaa", {"cccc", "bbbb"}));
  EXPECT_EQ(both.config.epoch(), 3u);
  EXPECT_TRUE(both.config.replicas().empty());
  EXPECT_THAT(NextWithoutReplicas(0, current, "aaaa", {"bbbb", "dddd"}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("does not list replica dddd")));
}

TEST(ShardConfigTest, TheHolderAddsAnAttachedStandbyLast) {
  const KeyValue current = Current(0, 2, "aaaa", {"bbbb"}, 9);
  ASSERT_OK_AND_ASSIGN(ShardClaim added, NextWithReplica(0, current, "aaaa", "cccc"));
  EXPECT_EQ(added.config.epoch(), 3u);
  EXPECT_EQ(added.config.holder(), "aaaa");
  EXPECT_THAT(added.config.replicas(), ElementsAre("bbbb", "cccc"));
  EXPECT_EQ(added.unchanged.number, 9);

  EXPECT_THAT(NextWithReplica(0, current, "bbbb", "cccc").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("held by aaaa, not bbbb: only the holder adds a replica")));
  EXPECT_THAT(NextWithReplica(0, current, "aaaa", "bbbb").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("already lists replica bbbb")));
  EXPECT_THAT(NextWithReplica(0, current, "aaaa", "aaaa").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not an instance id")));
  EXPECT_THAT(NextWithReplica(0, current, "aaaa", "no/id").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not an instance id")));
}

}  // namespace
}  // namespace pserver
