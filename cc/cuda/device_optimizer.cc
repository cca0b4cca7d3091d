#include "cc/cuda/device_optimizer.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/core/status_macros.h"
#include "cc/cuda/cuda_status.h"
#include "cc/cuda/kernels.h"
#include "cc/cuda/plan.h"
#include "cc/cuda/runtime.h"

namespace pserver {
namespace cuda {
namespace {

std::string SlotList(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) absl::StrAppend(&out, out.empty() ? "" : ", ", name);
  return absl::StrCat("[", out, "]");
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceOptimizer>> DeviceOptimizer::Create(
    const v1::ParameterConfig& config, size_t num_elements, int device) {
  const v1::OptimizerConfig& oc = config.optimizer();
  const int rule = DenseRuleFor(oc);
  if (rule < 0) {
    return absl::UnimplementedError(
        absl::StrCat("optimizer ", OptimizerName(oc),
                     " does not run on a CUDA device (sgd, adagrad, adam and adamw do); "
                     "keep this parameter in host memory"));
  }
  // The host optimizer validates the config (same messages) and names the
  // slots; with 0 elements it allocates nothing.
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> host, Optimizer::Create(config, v1::FLOAT32, 0));
  PS_ASSIGN_OR_RETURN(LearningRate lr, LearningRate::Create(config.learning_rate(), 0.01));

  std::unique_ptr<DeviceOptimizer> opt(new DeviceOptimizer());
  opt->name_ = host->name();
  opt->rule_ = rule;
  opt->num_elements_ = num_elements;
  opt->device_ = device;
  opt->config_ = config;
  opt->learning_rate_ = std::move(lr);
  for (auto& [name, bytes] : host->ExportState().slots) opt->slot_names_.push_back(name);

  // Fail early and clearly without a device, even for a state-less rule.
  PS_RETURN_IF_ERROR(
      CudaStatus(rt::SetDevice(device), absl::StrCat("cudaSetDevice(", device, ")")));
  const float initial =
      rule == kernels::kDenseAdagrad ? static_cast<float>(oc.adagrad().initial_accumulator()) : 0.f;
  for (size_t i = 0; i < opt->slot_names_.size(); ++i) {
    PS_ASSIGN_OR_RETURN(DeviceBuffer slot,
                        DeviceBuffer::Allocate(device, num_elements * sizeof(float)));
    if (initial == 0.f) {
      PS_RETURN_IF_ERROR(slot.Fill(0));
    } else {
      std::vector<float> values(num_elements, initial);
      PS_RETURN_IF_ERROR(CopyToDevice(slot, 0, values.data(), slot.size()));
    }
    opt->slots_.push_back(std::move(slot));
  }
  return opt;
}

absl::Status DeviceOptimizer::Apply(DeviceBuffer& params, const DeviceBuffer& grad,
                                    ElementType grad_type, std::optional<double> global_norm,
                                    const Stream* stream) {
  PS_ASSIGN_OR_RETURN(auto type, GradTypeOf(grad_type));
  const size_t want_params = num_elements_ * sizeof(float);
  const size_t want_grad = num_elements_ * type.second;
  if (params.size() != want_params) {
    return absl::InvalidArgumentError(
        absl::StrCat("device optimizer ", name_, ": parameter buffer holds ", params.size(),
                     " bytes, ", num_elements_, " float32 values need ", want_params));
  }
  if (grad.size() != want_grad) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device optimizer ", name_, ": gradient buffer holds ", grad.size(), " bytes, ",
        num_elements_, " ", ElementTypeName(grad_type), " values need ", want_grad));
  }
  if (params.device() != device_ || grad.device() != device_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device optimizer ", name_, " lives on cuda:", device_,
        ", the parameters on cuda:", params.device(), " and the gradient on cuda:", grad.device()));
  }
  if (num_elements_ == 0) {
    ++steps_;
    return absl::OkStatus();
  }
  PS_RETURN_IF_ERROR(CudaStatus(rt::SetDevice(device_), "cudaSetDevice"));
  void* s = stream != nullptr ? stream->native() : nullptr;

  const float lr = static_cast<float>(learning_rate_.At(steps_));
  double norm = 0;
  if (config_.clipping().clip_norm() > 0) {
    if (global_norm.has_value()) {
      norm = *global_norm;
    } else {
      if (norm_scratch_.size() == 0) {
        PS_ASSIGN_OR_RETURN(norm_scratch_, DeviceBuffer::Allocate(device_, sizeof(double)));
      }
      PS_RETURN_IF_ERROR(norm_scratch_.Fill(0, stream));
      PS_RETURN_IF_ERROR(CudaStatus(kernels::SumSquares(grad.data(), type.first, num_elements_,
                                                        norm_scratch_.as<double>(), s),
                                    "clip-by-norm sum of squares kernel"));
      double sum = 0;
      PS_RETURN_IF_ERROR(CopyToHost(&sum, norm_scratch_, 0, sizeof(double), stream));
      if (stream != nullptr) PS_RETURN_IF_ERROR(stream->Synchronize());
      norm = std::sqrt(sum);
    }
  }
  const kernels::DenseStep step = PlanDenseStep(config_, rule_, lr, steps_, norm);
  float* slot0 = slots_.size() > 0 ? slots_[0].as<float>() : nullptr;
  float* slot1 = slots_.size() > 1 ? slots_[1].as<float>() : nullptr;
  PS_RETURN_IF_ERROR(CudaStatus(kernels::DenseUpdate(step, params.as<float>(), grad.data(),
                                                     type.first, slot0, slot1, num_elements_, s),
                                absl::StrCat("device optimizer ", name_, " kernel launch")));
  ++steps_;
  if (stream == nullptr) {
    PS_RETURN_IF_ERROR(CudaStatus(rt::StreamSynchronize(nullptr),
                                  absl::StrCat("device optimizer ", name_, " kernel")));
  }
  return absl::OkStatus();
}

absl::StatusOr<OptimizerState> DeviceOptimizer::ExportState() const {
  OptimizerState state;
  state.steps = steps_;
  for (size_t i = 0; i < slots_.size(); ++i) {
    std::string bytes(num_elements_ * sizeof(float), '\0');
    PS_RETURN_IF_ERROR(CopyToHost(bytes.data(), slots_[i], 0, bytes.size()));
    state.slots.emplace_back(slot_names_[i], std::move(bytes));
  }
  return state;
}

absl::Status DeviceOptimizer::ImportState(const OptimizerState& state) {
  bool names_match = state.slots.size() == slot_names_.size();
  for (size_t i = 0; names_match && i < slot_names_.size(); ++i) {
    names_match = state.slots[i].first == slot_names_[i];
  }
  if (!names_match) {
    std::vector<std::string> theirs;
    for (const auto& slot : state.slots) theirs.push_back(slot.first);
    return absl::InvalidArgumentError(absl::StrCat("optimizer ", name_, " has state slots ",
                                                   SlotList(slot_names_),
                                                   ", the state to import has ", SlotList(theirs)));
  }
  const size_t want = num_elements_ * sizeof(float);
  for (size_t i = 0; i < slot_names_.size(); ++i) {
    if (state.slots[i].second.size() != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer ", name_, " state slot '", slot_names_[i], "' holds ", want,
                       " bytes, the state to import has ", state.slots[i].second.size()));
    }
  }
  for (size_t i = 0; i < slot_names_.size(); ++i) {
    PS_RETURN_IF_ERROR(CopyToDevice(slots_[i], 0, state.slots[i].second.data(), want));
  }
  steps_ = state.steps;
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace pserver
