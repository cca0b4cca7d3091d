// Registry fencing (docs/security.md): /ps/<idx> names a server's address and
// the instance id it drew at start; a client sends that id with every call
// and the server it reached refuses another, so a stale entry pointing at a
// different live server applies nothing there. An entry that names no
// instance (written by hand with etcdctl, or by a rogue) is refused by
// clients with require_instance_id (and used as before without it).
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/core/tensor.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/server/server.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

class RegistryFencingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(etcd_, testing::EtcdProcess::Start());
    a_ = StartServer("a");
    b_ = StartServer("b");
    EtcdClientOptions options;
    options.endpoints = {etcd_->endpoint()};
    options.prefix = etcd_keys::ClusterPrefix("a");
    ASSERT_OK_AND_ASSIGN(registry_, EtcdClient::Connect(options));
  }

  std::unique_ptr<Server> StartServer(const std::string& cluster) {
    ServerOptions options;
    options.etcd_endpoints = {etcd_->endpoint()};
    options.cluster = cluster;
    options.num_servers = 1;
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
    EXPECT_OK(server.status());
    return server.ok() ? *std::move(server) : nullptr;
  }

  absl::StatusOr<std::unique_ptr<Client>> ConnectA(bool require_instance_id = false) {
    ClientOptions options;
    options.require_instance_id = require_instance_id;
    options.etcd_endpoints = {etcd_->endpoint()};
    options.cluster = "a";
    options.register_worker = false;
    options.timeout = absl::Seconds(2);
    options.discovery_timeout = absl::Seconds(10);
    return Client::Connect(options);
  }

  std::unique_ptr<testing::EtcdProcess> etcd_;
  std::unique_ptr<Server> a_, b_;
  std::unique_ptr<EtcdClient> registry_;
};

TEST_F(RegistryFencingTest, ServerPublishesItsInstance) {
  ASSERT_OK_AND_ASSIGN(KeyValue kv, registry_->Get(etcd_keys::ServerKey(0)));
  ASSERT_OK_AND_ASSIGN(etcd_keys::ServerEntry entry, etcd_keys::ParseServerValue(kv.value));
  EXPECT_EQ(entry.address, a_->address());
  EXPECT_EQ(entry.instance_id, a_->instance_id());
  EXPECT_NE(a_->instance_id(), b_->instance_id());
  ASSERT_OK_AND_ASSIGN(auto client, ConnectA());
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({1}, {1})));
}

TEST_F(RegistryFencingTest, StaleEntryPointingAtAnotherLiveServerIsRefused) {
  // /ps/0 of cluster a names a's instance but b's address (as when a died
  // and b took its port).
  ASSERT_OK(registry_->Put(etcd_keys::ServerKey(0),
                           etcd_keys::FormatServerValue({b_->address(), a_->instance_id()})));
  ASSERT_OK_AND_ASSIGN(auto client, ConnectA());
  EXPECT_THAT(client->InitParam("w", Tensor::FromValues<float>({1}, {1})),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr(absl::StrCat("this server is instance ", b_->instance_id(),
                                              ", not ", a_->instance_id()))));
  // Nothing reached b's store.
  EXPECT_EQ(b_->store().GetStats().blocks, 0u);
}

TEST_F(RegistryFencingTest, EntryWithoutInstanceIsRefused) {
  // What `etcdctl put /pserver/a/ps/0 <host:port>` writes.
  ASSERT_OK(registry_->Put(etcd_keys::ServerKey(0), b_->address()));
  EXPECT_THAT(ConnectA(/*require_instance_id=*/true),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("a rogue or hand-written registry entry")));
  // Without the option a bare address is used as before (hand registration).
  ASSERT_OK_AND_ASSIGN(auto client, ConnectA());
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({1}, {1})));
  EXPECT_GT(b_->store().GetStats().blocks, 0u);
}

TEST_F(RegistryFencingTest, RogueInstanceIsRefused) {
  ASSERT_OK(registry_->Put(etcd_keys::ServerKey(0),
                           etcd_keys::FormatServerValue({b_->address(), "0123456789abcdef"})));
  ASSERT_OK_AND_ASSIGN(auto client, ConnectA());
  EXPECT_THAT(client->GetParam("w"),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("not 0123456789abcdef that etcd named")));
}

}  // namespace
}  // namespace pserver
