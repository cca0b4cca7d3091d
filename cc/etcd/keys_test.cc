#include "cc/etcd/keys.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace etcd_keys {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

TEST(KeysTest, Layout) {
  EXPECT_EQ(ClusterPrefix("job"), "/pserver/job");
  EXPECT_EQ(DesiredKey(), "/ps_desired");
  EXPECT_EQ(ServersPrefix(), "/ps/");
  EXPECT_EQ(ServerKey(0), "/ps/0");
  EXPECT_EQ(ServerKey(4294967295u), "/ps/4294967295");
  EXPECT_EQ(CheckpointsPrefix(), "/checkpoints/");
  EXPECT_EQ(CheckpointKey(12), "/checkpoints/12");
  EXPECT_EQ(WorkersPrefix(), "/workers/");
  EXPECT_EQ(WorkerKey("trainer-7"), "/workers/trainer-7");
  EXPECT_EQ(ShardsPrefix(), "/shards/");
  EXPECT_EQ(ShardKey(3), "/shards/3");
}

TEST(KeysTest, ParseGivesBackWhatTheLayoutWrote) {
  ASSERT_OK_AND_ASSIGN(ParsedKey desired, Parse(DesiredKey()));
  EXPECT_EQ(desired.kind, KeyKind::kDesired);
  ASSERT_OK_AND_ASSIGN(ParsedKey server, Parse(ServerKey(17)));
  EXPECT_EQ(server.kind, KeyKind::kServer);
  EXPECT_EQ(server.index, 17u);
  ASSERT_OK_AND_ASSIGN(ParsedKey checkpoint, Parse(CheckpointKey(0)));
  EXPECT_EQ(checkpoint.kind, KeyKind::kCheckpoint);
  EXPECT_EQ(checkpoint.index, 0u);
  ASSERT_OK_AND_ASSIGN(ParsedKey shard, Parse(ShardKey(5)));
  EXPECT_EQ(shard.kind, KeyKind::kShard);
  EXPECT_EQ(shard.index, 5u);
  ASSERT_OK_AND_ASSIGN(ParsedKey worker, Parse(WorkerKey("a/b c")));
  EXPECT_EQ(worker.kind, KeyKind::kWorker);
  EXPECT_EQ(worker.worker_id, "a/b c");
  ASSERT_OK_AND_ASSIGN(uint32_t index, ParseServerKey(ServerKey(4294967295u)));
  EXPECT_EQ(index, 4294967295u);
}

TEST(KeysTest, ParseRefusesKeysOutsideTheLayoutNamingThem) {
  for (const char* key : {"/ps/", "/ps/x", "/ps/-1", "/ps/+1", "/ps/ 1", "/ps/01", "/ps/1/",
                          "/ps/4294967296", "/checkpoints/", "/checkpoints/0x1", "/shards/",
                          "/shards/01", "/workers/", "/ps_desired/", "/other", "", "ps/0"}) {
    EXPECT_THAT(Parse(key), StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr(absl::StrCat("'", key, "'"))))
        << key;
  }
  EXPECT_THAT(ParseServerKey("/checkpoints/0"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/ps/<index>")));
  EXPECT_THAT(ParseServerKey("/ps/9999999999"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("below 2^32")));
}

TEST(KeysTest, ParseIndexTakesCanonicalDecimalOnly) {
  ASSERT_OK_AND_ASSIGN(uint32_t zero, ParseIndex("0"));
  EXPECT_EQ(zero, 0u);
  ASSERT_OK_AND_ASSIGN(uint32_t big, ParseIndex("4294967295"));
  EXPECT_EQ(big, 4294967295u);
  for (const char* text : {"", "00", "07", "+7", "-7", " 7", "7 ", "0x7", "4294967296"}) {
    EXPECT_THAT(ParseIndex(text), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr(absl::StrCat("'", text, "'"))))
        << text;
  }
}

