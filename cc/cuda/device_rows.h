// DeviceRows: rows of `dim` float32 values addressed by index, with the
// per-row optimizer state of cc/core's RowOptimizer (row_optimizer.h), held
// in GPU memory: gather rows into a contiguous buffer, and scatter-apply
// gradients (duplicates summed in double, in the order listed, then each
// distinct row's optimizer once) — the device half of a sparse table.
// Mapping keys to row indices (and eviction) stays with the caller.
//
//   v1::RowOptimizer config;
//   config.mutable_adagrad()->set_learning_rate(0.05);
//   PS_ASSIGN_OR_RETURN(auto rows, DeviceRows::Create(config, /*dim=*/64,
//                                                    /*num_rows=*/1 << 20, /*device=*/0));
//   PS_RETURN_IF_ERROR(rows->WriteRows({3, 9}, initial_values));     // host floats
//   PS_RETURN_IF_ERROR(rows->Gather({9, 3, 9}, out));                // device buffer
//   PS_RETURN_IF_ERROR(rows->ScatterApply({9, 3, 9}, grads, v1::FLOAT16));
//
// Rules and defaults are RowOptimizer's (sgd, adagrad, adam, add; ftrl stays
// on the host: UNIMPLEMENTED). Every update is computed in double and
// rounded to float once per stored value, as on the host; Adam's bias
// corrections use the device's pow (within 2 ulp of the host's in double),
// so results agree with the host to within one float rounding.
//
// Not thread-safe: the caller serializes calls on one DeviceRows.
#ifndef PSERVER_CC_CUDA_DEVICE_ROWS_H_
#define PSERVER_CC_CUDA_DEVICE_ROWS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "cc/core/element_type.h"
#include "cc/core/row_optimizer.h"
#include "cc/cuda/buffer.h"
#include "pserver/v1/table.pb.h"

namespace pserver {
namespace cuda {

class DeviceRows {
 public:
  // `num_rows` rows, zero values, state as RowOptimizer::InitState, steps 0.
  // Errors are prefixed with `what` (e.g. "table 'emb'"): INVALID_ARGUMENT
  // for a bad config or dim 0, UNIMPLEMENTED for ftrl, UNAVAILABLE without a
  // device, RESOURCE_EXHAUSTED if the rows do not fit.
  static absl::StatusOr<std::unique_ptr<DeviceRows>> Create(const v1::RowOptimizer& config,
                                                            uint32_t dim, uint32_t num_rows,
                                                            int device = 0,
                                                            absl::string_view what = "device rows");

  uint32_t dim() const { return dim_; }
  uint32_t num_rows() const { return num_rows_; }
  uint32_t state_per_row() const { return optimizer_.state_per_row(dim_); }
  const char* optimizer_name() const { return optimizer_.name(); }
  int device() const { return device_; }

  // Sets rows[k] to values[k * dim .. (k+1) * dim) (host floats), its state
  // to the initial state and its step count to 0 (a new row).
  absl::Status WriteRows(absl::Span<const uint32_t> rows, const float* values);

  // out[k * dim + i] = row rows[k] value i; `out` (device) holds at least
  // rows.size() * dim floats. Duplicates allowed.
  absl::Status Gather(absl::Span<const uint32_t> rows, DeviceBuffer& out,
                      const Stream* stream = nullptr);

  // `grads` (device): rows.size() * dim values of `grad_type` (FLOAT32,
  // FLOAT16 or BFLOAT16), gradient k for rows[k]. Gradients of a row listed
  // more than once are summed, then each distinct row is updated once and
  // its step count goes up by one.
  absl::Status ScatterApply(absl::Span<const uint32_t> rows, const DeviceBuffer& grads,
                            ElementType grad_type, const Stream* stream = nullptr);

  // Copies rows to the host (checkpoints, tests; one copy per row, not a hot
  // path): values rows.size() * dim floats, state rows.size() *
  // state_per_row() floats, steps rows.size() counts; null ones are skipped.
  absl::Status ReadRows(absl::Span<const uint32_t> rows, float* values, float* state,
                        uint64_t* steps) const;

 private:
  DeviceRows(RowOptimizer optimizer, std::string what) : optimizer_(optimizer), what_(what) {}
  absl::Status CheckRows(absl::Span<const uint32_t> rows) const;
  // Uploads `words` uint32 values into index_scratch_ (grown as needed).
  absl::Status UploadIndices(absl::Span<const uint32_t> words, const Stream* stream);

  const RowOptimizer optimizer_;
  const std::string what_;
  v1::RowOptimizer config_;
  uint32_t dim_ = 0;
  uint32_t num_rows_ = 0;
  int device_ = 0;
  DeviceBuffer values_;  // num_rows * dim floats
  DeviceBuffer state_;   // num_rows * state_per_row floats
  DeviceBuffer steps_;   // num_rows uint64
  DeviceBuffer index_scratch_;
};

}  // namespace cuda
}  // namespace pserver

#endif  // PSERVER_CC_CUDA_DEVICE_ROWS_H_
