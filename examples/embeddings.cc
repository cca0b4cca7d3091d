// Embeddings: matrix factorisation learned in a sparse embedding table by
// worker threads under stale-synchronous parallel (SSP) consistency.
//
//   bazel run //examples:embeddings
//   bazel run //examples:embeddings -- --workers=8 --staleness=0   # BSP
//   bazel run //examples:embeddings -- --quick                     # what the test runs
//   bazel run //examples:embeddings -- --in_process      # no sockets: in-process transport
//   bazel run //examples:embeddings -- --capacity=1000   # LRU eviction (shows in the stats)
//   bazel run //examples:embeddings -- --connect=127.0.0.1:7000,127.0.0.1:7001
//
// The model. Ratings r(u, i) of `users` users for `items` items come from a
// hidden rank-8 model, r = <p_u, q_i> + noise, with p_u and q_i drawn from a
// normal distribution so that ratings have unit variance. We learn 16-wide
// embeddings e_u, e_i and predict <e_u, e_i>; the loss of one rating is
//   (<e_u, e_i> - r)^2 / 2 + lambda / 2 * (|e_u|^2 + |e_i|^2),
// so the gradient for e_u is err * e_i + lambda * e_u (and symmetrically).
//
// The table. Users and items share one sparse table of dim 16: user u is key
// u and item i is key kItemKeyOffset + i. Rows are created on first touch
// from a seeded normal initializer (stddev 0.1, the same on every server) and
// updated by Adagrad, each row with its own accumulator, on the servers.
//
// The training. Each of `workers` threads owns a share of the training
// ratings and its own KvWorker. A step takes a minibatch, Gets the rows of its
// distinct keys at the worker's clock, computes the summed gradient per row,
// Adds it (the servers run Adagrad) and Clocks. Under SSP with staleness s a
// Get at clock c waits until every worker has reached clock c - s: a worker
// never reads while it is more than s clocks ahead of the slowest one.
//
// After each epoch the program prints the training and held-out RMSE, the
// clock and keys/s (rows read + written per second by all workers), then the
// table's stats per server. It exits 1 unless the final held-out RMSE is
// below 60% of the initial one.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "cc/client/client.h"
#include "cc/server/in_process_transport.h"
#include "cc/client/table.h"
#include "cc/core/status_macros.h"
#include "cc/server/local_cluster.h"
#include "examples/example_main.h"

ABSL_FLAG(int, servers, 2, "Servers of the embedded cluster.");
ABSL_FLAG(std::string, connect, "",
          "Comma-separated host:port of running pserver processes to train on instead of an "
          "embedded cluster (fresh ones: a table left by an earlier run starts trained).");
ABSL_FLAG(bool, in_process, false,
          "Talk to the embedded cluster in process (no sockets) instead of over gRPC.");
ABSL_FLAG(int, workers, 4, "Worker threads, each with its own KvWorker.");
ABSL_FLAG(int, staleness, 2, "SSP staleness (0 = BSP).");
ABSL_FLAG(int, clock_every, 1, "Steps between two Clock calls of a worker.");
ABSL_FLAG(int, epochs, 10, "Passes over the training ratings.");
ABSL_FLAG(int, batch, 256, "Ratings per minibatch step.");
ABSL_FLAG(int, users, 2000, "Users.");
ABSL_FLAG(int, items, 1000, "Items.");
ABSL_FLAG(int, ratings, 100000, "Generated ratings (10% are held out).");
ABSL_FLAG(double, learning_rate, 0.3, "Adagrad's learning rate.");
ABSL_FLAG(double, l2, 0.05, "L2 penalty lambda on the embeddings.");
ABSL_FLAG(uint64_t, capacity, 0,
          "Rows per server before the least recently used are evicted (0: no limit).");
ABSL_FLAG(bool, quick, false,
          "A short run (for the test): 500 users, 250 items, 20000 ratings, 8 epochs.");

