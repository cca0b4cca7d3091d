// Offline resharding end to end: a 3-server cluster trains dense parameters
// cut into blocks over every server, a sparse table with Adam and a BSP KV
// table with clocks and held-back adds; its checkpoints are resharded to 2
// and to 5 servers (cc/core/reshard.h); clusters of 2 and 5 servers started
// on them read back every value bit for bit, and a further round of training
// gives exactly what the 3-server cluster restarted from its own
// checkpoints gives (so optimizer state, steps, clocks and held-back adds
// came along). The same for clusters of 2 and 5 started directly on the 3
// servers' directory, which reshard at start (Server::ReshardAtStart). Over
// gRPC and in-process clients.
#include "cc/core/reshard.h"

#include <signal.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/client/table.h"
#include "cc/testing/child_process.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster_test_base.h"

namespace pserver {
namespace {

namespace fs = std::filesystem;
using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int kServers = 3;
// 5000 floats in 4096-byte blocks (cluster_test_base.h): 5 blocks.
constexpr int64_t kW = 5000;
constexpr int64_t kC = 2000;
constexpr uint32_t kDim = 3;

v1::ParameterConfig Optimizer(const std::string& kind, double lr) {
  v1::ParameterConfig config;
  if (kind == "adam") config.mutable_optimizer()->mutable_adam();
  if (kind == "adagrad") config.mutable_optimizer()->mutable_adagrad();
  if (kind == "momentum") config.mutable_optimizer()->mutable_sgd()->set_momentum(0.9);
  config.mutable_learning_rate()->set_learning_rate(lr);
  return config;
}

v1::TableConfig EmbConfig() {
  v1::TableConfig config;
  config.set_dim(kDim);
  config.mutable_optimizer()->mutable_adam()->set_learning_rate(0.05);
  config.mutable_initializer()->mutable_normal()->set_stddev(0.5);
  return config;
}

v1::TableConfig KvConfig() {
  v1::TableConfig config;
  config.set_dim(1);
  config.set_element_type(v1::FLOAT64);
  config.mutable_optimizer()->mutable_add();
  config.mutable_consistency()->set_model(v1::Consistency::BSP);
  return config;
}

std::vector<uint64_t> EmbKeys() {
  std::vector<uint64_t> keys(300);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 7919 + 3;  // spread, not sequential
  return keys;
}

// A deterministic gradient for round `round`.
template <typename T>
Tensor Grad(int64_t n, int round) {
  std::vector<T> g(n);
  for (int64_t i = 0; i < n; ++i) g[i] = static_cast<T>(((i * 37 + round * 11) % 101) - 50) / 64;
  return Tensor::FromValues<T>({n}, g);
}

std::vector<float> EmbGrads(int round) {
  std::vector<float> g(EmbKeys().size() * kDim);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>((i * 13 + round) % 29) / 16 - 0.875f;
  return g;
}

// Everything a trainer can read back, as bytes.
struct State {
  std::vector<std::string> params;  // w, b, c
  std::vector<float> emb;           // rows of EmbKeys()
  std::vector<double> kv;           // keys 5 and 7, read after w1's tick
  bool operator==(const State& o) const {
    return params == o.params && emb == o.emb && kv == o.kv;
  }
};

class ReshardClusterTest : public ClusterTest {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/reshard-",
                        GetParam() == Via::kGrpc ? "grpc" : "inproc");
    fs::remove_all(dir_);
  }
  void TearDown() override { cluster_.reset(); }

  ServerOptions Options(const std::string& checkpoint_dir) {
    ServerOptions base;
    base.checkpoint_dir = checkpoint_dir;
    base.checkpoint_on_shutdown = false;  // the directories stay as written
    return base;
  }

  // Trains on a fresh 3-server cluster and checkpoints it.
  void TrainAndCheckpoint() {
    StartCluster(kServers, Options(dir_ + "/from"));
    auto client = NewClient();
    ASSERT_NE(client, nullptr);
    ASSERT_NO_FATAL_FAILURE(TrainFresh(*client));
    ASSERT_OK(client->SaveCheckpoint());
    client.reset();
    cluster_.reset();
  }

