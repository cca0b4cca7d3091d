#include "sparse_group.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cc/client/table.h"
#include "cc/core/status_macros.h"
#include "bench/sparse_ceiling.h"

ABSL_FLAG(bool, sparse_grpc, true, "The sparse group measures pserver processes over gRPC.");
ABSL_FLAG(bool, sparse_embedded, true, "The sparse group measures the in-process cluster.");
ABSL_FLAG(std::vector<std::string>, sparse_batches, std::vector<std::string>({"1024", "16384"}),
          "Keys per operation in the sparse group (comma-separated).");
ABSL_FLAG(std::vector<std::string>, sparse_dims, std::vector<std::string>({"8", "64"}),
          "Table dims in the sparse group (comma-separated; 8 and 64 have a ceiling).");
ABSL_FLAG(std::vector<std::string>, sparse_in_flight, std::vector<std::string>({"1", "4"}),
          "Calls each worker keeps in flight in the sparse group (comma-separated): 1 is the "
          "blocking Pull/Push (results pull, push); k > 1 keeps k PullAsync/PushAsync tickets "
          "in flight per worker (results pull_async, push_async, extra in_flight = k).");

namespace pserver::bench {
namespace {

constexpr double kGB = 1e9;
// Keys are drawn uniformly from [0, 2^20): the table holds 1M rows, and a
// batch of 16384 keys repeats about 0.8% of its keys.
constexpr uint64_t kSparseKeySpace = uint64_t{1} << 20;
constexpr int kBatchesPerWorker = 8;  // cycled through, so no two ops in a row repeat
constexpr float kLearningRate = 1e-6f;
constexpr float kGradient = 1e-3f;
constexpr int kMaxSparseInFlight = 64;  // --sparse_in_flight: each call holds a batch's rows

std::vector<std::vector<uint64_t>> UniformKeyBatches(int count, int batch, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint64_t> key(0, kSparseKeySpace - 1);
  std::vector<std::vector<uint64_t>> batches(count, std::vector<uint64_t>(batch));
  for (auto& b : batches) {
    for (uint64_t& k : b) k = key(rng);
  }
  return batches;
}

// Worker w's batches of `batch` keys on the table of `dim`.
std::vector<std::vector<uint64_t>> WorkerBatches(int w, uint32_t dim, int batch) {
  return UniformKeyBatches(kBatchesPerWorker, batch, 1000 * w + dim + batch);
}

v1::TableConfig SparseConfig(uint32_t dim) {
  v1::TableConfig config;
  config.set_dim(dim);
  config.mutable_initializer()->mutable_uniform()->set_low(-0.01);
  config.mutable_initializer()->mutable_uniform()->set_high(0.01);
  config.mutable_optimizer()->mutable_sgd()->set_learning_rate(kLearningRate);
  return config;
}

// Pushes a zero gradient to every key of the key space (a pull creates no
// row), so that the timed pulls and pushes read and update rows rather than
// read the initializer or create rows.
absl::Status Populate(const Table& table) {
  constexpr uint64_t kChunk = 65536;
  std::vector<uint64_t> keys(kChunk);
  const std::vector<char> zeros(kChunk * table.row_bytes(), 0);
  for (uint64_t start = 0; start < kSparseKeySpace; start += kChunk) {
    std::iota(keys.begin(), keys.end(), start);
    PS_RETURN_IF_ERROR(table.Push(keys, absl::string_view(zeros.data(), zeros.size())));
  }
  return absl::OkStatus();
}

// Operations per repetition for `keys` keys per round of all workers.
int SparseOpsFor(const Harness& h, uint64_t keys) {
  const uint64_t target = h.quick() ? 256 * 1024 : 2 * 1024 * 1024;
  return static_cast<int>(std::clamp<uint64_t>(target / keys, 4, 2000));
}

void DescribeSparse(Result& r, uint32_t dim, int batch) {
  r.set_payload_bytes(static_cast<uint64_t>(batch) * dim * sizeof(float));
  auto& extra = *r.mutable_extra();
  extra["dim"] = dim;
  extra["batch_keys"] = batch;
  extra["payload_GBps"] = r.value().median() * dim * sizeof(float) / kGB;
}

// keys/s of `ops` operations of `ceiling` cycling through `batches`.
double CeilingRate(SparseCeiling& ceiling, bool push,
                   const std::vector<std::vector<uint64_t>>& batches, int ops) {
  const double begin = NowSeconds();
  ceiling.Run(push, batches, ops);
  return static_cast<double>(batches[0].size()) * ops / (NowSeconds() - begin);
}

absl::StatusOr<std::unique_ptr<SparseCeiling>> MakeCeiling(uint32_t dim) {
  return MakeSparseCeiling(dim, kSparseKeySpace, kLearningRate, kGradient);
}

using Ceilings = std::map<uint32_t, std::unique_ptr<SparseCeiling>>;

// The ceiling_pull and ceiling_push rows at `dim`, one per batch size.
absl::Status MeasureCeiling(Harness& h, uint32_t dim, SparseCeiling& ceiling,
                            const std::vector<int>& batches) {
  for (int batch : batches) {
    const std::vector<std::vector<uint64_t>> keys = WorkerBatches(0, dim, batch);
    for (bool push : {false, true}) {
      Result& r = h.Add("sparse", push ? "ceiling_push" : "ceiling_pull");
      r.set_servers(0);
      r.set_workers(1);
      PS_RETURN_IF_ERROR(h.Measure(&r, "keys/s", [&]() -> absl::StatusOr<double> {
        return CeilingRate(ceiling, push, keys, SparseOpsFor(h, batch));
      }));
      DescribeSparse(r, dim, batch);
    }
  }
  return absl::OkStatus();
}

// CPU seconds the processes `pids` used so far, together.
double ServersCpuSeconds(const std::vector<pid_t>& pids) {
  double seconds = 0;
  for (pid_t pid : pids) seconds += ProcessCpuSeconds(pid);
  return seconds;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// A sparse op as the group measures it: `in_flight` calls per worker.
struct Kind {
  std::string name;  // pull | push
  int in_flight;
  bool push;
  std::function<absl::Status(int worker)> op;
};

absl::Span<char> Bytes(std::vector<float>& v) {
  return absl::Span<char>(reinterpret_cast<char*>(v.data()), v.size() * sizeof(float));
}
absl::string_view View(const std::vector<float>& v) {
  return absl::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// One worker's calls in flight: a ring of k tickets, each slot with its own
// output (a pull's ticket borrows it until done).
class InFlight {
 public:
  // Issues the next of `ops` calls (`start(slot's output)`), first waiting
  // for the call k places back; the last one waits for all.
  absl::Status Next(int k, int ops, size_t floats,
                    const std::function<Ticket(std::vector<float>&)>& start) {
    if (slots_.size() != static_cast<size_t>(k)) {
      PS_RETURN_IF_ERROR(Drain());
      slots_.assign(k, Slot());
      issued_ = 0;
    }
    Slot& slot = slots_[issued_ % k];
    if (slot.ticket.has_value()) {
      absl::Status status = slot.ticket->Wait();
      slot.ticket.reset();
      PS_RETURN_IF_ERROR(status);
    }
    slot.out.resize(floats);
    slot.ticket = start(slot.out);
    if (++issued_ % ops == 0) return Drain();
    return absl::OkStatus();
  }

  // Waits for every call in flight; the first failure.
  absl::Status Drain() {
    absl::Status first;
    for (Slot& slot : slots_) {
      if (!slot.ticket.has_value()) continue;
      first.Update(slot.ticket->Wait());
      slot.ticket.reset();
    }
    return first;
  }

 private:
  struct Slot {
    std::optional<Ticket> ticket;
    std::vector<float> out;
  };
  std::vector<Slot> slots_;
  int issued_ = 0;
};

// Pull and push of `batches` keys per operation on a table of each dim, by
// every client (one worker each) on its own keys, with each of `in_flight`
// calls in flight per worker. Results are named `prefix` + pull/push (one
// call at a time, blocking) or + pull_async/push_async (k > 1 tickets in
// flight, extra["in_flight"] = k); the unit is keys per second over all
// workers. Each
// repetition first times the ceiling on worker 0's keys, so that the ratio
// (the median of the repetitions' ratios) compares moments of equal load.
absl::Status SparseOps(Harness& h, const SparseEnv& env, const std::string& prefix,
                       std::vector<std::unique_ptr<Client>>& clients,
                       const std::vector<pid_t>& server_pids, int servers,
                       const std::vector<uint32_t>& dims, const std::vector<int>& batches,
                       const std::vector<int>& in_flight, const Ceilings& ceilings) {
  const int workers = static_cast<int>(clients.size());
  for (uint32_t dim : dims) {
    const std::string name = absl::StrCat("sparse_d", dim);
    std::vector<Table> tables;
    for (auto& c : clients) {  // the first creates it, the others open it
      PS_ASSIGN_OR_RETURN(Table t, Table::Create(*c, name, SparseConfig(dim)));
      tables.push_back(std::move(t));
    }
    PS_RETURN_IF_ERROR(Populate(tables[0]));
    SparseCeiling& ceiling = *ceilings.at(dim);
    for (int batch : batches) {
      std::vector<std::vector<std::vector<uint64_t>>> keys;
      std::vector<std::vector<float>> grads, outs;
      for (int w = 0; w < workers; ++w) {
        keys.push_back(WorkerBatches(w, dim, batch));
        grads.emplace_back(static_cast<size_t>(batch) * dim, kGradient);
        outs.emplace_back(static_cast<size_t>(batch) * dim);
      }
      std::vector<int> next(workers, 0);
      auto keys_of = [&](int w) -> const std::vector<uint64_t>& {
        return keys[w][next[w]++ % kBatchesPerWorker];
      };
      // Calls in flight per worker: slot s of worker w holds its ticket and,
      // for pulls, its own output (a ticket borrows it until done).
      const int ops = SparseOpsFor(h, static_cast<uint64_t>(batch) * workers);
      std::vector<InFlight> windows(workers);
      std::vector<Kind> kinds;
      for (int k : in_flight) {
        for (bool push : {false, true}) {
          Kind kind{push ? "push" : "pull", k, push, nullptr};
          if (k == 1 && push) {
            kind.op = [&](int w) {
              return tables[w].Push<float>(keys_of(w), absl::MakeConstSpan(grads[w]));
            };
          } else if (k == 1) {
            kind.op = [&](int w) {
              return tables[w].Pull<float>(keys_of(w), absl::MakeSpan(outs[w]));
            };
          } else {
            kind.op = [&, k, push](int w) {
              const Table& table = tables[w];
              const std::vector<uint64_t>& batch_keys = keys_of(w);
              return windows[w].Next(k, ops, static_cast<size_t>(batch) * dim,
                                     [&](std::vector<float>& out) {
                                       return push ? table.PushAsync(batch_keys, View(grads[w]))
                                                   : table.PullAsync(batch_keys, Bytes(out));
                                     });
            };
          }
          kinds.push_back(std::move(kind));
        }
      }
      for (const Kind& kind : kinds) {
        const std::string& op_name = kind.name;
        const auto& op = kind.op;
        Result& r = h.Add("sparse", prefix + op_name + (kind.in_flight > 1 ? "_async" : ""));
        r.set_servers(servers);
        r.set_workers(workers);
        std::vector<double> ratios;
        double client_cpu = 0, server_cpu = 0, moved = 0;
        PS_RETURN_IF_ERROR(h.Measure(&r, "keys/s", [&]() -> absl::StatusOr<double> {
          const double ceiling_rate =
              CeilingRate(ceiling, kind.push, keys[0], SparseOpsFor(h, batch));
          const double client_before = SelfCpuSeconds();
          const double server_before = ServersCpuSeconds(server_pids);
          absl::StatusOr<double> run = env.run_workers(workers, ops, op);
          // Tickets still in flight (after a failure) borrow this scope's buffers.
          for (InFlight& window : windows) window.Drain().IgnoreError();
          PS_ASSIGN_OR_RETURN(double seconds, run);
          client_cpu += SelfCpuSeconds() - client_before;
          server_cpu += ServersCpuSeconds(server_pids) - server_before;
          moved += static_cast<double>(batch) * workers * ops;
          const double rate = static_cast<double>(batch) * workers * ops / seconds;
          ratios.push_back(rate / ceiling_rate);
          return rate;
        }));
        DescribeSparse(r, dim, batch);
        (*r.mutable_extra())["client_cpu_ns_per_key"] = client_cpu / moved * 1e9;
        (*r.mutable_extra())["server_cpu_ns_per_key"] = server_cpu / moved * 1e9;
        (*r.mutable_extra())["in_flight"] = kind.in_flight;
        // Without the warm-up repetitions.
        ratios.erase(ratios.begin(),
                     ratios.begin() + std::min<size_t>(ratios.size(), h.options().warmup));
        r.set_ceiling("ceiling_" + op_name);
        r.set_ratio(Median(ratios));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SparseGroup(Harness& h, const SparseEnv& env) {
  std::vector<uint32_t> dims;
  std::vector<int> batches;
  for (const std::string& d : absl::GetFlag(FLAGS_sparse_dims)) {
    uint32_t dim;
    if (!absl::SimpleAtoi(d, &dim)) return absl::InvalidArgumentError("bad --sparse_dims: " + d);
    dims.push_back(dim);
  }
  for (const std::string& b : absl::GetFlag(FLAGS_sparse_batches)) {
    int batch;
    if (!absl::SimpleAtoi(b, &batch) || batch <= 0) {
      return absl::InvalidArgumentError("bad --sparse_batches: " + b);
    }
    batches.push_back(batch);
  }
  std::vector<int> in_flight;
  for (const std::string& k : absl::GetFlag(FLAGS_sparse_in_flight)) {
    int calls;
    if (!absl::SimpleAtoi(k, &calls) || calls <= 0 || calls > kMaxSparseInFlight) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad --sparse_in_flight: ", k, " (calls in flight per worker, 1..", kMaxSparseInFlight,
          ")"));
    }
    in_flight.push_back(calls);
  }
  const std::vector<std::pair<int, int>> configs = {{1, 1}, {2, 2}};
  Ceilings ceilings;
  for (uint32_t dim : dims) {
    PS_ASSIGN_OR_RETURN(ceilings[dim], MakeCeiling(dim));
    PS_RETURN_IF_ERROR(MeasureCeiling(h, dim, *ceilings[dim], batches));
  }
  for (bool embedded : {false, true}) {
    if (!absl::GetFlag(embedded ? FLAGS_sparse_embedded : FLAGS_sparse_grpc)) continue;
    for (const auto& [servers, workers] : configs) {
      if (embedded && h.quick() && servers > 1) continue;
      PS_ASSIGN_OR_RETURN(SparseCluster cluster, env.start(servers, workers, embedded));
      PS_RETURN_IF_ERROR(SparseOps(h, env, embedded ? "embedded_" : "", cluster.clients,
                                   cluster.server_pids, servers, dims, batches, in_flight,
                                   ceilings));
    }
  }
  h.PrintGroup("sparse");
  return absl::OkStatus();
}

}  // namespace pserver::bench
