// Replication on the standby model, end to end (docs/replication.md): real
// etcd, two server processes with --accept_standbys and one --standby each.
// Deterministic SGD (integer gradients, learning rate 1: sums are exact in
// float32) runs in a trainer thread while the test kill -9s each primary in
// turn at a seeded random step; its standby takes the shard over, the
// trainer's calls follow /ps/<i> and are retried with the same request ids,
// and training completes. The final parameters equal, to the bit, the
// initial values minus every gradient acknowledged; and once the standbys
// attached, each primary's state checksum equals its backup's. Every wait is
// bounded in count and time; every process is stopped by its PID.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/core/tensor.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/shard_config.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/metrics/http_client.h"
#include "cc/testing/child_process.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "pserver/v1/service.grpc.pb.h"

namespace pserver {
namespace {

constexpr absl::Duration kWait = absl::Seconds(90);
constexpr char kCluster[] = "replication";
constexpr int kServers = 2;
constexpr int kParams = 8;
constexpr int kWidth = 16;
constexpr int kSteps = 500;
constexpr int kKills = 20;

std::string Param(int p) { return absl::StrCat("w", p); }

// The integer gradient of parameter p at step s, element e (1..5).
float Gradient(int step, int p, int e) {
  return static_cast<float>((step * 7 + p * 3 + e) % 5 + 1);
}

Tensor GradientTensor(int step, int p) {
  std::vector<float> values(kWidth);
  for (int e = 0; e < kWidth; ++e) values[e] = Gradient(step, p, e);
  return Tensor::FromValues<float>({kWidth}, values);
}

class ReplicationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(etcd_, testing::EtcdProcess::Start());
    EtcdClientOptions options;
    options.endpoints = {etcd_->endpoint()};
    options.prefix = etcd_keys::ClusterPrefix(kCluster);
    ASSERT_OK_AND_ASSIGN(etcd_client_, EtcdClient::Connect(options));
  }

  std::vector<std::string> Flags() const {
    std::vector<std::string> flags = {"--host=127.0.0.1",
                                      "--port=0",
                                      "--etcd=" + etcd_->endpoint(),
                                      absl::StrCat("--cluster=", kCluster),
                                      absl::StrCat("--num_servers=", kServers),
                                      absl::StrCat("--lease_ttl=", lease_ttl_s_),
                                      "--register_timeout=60"};
    flags.insert(flags.end(), extra_flags_.begin(), extra_flags_.end());
    return flags;
  }

  // Server `index` (they claim indices in start order), accepting standbys.
  std::unique_ptr<ChildProcess> StartPrimary(uint32_t index) {
    std::vector<std::string> flags = Flags();
    flags.push_back("--accept_standbys");
    absl::StatusOr<std::unique_ptr<ChildProcess>> child =
        ChildProcess::Spawn(RunfilesPath("cc/server/pserver"), flags);
    EXPECT_OK(child);
    if (!child.ok()) return nullptr;
    absl::StatusOr<std::string> listening =
        WaitForPserverAddress(**child, index, absl::Now() + kWait);
    EXPECT_OK(listening) << (*child)->output();
    if (!listening.ok()) return nullptr;
    return *std::move(child);
  }

  // kServers servers, index i the i-th; fewer when one failed to start.
  std::vector<std::unique_ptr<ChildProcess>> StartPrimaries() {
    std::vector<std::unique_ptr<ChildProcess>> primaries;
    for (uint32_t i = 0; i < kServers; ++i) {
      std::unique_ptr<ChildProcess> primary = StartPrimary(i);
      if (primary == nullptr) break;
      primaries.push_back(std::move(primary));
    }
    return primaries;
  }

