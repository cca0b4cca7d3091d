#include "cc/core/block_storage.h"

#include <utility>

namespace pserver {
namespace {

// Today's code path: the values in a string, the Optimizer's loops on them.
class HostBlockStorage final : public BlockStorage {
 public:
  HostBlockStorage(std::string values, std::unique_ptr<Optimizer> optimizer)
      : values_(std::move(values)), optimizer_(std::move(optimizer)) {}

  bool can_apply() const override { return optimizer_->can_apply(); }
  absl::Status CheckCanApply(const std::string& what) const override {
    return optimizer_->CheckCanApply(what);
  }
  absl::Status Apply(absl::string_view grad, ElementType /*grad_type*/,
                     std::optional<double> global_norm) override {
    optimizer_->Apply(values_.data(), grad.data(), global_norm);
    return absl::OkStatus();
  }
  absl::Status Read(absl::FunctionRef<void(absl::string_view)> read) const override {
    read(values_);
    return absl::OkStatus();
  }
  absl::StatusOr<OptimizerState> ExportState() const override { return optimizer_->ExportState(); }
  absl::Status ImportState(const OptimizerState& state) override {
    return optimizer_->ImportState(state);
  }
  size_t value_bytes() const override { return values_.size(); }
  size_t state_bytes() const override { return optimizer_->state_bytes(); }
  std::string location() const override { return "host"; }

 private:
  std::string values_;
  std::unique_ptr<Optimizer> optimizer_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BlockStorage>> MakeHostBlockStorage(const BlockStorageSpec& spec,
                                                                   std::string values) {
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
      Optimizer::Create(spec.config, spec.type, static_cast<size_t>(spec.num_elements));
  if (!optimizer.ok()) return optimizer.status();
  return std::unique_ptr<BlockStorage>(
      new HostBlockStorage(std::move(values), *std::move(optimizer)));
}

}  // namespace pserver
