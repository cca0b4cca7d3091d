// End to end: sparse and KV tables, consistency (BSP/SSP), collectives and
// custom table handlers on a 3-server cluster, over gRPC and in-process.
#include "cc/core/tables.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cc/client/table.h"
#include "cc/client/worker_group.h"
#include "cc/core/status_macros.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster_test_base.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::Each;
using ::testing::Gt;
using ::testing::HasSubstr;

constexpr int kServers = 3;

class TablesTest : public ClusterTest {
 protected:
  void SetUp() override { StartCluster(kServers); }

  static v1::TableConfig Config(uint32_t dim) {
    v1::TableConfig config;
    config.set_dim(dim);
    return config;
  }
  static v1::TableConfig KvConfig(v1::Consistency::Model model, uint32_t staleness = 0) {
    v1::TableConfig config = Config(1);
    config.set_element_type(v1::FLOAT64);
    config.mutable_optimizer()->mutable_add();
    config.mutable_consistency()->set_model(model);
    config.mutable_consistency()->set_staleness(staleness);
    return config;
  }
};

TEST_P(TablesTest, PullReturnsRowsInTheOrderAskedAndSpreadsKeysOverServers) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  v1::TableConfig config = Config(4);
  config.mutable_initializer()->mutable_uniform()->set_low(-1);
  config.mutable_initializer()->mutable_uniform()->set_high(1);
  config.mutable_initializer()->set_seed(7);
  ASSERT_OK_AND_ASSIGN(Table table, Table::Create(*client, "emb", config));

  std::vector<uint64_t> keys(300);
  std::iota(keys.begin(), keys.end(), 1000);
  std::vector<float> rows(keys.size() * 4);
  ASSERT_OK(table.Pull<float>(keys, absl::MakeSpan(rows)));

  // Every key's row is its initializer value, wherever it lives, and asking
  // in another order (with repeats) gives the same rows in that order.
  std::vector<uint64_t> shuffled = {1299, 1000, 1150, 1000};
  std::vector<float> again(shuffled.size() * 4);
  ASSERT_OK(table.Pull<float>(shuffled, absl::MakeSpan(again)));
  for (size_t i = 0; i < shuffled.size(); ++i) {
    const size_t at = shuffled[i] - 1000;
    for (int d = 0; d < 4; ++d) EXPECT_EQ(again[i * 4 + d], rows[at * 4 + d]) << shuffled[i];
  }
  EXPECT_THAT(rows, Each(AllOf(::testing::Ge(-1.0f), ::testing::Lt(1.0f))));

  // Reads create no rows: the 300 keys read are all still absent.
  ASSERT_OK_AND_ASSIGN(std::vector<v1::TableStats> stats, table.Stats());
  ASSERT_EQ(stats.size(), kServers);
  for (const v1::TableStats& s : stats) EXPECT_EQ(s.rows(), 0u) << "a read created rows";

  // Pushes create them, starting from the values the reads returned (a zero
  // SGD gradient leaves them as they start).
  ASSERT_OK(table.Push<float>(keys, std::vector<float>(keys.size() * 4, 0.0f)));
  std::vector<float> pushed(keys.size() * 4);
  ASSERT_OK(table.Pull<float>(keys, absl::MakeSpan(pushed)));
  EXPECT_EQ(pushed, rows);
  ASSERT_OK_AND_ASSIGN(stats, table.Stats());
  uint64_t total = 0;
  for (const v1::TableStats& s : stats) {
    EXPECT_GT(s.rows(), 50u) << "hash partitioning should spread 300 keys over 3 servers";
    total += s.rows();
  }
  EXPECT_EQ(total, 300u);
}

