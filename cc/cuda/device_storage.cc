#include "cc/cuda/device_storage.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cc/core/optimizer.h"
#include "cc/core/status_macros.h"
#include "cc/cuda/buffer.h"
#include "cc/cuda/device.h"
#include "cc/cuda/device_optimizer.h"
#include "cc/cuda/plan.h"

namespace pserver {
namespace cuda {
namespace {

class DeviceBlockStorage final : public BlockStorage {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceBlockStorage>> Create(
      const BlockStorageSpec& spec, std::string values, const DeviceStorageOptions& options) {
    const size_t n = static_cast<size_t>(spec.num_elements);
    const size_t bytes = n * sizeof(float);
    if (values.size() != bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device storage: ", values.size(), " bytes of values, ", n, " float32 need ", bytes));
    }
    std::unique_ptr<DeviceBlockStorage> s(new DeviceBlockStorage());
    s->device_ = options.device;
    s->num_elements_ = n;
    s->chunk_ = std::max<size_t>(options.copy_chunk_bytes, 1);
    PS_ASSIGN_OR_RETURN(s->optimizer_, DeviceOptimizer::Create(spec.config, n, options.device));
    PS_ASSIGN_OR_RETURN(s->values_, DeviceBuffer::Allocate(options.device, bytes));
    PS_ASSIGN_OR_RETURN(s->grad_, DeviceBuffer::Allocate(options.device, bytes));
    PS_ASSIGN_OR_RETURN(s->staging_, PinnedBuffer::Allocate(bytes));
    PS_ASSIGN_OR_RETURN(s->stream_, Stream::Create(options.device));
    absl::MutexLock lock(&s->mu_);
    PS_RETURN_IF_ERROR(s->Upload(s->values_, values));
    return s;
  }

  bool can_apply() const override { return true; }
  absl::Status CheckCanApply(const std::string&) const override { return absl::OkStatus(); }

  absl::Status Apply(absl::string_view grad, ElementType grad_type,
                     std::optional<double> global_norm) override {
    absl::MutexLock lock(&mu_);
    DeviceBuffer* target = &grad_;
    if (grad_type == v1::FLOAT16 || grad_type == v1::BFLOAT16) {
      // Half-precision gradients need a buffer of exactly their size.
      if (grad_half_.size() == 0) {
        PS_ASSIGN_OR_RETURN(grad_half_, DeviceBuffer::Allocate(device_, num_elements_ * 2));
      }
      target = &grad_half_;
    }
    if (grad.size() != target->size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("device storage: ", grad.size(), " bytes of ", ElementTypeName(grad_type),
                       " gradient, ", num_elements_, " values need ", target->size()));
    }
    PS_RETURN_IF_ERROR(Upload(*target, grad, /*synchronize=*/false));
    PS_RETURN_IF_ERROR(optimizer_->Apply(values_, *target, grad_type, global_norm, &stream_));
    return stream_.Synchronize();
  }

  absl::Status Read(absl::FunctionRef<void(absl::string_view)> read) const override {
    absl::MutexLock lock(&mu_);
    const size_t bytes = values_.size();
    PS_RETURN_IF_ERROR(CopyToHost(staging_.data(), values_, 0, bytes, &stream_));
    PS_RETURN_IF_ERROR(stream_.Synchronize());
    read(absl::string_view(static_cast<const char*>(staging_.data()), bytes));
    return absl::OkStatus();
  }

  absl::StatusOr<OptimizerState> ExportState() const override {
    absl::MutexLock lock(&mu_);
    return optimizer_->ExportState();
  }
  absl::Status ImportState(const OptimizerState& state) override {
    absl::MutexLock lock(&mu_);
    return optimizer_->ImportState(state);
  }

  size_t value_bytes() const override { return values_.size(); }
  size_t state_bytes() const override { return optimizer_->state_bytes(); }
  std::string location() const override { return absl::StrCat("cuda:", device_); }

 private:
  DeviceBlockStorage() = default;

  // Host bytes -> dst through the pinned buffer: each chunk's copy is queued
  // as soon as it is staged, so it overlaps staging the next one.
  absl::Status Upload(DeviceBuffer& dst, absl::string_view src, bool synchronize = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    char* pinned = static_cast<char*>(staging_.data());
    for (size_t offset = 0; offset < src.size(); offset += chunk_) {
      const size_t len = std::min(chunk_, src.size() - offset);
      std::memcpy(pinned + offset, src.data() + offset, len);
      PS_RETURN_IF_ERROR(CopyToDevice(dst, offset, pinned + offset, len, &stream_));
    }
    return synchronize ? stream_.Synchronize() : absl::OkStatus();
  }

  int device_ = 0;
  size_t num_elements_ = 0;
  size_t chunk_ = 0;
  // Guards the staging buffer, the stream and the optimizer: the store may
  // call Read from several threads at once.
  mutable absl::Mutex mu_;
  std::unique_ptr<DeviceOptimizer> optimizer_;
  DeviceBuffer values_;
  DeviceBuffer grad_;       // float32 gradients
  DeviceBuffer grad_half_;  // float16/bfloat16 gradients, made on first use
  PinnedBuffer staging_;    // the block's size
  Stream stream_;
};

// "float64 adam" -> the one-line log of the first block left on the host.
std::string HostSummary(const BlockStorageSpec& spec, const absl::Status& why, int device) {
  return absl::StrCat("parameter '", spec.name, "' (", ElementTypeName(spec.type), ", ",
                      OptimizerName(spec.config.optimizer()), ") and any other block cuda:", device,
                      " cannot update stay in host memory: ", why.message());
}

}  // namespace

absl::Status DeviceCanHold(ElementType type, const v1::ParameterConfig& config) {
  if (type != v1::FLOAT32) {
    return absl::UnimplementedError(absl::StrCat(
        ElementTypeName(type), " parameters are updated on the host (the device holds float32)"));
  }
  if (DenseRuleFor(config.optimizer()) < 0) {
    return absl::UnimplementedError(
        absl::StrCat("optimizer ", OptimizerName(config.optimizer()),
                     " does not run on a CUDA device (sgd, adagrad, adam and adamw do)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BlockStorage>> MakeDeviceBlockStorage(
    const BlockStorageSpec& spec, std::string values, const DeviceStorageOptions& options) {
  PS_RETURN_IF_ERROR(DeviceCanHold(spec.type, spec.config));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBlockStorage> storage,
                      DeviceBlockStorage::Create(spec, std::move(values), options));
  return std::unique_ptr<BlockStorage>(std::move(storage));
}

BlockStorageFactory DeviceStorageFactory(DeviceStorageOptions options) {
  auto logged = std::make_shared<std::atomic<bool>>(false);
  return [options = std::move(options), logged](
             const BlockStorageSpec& spec,
             std::string values) -> absl::StatusOr<std::unique_ptr<BlockStorage>> {
    absl::Status can = DeviceCanHold(spec.type, spec.config);
    if (!can.ok()) {
      absl::StatusOr<std::unique_ptr<BlockStorage>> host =
          MakeHostBlockStorage(spec, std::move(values));
      if (host.ok() && options.log && !logged->exchange(true)) {
        options.log(HostSummary(spec, can, options.device));
      }
      return host;
    }
    return MakeDeviceBlockStorage(spec, std::move(values), options);
  };
}

absl::StatusOr<BlockStorageFactory> MakeDeviceStorageFactory(DeviceStorageOptions options) {
  PS_RETURN_IF_ERROR(ChooseDevice(absl::StrCat("cuda:", options.device)).status());
  return DeviceStorageFactory(std::move(options));
}

}  // namespace cuda
}  // namespace pserver
