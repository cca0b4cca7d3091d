#include "cc/etcd/placement_record.h"

#include <memory>
#include <optional>
#include <string>

#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::EtcdProcess;
using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

v1::Placement Jump(uint32_t n, uint64_t version) {
  v1::Placement p;
  p.set_kind(v1::Placement::JUMP);
  p.set_num_servers(n);
  p.set_version(version);
  return p;
}

TEST(PlacementRecordTest, FormatsAndParsesBack) {
  const v1::Placement p = Jump(4, 3);
  const std::string json = FormatPlacementRecord(p);
  EXPECT_THAT(json, HasSubstr("\"kind\":\"JUMP\""));
  ASSERT_OK_AND_ASSIGN(v1::Placement back, ParsePlacementRecord(json));
  EXPECT_EQ(back.SerializeAsString(), p.SerializeAsString());
  // A field of a later release is ignored.
  ASSERT_OK_AND_ASSIGN(back, ParsePlacementRecord(
                                 R"({"version":"2","kind":"JUMP","numServers":3,"later":1})"));
  EXPECT_EQ(back.num_servers(), 3u);
  // A move under way (docs/elastic.md).
  ASSERT_OK_AND_ASSIGN(back, ParsePlacementRecord(
      R"({"version":"5","kind":"JUMP","numServers":3,"moving":true,"fromNumServers":2})"));
  EXPECT_TRUE(back.moving());
  EXPECT_EQ(back.from_num_servers(), 2u);
}

TEST(PlacementRecordTest, RefusesMalformedValuesNamingTheKey) {
  for (const auto& [value, why] : std::vector<std::pair<std::string, std::string>>{
           {"not json", "is not Placement JSON"},
           {R"({"version":"1","kind":"RING","numServers":3})", "kind is not JUMP"},
           {R"({"version":"1","kind":"MODULO","numServers":3})", "kind is not JUMP"},
           {R"({"version":"1","numServers":3})", "kind is not JUMP"},
           {R"({"version":"0","kind":"JUMP","numServers":3})", "version is 0"},
           {R"({"version":"1","kind":"JUMP","numServers":0})", "num_servers must be in [1, 4096]"},
           {R"({"version":"1","kind":"JUMP","numServers":5000})", "got 5000"},
           {R"({"version":"1","kind":9,"numServers":2})", "kind is not JUMP"},
           {std::string(5000, ' '), "more than 4096"},
           {R"({"version":"2","kind":"JUMP","numServers":3,"moving":true})",
            "moving from 0 servers to 3"},
           {R"({"version":"2","kind":"JUMP","numServers":3,"moving":true,"fromNumServers":3})",
            "differ from num_servers"},
           {R"({"version":"2","kind":"JUMP","numServers":3,"moving":true,"fromNumServers":5000})",
            "moving from 5000 servers"},
           {R"({"version":"2","kind":"JUMP","numServers":3,"fromNumServers":2})",
            "not moving but names from_num_servers 2"},
       }) {
    SCOPED_TRACE(value.substr(0, 60));
    EXPECT_THAT(ParsePlacementRecord(value),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("etcd /placement does not hold a placement"),
                               HasSubstr(why))));
  }
}

class EnsurePlacementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(etcd_, EtcdProcess::Start());
    EtcdClientOptions options;
    options.endpoints = {etcd_->endpoint()};
    options.prefix = "/pserver/test";
    ASSERT_OK_AND_ASSIGN(client_, EtcdClient::Connect(options));
  }

  std::unique_ptr<EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(EnsurePlacementTest, WritesVersionOneThenBumpsOnAnotherCount) {
  ASSERT_OK_AND_ASSIGN(std::optional<v1::Placement> none, ReadPlacement(*client_));
  EXPECT_FALSE(none.has_value());
  ASSERT_OK_AND_ASSIGN(v1::Placement first, EnsurePlacement(*client_, 3));
  EXPECT_EQ(first.SerializeAsString(), Jump(3, 1).SerializeAsString());
  ASSERT_OK_AND_ASSIGN(KeyValue kv, client_->Get(etcd_keys::PlacementKey()));
  // The same count again: nothing written.
  ASSERT_OK_AND_ASSIGN(v1::Placement same, EnsurePlacement(*client_, 3));
  EXPECT_EQ(same.version(), 1u);
  ASSERT_OK_AND_ASSIGN(KeyValue again, client_->Get(etcd_keys::PlacementKey()));
  EXPECT_EQ(again.mod_revision, kv.mod_revision);
  // Another count: version 2.
  ASSERT_OK_AND_ASSIGN(v1::Placement grown, EnsurePlacement(*client_, 5));
  EXPECT_EQ(grown.SerializeAsString(), Jump(5, 2).SerializeAsString());
  ASSERT_OK_AND_ASSIGN(std::optional<v1::Placement> read, ReadPlacement(*client_));
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->SerializeAsString(), grown.SerializeAsString());
  EXPECT_THAT(EnsurePlacement(*client_, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_servers")));
}

TEST_F(EnsurePlacementTest, AMovingPlacementIsLeftToItsCoordinator) {
  v1::Placement moving = Jump(3, 4);
  moving.set_moving(true);
  moving.set_from_num_servers(2);
  ASSERT_OK(client_->Put(etcd_keys::PlacementKey(), FormatPlacementRecord(moving)));
  ASSERT_OK_AND_ASSIGN(KeyValue kv, client_->Get(etcd_keys::PlacementKey()));
  for (uint32_t count : {2u, 3u, 4u}) {
    ASSERT_OK_AND_ASSIGN(v1::Placement held, EnsurePlacement(*client_, count));
    EXPECT_EQ(held.SerializeAsString(), moving.SerializeAsString());
  }
  ASSERT_OK_AND_ASSIGN(KeyValue again, client_->Get(etcd_keys::PlacementKey()));
  EXPECT_EQ(again.mod_revision, kv.mod_revision);
}

TEST_F(EnsurePlacementTest, AMalformedValueIsAnErrorAndStaysAsItWas) {
  ASSERT_OK(client_->Put(etcd_keys::PlacementKey(), "{garbage"));
  EXPECT_THAT(EnsurePlacement(*client_, 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not Placement JSON")));
  EXPECT_THAT(ReadPlacement(*client_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not Placement JSON")));
  ASSERT_OK_AND_ASSIGN(KeyValue kv, client_->Get(etcd_keys::PlacementKey()));
  EXPECT_EQ(kv.value, "{garbage");
}

}  // namespace
}  // namespace pserver
