// Optimizer: the server-side update of one parameter block. It owns the
// block's optimizer state (momenta, accumulators, step count) and applies
// clipping and the learning-rate schedule from a v1::ParameterConfig.
//
//   PS_ASSIGN_OR_RETURN(auto opt, Optimizer::Create(config, v1::FLOAT32, n));
//   opt->Apply(param_bytes, grad_bytes, /*global_norm=*/std::nullopt);
//
// Rules (SGD with momentum/Nesterov/weight decay, Adagrad, Adadelta, RMSProp,
// Adam, AdamW) follow the formulas in proto/pserver/v1/config.proto, computed
// in the parameter's own precision (float32 or float64). `add` (p += g) is the
// only rule for integer parameters.
//
// Not thread-safe: the caller serializes Apply on one Optimizer.
#ifndef PSERVER_CC_CORE_OPTIMIZER_H_
#define PSERVER_CC_CORE_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "cc/core/element_type.h"
#include "cc/core/learning_rate.h"
#include "pserver/v1/config.pb.h"

namespace pserver {

// Everything an Optimizer accumulates while it trains, so that a restored one
// continues bit for bit: the step count (which also drives the learning-rate
// schedule) and the rule's named state vectors ("m", "v", "momentum", ...),
// each the raw little-endian bytes of one value per element, in the rule's
// fixed order. Hyper-parameters are not part of it: they come from the config.
struct OptimizerState {
  uint64_t steps = 0;
  std::vector<std::pair<std::string, std::string>> slots;  // name, bytes
};

// One named state vector of an update rule, pointing into the rule.
struct StateSlot {
  std::string name;
  void* data = nullptr;
  size_t bytes = 0;
};

// The per-element arithmetic of one optimizer, with its state. Internal to
// Optimizer; declared here so tests and later GPU kernels share the interface.
class UpdateRule {
 public:
  virtual ~UpdateRule() = default;
  // params and grad hold the block's elements of the rule's type.
  virtual void Update(void* params, const void* grad, double lr,
                      uint64_t step) = 0;
  virtual size_t state_bytes() const = 0;
  // The rule's state vectors, in a fixed order; valid until the next Update.
  // Rules without state have none.
  virtual std::vector<StateSlot> state_slots() { return {}; }
};

class Optimizer {
 public:
  // INVALID_ARGUMENT naming the field for an out-of-range hyper-parameter,
  // and for an explicit non-`add` optimizer on an integer type. An integer
  // parameter with no optimizer set gets no update rule: it is stored and
  // served, and Apply-ing a gradient to it is refused by CheckCanApply.
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(
      const v1::ParameterConfig& config, ElementType type, size_t num_elements);

  // OK if a gradient may be applied; FAILED_PRECONDITION naming `what`
  // otherwise (integer parameters without the `add` optimizer).
  absl::Status CheckCanApply(const std::string& what) const;
  bool can_apply() const { return rule_ != nullptr; }

  // Applies one gradient (same type and element count as the block) to the
  // parameter values; `grad` is not modified (clipping works on a copy).
  // `global_norm`, when set, is the L2 norm of the whole gradient the block
  // belongs to, used for clip-by-norm. Call only after CheckCanApply is OK.
  void Apply(void* params, const void* grad, std::optional<double> global_norm);

  // A copy of the step count and the rule's state vectors.
  OptimizerState ExportState() const;

  // Replaces the step count and state with `state` exported from an Optimizer
  // made from the same config, element type and element count.
  // INVALID_ARGUMENT (and nothing changes) if the slot names, their order or
  // their sizes differ from this optimizer's.
  absl::Status ImportState(const OptimizerState& state);

  uint64_t steps() const { return steps_; }
  size_t state_bytes() const { return rule_ ? rule_->state_bytes() : 0; }
  const std::string& name() const { return name_; }
  double current_learning_rate() const { return learning_rate_.At(steps_); }

 private:
  Optimizer() = default;

  std::string name_;
  ElementType type_ = v1::ELEMENT_TYPE_UNSPECIFIED;
  size_t num_elements_ = 0;
  LearningRate learning_rate_;
  v1::Clipping clipping_;
  std::unique_ptr<UpdateRule> rule_;
  std::string clipped_;  // scratch for the clipped gradient, reused
  uint64_t steps_ = 0;
};

// Name of the optimizer a config selects: "sgd", "adam", ... ("sgd" if unset).
std::string OptimizerName(const v1::OptimizerConfig& config);

}  // namespace pserver

#endif  // PSERVER_CC_CORE_OPTIMIZER_H_
