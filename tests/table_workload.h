// The table workload the live move tests train (tests/live_move_tables_test.cc,
// tests/move_failover_test.cc): a sparse table with Adam ("emb") that every
// step pushes a gradient for each of its keys to, and a BSP KV table ("kv")
// on which two workers add, tick their clocks and read at each step (a read
// that waits for the other worker's clock on the servers). Every value is
// exact: the KV adds are multiples of 1/4, and the reference for "emb" is a
// SparseTable in the test's process fed the same pushes (a run without
// moves, kills or restarts).
#ifndef PSERVER_TESTS_TABLE_WORKLOAD_H_
#define PSERVER_TESTS_TABLE_WORKLOAD_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cc/client/table.h"
#include "cc/core/placement.h"
#include "cc/core/sparse_table.h"
#include "cc/core/status_macros.h"
#include "pserver/v1/table.pb.h"

namespace pserver {
namespace testing {

inline constexpr uint32_t kEmbDim = 4;
inline constexpr uint32_t kKvDim = 2;
inline constexpr int kEmbKeys = 1024;
inline constexpr int kKvKeys = 256;

// Half sequential ids, half spread over 64 bits.
inline std::vector<uint64_t> EmbKeys() {
  std::vector<uint64_t> keys;
  for (int i = 0; i < kEmbKeys / 2; ++i) keys.push_back(static_cast<uint64_t>(i));
  for (int i = 0; i < kEmbKeys / 2; ++i) keys.push_back(Mix64(0x1234 + i));
  return keys;
}

inline std::vector<uint64_t> KvKeys() {
  std::vector<uint64_t> keys;
  for (int i = 0; i < kKvKeys; ++i) keys.push_back(1000 + static_cast<uint64_t>(i));
  return keys;
}

inline v1::TableConfig EmbConfig() {
  v1::TableConfig config;
  config.set_dim(kEmbDim);
  config.mutable_initializer()->mutable_normal()->set_stddev(0.1);
  config.mutable_initializer()->set_seed(7);
  config.mutable_optimizer()->mutable_adam()->set_learning_rate(0.01);
  return config;
}

inline v1::TableConfig KvConfig() {
  v1::TableConfig config;
  config.set_dim(kKvDim);
  config.mutable_optimizer()->mutable_add();
  config.mutable_consistency()->set_model(v1::Consistency::BSP);
  return config;
}

inline std::vector<float> EmbGrads(int step) {
  std::vector<float> g(kEmbKeys * kEmbDim);
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.25f * static_cast<float>((i + step) % 5) - 0.5f;
  return g;
}

// Worker w's add at clock c: multiples of 1/4, so every sum is exact.
inline std::vector<float> KvAdd(int worker, int clock) {
  std::vector<float> a(kKvKeys * kKvDim);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = 0.25f * static_cast<float>((i + clock + 3 * worker) % 4);
  }
  return a;
}

// The KV values a read at clock c sees under BSP: every add of clocks < c.
inline std::vector<float> KvAt(int clock) {
  std::vector<float> v(kKvKeys * kKvDim, 0.0f);
  for (int c = 0; c < clock; ++c) {
    for (int w = 0; w < 2; ++w) {
      const std::vector<float> a = KvAdd(w, c);
      for (size_t i = 0; i < v.size(); ++i) v[i] += a[i];
    }
  }
  return v;
}

// One step: a push of every embedding key; on the KV table, w0 adds and
// ticks, reads at its new clock (a read that waits for w1 on the servers),
// w1 adds and ticks, and the read must see exactly the adds of every
// earlier clock.
inline absl::Status TableStep(int step, const Table& emb, KvWorker& w0, KvWorker& w1) {
  const std::vector<uint64_t> emb_keys = EmbKeys();
  PS_RETURN_IF_ERROR(emb.Push<float>(emb_keys, EmbGrads(step)));
  const std::vector<uint64_t> kv_keys = KvKeys();
  PS_RETURN_IF_ERROR(w0.Add<float>(kv_keys, KvAdd(0, step)));
  PS_RETURN_IF_ERROR(w0.Clock());
  std::vector<float> read(kKvKeys * kKvDim);
  Ticket waiting = w0.GetAsync(
      kv_keys, absl::Span<char>(reinterpret_cast<char*>(read.data()), read.size() * 4));
  PS_RETURN_IF_ERROR(w1.Add<float>(kv_keys, KvAdd(1, step)));
  PS_RETURN_IF_ERROR(w1.Clock());
  PS_RETURN_IF_ERROR(waiting.Wait(absl::Seconds(120)));
  if (read != KvAt(step + 1)) {
    return absl::InternalError(absl::StrCat("w0's BSP read at clock ", step + 1,
                                            " does not see exactly the adds before it"));
  }
  return absl::OkStatus();
}

// A table row as a checkpoint holds it: values, optimizer state, step count.
struct TableRow {
  std::string values, state;
  uint64_t step = 0;
  bool operator==(const TableRow& o) const {
    return values == o.values && state == o.state && step == o.step;
  }
};

// The rows of a table's checkpoint section ("table/<name>"), by key.
inline std::map<uint64_t, TableRow> RowsOf(const v1::SparseTableSnapshot& snap) {
  std::map<uint64_t, TableRow> rows;
  const size_t row_bytes = snap.values().size() / std::max<uint64_t>(1, snap.rows());
  const size_t state_bytes = snap.state().size() / std::max<uint64_t>(1, snap.rows());
  for (uint64_t r = 0; r < snap.rows(); ++r) {
    uint64_t key, step;
    std::memcpy(&key, snap.keys().data() + r * 8, 8);
    std::memcpy(&step, snap.steps().data() + r * 8, 8);
    rows[key] = {snap.values().substr(r * row_bytes, row_bytes),
                 snap.state().substr(r * state_bytes, state_bytes), step};
  }
  return rows;
}

// "emb" as a run without moves holds it: a SparseTable fed the pushes of
// steps 0, 1, ... (AdvanceTo).
class ReferenceEmb {
 public:
  static absl::StatusOr<ReferenceEmb> Create() {
    PS_ASSIGN_OR_RETURN(std::unique_ptr<SparseTable> table, SparseTable::Create("emb", EmbConfig()));
    return ReferenceEmb(std::move(table));
  }
  // Applies the pushes of steps up to `steps` - 1.
  absl::Status AdvanceTo(int steps) {
    const std::vector<uint64_t> keys = EmbKeys();
    for (; steps_ < steps; ++steps_) {
      const std::vector<float> grads = EmbGrads(steps_);
      PS_RETURN_IF_ERROR(table_->Push(
          keys, absl::string_view(reinterpret_cast<const char*>(grads.data()), grads.size() * 4)));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::map<uint64_t, TableRow>> Rows() const {
    v1::SparseTableSnapshot snap;
    if (!snap.ParseFromString(table_->Serialize())) {
      return absl::DataLossError("the reference table's snapshot does not parse");
    }
    return RowsOf(snap);
  }
  // The values of every EmbKeys() row, in that order (what a Pull returns).
  absl::StatusOr<std::string> ValuesInKeyOrder() const {
    PS_ASSIGN_OR_RETURN(const auto rows, Rows());
    std::string values;
    for (uint64_t key : EmbKeys()) values += rows.at(key).values;
    return values;
  }
  // Values and optimizer state of every row.
  uint64_t bytes() const {
    return uint64_t{kEmbKeys} * (kEmbDim + table_->state_per_row()) * sizeof(float);
  }

 private:
  explicit ReferenceEmb(std::unique_ptr<SparseTable> table) : table_(std::move(table)) {}
  std::unique_ptr<SparseTable> table_;
  int steps_ = 0;
};

}  // namespace testing
}  // namespace pserver

#endif  // PSERVER_TESTS_TABLE_WORKLOAD_H_
