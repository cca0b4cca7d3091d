#include "cc/cuda/plan.h"

#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "cc/cuda/update_math.h"

namespace pserver {
namespace cuda {

absl::StatusOr<std::pair<int, size_t>> GradTypeOf(ElementType type) {
  switch (type) {
    case v1::FLOAT32:
      return std::make_pair(int{kernels::kGradFloat32}, size_t{4});
    case v1::FLOAT16:
      return std::make_pair(int{kernels::kGradFloat16}, size_t{2});
    case v1::BFLOAT16:
      return std::make_pair(int{kernels::kGradBfloat16}, size_t{2});
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("gradient element type ", ElementTypeName(type),
                       " is not accepted on the device (float32, float16 or bfloat16)"));
  }
}

int DenseRuleFor(const v1::OptimizerConfig& config) {
  switch (config.kind_case()) {
    case v1::OptimizerConfig::KIND_NOT_SET:
    case v1::OptimizerConfig::kSgd:
      return kernels::kDenseSgd;
    case v1::OptimizerConfig::kAdagrad:
      return kernels::kDenseAdagrad;
    case v1::OptimizerConfig::kAdam:
    case v1::OptimizerConfig::kAdamw:
      return kernels::kDenseAdam;
    default:
      return -1;
  }
}

kernels::DenseStep PlanDenseStep(const v1::ParameterConfig& config, int rule, float lr,
                                 uint64_t steps, double norm) {
  kernels::DenseStep step;
  step.rule = rule;
  step.lr = lr;
  // Clipping, as Optimizer::Apply: scale by clip_norm / norm, then clamp.
  const v1::Clipping& clip = config.clipping();
  if (clip.clip_norm() > 0 && norm > clip.clip_norm()) {
    step.scale_grad = true;
    step.grad_scale = static_cast<float>(clip.clip_norm() / norm);
  }
  if (clip.clip_value() > 0) step.clip_value = static_cast<float>(clip.clip_value());

  const v1::OptimizerConfig& oc = config.optimizer();
  switch (rule) {
    case kernels::kDenseSgd: {
      const v1::SgdConfig& c = oc.sgd();
      step.momentum = static_cast<float>(c.momentum());
      step.weight_decay = static_cast<float>(c.weight_decay());
      step.nesterov = c.nesterov();
      step.first_step = steps == 0;
      break;
    }
    case kernels::kDenseAdagrad: {
      const v1::AdagradConfig& c = oc.adagrad();
      step.epsilon = static_cast<float>(c.has_epsilon() ? c.epsilon() : 1e-10);
      step.weight_decay = static_cast<float>(c.weight_decay());
      break;
    }
    default: {  // Adam and AdamW, exactly as AdamRule::Step computes its scalars.
      const bool w = oc.kind_case() == v1::OptimizerConfig::kAdamw;
      const double beta1 = w ? (oc.adamw().has_beta1() ? oc.adamw().beta1() : 0.9)
                             : (oc.adam().has_beta1() ? oc.adam().beta1() : 0.9);
      const double beta2 = w ? (oc.adamw().has_beta2() ? oc.adamw().beta2() : 0.999)
                             : (oc.adam().has_beta2() ? oc.adam().beta2() : 0.999);
      const double eps = w ? (oc.adamw().has_epsilon() ? oc.adamw().epsilon() : 1e-8)
                           : (oc.adam().has_epsilon() ? oc.adam().epsilon() : 1e-8);
      const double l2 = w ? 0.0 : oc.adam().weight_decay();
      const double decoupled =
          w ? (oc.adamw().has_weight_decay() ? oc.adamw().weight_decay() : 0.01) : 0.0;
      step.beta1 = static_cast<float>(beta1);
      step.beta2 = static_cast<float>(beta2);
      step.epsilon = static_cast<float>(eps);
      step.l2 = static_cast<float>(l2);
      const double t = static_cast<double>(steps + 1);
      const float bias1 = static_cast<float>(1 - std::pow(static_cast<double>(step.beta1), t));
      step.bias2_sqrt =
          static_cast<float>(std::sqrt(1 - std::pow(static_cast<double>(step.beta2), t)));
      step.step_size = lr / bias1;
      step.shrink = static_cast<float>(1 - static_cast<double>(lr) * decoupled);
      break;
    }
  }
  return step;
}

kernels::RowStep PlanRowStep(const v1::RowOptimizer& config, RowOptimizer::Kind kind) {
  kernels::RowStep step;
  switch (kind) {
    case RowOptimizer::Kind::kAdagrad: {
      const auto& c = config.adagrad();
      step.rule = kernels::kRowAdagrad;
      step.lr = c.has_learning_rate() ? c.learning_rate() : 0.01;
      step.epsilon = c.has_epsilon() ? c.epsilon() : 1e-10;
      break;
    }
    case RowOptimizer::Kind::kAdam: {
      const auto& c = config.adam();
      step.rule = kernels::kRowAdam;
      step.lr = c.has_learning_rate() ? c.learning_rate() : 0.001;
      step.beta1 = c.has_beta1() ? c.beta1() : 0.9;
      step.beta2 = c.has_beta2() ? c.beta2() : 0.999;
      step.epsilon = c.has_epsilon() ? c.epsilon() : 1e-8;
      break;
    }
    case RowOptimizer::Kind::kAdd:
      step.rule = kernels::kRowAdd;
      break;
    default: {
      const auto& c = config.sgd();
      step.rule = kernels::kRowSgd;
      step.lr = c.has_learning_rate() ? c.learning_rate() : 0.01;
      break;
    }
  }
  return step;
}

RowPlan PlanRows(absl::Span<const uint32_t> rows) {
  absl::flat_hash_map<uint32_t, uint32_t> unique_of;
  std::vector<uint32_t> unique, counts;
  std::vector<uint32_t> which(rows.size());
  for (size_t k = 0; k < rows.size(); ++k) {
    auto [it, inserted] = unique_of.try_emplace(rows[k], static_cast<uint32_t>(unique.size()));
    if (inserted) {
      unique.push_back(rows[k]);
      counts.push_back(0);
    }
    which[k] = it->second;
    ++counts[it->second];
  }
  RowPlan plan;
  const size_t u = unique.size();
  plan.num_unique = u;
  plan.words.resize(u + (u + 1) + rows.size());
  std::copy(unique.begin(), unique.end(), plan.words.begin());
  uint32_t* offsets = plan.words.data() + u;
  uint32_t* positions = offsets + u + 1;
  offsets[0] = 0;
  for (size_t i = 0; i < u; ++i) offsets[i + 1] = offsets[i] + counts[i];
  std::vector<uint32_t> fill(offsets, offsets + u);
  for (size_t k = 0; k < rows.size(); ++k) positions[fill[which[k]]++] = static_cast<uint32_t>(k);
  return plan;
}

namespace kernels {

void DenseUpdateOnHost(const DenseStep& step, float* params, const void* grad, int grad_type,
                       float* slot0, float* slot1, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    switch (step.rule) {
      case kDenseSgd:
        DenseElement<kDenseSgd>(step, params, grad, grad_type, slot0, slot1, i);
        break;
      case kDenseAdagrad:
        DenseElement<kDenseAdagrad>(step, params, grad, grad_type, slot0, slot1, i);
        break;
      default:
        DenseElement<kDenseAdam>(step, params, grad, grad_type, slot0, slot1, i);
        break;
    }
  }
}

void ScatterApplyRowsOnHost(const RowStep& step, float* values, float* state, uint64_t* steps,
                            uint32_t dim, uint32_t state_factor, const RowPlan& plan,
                            const void* grads, int grad_type) {
  for (size_t u = 0; u < plan.num_unique; ++u) {
    const size_t row = plan.rows()[u];
    for (size_t i = 0; i < dim; ++i) {
      const double g = RowGradSum(grads, grad_type, dim, plan.offsets(), plan.positions(), u, i);
      RowElement(step, values + row * dim, state + row * state_factor * dim, dim, i, g,
                 steps[row] + 1);
    }
  }
  for (size_t u = 0; u < plan.num_unique; ++u) steps[plan.rows()[u]] += 1;
}

}  // namespace kernels
}  // namespace cuda
}  // namespace pserver