  // A standby; returns once /shards/<shard> lists it (shards fill in order).
  std::unique_ptr<ChildProcess> StartStandby(uint32_t shard) {
    std::vector<std::string> flags = Flags();
    flags.push_back("--standby");
    flags.push_back("--accept_standbys");
    absl::StatusOr<std::unique_ptr<ChildProcess>> child =
        ChildProcess::Spawn(RunfilesPath("cc/server/pserver"), flags);
    EXPECT_OK(child);
    if (!child.ok()) return nullptr;
    bool listed = false;
    for (int i = 0; i < 4500 && !listed; ++i) {
      listed = Config(shard).replicas_size() == 1;
      if (!listed) absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_TRUE(listed) << "no standby attached to shard " << shard << ": " << (*child)->output();
    return *std::move(child);
  }

  // A trainer following /ps/<i>, retrying with the same request ids; the
  // parameters initialised to 0 (SGD, learning rate 1), and `big` more,
  // "big<k>", of `big_floats` zeros each.
  std::unique_ptr<Client> ConnectAndInit(int big = 0, int big_floats = 0) {
    ClientOptions options;
    options.etcd_endpoints = {etcd_->endpoint()};
    options.cluster = kCluster;
    options.timeout = kWait;
    options.discovery_timeout = kWait;
    options.initial_backoff = absl::Milliseconds(10);
    options.attempt_timeout = absl::Seconds(5);
    absl::StatusOr<std::unique_ptr<Client>> trainer = Client::Connect(options);
    EXPECT_OK(trainer);
    if (!trainer.ok()) return nullptr;
    v1::ParameterConfig sgd;
    sgd.mutable_optimizer()->mutable_sgd();
    sgd.mutable_learning_rate()->set_learning_rate(1.0);
    for (int p = 0; p < kParams; ++p) {
      absl::Status init = (*trainer)->InitParam(
          Param(p), Tensor::FromValues<float>({kWidth}, std::vector<float>(kWidth, 0)), sgd);
      EXPECT_OK(init);
      if (!init.ok()) return nullptr;
    }
    for (int k = 0; k < big; ++k) {
      absl::Status init = (*trainer)->InitParam(
          absl::StrCat("big", k),
          Tensor::FromValues<float>({big_floats}, std::vector<float>(big_floats, 0)), sgd);
      EXPECT_OK(init);
      if (!init.ok()) return nullptr;
    }
    EXPECT_OK((*trainer)->FinishInitParams());
    return *std::move(trainer);
  }

  v1::ShardConfig Config(uint32_t shard) {
    absl::StatusOr<KeyValue> kv = etcd_client_->Get(etcd_keys::ShardKey(shard));
    if (!kv.ok()) return {};
    absl::StatusOr<v1::ShardConfig> config = ParseShardConfig(shard, kv->value);
    EXPECT_OK(config);
    return config.ok() ? *config : v1::ShardConfig();
  }

  // The address in etcd key `key` (a /ps/<i> or /standby/<i> value).
  std::string AddressAt(const std::string& key) {
    absl::StatusOr<KeyValue> kv = etcd_client_->Get(key);
    EXPECT_OK(kv) << key;
    if (!kv.ok()) return "";
    absl::StatusOr<etcd_keys::ServerEntry> entry = etcd_keys::ParseServerValue(kv->value);
    EXPECT_OK(entry);
    return entry.ok() ? entry->address : "";
  }

  std::unique_ptr<testing::EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> etcd_client_;
  int lease_ttl_s_ = 2;  // the servers' --lease_ttl
  std::vector<std::string> extra_flags_;  // every process's, after Flags()'s
};

// Steps [from, to): even steps push every parameter in one SendGrads (bulk),
// odd steps one SendGrad per parameter (control). `done` counts the steps
// acknowledged. With `allowed`, step s waits (up to kWait) until s < *allowed:
// the test paces training so that each kill lands while it runs.
absl::Status Train(Client& trainer, int from, int to, std::atomic<int>* done,
                   const std::atomic<int>* allowed = nullptr) {
  for (int step = from; step < to; ++step) {
    for (int wait = 0; allowed != nullptr && step >= allowed->load(); ++wait) {
      if (wait >= 9000) return absl::DeadlineExceededError(absl::StrCat("step ", step, " never allowed"));
      absl::SleepFor(absl::Milliseconds(10));
    }
    absl::Status status;
    if (step % 2 == 0) {
      std::vector<NamedTensor> grads;
      for (int p = 0; p < kParams; ++p) grads.push_back({Param(p), GradientTensor(step, p)});
      status = trainer.SendGrads(grads);
    } else {
      for (int p = 0; p < kParams && status.ok(); ++p) {
        status = trainer.SendGrad(Param(p), GradientTensor(step, p));
      }
    }
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat("step ", step, ": ", status.message()));
    }
    done->store(step + 1);
  }
  return absl::OkStatus();
}