TEST(KeysTest, ServerValueCarriesTheInstanceId) {
  const std::string id = NewInstanceId();
  EXPECT_EQ(id.size(), 16u);
  EXPECT_NE(id, NewInstanceId());
  const std::string value = FormatServerValue({"10.0.0.1:7000", id});
  EXPECT_EQ(value, absl::StrCat("10.0.0.1:7000 instance=", id));
  ASSERT_OK_AND_ASSIGN(ServerEntry entry, ParseServerValue(value));
  EXPECT_EQ(entry.address, "10.0.0.1:7000");
  EXPECT_EQ(entry.instance_id, id);
  // The form before instance ids.
  ASSERT_OK_AND_ASSIGN(entry, ParseServerValue("[::1]:7000"));
  EXPECT_EQ(entry.address, "[::1]:7000");
  EXPECT_EQ(entry.instance_id, "");
  for (const char* bad : {"", " instance=ab", "a:1 instance=", "a:1 instance=a b", "a b:1"}) {
    EXPECT_THAT(ParseServerValue(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("host:port instance=<id>")))
        << bad;
  }
}

TEST(KeysTest, ServerValueCarriesTheMetricsAddress) {
  const ServerEntry written{"10.0.0.1:7000", "00ff00ff00ff00ff", "10.0.0.1:9100"};
  const std::string value = FormatServerValue(written);
  EXPECT_EQ(value, "10.0.0.1:7000 instance=00ff00ff00ff00ff metrics=10.0.0.1:9100");
  ASSERT_OK_AND_ASSIGN(ServerEntry entry, ParseServerValue(value));
  EXPECT_EQ(entry.address, written.address);
  EXPECT_EQ(entry.instance_id, written.instance_id);
  EXPECT_EQ(entry.metrics_address, written.metrics_address);
  ASSERT_OK_AND_ASSIGN(entry, ParseServerValue("[fd00::7]:7000 instance=ab metrics=[fd00::7]:1"));
  EXPECT_EQ(entry.metrics_address, "[fd00::7]:1");
  // A value without it (an older server, or no --metrics_port) stays valid.
  ASSERT_OK_AND_ASSIGN(entry, ParseServerValue("10.0.0.1:7000 instance=ab"));
  EXPECT_EQ(entry.metrics_address, "");
  EXPECT_EQ(FormatServerValue(entry), "10.0.0.1:7000 instance=ab");
  const std::pair<const char*, const char*> bad[] = {
      {"a:1 instance=ab metrics=", "metrics= is not host:port"},
      {"a:1 instance=ab metrics=h", "metrics= is not host:port"},
      {"a:1 instance=ab metrics=h:0", "metrics= is not host:port"},
      {"a:1 instance=ab metrics=h:65536", "metrics= is not host:port"},
      {"a:1 instance=ab metrics=h:09", "metrics= is not host:port"},
      {"a:1 instance=ab metrics=:9", "metrics= is not host:port"},
      {"a:1 instance=ab metrics=[::1:9", "metrics= is not host:port"},
      {"a:1 instance=ab metrics=h=x:9", "metrics= is not host:port"},
      {"a:1 instance=ab metrics=h\x01:9", "metrics= is not host:port"},
      {"a:1 metrics=h:9", "unexpected field 'metrics=h:9'"},
      {"a:1 metrics=h:9 instance=ab", "unexpected field 'metrics=h:9'"},
      {"a:1 instance=ab metrics=h:9 metrics=h:9", "more than three fields"},
      {"a:1 instance=ab instance=cd", "unexpected field 'instance=cd'"},
      {"a:1 instance=ab color=red", "unexpected field 'color=red'"},
      {"a:1  instance=ab", "unexpected field ''"},
      {"a:1 instance=ab metrics=h:9 ", "more than three fields"},
  };
  for (const auto& [value, why] : bad) {
    EXPECT_THAT(ParseServerValue(value),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(why)))
        << value;
  }
}

}  // namespace
}  // namespace etcd_keys
}  // namespace pserver
