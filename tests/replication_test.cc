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
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/client/table.h"
#include "cc/core/tensor.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/shard_config.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/metrics/http_client.h"
#include "cc/testing/child_process.h"
#include "cc/security/tls.h"
#include "cc/testing/status_matchers.h"
#include "cc/testing/test_certs.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "pserver/v1/service.grpc.pb.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;

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

// Who a test's own calls present: TLS (plaintext when off) and a bearer
// token ("" for none).
struct Caller {
  TlsOptions tls;
  std::string token;
};

// The state checksum a server at `address` reports (GetStats; on a cluster
// with roles the caller must be an admin).
uint32_t StateChecksum(const std::string& address, const Caller& caller = {});

class ReplicationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(etcd_, testing::EtcdProcess::Start());
    EtcdClientOptions options;
    options.endpoints = {etcd_->endpoint()};
    options.prefix = etcd_keys::ClusterPrefix(kCluster);
    ASSERT_OK_AND_ASSIGN(etcd_client_, EtcdClient::Connect(options));
  }

  std::vector<std::string> Flags() {
    std::vector<std::string> flags = {"--host=127.0.0.1",
                                      "--port=0",
                                      "--etcd=" + etcd_->endpoint(),
                                      absl::StrCat("--cluster=", kCluster),
                                      absl::StrCat("--num_servers=", kServers),
                                      absl::StrCat("--lease_ttl=", lease_ttl_s_),
                                      "--register_timeout=60"};
    if (checkpoints_) {  // a directory per process, saved every 0.5 s
      const char* tmp = std::getenv("TEST_TMPDIR");
      flags.push_back(absl::StrCat("--checkpoint_dir=", tmp != nullptr ? tmp : "/tmp", "/ckpt-",
                                   getpid(), "-", processes_++));
      flags.push_back("--checkpoint_interval=0.5");
    }
    flags.insert(flags.end(), extra_flags_.begin(), extra_flags_.end());
    return flags;
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

  // What most tests start from: kServers primaries (index i the i-th), a
  // trainer with the parameters at 0 (ConnectAndInit(big, big_floats)) and,
  // with `standby_of_shard0`, one standby attached to shard 0. A member is
  // null (or primaries short) when it failed to start, with the failure
  // reported.
  struct Started {
    std::vector<std::unique_ptr<ChildProcess>> primaries;
    std::unique_ptr<Client> trainer;
    std::unique_ptr<ChildProcess> standby;
    bool ok(bool standby_of_shard0) const {
      return primaries.size() == kServers && trainer != nullptr &&
             (!standby_of_shard0 || standby != nullptr);
    }
  };
  Started StartTraining(bool standby_of_shard0, int big = 0, int big_floats = 0) {
    Started started;
    started.primaries = StartPrimaries();
    EXPECT_EQ(started.primaries.size(), static_cast<size_t>(kServers));
    if (started.primaries.size() != kServers) return started;
    started.trainer = ConnectAndInit(big, big_floats);
    if (started.trainer != nullptr && standby_of_shard0) started.standby = StartStandby(0);
    return started;
  }

  // A client following /ps/<i>, retrying with the same request ids;
  // `adjust` (if given) changes its options.
  std::unique_ptr<Client> Connect(const std::function<void(ClientOptions&)>& adjust = nullptr) {
    ClientOptions options;
    options.etcd_endpoints = {etcd_->endpoint()};
    options.cluster = kCluster;
    options.timeout = kWait;
    options.discovery_timeout = kWait;
    options.initial_backoff = absl::Milliseconds(10);
    options.attempt_timeout = absl::Seconds(5);
    options.tls = client_tls_;
    options.token = client_token_;
    if (adjust) adjust(options);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    EXPECT_OK(client);
    return client.ok() ? *std::move(client) : nullptr;
  }

  // A trainer (Connect) with the parameters initialised to 0 (SGD, learning
  // rate 1), and `big` more, "big<k>", of `big_floats` zeros each.
  std::unique_ptr<Client> ConnectAndInit(int big = 0, int big_floats = 0) {
    std::unique_ptr<Client> trainer = Connect();
    if (trainer == nullptr) return nullptr;
    v1::ParameterConfig sgd;
    sgd.mutable_optimizer()->mutable_sgd();
    sgd.mutable_learning_rate()->set_learning_rate(1.0);
    for (int p = 0; p < kParams; ++p) {
      absl::Status init = trainer->InitParam(
          Param(p), Tensor::FromValues<float>({kWidth}, std::vector<float>(kWidth, 0)), sgd);
      EXPECT_OK(init);
      if (!init.ok()) return nullptr;
    }
    for (int k = 0; k < big; ++k) {
      absl::Status init = trainer->InitParam(
          absl::StrCat("big", k),
          Tensor::FromValues<float>({big_floats}, std::vector<float>(big_floats, 0)), sgd);
      EXPECT_OK(init);
      if (!init.ok()) return nullptr;
    }
    EXPECT_OK(trainer->FinishInitParams());
    return trainer;
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

  // The address in etcd key `key` (a /ps/<i> or /standby/<i>/<instance>
  // value); "" when absent, a test failure unless `may_be_absent`.
  std::string AddressAt(const std::string& key, bool may_be_absent = false) {
    absl::StatusOr<KeyValue> kv = etcd_client_->Get(key);
    if (!may_be_absent) EXPECT_OK(kv) << key;
    if (!kv.ok()) return "";
    absl::StatusOr<etcd_keys::ServerEntry> entry = etcd_keys::ParseServerValue(kv->value);
    EXPECT_OK(entry);
    return entry.ok() ? entry->address : "";
  }

  // Each shard's primary and its standby hold one state (equal checksums).
  void ExpectStandbysHoldTheirPrimariesState() {
    for (uint32_t i = 0; i < kServers; ++i) {
      EXPECT_EQ(StateChecksum(AddressAt(etcd_keys::ServerKey(i)), admin_),
                StateChecksum(StandbyAddress(i), admin_))
          << "shard " << i;
    }
  }

  // kill -9 of shard i's primary (holders[i]): its standby (standbys[i])
  // takes the shard over, one epoch up, and becomes holders[i]; a new
  // standby attaches to it.
  void FailOver(uint32_t i, std::vector<std::unique_ptr<ChildProcess>>& holders,
                std::vector<std::unique_ptr<ChildProcess>>& standbys) {
    const v1::ShardConfig before = Config(i);
    ASSERT_EQ(before.replicas_size(), 1) << "shard " << i << " has no standby";
    const std::string successor = before.replicas(0);
    ASSERT_EQ(kill(holders[i]->pid(), SIGKILL), 0) << std::strerror(errno);
    ASSERT_OK_AND_ASSIGN(int status, holders[i]->WaitForExit(absl::Now() + kWait));
    EXPECT_TRUE(WIFSIGNALED(status)) << DescribeWaitStatus(status);
    AwaitTakeover(i, successor, *standbys[i]);
    holders[i] = std::move(standbys[i]);
    standbys[i] = StartStandby(i);
    ASSERT_NE(standbys[i], nullptr);
  }

  // Until /shards/<i> names `successor` as holder (bounded).
  void AwaitTakeover(uint32_t i, const std::string& successor, const ChildProcess& standby) {
    bool took_over = false;
    for (int wait = 0; wait < 4500 && !took_over; ++wait) {
      took_over = Config(i).holder() == successor;
      if (!took_over) absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_TRUE(took_over) << "shard " << i << "'s standby did not take over: " << standby.output();
  }

  // Standbys first (a primary's shutdown would promote them), by kill -9;
  // then the holders, by SIGTERM, each expected to exit cleanly.
  void StopAll(std::vector<std::unique_ptr<ChildProcess>>& standbys,
               std::vector<std::unique_ptr<ChildProcess>>& holders) {
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

  v1::CheckpointRecord PublishedCheckpoint(uint32_t shard) {
    absl::StatusOr<KeyValue> kv = etcd_client_->Get(etcd_keys::CheckpointKey(shard));
    v1::CheckpointRecord record;
    if (kv.ok()) {
      EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(kv->value, &record).ok())
          << kv->value;
    }
    return record;
  }

  std::unique_ptr<testing::EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> etcd_client_;
  int lease_ttl_s_ = 2;  // the servers' --lease_ttl
  bool checkpoints_ = false;
  inline static int processes_ = 0;  // across tests: one process, one TEST_TMPDIR
  std::vector<std::string> extra_flags_;  // every process's, after Flags()'s
  TlsOptions client_tls_;                  // the trainers' (Connect)
  std::string client_token_;               // the trainers' bearer token
  Caller admin_;                           // what checksums present
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
  // Lets training go on to `step` (no further) without waiting for it.
  void Allow(int step) { allowed_.store(std::min(step, to_)); }
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

// A stub for the server at `address`, with `tls` (plaintext when off).
std::unique_ptr<v1::ParameterServer::Stub> Stub(const std::string& address,
                                                const TlsOptions& tls = {}) {
  grpc::ChannelArguments arguments;
  AddTlsChannelArguments(tls, &arguments);
  return v1::ParameterServer::NewStub(
      grpc::CreateCustomChannel(address, MakeChannelCredentials(tls), arguments));
}

v1::ServerStats Stats(const std::string& address) {
  auto stub = Stub(address);
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

uint32_t StateChecksum(const std::string& address, const Caller& caller) {
  auto stub = Stub(address, caller.tls);
  grpc::ClientContext context;
  if (!caller.token.empty()) context.AddMetadata("authorization", "Bearer " + caller.token);
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
  // Each kill is seen at once (the address refuses: no lease expiry waited
  // for), so a long lease costs nothing here, and a primary whose
  // keep-alives a loaded machine delays does not lose its shard to its
  // standby unasked (then two shards lack a backup, and the fresh standby
  // started for the killed one may back up the other). Likewise a backup
  // slow to answer is not dropped after 10 s.
  lease_ttl_s_ = 10;
  extra_flags_ = {"--replicate_timeout=60"};
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
  ExpectStandbysHoldTheirPrimariesState();

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
    std::printf("kill -9 of shard %u's primary after step %d\n", i, steps_done.load());
    FailOver(i, holders, standbys);
    if (HasFatalFailure()) break;
  }
  ASSERT_OK(paced.Finish());
  ASSERT_EQ(steps_done.load(), kSteps);

  // Exact to the bit: 0 - sum of every acknowledged gradient; and each
  // shard's primary and its newest standby hold one state.
  ExpectTrained(*trainer, kSteps);
  ExpectStandbysHoldTheirPrimariesState();

  trainer.reset();
  StopAll(standbys, holders);  // the holders: each a promoted standby, stopped cleanly
}

// The other side: a backup killed mid-training. The primary's next write is
// not acknowledged by it; the primary drops it from /shards/<i> (epoch + 1)
// before acknowledging that write, and training goes on without a backup.
TEST_F(ReplicationTest, APrimaryDropsAKilledStandbyBeforeAcknowledging) {
  Started started = StartTraining(/*standby_of_shard0=*/true);
  ASSERT_TRUE(started.ok(true));
  auto& [primaries, trainer, standby] = started;
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

// Catch-up from a backup's own LSN (--catch_up_bytes): a standby paused
// past the replicate timeout is dropped; the primary goes on alone,
// numbering and keeping its writes; resumed, the standby finds itself
// unlisted and rejoins holding its state up to its LSN: the primary sends
// only the writes after it (no copy), then lists it. With a bound too small
// for those writes it is sent a full copy instead. Training exact, the
// standby's checksum the primary's.
class CatchUpTest : public ReplicationTest,
                    public ::testing::WithParamInterface<bool> {};

TEST_P(CatchUpTest, ADroppedStandbyRejoinsFromItsOwnLsnOrCopiesWhenTheWritesAreNotKept) {
  const bool kept = GetParam();
  // 1024 bytes keep less than one step's writes (8 x 16 floats and more).
  extra_flags_ = {kept ? "--catch_up_bytes=67108864" : "--catch_up_bytes=1024"};
  Started started = StartTraining(/*standby_of_shard0=*/true);
  ASSERT_TRUE(started.ok(true));
  auto& [primaries, trainer, standby] = started;
  std::atomic<int> steps_done{0};
  ASSERT_OK(Train(*trainer, 0, 6, &steps_done));
  ASSERT_EQ(kill(standby->pid(), SIGSTOP), 0) << std::strerror(errno);
  // Acknowledged once the primary dropped the paused standby (its write
  // timed out), then more without any backup.
  ASSERT_OK(Train(*trainer, 6, 12, &steps_done));
  EXPECT_EQ(Config(0).replicas_size(), 0);
  ASSERT_EQ(kill(standby->pid(), SIGCONT), 0) << std::strerror(errno);
  bool listed = false;
  for (int i = 0; i < 4500 && !listed; ++i) {
    listed = Config(0).replicas_size() == 1;
    if (!listed) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(listed) << standby->output();
  ASSERT_OK(Train(*trainer, 12, 16, &steps_done));
  EXPECT_EQ(StateChecksum(AddressAt(etcd_keys::ServerKey(0)), admin_),
            StateChecksum(StandbyAddress(0), admin_));
  ExpectTrained(*trainer, 16);
  // What each said (read once they exited).
  trainer.reset();
  KillNine(*standby);
  StopCleanly(primaries);
  const std::string copied = "standby: copied shard 0 from its primary";
  const std::string out = standby->output();
  if (HasFailure()) {
    ADD_FAILURE() << "standby:\n" << out << "\nprimary 0:\n" << primaries[0]->output();
  }
  int copies = 0;
  for (size_t at = out.find(copied); at != std::string::npos; at = out.find(copied, at + 1)) {
    ++copies;
  }
  if (kept) {
    EXPECT_EQ(copies, 1) << out;  // the first attach only
    EXPECT_THAT(out, HasSubstr("standby: rejoined shard 0 from its own LSN"));
    EXPECT_THAT(primaries[0]->output(), HasSubstr("rejoining shard 0 from its own LSN"));
  } else {
    EXPECT_EQ(copies, 2) << out;
    EXPECT_THAT(out, ::testing::Not(HasSubstr("rejoined shard 0 from its own LSN")));
    EXPECT_THAT(primaries[0]->output(), HasSubstr("but is sent a full copy: write "));
  }
}

INSTANTIATE_TEST_SUITE_P(KeptOrNot, CatchUpTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "WritesKept" : "WritesNotKept";
                         });

// Replication health: a primary reports its live backups and last LSN, a
// standby the LSN it applied; once the primary dropped its killed backup
// it counts the drop, has no backup, and GetStats says it is degraded.
TEST_F(ReplicationTest, APrimaryWhoseBackupWasDroppedReportsItselfDegraded) {
  extra_flags_ = {"--metrics_port=0"};
  Started started = StartTraining(/*standby_of_shard0=*/true);
  ASSERT_TRUE(started.ok(true));
  auto& [primaries, trainer, standby] = started;
  const std::string primary = AddressAt(etcd_keys::ServerKey(0));
  const std::string backup = StandbyAddress(0);
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
  // 8 parameters of 64 KiB beside the small ones: each shard holds some
  // (placement is deterministic), so each shard's copy is past the 4 KiB bound.
  Started started = StartTraining(/*standby_of_shard0=*/false, 8, 1 << 14);
  ASSERT_TRUE(started.ok(false));
  auto& [primaries, trainer, unused_standby] = started;
  std::unique_ptr<ChildProcess> standby = FailedStandby("--max_standby_copy_bytes=4096");
  ASSERT_NE(standby, nullptr);
  EXPECT_THAT(standby->err(), ::testing::HasSubstr("--max_standby_copy_bytes=4096"));
  EXPECT_THAT(standby->err(), ::testing::HasSubstr("nothing loaded"));
  // The standby was never listed (it would have been once caught up); the
  // primary let it go, and the primaries serve on.
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
  Started started = StartTraining(/*standby_of_shard0=*/true);
  ASSERT_TRUE(started.ok(true));
  auto& [primaries, trainer, standby] = started;
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

// ---- Tables across a failover ---------------------------------------------

constexpr int kWorkers = 2;
constexpr int kTableSteps = 40;
constexpr int kDim = 4;
constexpr int kTableKeys = 8;

// A sparse table trained by Adam (order-sensitive) from a seeded uniform
// initializer.
v1::TableConfig AdamTable() {
  v1::TableConfig config;
  config.set_dim(kDim);
  config.mutable_initializer()->mutable_uniform()->set_low(-0.5);
  config.mutable_initializer()->mutable_uniform()->set_high(0.5);
  config.mutable_initializer()->set_seed(7);
  config.mutable_optimizer()->mutable_adam()->set_learning_rate(0.01);
  return config;
}

// A KV table of adds under BSP: an add is held back until every worker has
// passed the clock it was made at.
v1::TableConfig BspTable() {
  v1::TableConfig config;
  config.set_dim(kDim);
  config.mutable_optimizer()->mutable_add();
  config.mutable_consistency()->set_model(v1::Consistency::BSP);
  return config;
}

// Worker w's rows of the Adam table (disjoint per worker: each row's pushes
// come in one order), and the KV keys every worker adds to.
std::vector<uint64_t> AdamKeys(int w) {
  std::vector<uint64_t> keys;
  for (int k = 0; k < kTableKeys; ++k) keys.push_back(1000 * (w + 1) + 37 * k);
  return keys;
}
std::vector<uint64_t> KvKeys() {
  std::vector<uint64_t> keys;
  for (int k = 0; k < kTableKeys; ++k) keys.push_back(k);
  return keys;
}

// Integers: every sum of adds is exact in float32.
float KvAdd(int step, int w, int k, int c) {
  return static_cast<float>((step * 3 + w * 5 + k + c) % 7 + 1);
}
float AdamGrad(int step, int w, int k, int c) {
  return static_cast<float>((step + 2 * w + 3 * k + c) % 9 - 4) * 0.125f;
}

// The KV value of key k, column c, once the adds of clocks [0, clock) applied.
float KvExpected(int clock, int k, int c) {
  float sum = 0;
  for (int step = 0; step < clock; ++step) {
    for (int w = 0; w < kWorkers; ++w) sum += KvAdd(step, w, k, c);
  }
  return sum;
}

// Worker w's steps [from, to) on tables `adam` and `kv` (its KvWorker):
// a BSP read that must see exactly the adds of earlier clocks, an add, a
// pull and an Adam push of its own rows, a clock tick. `done` counts steps.
absl::Status TrainTables(const Table& adam, KvWorker& kv, int w, int from, int to,
                         std::atomic<int>* done) {
  const std::vector<uint64_t> kv_keys = KvKeys(), adam_keys = AdamKeys(w);
  std::vector<float> rows(kTableKeys * kDim), values(kTableKeys * kDim);
  for (int step = from; step < to; ++step) {
    auto failed = [&](const absl::Status& status) {
      return absl::Status(status.code(),
                          absl::StrCat("worker ", w, " step ", step, ": ", status.message()));
    };
    if (kv.clock() != step) {
      return absl::InternalError(absl::StrCat("worker ", w, " at clock ", kv.clock(),
                                              " before step ", step));
    }
    if (absl::Status s = kv.Get<float>(kv_keys, absl::MakeSpan(rows)); !s.ok()) return failed(s);
    for (int k = 0; k < kTableKeys; ++k) {
      for (int c = 0; c < kDim; ++c) {
        if (rows[k * kDim + c] != KvExpected(step, k, c)) {
          return absl::InternalError(absl::StrCat(
              "worker ", w, " step ", step, ": BSP read of key ", k, " column ", c, " is ",
              rows[k * kDim + c], ", not the adds of clocks before it, ", KvExpected(step, k, c)));
        }
        values[k * kDim + c] = KvAdd(step, w, k, c);
      }
    }
    if (absl::Status s = kv.Add<float>(kv_keys, values); !s.ok()) return failed(s);
    if (absl::Status s = adam.Pull<float>(adam_keys, absl::MakeSpan(rows)); !s.ok()) {
      return failed(s);
    }
    for (int k = 0; k < kTableKeys; ++k) {
      for (int c = 0; c < kDim; ++c) values[k * kDim + c] = AdamGrad(step, w, k, c);
    }
    if (absl::Status s = adam.Push<float>(adam_keys, values); !s.ok()) return failed(s);
    if (absl::Status s = kv.Clock(); !s.ok()) return failed(s);
    done->store(step + 1);
  }
  return absl::OkStatus();
}

// The tables of one run (names prefixed), a client and a KvWorker per worker.
struct TableRun {
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<Table> adam;
  std::vector<std::unique_ptr<KvWorker>> kv;
  std::atomic<int> done[kWorkers] = {};
  absl::Status results[kWorkers];

  int Done() const { return std::min(done[0].load(), done[1].load()); }
  // The workers leave their tables while the servers still run.
  void Close() {
    kv.clear();
    adam.clear();
    clients.clear();
  }
};

// Two workers train `run`'s tables for kTableSteps steps in threads;
// `between` runs on this thread meanwhile (the kills).
void TrainInThreads(TableRun& run, const std::function<void()>& between) {
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&run, w] {
      run.results[w] = TrainTables(run.adam[w], *run.kv[w], w, 0, kTableSteps, &run.done[w]);
      if (!run.results[w].ok()) run.done[w].store(kTableSteps);  // nobody waits on it
    });
  }
  between();
  for (std::thread& t : workers) t.join();
}

std::vector<float> PullRows(const Table& table, const std::vector<uint64_t>& keys) {
  std::vector<float> rows(keys.size() * kDim);
  EXPECT_OK(table.Pull<float>(keys, absl::MakeSpan(rows))) << table.name();
  return rows;
}

TEST_F(ReplicationTest, AdamAndBspTablesContinueExactlyAcrossKillsOfEachPrimary) {
  std::vector<std::unique_ptr<ChildProcess>> holders = StartPrimaries();
  ASSERT_EQ(holders.size(), static_cast<size_t>(kServers));
  std::vector<std::unique_ptr<ChildProcess>> standbys;
  for (uint32_t i = 0; i < kServers; ++i) {
    standbys.push_back(StartStandby(i));
    ASSERT_NE(standbys.back(), nullptr);
  }
  // Each run's tables; the first run has no kill: it is the reference.
  auto open = [&](TableRun& run, const std::string& prefix) {
    for (int w = 0; w < kWorkers; ++w) {
      run.clients.push_back(Connect());
      ASSERT_NE(run.clients.back(), nullptr);
      ASSERT_OK_AND_ASSIGN(Table adam, Table::Create(*run.clients[w], prefix + "adam", AdamTable()));
      ASSERT_OK_AND_ASSIGN(Table kv, Table::Create(*run.clients[w], prefix + "kv", BspTable()));
      run.adam.push_back(adam);
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvWorker> worker,
                           KvWorker::Join(kv, absl::StrCat("worker-", w)));
      run.kv.push_back(std::move(worker));
    }
  };
  TableRun reference;
  open(reference, "ref_");
  ASSERT_FALSE(HasFatalFailure());
  TrainInThreads(reference, [] {});
  for (const absl::Status& result : reference.results) ASSERT_OK(result);

  // Before any kill: each primary's state (rows, Adam moments and steps,
  // clocks, held-back adds, applied request ids) equals its standby's.
  ExpectStandbysHoldTheirPrimariesState();

  // The same training on fresh tables, each shard's primary killed once at
  // a seeded random step.
  TableRun killed;
  open(killed, "");
  ASSERT_FALSE(HasFatalFailure());
  const unsigned seed = static_cast<unsigned>(absl::ToUnixNanos(absl::Now()));
  std::printf("kill points seeded with %u\n", seed);
  std::mt19937 random(seed);
  TrainInThreads(killed, [&] {
    int kill_after = 0;
    for (uint32_t i = 0; i < kServers; ++i) {
      kill_after += 3 + static_cast<int>(random() % 12);
      bool reached = false;
      for (int wait = 0; wait < 9000 && !reached; ++wait) {
        reached = killed.Done() >= kill_after;
        if (!reached) absl::SleepFor(absl::Milliseconds(10));
      }
      ASSERT_TRUE(reached) << "training stalled at step " << killed.Done();
      std::printf("kill -9 of shard %u's primary after step %d\n", i, killed.Done());
      FailOver(i, holders, standbys);
      if (HasFatalFailure()) return;
    }
  });
  ASSERT_FALSE(HasFatalFailure());
  for (const absl::Status& result : killed.results) ASSERT_OK(result);

  // Rows and their optimizer state continued exactly: every Adam row equals
  // the reference run's to the bit (a lost or doubled push, or a lost
  // moment, would change it); the KV rows hold every add once.
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_EQ(PullRows(killed.adam[w], AdamKeys(w)), PullRows(reference.adam[w], AdamKeys(w)))
        << "worker " << w;
    EXPECT_NE(PullRows(killed.adam[w], AdamKeys(w)),
              PullRows(reference.adam[w], AdamKeys(1 - w)));  // the rows differ per worker
  }
  std::vector<float> kv_expected;
  for (int k = 0; k < kTableKeys; ++k) {
    for (int c = 0; c < kDim; ++c) kv_expected.push_back(KvExpected(kTableSteps, k, c));
  }
  EXPECT_EQ(PullRows(killed.kv[0]->table(), KvKeys()), kv_expected);
  // Clocks continued: every worker at kTableSteps on every shard.
  for (int w = 0; w < kWorkers; ++w) EXPECT_EQ(killed.kv[w]->clock(), kTableSteps);
  ASSERT_OK_AND_ASSIGN(std::vector<v1::TableStats> stats, killed.kv[0]->table().Stats());
  ASSERT_EQ(stats.size(), static_cast<size_t>(kServers));
  for (const v1::TableStats& s : stats) {
    EXPECT_EQ(s.min_clock(), kTableSteps);
    EXPECT_EQ(s.workers(), static_cast<uint32_t>(kWorkers));
  }
  // The new standbys copied the promoted primaries' state and kept up.
  ExpectStandbysHoldTheirPrimariesState();
  reference.Close();
  killed.Close();
  StopAll(standbys, holders);
}

