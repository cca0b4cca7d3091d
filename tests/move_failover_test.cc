// Live moves that survive a kill -9 (issue 16 item 4, docs/elastic.md,
// "Moves with replication"): real etcd, three `pserver` primaries with
// --accept_standbys and a `--standby` process each, a trainer pushing
// deterministic steps while `psctl scale 2` (ScaleCluster) moves server 2's
// blocks or table rows to servers 0 and 1: SGD steps on dense parameters
// (integer gradients, learning rate 1: exact in float32), or the table
// workload of tests/table_workload.h (a sparse Adam table and a BSP KV
// table with two workers; a table batch is a run of key buckets). One primary is started with
// --testing_move_stall_after_batches=3: mid-move it stops (the old owner
// after its third batch reached the new owner and before it marked it
// handed over; the new owner before it takes its fourth batch) and says so
// on stdout; the test then kill -9s it. Its standby takes the shard over
// with the move's marks, the coordinator asks it (MoveBlocks on whoever
// holds /ps/<i> now), the sender sends to it, and the move completes. Every
// parameter then equals 0 minus every gradient acknowledged, to the bit
// (every table row equals a reference table fed the same pushes, every KV
// value every add, every worker clock the steps): nothing lost, nothing
// applied twice; each primary's state checksum equals its standby's. Every wait is bounded; every process
// is stopped by its PID.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/client/table.h"
#include "cc/core/placement.h"
#include "cc/core/status_macros.h"
#include "cc/core/tensor.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/placement_record.h"
#include "cc/etcd/shard_config.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/server/move_coordinator.h"
#include "cc/testing/child_process.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "pserver/v1/service.grpc.pb.h"
#include "tests/step_trainer.h"
#include "tests/table_workload.h"

namespace pserver {
namespace {

constexpr absl::Duration kWait = absl::Seconds(90);
constexpr char kCluster[] = "movefail";
constexpr int kParams = 8;
constexpr int kWidth = 4096;          // 16 KiB a parameter
constexpr uint64_t kBlockBytes = 1024;  // 16 blocks a parameter; one a batch

std::string Param(int p) { return absl::StrCat("w", p); }

// The integer gradient of parameter p at step s, element e (1..5).
float Gradient(int step, int p, int e) {
  return static_cast<float>((step * 7 + p * 3 + e) % 5 + 1);
}

// Every parameter at 0, SGD with learning rate 1.
absl::Status InitDense(Client& client) {
  v1::ParameterConfig sgd;
  sgd.mutable_optimizer()->mutable_sgd();
  sgd.mutable_learning_rate()->set_learning_rate(1.0);
  for (int p = 0; p < kParams; ++p) {
    PS_RETURN_IF_ERROR(client.InitParam(
        Param(p), Tensor::FromValues<float>({kWidth}, std::vector<float>(kWidth, 0)), sgd));
  }
  return client.FinishInitParams();
}

// Step `step`: Gradient(step, p, e) for every parameter.
absl::Status DenseStep(Client& client, int step) {
  std::vector<NamedTensor> grads;
  for (int p = 0; p < kParams; ++p) {
    std::vector<float> g(kWidth);
    for (int e = 0; e < kWidth; ++e) g[e] = Gradient(step, p, e);
    grads.push_back({Param(p), Tensor::FromValues<float>({kWidth}, g)});
  }
  return client.SendGrads(grads);
}

// Every parameter equals 0 minus the gradients of steps 0 .. steps-1, to the
// bit.
void ExpectDenseExact(Client& fresh, int steps) {
  for (int p = 0; p < kParams; ++p) {
    ASSERT_OK_AND_ASSIGN(Tensor w, fresh.GetParam(Param(p)));
    const std::vector<float> got = w.ToVector<float>();
    ASSERT_EQ(got.size(), static_cast<size_t>(kWidth));
    for (int e = 0; e < kWidth; ++e) {
      float expected = 0;
      for (int s = 0; s < steps; ++s) expected -= Gradient(s, p, e);
      ASSERT_EQ(got[e], expected) << Param(p) << "[" << e << "] after " << steps << " steps";
    }
  }
}

// Dense SGD steps from `first_step` on, one after another.
class Trainer : public StepTrainer {
 public:
  explicit Trainer(Client& client, int first_step = 0)
      : StepTrainer([&client](int step) { return DenseStep(client, step); }, first_step) {}
};

// What the trainer trains through the move, and what the model must be
// after `steps` steps.
class Workload {
 public:
  virtual ~Workload() = default;
  virtual absl::Status Init(Client& client) = 0;
  virtual absl::Status Step(int step) = 0;
  // `fresh` routes by the new count; `stalled` was killed mid-move.
  virtual void Expect(Client& fresh, int steps, const ScaleResult& result, uint32_t stalled) = 0;
  // Called while the servers still run, before the client goes.
  virtual void Stop() {}
};

// SGD on kParams dense parameters: step s pushes Gradient(s, p, e).
class DenseWorkload : public Workload {
 public:
  absl::Status Init(Client& client) override {
    client_ = &client;
    return InitDense(client);
  }
  absl::Status Step(int step) override { return DenseStep(*client_, step); }
  void Expect(Client& fresh, int steps, const ScaleResult& result, uint32_t stalled) override {
    ExpectDenseExact(fresh, steps);
    if (::testing::Test::HasFatalFailure()) return;
    // The blocks server 2 owned under 3 servers. Killed as the old owner, it
    // had marked its first two batches (one block each) handed over, on its
    // standby too: its successor sent the rest, the third (held) again.
    uint64_t leaving = 0;
    const Placement three = Placement::Jump(3, 0, kBlockBytes);
    for (int p = 0; p < kParams; ++p) {
      for (uint32_t b = 0; b < kWidth * 4 / kBlockBytes; ++b) {
        leaving += three.ServerOf(Param(p), b) == 2;
      }
    }
    EXPECT_EQ(result.blocks_moved, stalled == 2 ? leaving - 2 : leaving);
    std::printf("the last MoveBlocks moved %llu of %llu blocks\n",
                static_cast<unsigned long long>(result.blocks_moved),
                static_cast<unsigned long long>(leaving));
  }

