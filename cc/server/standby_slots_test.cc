// The standby slots of a --replicas process (cc/server/standby_slots.h,
// docs/replication.md "Replicas in the serving processes"): a slot whose
// server took a shard over and then stepped down is shut down and replaced
// by a fresh standby, which backs up a shard again. A real etcd and real
// servers in this process; every wait is on a condition, bounded.
#include "cc/server/standby_slots.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/shard_config.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/server/process_slots.h"
#include "cc/server/server.h"
#include "cc/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

constexpr absl::Duration kWait = absl::Seconds(90);

template <typename Condition>
bool WaitFor(Condition condition) {
  const absl::Time deadline = absl::Now() + kWait;
  for (int i = 0; i < 10000; ++i) {
    if (condition()) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

class StandbySlotsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(etcd_process_, testing::EtcdProcess::Start());
    EtcdClientOptions options;
    options.endpoints = {etcd_process_->endpoint()};
    options.prefix = etcd_keys::ClusterPrefix("slots");
    ASSERT_OK_AND_ASSIGN(etcd_, EtcdClient::Connect(options));
  }

  // A server of "a process" of its own (its own ProcessSlots).
  ServerOptions ProcessOptions() const {
    ServerOptions options;
    options.host = "127.0.0.1";
    options.etcd_endpoints = {etcd_process_->endpoint()};
    options.cluster = "slots";
    options.num_servers = 1;
    options.lease_ttl = absl::Seconds(2);
    options.register_timeout = absl::Minutes(5);  // a standby waits for a shard
    options.process_slots = std::make_shared<ProcessSlots>();
    options.stop = std::make_shared<absl::Notification>();
    return options;
  }

  ServerOptions PrimaryOptions() const {
    ServerOptions options = ProcessOptions();
    options.accept_standbys = true;
    return options;
  }

  v1::ShardConfig Config() {
    absl::StatusOr<KeyValue> kv = etcd_->Get(etcd_keys::ShardKey(0));
    if (!kv.ok()) return {};
    absl::StatusOr<v1::ShardConfig> config = ParseShardConfig(0, kv->value);
    return config.ok() ? *config : v1::ShardConfig();
  }

  std::unique_ptr<testing::EtcdProcess> etcd_process_;
  std::unique_ptr<EtcdClient> etcd_;
};

TEST_F(StandbySlotsTest, ASlotWhoseServerSteppedDownIsReplacedByAFreshStandby) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> primary, Server::Start(PrimaryOptions()));
  // Another process with one standby slot (--replicas=2).
  ServerOptions process = ProcessOptions();
  absl::Mutex mu;
  std::vector<std::pair<std::string, int64_t>> took_over;  // (instance, lease)
  std::vector<std::string> lines;
  StandbySlots slots(
      process, 1,
      [&](const Server& server) {
        absl::MutexLock lock(&mu);
        took_over.emplace_back(server.instance_id(), server.lease());
      },
      [&](const std::string& line) {
        absl::MutexLock lock(&mu);
        lines.push_back(line);
      });
  auto logged = [&](const std::string& words) {
    absl::MutexLock lock(&mu);
    for (const std::string& line : lines) {
      if (absl::StrContains(line, words)) return true;
    }
    return false;
  };
  // The slot backs shard 0 up.
  ASSERT_TRUE(WaitFor([&] { return Config().replicas_size() == 1; }));
  const std::string first = Config().replicas(0);
  // Its primary goes: the slot takes the shard over and serves it.
  primary->Shutdown();
  primary.reset();
  ASSERT_TRUE(WaitFor([&] { return slots.serving() == 1; }));
  int64_t lease = 0;
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(took_over.size(), 1u);
    EXPECT_EQ(took_over[0].first, first);
    lease = took_over[0].second;
  }
  EXPECT_EQ(Config().holder(), first);
  // It is fenced: etcd names another holder one epoch up, and its lease is
  // gone (as if it had expired while the process was paused). It steps down.
  v1::ShardConfig other;
  other.set_epoch(Config().epoch() + 1);
  other.set_holder("c0c0c0c0c0c0c0c0");
  ASSERT_OK(etcd_->Put(etcd_keys::ShardKey(0), FormatShardConfig(other)));
  ASSERT_OK(etcd_->Revoke(lease));
  // The slot shuts it down and starts a fresh standby in its place.
  ASSERT_TRUE(WaitFor([&] { return slots.replaced() == 1 && slots.serving() == 0; }));
  EXPECT_TRUE(logged("its server of shard 0 stepped down; shutting it down and starting a "
                     "fresh standby in its place"));
  // A new primary claims the shard: the fresh standby (a new instance)
  // backs it up, so the process backs up a shard again.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> second, Server::Start(PrimaryOptions()));
  ASSERT_TRUE(WaitFor([&] { return Config().replicas_size() == 1; }));
  const v1::ShardConfig now = Config();
  EXPECT_EQ(now.holder(), second->instance_id());
  EXPECT_NE(now.replicas(0), first);
  EXPECT_EQ(slots.serving(), 0);
  EXPECT_EQ(slots.replaced(), 1);
  process.stop->Notify();
  EXPECT_OK(slots.Stop(absl::ZeroDuration()));
  second->Shutdown();
}

}  // namespace
}  // namespace pserver
