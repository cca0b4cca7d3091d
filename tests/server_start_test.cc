// Server::Start stops waiting when ServerOptions::stop is notified (pserver
// does so on SIGTERM): here while every index in a real etcd is taken, where
// it would otherwise wait for --register_timeout.
#include <memory>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
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

TEST(ServerStartTest, StopEndsTheWaitForAFreeIndex) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<testing::EtcdProcess> etcd, testing::EtcdProcess::Start());
  EtcdClientOptions etcd_options;
  etcd_options.endpoints = {etcd->endpoint()};
  etcd_options.prefix = etcd_keys::ClusterPrefix("full");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> registry, EtcdClient::Connect(etcd_options));
  ASSERT_OK(registry->Put(etcd_keys::DesiredKey(), "1"));
  ASSERT_OK(registry->Put(etcd_keys::ServerKey(0), "127.0.0.1:1"));  // taken, and never freed

  ServerOptions options;
  options.etcd_endpoints = {etcd->endpoint()};
  options.cluster = "full";
  options.register_timeout = absl::Seconds(300);
  options.stop = std::make_shared<absl::Notification>();
  // Stopped before it even starts: Start looks once, finds every index
  // taken, and gives up instead of waiting 300 s.
  options.stop->Notify();
  const absl::Time started = absl::Now();
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
  EXPECT_THAT(server.status(),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("stopped while starting")));
  EXPECT_LT(absl::Now() - started, absl::Seconds(60));  // generous: the old code took 300 s
  // The index stays the other server's.
  ASSERT_OK_AND_ASSIGN(KeyValue kv, registry->Get(etcd_keys::ServerKey(0)));
  EXPECT_EQ(kv.value, "127.0.0.1:1");
}

}  // namespace
}  // namespace pserver