TEST_P(TablesTest, ReadsOfManyUnknownKeysDoNotGrowTheTable) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  v1::TableConfig config = Config(8);
  config.mutable_initializer()->mutable_normal()->set_stddev(0.5);
  config.mutable_initializer()->set_seed(3);
  ASSERT_OK_AND_ASSIGN(Table table, Table::Create(*client, "wide", config));
  ASSERT_OK(table.Push<float>({1, 2}, std::vector<float>(16, 0.0f)));
  std::vector<uint64_t> keys(200000);
  std::iota(keys.begin(), keys.end(), uint64_t{1} << 40);
  std::vector<float> rows(keys.size() * 8);
  ASSERT_OK(table.Pull<float>(keys, absl::MakeSpan(rows)));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::TableStats> stats, table.Stats());
  uint64_t total = 0, bytes = 0, pulled = 0;
  for (const v1::TableStats& s : stats) {
    total += s.rows();
    bytes += s.bytes();
    pulled += s.keys_pulled();
  }
  EXPECT_EQ(total, 2u);
  EXPECT_EQ(bytes, 2u * 8 * 4);
  EXPECT_EQ(pulled, keys.size());
  // What a push-created row of those keys starts from is what was read.
  const std::vector<uint64_t> some = {keys[0], keys[12345], keys.back()};
  ASSERT_OK(table.Push<float>(some, std::vector<float>(some.size() * 8, 0.0f)));
  std::vector<float> created(some.size() * 8);
  ASSERT_OK(table.Pull<float>(some, absl::MakeSpan(created)));
  for (size_t d = 0; d < 8; ++d) {
    EXPECT_EQ(created[d], rows[d]);
    EXPECT_EQ(created[8 + d], rows[12345 * 8 + d]);
    EXPECT_EQ(created[16 + d], rows[(keys.size() - 1) * 8 + d]);
  }
}

TEST_P(TablesTest, RangePartitioningKeepsContiguousKeysTogether) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  v1::TableConfig config = Config(2);
  config.mutable_partitioning()->set_kind(v1::Partitioning::RANGE);
  config.mutable_partitioning()->set_range_end(300);
  ASSERT_OK_AND_ASSIGN(Table table, Table::Create(*client, "ranged", config));
  ASSERT_OK_AND_ASSIGN(int first, table.ServerOf(0));
  ASSERT_OK_AND_ASSIGN(int middle, table.ServerOf(150));
  ASSERT_OK_AND_ASSIGN(int last, table.ServerOf(299));
  EXPECT_EQ(first, 0);
  EXPECT_EQ(middle, 1);
  EXPECT_EQ(last, 2);

  const std::vector<uint64_t> keys = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};  // all on server 0
  ASSERT_OK(table.Push<float>(keys, std::vector<float>(keys.size() * 2, 0.0f)));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::TableStats> stats, table.Stats());
  EXPECT_EQ(stats[0].rows(), 10u);
  EXPECT_EQ(stats[1].rows(), 0u);

  const std::vector<uint64_t> outside = {5, 300};
  std::vector<float> two(4);
  EXPECT_THAT(table.Pull<float>(outside, absl::MakeSpan(two)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key 300 is outside")));
}

TEST_P(TablesTest, PushSumsDuplicateKeysAndAppliesAdagradPerRow) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  v1::TableConfig config = Config(2);
  config.mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.5);
  config.mutable_optimizer()->mutable_adagrad()->set_initial_accumulator(0.1);
  ASSERT_OK_AND_ASSIGN(Table table, Table::Create(*client, "ada", config));

  // Key 3 appears twice: its gradients are summed, then one Adagrad step.
  const std::vector<uint64_t> keys = {3, 8, 3};
  const std::vector<float> grads = {1, 2, 0.5f, -1, 3, 4};
  ASSERT_OK(table.Push<float>(keys, grads));
  ASSERT_OK(table.Push<float>(keys, grads));

  std::vector<float> rows(4);
  const std::vector<uint64_t> read = {3, 8};
  ASSERT_OK(table.Pull<float>(read, absl::MakeSpan(rows)));
  // Reference: two Adagrad steps from 0 with the summed gradient.
  auto adagrad = [](double g) {
    double w = 0, acc = 0.1;
    for (int step = 0; step < 2; ++step) {
      acc += g * g;
      w -= 0.5 * g / (std::sqrt(acc) + 1e-10);
    }
    return w;
  };
  EXPECT_NEAR(rows[0], adagrad(1 + 3), 1e-6);
  EXPECT_NEAR(rows[1], adagrad(2 + 4), 1e-6);
  EXPECT_NEAR(rows[2], adagrad(0.5), 1e-6);
  EXPECT_NEAR(rows[3], adagrad(-1), 1e-6);
}

