#include "cc/etcd/shard_config.h"

#include <string>

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

}  // namespace
}  // namespace pserver