// Every parameter is 0 minus the sum of the gradients of `steps` steps, to the bit.
void ExpectTrained(Client& trainer, int steps) {
  for (int p = 0; p < kParams; ++p) {
    std::vector<float> expected(kWidth, 0);
    for (int step = 0; step < steps; ++step) {
      for (int e = 0; e < kWidth; ++e) expected[e] -= Gradient(step, p, e);
    }
    absl::StatusOr<Tensor> got = trainer.GetParam(Param(p));
    ASSERT_OK(got.status());
    EXPECT_EQ(got->ToVector<float>(), expected) << Param(p);
  }
}

// kill -9 of `child`, its exit reaped.
void KillNine(ChildProcess& child) {
  ASSERT_EQ(kill(child.pid(), SIGKILL), 0) << std::strerror(errno);
  ASSERT_OK_AND_ASSIGN(int status, child.WaitForExit(absl::Now() + kWait));
  EXPECT_TRUE(WIFSIGNALED(status)) << DescribeWaitStatus(status);
}

// SIGTERM to each server; each exits 0.
void StopCleanly(std::vector<std::unique_ptr<ChildProcess>>& servers) {
  for (std::unique_ptr<ChildProcess>& server : servers) {
    ASSERT_EQ(kill(server->pid(), SIGTERM), 0);
    ASSERT_OK_AND_ASSIGN(int exit_status, server->WaitForExit(absl::Now() + kWait));
    EXPECT_TRUE(WIFEXITED(exit_status) && WEXITSTATUS(exit_status) == 0)
        << DescribeWaitStatus(exit_status) << server->err();
  }
}

v1::ServerStats Stats(const std::string& address) {
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::GetStatsResponse response;
  const grpc::Status status = stub->GetStats(&context, v1::GetStatsRequest(), &response);
  EXPECT_TRUE(status.ok()) << address << ": " << status.error_message();
  return response.stats();
}

// The value of the unlabelled sample `name` on the metrics page of the
// server at `address` (gRPC); -1 when the page or the sample is missing.
double MetricAt(const std::string& address, const std::string& name) {
  const std::string metrics = Stats(address).metrics_address();
  const size_t colon = metrics.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(metrics.substr(colon + 1), &port)) {
    ADD_FAILURE() << address << " publishes no metrics address: '" << metrics << "'";
    return -1;
  }
  absl::StatusOr<std::string> page = metrics::HttpGet(metrics.substr(0, colon), port, "/metrics",
                                                      absl::Now() + absl::Seconds(30));
  if (!page.ok()) return -1;
  for (absl::string_view line : absl::StrSplit(*page, '\n')) {
    double value = 0;
    if (absl::ConsumePrefix(&line, name + " ") && absl::SimpleAtod(line, &value)) return value;
  }
  return -1;
}

uint32_t StateChecksum(const std::string& address) {
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::GetStatsRequest request;
  request.set_state_checksum(true);
  v1::GetStatsResponse response;
  const grpc::Status status = stub->GetStats(&context, request, &response);
  EXPECT_TRUE(status.ok()) << address << ": " << status.error_message();
  EXPECT_TRUE(response.stats().has_state_checksum()) << address;
  return response.stats().state_checksum();
}