// ---- A primary paused past its lease (SIGSTOP) --------------------------------

std::unique_ptr<v1::ParameterServer::Stub> StubAt(const std::string& address) {
  return v1::ParameterServer::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

// The parameters `address` holds blocks of (ListParams, one page).
std::vector<std::string> ParamsAt(const std::string& address) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::ListParamsResponse response;
  const grpc::Status status = StubAt(address)->ListParams(&context, {}, &response);
  EXPECT_TRUE(status.ok()) << address << ": " << status.error_message();
  std::vector<std::string> names;
  for (const v1::ParamListing& p : response.params()) {
    if (p.blocks_held() > 0) names.push_back(p.name());
  }
  return names;
}

// `grad`: `value` in every element of `param` (kWidth float32).
void FillGradient(v1::Gradient* grad, const std::string& param, float value) {
  grad->set_name(param);
  grad->set_element_type(v1::FLOAT32);
  grad->set_content(std::string(
      Tensor::FromValues<float>({kWidth}, std::vector<float>(kWidth, value)).bytes()));
}

// One push of 1000s to `param` straight to `address` over gRPC, no retries:
// a client still holding that address.
grpc::Status RawPush(const std::string& address, const std::string& param) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::SendGradRequest request;
  FillGradient(request.mutable_gradient(), param, 1000);
  v1::SendGradResponse response;
  return StubAt(address)->SendGrad(&context, request, &response);
}