TEST_P(TablesTest, AdmissionAndCapacityShowInStats) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  v1::TableConfig config = Config(1);
  config.mutable_eviction()->set_admission_count(2);
  config.mutable_optimizer()->mutable_sgd()->set_learning_rate(1);
  ASSERT_OK_AND_ASSIGN(Table table, Table::Create(*client, "admit", config));
  const std::vector<uint64_t> key = {42};
  const std::vector<float> grad = {-1};
  ASSERT_OK(table.Push<float>(key, grad));  // first sighting: not admitted, dropped
  std::vector<float> row(1);
  ASSERT_OK(table.Pull<float>(key, absl::MakeSpan(row)));  // second: admitted now
  EXPECT_EQ(row[0], 0.0f);
  ASSERT_OK(table.Push<float>(key, grad));
  ASSERT_OK(table.Pull<float>(key, absl::MakeSpan(row)));
  EXPECT_EQ(row[0], 1.0f);
}

TEST_P(TablesTest, BadRequestsAreRefusedWithClearErrors) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  ASSERT_OK_AND_ASSIGN(Table table, Table::Create(*client, "t", Config(3)));
  EXPECT_OK(Table::Create(*client, "t", Config(3)).status());  // same config: opens it
  EXPECT_THAT(Table::Create(*client, "t", Config(4)).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("another config")));
  EXPECT_THAT(Table::Create(*client, "bad", Config(0)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dim")));

  const std::vector<uint64_t> keys = {1, 2};
  std::vector<float> short_out(5);
  EXPECT_THAT(table.Pull<float>(keys, absl::MakeSpan(short_out)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("24 bytes of output")));
  std::vector<double> wrong_type(6);
  EXPECT_THAT(table.Pull<double>(keys, absl::MakeSpan(wrong_type)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("float32")));
  const std::vector<float> nan_grad = {0, 0, 0, 0, std::nanf(""), 0};
  EXPECT_THAT(table.Push<float>(keys, nan_grad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key 2")));

  std::vector<float> out(6);
  ASSERT_OK(table.Pull<float>(keys, absl::MakeSpan(out)));
  EXPECT_THAT(out, Each(0.0f)) << "the refused NaN push changed nothing";
}

// BSP: every read at clock c sees exactly the adds of clocks before c, so
// 4 workers computing from what they read end where a sequential run does.
TEST_P(TablesTest, BspMatchesASequentialRun) {
  constexpr int kWorkers = 4;
  constexpr int kClocks = 8;
  std::vector<std::unique_ptr<Client>> clients;
  for (int w = 0; w < kWorkers; ++w) clients.push_back(NewClient());
  ASSERT_NE(clients.back(), nullptr);
  ASSERT_OK_AND_ASSIGN(Table table,
                       Table::Create(*clients[0], "bsp", KvConfig(v1::Consistency::BSP)));
  // Update of worker w at clock t from the sum it read.
  auto update = [](int w, int t, double sum) { return std::fmod(sum, 7.0) + w + t + 1; };
  // The sequential run.
  std::vector<std::vector<double>> expected_sums(kClocks);
  std::vector<double> state(kWorkers, 0);
  for (int t = 0; t < kClocks; ++t) {
    const double sum = std::accumulate(state.begin(), state.end(), 0.0);
    expected_sums[t].assign(kWorkers, sum);
    for (int w = 0; w < kWorkers; ++w) state[w] += update(w, t, sum);
  }

  std::vector<std::unique_ptr<KvWorker>> workers(kWorkers);
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_OK_AND_ASSIGN(Table mine,
                         Table::Create(*clients[w], "bsp", KvConfig(v1::Consistency::BSP)));
    ASSERT_OK_AND_ASSIGN(workers[w], KvWorker::Join(mine, absl::StrCat("w", w)));
  }
  std::vector<std::vector<double>> seen(kClocks, std::vector<double>(kWorkers, -1));
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      std::vector<uint64_t> keys(kWorkers);
      std::iota(keys.begin(), keys.end(), 0);
      std::vector<double> vals(kWorkers);
      for (int t = 0; t < kClocks; ++t) {
        ASSERT_OK(workers[w]->Get<double>(keys, absl::MakeSpan(vals)));
        const double sum = std::accumulate(vals.begin(), vals.end(), 0.0);
        seen[t][w] = sum;
        const std::vector<uint64_t> mine = {static_cast<uint64_t>(w)};
        const std::vector<double> delta = {update(w, t, sum)};
        ASSERT_OK(workers[w]->Add<double>(mine, delta));
        ASSERT_OK(workers[w]->Clock());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(seen, expected_sums);
  for (auto& worker : workers) ASSERT_OK(worker->Leave());
  std::vector<uint64_t> keys(kWorkers);
  std::iota(keys.begin(), keys.end(), 0);
  std::vector<double> final_state(kWorkers);
  ASSERT_OK(table.Pull<double>(keys, absl::MakeSpan(final_state)));
  EXPECT_EQ(final_state, state);
}

// SSP(s): a read at clock c never misses an add made before clock c - s, and
// a worker that runs more than s clocks ahead waits for the slowest.
TEST_P(TablesTest, SspBoundsStalenessAndMakesFastWorkersWait) {
  constexpr int kWorkers = 4;
  constexpr int kClocks = 10;
  constexpr int kStaleness = 2;
  std::vector<std::unique_ptr<Client>> clients;
  for (int w = 0; w < kWorkers; ++w) clients.push_back(NewClient());
  ASSERT_NE(clients.back(), nullptr);
  const v1::TableConfig config = KvConfig(v1::Consistency::SSP, kStaleness);
  std::vector<std::unique_ptr<KvWorker>> workers(kWorkers);
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_OK_AND_ASSIGN(Table table, Table::Create(*clients[w], "ssp", config));
    ASSERT_OK_AND_ASSIGN(workers[w], KvWorker::Join(table, absl::StrCat("w", w)));
  }
  std::vector<uint64_t> keys(kWorkers);
  std::iota(keys.begin(), keys.end(), 0);
  std::vector<double> vals(kWorkers);

  // Worker 0 stays at clock 0; the others run ahead until they must wait.
  auto step = [&](KvWorker& worker, int w) -> absl::Status {
    const std::vector<uint64_t> mine = {static_cast<uint64_t>(w)};
    const std::vector<double> one = {1};
    PS_RETURN_IF_ERROR(worker.Add<double>(mine, one));
    return worker.Clock();
  };
  for (int w = 1; w < kWorkers; ++w) {
    for (int t = 0; t <= kStaleness; ++t) {
      ASSERT_OK(workers[w]->Get<double>(keys, absl::MakeSpan(vals)));  // within s: no wait
      ASSERT_OK(step(*workers[w], w));
    }
    // At clock s + 1 the read needs worker 0 at clock 1: it waits, and at the
    // deadline the error names the straggler.
    CallOptions soon;
    soon.deadline = absl::Now() + absl::Seconds(4);  // the server answers 1 s before
    EXPECT_THAT(workers[w]->Get<double>(keys, absl::MakeSpan(vals), soon),
                StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("w0 at clock 0")));
  }

  // Now all run, worker 0 the slowest (it does extra reads); every read is
  // checked against the staleness bound.
  std::atomic<int> violations{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      std::vector<double> read(kWorkers);
      while (workers[w]->clock() < kClocks) {
        const int64_t c = workers[w]->clock();
        const int reads = w == 0 ? 5 : 1;
        for (int r = 0; r < reads; ++r) {
          ASSERT_OK(workers[w]->Get<double>(keys, absl::MakeSpan(read)));
        }
        for (int other = 0; other < kWorkers; ++other) {
          // Worker `other` made one add per clock before ticking.
          if (read[other] < c - kStaleness) violations.fetch_add(1);
        }
        if (read[w] != static_cast<double>(c)) violations.fetch_add(1);  // reads its writes
        ASSERT_OK(step(*workers[w], w));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(violations.load(), 0);
  ASSERT_OK(workers[0]->Get<double>(keys, absl::MakeSpan(vals)));
  EXPECT_THAT(vals, Each(static_cast<double>(kClocks)));
}

TEST_P(TablesTest, ChunkFormsAddressWholeChunksOfKeys) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  v1::TableConfig config = KvConfig(v1::Consistency::ASP);
  config.set_chunk_size(4);
  ASSERT_OK_AND_ASSIGN(Table table, Table::Create(*client, "chunks", config));
  ASSERT_OK_AND_ASSIGN(auto worker, KvWorker::Join(table, "solo"));
  const std::vector<uint64_t> chunk = {2};  // keys 8..11
  const std::vector<double> vals = {1, 2, 3, 4};
  ASSERT_OK(worker->AddChunk(chunk, absl::string_view(reinterpret_cast<const char*>(vals.data()),
                                                      vals.size() * sizeof(double))));
  std::vector<double> row(4);
  const std::vector<uint64_t> keys = {8, 9, 10, 11};
  ASSERT_OK(worker->Get<double>(keys, absl::MakeSpan(row)));
  EXPECT_EQ(row, vals);
  std::vector<double> got(4);
  ASSERT_OK(worker->GetChunk(
      chunk, absl::Span<char>(reinterpret_cast<char*>(got.data()), got.size() * sizeof(double))));
  EXPECT_EQ(got, vals);
}

// Tables, their optimizer state, workers' clocks and held-back BSP adds are
// in the servers' checkpoints: a cluster restarted from them carries on.
TEST_P(TablesTest, TablesAndClocksSurviveARestartFromCheckpoints) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/tables-", GetParam() == Via::kGrpc ? "grpc" : "inproc");
  ServerOptions base;
  base.checkpoint_dir = dir;
  cluster_.reset();
  StartCluster(kServers, base);
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  v1::TableConfig config = Config(3);
  config.mutable_optimizer()->mutable_adam()->set_learning_rate(0.1);
  config.mutable_initializer()->mutable_normal()->set_stddev(0.5);
  ASSERT_OK_AND_ASSIGN(Table emb, Table::Create(*client, "emb", config));
  std::vector<uint64_t> keys(40);
  std::iota(keys.begin(), keys.end(), 0);
  std::vector<float> grads(keys.size() * 3, 0.25f);
  ASSERT_OK(emb.Push<float>(keys, grads));
  ASSERT_OK_AND_ASSIGN(Table kv, Table::Create(*client, "kv", KvConfig(v1::Consistency::BSP)));
  ASSERT_OK_AND_ASSIGN(auto w0, KvWorker::Join(kv, "w0"));
  ASSERT_OK_AND_ASSIGN(auto w1, KvWorker::Join(kv, "w1"));
  const std::vector<uint64_t> one_key = {5};
  ASSERT_OK(w0->Add<double>(one_key, std::vector<double>{2.5}));  // held until w1 passes 0
  ASSERT_OK(w0->Clock());
  std::vector<double> value(1);
  ASSERT_OK(kv.Pull<double>(one_key, absl::MakeSpan(value)));
  EXPECT_EQ(value[0], 0.0);

  for (int i = 0; i < kServers; ++i) ASSERT_OK(cluster_->server(i).Save().status());
  std::vector<float> before(keys.size() * 3);
  ASSERT_OK(emb.Pull<float>(keys, absl::MakeSpan(before)));

  w0.release();  // their servers go away; no Leave
  w1.release();
  client.reset();
  base.checkpoint_on_shutdown = false;
  cluster_.reset();
  StartCluster(kServers, base);
  client = NewClient();
  ASSERT_NE(client, nullptr);
  ASSERT_OK_AND_ASSIGN(emb, Table::Create(*client, "emb", config));
  std::vector<float> after(keys.size() * 3);
  ASSERT_OK(emb.Pull<float>(keys, absl::MakeSpan(after)));
  EXPECT_EQ(after, before);
  // Adam's state came back too: the next step matches on both sides.
  ASSERT_OK(emb.Push<float>(keys, grads));
  ASSERT_OK(emb.Pull<float>(keys, absl::MakeSpan(after)));
  EXPECT_NE(after, before);

  ASSERT_OK_AND_ASSIGN(kv, Table::Create(*client, "kv", KvConfig(v1::Consistency::BSP)));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::TableStats> stats, kv.Stats());
  for (const v1::TableStats& s : stats) {
    EXPECT_EQ(s.workers(), 2u);
    EXPECT_EQ(s.min_clock(), 0);  // w1 never ticked
  }
  // w1 rejoins at its restored clock and ticks: w0's held add applies.
  ASSERT_OK_AND_ASSIGN(auto w1_again, KvWorker::Join(kv, "w1"));
  EXPECT_EQ(w1_again->clock(), 0);
  ASSERT_OK(w1_again->Clock());
  ASSERT_OK(w1_again->Get<double>(one_key, absl::MakeSpan(value)));
  EXPECT_EQ(value[0], 2.5);
}