  // Gives 3 servers a fresh model through `client` and trains it: dense
  // parameters, the sparse table, and two KV workers whose adds are held
  // back (the workers are let go without leaving).
  void TrainFresh(Client& client) {
    std::vector<float> w(kW), c(kC);
    std::iota(w.begin(), w.end(), 0.5f);
    std::iota(c.begin(), c.end(), -3.0f);
    ASSERT_OK(client.InitParam("w", Tensor::FromValues<float>({kW}, w), Optimizer("adam", 0.01)));
    ASSERT_OK(client.InitParam("b", Tensor::FromValues<double>({3}, {1, 2, 3}),
                               Optimizer("momentum", 0.1)));
    ASSERT_OK(client.InitParam("c", Tensor::FromValues<float>({kC}, c),
                               Optimizer("adagrad", 0.1)));
    ASSERT_OK(client.FinishInitParams());
    std::set<int> servers;
    for (const BlockSpec& b : client.placement().Blocks("w", kW, sizeof(float))) {
      servers.insert(b.server);
    }
    ASSERT_EQ(servers.size(), static_cast<size_t>(kServers));  // w loads every server
    for (int round = 0; round < 3; ++round) ASSERT_OK(Push(client, round));

    ASSERT_OK_AND_ASSIGN(Table kv, Table::Create(client, "kv", KvConfig()));
    ASSERT_OK_AND_ASSIGN(auto w0, KvWorker::Join(kv, "w0"));
    ASSERT_OK_AND_ASSIGN(auto w1, KvWorker::Join(kv, "w1"));
    ASSERT_OK(w0->Add<double>(std::vector<uint64_t>{5}, std::vector<double>{2.5}));
    ASSERT_OK(w1->Add<double>(std::vector<uint64_t>{7}, std::vector<double>{1.25}));
    ASSERT_OK(w0->Clock());  // both adds held until w1 passes clock 0
    w0.release();  // their servers go away; no Leave
    w1.release();
  }

  // One round of training: every parameter and the sparse table.
  absl::Status Push(Client& client, int round) {
    PS_RETURN_IF_ERROR(client.SendGrad("w", Grad<float>(kW, round)));
    PS_RETURN_IF_ERROR(client.SendGrad("b", Grad<double>(3, round)));
    PS_RETURN_IF_ERROR(client.SendGrad("c", Grad<float>(kC, round)));
    PS_ASSIGN_OR_RETURN(Table emb, Table::Create(client, "emb", EmbConfig()));
    return emb.Push<float>(EmbKeys(), EmbGrads(round));
  }

  absl::StatusOr<State> Read(Client& client) {
    State state;
    PS_ASSIGN_OR_RETURN(std::vector<Tensor> params, client.GetParams({"w", "b", "c"}));
    for (const Tensor& t : params) state.params.emplace_back(t.bytes());
    PS_ASSIGN_OR_RETURN(Table emb, Table::Create(client, "emb", EmbConfig()));
    state.emb.resize(EmbKeys().size() * kDim);
    PS_RETURN_IF_ERROR(emb.Pull<float>(EmbKeys(), absl::MakeSpan(state.emb)));
    return state;
  }

  // Starts `servers` servers on `dir`: checks what they hold against
  // `saved`, then trains on and returns what that gives.
  State StartAndContinue(int servers, const std::string& dir, const State& saved) {
    StartCluster(servers, Options(dir));
    auto client = NewClient();
    EXPECT_NE(client, nullptr);
    if (client == nullptr) return {};
    State after = CheckAndContinue(*client, servers, saved);
    client.reset();
    cluster_.reset();
    return after;
  }

  // What `client`'s `servers` servers hold, checked against `saved`; then
  // trains on and returns what that gives.
  State CheckAndContinue(Client& client, int servers, const State& saved) {
    absl::StatusOr<State> restored = Read(client);
    EXPECT_OK(restored.status());
    if (!restored.ok()) return {};
    EXPECT_TRUE(restored->params == saved.params) << servers << " servers";
    EXPECT_EQ(restored->emb, saved.emb) << servers << " servers";

    // Clocks came along: both workers at their clocks, the adds held back.
    absl::StatusOr<Table> kv = Table::Create(client, "kv", KvConfig());
    EXPECT_OK(kv.status());
    if (!kv.ok()) return {};
    absl::StatusOr<std::vector<v1::TableStats>> stats = kv->Stats();
    EXPECT_OK(stats.status());
    if (stats.ok()) {
      EXPECT_EQ(stats->size(), static_cast<size_t>(servers));
      for (const v1::TableStats& s : *stats) {
        EXPECT_EQ(s.workers(), 2u);
        EXPECT_EQ(s.min_clock(), 0);
      }
    }
    std::vector<double> held(2, -1);
    EXPECT_OK(kv->Pull<double>(std::vector<uint64_t>{5, 7}, absl::MakeSpan(held)));
    EXPECT_EQ(held, (std::vector<double>{0, 0}));

    // Train on: the same round everywhere; w1 rejoins and ticks, releasing
    // the held-back adds.
    EXPECT_OK(Push(client, 3));
    EXPECT_OK(Push(client, 4));
    absl::StatusOr<State> after = Read(client);
    EXPECT_OK(after.status());
    if (!after.ok()) return {};
    EXPECT_FALSE(after->params == saved.params);
    {
      absl::StatusOr<std::unique_ptr<KvWorker>> w1 = KvWorker::Join(*kv, "w1");
      EXPECT_OK(w1.status());
      if (!w1.ok()) return {};
      EXPECT_EQ((*w1)->clock(), 0);
      EXPECT_OK((*w1)->Clock());
      after->kv.resize(2);
      EXPECT_OK((*w1)->Get<double>(std::vector<uint64_t>{5, 7}, absl::MakeSpan(after->kv)));
      (*w1).release();  // no Leave: the cluster goes away next
    }
    return *after;
  }

