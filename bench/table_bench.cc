// SparseTable::Pull and Push alone, in this process (no client, no
// transport): CPU nanoseconds per key at the sparse group's shapes (1M rows,
// keys uniform, 8 batches cycled), to tell a table's own cost from the
// transport's in a server profile, and the flat_hash_map ceiling
// (sparse_ceiling.h) on the same keys, timed alternately with the table
// (--rounds times; the least CPU time of each is printed, and the table's
// rate as a share of the ceiling's).
//
//   bazel run -c opt //bench:table_bench -- --dims=8,64 --batches=1024,16384
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "bench/sparse_ceiling.h"
#include "cc/core/memory_budget.h"
#include "cc/core/sparse_table.h"

ABSL_FLAG(std::vector<std::string>, dims, std::vector<std::string>({"8", "64"}), "Table dims.");
ABSL_FLAG(std::vector<std::string>, batches, std::vector<std::string>({"1024", "16384"}),
          "Keys per call.");
ABSL_FLAG(int, keys_per_run, 4 << 20, "Keys pulled (and pushed) per shape and round.");
ABSL_FLAG(int, rounds, 3, "Rounds per shape, table and ceiling alternately.");
ABSL_FLAG(uint64_t, row_budget_bytes, uint64_t{1} << 40,
          "The table's row budget, as --max_table_row_bytes gives a server's tables (every "
          "push reserves and settles its room); 0: none.");

namespace {

constexpr uint64_t kRows = uint64_t{1} << 20;

double CpuSeconds() {
  rusage usage;
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

int Run(uint32_t dim, int batch) {
  pserver::v1::TableConfig config;
  config.set_dim(dim);
  config.mutable_initializer()->mutable_uniform()->set_low(-0.01);
  config.mutable_initializer()->mutable_uniform()->set_high(0.01);
  config.mutable_optimizer()->mutable_sgd()->set_learning_rate(1e-6);
  pserver::SparseTableOptions options;
  if (absl::GetFlag(FLAGS_row_budget_bytes) > 0) {
    options.row_budget =
        std::make_shared<pserver::MemoryBudget>(absl::GetFlag(FLAGS_row_budget_bytes));
  }
  auto table = pserver::SparseTable::Create("bench", config, std::move(options));
  if (!table.ok()) {
    std::fprintf(stderr, "%s\n", table.status().ToString().c_str());
    return 1;
  }
  const size_t row = (*table)->row_bytes();
  {  // every row exists, as in the sparse group
    std::vector<uint64_t> keys(65536);
    const std::string zeros(keys.size() * row, '\0');
    for (uint64_t start = 0; start < kRows; start += keys.size()) {
      std::iota(keys.begin(), keys.end(), start);
      if (!(*table)->Push(keys, zeros).ok()) return 1;
    }
  }
  std::mt19937_64 rng(dim + batch);
  std::vector<std::vector<uint64_t>> batches(8, std::vector<uint64_t>(batch));
  for (auto& b : batches) {
    for (uint64_t& k : b) k = rng() % kRows;
  }
  std::vector<char> out(static_cast<size_t>(batch) * row);
  std::vector<float> grads(static_cast<size_t>(batch) * dim, 1e-3f);
  const absl::string_view grad_bytes(reinterpret_cast<const char*>(grads.data()),
                                    grads.size() * sizeof(float));
  const int calls = std::max(8, absl::GetFlag(FLAGS_keys_per_run) / batch);
  // The ceiling's rows are 0 .. kRows - 1, as the table's.
  absl::StatusOr<std::unique_ptr<pserver::bench::SparseCeiling>> ceiling =
      pserver::bench::MakeSparseCeiling(dim, kRows, 1e-6f, 1e-3f);
  for (bool push : {false, true}) {
    double table_best = 0, ceiling_best = 0;
    for (int round = 0; round < std::max(1, absl::GetFlag(FLAGS_rounds)); ++round) {
      const double begin = CpuSeconds();
      for (int i = 0; i < calls; ++i) {
        const std::vector<uint64_t>& keys = batches[i % batches.size()];
        const absl::Status status = push ? (*table)->Push(keys, grad_bytes)
                                         : (*table)->Pull(keys, absl::MakeSpan(out));
        if (!status.ok()) {
          std::fprintf(stderr, "%s\n", status.ToString().c_str());
          return 1;
        }
      }
      const double table_ns = (CpuSeconds() - begin) / (static_cast<double>(calls) * batch) * 1e9;
      table_best = round == 0 ? table_ns : std::min(table_best, table_ns);
      if (!ceiling.ok()) continue;
      const double ceiling_begin = CpuSeconds();
      (*ceiling)->Run(push, batches, calls);
      const double ceiling_ns =
          (CpuSeconds() - ceiling_begin) / (static_cast<double>(calls) * batch) * 1e9;
      ceiling_best = round == 0 ? ceiling_ns : std::min(ceiling_best, ceiling_ns);
    }
    std::printf("%s dim %u batch %d: %.1f CPU ns per key", push ? "push" : "pull", dim, batch,
                table_best);
    if (ceiling.ok()) {
      std::printf("; ceiling %.1f ns per key; table at %.0f%% of the ceiling", ceiling_best,
                  100 * ceiling_best / table_best);
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  for (const std::string& d : absl::GetFlag(FLAGS_dims)) {
    for (const std::string& b : absl::GetFlag(FLAGS_batches)) {
      uint32_t dim;
      int batch;
      if (!absl::SimpleAtoi(d, &dim) || !absl::SimpleAtoi(b, &batch) || batch <= 0) {
        std::fprintf(stderr, "bad --dims or --batches: %s, %s\n", d.c_str(), b.c_str());
        return 2;
      }
      if (const int failed = Run(dim, batch); failed != 0) return failed;
    }
  }
  return 0;
}