// A group of workers on their own threads, each with its own client.
class GroupTest : public TablesTest {
 protected:
  template <typename Fn>
  void RunGroup(int size, Fn body) {
    std::vector<std::unique_ptr<Client>> clients;
    for (int w = 0; w < size; ++w) clients.push_back(NewClient());
    ASSERT_NE(clients.back(), nullptr);
    std::vector<std::thread> threads;
    for (int w = 0; w < size; ++w) {
      threads.emplace_back([&, w] {
        WorkerGroup group(*clients[w], "g", size, absl::StrCat("w", w));
        body(group, w);
      });
    }
    for (std::thread& t : threads) t.join();
  }
};

TEST_P(GroupTest, AllReduceEqualsTheLocalSumForManySizes) {
  constexpr int kSize = 3;
  // 5000 floats are 20000 bytes: 5 chunks of the 4096-byte blocks.
  const std::vector<int64_t> lengths = {0, 1, 7, 1024, 5000};
  RunGroup(kSize, [&](WorkerGroup& group, int w) {
    for (int64_t n : lengths) {
      std::vector<float> mine(n);
      for (int64_t i = 0; i < n; ++i) mine[i] = static_cast<float>((i % 13) * (w + 1));
      Tensor t = Tensor::FromValues<float>({n}, mine);
      ASSERT_OK(group.AllReduce(&t, ReduceOp::kSum));
      for (int64_t i = 0; i < n; ++i) {
        // 1 + 2 + 3 times the common factor.
        ASSERT_EQ(t.values<float>()[i], static_cast<float>((i % 13) * 6)) << n << " " << i;
      }
      Tensor m = Tensor::FromValues<int64_t>({2}, {10 * (w + 1), -w});
      ASSERT_OK(group.AllReduce(&m, ReduceOp::kMean));
      EXPECT_EQ(m.values<int64_t>()[0], 20);  // (10 + 20 + 30) / 3
      EXPECT_EQ(m.values<int64_t>()[1], -1);  // (0 - 1 - 2) / 3
    }
  });
}