  std::string dir_;
};

TEST_P(ReshardClusterTest, ThreeServersCheckpointsServeTwoAndFiveServersExactly) {
  ASSERT_NO_FATAL_FAILURE(TrainAndCheckpoint());

  // What the 3 servers saved, read back by 3 servers, and their next steps.
  StartCluster(kServers, Options(dir_ + "/from"));
  State saved;
  {
    auto client = NewClient();
    ASSERT_NE(client, nullptr);
    ASSERT_OK_AND_ASSIGN(saved, Read(*client));
  }
  cluster_.reset();
  const State reference = StartAndContinue(kServers, dir_ + "/from", saved);
  EXPECT_EQ(reference.kv, (std::vector<double>{2.5, 1.25}));

  for (uint32_t m : {2u, 5u}) {
    SCOPED_TRACE(absl::StrCat(m, " servers"));
    // Offline: psctl checkpoint reshard's way.
    const std::string to = absl::StrCat(dir_, "/to-", m);
    ReshardOptions options;
    options.num_servers = m;
    ASSERT_OK_AND_ASSIGN(ReshardResult result, ReshardCheckpoints(dir_ + "/from", to, options));
    EXPECT_EQ(result.from_servers, static_cast<uint32_t>(kServers));
    EXPECT_EQ(result.table_rows, EmbKeys().size() + 0 /* kv rows: none yet */);
    const State resharded = StartAndContinue(static_cast<int>(m), to, saved);
    EXPECT_TRUE(resharded == reference);

    // At start: m servers on (a copy of) the 3 servers' directory.
    const std::string direct = absl::StrCat(dir_, "/direct-", m);
    fs::copy(dir_ + "/from", direct, fs::copy_options::recursive);
    const State at_start = StartAndContinue(static_cast<int>(m), direct, saved);
    EXPECT_TRUE(at_start == reference);
    // Each server wrote its share as a checkpoint for m servers.
    for (uint32_t k = 0; k < m; ++k) {
      ASSERT_OK_AND_ASSIGN(std::vector<CheckpointEntry> held,
                           ListCheckpoints(absl::StrCat(direct, "/shard-", k)));
      ASSERT_FALSE(held.empty()) << "shard " << k;
      ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(held.back().path));
      EXPECT_EQ(reader->info().num_servers, m);
      EXPECT_EQ(reader->info().placement.num_servers(), m);
    }
    // Started again, they load those rather than resharding again.
    ASSERT_OK_AND_ASSIGN(std::vector<CheckpointEntry> before,
                         ListCheckpoints(absl::StrCat(direct, "/shard-0")));
    const State again = StartAndContinue(static_cast<int>(m), direct, saved);
    EXPECT_TRUE(again == reference);
    ASSERT_OK_AND_ASSIGN(std::vector<CheckpointEntry> after,
                         ListCheckpoints(absl::StrCat(direct, "/shard-0")));
    EXPECT_EQ(after.size(), before.size());
  }
}

