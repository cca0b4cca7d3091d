// Host-side planning of cc/cuda's kernel launches: the per-step scalars of a
// dense optimizer (as cc/core's Optimizer::Apply computes them), the
// hyper-parameters of a row optimizer, the row plan of a scatter-apply, and
// the kernels' element code run on the host (host_kernels), which the tests
// use to check the kernels' math on machines without a GPU. Internal to
// cc/cuda. Pure functions: thread-safe.
#ifndef PSERVER_CC_CUDA_PLAN_H_
#define PSERVER_CC_CUDA_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cc/core/element_type.h"
#include "cc/core/row_optimizer.h"
#include "cc/cuda/kernels.h"
#include "pserver/v1/config.pb.h"
#include "pserver/v1/table.pb.h"

namespace pserver {
namespace cuda {

// kernels::GradType of a gradient type the device accepts (FLOAT32, FLOAT16,
// BFLOAT16), with its element size; INVALID_ARGUMENT naming it otherwise.
absl::StatusOr<std::pair<int, size_t>> GradTypeOf(ElementType type);

// kernels::DenseRule of a config's optimizer; -1 if the device has none.
int DenseRuleFor(const v1::OptimizerConfig& config);

// The scalars of the step after `steps` steps with learning rate `lr` (the
// schedule's value, as a float). `norm` (the gradient's L2 norm) is read only
// when the config clips by norm.
kernels::DenseStep PlanDenseStep(const v1::ParameterConfig& config, int rule, float lr,
                                 uint64_t steps, double norm);

// A validated row optimizer's hyper-parameters, with RowOptimizer's defaults.
kernels::RowStep PlanRowStep(const v1::RowOptimizer& config, RowOptimizer::Kind kind);

// Distinct rows in first-seen order, then offsets (num_unique + 1), then the
// positions of each distinct row's gradients in listed order: one array, as
// kernels::ScatterApplyRows reads it.
struct RowPlan {
  size_t num_unique = 0;
  std::vector<uint32_t> words;
  const uint32_t* rows() const { return words.data(); }
  const uint32_t* offsets() const { return words.data() + num_unique; }
  const uint32_t* positions() const { return words.data() + 2 * num_unique + 1; }
};
RowPlan PlanRows(absl::Span<const uint32_t> rows);

namespace kernels {

// The kernels' element code (update_math.h), looped on the host.
void DenseUpdateOnHost(const DenseStep& step, float* params, const void* grad, int grad_type,
                       float* slot0, float* slot1, size_t n);
void ScatterApplyRowsOnHost(const RowStep& step, float* values, float* state, uint64_t* steps,
                            uint32_t dim, uint32_t state_factor, const RowPlan& plan,
                            const void* grads, int grad_type);

}  // namespace kernels
}  // namespace cuda
}  // namespace pserver

#endif  // PSERVER_CC_CUDA_PLAN_H_
