#include "cc/cuda/device_rows.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/core/status_macros.h"
#include "cc/cuda/cuda_status.h"
#include "cc/cuda/kernels.h"
#include "cc/cuda/plan.h"
#include "cc/cuda/runtime.h"

namespace pserver {
namespace cuda {

absl::StatusOr<std::unique_ptr<DeviceRows>> DeviceRows::Create(const v1::RowOptimizer& config,
                                                               uint32_t dim, uint32_t num_rows,
                                                               int device, absl::string_view what) {
  PS_ASSIGN_OR_RETURN(RowOptimizer optimizer, RowOptimizer::Create(config, what));
  if (optimizer.kind() == RowOptimizer::Kind::kFtrl) {
    return absl::UnimplementedError(absl::StrCat(
        what,
        ": row optimizer ftrl does not run on a CUDA device (sgd, adagrad, adam and add "
        "do); keep this table in host memory"));
  }
  if (dim == 0) return absl::InvalidArgumentError(absl::StrCat(what, ": dim must be > 0"));
  std::unique_ptr<DeviceRows> rows(new DeviceRows(optimizer, std::string(what)));
  rows->config_ = config;
  rows->dim_ = dim;
  rows->num_rows_ = num_rows;
  rows->device_ = device;
  PS_RETURN_IF_ERROR(
      CudaStatus(rt::SetDevice(device), absl::StrCat(what, ": cudaSetDevice(", device, ")")));
  const size_t n = static_cast<size_t>(num_rows);
  PS_ASSIGN_OR_RETURN(rows->values_, DeviceBuffer::Allocate(device, n * dim * sizeof(float)));
  PS_ASSIGN_OR_RETURN(rows->state_,
                      DeviceBuffer::Allocate(device, n * rows->state_per_row() * sizeof(float)));
  PS_ASSIGN_OR_RETURN(rows->steps_, DeviceBuffer::Allocate(device, n * sizeof(uint64_t)));
  PS_RETURN_IF_ERROR(rows->values_.Fill(0));
  PS_RETURN_IF_ERROR(rows->steps_.Fill(0));
  if (rows->state_per_row() > 0) {
    if (optimizer.kind() == RowOptimizer::Kind::kAdagrad &&
        config.adagrad().initial_accumulator() != 0) {
      std::vector<float> initial(n * rows->state_per_row());
      optimizer.InitState(initial.data(), static_cast<uint32_t>(initial.size()));
      PS_RETURN_IF_ERROR(CopyToDevice(rows->state_, 0, initial.data(), rows->state_.size()));
    } else {
      PS_RETURN_IF_ERROR(rows->state_.Fill(0));
    }
  }
  return rows;
}

absl::Status DeviceRows::CheckRows(absl::Span<const uint32_t> rows) const {
  for (size_t k = 0; k < rows.size(); ++k) {
    if (rows[k] >= num_rows_) {
      return absl::InvalidArgumentError(absl::StrCat(what_, ": row index ", rows[k], " (position ",
                                                     k, ") is out of range: ", num_rows_, " rows"));
    }
  }
  return absl::OkStatus();
}

absl::Status DeviceRows::UploadIndices(absl::Span<const uint32_t> words, const Stream* stream) {
  const size_t bytes = words.size() * sizeof(uint32_t);
  // Wait for queued kernels that may still read the scratch (old or reused).
  if (stream != nullptr) PS_RETURN_IF_ERROR(stream->Synchronize());
  if (index_scratch_.size() < bytes) {
    PS_ASSIGN_OR_RETURN(index_scratch_, DeviceBuffer::Allocate(device_, bytes * 2));
  }
  return CopyToDevice(index_scratch_, 0, words.data(), bytes, stream);
}

absl::Status DeviceRows::WriteRows(absl::Span<const uint32_t> rows, const float* values) {
  PS_RETURN_IF_ERROR(CheckRows(rows));
  const uint32_t spr = state_per_row();
  std::vector<float> initial(spr);
  if (spr > 0) optimizer_.InitState(initial.data(), dim_);
  const uint64_t zero = 0;
  for (size_t k = 0; k < rows.size(); ++k) {
    const size_t r = rows[k];
    PS_RETURN_IF_ERROR(
        CopyToDevice(values_, r * dim_ * sizeof(float), values + k * dim_, dim_ * sizeof(float)));
    if (spr > 0) {
      PS_RETURN_IF_ERROR(
          CopyToDevice(state_, r * spr * sizeof(float), initial.data(), spr * sizeof(float)));
    }
    PS_RETURN_IF_ERROR(CopyToDevice(steps_, r * sizeof(uint64_t), &zero, sizeof(uint64_t)));
  }
  return absl::OkStatus();
}

absl::Status DeviceRows::Gather(absl::Span<const uint32_t> rows, DeviceBuffer& out,
                                const Stream* stream) {
  PS_RETURN_IF_ERROR(CheckRows(rows));
  const size_t need = rows.size() * dim_ * sizeof(float);
  if (out.size() < need) {
    return absl::InvalidArgumentError(absl::StrCat(what_, ": gather of ", rows.size(),
                                                   " rows of dim ", dim_, " needs ", need,
                                                   " bytes, the output buffer holds ", out.size()));
  }
  if (out.device() != device_) {
    return absl::InvalidArgumentError(absl::StrCat(what_, ": rows live on cuda:", device_,
                                                   ", the output buffer on cuda:", out.device()));
  }
  if (rows.empty()) return absl::OkStatus();
  PS_RETURN_IF_ERROR(UploadIndices(rows, stream));
  void* s = stream != nullptr ? stream->native() : nullptr;
  PS_RETURN_IF_ERROR(
      CudaStatus(kernels::GatherRows(values_.as<float>(), dim_, index_scratch_.as<uint32_t>(),
                                     rows.size(), out.as<float>(), s),
                 absl::StrCat(what_, ": gather kernel launch")));
  if (stream == nullptr) {
    PS_RETURN_IF_ERROR(
        CudaStatus(rt::StreamSynchronize(nullptr), absl::StrCat(what_, ": gather kernel")));
  }
  return absl::OkStatus();
}

absl::Status DeviceRows::ScatterApply(absl::Span<const uint32_t> rows, const DeviceBuffer& grads,
                                      ElementType grad_type, const Stream* stream) {
  PS_RETURN_IF_ERROR(CheckRows(rows));
  const absl::StatusOr<std::pair<int, size_t>> encoding = GradTypeOf(grad_type);
  if (!encoding.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what_, ": ", encoding.status().message()));
  }
  const auto [type, element] = *encoding;
  const size_t need = rows.size() * dim_ * element;
  if (grads.size() != need) {
    return absl::InvalidArgumentError(absl::StrCat(
        what_, ": ", rows.size(), " gradient rows of dim ", dim_, " ", ElementTypeName(grad_type),
        " need ", need, " bytes, the gradient buffer holds ", grads.size()));
  }
  if (grads.device() != device_) {
    return absl::InvalidArgumentError(absl::StrCat(what_, ": rows live on cuda:", device_,
                                                   ", the gradients on cuda:", grads.device()));
  }
  if (rows.empty()) return absl::OkStatus();