TEST_F(ReplicationTest, KillingEachPrimaryMidTrainingLosesNoAcknowledgedUpdate) {
  std::vector<std::unique_ptr<ChildProcess>> primaries = StartPrimaries();
  ASSERT_EQ(primaries.size(), static_cast<size_t>(kServers));
  std::unique_ptr<Client> trainer = ConnectAndInit();
  ASSERT_NE(trainer, nullptr);

  // One standby per shard; each primary's writes now reach its backup first.
  std::vector<std::unique_ptr<ChildProcess>> standbys;
  for (uint32_t i = 0; i < kServers; ++i) {
    standbys.push_back(StartStandby(i));
    ASSERT_NE(standbys.back(), nullptr);
  }

  std::atomic<int> steps_done{0};
  absl::Status training;
  auto train = [&](int from, int to) { training = Train(*trainer, from, to, &steps_done); };

  // A few steps, then the replicas compare equal, shard by shard.
  train(0, 10);
  ASSERT_OK(training);
  for (uint32_t i = 0; i < kServers; ++i) {
    const uint32_t primary = StateChecksum(AddressAt(etcd_keys::ServerKey(i)));
    const uint32_t backup = StateChecksum(AddressAt(etcd_keys::StandbyKey(i)));
    EXPECT_EQ(primary, backup) << "shard " << i;
  }

  // The rest runs in a thread. kKills times, the current primary of shard
  // k % kServers is killed at a seeded random step; its standby takes over,
  // and a new standby attaches to it while training goes on.
  const unsigned seed = static_cast<unsigned>(absl::ToUnixNanos(absl::Now()));
  std::printf("kill points seeded with %u\n", seed);
  std::mt19937 random(seed);
  std::vector<std::unique_ptr<ChildProcess>> holders = std::move(primaries);
  // Training may run at most kLead steps past the next kill point, so every
  // kill lands while steps are in flight.
  constexpr int kLead = 4;
  std::atomic<int> allowed{10};
  std::thread trainer_thread(
      [&] { training = Train(*trainer, 10, kSteps, &steps_done, &allowed); });
  struct JoinOnExit {  // also when an assertion below returns early
    std::atomic<int>& allowed;
    std::thread& thread;
    ~JoinOnExit() {
      allowed.store(kSteps);
      if (thread.joinable()) thread.join();
    }
  } join_on_exit{allowed, trainer_thread};
  int kill_after = 10;
  for (int k = 0; k < kKills; ++k) {
    const uint32_t i = k % kServers;
    kill_after += 3 + static_cast<int>(random() % 18);
    allowed.store(kill_after + kLead);
    bool reached = false;
    for (int wait = 0; wait < 9000 && !reached; ++wait) {
      reached = steps_done.load() >= kill_after || steps_done.load() >= kSteps;
      if (!reached) absl::SleepFor(absl::Milliseconds(10));
    }
    ASSERT_TRUE(reached) << "training stalled at step " << steps_done.load();
    const std::string successor = Config(i).replicas(0);
    std::printf("kill -9 of shard %u's primary after step %d\n", i, steps_done.load());
    ASSERT_EQ(kill(holders[i]->pid(), SIGKILL), 0) << std::strerror(errno);
    ASSERT_OK_AND_ASSIGN(int status, holders[i]->WaitForExit(absl::Now() + kWait));
    EXPECT_TRUE(WIFSIGNALED(status)) << DescribeWaitStatus(status);
    // Its standby takes the shard over, one epoch up, the old primary out.
    bool took_over = false;
    for (int wait = 0; wait < 4500 && !took_over; ++wait) {
      took_over = Config(i).holder() == successor;
      if (!took_over) absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_TRUE(took_over) << "shard " << i
                           << "'s standby did not take over: " << standbys[i]->output();
    holders[i] = std::move(standbys[i]);
    standbys[i] = StartStandby(i);
    ASSERT_NE(standbys[i], nullptr);
  }
  allowed.store(kSteps);
  trainer_thread.join();
  ASSERT_OK(training);
  ASSERT_EQ(steps_done.load(), kSteps);

  // Exact to the bit: 0 - sum of every acknowledged gradient; and each
  // shard's primary and its newest standby hold one state.
  ExpectTrained(*trainer, kSteps);
  for (uint32_t i = 0; i < kServers; ++i) {
    EXPECT_EQ(StateChecksum(AddressAt(etcd_keys::ServerKey(i))),
              StateChecksum(AddressAt(etcd_keys::StandbyKey(i))))
        << "shard " << i;
  }

  trainer.reset();
  // Standbys first (a primary's shutdown would promote them), then the
  // primaries, cleanly: each a promoted standby.
  for (std::unique_ptr<ChildProcess>& standby : standbys) {
    ASSERT_EQ(kill(standby->pid(), SIGKILL), 0);
    ASSERT_OK_AND_ASSIGN(int status, standby->WaitForExit(absl::Now() + kWait));
    EXPECT_TRUE(WIFSIGNALED(status)) << DescribeWaitStatus(status);
  }
  for (std::unique_ptr<ChildProcess>& holder : holders) {
    ASSERT_EQ(kill(holder->pid(), SIGTERM), 0);
    ASSERT_OK_AND_ASSIGN(int status, holder->WaitForExit(absl::Now() + kWait));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << DescribeWaitStatus(status) << holder->err();
  }
}

// The other side: a backup killed mid-training. The primary's next write is
// not acknowledged by it; the primary drops it from /shards/<i> (epoch + 1)
// before acknowledging that write, and training goes on without a backup.
TEST_F(ReplicationTest, APrimaryDropsAKilledStandbyBeforeAcknowledging) {
  std::vector<std::unique_ptr<ChildProcess>> primaries = StartPrimaries();
  ASSERT_EQ(primaries.size(), static_cast<size_t>(kServers));
  std::unique_ptr<Client> trainer = ConnectAndInit();
  ASSERT_NE(trainer, nullptr);
  std::unique_ptr<ChildProcess> standby = StartStandby(0);
  ASSERT_NE(standby, nullptr);
  const v1::ShardConfig attached = Config(0);
  std::atomic<int> steps_done{0};
  ASSERT_OK(Train(*trainer, 0, 6, &steps_done));

  KillNine(*standby);
  ASSERT_OK(Train(*trainer, 6, 12, &steps_done));

  const v1::ShardConfig dropped = Config(0);
  EXPECT_EQ(dropped.holder(), attached.holder());
  EXPECT_EQ(dropped.replicas_size(), 0);
  EXPECT_EQ(dropped.epoch(), attached.epoch() + 1);
  ExpectTrained(*trainer, 12);

  trainer.reset();
  StopCleanly(primaries);
  EXPECT_THAT(primaries[0]->err(), ::testing::HasSubstr("dropped backup"));
}

// Replication health: a primary reports its live backups and last LSN, a
// standby the LSN it applied; once the primary dropped its killed backup
// it counts the drop, has no backup, and GetStats says it is degraded.
TEST_F(ReplicationTest, APrimaryWhoseBackupWasDroppedReportsItselfDegraded) {
  extra_flags_ = {"--metrics_port=0"};
  std::vector<std::unique_ptr<ChildProcess>> primaries = StartPrimaries();
  ASSERT_EQ(primaries.size(), static_cast<size_t>(kServers));
  std::unique_ptr<Client> trainer = ConnectAndInit();
  ASSERT_NE(trainer, nullptr);
  std::unique_ptr<ChildProcess> standby = StartStandby(0);
  ASSERT_NE(standby, nullptr);
  const std::string primary = AddressAt(etcd_keys::ServerKey(0));
  const std::string backup = AddressAt(etcd_keys::StandbyKey(0));
  std::atomic<int> steps_done{0};
  ASSERT_OK(Train(*trainer, 0, 6, &steps_done));

  // Every write acknowledged was applied on the standby: the LSNs agree.
  const double last_lsn = MetricAt(primary, "pserver_replication_last_lsn");
  EXPECT_GT(last_lsn, 0);
  EXPECT_EQ(MetricAt(backup, "pserver_backup_applied_lsn"), last_lsn);
  EXPECT_EQ(MetricAt(primary, "pserver_replication_backups"), 1);
  EXPECT_EQ(MetricAt(primary, "pserver_replication_dropped_total"), 0);
  EXPECT_EQ(MetricAt(primary, "pserver_replication_degraded"), 0);
  EXPECT_EQ(Stats(primary).degraded(), "");

  KillNine(*standby);
  // The first write after the kill is acknowledged only once it was dropped.
  ASSERT_OK(Train(*trainer, 6, 8, &steps_done));
  EXPECT_EQ(Stats(primary).degraded(), "shard 0 has no backup");
  EXPECT_EQ(MetricAt(primary, "pserver_replication_backups"), 0);
  EXPECT_EQ(MetricAt(primary, "pserver_replication_dropped_total"), 1);
  EXPECT_EQ(MetricAt(primary, "pserver_replication_degraded"), 1);
  EXPECT_GT(MetricAt(primary, "pserver_replication_last_lsn"), last_lsn);
  // Shard 1 never had a backup: not degraded.
  EXPECT_EQ(Stats(AddressAt(etcd_keys::ServerKey(1))).degraded(), "");
  ExpectTrained(*trainer, 8);

  trainer.reset();
  StopCleanly(primaries);
}

// A standby bounds the copy it accepts from the primary etcd names
// (--max_standby_copy_bytes): a larger copy fails the attach, saying so, and
// the shard stays without a replica.
TEST_F(ReplicationTest, AStandbyRefusesACopyLargerThanItsBound) {
  std::vector<std::unique_ptr<ChildProcess>> primaries = StartPrimaries();
  ASSERT_EQ(primaries.size(), static_cast<size_t>(kServers));
  // 8 parameters of 64 KiB beside the small ones: each shard holds some
  // (placement is deterministic), so each shard's copy is past the 4 KiB bound.
  std::unique_ptr<Client> trainer = ConnectAndInit(8, 1 << 14);
  ASSERT_NE(trainer, nullptr);
  std::vector<std::string> flags = Flags();
  flags.push_back("--standby");
  flags.push_back("--max_standby_copy_bytes=4096");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChildProcess> standby,
                       ChildProcess::Spawn(RunfilesPath("cc/server/pserver"), flags));
  ASSERT_OK_AND_ASSIGN(int status, standby->WaitForExit(absl::Now() + kWait));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << DescribeWaitStatus(status);
  EXPECT_THAT(standby->err(), ::testing::HasSubstr("--max_standby_copy_bytes=4096"));
  EXPECT_THAT(standby->err(), ::testing::HasSubstr("nothing loaded"));
  // The primary listed the standby when it sent the copy; the first write
  // the standby cannot take drops it again, and the primaries serve on.
  std::atomic<int> steps_done{0};
  ASSERT_OK(Train(*trainer, 0, 2, &steps_done));
  ExpectTrained(*trainer, 2);
  for (uint32_t shard = 0; shard < kServers; ++shard) {
    EXPECT_EQ(Config(shard).replicas_size(), 0) << "shard " << shard;
  }
}