// SIGCONTs a paused primary of shard 0 (`holder`, once at `old_address`)
// and waits, bounded, until `listed` says its fresh standby is the shard's
// backup, every push sent straight to it meanwhile refused; then it has
// said that it stepped down.
void ResumeRefusingUntilRejoined(ChildProcess& holder, const std::string& old_address,
                                 const std::string& param, const std::function<bool()>& listed) {
  ASSERT_EQ(kill(holder.pid(), SIGCONT), 0) << std::strerror(errno);
  bool rejoined = false;
  for (int i = 0; i < 1800 && !rejoined; ++i) {
    const grpc::Status refused = RawPush(old_address, param);
    ASSERT_FALSE(refused.ok()) << "the paused primary acknowledged a push after the takeover";
    rejoined = listed();
    if (!rejoined) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(rejoined) << holder.output();
  ASSERT_OK(holder.WaitForLine("pserver 0: its server of shard 0 stepped down",
                               absl::Now() + kWait));
}

// One SendGrads of `value` everywhere to `param`, as push `sequence` of a
// fixed client id, straight to `address` over gRPC, no retries.
grpc::Status RawSendGrads(const std::string& address, const std::string& param,
                          uint64_t sequence, float value) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::SendGradsRequest request;
  FillGradient(request.add_gradients(), param, value);
  request.set_client_id(0x5eed);
  request.set_sequence(sequence);
  v1::SendGradsResponse response;
  return StubAt(address)->SendGrads(&context, request, &response);
}

