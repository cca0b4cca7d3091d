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
#include <algorithm>
#include <map>
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
    return {"--host=127.0.0.1",
            "--port=0",
            "--etcd=" + etcd_->endpoint(),
            absl::StrCat("--cluster=", kCluster),
            absl::StrCat("--num_servers=", kServers),
            absl::StrCat("--lease_ttl=", lease_ttl_s_),
            "--register_timeout=60"};
  }

  // Server `index` (they claim indices in start order), accepting standbys.
  std::unique_ptr<ChildProcess> StartPrimary(uint32_t index,
                                             const std::vector<std::string>& extra = {}) {
    std::vector<std::string> flags = Flags();
    flags.push_back("--accept_standbys");
    flags.insert(flags.end(), extra.begin(), extra.end());
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
  std::vector<std::unique_ptr<ChildProcess>> StartPrimaries(
      const std::vector<std::string>& extra = {}) {
    std::vector<std::unique_ptr<ChildProcess>> primaries;
    for (uint32_t i = 0; i < kServers; ++i) {
      std::unique_ptr<ChildProcess> primary = StartPrimary(i, extra);
      if (primary == nullptr) break;
      primaries.push_back(std::move(primary));
    }
    return primaries;
  }

  // A standby; returns once /shards/<shard> lists `replicas` backups (a
  // standby attaches to the shard with the fewest first).
  std::unique_ptr<ChildProcess> StartStandby(uint32_t shard, int replicas = 1) {
    std::vector<std::string> flags = Flags();
    flags.push_back("--standby");
    flags.push_back("--accept_standbys");
    absl::StatusOr<std::unique_ptr<ChildProcess>> child =
        ChildProcess::Spawn(RunfilesPath("cc/server/pserver"), flags);
    EXPECT_OK(child);
    if (!child.ok()) return nullptr;
    bool listed = false;
    for (int i = 0; i < 4500 && !listed; ++i) {
      listed = Config(shard).replicas_size() == replicas;
      if (!listed) absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_TRUE(listed) << "no standby attached to shard " << shard << ": " << (*child)->output();
    return *std::move(child);
  }

  // A standby with `flag` that attaches nowhere: returned once it exited
  // (with an error, as expected); null when it could not start.
  std::unique_ptr<ChildProcess> FailedStandby(const std::string& flag) {
    std::vector<std::string> flags = Flags();
    flags.push_back("--standby");
    flags.push_back(flag);
    absl::StatusOr<std::unique_ptr<ChildProcess>> child =
        ChildProcess::Spawn(RunfilesPath("cc/server/pserver"), flags);
    EXPECT_OK(child);
    if (!child.ok()) return nullptr;
    absl::StatusOr<int> status = (*child)->WaitForExit(absl::Now() + kWait);
    EXPECT_OK(status);
    if (status.ok()) {
      EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) != 0) << DescribeWaitStatus(*status);
    }
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

  // The address of shard i's first backup (its /standby/<i>/<instance>).
  std::string StandbyAddress(uint32_t shard) {
    const v1::ShardConfig config = Config(shard);
    EXPECT_GT(config.replicas_size(), 0) << "shard " << shard;
    return config.replicas_size() > 0
               ? AddressAt(etcd_keys::StandbyKey(shard, config.replicas(0)))
               : "";
  }

  // The address in etcd key `key` (a /ps/<i> or /standby/<i>/<instance> value).
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

// Steps [from, to) in a thread of their own, paced: training runs at most
// kLead steps past the next kill point, so every kill lands while steps are
// in flight. Joined (and let run to the end) when it goes.
class PacedTraining {
 public:
  static constexpr int kLead = 4;
  PacedTraining(Client& trainer, int from, int to, std::atomic<int>& done)
      : to_(to), done_(done), allowed_(from) {
    thread_ = std::thread([this, &trainer, from] {
      status_ = Train(trainer, from, to_, &done_, &allowed_);
    });
  }
  ~PacedTraining() { Finish().IgnoreError(); }

  // Lets training run to `step` (and kLead past it) and waits until it got
  // there or to its end; false when it stalled.
  bool RunTo(int step) {
    allowed_.store(step + kLead);
    for (int wait = 0; wait < 9000; ++wait) {
      if (done_.load() >= step || done_.load() >= to_) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }
  // Lets it run to the end; its outcome.
  absl::Status Finish() {
    allowed_.store(to_);
    if (thread_.joinable()) thread_.join();
    return status_;
  }

 private:
  const int to_;
  std::atomic<int>& done_;
  std::atomic<int> allowed_;
  absl::Status status_;
  std::thread thread_;
};

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
    const uint32_t backup = StateChecksum(StandbyAddress(i));
    EXPECT_EQ(primary, backup) << "shard " << i;
  }

  // The rest runs in a thread. kKills times, the current primary of shard
  // k % kServers is killed at a seeded random step; its standby takes over,
  // and a new standby attaches to it while training goes on.
  const unsigned seed = static_cast<unsigned>(absl::ToUnixNanos(absl::Now()));
  std::printf("kill points seeded with %u\n", seed);
  std::mt19937 random(seed);
  std::vector<std::unique_ptr<ChildProcess>> holders = std::move(primaries);
  PacedTraining paced(*trainer, 10, kSteps, steps_done);
  int kill_after = 10;
  for (int k = 0; k < kKills; ++k) {
    const uint32_t i = k % kServers;
    kill_after += 3 + static_cast<int>(random() % 18);
    ASSERT_TRUE(paced.RunTo(kill_after)) << "training stalled at step " << steps_done.load();
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
  ASSERT_OK(paced.Finish());
  ASSERT_EQ(steps_done.load(), kSteps);

  // Exact to the bit: 0 - sum of every acknowledged gradient; and each
  // shard's primary and its newest standby hold one state.
  ExpectTrained(*trainer, kSteps);
  for (uint32_t i = 0; i < kServers; ++i) {
    EXPECT_EQ(StateChecksum(AddressAt(etcd_keys::ServerKey(i))),
              StateChecksum(StandbyAddress(i)))
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
  std::unique_ptr<ChildProcess> standby = FailedStandby("--max_standby_copy_bytes=4096");
  ASSERT_NE(standby, nullptr);
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

// R=3: two primaries with two standbys each (--max_standbys=2, the
// default). kKillsR3 times, at seeded random steps while training runs,
// shard k % 2 loses its primary: in kills 0-1, 4-5 together with one of its
// standbys chosen at random (two processes killed at once; the other
// standby takes over alone), in kills 2-3, 6-7 the primary only (one
// standby takes over, the other sees /shards/<i> drop it and copies the new
// primary anew). Fresh standbys
// bring the shard back to two backups. Training completes exact to the bit;
// every replica of each shard has its primary's checksum.
TEST_F(ReplicationTest, ThreeReplicasSurviveTwoProcessesKilledAtOnce) {
  constexpr int kKillsR3 = 8;
  std::vector<std::unique_ptr<ChildProcess>> primaries = StartPrimaries();
  ASSERT_EQ(primaries.size(), static_cast<size_t>(kServers));
  std::unique_ptr<Client> trainer = ConnectAndInit();
  ASSERT_NE(trainer, nullptr);
  // Every process by its instance id.
  std::map<std::string, std::unique_ptr<ChildProcess>> processes;
  for (uint32_t i = 0; i < kServers; ++i) processes[Config(i).holder()] = std::move(primaries[i]);
  auto add_standby = [&](uint32_t shard, int replicas) {
    std::unique_ptr<ChildProcess> standby = StartStandby(shard, replicas);
    if (standby == nullptr) return false;
    // The one backup listed that is no known process.
    std::string id;
    const v1::ShardConfig config = Config(shard);
    for (const std::string& replica : config.replicas()) {
      if (processes.count(replica) == 0) id = replica;
    }
    EXPECT_FALSE(id.empty()) << standby->output();
    if (id.empty()) return false;
    processes[id] = std::move(standby);
    return true;
  };
  for (int replicas = 1; replicas <= 2; ++replicas) {
    for (uint32_t i = 0; i < kServers; ++i) ASSERT_TRUE(add_standby(i, replicas));
  }
  // Every replica of shard i has its primary's state.
  auto expect_replicas_equal = [&] {
    for (uint32_t i = 0; i < kServers; ++i) {
      const v1::ShardConfig config = Config(i);
      EXPECT_EQ(config.replicas_size(), 2) << "shard " << i;
      const uint32_t primary = StateChecksum(AddressAt(etcd_keys::ServerKey(i)));
      for (const std::string& replica : config.replicas()) {
        EXPECT_EQ(StateChecksum(AddressAt(etcd_keys::StandbyKey(i, replica))), primary)
            << "shard " << i << ", backup " << replica;
      }
    }
  };

  std::atomic<int> steps_done{0};
  ASSERT_OK(Train(*trainer, 0, 10, &steps_done));
  expect_replicas_equal();

  const unsigned seed = static_cast<unsigned>(absl::ToUnixNanos(absl::Now()));
  std::printf("R=3 kill points seeded with %u\n", seed);
  std::mt19937 random(seed);
  constexpr int kStepsR3 = 200;
  PacedTraining paced(*trainer, 10, kStepsR3, steps_done);
  int kill_after = 10;
  for (int k = 0; k < kKillsR3; ++k) {
    const uint32_t i = k % kServers;
    kill_after += 3 + static_cast<int>(random() % 18);
    ASSERT_TRUE(paced.RunTo(kill_after)) << "training stalled at step " << steps_done.load();
    const v1::ShardConfig before = Config(i);
    ASSERT_EQ(before.replicas_size(), 2) << "shard " << i;
    std::vector<std::string> victims = {before.holder()};
    std::vector<std::string> survivors(before.replicas().begin(), before.replicas().end());
    if ((k / kServers) % 2 == 0) {
      const size_t which = random() % 2;
      victims.push_back(survivors[which]);
      survivors.erase(survivors.begin() + static_cast<std::ptrdiff_t>(which));
    }
    std::printf("kill -9 of shard %u's primary%s after step %d\n", i,
                victims.size() > 1 ? " and one standby" : "", steps_done.load());
    for (const std::string& victim : victims) {
      ASSERT_TRUE(processes.count(victim)) << victim;
      ASSERT_EQ(kill(processes[victim]->pid(), SIGKILL), 0) << std::strerror(errno);
    }
    for (const std::string& victim : victims) {
      ASSERT_OK_AND_ASSIGN(int status, processes[victim]->WaitForExit(absl::Now() + kWait));
      EXPECT_TRUE(WIFSIGNALED(status)) << DescribeWaitStatus(status);
      processes.erase(victim);
    }
    // One surviving standby takes the shard over; a live one that did not
    // copies it anew, so the shard has every survivor back.
    bool settled = false;
    for (int wait = 0; wait < 4500 && !settled; ++wait) {
      const v1::ShardConfig now = Config(i);
      settled = std::count(survivors.begin(), survivors.end(), now.holder()) == 1 &&
                now.replicas_size() == static_cast<int>(survivors.size()) - 1;
      if (!settled) absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_TRUE(settled) << "shard " << i << " did not settle on its survivors: "
                         << FormatShardConfig(Config(i));
    for (int replicas = static_cast<int>(survivors.size()); replicas <= 2; ++replicas) {
      ASSERT_TRUE(add_standby(i, replicas));
    }
  }
  ASSERT_OK(paced.Finish());
  ASSERT_EQ(steps_done.load(), kStepsR3);
  ExpectTrained(*trainer, kStepsR3);
  expect_replicas_equal();

  trainer.reset();
  // Backups first (killed: a primary's shutdown would promote them), then
  // the primaries, cleanly.
  std::vector<std::string> holders;
  for (uint32_t i = 0; i < kServers; ++i) holders.push_back(Config(i).holder());
  for (auto& [id, process] : processes) {
    if (std::count(holders.begin(), holders.end(), id) > 0) continue;
    ASSERT_EQ(kill(process->pid(), SIGKILL), 0);
    EXPECT_OK(process->WaitForExit(absl::Now() + kWait).status());
  }
  for (const std::string& id : holders) {
    ASSERT_TRUE(processes.count(id)) << id;
    ASSERT_EQ(kill(processes[id]->pid(), SIGTERM), 0);
    ASSERT_OK_AND_ASSIGN(int status, processes[id]->WaitForExit(absl::Now() + kWait));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << DescribeWaitStatus(status) << processes[id]->err();
  }
}

// --max_standbys bounds the standbys attached to one primary: past it the
// primary refuses, naming the flag, and a standby with no shard left to
// attach to gives up at its --register_timeout.
TEST_F(ReplicationTest, APrimaryRefusesAStandbyPastMaxStandbys) {
  std::vector<std::unique_ptr<ChildProcess>> primaries = StartPrimaries({"--max_standbys=1"});
  ASSERT_EQ(primaries.size(), static_cast<size_t>(kServers));
  std::unique_ptr<Client> trainer = ConnectAndInit();
  ASSERT_NE(trainer, nullptr);
  std::vector<std::unique_ptr<ChildProcess>> standbys;
  for (uint32_t i = 0; i < kServers; ++i) {
    standbys.push_back(StartStandby(i));
    ASSERT_NE(standbys.back(), nullptr);
  }
  std::unique_ptr<ChildProcess> extra = FailedStandby("--register_timeout=3");
  ASSERT_NE(extra, nullptr);
  EXPECT_THAT(extra->err(), ::testing::HasSubstr("the most --max_standbys=1 allows"));
  EXPECT_THAT(extra->err(), ::testing::HasSubstr("attached to none"));
  for (uint32_t i = 0; i < kServers; ++i) EXPECT_EQ(Config(i).replicas_size(), 1) << i;
  // The shards serve on with their one backup each.
  std::atomic<int> steps_done{0};
  ASSERT_OK(Train(*trainer, 0, 4, &steps_done));
  ExpectTrained(*trainer, 4);
  for (uint32_t i = 0; i < kServers; ++i) {
    EXPECT_EQ(StateChecksum(AddressAt(etcd_keys::ServerKey(i))), StateChecksum(StandbyAddress(i)));
  }
}

}  // namespace
}  // namespace pserver