 private:
  Client* client_ = nullptr;
};

// The table workload (tests/table_workload.h): no dense parameter, so every
// batch of the move is a run of table key buckets.
class TablesWorkload : public Workload {
 public:
  absl::Status Init(Client& client) override {
    PS_ASSIGN_OR_RETURN(Table emb, Table::Create(client, "emb", testing::EmbConfig()));
    PS_ASSIGN_OR_RETURN(Table kv, Table::Create(client, "kv", testing::KvConfig()));
    emb_ = std::make_unique<Table>(std::move(emb));
    kv_ = std::make_unique<Table>(std::move(kv));
    PS_ASSIGN_OR_RETURN(w0_, KvWorker::Join(*kv_, "w0"));
    PS_ASSIGN_OR_RETURN(w1_, KvWorker::Join(*kv_, "w1"));
    PS_ASSIGN_OR_RETURN(testing::ReferenceEmb reference, testing::ReferenceEmb::Create());
    reference_ = std::make_unique<testing::ReferenceEmb>(std::move(reference));
    return absl::OkStatus();
  }
  absl::Status Step(int step) override { return testing::TableStep(step, *emb_, *w0_, *w1_); }
  void Expect(Client& fresh, int steps, const ScaleResult& result, uint32_t stalled) override {
    ExpectValues(fresh, steps);
    if (::testing::Test::HasFatalFailure()) return;
    const std::vector<uint64_t> keys = testing::EmbKeys();
    // The rows server 2 owned under 3 servers, with their optimizer state.
    // Killed as the old owner, it had marked its first two runs of buckets
    // handed over, on its standby too: its successor sent the rest only.
    const Placement three = Placement::Jump(3, 0, kBlockBytes);
    uint64_t leaving = 0;
    for (uint64_t key : keys) {
      leaving += three.HashKeyServer(key) == 2 ? reference_->bytes() / testing::kEmbKeys : 0;
    }
    for (uint64_t key : testing::KvKeys()) {
      leaving += three.HashKeyServer(key) == 2 ? testing::kKvDim * sizeof(float) : 0;
    }
    if (stalled == 2) {
      EXPECT_GT(result.bytes_moved, 0u);
      EXPECT_LT(result.bytes_moved, leaving);
    } else {
      EXPECT_EQ(result.bytes_moved, leaving);
    }
    EXPECT_EQ(result.blocks_moved, 0u);
    std::printf("the last MoveBlocks moved %llu of %llu bytes of rows\n",
                static_cast<unsigned long long>(result.bytes_moved),
                static_cast<unsigned long long>(leaving));
  }
  // After `steps` steps: every row byte-equal to the reference's (read
  // through `fresh`), every KV value every add, both workers' clocks
  // `steps`.
  void ExpectValues(Client& fresh, int steps) {
    ASSERT_OK(reference_->AdvanceTo(steps));
    ASSERT_OK_AND_ASSIGN(Table emb, Table::Create(fresh, "emb", testing::EmbConfig()));
    const std::vector<uint64_t> keys = testing::EmbKeys();
    std::vector<float> pulled(keys.size() * testing::kEmbDim);
    ASSERT_OK(emb.Pull<float>(keys, absl::MakeSpan(pulled)));
    ASSERT_OK_AND_ASSIGN(const std::string expected, reference_->ValuesInKeyOrder());
    EXPECT_TRUE(std::string(reinterpret_cast<const char*>(pulled.data()), pulled.size() * 4) ==
                expected)
        << "the emb rows after " << steps << " steps";
    ASSERT_OK_AND_ASSIGN(Table kv, Table::Create(fresh, "kv", testing::KvConfig()));
    std::vector<float> values(testing::kKvKeys * testing::kKvDim);
    ASSERT_OK(kv.Pull<float>(testing::KvKeys(), absl::MakeSpan(values)));
    EXPECT_EQ(values, testing::KvAt(steps));
    EXPECT_EQ(w0_->clock(), steps);
    EXPECT_EQ(w1_->clock(), steps);
  }
  // The workers leave (each server checked their clocks before).
  void Stop() override {
    for (std::unique_ptr<KvWorker>* worker : {&w0_, &w1_}) {
      if (*worker != nullptr) (*worker)->Leave().IgnoreError();
      worker->reset();
    }
    emb_.reset();
    kv_.reset();
  }

 private:
  std::unique_ptr<Table> emb_, kv_;
  std::unique_ptr<KvWorker> w0_, w1_;
  std::unique_ptr<testing::ReferenceEmb> reference_;
};

// Dense SGD and the table workload in one step: every batch kind moves.
class MixedWorkload : public Workload {
 public:
  absl::Status Init(Client& client) override {
    PS_RETURN_IF_ERROR(dense_.Init(client));
    return tables_.Init(client);
  }
  absl::Status Step(int step) override {
    PS_RETURN_IF_ERROR(dense_.Step(step));
    return tables_.Step(step);
  }
  void Expect(Client& fresh, int steps, const ScaleResult&, uint32_t) override {
    ExpectValues(fresh, steps);
  }
  void ExpectValues(Client& fresh, int steps) {
    ExpectDenseExact(fresh, steps);
    if (::testing::Test::HasFatalFailure()) return;
    tables_.ExpectValues(fresh, steps);
  }
  void Stop() override { tables_.Stop(); }

 private:
  DenseWorkload dense_;
  TablesWorkload tables_;
};

class MoveFailoverTest : public ::testing::Test {
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
            "--lease_ttl=5",
            "--register_timeout=60",
            "--placement_redirects",
            absl::StrCat("--move_batch_bytes=", kBlockBytes)};
  }

  std::unique_ptr<ChildProcess> Spawn(const std::vector<std::string>& flags) {
    absl::StatusOr<std::unique_ptr<ChildProcess>> child =
        ChildProcess::Spawn(RunfilesPath("cc/server/pserver"), flags);
    EXPECT_OK(child);
    return child.ok() ? *std::move(child) : nullptr;
  }

  // A server process with Flags() and `extra`; with `index`, returned once
  // its server claimed that index (null if it did not).
  std::unique_ptr<ChildProcess> SpawnServer(const std::vector<std::string>& extra,
                                            std::optional<uint32_t> index) {
    std::vector<std::string> flags = Flags();
    flags.insert(flags.end(), extra.begin(), extra.end());
    std::unique_ptr<ChildProcess> child = Spawn(flags);
    if (child == nullptr || !index.has_value()) return child;
    absl::StatusOr<std::string> listening =
        WaitForPserverAddress(*child, *index, absl::Now() + kWait);
    EXPECT_OK(listening) << child->output();
    return listening.ok() ? std::move(child) : nullptr;
  }

  // Primary `index` of `count` (they claim indexes in start order).
  std::unique_ptr<ChildProcess> StartPrimary(uint32_t index, bool stall, uint32_t count = 3) {
    std::vector<std::string> extra = {absl::StrCat("--num_servers=", count),
                                      "--accept_standbys"};
    if (stall) extra.push_back("--testing_move_stall_after_batches=3");
    return SpawnServer(extra, index);
  }