// A push the primary refuses (a NaN) is shipped nowhere and its id is used
// up nowhere: primary and standby keep one state (their checksums cover the
// applied id sets), the same id retried on the primary is refused alike,
// and so it is on the standby once it took the shard over (kill -9).
TEST_F(ReplicationTest, ARefusedPushIsAnsweredAlikeByThePrimaryAndItsSuccessor) {
  Started started = StartTraining(/*standby_of_shard0=*/true);
  ASSERT_TRUE(started.ok(true));
  auto& [primaries, trainer, standby] = started;
  std::atomic<int> steps_done{0};
  ASSERT_OK(Train(*trainer, 0, 4, &steps_done));
  const std::string primary = AddressAt(etcd_keys::ServerKey(0));
  const std::vector<std::string> held = ParamsAt(primary);
  ASSERT_FALSE(held.empty());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const grpc::Status first = RawSendGrads(primary, held[0], 1, nan);
  ASSERT_EQ(first.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << first.error_message();
  const grpc::Status again = RawSendGrads(primary, held[0], 1, nan);
  EXPECT_EQ(again.error_code(), first.error_code()) << again.error_message();
  EXPECT_EQ(again.error_message(), first.error_message());
  EXPECT_EQ(StateChecksum(primary, admin_), StateChecksum(StandbyAddress(0), admin_));

  const std::string successor = Config(0).replicas(0);
  KillNine(*primaries[0]);
  AwaitTakeover(0, successor, *standby);
  const std::string new_primary = AddressAt(etcd_keys::ServerKey(0));
  // Retried on the new primary (UNAVAILABLE while it starts serving).
  grpc::Status retried;
  for (int i = 0; i < 600; ++i) {
    retried = RawSendGrads(new_primary, held[0], 1, nan);
    if (retried.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(retried.error_code(), first.error_code()) << retried.error_message();
  EXPECT_EQ(retried.error_message(), first.error_message());
  // Training goes on exact: no refused push counted anywhere.
  ASSERT_OK(Train(*trainer, 4, 8, &steps_done));
  ExpectTrained(*trainer, 8);

  trainer.reset();
  std::vector<std::unique_ptr<ChildProcess>> serving;
  serving.push_back(std::move(standby));
  serving.push_back(std::move(primaries[1]));
  StopCleanly(serving);
}

// A primary paused (SIGSTOP) past its lease while training runs: its
// standby takes over. Resumed, it acknowledges nothing, steps down, and the
// process replaces it with a fresh standby that copies shard 0 from its
// replacement and is listed as its backup (R restored). A kill -9 of the
// replacement later: the rejoined one takes over and training ends exact.
TEST_F(ReplicationTest, APrimaryPausedPastItsLeaseStepsDownAndRejoinsAsTheBackupOfItsReplacement) {
  checkpoints_ = true;
  std::vector<std::unique_ptr<ChildProcess>> holders = StartPrimaries();
  ASSERT_EQ(holders.size(), static_cast<size_t>(kServers));
  std::unique_ptr<Client> trainer = ConnectAndInit();
  ASSERT_NE(trainer, nullptr);
  std::unique_ptr<ChildProcess> standby = StartStandby(0);
  ASSERT_NE(standby, nullptr);
  std::atomic<int> steps_done{0};
  ASSERT_OK(Train(*trainer, 0, 10, &steps_done));

  const v1::ShardConfig before = Config(0);
  const std::string old_address = AddressAt(etcd_keys::ServerKey(0));
  const std::vector<std::string> held = ParamsAt(old_address);
  ASSERT_FALSE(held.empty());

  // Paused past its lease while training goes on: the standby takes over
  // (etcd names it) and the trainer's steps complete against it.
  ASSERT_EQ(kill(holders[0]->pid(), SIGSTOP), 0) << std::strerror(errno);
  absl::Status training;
  std::thread trainer_thread([&] { training = Train(*trainer, 10, kSteps, &steps_done); });
  AwaitTakeover(0, before.replicas(0), *standby);
  bool went_on = false;
  for (int wait = 0; wait < 9000 && !went_on; ++wait) {
    went_on = steps_done.load() >= kSteps / 2;
    if (!went_on) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(went_on) << "training stalled at step " << steps_done.load();
  const v1::ShardConfig after = Config(0);
  EXPECT_EQ(after.epoch(), before.epoch() + 1);
  EXPECT_EQ(after.replicas_size(), 0);
  const std::string new_address = AddressAt(etcd_keys::ServerKey(0));
  EXPECT_NE(new_address, old_address);

  // Resumed: a client still holding the old address has every push refused
  // (never OK: the fence, then stepped down, then the port closed or a
  // standby's) until the process's fresh standby is listed as the backup of
  // shard 0. Shard 1's primary is no standby: the backup is that process.
  ASSERT_NO_FATAL_FAILURE(ResumeRefusingUntilRejoined(
      *holders[0], old_address, held[0], [&] { return Config(0).replicas_size() == 1; }));
  const v1::ShardConfig backed_up = Config(0);
  EXPECT_EQ(backed_up.holder(), after.holder());
  EXPECT_NE(backed_up.replicas(0), before.holder());  // a fresh instance
  EXPECT_NE(StandbyAddress(0), new_address);
  EXPECT_FALSE(RawPush(old_address, held[0]).ok());

  trainer_thread.join();
  ASSERT_OK(training);
  // Nothing acknowledged is lost, and none of the refused pushes counts;
  // the rejoined backup holds its primary's state.
  ExpectTrained(*trainer, kSteps);
  EXPECT_EQ(StateChecksum(new_address, admin_), StateChecksum(StandbyAddress(0), admin_));

  // Checkpoints: the new primary publishes at the new epoch (or the one
  // above, which listed the rejoined backup); the old server published
  // none after it paused.
  bool published = false;
  for (int wait = 0; wait < 3000 && !published; ++wait) {
    const v1::CheckpointRecord record = PublishedCheckpoint(0);
    published = record.epoch() >= after.epoch() && record.epoch() <= backed_up.epoch() &&
                record.server_address() == new_address;
    if (!published) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(published) << "the new primary published no checkpoint: " << standby->output();

  // The replacement killed: the rejoined backup takes shard 0 over (its
  // process says so) and training goes on, exact to the bit.
  const std::string rejoined_id = backed_up.replicas(0);
  KillNine(*standby);
  AwaitTakeover(0, rejoined_id, *holders[0]);
  ASSERT_OK(Train(*trainer, kSteps, kSteps + 10, &steps_done));
  ExpectTrained(*trainer, kSteps + 10);
  EXPECT_OK(holders[0]->WaitForLine(
      absl::StrCat("pserver 0 listening on ", AddressAt(etcd_keys::ServerKey(0)), " (a standby"),
      absl::Now() + kWait));

  trainer.reset();
  StopCleanly(holders);
  // Why it stepped down: etcd names the new holder, or (a write in flight
  // when it paused) the promoted standby refused it as of an older epoch;
  // either names the new epoch. Its stepped-down server saved nothing.
  EXPECT_THAT(holders[0]->err(), ::testing::ContainsRegex(absl::StrCat(
                                     "stepping down: [^\n]*epoch ", after.epoch())));
  EXPECT_THAT(holders[0]->err(), HasSubstr("no final checkpoint"));
  EXPECT_THAT(holders[0]->err(), HasSubstr("standby: copied shard 0 from its primary"));
}

// A primary that goes silent (SIGSTOP: its host answers nothing, so only
// its lease tells) with pushes just sent to it, by clients whose attempt
// timeout is an hour. Once the standby took the shard over (after the 2 s
// lease) and etcd names it at /ps/0, each client abandons its attempt to the
// paused primary and retries it at the standby with the same request id:
// a dense push over the bulk channel and one over gRPC, a KV table push
// over the bulk channel (table frames) and one over gRPC, all complete
// within the test's bounded wait (a fraction of the attempt timeout), each
// applied exactly once. Resumed, the old primary acknowledges nothing (raw
// pushes to it are refused), steps down and rejoins as a backup; the values
// stay exact. Without the abandon the pushes would wait out the hour: the
// bounded wait fails, and the test then kills the paused primary so that
// they end.
TEST_F(ReplicationTest, PushesSentToASilentPrimaryAreRetriedAtItsSuccessorOnceEtcdNamesIt) {
  std::vector<std::unique_ptr<ChildProcess>> holders = StartPrimaries();
  ASSERT_EQ(holders.size(), static_cast<size_t>(kServers));
  std::unique_ptr<Client> trainer = ConnectAndInit();
  ASSERT_NE(trainer, nullptr);
  std::unique_ptr<ChildProcess> standby = StartStandby(0);
  ASSERT_NE(standby, nullptr);
  std::atomic<int> steps_done{0};
  ASSERT_OK(Train(*trainer, 0, 10, &steps_done));

  // Clients that give an attempt an hour: one over the bulk channel, one
  // over gRPC only.
  constexpr absl::Duration kHour = absl::Hours(1);
  auto patient = [&](bool bulk_channel) {
    return Connect([&](ClientOptions& options) {
      options.timeout = kHour;
      options.attempt_timeout = kHour;
      options.bulk_channel = bulk_channel;
    });
  };
  std::unique_ptr<Client> bulk = patient(true);
  std::unique_ptr<Client> grpc_only = patient(false);
  ASSERT_NE(bulk, nullptr);
  ASSERT_NE(grpc_only, nullptr);
  v1::TableConfig adds;
  adds.set_dim(kDim);
  adds.mutable_optimizer()->mutable_add();
  ASSERT_OK_AND_ASSIGN(Table bulk_table, Table::Create(*bulk, "adds", adds));
  ASSERT_OK_AND_ASSIGN(Table grpc_table, Table::Create(*grpc_only, "adds", adds));
  // Keys of shard 0, the one paused.
  std::vector<uint64_t> keys;
  for (uint64_t key = 0; keys.size() < kTableKeys && key < 10000; ++key) {
    ASSERT_OK_AND_ASSIGN(int server, bulk_table.ServerOf(key));
    if (server == 0) keys.push_back(key);
  }
  ASSERT_EQ(keys.size(), static_cast<size_t>(kTableKeys));
  // Every connection open (pulls), and the rows before the pushes.
  for (int p = 0; p < kParams; ++p) {
    ASSERT_OK(bulk->GetParam(Param(p)).status());
    ASSERT_OK(grpc_only->GetParam(Param(p)).status());
  }
  ASSERT_EQ(PullRows(grpc_table, keys), PullRows(bulk_table, keys));
  const std::vector<float> rows_before = PullRows(bulk_table, keys);
  auto table_add = [&](int k, int c, int client) {
    return static_cast<float>((k * 3 + c + client * 5) % 7 + 1);
  };
  std::vector<float> table_grads[2];
  for (int client = 0; client < 2; ++client) {
    for (int k = 0; k < kTableKeys; ++k) {
      for (int c = 0; c < kDim; ++c) table_grads[client].push_back(table_add(k, c, client));
    }
  }

  const v1::ShardConfig before = Config(0);
  ASSERT_EQ(before.replicas_size(), 1);
  const std::string old_address = AddressAt(etcd_keys::ServerKey(0));
  const std::vector<std::string> held = ParamsAt(old_address);
  ASSERT_FALSE(held.empty());

  // Paused, then the pushes (steps 10 and 11's gradients, and the adds).
  ASSERT_EQ(kill(holders[0]->pid(), SIGSTOP), 0) << std::strerror(errno);
  constexpr int kCalls = 4;
  TraceRecorder sent[kCalls];
  std::atomic<bool> finished[kCalls] = {};
  absl::Status results[kCalls];
  auto dense = [](int step) {
    std::vector<NamedTensor> grads;
    for (int p = 0; p < kParams; ++p) grads.push_back({Param(p), GradientTensor(step, p)});
    return grads;
  };
  const std::vector<NamedTensor> step10 = dense(10), step11 = dense(11);
  std::vector<std::function<absl::Status(const CallOptions&)>> calls = {
      [&](const CallOptions& call) { return bulk->SendGrads(step10, call); },
      [&](const CallOptions& call) { return grpc_only->SendGrads(step11, call); },
      [&](const CallOptions& call) {
        return bulk_table.Push<float>(keys, table_grads[0], call);
      },
      [&](const CallOptions& call) {
        return grpc_table.Push<float>(keys, table_grads[1], call);
      },
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < kCalls; ++i) {
    threads.emplace_back([&, i] {
      CallOptions call;
      call.trace = &sent[i];
      results[i] = calls[i](call);
      finished[i].store(true);
    });
  }
  // Bounded: far longer than the lease, far shorter than the hour, and
  // shorter than the client's gRPC keepalive (a ping after 1 min idle, 20 s
  // to answer: kClientKeepaliveTime), which would end a gRPC call to a
  // silent host too, after 80 s.
  constexpr int kBoundSeconds = 60;
  bool all = false;
  for (int wait = 0; wait < kBoundSeconds * 100 && !all; ++wait) {
    all = true;
    for (int i = 0; i < kCalls; ++i) all = all && finished[i].load();
    if (!all) absl::SleepFor(absl::Milliseconds(10));
  }
  std::string stuck;
  for (int i = 0; i < kCalls; ++i) {
    if (!finished[i].load()) absl::StrAppend(&stuck, " ", i);
  }
  EXPECT_TRUE(all) << "pushes" << stuck << " still waited on the paused primary after "
                   << kBoundSeconds << " s";
  if (!all) KillNine(*holders[0]);  // their attempts end (reset), so that they can be joined
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(all);
  for (int i = 0; i < kCalls; ++i) {
    EXPECT_OK(results[i]) << "push " << i;
    EXPECT_NE(sent[i].Get().sent, absl::InfinitePast()) << "push " << i;
  }
  const v1::ShardConfig after = Config(0);
  EXPECT_EQ(after.holder(), before.replicas(0));
  EXPECT_EQ(after.epoch(), before.epoch() + 1);
  EXPECT_GE(bulk->servers_replaced(), 1u);
  EXPECT_GE(grpc_only->servers_replaced(), 1u);
  const std::string new_address = AddressAt(etcd_keys::ServerKey(0));
  EXPECT_NE(new_address, old_address);

  // Applied exactly once: steps 0-11, and the two adds.
  auto expect_exact = [&] {
    ExpectTrained(*trainer, 12);
    std::vector<float> expected = rows_before;
    for (size_t j = 0; j < expected.size(); ++j) {
      expected[j] += table_grads[0][j] + table_grads[1][j];
    }
    EXPECT_EQ(PullRows(bulk_table, keys), expected);
  };
  expect_exact();

  // Resumed: it acknowledges nothing sent straight to it (the fence, then
  // stepped down, then a standby's), and steps down; the values stay exact.
  ASSERT_NO_FATAL_FAILURE(ResumeRefusingUntilRejoined(
      *holders[0], old_address, held[0], [&] { return Config(0).replicas_size() == 1; }));
  EXPECT_FALSE(RawPush(old_address, held[0]).ok());
  expect_exact();
  EXPECT_EQ(StateChecksum(new_address, admin_), StateChecksum(StandbyAddress(0), admin_));

  bulk.reset();
  grpc_only.reset();
  trainer.reset();
  KillNine(*holders[0]);  // now the backup: stopped first (its shutdown would not promote it)
  std::vector<std::unique_ptr<ChildProcess>> serving;
  serving.push_back(std::move(standby));
  serving.push_back(std::move(holders[1]));
  StopCleanly(serving);
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
    if (!settled) {
      std::string outputs;
      for (const std::string& survivor : survivors) {
        if (processes.count(survivor) == 0) continue;
        // Stopped to collect what it said (the test fails anyway).
        kill(processes[survivor]->pid(), SIGKILL);
        processes[survivor]->WaitForExit(absl::Now() + kWait).IgnoreError();
        absl::StrAppend(&outputs, "\n--- ", survivor, ":\n", processes[survivor]->output());
      }
      ASSERT_TRUE(settled) << "shard " << i << " did not settle on its survivors: "
                           << FormatShardConfig(Config(i)) << outputs;
    }
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

// A file under the test's temporary directory holding `text`.
std::string WriteTestFile(const std::string& name, const std::string& text) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name, "-", getpid());
  FILE* file = std::fopen(path.c_str(), "w");
  EXPECT_NE(file, nullptr) << path;
  if (file != nullptr) {
    std::fputs(text.c_str(), file);
    std::fclose(file);
  }
  return path;
}

// Replication on a secured cluster (docs/security.md): mutual TLS, roles
// from certificates. Each server's certificate names it admin of the job
// (cn:<role>.<job>), so a standby attaching and a primary replicating
// present it and are allowed; the trainer's names it trainer, which may
// train but neither replicate nor attach.
TEST_F(ReplicationTest, ReplicasOnAClusterWithMutualTlsAndCertificateRolesSurviveKills) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<TestCerts> certs, TestCerts::Create());
  ASSERT_OK_AND_ASSIGN(TestCa * ca, certs->AddCa("ca"));
  CertRequest server;
  server.common_name = "admin.job-a";
  server.ip_addresses = {"127.0.0.1"};
  ASSERT_OK_AND_ASSIGN(CertFiles server_files, ca->Issue("server", server));
  CertRequest trainer_request;
  trainer_request.common_name = "trainer.job-a";
  ASSERT_OK_AND_ASSIGN(CertFiles trainer_files, ca->Issue("trainer", trainer_request));
  extra_flags_ = {"--tls_cert=" + server_files.cert, "--tls_key=" + server_files.key,
                  "--tls_ca=" + ca->cert_path(), "--job=job-a",
                  "--auth_cert_rule=cn:<role>.<job>"};
  client_tls_.cert = trainer_files.cert;
  client_tls_.key = trainer_files.key;
  client_tls_.ca = ca->cert_path();
  admin_.tls = {.cert = server_files.cert, .key = server_files.key, .ca = ca->cert_path()};

  Started started = StartTraining(/*standby_of_shard0=*/false);
  ASSERT_TRUE(started.ok(false));
  std::vector<std::unique_ptr<ChildProcess>> standbys;
  for (uint32_t i = 0; i < kServers; ++i) {
    standbys.push_back(StartStandby(i));
    ASSERT_NE(standbys.back(), nullptr);
  }
  std::atomic<int> steps_done{0};
  ASSERT_OK(Train(*started.trainer, 0, 6, &steps_done));
  ExpectStandbysHoldTheirPrimariesState();

  // The trainer's certificate may not replicate to a standby nor attach
  // as one: PERMISSION_DENIED naming its role and the method.
  {
    grpc::ClientContext context;
    v1::ReplicateResponse response;
    const grpc::Status replicate =
        Stub(StandbyAddress(0), client_tls_)
            ->Replicate(&context, v1::ReplicateRequest(), &response);
    EXPECT_EQ(replicate.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(replicate.error_message(), HasSubstr("trainer"));
    EXPECT_THAT(replicate.error_message(), HasSubstr("Replicate"));
  }
  {
    grpc::ClientContext context;
    v1::AttachStandbyRequest request;
    request.set_shard(0);
    v1::AttachStandbyResponse response;
    const grpc::Status attach = Stub(AddressAt(etcd_keys::ServerKey(0)), client_tls_)
                                    ->AttachStandby(&context, request, &response);
    EXPECT_EQ(attach.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(attach.error_message(), HasSubstr("AttachStandby"));
  }

  // Each primary killed once mid-training: its standby takes over (over
  // TLS), a new one attaches, and training ends exact to the bit.
  std::vector<std::unique_ptr<ChildProcess>> holders = std::move(started.primaries);
  PacedTraining paced(*started.trainer, 6, 40, steps_done);
  for (uint32_t i = 0; i < kServers; ++i) {
    ASSERT_TRUE(paced.RunTo(10 + 10 * static_cast<int>(i)))
        << "training stalled at step " << steps_done.load();
    FailOver(i, holders, standbys);
    if (HasFatalFailure()) break;
  }
  ASSERT_OK(paced.Finish());
  ExpectTrained(*started.trainer, 40);
  ExpectStandbysHoldTheirPrimariesState();
  started.trainer.reset();
  StopAll(standbys, holders);
}

// Roles from bearer tokens (no client certificates): the servers present
// --peer_token_file, an admin's token, to each other. A standby whose token
// is a trainer's is refused by the primary, naming the role, and exits.
TEST_F(ReplicationTest, ReplicasWithTokenRolesPresentThePeerTokenAndSurviveAKill) {
  const std::string admin = "admin-token-0123456789abcdef";
  const std::string trainer = "trainer-token-0123456789abcdef";
  const std::string tokens = WriteTestFile(
      "tokens", absl::StrCat("admin job-a ", admin, "\ntrainer job-a ", trainer, "\n"));
  extra_flags_ = {"--job=job-a", "--auth_tokens_file=" + tokens,
                  "--peer_token_file=" + WriteTestFile("admin-token", admin)};
  client_token_ = trainer;
  admin_.token = admin;

  Started started = StartTraining(/*standby_of_shard0=*/true);
  ASSERT_TRUE(started.ok(true));
  std::unique_ptr<ChildProcess> refused =
      FailedStandby("--peer_token_file=" + WriteTestFile("trainer-token", trainer));
  ASSERT_NE(refused, nullptr);
  EXPECT_THAT(refused->err(), HasSubstr("PERMISSION_DENIED"));
  EXPECT_THAT(refused->err(), HasSubstr("trainer"));
  EXPECT_EQ(Config(0).replicas_size(), 1);

  std::atomic<int> steps_done{0};
  ASSERT_OK(Train(*started.trainer, 0, 6, &steps_done));
  EXPECT_EQ(StateChecksum(AddressAt(etcd_keys::ServerKey(0)), admin_),
            StateChecksum(StandbyAddress(0), admin_));
  std::vector<std::unique_ptr<ChildProcess>> holders = std::move(started.primaries);
  std::vector<std::unique_ptr<ChildProcess>> standbys;
  standbys.push_back(std::move(started.standby));
  FailOver(0, holders, standbys);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_OK(Train(*started.trainer, 6, 12, &steps_done));
  ExpectTrained(*started.trainer, 12);
  started.trainer.reset();
  StopAll(standbys, holders);
}

// Whether the server at `address` answers GetStats within a few seconds.
bool Answers(const std::string& address) {
  if (address.empty()) return false;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(3)));
  v1::GetStatsResponse response;
  return Stub(address)->GetStats(&context, v1::GetStatsRequest(), &response).ok();
}

// --replicas=2: every process serves its own shard and runs a standby slot
// that backs up another process's shard. Whole processes are killed (each
// takes its primaries and its backups with it); a replacement process
// (--standby --replicas=2: two standby slots) backs up what is left, and
// training ends exact to the bit. A slot never backs up a shard of its own
// process: if one did, killing that process would lose the shard and the
// training would stop.
TEST_F(ReplicationTest, ReplicasInTheServingProcessesSurviveKillsOfWholeProcesses) {
  std::vector<std::unique_ptr<ChildProcess>> processes = StartPrimaries({"--replicas=2"});
  ASSERT_EQ(processes.size(), static_cast<size_t>(kServers));
  std::unique_ptr<Client> trainer = ConnectAndInit();
  ASSERT_NE(trainer, nullptr);

  // Every shard served and backed up by a live process (bounded wait).
  auto await_backed_up = [&](const std::string& when) {
    bool backed_up = false;
    for (int wait = 0; wait < 900 && !backed_up; ++wait) {
      backed_up = true;
      for (uint32_t i = 0; i < kServers && backed_up; ++i) {
        const v1::ShardConfig config = Config(i);
        // Keys come and go during a takeover: absent ones just mean "not yet".
        backed_up = config.replicas_size() == 1 &&
                    Answers(AddressAt(etcd_keys::ServerKey(i), /*may_be_absent=*/true)) &&
                    Answers(AddressAt(etcd_keys::StandbyKey(i, config.replicas(0)),
                                      /*may_be_absent=*/true));
      }
      if (!backed_up) absl::SleepFor(absl::Milliseconds(100));
    }
    std::string outputs;
    for (const auto& process : processes) outputs += process->err();
    ASSERT_TRUE(backed_up) << when << ": a shard has no live backup:\n" << outputs;
  };
  await_backed_up("at start");
  std::atomic<int> steps_done{0};
  ASSERT_OK(Train(*trainer, 0, 6, &steps_done));
  ExpectStandbysHoldTheirPrimariesState();

  constexpr int kProcessKills = 4;
  PacedTraining paced(*trainer, 6, 120, steps_done);
  for (int k = 0; k < kProcessKills; ++k) {
    ASSERT_TRUE(paced.RunTo(10 + 20 * k)) << "training stalled at step " << steps_done.load();
    std::printf("kill -9 of process %d (pid %d) after step %d\n", k, processes[k]->pid(),
                steps_done.load());
    KillNine(*processes[k]);
    std::vector<std::string> flags = Flags();
    flags.insert(flags.end(), {"--standby", "--replicas=2"});
    absl::StatusOr<std::unique_ptr<ChildProcess>> replacement =
        ChildProcess::Spawn(RunfilesPath("cc/server/pserver"), flags);
    ASSERT_OK(replacement);
    processes.push_back(*std::move(replacement));
    // Training goes on meanwhile: a primary drops its dead backup only at
    // a write (until then /shards/<i> still lists it).
    paced.Allow(20 * (k + 1) + 10);
    await_backed_up(absl::StrCat("after kill ", k + 1));
    if (HasFatalFailure()) break;
  }
  ASSERT_OK(paced.Finish());
  ExpectTrained(*trainer, 120);
  ExpectStandbysHoldTheirPrimariesState();
  trainer.reset();
  for (size_t p = kProcessKills; p < processes.size(); ++p) KillNine(*processes[p]);
}

// ---- A primary shut down; a standby lost while etcd is down -----------------

class ReplicationShutdownTest : public ReplicationTest {
 protected:
  static constexpr int kShutdownSteps = 200;

  // What ShutDownPrimaryMidTraining saw of the old primary, and shard 0's
  // epochs before and after.
  struct ShutDown {
    int status = -1;  // wait status
    std::string err;
    uint64_t epoch_before = 0, epoch_after = 0;
  };

  // SIGTERM to shard 0's primary while a trainer runs: it stops listening,
  // its standby takes over (/shards/0 names it, one epoch up), and every
  // step completes (a call the primary refused while draining is retried on
  // the new primary with its request id), exact to the bit. Then stops the
  // promoted standby and shard 1's primary cleanly.
  void ShutDownPrimaryMidTraining(ShutDown& down) {
    Started started = StartTraining(/*standby_of_shard0=*/true);
    ASSERT_TRUE(started.ok(true));
    auto& [primaries, trainer, standby] = started;
    const v1::ShardConfig attached = Config(0);
    down.epoch_before = attached.epoch();
    std::atomic<int> steps_done{0};
    ASSERT_OK(Train(*trainer, 0, 10, &steps_done));
    {
      PacedTraining paced(*trainer, 10, kShutdownSteps, steps_done);
      ASSERT_TRUE(paced.RunTo(20)) << "training stalled at step " << steps_done.load();
      ASSERT_EQ(kill(primaries[0]->pid(), SIGTERM), 0) << std::strerror(errno);
      ASSERT_OK_AND_ASSIGN(down.status, primaries[0]->WaitForExit(absl::Now() + kWait));
      down.err = primaries[0]->err();
      AwaitTakeover(0, attached.replicas(0), *standby);
      ASSERT_OK(paced.Finish());
    }
    ASSERT_EQ(steps_done.load(), kShutdownSteps);
    ExpectTrained(*trainer, kShutdownSteps);
    down.epoch_after = Config(0).epoch();
    EXPECT_GT(down.epoch_after, down.epoch_before);
    trainer.reset();
    primaries[0] = std::move(standby);  // shard 0's primary now
    StopCleanly(primaries);
    EXPECT_THAT(primaries[0]->err(), HasSubstr("took over shard 0"));
  }
};

// Without --checkpoint_dir there is no final save to refuse: the old
// primary exits 0 whoever holds the shard by then.
TEST_F(ReplicationShutdownTest, APrimaryShutDownIsTakenOverByItsStandby) {
  ShutDown down;
  ShutDownPrimaryMidTraining(down);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_TRUE(WIFEXITED(down.status) && WEXITSTATUS(down.status) == 0)
      << DescribeWaitStatus(down.status) << down.err;
}

// With --checkpoint_dir the old primary's final save races its standby's
// takeover (it stops listening first, and the standby sees the refused
// dial): published before the takeover, it exits 0; otherwise its publish
// is refused (the file deleted), or a write it drained was refused by the
// promoted standby, and it steps down and exits 1. Both happen on this
// machine. Either way nothing acknowledged is lost, and the shard's
// published checkpoint ends as the new primary's.
TEST_F(ReplicationShutdownTest, APrimaryShutDownWithCheckpointsIsTakenOverByItsStandby) {
  checkpoints_ = true;
  ShutDown down;
  ShutDownPrimaryMidTraining(down);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(WIFEXITED(down.status)) << DescribeWaitStatus(down.status);
  std::printf("the old primary exited %d\n", WEXITSTATUS(down.status));
  if (WEXITSTATUS(down.status) == 0) {
    EXPECT_THAT(down.err, HasSubstr("saved checkpoint"));
  } else {
    EXPECT_EQ(WEXITSTATUS(down.status), 1);
    EXPECT_THAT(down.err, ::testing::ContainsRegex(
                              "stepping down: (publishing checkpoint [^\n]* was refused|a backup "
                              "of shard 0 refused a write)"));
    EXPECT_THAT(down.err, HasSubstr("stopped, but the final checkpoint failed"));
  }
  // The promoted standby's own final save (at its SIGTERM) is the last.
  EXPECT_EQ(PublishedCheckpoint(0).epoch(), down.epoch_after);
}

// The standby dies, and etcd is down: the primary cannot drop the standby
// from /shards/0, so it acknowledges nothing (pushes straight to it are
// refused; the trainer's next step waits) until etcd is back. Then it
// re-registers (its lease ran out meanwhile; the guard compares /shards/0
// with what it last wrote there, the attach included), drops the standby
// (epoch + 1) and acknowledges, and training ends exact.
TEST_F(ReplicationShutdownTest, APrimaryWhoseStandbyDiedAcknowledgesNothingUntilEtcdIsBack) {
  // "big<k>": parameters the trainer never pushes to; raw pushes go there.
  Started started = StartTraining(/*standby_of_shard0=*/true, /*big=*/8, /*big_floats=*/kWidth);
  ASSERT_TRUE(started.ok(true));
  auto& [primaries, trainer, standby] = started;
  const v1::ShardConfig attached = Config(0);
  const std::string primary = AddressAt(etcd_keys::ServerKey(0));
  std::string probe;
  for (const std::string& name : ParamsAt(primary)) {
    if (absl::StartsWith(name, "big")) probe = name;
  }
  ASSERT_FALSE(probe.empty()) << "no big<k> parameter on shard 0";
  std::atomic<int> steps_done{0};
  ASSERT_OK(Train(*trainer, 0, 6, &steps_done));
  ASSERT_TRUE(RawPush(primary, probe).ok());  // acknowledged while all is well

  KillNine(*standby);
  ASSERT_OK(etcd_->Kill());
  absl::Status training;
  std::thread trainer_thread([&] { training = Train(*trainer, 6, 12, &steps_done); });
  // Refused (UNAVAILABLE: the backup refuses connections and etcd cannot be
  // read, or the lease lapsed) or not answered within the push's 10 s while
  // another write waits on etcd; never OK.
  for (int i = 0; i < 3; ++i) {
    const grpc::Status refused = RawPush(primary, probe);
    EXPECT_FALSE(refused.ok()) << "a push was acknowledged with its standby dead and etcd down";
    EXPECT_TRUE(refused.error_code() == grpc::StatusCode::UNAVAILABLE ||
                refused.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
        << refused.error_code() << " " << refused.error_message();
  }
  EXPECT_EQ(steps_done.load(), 6) << "a step was acknowledged with its standby dead and etcd down";

  ASSERT_OK(etcd_->Restart());
  trainer_thread.join();
  ASSERT_OK(training);
  ExpectTrained(*trainer, 12);
  const v1::ShardConfig dropped = Config(0);
  EXPECT_EQ(dropped.holder(), attached.holder());
  EXPECT_EQ(dropped.replicas_size(), 0);
  EXPECT_EQ(dropped.epoch(), attached.epoch() + 1);
  trainer.reset();
  StopCleanly(primaries);
  EXPECT_THAT(primaries[0]->err(), HasSubstr("dropped backup"));
}

// The primary's writes sent to its backups over `transport` ("channel" or
// "grpc"), from its metrics page; -1 when missing.
double SentOver(const std::string& primary, const std::string& transport) {
  return MetricAt(primary,
                  absl::StrCat("pserver_replication_sent_total{transport=\"", transport, "\"}"));
}

// Trains 6 steps with a standby of shard 0, every process started with
// `flags`; then every write the primary numbered was sent over `used` and none
// over `unused`, and the standby holds the primary's state.
class ReplicationTransportTest : public ReplicationTest {
 protected:
  void ExpectWritesSentOver(std::vector<std::string> flags, const std::string& used,
                            const std::string& unused) {
    extra_flags_ = std::move(flags);
    extra_flags_.push_back("--metrics_port=0");
    Started started = StartTraining(/*standby_of_shard0=*/true);
    ASSERT_TRUE(started.ok(true));
    auto& [primaries, trainer, standby] = started;
    const std::string primary = AddressAt(etcd_keys::ServerKey(0));
    // The writes before the standby attached (numbered too with catch-up,
    // the default) reached it in its copy.
    const double copied_lsn = MetricAt(primary, "pserver_replication_last_lsn");
    std::atomic<int> steps_done{0};
    ASSERT_OK(Train(*trainer, 0, 6, &steps_done));
    const double last_lsn = MetricAt(primary, "pserver_replication_last_lsn");
    EXPECT_GT(last_lsn, copied_lsn);
    EXPECT_EQ(MetricAt(StandbyAddress(0), "pserver_backup_applied_lsn"), last_lsn);
    EXPECT_GE(SentOver(primary, used), last_lsn - copied_lsn);  // retries count too
    EXPECT_EQ(SentOver(primary, unused), 0);
    EXPECT_EQ(StateChecksum(primary), StateChecksum(StandbyAddress(0)));
    ExpectTrained(*trainer, 6);
    trainer.reset();
    StopCleanly(primaries);
  }
};

// Writes reach a standby over its bulk channel (a frame per write on one
// connection, cc/server/replica_channel.h), not over gRPC.
TEST_F(ReplicationTransportTest, WritesReachTheStandbyOverItsBulkChannel) {
  ExpectWritesSentOver({}, "channel", "grpc");
}

// With the bulk channel off (on every process, the standby's included) the
// primary falls back to gRPC Replicate, and nothing else changes.
TEST_F(ReplicationTransportTest, WritesReachAStandbyWithoutABulkChannelOverGrpc) {
  ExpectWritesSentOver({"--bulk_channel=off"}, "grpc", "channel");
}

}  // namespace
}  // namespace pserver