// A primary killed on a live host: its port refuses connections, and its
// standby takes over at once instead of waiting for the lease. With a lease
// of 120 s and a trainer that gives up after 90 s, only that path can let
// training go on.
TEST_F(ReplicationTest, AKilledPrimaryIsTakenOverBeforeItsLeaseExpires) {
  lease_ttl_s_ = 120;
  static_assert(kWait < absl::Seconds(120), "the trainer must give up before the lease ends");
  std::vector<std::unique_ptr<ChildProcess>> primaries = StartPrimaries();
  ASSERT_EQ(primaries.size(), static_cast<size_t>(kServers));
  std::unique_ptr<Client> trainer = ConnectAndInit();
  ASSERT_NE(trainer, nullptr);
  std::unique_ptr<ChildProcess> standby = StartStandby(0);
  ASSERT_NE(standby, nullptr);
  const v1::ShardConfig attached = Config(0);
  std::atomic<int> steps_done{0};
  ASSERT_OK(Train(*trainer, 0, 5, &steps_done));

  ASSERT_EQ(kill(primaries[0]->pid(), SIGKILL), 0) << std::strerror(errno);
  const absl::Time killed = absl::Now();
  ASSERT_OK_AND_ASSIGN(int status, primaries[0]->WaitForExit(absl::Now() + kWait));
  EXPECT_TRUE(WIFSIGNALED(status)) << DescribeWaitStatus(status);
  ASSERT_OK(Train(*trainer, 5, 6, &steps_done)) << standby->output();
  // Informational (no assertion depends on it): kill -> next completed step.
  std::printf("kill -9 -> next completed step: %.3f s\n",
              absl::ToDoubleSeconds(absl::Now() - killed));
  ASSERT_OK(Train(*trainer, 6, 10, &steps_done));
  ExpectTrained(*trainer, 10);

  const v1::ShardConfig took_over = Config(0);
  EXPECT_EQ(took_over.holder(), attached.replicas(0));
  EXPECT_GT(took_over.epoch(), attached.epoch());

  trainer.reset();
  for (std::unique_ptr<ChildProcess>* server : {&standby, &primaries[1]}) {
    ASSERT_EQ(kill((*server)->pid(), SIGTERM), 0);
    ASSERT_OK_AND_ASSIGN(int exit_status, (*server)->WaitForExit(absl::Now() + kWait));
    EXPECT_TRUE(WIFEXITED(exit_status) && WEXITSTATUS(exit_status) == 0)
        << DescribeWaitStatus(exit_status) << (*server)->err();
  }
  EXPECT_THAT(standby->err(), ::testing::HasSubstr("refuses connections"));
}

}  // namespace
}  // namespace pserver
