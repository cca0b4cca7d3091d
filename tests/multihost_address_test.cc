// The address a server publishes (ServerOptions.advertise_host), in one
// process on loopback: refused when there is none to publish, published in
// etcd as given (IPv6 in brackets), and reached by clients through etcd over
// gRPC and the bulk channel's TCP port. The same across real hosts:
// tests/multihost_test.cc.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cc/client/client.h"
#include "cc/core/tensor.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/server/bulk_listener.h"
#include "cc/server/server.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

v1::ParameterConfig Sgd() {
  v1::ParameterConfig config;
  config.mutable_optimizer()->mutable_sgd();
  config.mutable_learning_rate()->set_learning_rate(1);
  return config;
}

// Pushes -1 twice into a new parameter of zeros through `client`; expects 2.
void PushTwice(Client& client) {
  ASSERT_OK(client.InitParam("w", Tensor::FromValues<float>({4}, {0, 0, 0, 0}), Sgd()));
  ASSERT_OK(client.FinishInitParams());
  const Tensor grad = Tensor::FromValues<float>({4}, {-1, -1, -1, -1});
  Tensor out;
  ASSERT_OK(client.PushPull("w", grad, &out));
  ASSERT_OK(client.PushPull("w", grad, &out));
  EXPECT_THAT(out.values<float>(), ::testing::ElementsAre(2, 2, 2, 2));
}

// Without the Unix socket a client can only use the bulk channel over TCP.
ServerOptions TcpOnly(const std::string& host, const std::string& advertise_host) {
  ServerOptions options;
  options.host = host;
  options.advertise_host = advertise_host;
  options.bulk_unix_socket = false;
  return options;
}

TEST(MultihostAddressTest, EveryAddressWithoutAnAdvertiseHostIsRefused) {
  for (const char* host : {"0.0.0.0", "::"}) {
    EXPECT_THAT(Server::Start(TcpOnly(host, "")),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--advertise_host")))
        << host;
  }
  EXPECT_THAT(Server::Start(TcpOnly("0.0.0.0", "0.0.0.0")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unspecified")));
  EXPECT_THAT(Server::Start(TcpOnly("0.0.0.0", "127.0.0.1:7000")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("without a port")));
}

TEST(MultihostAddressTest, Ipv6LoopbackIsBracketedAndServesOverTheBulkChannel) {
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(TcpOnly("::1", ""));
  if (absl::IsUnavailable(server.status())) {
    GTEST_SKIP() << "no IPv6 loopback here: " << server.status();
  }
  ASSERT_OK(server.status());
  EXPECT_EQ((*server)->address(), absl::StrCat("[::1]:", (*server)->port()));
  ClientOptions options;
  options.servers = {(*server)->address()};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(options));
  PushTwice(*client);
  ASSERT_NE((*server)->bulk_listener(), nullptr);
  EXPECT_GE((*server)->bulk_listener()->connections(), 1) << "pushes went over gRPC only";
}

// host, advertise_host, and the address etcd must hold (with the port).
struct Published {
  std::string host, advertise_host, expected_host;
};

class PublishedAddressTest : public ::testing::TestWithParam<Published> {};

TEST_P(PublishedAddressTest, EtcdHoldsTheAdvertisedAddressAndClientsReachIt) {
  const Published& p = GetParam();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<testing::EtcdProcess> etcd, testing::EtcdProcess::Start());
  ServerOptions options = TcpOnly(p.host, p.advertise_host);
  options.etcd_endpoints = {etcd->endpoint()};
  options.cluster = "advertised";
  options.num_servers = 1;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
  if (absl::IsUnavailable(server.status()) && absl::StrContains(p.host, ':')) {
    GTEST_SKIP() << "no IPv6 here: " << server.status();
  }
  ASSERT_OK(server.status());
  const std::string expected = absl::StrCat(p.expected_host, ":", (*server)->port());
  EXPECT_EQ((*server)->address(), expected);

  EtcdClientOptions etcd_options;
  etcd_options.endpoints = {etcd->endpoint()};
  etcd_options.prefix = etcd_keys::ClusterPrefix("advertised");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> registry, EtcdClient::Connect(etcd_options));
  ASSERT_OK_AND_ASSIGN(KeyValue kv, registry->Get(etcd_keys::ServerKey(0)));
  ASSERT_OK_AND_ASSIGN(etcd_keys::ServerEntry entry, etcd_keys::ParseServerValue(kv.value));
  EXPECT_EQ(entry.address, expected);
  EXPECT_FALSE(entry.instance_id.empty()) << kv.value;

  ClientOptions client_options;
  client_options.etcd_endpoints = {etcd->endpoint()};
  client_options.cluster = "advertised";
  client_options.register_worker = false;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(client_options));
  PushTwice(*client);
  EXPECT_GE((*server)->bulk_listener()->connections(), 1) << "pushes went over gRPC only";
}

INSTANTIATE_TEST_SUITE_P(Hosts, PublishedAddressTest,
                         ::testing::Values(Published{"0.0.0.0", "127.0.0.1", "127.0.0.1"},
                                           Published{"::", "::1", "[::1]"},
                                           Published{"::", "[::1]", "[::1]"},
                                           Published{"127.0.0.1", "", "127.0.0.1"}));

}  // namespace
}  // namespace pserver
