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

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/core/tensor.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/shard_config.h"
#include "cc/etcd/testing/etcd_process.h"
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
constexpr int kSteps = 260;
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

  // --lease_ttl=2 unless told: a takeover after a kill -9 needs no lease
  // expiry (the standby sees the connection break and the dial refused).
  std::vector<std::string> Flags() const {
    return {"--host=127.0.0.1",
            "--port=0",
            "--etcd=" + etcd_->endpoint(),
            absl::StrCat("--cluster=", kCluster),
            absl::StrCat("--num_servers=", kServers),
            absl::StrCat("--lease_ttl=", lease_ttl_seconds_),
            "--register_timeout=60"};
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
  // parameters initialised to 0 (SGD, learning rate 1).
  std::unique_ptr<Client> ConnectAndInit() {
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

  // kServers primaries, a trainer, and a standby of shard 0.
  void StartWithAStandbyOfShard0(std::vector<std::unique_ptr<ChildProcess>>* primaries,
                                 std::unique_ptr<Client>* trainer,
                                 std::unique_ptr<ChildProcess>* standby) {
    *primaries = StartPrimaries();
    ASSERT_EQ(primaries->size(), static_cast<size_t>(kServers));
    *trainer = ConnectAndInit();
    ASSERT_NE(*trainer, nullptr);
    *standby = StartStandby(0);
    ASSERT_NE(*standby, nullptr);
  }

  // Waits for shard `shard`'s holder to be `successor`.
  bool AwaitHolder(uint32_t shard, const std::string& successor) {
    bool took_over = false;
    for (int wait = 0; wait < 2000 && !took_over; ++wait) {
      took_over = Config(shard).holder() == successor;
      if (!took_over) absl::SleepFor(absl::Milliseconds(20));
    }
    return took_over;
  }

  int lease_ttl_seconds_ = 2;
  std::unique_ptr<testing::EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> etcd_client_;
};

// Steps [from, to): even steps push every parameter in one SendGrads (bulk),
// odd steps one SendGrad per parameter (control). `done` counts the steps
// acknowledged.
absl::Status Train(Client& trainer, int from, int to, std::atomic<int>* done) {
  for (int step = from; step < to; ++step) {
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
  std::thread trainer_thread([&] { train(10, kSteps); });
  int kill_after = 10;
  for (int k = 0; k < kKills; ++k) {
    const uint32_t i = k % kServers;
    kill_after += 2 + static_cast<int>(random() % 10);
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
    ASSERT_TRUE(AwaitHolder(i, successor)) << "shard " << i
                           << "'s standby did not take over: " << standbys[i]->output();
    holders[i] = std::move(standbys[i]);
    standbys[i] = StartStandby(i);
    ASSERT_NE(standbys[i], nullptr);
  }
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

// A kill -9 is evident: the standby's connection to its primary breaks and a
// fresh dial is refused, so it takes over without waiting for the lease. With
// --lease_ttl=60 the killed primary's lease outlives the wait below (40 s
// from the kill), so only that path can complete the takeover; /ps/0 names
// the standby at once (replaced by revision, now under the standby's lease),
// and training goes on, exact to the bit.
TEST_F(ReplicationTest, AKilledPrimaryIsTakenOverWithoutWaitingForItsLease) {
  lease_ttl_seconds_ = 60;
  std::vector<std::unique_ptr<ChildProcess>> primaries;
  std::unique_ptr<Client> trainer;
  std::unique_ptr<ChildProcess> standby;
  ASSERT_NO_FATAL_FAILURE(StartWithAStandbyOfShard0(&primaries, &trainer, &standby));
  std::atomic<int> steps_done{0};
  ASSERT_OK(Train(*trainer, 0, 6, &steps_done));
  const v1::ShardConfig attached = Config(0);
  ASSERT_OK_AND_ASSIGN(KeyValue old_entry, etcd_client_->Get(etcd_keys::ServerKey(0)));

  const absl::Time killed = absl::Now();
  ASSERT_EQ(kill(primaries[0]->pid(), SIGKILL), 0) << std::strerror(errno);
  ASSERT_OK_AND_ASSIGN(int status, primaries[0]->WaitForExit(absl::Now() + kWait));
  EXPECT_TRUE(WIFSIGNALED(status)) << DescribeWaitStatus(status);
  bool took_over = false;
  while (!took_over && absl::Now() < killed + absl::Seconds(40)) {
    took_over = Config(0).holder() == attached.replicas(0);
    if (!took_over) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(took_over) << standby->output();
  const v1::ShardConfig taken = Config(0);
  EXPECT_EQ(taken.epoch(), attached.epoch() + 1);
  EXPECT_EQ(taken.replicas_size(), 0);
  ASSERT_OK_AND_ASSIGN(KeyValue new_entry, etcd_client_->Get(etcd_keys::ServerKey(0)));
  EXPECT_NE(new_entry.lease, old_entry.lease);
  ASSERT_OK_AND_ASSIGN(etcd_keys::ServerEntry entry, etcd_keys::ParseServerValue(new_entry.value));
  EXPECT_EQ(entry.instance_id, attached.replicas(0));

  ASSERT_OK(Train(*trainer, 6, 12, &steps_done));
  ExpectTrained(*trainer, 12);

  trainer.reset();
  ASSERT_EQ(kill(primaries[1]->pid(), SIGTERM), 0);
  ASSERT_EQ(kill(standby->pid(), SIGTERM), 0);
  for (ChildProcess* process : {primaries[1].get(), standby.get()}) {
    ASSERT_OK_AND_ASSIGN(int exit_status, process->WaitForExit(absl::Now() + kWait));
    EXPECT_TRUE(WIFEXITED(exit_status) && WEXITSTATUS(exit_status) == 0)
        << DescribeWaitStatus(exit_status) << process->err();
  }
  EXPECT_THAT(standby->err(), ::testing::HasSubstr("without waiting for its lease"));
}

// The other side: a backup killed mid-training. The primary's next write is
// not acknowledged by it; the primary drops it from /shards/<i> (epoch + 1)
// before acknowledging that write, and training goes on without a backup.
TEST_F(ReplicationTest, APrimaryDropsAKilledStandbyBeforeAcknowledging) {
  std::vector<std::unique_ptr<ChildProcess>> primaries;
  std::unique_ptr<Client> trainer;
  std::unique_ptr<ChildProcess> standby;
  ASSERT_NO_FATAL_FAILURE(StartWithAStandbyOfShard0(&primaries, &trainer, &standby));
  const v1::ShardConfig attached = Config(0);
  std::atomic<int> steps_done{0};
  ASSERT_OK(Train(*trainer, 0, 6, &steps_done));

  ASSERT_EQ(kill(standby->pid(), SIGKILL), 0) << std::strerror(errno);
  ASSERT_OK_AND_ASSIGN(int status, standby->WaitForExit(absl::Now() + kWait));
  EXPECT_TRUE(WIFSIGNALED(status)) << DescribeWaitStatus(status);
  ASSERT_OK(Train(*trainer, 6, 12, &steps_done));

  const v1::ShardConfig dropped = Config(0);
  EXPECT_EQ(dropped.holder(), attached.holder());
  EXPECT_EQ(dropped.replicas_size(), 0);
  EXPECT_EQ(dropped.epoch(), attached.epoch() + 1);
  ExpectTrained(*trainer, 12);

  trainer.reset();
  for (std::unique_ptr<ChildProcess>& primary : primaries) {
    ASSERT_EQ(kill(primary->pid(), SIGTERM), 0);
    ASSERT_OK_AND_ASSIGN(int exit_status, primary->WaitForExit(absl::Now() + kWait));
    EXPECT_TRUE(WIFEXITED(exit_status) && WEXITSTATUS(exit_status) == 0)
        << DescribeWaitStatus(exit_status) << primary->err();
  }
  EXPECT_THAT(primaries[0]->err(), ::testing::HasSubstr("dropped backup"));
}

}  // namespace
}  // namespace pserver
