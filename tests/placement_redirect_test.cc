// Live moves, the first slice: servers started with placement_redirects
// follow etcd's /placement and refuse, with PlacementMoved and nothing
// applied, every dense block they no longer own; blocks they still own are
// served as before. Real etcd, two servers over gRPC; no timing: waits are
// bounded loops on conditions.
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/core/placement.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/placement_record.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/server/server.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;

// The first name (one block) on `from` of 2 servers and on `to` of 3.
std::string NameMoving(int from, int to) {
  for (int i = 0; i < 10000; ++i) {
    const std::string name = absl::StrCat("p", i);
    if (Placement::Jump(2, 1).ServerOf(name, 0) == from &&
        Placement::Jump(3, 1).ServerOf(name, 0) == to)
      return name;
  }
  ADD_FAILURE() << "no name from " << from << " to " << to;
  return "";
}

class PlacementRedirectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(etcd_, testing::EtcdProcess::Start());
    EtcdClientOptions options;
    options.endpoints = {etcd_->endpoint()};
    options.prefix = etcd_keys::ClusterPrefix("job");
    ASSERT_OK_AND_ASSIGN(etcd_client_, EtcdClient::Connect(options));
  }

  ServerOptions Options() const {
    ServerOptions options;
    options.etcd_endpoints = {etcd_->endpoint()};
    options.cluster = "job";
    options.num_servers = 2;
    options.lease_ttl = absl::Seconds(5);
    options.register_timeout = absl::Seconds(30);
    options.placement_redirects = true;
    return options;
  }

  std::unique_ptr<testing::EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> etcd_client_;
};

TEST_F(PlacementRedirectTest, ServersRefuseBlocksTheyNoLongerOwnAndServeTheRest) {
  auto start = [this] { return Server::Start(Options()); };
  std::future<absl::StatusOr<std::unique_ptr<Server>>> a = std::async(std::launch::async, start);
  std::future<absl::StatusOr<std::unique_ptr<Server>>> b = std::async(std::launch::async, start);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server_a, a.get());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server_b, b.get());

  ClientOptions options;
  options.etcd_endpoints = {etcd_->endpoint()};
  options.cluster = "job";
  options.discovery_timeout = absl::Seconds(30);
  options.timeout = absl::Seconds(30);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(options));
  ASSERT_EQ(client->num_servers(), 2);
  const uint64_t version = client->placement().version();
  ASSERT_GE(version, 1u);

  const std::string moving = NameMoving(0, 2);
  const std::string staying = NameMoving(1, 1);
  v1::ParameterConfig sgd;
  sgd.mutable_optimizer()->mutable_sgd();
  sgd.mutable_learning_rate()->set_learning_rate(1.0);
  for (const std::string& name : {moving, staying}) {
    ASSERT_OK(client->InitParam(name, Tensor::FromValues<float>({2}, {0, 0}), sgd));
  }
  ASSERT_OK(client->FinishInitParams());
  for (const std::string& name : {moving, staying}) {
    ASSERT_OK(client->SendGrad(name, Tensor::FromValues<float>({2}, {-1, -2})));
  }

  // /placement v+1 for three servers: `moving` is server 2's now.
  v1::Placement next;
  next.set_kind(v1::Placement::JUMP);
  next.set_num_servers(3);
  next.set_version(version + 1);
  ASSERT_OK(etcd_client_->Put(etcd_keys::PlacementKey(), FormatPlacementRecord(next)));

  // Until the server's watch delivers it, the push is applied; count those.
  int applied = 1;
  absl::Status refused;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (int i = 0; i < 6000 && absl::Now() < deadline; ++i) {
    refused = client->SendGrad(moving, Tensor::FromValues<float>({2}, {-1, -2}));
    if (!refused.ok()) break;
    ++applied;
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(PlacementMovedVersion(refused), std::optional<uint64_t>(version + 1)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("is on server 2 under it, not on this server 0"));
  EXPECT_EQ(PlacementMovedVersion(client->GetParam(moving).status()),
            std::optional<uint64_t>(version + 1));

  // The block that stays is served, pushes and reads alike.
  ASSERT_OK(client->SendGrad(staying, Tensor::FromValues<float>({2}, {-1, -2})));
  ASSERT_OK_AND_ASSIGN(Tensor w, client->GetParam(staying));
  EXPECT_EQ(w.ToVector<float>(), (std::vector<float>{2, 4}));

  // Nothing of the refused push was applied: back on the old placement the
  // block holds exactly the acknowledged pushes.
  v1::Placement back = next;
  back.set_num_servers(2);
  back.set_version(version + 2);
  ASSERT_OK(etcd_client_->Put(etcd_keys::PlacementKey(), FormatPlacementRecord(back)));
  absl::StatusOr<Tensor> read = absl::UnknownError("not read");
  for (int i = 0; i < 6000 && absl::Now() < deadline; ++i) {
    read = client->GetParam(moving);
    if (read.ok()) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_OK(read.status());
  EXPECT_EQ(read->ToVector<float>(),
            (std::vector<float>{static_cast<float>(applied), static_cast<float>(2 * applied)}));
}

TEST_F(PlacementRedirectTest, NeedsEtcd) {
  ServerOptions options;
  options.placement_redirects = true;
  EXPECT_THAT(Server::Start(options),
              ::pserver::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("--placement_redirects needs --etcd")));
}

}  // namespace
}  // namespace pserver