TEST_P(GroupTest, BroadcastAndBarrier) {
  constexpr int kSize = 4;
  std::atomic<int> arrived{0};
  std::atomic<int> early{0};
  RunGroup(kSize, [&](WorkerGroup& group, int w) {
    for (int round = 0; round < 5; ++round) {
      arrived.fetch_add(1);
      ASSERT_OK(group.Barrier(round % 2 == 0 ? BarrierScope::kWorkers : BarrierScope::kAll));
      // Nobody passes a barrier before everyone reached it.
      if (arrived.load() < kSize * (round + 1)) early.fetch_add(1);
    }
    std::vector<double> values(2000, w == 2 ? 1.5 : 0.0);
    values[1999] = w;
    Tensor t = Tensor::FromValues<double>({2000}, values);
    ASSERT_OK(group.Broadcast(&t, /*root=*/w == 2));
    EXPECT_EQ(t.values<double>()[0], 1.5);
    EXPECT_EQ(t.values<double>()[1999], 2.0);
  });
  EXPECT_EQ(early.load(), 0);
}

TEST_P(GroupTest, BarrierTimesOutNamingWhoArrived) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  WorkerGroup group(*client, "lonely", 2, "w0");
  CallOptions soon;
  soon.deadline = absl::Now() + absl::Seconds(1);
  EXPECT_THAT(group.Barrier(BarrierScope::kWorkers, soon),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("1 of 2 arrived (w0)")));
}