  // Plan on the host: distinct rows in first-seen order, and for each the
  // positions of its gradients in listed order (CSR), uploaded at once.
  const RowPlan plan = PlanRows(rows);
  const size_t u = plan.num_unique;
  PS_RETURN_IF_ERROR(UploadIndices(plan.words, stream));
  const kernels::RowStep step = PlanRowStep(config_, optimizer_.kind());
  const uint32_t* d_words = index_scratch_.as<uint32_t>();
  void* s = stream != nullptr ? stream->native() : nullptr;
  PS_RETURN_IF_ERROR(
      CudaStatus(kernels::ScatterApplyRows(step, values_.as<float>(), state_.as<float>(),
                                           steps_.as<uint64_t>(), dim_,
                                           optimizer_.state_per_row_factor(), d_words, d_words + u,
                                           d_words + u + (u + 1), u, grads.data(), type, s),
                 absl::StrCat(what_, ": scatter-apply kernel launch")));
  if (stream == nullptr) {
    PS_RETURN_IF_ERROR(
        CudaStatus(rt::StreamSynchronize(nullptr), absl::StrCat(what_, ": scatter-apply kernel")));
  }
  return absl::OkStatus();
}

absl::Status DeviceRows::ReadRows(absl::Span<const uint32_t> rows, float* values, float* state,
                                  uint64_t* steps) const {
  PS_RETURN_IF_ERROR(CheckRows(rows));
  const uint32_t spr = state_per_row();
  for (size_t k = 0; k < rows.size(); ++k) {
    const size_t r = rows[k];
    if (values != nullptr) {
      PS_RETURN_IF_ERROR(
          CopyToHost(values + k * dim_, values_, r * dim_ * sizeof(float), dim_ * sizeof(float)));
    }
    if (state != nullptr && spr > 0) {
      PS_RETURN_IF_ERROR(
          CopyToHost(state + k * spr, state_, r * spr * sizeof(float), spr * sizeof(float)));
    }
    if (steps != nullptr) {
      PS_RETURN_IF_ERROR(CopyToHost(steps + k, steps_, r * sizeof(uint64_t), sizeof(uint64_t)));
    }
  }
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace pserver
