// The sparse ceiling of issue 13: one thread over a 1M-row
// absl::flat_hash_map with rows held inline, no locks, no network. A pull
// copies each key's row out; a push applies SGD to it (a repeated key once
// per listing). The sparse group (sparse_group.cc) times it beside every
// pull and push; bench:table_bench beside SparseTable alone.
//
//   PS_ASSIGN_OR_RETURN(auto ceiling, MakeSparseCeiling(8, 1 << 20, 1e-6f, 1e-3f));
//   ceiling->Run(/*push=*/false, batches, ops);
#ifndef PSERVER_BENCH_SPARSE_CEILING_H_
#define PSERVER_BENCH_SPARSE_CEILING_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace pserver::bench {

class SparseCeiling {
 public:
  virtual ~SparseCeiling() = default;
  virtual void Pull(const std::vector<uint64_t>& keys) = 0;
  virtual void Push(const std::vector<uint64_t>& keys) = 0;

  // `ops` pulls (or pushes) cycling through `batches`.
  void Run(bool push, const std::vector<std::vector<uint64_t>>& batches, int ops) {
    for (int i = 0; i < ops; ++i) {
      const std::vector<uint64_t>& keys = batches[i % batches.size()];
      push ? Push(keys) : Pull(keys);
    }
  }
};

// Rows 0 .. rows - 1 of kDim float32 values; pushes apply `gradient` to
// every value with `learning_rate`.
template <uint32_t kDim>
class FlatMapCeiling : public SparseCeiling {
 public:
  FlatMapCeiling(uint64_t rows, float learning_rate, float gradient)
      : learning_rate_(learning_rate), gradient_(gradient) {
    rows_.reserve(rows);
    for (uint64_t k = 0; k < rows; ++k) {
      Row& row = rows_[k];
      std::fill(row.v, row.v + kDim, 0.001f * static_cast<float>(k % 7));
    }
  }
  void Pull(const std::vector<uint64_t>& keys) override {
    out_.resize(keys.size() * kDim);
    for (size_t i = 0; i < keys.size(); ++i) {
      std::memcpy(out_.data() + i * kDim, rows_.find(keys[i])->second.v, sizeof(Row));
    }
    sink_ = out_[0];  // keeps the gathers
  }
  void Push(const std::vector<uint64_t>& keys) override {
    grads_.resize(keys.size() * kDim, gradient_);
    // A local copy: a member read through `this` could alias the rows, and
    // the loop would reload it for every value instead of vectorizing.
    const float learning_rate = learning_rate_;
    for (size_t i = 0; i < keys.size(); ++i) {
      float* w = rows_.find(keys[i])->second.v;
      const float* g = grads_.data() + i * kDim;
      for (uint32_t c = 0; c < kDim; ++c) w[c] -= learning_rate * g[c];
    }
  }

 private:
  struct Row {
    float v[kDim];
  };
  const float learning_rate_;
  const float gradient_;
  absl::flat_hash_map<uint64_t, Row> rows_;
  std::vector<float> out_, grads_;
  volatile float sink_ = 0;
};

// The ceiling of rows of `dim` values (8 or 64; else INVALID_ARGUMENT).
inline absl::StatusOr<std::unique_ptr<SparseCeiling>> MakeSparseCeiling(uint32_t dim,
                                                                        uint64_t rows,
                                                                        float learning_rate,
                                                                        float gradient) {
  if (dim == 8) return std::make_unique<FlatMapCeiling<8>>(rows, learning_rate, gradient);
  if (dim == 64) return std::make_unique<FlatMapCeiling<64>>(rows, learning_rate, gradient);
  return absl::InvalidArgumentError(absl::StrCat("no sparse ceiling for dim ", dim));
}

}  // namespace pserver::bench

#endif  // PSERVER_BENCH_SPARSE_CEILING_H_
