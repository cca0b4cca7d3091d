// Launchers of cc/cuda's kernels, as plain C++ declarations (see runtime.h):
// compiled by nvcc in optimizer_kernels.cu and sparse_kernels.cu, or by the
// host compiler in runtime_stub.cc, where they return rt::kNotBuilt.
// Internal to cc/cuda: the public API is device_optimizer.h and
// device_rows.h. All pointers are device pointers unless named host_*;
// every launch is asynchronous on `stream` and returns the launch error.
#ifndef PSERVER_CC_CUDA_KERNELS_H_
#define PSERVER_CC_CUDA_KERNELS_H_

#include <cstddef>
#include <cstdint>

namespace pserver {
namespace cuda {
namespace kernels {

// Gradient element types converted in-kernel to float.
enum GradType : int { kGradFloat32 = 0, kGradFloat16 = 1, kGradBfloat16 = 2 };

enum DenseRule : int { kDenseSgd = 0, kDenseAdagrad = 1, kDenseAdam = 2 };

// One step of a dense float32 optimizer, every scalar already computed on the
// host exactly as cc/core/optimizer.cc computes it (in float).
struct DenseStep {
  int rule = kDenseSgd;
  float lr = 0;
  // Gradient preprocessing (clipping): g = g * grad_scale (if scale_grad),
  // then clamped to [-clip_value, clip_value] (if clip_value > 0).
  bool scale_grad = false;
  float grad_scale = 1;
  float clip_value = 0;
  // sgd: d = g + weight_decay * p; momentum buffer in slot0 if momentum > 0.
  // adagrad: d = g + weight_decay * p; accumulator in slot0.
  float weight_decay = 0;
  float momentum = 0;
  bool nesterov = false;
  bool first_step = false;  // sgd: the momentum buffer starts as d
  float epsilon = 0;
  // adam/adamw: m in slot0, v in slot1.
  float beta1 = 0, beta2 = 0, l2 = 0, shrink = 1, step_size = 0, bias2_sqrt = 1;
};

int DenseUpdate(const DenseStep& step, float* params, const void* grad, int grad_type,
                float* slot0, float* slot1, size_t n, void* stream);

// Adds sum over i of (double)g[i]^2 to *sum (a double on the device).
int SumSquares(const void* grad, int grad_type, size_t n, double* sum, void* stream);

// ---- sparse rows --------------------------------------------------------

enum RowRule : int { kRowSgd = 0, kRowAdagrad = 1, kRowAdam = 2, kRowAdd = 3 };

struct RowStep {
  int rule = kRowSgd;
  double lr = 0, epsilon = 0, beta1 = 0, beta2 = 0;
};

// out[k * dim + i] = values[rows[k] * dim + i] for k < n.
int GatherRows(const float* values, uint32_t dim, const uint32_t* rows, size_t n, float* out,
               void* stream);

// For each unique row u < num_unique: its summed gradient (in double, in the
// order listed) g = sum over j in [offsets[u], offsets[u+1]) of grads[positions[j]
// * dim + i], then the row optimizer on values[rows[u]], its state
// (state_factor * dim floats at state[rows[u] * state_factor * dim]) with step
// steps[rows[u]] + 1; then steps[rows[u]] += 1.
int ScatterApplyRows(const RowStep& step, float* values, float* state, uint64_t* steps,
                     uint32_t dim, uint32_t state_factor, const uint32_t* rows,
                     const uint32_t* offsets, const uint32_t* positions, size_t num_unique,
                     const void* grads, int grad_type, void* stream);

}  // namespace kernels
}  // namespace cuda
}  // namespace pserver

#endif  // PSERVER_CC_CUDA_KERNELS_H_