// A shard missing: the servers of another count refuse to start, naming it,
// and offline resharding writes nothing.
TEST_P(ReshardClusterTest, AMissingShardFailsStartAndReshardingWritesNothing) {
  ASSERT_NO_FATAL_FAILURE(TrainAndCheckpoint());
  fs::rename(dir_ + "/from/shard-1", dir_ + "/shard-1-away");
  EXPECT_THAT(LocalCluster::Start(2, Options(dir_ + "/from")).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("resharding the checkpoints in"),
                             HasSubstr("shard 1 of 3 is missing"))));
  ReshardOptions options;
  options.num_servers = 2;
  EXPECT_THAT(ReshardCheckpoints(dir_ + "/from", dir_ + "/to", options).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("shard 1 of 3 is missing")));
  EXPECT_FALSE(fs::exists(dir_ + "/to"));
  ASSERT_OK_AND_ASSIGN(std::vector<CheckpointEntry> held, ListCheckpoints(dir_ + "/from/shard-0"));
  EXPECT_EQ(held.size(), 1u) << "nothing written for 2 servers";
}

// Real pserver processes (--index, --num_servers, no etcd): 3 train and save
// on SIGTERM; 2 and 5 started on copies of their directory reshard at start,
// serve the same values and train on exactly as 3 restarted servers do.
class Processes {
 public:
  // Starts `n` servers on `dir`; their addresses in `addresses()`.
  absl::Status Start(int n, const std::string& dir) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    for (int i = 0; i < n; ++i) {
      PS_ASSIGN_OR_RETURN(
          auto child,
          ChildProcess::Spawn(RunfilesPath("cc/server/pserver"),
                              {"--port=0", absl::StrCat("--index=", i),
                               absl::StrCat("--num_servers=", n),
                               absl::StrCat("--checkpoint_dir=", dir)}));
      absl::StatusOr<std::string> address =
          WaitForPserverAddress(*child, static_cast<uint32_t>(i), deadline);
      if (!address.ok()) {
        return absl::Status(address.status().code(),
                            absl::StrCat(address.status().message(), "\n", child->output()));
      }
      addresses_.push_back(*address);
      children_.push_back(std::move(child));
    }
    return absl::OkStatus();
  }
  const std::vector<std::string>& addresses() const { return addresses_; }

  // SIGTERM to each (each saves a last checkpoint) and a clean exit.
  absl::Status Stop() {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    for (auto& child : children_) {
      if (kill(child->pid(), SIGTERM) != 0) return absl::InternalError(std::strerror(errno));
    }
    for (auto& child : children_) {
      PS_ASSIGN_OR_RETURN(int status, child->WaitForExit(deadline));
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        return absl::InternalError(
            absl::StrCat("pserver ", DescribeWaitStatus(status), ":\n", child->output()));
      }
    }
    children_.clear();
    addresses_.clear();
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<ChildProcess>> children_;  // killed by their destructors
  std::vector<std::string> addresses_;
};

TEST_P(ReshardClusterTest, RealServerProcessesOfTwoAndFiveLoadThreeServersCheckpoints) {
  if (GetParam() != Via::kGrpc) GTEST_SKIP() << "processes are reached over gRPC";
  options_.block_bytes = 4096;
  options_.timeout = absl::Seconds(20);
  const std::string from = dir_ + "/processes-3";
  {
    Processes three;
    ASSERT_OK(three.Start(kServers, from));
    options_.servers = three.addresses();
    ASSERT_OK_AND_ASSIGN(auto client, Connect());
    ASSERT_NO_FATAL_FAILURE(TrainFresh(*client));
    client.reset();
    ASSERT_OK(three.Stop());
  }
  auto run = [&](int n, const State* saved, State* read) -> State {
    const std::string dir = absl::StrCat(dir_, "/processes-", n, "-from-3");
    fs::copy(from, dir, fs::copy_options::recursive);
    Processes servers;
    EXPECT_OK(servers.Start(n, dir));
    options_.servers = servers.addresses();
    absl::StatusOr<std::unique_ptr<Client>> client = Connect();
    EXPECT_OK(client.status());
    if (!client.ok()) return {};
    if (read != nullptr) {
      absl::StatusOr<State> state = Read(**client);
      EXPECT_OK(state.status());
      if (state.ok()) *read = *state;
    }
    State after = CheckAndContinue(**client, n, saved != nullptr ? *saved : *read);
    client->reset();
    EXPECT_OK(servers.Stop());
    return after;
  };
  State saved;
  const State reference = run(kServers, nullptr, &saved);
  EXPECT_EQ(reference.kv, (std::vector<double>{2.5, 1.25}));
  for (int m : {2, 5}) {
    SCOPED_TRACE(absl::StrCat(m, " server processes"));
    EXPECT_TRUE(run(m, &saved, nullptr) == reference);
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, ReshardClusterTest,
                         ::testing::Values(Via::kGrpc, Via::kInProcess), ViaName);

}  // namespace
}  // namespace pserver
