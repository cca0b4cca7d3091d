// Top-k with error feedback for the pushes of a sparse table
// (TableConfig.wire_compression): a trainer keeps one float32 residual per
// row it pushed, adds each push's gradient rows to it and sends only the k
// rows with the largest L2 norm; what it does not send now it sends later.
//
//   RowErrorFeedback feedback(/*dim=*/16, /*max_rows=*/1 << 20);
//   SelectedRows sent = feedback.AddAndSelect(keys, grads, k);
//   // push sent.keys with sent.values (dim floats per key)
//
// Memory is bounded: at most max_rows residual rows (dim floats each, plus
// about 64 bytes); past it the least recently pushed rows are dropped and
// their residual is lost (counted in dropped_rows()). A row sent or left at
// zero is not kept. Thread-compatible.
#ifndef PSERVER_CC_CORE_ROW_ERROR_FEEDBACK_H_
#define PSERVER_CC_CORE_ROW_ERROR_FEEDBACK_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

namespace pserver {

// What a top-k table push sends: distinct keys and their rows (dim float32
// values each, in the order of `keys`).
struct SelectedRows {
  std::vector<uint64_t> keys;
  std::vector<float> values;
};

class RowErrorFeedback {
 public:
  // Residual rows of `dim` floats, at most `max_rows` (at least 1) of them.
  RowErrorFeedback(size_t dim, size_t max_rows);

  // For each distinct key of `keys` (row i of `grads` is dim floats at
  // grads + i * dim; rows of a repeated key are summed): residual[key] +=
  // row. Then takes the k rows of those keys with the largest L2 norm
  // (ties: the key seen first in `keys`), returns them in the order their
  // keys were first seen and forgets their residual (and that of rows left
  // at zero). Then drops the least
  // recently pushed rows beyond max_rows.
  SelectedRows AddAndSelect(absl::Span<const uint64_t> keys, const float* grads, size_t k);

  // Distinct keys of `keys` (what k is a fraction of).
  static size_t DistinctKeys(absl::Span<const uint64_t> keys);

  size_t dim() const { return dim_; }
  size_t rows() const { return rows_.size(); }             // residual rows kept
  uint64_t dropped_rows() const { return dropped_rows_; }  // lost to max_rows
  // The residual of `key` (dim floats), or nullptr if none is kept.
  const float* ResidualOf(uint64_t key) const;

 private:
  struct Row {
    uint64_t key;
    std::vector<float> residual;
  };
  using RowList = std::list<Row>;  // most recently pushed first

  // The row of `key`, created zero if new, moved to the front.
  RowList::iterator Touch(uint64_t key);
  void Forget(RowList::iterator row);
  void DropOldest();

  size_t dim_;
  size_t max_rows_;
  RowList lru_;
  absl::flat_hash_map<uint64_t, RowList::iterator> rows_;
  uint64_t dropped_rows_ = 0;
};

}  // namespace pserver

#endif  // PSERVER_CC_CORE_ROW_ERROR_FEEDBACK_H_
