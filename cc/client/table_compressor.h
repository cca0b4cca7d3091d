// The trainer's side of a sparse table's compression on the wire
// (TableConfig.wire_compression): pushed gradient rows cut to the top-k rows
// with error feedback (cc/core/row_error_feedback.h) and/or narrowed to
// float16/bfloat16, pulled rows widened back to float32. The table keeps
// float32; Table calls this at its one encode and one decode point.
//
//   std::shared_ptr<TableCompressor> c = TableCompressor::For(config);  // null: none
//   TableCompressor::Encoded push = c->EncodePush(keys, grads);
//   // send push.keys, push.values (c->wire_type(), c->wire_row_bytes() a row)
//
// Residuals: one float32 row per key pushed and not yet sent, at most
// wire_compression.max_residual_rows (default 1,048,576) per table handle
// and its copies; past it the least recently pushed rows are dropped. A
// push is encoded once: retries resend the same bytes (exactly-once), and a
// push that fails loses what it carried, as an uncompressed one would.
// Thread-safe; pushes through one handle encode one at a time.
#ifndef PSERVER_CC_CLIENT_TABLE_COMPRESSOR_H_
#define PSERVER_CC_CLIENT_TABLE_COMPRESSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "cc/core/element_type.h"
#include "cc/core/row_error_feedback.h"
#include "pserver/v1/table.pb.h"

namespace pserver {

class TableCompressor {
 public:
  // Residual rows kept when max_residual_rows is 0.
  static constexpr uint64_t kDefaultMaxResidualRows = uint64_t{1} << 20;

  // The compressor of a float32 table whose config compresses; nullptr if
  // it compresses nothing. The config must have passed
  // ValidateWireCompressionFor.
  static std::shared_ptr<TableCompressor> For(const v1::TableConfig& config);

  // What a push sends: the keys (top-k: the rows chosen) and their rows in
  // wire_type().
  struct Encoded {
    std::vector<uint64_t> keys;
    std::string values;
  };
  // `grads`: keys.size() float32 rows (checked by the caller).
  Encoded EncodePush(absl::Span<const uint64_t> keys, absl::string_view grads);

  // The float32 rows of a pull reply whose values came as `content_type`
  // (unset or FLOAT32: as they are, else widened into *widened). DATA_LOSS
  // naming `what` for another type or a partial value.
  // The result views `values` or `*widened`.
  absl::StatusOr<absl::string_view> DecodePull(ElementType content_type, absl::string_view values,
                                               std::string* widened,
                                               const std::string& what) const;

  ElementType wire_type() const { return wire_type_; }  // FLOAT32: as stored
  size_t wire_row_bytes() const { return dim_ * ElementSize(wire_type_); }

  // Residual rows kept and dropped (tests, stats).
  size_t residual_rows() const;
  uint64_t dropped_rows() const;

 private:
  TableCompressor(const v1::WireCompression& config, size_t dim);

  const v1::WireCompression config_;
  const size_t dim_;
  const ElementType wire_type_;
  const bool topk_;
  mutable absl::Mutex mu_;
  RowErrorFeedback feedback_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_TABLE_COMPRESSOR_H_
