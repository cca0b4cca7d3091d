// DeviceOptimizer: the server-side update of one dense float32 parameter
// block that lives in GPU memory, with its optimizer state on the same GPU.
// It is cc/core's Optimizer (optimizer.h) on the device: built from the same
// v1::ParameterConfig, the same rules (SGD with momentum/Nesterov/weight
// decay, Adagrad, Adam, AdamW), defaults, clipping and learning-rate
// schedule (evaluated on the host each step and passed to the kernel), and
// the same state slots in the same order, so ExportState/ImportState move
// state between the two and checkpoints keep one format.
//
//   PS_ASSIGN_OR_RETURN(auto opt, DeviceOptimizer::Create(config, n, /*device=*/0));
//   PS_ASSIGN_OR_RETURN(DeviceBuffer params, DeviceBuffer::Allocate(0, n * 4));
//   ... copy values in, receive a gradient into `grad` (float32, float16 or bfloat16) ...
//   PS_RETURN_IF_ERROR(opt->Apply(params, grad, v1::BFLOAT16));
//   PS_ASSIGN_OR_RETURN(OptimizerState state, opt->ExportState());  // host bytes
//
// Precision: float32 parameters and state; float16/bfloat16 gradients are
// converted to float32 in the kernel (exactly). The kernels repeat the host's
// float operations in the host's order and are compiled without fused
// multiply-add, so the device and the host agree to the last bit except
// where clip-by-norm computes the norm itself (a parallel sum of squares in
// double, in a different order); the tests allow 1e-5 relative.
//
// Adadelta, RMSProp, `add` and float64 parameters stay on the host: Create
// returns UNIMPLEMENTED naming the optimizer.
//
// Not thread-safe: the caller serializes calls on one DeviceOptimizer.
#ifndef PSERVER_CC_CUDA_DEVICE_OPTIMIZER_H_
#define PSERVER_CC_CUDA_DEVICE_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cc/core/element_type.h"
#include "cc/core/learning_rate.h"
#include "cc/core/optimizer.h"
#include "cc/cuda/buffer.h"
#include "pserver/v1/config.pb.h"

namespace pserver {
namespace cuda {

class DeviceOptimizer {
 public:
  // INVALID_ARGUMENT (as Optimizer::Create words it) for a bad config;
  // UNIMPLEMENTED for an optimizer the device does not run; UNAVAILABLE
  // without a device; RESOURCE_EXHAUSTED if the state does not fit.
  static absl::StatusOr<std::unique_ptr<DeviceOptimizer>> Create(
      const v1::ParameterConfig& config, size_t num_elements, int device = 0);

  // Applies one gradient to the parameter values, both on this optimizer's
  // device: `params` num_elements float32 values, `grad` num_elements values
  // of `grad_type` (FLOAT32, FLOAT16 or BFLOAT16). INVALID_ARGUMENT naming
  // the sizes or the type, and nothing changes, if they do not fit.
  // `global_norm` as in Optimizer::Apply. With a stream the update is queued
  // on it (clip-by-norm without global_norm still waits for the norm);
  // without one Apply returns when the update is done.
  absl::Status Apply(DeviceBuffer& params, const DeviceBuffer& grad, ElementType grad_type,
                     std::optional<double> global_norm = std::nullopt,
                     const Stream* stream = nullptr);

  // The step count and the state slots copied to the host, named and ordered
  // as cc/core's Optimizer names them ("momentum"; "accumulator"; "m", "v").
  absl::StatusOr<OptimizerState> ExportState() const;

  // Replaces the step count and state (from ExportState of either optimizer
  // made from the same config and size). INVALID_ARGUMENT with the host
  // optimizer's wording, and nothing changes, if slots or sizes differ.
  absl::Status ImportState(const OptimizerState& state);

  const std::string& name() const { return name_; }
  size_t num_elements() const { return num_elements_; }
  int device() const { return device_; }
  uint64_t steps() const { return steps_; }
  size_t state_bytes() const { return slots_.size() * num_elements_ * sizeof(float); }
  double current_learning_rate() const { return learning_rate_.At(steps_); }

 private:
  DeviceOptimizer() = default;

  std::string name_;
  int rule_ = 0;  // kernels::DenseRule
  size_t num_elements_ = 0;
  int device_ = 0;
  v1::ParameterConfig config_;
  LearningRate learning_rate_;
  std::vector<std::string> slot_names_;
  std::vector<DeviceBuffer> slots_;
  DeviceBuffer norm_scratch_;  // one double, for clip-by-norm
  uint64_t steps_ = 0;
};

}  // namespace cuda
}  // namespace pserver

#endif  // PSERVER_CC_CUDA_DEVICE_OPTIMIZER_H_