namespace {

using pserver::Client;
using pserver::KvWorker;
using pserver::Table;

constexpr int kDim = 16;        // learned embedding width
constexpr int kTrueRank = 8;    // rank of the hidden model
constexpr double kNoise = 0.1;  // stddev of the rating noise
constexpr uint64_t kItemKeyOffset = uint64_t{1} << 32;

struct Rating {
  uint32_t user;
  uint32_t item;
  float value;
};

struct Dataset {
  std::vector<Rating> train;
  std::vector<Rating> held_out;
};

uint64_t UserKey(uint32_t user) { return user; }
uint64_t ItemKey(uint32_t item) { return kItemKeyOffset + item; }

// Ratings of random (user, item) pairs from a hidden rank-8 model plus noise,
// shuffled and split 90/10 into training and held-out sets.
Dataset Generate(int users, int items, int ratings, uint32_t seed) {
  std::mt19937 rng(seed);
  // Each factor ~ N(0, 1/sqrt(rank)), so <p, q> has variance 1.
  std::normal_distribution<float> factor(0.0f, 1.0f / std::sqrt(std::sqrt(float{kTrueRank})));
  std::normal_distribution<float> noise(0.0f, kNoise);
  std::vector<float> p(static_cast<size_t>(users) * kTrueRank),
      q(static_cast<size_t>(items) * kTrueRank);
  for (float& v : p) v = factor(rng);
  for (float& v : q) v = factor(rng);
  std::uniform_int_distribution<uint32_t> user(0, users - 1), item(0, items - 1);
  std::vector<Rating> all(ratings);
  for (Rating& r : all) {
    r.user = user(rng);
    r.item = item(rng);
    float dot = 0;
    for (int k = 0; k < kTrueRank; ++k)
      dot += p[r.user * kTrueRank + k] * q[r.item * kTrueRank + k];
    r.value = dot + noise(rng);
  }
  const size_t held = all.size() / 10;
  Dataset d;
  d.held_out.assign(all.begin(), all.begin() + held);
  d.train.assign(all.begin() + held, all.end());
  return d;
}

float Dot(const float* a, const float* b) {
  float s = 0;
  for (int k = 0; k < kDim; ++k) s += a[k] * b[k];
  return s;
}

// The distinct keys of some ratings, and for each rating the positions of
// its user's and its item's row among them.
struct BatchKeys {
  std::vector<uint64_t> keys;
  std::vector<std::pair<size_t, size_t>> rows;  // per rating: (user row, item row)
};

BatchKeys KeysOf(absl::Span<const Rating> ratings) {
  BatchKeys batch;
  absl::flat_hash_map<uint64_t, size_t> index;
  auto position = [&](uint64_t key) {
    auto [it, inserted] = index.try_emplace(key, batch.keys.size());
    if (inserted) batch.keys.push_back(key);
    return it->second;
  };
  batch.rows.reserve(ratings.size());
  for (const Rating& r : ratings) {
    batch.rows.emplace_back(position(UserKey(r.user)), position(ItemKey(r.item)));
  }
  return batch;
}

// Root mean squared error of `ratings` with the embeddings in `table`
// (a plain Pull: the evaluation runs between epochs, with no worker active).
absl::StatusOr<double> Rmse(const Table& table, absl::Span<const Rating> ratings) {
  const BatchKeys batch = KeysOf(ratings);
  std::vector<float> values(batch.keys.size() * kDim);
  PS_RETURN_IF_ERROR(table.Pull<float>(batch.keys, absl::MakeSpan(values)));
  double squared = 0;
  for (size_t i = 0; i < ratings.size(); ++i) {
    const auto [user, item] = batch.rows[i];
    const double err = Dot(&values[user * kDim], &values[item * kDim]) - ratings[i].value;
    squared += err * err;
  }
  return std::sqrt(squared / std::max<size_t>(1, ratings.size()));
}

struct TrainOptions {
  int batch;
  int clock_every;
  float l2;
};

// One minibatch: Get the rows, compute each row's summed gradient, Add it.
// Returns the number of distinct keys (each was read once and written once).
absl::StatusOr<size_t> Step(KvWorker& worker, absl::Span<const Rating> ratings, float l2) {
  const BatchKeys batch = KeysOf(ratings);
  std::vector<float> values(batch.keys.size() * kDim);
  PS_RETURN_IF_ERROR(worker.Get<float>(batch.keys, absl::MakeSpan(values)));
  std::vector<float> grads(values.size(), 0.0f);
  for (size_t i = 0; i < ratings.size(); ++i) {
    const auto [user, item] = batch.rows[i];
    const float* u = &values[user * kDim];
    const float* v = &values[item * kDim];
    float* gu = &grads[user * kDim];
    float* gv = &grads[item * kDim];
    const float err = Dot(u, v) - ratings[i].value;
    for (int k = 0; k < kDim; ++k) {
      gu[k] += err * v[k] + l2 * u[k];
      gv[k] += err * u[k] + l2 * v[k];
    }
  }
  PS_RETURN_IF_ERROR(worker.Add<float>(batch.keys, grads));
  return batch.keys.size();
}

// One epoch of one worker over its share of the training ratings: a Clock
// after every `clock_every` steps. Adds the keys it moved to `*keys`.
absl::Status TrainShard(KvWorker& worker, absl::Span<const Rating> shard,
                        const TrainOptions& options, uint64_t* keys) {
  int steps = 0;
  for (size_t start = 0; start < shard.size(); start += options.batch) {
    PS_ASSIGN_OR_RETURN(size_t n, Step(worker, shard.subspan(start, options.batch), options.l2));
    *keys += 2 * n;  // read and written
    if (++steps % options.clock_every == 0) PS_RETURN_IF_ERROR(worker.Clock());
  }
  return absl::OkStatus();
}

// Runs one epoch on every worker in parallel; returns the keys moved.
absl::StatusOr<uint64_t> TrainEpoch(std::vector<std::unique_ptr<KvWorker>>& workers,
                                    absl::Span<const Rating> train, const TrainOptions& options) {
  const size_t n = workers.size();
  const size_t share = train.size() / n;  // equal shares keep the clocks in step
  std::vector<absl::Status> results(n);
  std::vector<uint64_t> keys(n, 0);
  std::vector<std::thread> threads;
  for (size_t w = 0; w < n; ++w) {
    threads.emplace_back([&, w] {
      results[w] = TrainShard(*workers[w], train.subspan(w * share, share), options, &keys[w]);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) PS_RETURN_IF_ERROR(s);
  return std::accumulate(keys.begin(), keys.end(), uint64_t{0});
}

pserver::v1::TableConfig EmbeddingConfig(double learning_rate, int staleness, uint64_t capacity) {
  pserver::v1::TableConfig config;
  config.set_dim(kDim);
  config.mutable_initializer()->mutable_normal()->set_stddev(0.1);
  config.mutable_initializer()->set_seed(42);
  config.mutable_optimizer()->mutable_adagrad()->set_learning_rate(learning_rate);
  config.mutable_consistency()->set_model(staleness == 0 ? pserver::v1::Consistency::BSP
                                                         : pserver::v1::Consistency::SSP);
  config.mutable_consistency()->set_staleness(staleness);
  config.mutable_eviction()->set_capacity(capacity);
  return config;
}

// A client of the servers in --connect, or of an embedded cluster started
// into `*cluster` (over gRPC, or in process with --in_process).
absl::StatusOr<std::unique_ptr<Client>> ConnectClient(
    std::unique_ptr<pserver::LocalCluster>* cluster) {
  pserver::ClientOptions options;
  const std::string connect = absl::GetFlag(FLAGS_connect);
  if (!connect.empty()) {
    options.servers = absl::StrSplit(connect, ',', absl::SkipEmpty());
    return Client::Connect(options);
  }
  PS_ASSIGN_OR_RETURN(*cluster, pserver::LocalCluster::Start(absl::GetFlag(FLAGS_servers)));
  options.servers = (*cluster)->addresses();
  if (absl::GetFlag(FLAGS_in_process)) {
    return Client::Create(options,
                          pserver::InProcessTransports(**cluster));
  }
  return Client::Connect(options);
}

absl::Status PrintStats(const Table& table) {
  PS_ASSIGN_OR_RETURN(std::vector<pserver::v1::TableStats> stats, table.Stats());
  for (size_t i = 0; i < stats.size(); ++i) {
    const pserver::v1::TableStats& s = stats[i];
    std::printf(
        "server %zu: %llu rows (%.1f KiB), %llu evictions, %llu keys pulled, "
        "%llu keys pushed\n",
        i, static_cast<unsigned long long>(s.rows()), s.bytes() / 1024.0,
        static_cast<unsigned long long>(s.evictions()),
        static_cast<unsigned long long>(s.keys_pulled()),
        static_cast<unsigned long long>(s.keys_pushed()));
  }
  return absl::OkStatus();
}

absl::Status Run() {
  const bool quick = absl::GetFlag(FLAGS_quick);
  const int num_workers = absl::GetFlag(FLAGS_workers);
  const int staleness = absl::GetFlag(FLAGS_staleness);
  const int epochs = quick ? 8 : absl::GetFlag(FLAGS_epochs);
  const TrainOptions train_options{absl::GetFlag(FLAGS_batch), absl::GetFlag(FLAGS_clock_every),
                                   static_cast<float>(absl::GetFlag(FLAGS_l2))};
  if (num_workers < 1 || epochs < 1 || train_options.batch < 1 || train_options.clock_every < 1 ||
      staleness < 0) {
    return absl::InvalidArgumentError(
        "--workers, --epochs, --batch and --clock_every must be >= 1, --staleness >= 0");
  }
  const Dataset data = quick ? Generate(500, 250, 20000, 7)
                             : Generate(absl::GetFlag(FLAGS_users), absl::GetFlag(FLAGS_items),
                                        absl::GetFlag(FLAGS_ratings), 7);

  std::unique_ptr<pserver::LocalCluster> cluster;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, ConnectClient(&cluster));
  std::printf("cluster: %d servers:", client->num_servers());
  for (const std::string& a : client->addresses()) std::printf(" %s", a.c_str());
  std::printf("\n%zu training and %zu held-out ratings; %d workers, SSP staleness %d\n",
              data.train.size(), data.held_out.size(), num_workers, staleness);

  PS_ASSIGN_OR_RETURN(Table table,
                      Table::Create(*client, "mf_embeddings",
                                    EmbeddingConfig(absl::GetFlag(FLAGS_learning_rate), staleness,
                                                    absl::GetFlag(FLAGS_capacity))));
  std::vector<std::unique_ptr<KvWorker>> workers;
  for (int w = 0; w < num_workers; ++w) {
    PS_ASSIGN_OR_RETURN(auto worker, KvWorker::Join(table, absl::StrCat("worker-", w)));
    workers.push_back(std::move(worker));
  }

  PS_ASSIGN_OR_RETURN(const double initial, Rmse(table, data.held_out));
  PS_ASSIGN_OR_RETURN(const double initial_train, Rmse(table, data.train));
  std::printf("epoch  clock  train_rmse  heldout_rmse     keys/s\n");
  std::printf("%5d  %5lld  %10.4f  %12.4f\n", 0, static_cast<long long>(workers[0]->clock()),
              initial_train, initial);
  double held_out = initial;
  uint64_t total_keys = 0;
  double total_seconds = 0;
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    const absl::Time start = absl::Now();
    PS_ASSIGN_OR_RETURN(const uint64_t keys, TrainEpoch(workers, data.train, train_options));
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    total_keys += keys;
    total_seconds += seconds;
    PS_ASSIGN_OR_RETURN(const double train, Rmse(table, data.train));
    PS_ASSIGN_OR_RETURN(held_out, Rmse(table, data.held_out));
    std::printf("%5d  %5lld  %10.4f  %12.4f  %9.0f\n", epoch,
                static_cast<long long>(workers[0]->clock()), train, held_out, keys / seconds);
    std::fflush(stdout);
  }
  for (auto& worker : workers) PS_RETURN_IF_ERROR(worker->Leave());
  PS_RETURN_IF_ERROR(PrintStats(table));
  std::printf("%.0f keys/s over %.1f s of training (rows read + written by all workers)\n",
              total_keys / total_seconds, total_seconds);
  return pserver::CheckFell("held-out RMSE", initial, held_out, 0.6);
}

}  // namespace

int main(int argc, char** argv) { return pserver::ExampleMain("embeddings", argc, argv, Run); }