// A custom handler that keeps the maximum of what is pushed instead of
// running the optimizer, and counts the keys it serves.
class MaxHandler : public TableHandler {
 public:
  absl::Status Pull(SparseTable& table, absl::Span<const uint64_t> keys,
                    absl::Span<char> out) override {
    pulled_.fetch_add(keys.size());
    return TableHandler::Pull(table, keys, out);
  }
  absl::Status Push(SparseTable& table, absl::Span<const uint64_t> keys,
                    absl::string_view values) override {
    const float* pushed = reinterpret_cast<const float*>(values.data());
    std::vector<float> current(keys.size());
    PS_RETURN_IF_ERROR(table.Pull(keys, absl::MakeSpan(reinterpret_cast<char*>(current.data()),
                                                       current.size() * sizeof(float))));
    std::vector<float> delta(keys.size());
    for (size_t i = 0; i < keys.size(); ++i)
      delta[i] = std::max(current[i], pushed[i]) - current[i];
    return table.Push(keys, absl::string_view(reinterpret_cast<const char*>(delta.data()),
                                              delta.size() * sizeof(float)));
  }
  uint64_t pulled() const { return pulled_.load(); }

 private:
  std::atomic<uint64_t> pulled_{0};
};

TEST_P(TablesTest, CustomHandlerServesTheTablesRequests) {
  std::vector<std::shared_ptr<MaxHandler>> handlers;
  for (Tables* tables : cluster_->tables()) {
    handlers.push_back(std::make_shared<MaxHandler>());
    tables->SetHandler("max", handlers.back());
  }
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  v1::TableConfig config = Config(1);
  config.mutable_optimizer()->mutable_add();
  ASSERT_OK_AND_ASSIGN(Table table, Table::Create(*client, "max", config));
  const std::vector<uint64_t> keys = {1, 2, 3};
  ASSERT_OK(table.Push<float>(keys, std::vector<float>{5, -2, 1}));
  ASSERT_OK(table.Push<float>(keys, std::vector<float>{3, 4, 1}));
  std::vector<float> got(3);
  ASSERT_OK(table.Pull<float>(keys, absl::MakeSpan(got)));
  EXPECT_EQ(got, (std::vector<float>{5, 4, 1}));
  uint64_t pulled = 0;
  for (const auto& h : handlers) pulled += h->pulled();
  EXPECT_EQ(pulled, 3u);
}

INSTANTIATE_TEST_SUITE_P(Transports, TablesTest, ::testing::Values(Via::kGrpc, Via::kInProcess),
                         ViaName);
INSTANTIATE_TEST_SUITE_P(Transports, GroupTest, ::testing::Values(Via::kGrpc, Via::kInProcess),
                         ViaName);

}  // namespace
}  // namespace pserver