  // A standby; returned once /shards/<shard> lists it (a standby attaches
  // to the shard with the fewest backups first).
  std::unique_ptr<ChildProcess> StartStandby(uint32_t shard) {
    std::vector<std::string> flags = Flags();
    flags.push_back("--standby");
    flags.push_back("--accept_standbys");
    std::unique_ptr<ChildProcess> child = Spawn(flags);
    if (child == nullptr) return nullptr;
    bool listed = false;
    for (int i = 0; i < 4500 && !listed; ++i) {
      listed = Config(shard).replicas_size() == 1;
      if (!listed) absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_TRUE(listed) << "no standby attached to shard " << shard << ": " << child->output();
    return child;
  }

  // Primaries 0 .. count-1 of `count` (`stalled` with
  // --testing_move_stall_after_batches=3), then a standby of each.
  void StartShards(uint32_t count, std::optional<uint32_t> stalled,
                   std::vector<std::unique_ptr<ChildProcess>>* primaries,
                   std::vector<std::unique_ptr<ChildProcess>>* standbys) {
    for (uint32_t i = 0; i < count; ++i) {
      primaries->push_back(StartPrimary(i, stalled == i, count));
      ASSERT_NE(primaries->back(), nullptr);
    }
    for (uint32_t i = 0; i < count; ++i) {
      standbys->push_back(StartStandby(i));
      ASSERT_NE(standbys->back(), nullptr);
    }
  }

  v1::ShardConfig Config(uint32_t shard) {
    absl::StatusOr<KeyValue> kv = etcd_client_->Get(etcd_keys::ShardKey(shard));
    if (!kv.ok()) return {};
    absl::StatusOr<v1::ShardConfig> config = ParseShardConfig(shard, kv->value);
    return config.ok() ? *config : v1::ShardConfig();
  }

  // The address in etcd key `key` (/ps/<i> or /standby/<i>/<instance>).
  std::string AddressAt(const std::string& key) {
    absl::StatusOr<KeyValue> kv = etcd_client_->Get(key);
    EXPECT_OK(kv) << key;
    if (!kv.ok()) return "";
    absl::StatusOr<etcd_keys::ServerEntry> entry = etcd_keys::ParseServerValue(kv->value);
    EXPECT_OK(entry);
    return entry.ok() ? entry->address : "";
  }

  // The state checksum the server at `address` reports (GetStats), if it
  // answers.
  static std::optional<uint32_t> ChecksumOf(const std::string& address) {
    std::unique_ptr<v1::ParameterServer::Stub> stub = v1::ParameterServer::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::GetStatsRequest request;
    request.set_state_checksum(true);
    v1::GetStatsResponse response;
    const grpc::Status status = stub->GetStats(&context, request, &response);
    if (!status.ok()) return std::nullopt;
    return response.stats().state_checksum();
  }
  static uint32_t StateChecksum(const std::string& address) {
    const std::optional<uint32_t> checksum = ChecksumOf(address);
    EXPECT_TRUE(checksum.has_value()) << address << " did not answer GetStats";
    return checksum.value_or(0);
  }

  std::unique_ptr<Client> Connect(absl::Duration attempt_timeout = absl::Seconds(5)) {
    ClientOptions options;
    options.etcd_endpoints = {etcd_->endpoint()};
    options.cluster = kCluster;
    options.timeout = kWait;
    options.discovery_timeout = kWait;
    options.initial_backoff = absl::Milliseconds(10);
    options.attempt_timeout = attempt_timeout;
    options.block_bytes = kBlockBytes;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    EXPECT_OK(client);
    return client.ok() ? *std::move(client) : nullptr;
  }

  // Both workers' clocks of table "kv" on the server at `address`
  // (TableStats): its slowest worker's clock, and how many are registered.
  static std::pair<int64_t, uint32_t> KvClocks(const std::string& address) {
    std::unique_ptr<v1::ParameterServer::Stub> stub = v1::ParameterServer::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::TableStatsResponse response;
    const grpc::Status status = stub->TableStats(&context, v1::TableStatsRequest(), &response);
    EXPECT_TRUE(status.ok()) << address << ": " << status.error_message();
    for (const v1::TableStats& table : response.tables()) {
      if (table.name() == "kv") return {table.min_clock(), table.workers()};
    }
    return {-1, 0};
  }

  // The rows of each table the server at `address` holds (TableStats; a
  // standby answers too), tables without rows left out; empty if it does
  // not answer.
  // `error`, when given, gets why it did not answer.
  static std::map<std::string, uint64_t> TableRows(const std::string& address,
                                                   std::string* error = nullptr) {
    std::unique_ptr<v1::ParameterServer::Stub> stub = v1::ParameterServer::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::TableStatsResponse response;
    std::map<std::string, uint64_t> rows;
    const grpc::Status status = stub->TableStats(&context, v1::TableStatsRequest(), &response);
    if (!status.ok()) {
      if (error != nullptr) {
        *error = absl::StrCat(address, ": ", status.error_code(), " ", status.error_message());
      }
      return rows;
    }
    for (const v1::TableStats& table : response.tables()) {
      if (table.rows() > 0) rows[table.name()] = table.rows();
    }
    return rows;
  }

  // Every parameter at 0, SGD with learning rate 1.
  static void InitParams(Client& client) { ASSERT_OK(InitDense(client)); }

  // A fresh client finds `count` servers and every parameter equal to 0
  // minus the gradients of steps 0 .. steps-1, to the bit.
  void ExpectExact(int steps, int count) {
    std::unique_ptr<Client> fresh = Connect();
    ASSERT_NE(fresh, nullptr);
    ASSERT_EQ(fresh->num_servers(), count);
    ExpectDenseExact(*fresh, steps);
  }

  ScaleOptions ScaleTo(uint32_t to) const {
    ScaleOptions scale;
    scale.etcd_endpoints = {etcd_->endpoint()};
    scale.cluster = kCluster;
    scale.to = to;
    scale.timeout = absl::Minutes(4);
    scale.progress = [](const std::string& line) { std::printf("scale: %s\n", line.c_str()); };
    return scale;
  }

  // Waits until `client` routes by placement `version` or newer.
  static void WaitRouted(Client& client, uint64_t version) {
    bool routed = false;
    for (int i = 0; i < 9000 && !routed; ++i) {
      routed = client.etcd_placement_version() >= version;
      if (!routed) absl::SleepFor(absl::Milliseconds(10));
    }
    ASSERT_TRUE(routed) << "the client does not route by placement version " << version;
  }

  // One live move at a time (docs/limits.md): a MoveBlocks for the move
  // under way, sent to the old owner at `address` while its move of it is
  // under way (stalled), is refused UNAVAILABLE at once, "retry".
  void ExpectASecondMoveIsRefused(const std::string& address) {
    ASSERT_OK_AND_ASSIGN(std::optional<v1::Placement> moving,
                         ReadPlacement(*etcd_client_, absl::Now() + kWait));
    ASSERT_TRUE(moving.has_value() && moving->moving()) << "no move under way in etcd";
    std::unique_ptr<v1::ParameterServer::Stub> stub = v1::ParameterServer::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    v1::MoveBlocksRequest request;
    request.set_version(moving->version());
    v1::MoveBlocksResponse response;
    const grpc::Status status = stub->MoveBlocks(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
    EXPECT_THAT(status.error_message(),
                ::testing::HasSubstr("handing blocks over already (an earlier MoveBlocks); retry"));
  }

  // 3 -> 2 servers while a trainer runs `workload`; primary `stalled` stops
  // mid-move and is killed; its standby takes over and the move completes
  // exactly.
  void ScaleDownKillingMidMove(Workload& workload, uint32_t stalled) {
    std::vector<std::unique_ptr<ChildProcess>> primaries, standbys;
    StartShards(3, stalled, &primaries, &standbys);
    ASSERT_FALSE(HasFatalFailure());
    std::unique_ptr<Client> client = Connect();
    ASSERT_NE(client, nullptr);
    // Before the client goes, and the processes (declared before it).
    absl::Cleanup stop_workload = [&workload] { workload.Stop(); };
    ASSERT_OK(workload.Init(*client));
    StepTrainer trainer([&workload](int step) { return workload.Step(step); });
    ASSERT_TRUE(trainer.Advance(3)) << trainer.Stop();

    const ScaleOptions scale = ScaleTo(2);
    std::future<absl::StatusOr<ScaleResult>> scaled =
        std::async(std::launch::async, [scale] { return ScaleCluster(scale); });

    // Every process's output, once it is stopped (a failure's report).
    auto outputs = [&] {
      std::string all;
      for (auto* group : {&primaries, &standbys}) {
        for (std::unique_ptr<ChildProcess>& child : *group) {
          kill(child->pid(), SIGKILL);
          child->WaitForExit(absl::Now() + kWait).IgnoreError();
          absl::StrAppend(&all, "---- pid ", child->pid(), "\n", child->output());
        }
      }
      return all;
    };
    // Mid-move: the stalled primary says so, then dies.
    const std::string stall_line = absl::StrCat("pserver ", stalled, ": testing: live move stalled");
    absl::Status stalled_said =
        primaries[stalled]->WaitForLine(stall_line, absl::Now() + kWait).status();
    ASSERT_OK(stalled_said) << outputs();
    if (stalled == 2) ExpectASecondMoveIsRefused(AddressAt(etcd_keys::ServerKey(stalled)));
    const std::string successor = Config(stalled).replicas(0);
    ASSERT_EQ(kill(primaries[stalled]->pid(), SIGKILL), 0) << std::strerror(errno);
    ASSERT_OK_AND_ASSIGN(int status, primaries[stalled]->WaitForExit(absl::Now() + kWait));
    EXPECT_TRUE(WIFSIGNALED(status)) << DescribeWaitStatus(status);
    bool took_over = false;
    for (int i = 0; i < 4500 && !took_over; ++i) {
      took_over = Config(stalled).holder() == successor;
      if (!took_over) absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_TRUE(took_over) << standbys[stalled]->output();

    absl::StatusOr<ScaleResult> scaled_result = scaled.get();
    ASSERT_OK(scaled_result) << outputs();
    const ScaleResult result = *scaled_result;
    EXPECT_TRUE(result.moved);
    EXPECT_EQ(result.from, 3u);
    EXPECT_EQ(result.to, 2u);
    // A few steps on the new placement, then the trainer stops.
    WaitRouted(*client, result.version);
    ASSERT_FALSE(HasFatalFailure());
    ASSERT_TRUE(trainer.Advance(2)) << trainer.Stop();
    ASSERT_OK(trainer.Stop());
    const int steps = trainer.steps();

    std::unique_ptr<Client> fresh = Connect();
    ASSERT_NE(fresh, nullptr);
    ASSERT_EQ(fresh->num_servers(), 2);
    workload.Expect(*fresh, steps, result, stalled);
    for (uint32_t shard = 0; shard < 2; ++shard) {
      const std::string primary = AddressAt(etcd_keys::ServerKey(shard));
      if (dynamic_cast<TablesWorkload*>(&workload) != nullptr) {
        EXPECT_EQ(KvClocks(primary), std::make_pair(int64_t{steps}, 2u)) << "server " << shard;
      }
      // A shard that took blocks or rows as replicated writes: its standby
      // holds its state (the shard whose standby took it over has none).
      const v1::ShardConfig config = Config(shard);
      if (config.replicas_size() == 0) continue;
      EXPECT_EQ(StateChecksum(primary),
                StateChecksum(AddressAt(etcd_keys::StandbyKey(shard, config.replicas(0)))))
          << "shard " << shard;
    }
    std::printf("%d steps, exact; the stalled server %u was killed mid-move\n", steps, stalled);
    // Every process left is stopped by its PID (ChildProcess's destructor).
  }

  std::unique_ptr<testing::EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> etcd_client_;
};

// The old owner (server 2, handing its blocks to 0 and 1) is killed after
// its third batch reached the new owner and before it marked it handed
// over: its standby holds the batch as held, sends it again, and the new
// owner keeps the copy it took.
TEST_F(MoveFailoverTest, AnOldOwnerKilledMidMoveIsTakenOverAndTheMoveCompletesExactly) {
  DenseWorkload dense;
  ScaleDownKillingMidMove(dense, /*stalled=*/2);
}

// A new owner (server 0) is killed before it takes its fourth batch: its
// standby holds the three it took (replicated before they were
// acknowledged) and takes the rest from the sender, which follows /ps/0.
TEST_F(MoveFailoverTest, ANewOwnerKilledMidMoveIsTakenOverAndTheMoveCompletesExactly) {
  DenseWorkload dense;
  ScaleDownKillingMidMove(dense, /*stalled=*/0);
}

// Table rows: the old owner (server 2) is killed after its third run of key
// buckets reached servers 0 and 1 and before it marked the run handed over:
// its standby holds the run (and the first two as handed over), sends it
// again, and the new owners keep the rows they took (they may have taken
// pushes since).
TEST_F(MoveFailoverTest, TableRowsOfAnOldOwnerKilledMidMoveMoveExactly) {
  TablesWorkload tables;
  ScaleDownKillingMidMove(tables, /*stalled=*/2);
}

// Table rows: a new owner (server 0) is killed mid-move (before it takes
// its fourth run, or after its own third run of buckets reached server 1):
// its standby holds the rows it took (replicated before they were
// acknowledged) and the buckets it received, and the move completes.
TEST_F(MoveFailoverTest, TableRowsOfANewOwnerKilledMidMoveMoveExactly) {
  TablesWorkload tables;
  ScaleDownKillingMidMove(tables, /*stalled=*/0);
}

// Issue 16: a shard with a standby drops the table rows it handed over on
// the standby too (the DROPPED marks name the buckets and the stable
// placement). 2 -> 3 servers under the table workload: afterwards each old
// shard's primary and standby hold exactly its share of the rows under 3
// servers (TableStats, to the row) and equal state checksums; then the
// primary of shard 0 is killed (kill -9): its standby takes over and
// training goes on exact.
TEST_F(MoveFailoverTest, AStandbyDropsTheTableRowsItsPrimaryHandedOverAndTakesOverExactly) {
  std::vector<std::unique_ptr<ChildProcess>> primaries, standbys;
  StartShards(2, /*stalled=*/std::nullopt, &primaries, &standbys);
  ASSERT_FALSE(HasFatalFailure());
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  TablesWorkload workload;
  absl::Cleanup stop_workload = [&workload] { workload.Stop(); };
  ASSERT_OK(workload.Init(*client));
  auto trainer =
      std::make_unique<StepTrainer>([&workload](int step) { return workload.Step(step); });
  ASSERT_TRUE(trainer->Advance(3)) << trainer->Stop();
  auto outputs = [&] {
    std::string all;
    for (auto* group : {&primaries, &standbys}) {
      for (std::unique_ptr<ChildProcess>& child : *group) {
        child->WaitForLine("\x01", absl::Now() + absl::Milliseconds(1)).IgnoreError();
        absl::StrAppend(&all, "---- pid ", child->pid(), "\n", child->output());
      }
    }
    return all;
  };

  // A third server joins the move as server 2.
  primaries.push_back(SpawnServer({}, std::nullopt));
  ASSERT_NE(primaries.back(), nullptr);
  absl::StatusOr<ScaleResult> grown = ScaleCluster(ScaleTo(3));
  ASSERT_OK(grown) << outputs();
  EXPECT_TRUE(grown->moved);
  ASSERT_OK(WaitForPserverAddress(*primaries[2], 2, absl::Now() + kWait).status());
  WaitRouted(*client, grown->version);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(trainer->Advance(2)) << trainer->Stop();
  ASSERT_OK(trainer->Stop());
  const int steps = trainer->steps();

  // Each old shard's share under 3 servers (every step writes every key).
  const Placement three = Placement::Jump(3, 0, kBlockBytes);
  std::map<std::string, uint64_t> share[2];
  for (uint64_t key : testing::EmbKeys()) {
    const int owner = three.HashKeyServer(key);
    if (owner < 2) ++share[owner]["emb"];
  }
  for (uint64_t key : testing::KvKeys()) {
    const int owner = three.HashKeyServer(key);
    if (owner < 2) ++share[owner]["kv"];
  }
  std::string successor;
  for (uint32_t shard = 0; shard < 2; ++shard) {
    const v1::ShardConfig config = Config(shard);
    ASSERT_EQ(config.replicas_size(), 1) << "shard " << shard << "\n" << outputs();
    if (shard == 0) successor = config.replicas(0);
    const std::string primary = AddressAt(etcd_keys::ServerKey(shard));
    const std::string standby = AddressAt(etcd_keys::StandbyKey(shard, config.replicas(0)));
    // Bounded wait: each replica drops once the DROPPED marks reach it.
    std::map<std::string, uint64_t> on_primary, on_standby;
    for (int i = 0; i < 3000; ++i) {
      on_primary = TableRows(primary);
      on_standby = TableRows(standby);
      if (on_primary == share[shard] && on_standby == share[shard]) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_EQ(on_primary, share[shard]) << "shard " << shard << "'s primary";
    EXPECT_EQ(on_standby, share[shard]) << "shard " << shard << "'s standby";
    EXPECT_EQ(StateChecksum(primary), StateChecksum(standby)) << "shard " << shard;
    std::printf("shard %u: the standby holds %llu emb and %llu kv rows, its share %llu and %llu\n",
                shard, static_cast<unsigned long long>(on_standby["emb"]),
                static_cast<unsigned long long>(on_standby["kv"]),
                static_cast<unsigned long long>(share[shard]["emb"]),
                static_cast<unsigned long long>(share[shard]["kv"]));
  }
  ASSERT_FALSE(HasFatalFailure()) << outputs();

  // kill -9 of shard 0's primary: its standby takes over with its share.
  ASSERT_EQ(kill(primaries[0]->pid(), SIGKILL), 0) << std::strerror(errno);
  ASSERT_OK_AND_ASSIGN(int status, primaries[0]->WaitForExit(absl::Now() + kWait));
  EXPECT_TRUE(WIFSIGNALED(status)) << DescribeWaitStatus(status);
  bool took_over = false;
  for (int i = 0; i < 4500 && !took_over; ++i) {
    took_over = Config(0).holder() == successor;
    if (!took_over) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(took_over) << outputs();
  EXPECT_EQ(TableRows(AddressAt(etcd_keys::ServerKey(0))), share[0]);
  StepTrainer after([&workload](int step) { return workload.Step(step); }, steps);
  ASSERT_TRUE(after.Advance(3)) << after.Stop();
  ASSERT_OK(after.Stop());
  std::unique_ptr<Client> fresh = Connect();
  ASSERT_NE(fresh, nullptr);
  ASSERT_EQ(fresh->num_servers(), 3);
  workload.ExpectValues(*fresh, after.steps());
  for (uint32_t shard = 0; shard < 3; ++shard) {
    EXPECT_EQ(KvClocks(AddressAt(etcd_keys::ServerKey(shard))),
              std::make_pair(int64_t{after.steps()}, 2u))
        << "server " << shard;
  }
  std::printf("%d steps, exact; shard 0's primary killed after the move, its standby took over\n",
              after.steps());
}

// ---- Live moves with --replicas (docs/elastic.md, "Moves with --replicas") ----
//
// Every process runs its own server and one standby slot (--replicas=2)
// backing up another process's shard. The shard count changes under the
// trainer: slots back up the new shard, leave a departed one (it is not
// taken over), and move to shards that lack a backup.
class ReplicasMoveTest : public MoveFailoverTest {
 protected:
  using Processes = std::vector<std::unique_ptr<ChildProcess>>;
  static constexpr absl::Duration kAttempt = absl::Seconds(30);

  // A process with --replicas=replicas_ (and, for R > 2, --max_standbys=R:
  // a slot of a new process backs up an old shard as its R-th backup until
  // one of that shard's backups moves on to the new shard); with `index`,
  // returned once its own server claimed that index.
  std::unique_ptr<ChildProcess> StartProcess(std::optional<uint32_t> index,
                                             const std::vector<std::string>& extra) {
    std::vector<std::string> flags = {absl::StrCat("--replicas=", replicas_),
                                      "--depart_linger_seconds=1"};
    if (replicas_ > 2) flags.push_back(absl::StrCat("--max_standbys=", replicas_));
    flags.insert(flags.end(), extra.begin(), extra.end());
    return SpawnServer(flags, index);
  }

  // One more process (it claims index `to` - 1 once the move begins) and
  // the move to `to` servers: its result, once `client` routes by it.
  void GrowTo(uint32_t to, Processes& processes, Client& client, ScaleResult* result) {
    processes.push_back(StartProcess(std::nullopt, {}));
    ASSERT_NE(processes.back(), nullptr);
    absl::StatusOr<ScaleResult> grown = ScaleCluster(ScaleTo(to));
    ASSERT_OK(grown) << Drain(processes);
    EXPECT_TRUE(grown->moved);
    ASSERT_OK(WaitForPserverAddress(*processes.back(), to - 1, absl::Now() + kWait).status());
    WaitRouted(client, grown->version);
    *result = *grown;
  }

  // Reads what the processes printed so far (a pipe left full would stop a
  // process that logs); returns it all.
  static std::string Drain(Processes& processes) {
    std::string all;
    for (std::unique_ptr<ChildProcess>& child : processes) {
      child->WaitForLine("\x01", absl::Now() + absl::Milliseconds(1)).IgnoreError();
      absl::StrAppend(&all, "---- pid ", child->pid(), "\n", child->output());
    }
    return all;
  }

  // The address in etcd key `key` (/ps/<i>, /standby/<i>/<instance>), if it
  // exists.
  std::optional<std::string> LiveAddress(const std::string& key) {
    absl::StatusOr<KeyValue> kv = etcd_client_->Get(key);
    if (!kv.ok()) return std::nullopt;
    absl::StatusOr<etcd_keys::ServerEntry> entry = etcd_keys::ParseServerValue(kv->value);
    if (!entry.ok()) return std::nullopt;
    return entry->address;
  }

  // Three processes with --replicas=2 (`stalled` started with
  // --testing_move_stall_after_batches=3), every shard backed up, every
  // parameter initialized: the client, or null after a failure.
  std::unique_ptr<Client> StartThreeAndInit(Processes& processes,
                                            std::optional<uint32_t> stalled) {
    for (uint32_t i = 0; i < 3; ++i) {
      std::vector<std::string> extra = {"--num_servers=3"};
      if (stalled == i) extra.push_back("--testing_move_stall_after_batches=3");
      processes.push_back(StartProcess(i, extra));
      if (processes.back() == nullptr) return nullptr;
    }
    ExpectEveryShardBackedUp(3, processes);
    if (HasFatalFailure()) return nullptr;
    // An InitParam sent again would find itself applied (ALREADY_EXISTS):
    // its attempt must not time out on a loaded machine.
    std::unique_ptr<Client> client = Connect(kAttempt);
    if (client == nullptr) return nullptr;
    InitParams(*client);
    if (HasFatalFailure()) {
      ADD_FAILURE() << Drain(processes);
      return nullptr;
    }
    return client;
  }

  // kill -9 of process `shard` (which serves shard `shard`, listed with at
  // least `backups` backups), then waits until one of them holds the shard
  // (a slot that left the shard stays listed until the primary's next write
  // drops it; it is gone and takes nothing over).
  void KillAndAwaitTakeover(uint32_t shard, Processes& processes, int backups) {
    const v1::ShardConfig before = Config(shard);
    ASSERT_GE(before.replicas_size(), backups) << Drain(processes);
    ASSERT_EQ(kill(processes[shard]->pid(), SIGKILL), 0) << std::strerror(errno);
    ASSERT_OK_AND_ASSIGN(int status, processes[shard]->WaitForExit(absl::Now() + kWait));
    EXPECT_TRUE(WIFSIGNALED(status)) << DescribeWaitStatus(status);
    bool took_over = false;
    for (int i = 0; i < 4500 && !took_over; ++i) {
      Drain(processes);
      const std::string holder = Config(shard).holder();
      took_over = std::find(before.replicas().begin(), before.replicas().end(), holder) !=
                  before.replicas().end();
      if (!took_over) absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_TRUE(took_over) << Drain(processes);
  }

  // Processes 0 .. count-1 of `count`, every shard backed up, then a
  // client (null after a failure) with `workload` initialized through it.
  std::unique_ptr<Client> StartAndInit(uint32_t count, Processes& processes,
                                       Workload& workload) {
    for (uint32_t i = 0; i < count; ++i) {
      processes.push_back(StartProcess(i, {absl::StrCat("--num_servers=", count)}));
      if (processes.back() == nullptr) return nullptr;
    }
    ExpectEveryShardBackedUp(count, processes);
    if (HasFatalFailure()) return nullptr;
    std::unique_ptr<Client> client = Connect(kAttempt);
    if (client == nullptr) return nullptr;
    if (absl::Status init = workload.Init(*client); !init.ok()) {
      ADD_FAILURE() << init << Drain(processes);
      return nullptr;
    }
    return client;
  }

  // With no write under way: waits until every shard 0..count-1 has
  // replicas_ - 1 live backups (holding /standby/<i>/<instance>), each
  // listed in /shards/<i>, and no other (the slots settled: none leaves a
  // shard afterwards), whose state checksums equal their primary's.
  void ExpectEveryShardBackedUp(uint32_t count, Processes& processes) {
    const size_t wanted = static_cast<size_t>(replicas_ - 1);
    for (uint32_t shard = 0; shard < count; ++shard) {
      bool equal = false;
      std::string seen = "nothing";
      for (int i = 0; i < 3000 && !equal; ++i) {
        Drain(processes);
        const std::optional<std::string> primary = LiveAddress(etcd_keys::ServerKey(shard));
        const v1::ShardConfig config = Config(shard);
        absl::StatusOr<std::vector<KeyValue>> live =
            etcd_client_->GetPrefix(etcd_keys::StandbyPrefix(shard));
        if (primary.has_value() && live.ok() && live->size() == wanted) {
          const std::optional<uint32_t> a = ChecksumOf(*primary);
          equal = a.has_value();
          seen = absl::StrCat("primary ", *primary, " ", a.value_or(0));
          for (const KeyValue& kv : *live) {
            absl::StatusOr<etcd_keys::ServerEntry> backup = etcd_keys::ParseServerValue(kv.value);
            const bool listed =
                backup.ok() && std::find(config.replicas().begin(), config.replicas().end(),
                                         backup->instance_id) != config.replicas().end();
            const std::optional<uint32_t> b =
                listed ? ChecksumOf(backup->address) : std::nullopt;
            equal = equal && b.has_value() && *b == *a;
            absl::StrAppend(&seen, ", backup ", backup.ok() ? backup->address : "?",
                            listed ? " " : " (not listed) ", b.value_or(0));
          }
        } else {
          seen = absl::StrCat(live.ok() ? live->size() : 0, " live backups, ",
                              config.replicas_size(), " listed, primary ",
                              primary.value_or("(none)"));
        }
        if (!equal) absl::SleepFor(absl::Milliseconds(30));
      }
      ASSERT_TRUE(equal) << "shard " << shard << " has not " << wanted
                         << " live listed backups with its primary's checksum (last seen: "
                         << seen << ")\n"
                         << Drain(processes);
      std::printf("shard %u: %s\n", shard, seen.c_str());
    }
  }

  // What a shard holds: dense blocks (GetStats) and rows per table
  // (TableStats, tables without rows left out).
  struct Held {
    uint64_t blocks = 0;
    std::map<std::string, uint64_t> rows;
    bool operator==(const Held& other) const {
      return blocks == other.blocks && rows == other.rows;
    }
  };
  static std::string Describe(const Held& held) {
    std::string out = absl::StrCat(held.blocks, " blocks");
    for (const auto& [table, rows] : held.rows) absl::StrAppend(&out, ", ", rows, " ", table);
    return out;
  }
  // Each shard's share under `count` servers of the MixedWorkload's model.
  static std::vector<Held> SharesUnder(uint32_t count) {
    const Placement placement = Placement::Jump(count, 0, kBlockBytes);
    std::vector<Held> shares(count);
    for (int p = 0; p < kParams; ++p) {
      for (uint32_t b = 0; b < kWidth * 4 / kBlockBytes; ++b) {
        ++shares[placement.ServerOf(Param(p), b)].blocks;
      }
    }
    for (uint64_t key : testing::EmbKeys()) ++shares[placement.HashKeyServer(key)].rows["emb"];
    for (uint64_t key : testing::KvKeys()) ++shares[placement.HashKeyServer(key)].rows["kv"];
    return shares;
  }
  // What the server at `address` holds (a standby answers too); nullopt
  // (with `error` set) if it does not answer.
  static std::optional<Held> HeldBy(const std::string& address, std::string* error) {
    std::unique_ptr<v1::ParameterServer::Stub> stub = v1::ParameterServer::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::GetStatsResponse response;
    const grpc::Status status = stub->GetStats(&context, v1::GetStatsRequest(), &response);
    if (!status.ok()) {
      *error = absl::StrCat(address, ": ", status.error_message());
      return std::nullopt;
    }
    Held held;
    held.blocks = response.stats().parameters();
    held.rows = TableRows(address, error);
    return held;
  }
  // Waits until the primary of every shard 0..count-1 and each of its live
  // backups hold exactly the shard's share under `count` servers (each
  // replica drops what it handed over once the DROPPED marks reach it).
  void ExpectEveryReplicaHoldsItsShare(uint32_t count, Processes& processes) {
    const std::vector<Held> shares = SharesUnder(count);
    for (uint32_t shard = 0; shard < count; ++shard) {
      bool exact = false;
      std::string seen;
      for (int i = 0; i < 3000 && !exact; ++i) {
        Drain(processes);
        std::vector<std::string> addresses;
        if (std::optional<std::string> primary = LiveAddress(etcd_keys::ServerKey(shard))) {
          addresses.push_back(*primary);
        }
        absl::StatusOr<std::vector<KeyValue>> live =
            etcd_client_->GetPrefix(etcd_keys::StandbyPrefix(shard));
        for (const KeyValue& kv : live.ok() ? *live : std::vector<KeyValue>()) {
          absl::StatusOr<etcd_keys::ServerEntry> backup = etcd_keys::ParseServerValue(kv.value);
          if (backup.ok()) addresses.push_back(backup->address);
        }
        exact = addresses.size() == static_cast<size_t>(replicas_);
        seen = absl::StrCat(addresses.size(), " replicas");
        for (const std::string& address : addresses) {
          std::string error;
          const std::optional<Held> held = HeldBy(address, &error);
          exact = exact && held.has_value() && *held == shares[shard];
          absl::StrAppend(&seen, "; ", address, ": ", held ? Describe(*held) : error);
        }
        if (!exact) absl::SleepFor(absl::Milliseconds(30));
      }
      EXPECT_TRUE(exact) << "shard " << shard << "'s share is " << Describe(shares[shard])
                         << "; seen " << seen;
      std::printf("shard %u, share %s: %s\n", shard, Describe(shares[shard]).c_str(),
                  seen.c_str());
    }
  }

  int replicas_ = 2;  // --replicas of every process
};

// 3 -> 4 -> 3 processes with --replicas=2 under a trainer: the fourth
// process takes index 3 and the slots end up backing up all four shards;
// shrinking, the fourth process departs, the slot that backed up shard 3
// leaves it (nothing takes it over, /shards/3 lists no backup) and backs
// up another shard. Values exact, checksums equal after each move.
TEST_F(ReplicasMoveTest, GrowsAndShrinksWithABackupOfEveryShardAfterEachMove) {
  Processes processes;
  std::unique_ptr<Client> client = StartThreeAndInit(processes, std::nullopt);
  ASSERT_NE(client, nullptr);
  auto trainer = std::make_unique<Trainer>(*client);
  ASSERT_TRUE(trainer->Advance(3)) << trainer->Stop();

  // 3 -> 4: a fourth process claims index 3 once the move begins.
  ScaleResult grown;
  GrowTo(4, processes, *client, &grown);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(trainer->Advance(2)) << trainer->Stop();
  ASSERT_OK(trainer->Stop());
  int steps = trainer->steps();
  ExpectExact(steps, 4);
  ASSERT_FALSE(HasFatalFailure());
  ExpectEveryShardBackedUp(4, processes);
  ASSERT_FALSE(HasFatalFailure());

  // 4 -> 3: the fourth process departs by itself.
  trainer = std::make_unique<Trainer>(*client, steps);
  ASSERT_TRUE(trainer->Advance(2)) << trainer->Stop();
  absl::StatusOr<ScaleResult> shrunk = ScaleCluster(ScaleTo(3));
  ASSERT_OK(shrunk) << Drain(processes);
  EXPECT_TRUE(shrunk->moved);
  ASSERT_OK_AND_ASSIGN(int status, processes[3]->WaitForExit(absl::Now() + kWait));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << DescribeWaitStatus(status) << processes[3]->output();
  WaitRouted(*client, shrunk->version);
  ASSERT_FALSE(HasFatalFailure());
  // Writes after the departure: the primaries drop backups that lived in
  // the fourth process.
  ASSERT_TRUE(trainer->Advance(2)) << trainer->Stop();
  ASSERT_OK(trainer->Stop());
  steps = trainer->steps();
  ExpectExact(steps, 3);
  ASSERT_FALSE(HasFatalFailure());
  ExpectEveryShardBackedUp(3, processes);
  ASSERT_FALSE(HasFatalFailure());

  // Shard 3's backup left it and did not take it over.
  bool left = false;
  for (int i = 0; i < 3000 && !left; ++i) {
    const std::string said = Drain(processes);
    absl::StatusOr<std::vector<KeyValue>> standbys =
        etcd_client_->GetPrefix(etcd_keys::StandbyPrefix(3));
    left = said.find("standby slot: leaving shard 3: placement version") != std::string::npos &&
           standbys.ok() && standbys->empty() && Config(3).replicas_size() == 0;
    if (!left) absl::SleepFor(absl::Milliseconds(30));
  }
  EXPECT_TRUE(left) << Drain(processes);
  EXPECT_TRUE(absl::IsNotFound(etcd_client_->Get(etcd_keys::ServerKey(3)).status()));
  std::printf("%d steps, exact through 3 -> 4 -> 3 with --replicas=2\n", steps);
}

// 3 -> 2 processes with --replicas=2; the departing process is killed
// (kill -9) after its third batch reached the new owner: the slot backing
// up its shard (in another process) takes it over, finishes the move, then
// departs and is replaced by a fresh standby in the same process. Values
// exact; both shards left end backed up.
TEST_F(ReplicasMoveTest, AProcessKilledMidMoveLosesNothing) {
  Processes processes;
  std::unique_ptr<Client> client = StartThreeAndInit(processes, /*stalled=*/2);
  ASSERT_NE(client, nullptr);
  auto first = std::make_unique<Trainer>(*client);
  ASSERT_TRUE(first->Advance(3)) << first->Stop();
  ASSERT_OK(first->Stop());
  // Every shard backed up, equal, before the move (the kill must find a
  // backup of shard 2).
  ExpectEveryShardBackedUp(3, processes);
  ASSERT_FALSE(HasFatalFailure());
  Trainer trainer(*client, first->steps());
  ASSERT_TRUE(trainer.Advance(2)) << trainer.Stop();

  const ScaleOptions scale = ScaleTo(2);
  std::future<absl::StatusOr<ScaleResult>> scaled =
      std::async(std::launch::async, [scale] { return ScaleCluster(scale); });
  ASSERT_OK(processes[2]
                ->WaitForLine("pserver 2: testing: live move stalled", absl::Now() + kWait)
                .status())
      << Drain(processes);
  KillAndAwaitTakeover(2, processes, /*backups=*/1);
  ASSERT_FALSE(HasFatalFailure());

  absl::StatusOr<ScaleResult> result = scaled.get();
  ASSERT_OK(result) << Drain(processes);
  EXPECT_TRUE(result->moved);
  EXPECT_EQ(result->from, 3u);
  EXPECT_EQ(result->to, 2u);
  WaitRouted(*client, result->version);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(trainer.Advance(2)) << trainer.Stop();
  ASSERT_OK(trainer.Stop());
  const int steps = trainer.steps();
  ExpectExact(steps, 2);
  ASSERT_FALSE(HasFatalFailure());
  ExpectEveryShardBackedUp(2, processes);
  ASSERT_FALSE(HasFatalFailure());
  // The slot that took shard 2 over departed with it and was replaced; its
  // process goes on.
  bool replaced = false;
  std::string said;
  for (int i = 0; i < 3000 && !replaced; ++i) {
    said = Drain(processes);
    replaced = said.find("departed in a live move (after") != std::string::npos;
    if (!replaced) absl::SleepFor(absl::Milliseconds(30));
  }
  EXPECT_TRUE(replaced) << said;
  EXPECT_EQ(said.find("stopping (--depart_linger_seconds)"), std::string::npos) << said;
  std::printf("%d steps, exact; process 2 killed mid-move, its shard's backup took over, finished "
              "the move and departed\n",
              steps);
}

// Issue 16: table rows with --replicas=2 under a move. Two processes
// (each backing up the other's shard) grow to three under the table
// workload (a sparse Adam table and a BSP KV table): the rows read back
// byte-equal to a reference fed the same pushes (Adam's moments moved
// exactly, or the steps after the move would differ), KV values and both
// workers' clocks exact, every shard backed up with its primary's checksum,
// and each shard's primary and backup hold exactly its share of the rows.
TEST_F(ReplicasMoveTest, TableRowsMoveTwoToThreeWithABackupOfEveryShard) {
  Processes processes;
  std::unique_ptr<Client> client;  // outlives the workload's Stop
  TablesWorkload workload;
  absl::Cleanup stop_workload = [&workload] { workload.Stop(); };
  client = StartAndInit(2, processes, workload);
  ASSERT_NE(client, nullptr);
  auto trainer =
      std::make_unique<StepTrainer>([&workload](int step) { return workload.Step(step); });
  ASSERT_TRUE(trainer->Advance(3)) << trainer->Stop();

  // A third process claims index 2 once the move begins.
  ScaleResult grown;
  GrowTo(3, processes, *client, &grown);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_GT(grown.bytes_moved, 0u);
  ASSERT_TRUE(trainer->Advance(2)) << trainer->Stop();
  ASSERT_OK(trainer->Stop());
  const int steps = trainer->steps();
  std::unique_ptr<Client> fresh = Connect(kAttempt);
  ASSERT_NE(fresh, nullptr);
  ASSERT_EQ(fresh->num_servers(), 3);
  workload.ExpectValues(*fresh, steps);
  ASSERT_FALSE(HasFatalFailure()) << Drain(processes);
  ExpectEveryShardBackedUp(3, processes);
  ASSERT_FALSE(HasFatalFailure());

  const Placement three = Placement::Jump(3, 0, kBlockBytes);
  std::map<std::string, uint64_t> share[3];
  for (uint64_t key : testing::EmbKeys()) ++share[three.HashKeyServer(key)]["emb"];
  for (uint64_t key : testing::KvKeys()) ++share[three.HashKeyServer(key)]["kv"];
  for (uint32_t shard = 0; shard < 3; ++shard) {
    std::map<std::string, uint64_t> on_primary, on_backup;
    std::string seen;
    for (int i = 0; i < 3000; ++i) {
      Drain(processes);
      const v1::ShardConfig config = Config(shard);
      const std::optional<std::string> primary = LiveAddress(etcd_keys::ServerKey(shard));
      // The live one (a slot that left stays listed until the primary's
      // next write drops it).
      std::optional<std::string> backup;
      for (const std::string& replica : config.replicas()) {
        if (!backup.has_value()) backup = LiveAddress(etcd_keys::StandbyKey(shard, replica));
      }
      seen = absl::StrCat("replicas ", config.replicas_size(), ", backup ",
                          backup.value_or("(none)"));
      on_primary = primary.has_value() ? TableRows(*primary, &seen) : on_primary;
      on_backup = backup.has_value() ? TableRows(*backup, &seen) : on_backup;
      if (on_primary == share[shard] && on_backup == share[shard]) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_EQ(on_primary, share[shard]) << "shard " << shard << "'s primary; " << seen;
    EXPECT_EQ(on_backup, share[shard]) << "shard " << shard << "'s backup; " << seen;
    std::printf("shard %u: primary %llu/%llu, backup %llu/%llu emb/kv rows (its share %llu/%llu)\n",
                shard, static_cast<unsigned long long>(on_primary["emb"]),
                static_cast<unsigned long long>(on_primary["kv"]),
                static_cast<unsigned long long>(on_backup["emb"]),
                static_cast<unsigned long long>(on_backup["kv"]),
                static_cast<unsigned long long>(share[shard]["emb"]),
                static_cast<unsigned long long>(share[shard]["kv"]));
  }
  std::printf("%d steps, exact through 2 -> 3 with --replicas=2 and tables\n", steps);
}

// R=3 (--replicas=3): 3 -> 4 processes under dense SGD and the table
// workload together. Every process runs its own server and two standby
// slots; the fourth's slots back up old shards as a third backup
// (--max_standbys=3) until a backup of each moves on to the new shard.
// After the move every shard has two live backups listed, all three
// replicas hold exactly the shard's share under 4 servers (dense blocks,
// emb and kv rows) with equal state checksums, and the values are exact.
// Then process 0 (shard 0's primary, and a backup of two other shards) is
// killed (kill -9) right after the move: a backup of shard 0 takes it over
// holding exactly its share, and training goes on exact.
TEST_F(ReplicasMoveTest, ThreeReplicasGrowThreeToFourAndSurviveAPrimaryKilledAfter) {
  replicas_ = 3;
  Processes processes;
  std::unique_ptr<Client> client;  // outlives the workload's Stop
  MixedWorkload workload;
  absl::Cleanup stop_workload = [&workload] { workload.Stop(); };
  client = StartAndInit(3, processes, workload);
  ASSERT_NE(client, nullptr);
  auto trainer =
      std::make_unique<StepTrainer>([&workload](int step) { return workload.Step(step); });
  ASSERT_TRUE(trainer->Advance(3)) << trainer->Stop() << Drain(processes);

  ScaleResult grown;
  GrowTo(4, processes, *client, &grown);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_GT(grown.blocks_moved, 0u);
  EXPECT_GT(grown.bytes_moved, 0u);
  ASSERT_TRUE(trainer->Advance(2)) << trainer->Stop() << Drain(processes);
  ASSERT_OK(trainer->Stop());
  int steps = trainer->steps();
  std::unique_ptr<Client> fresh = Connect(kAttempt);
  ASSERT_NE(fresh, nullptr);
  ASSERT_EQ(fresh->num_servers(), 4);
  workload.ExpectValues(*fresh, steps);
  ASSERT_FALSE(HasFatalFailure()) << Drain(processes);
  ExpectEveryShardBackedUp(4, processes);
  ASSERT_FALSE(HasFatalFailure());
  ExpectEveryReplicaHoldsItsShare(4, processes);
  ASSERT_FALSE(HasFatalFailure());

  // kill -9 of process 0: one of shard 0's two live backups takes it over.
  KillAndAwaitTakeover(0, processes, /*backups=*/2);
  ASSERT_FALSE(HasFatalFailure());
  StepTrainer after([&workload](int step) { return workload.Step(step); }, steps);
  ASSERT_TRUE(after.Advance(3)) << after.Stop() << Drain(processes);
  ASSERT_OK(after.Stop());
  steps = after.steps();
  fresh = Connect(kAttempt);
  ASSERT_NE(fresh, nullptr);
  ASSERT_EQ(fresh->num_servers(), 4);
  workload.ExpectValues(*fresh, steps);
  ASSERT_FALSE(HasFatalFailure()) << Drain(processes);
  std::string error;
  const std::optional<Held> held = HeldBy(AddressAt(etcd_keys::ServerKey(0)), &error);
  ASSERT_TRUE(held.has_value()) << error;
  EXPECT_EQ(Describe(*held), Describe(SharesUnder(4)[0])) << "shard 0's new primary";
  std::printf("%d steps, exact through 3 -> 4 with --replicas=3 and a kill -9 of process 0\n",
              steps);
}

}  // namespace
}  // namespace pserver
