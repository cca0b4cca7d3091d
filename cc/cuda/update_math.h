// The per-element arithmetic of cc/cuda's kernels, shared by the device
// kernels (optimizer_kernels.cu, sparse_kernels.cu, compiled by nvcc) and by
// host_kernels.cc, which runs the very same code on the CPU so that CI checks
// the kernels' math against cc/core's optimizers without a GPU. Internal to
// cc/cuda. Plain C++ (no CUDA headers): with nvcc the functions are
// __host__ __device__.
#ifndef PSERVER_CC_CUDA_UPDATE_MATH_H_
#define PSERVER_CC_CUDA_UPDATE_MATH_H_

#include <math.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cc/core/half_float.h"
#include "cc/cuda/kernels.h"

#if defined(__CUDACC__)
#define PS_CUDA_HD __host__ __device__ __forceinline__
#else
#define PS_CUDA_HD inline
#endif

namespace pserver {
namespace cuda {
namespace kernels {

// The one definition of the half-precision conversions (cc/core/half_float.h).
using ::pserver::half::Bfloat16ToFloat;
using ::pserver::half::BitsToFloat;
using ::pserver::half::HalfToFloat;

PS_CUDA_HD float LoadGrad(const void* grad, int grad_type, size_t i) {
  switch (grad_type) {
    case kGradFloat16:
      return HalfToFloat(static_cast<const uint16_t*>(grad)[i]);
    case kGradBfloat16:
      return Bfloat16ToFloat(static_cast<const uint16_t*>(grad)[i]);
    default:
      return static_cast<const float*>(grad)[i];
  }
}

// std::clamp(g, -hi, hi) as the host evaluates it (NaN passes through).
PS_CUDA_HD float Clamp(float g, float hi) {
  const float lo = -hi;
  return g < lo ? lo : (hi < g ? hi : g);
}

// Element i of one dense step: cc/core/optimizer.cc's SgdRule, AdagradRule
// and AdamRule loops, the same float operations in the same order.
template <int kRule>
PS_CUDA_HD void DenseElement(const DenseStep& s, float* p, const void* grad, int grad_type,
                             float* slot0, float* slot1, size_t i) {
  float g = LoadGrad(grad, grad_type, i);
  if (s.scale_grad) g *= s.grad_scale;
  if (s.clip_value > 0) g = Clamp(g, s.clip_value);
  if (kRule == kDenseSgd) {
    float d = g + s.weight_decay * p[i];
    if (s.momentum > 0) {
      const float b = s.first_step ? d : s.momentum * slot0[i] + d;
      slot0[i] = b;
      d = s.nesterov ? d + s.momentum * b : b;
    }
    p[i] -= s.lr * d;
  } else if (kRule == kDenseAdagrad) {
    const float d = g + s.weight_decay * p[i];
    const float acc = slot0[i] + d * d;
    slot0[i] = acc;
    p[i] -= s.lr * d / (sqrtf(acc) + s.epsilon);
  } else {
    const float one = 1;
    const float w = p[i] * s.shrink;
    const float d = g + s.l2 * w;
    const float m = s.beta1 * slot0[i] + (one - s.beta1) * d;
    const float v = s.beta2 * slot1[i] + (one - s.beta2) * d * d;
    slot0[i] = m;
    slot1[i] = v;
    p[i] = w - s.step_size * m / (sqrtf(v) / s.bias2_sqrt + s.epsilon);
  }
}

// Element i of one sparse row update: cc/core/row_optimizer.cc's Apply, in
// double, rounded to float once per stored value. `g` is the row's summed
// gradient for element i, `step` the row's step count including this update.
PS_CUDA_HD void RowElement(const RowStep& s, float* w, float* state, uint32_t dim, size_t i,
                           double g, uint64_t step) {
  switch (s.rule) {
    case kRowSgd:
      w[i] = static_cast<float>(static_cast<double>(w[i]) - s.lr * g);
      break;
    case kRowAdd:
      w[i] = static_cast<float>(static_cast<double>(w[i]) + g);
      break;
    case kRowAdagrad: {
      const double a = static_cast<double>(state[i]) + g * g;
      state[i] = static_cast<float>(a);
      w[i] = static_cast<float>(static_cast<double>(w[i]) - s.lr * g / (sqrt(a) + s.epsilon));
      break;
    }
    case kRowAdam: {
      const double t = static_cast<double>(step);
      const double b1 = s.beta1, b2 = s.beta2;
      const double step_size = s.lr / (1 - pow(b1, t));
      const double bias2_sqrt = sqrt(1 - pow(b2, t));
      float* m = state;
      float* v = state + dim;
      const double mi = b1 * static_cast<double>(m[i]) + (1 - b1) * g;
      const double vi = b2 * static_cast<double>(v[i]) + (1 - b2) * g * g;
      m[i] = static_cast<float>(mi);
      v[i] = static_cast<float>(vi);
      w[i] = static_cast<float>(static_cast<double>(w[i]) -
                                step_size * mi / (sqrt(vi) / bias2_sqrt + s.epsilon));
      break;
    }
    default:
      break;
  }
}

// The summed gradient of unique row u, element i (in double, in listed order).
PS_CUDA_HD double RowGradSum(const void* grads, int grad_type, uint32_t dim, const uint32_t* offsets,
                             const uint32_t* positions, size_t u, size_t i) {
  double g = 0;
  for (uint32_t j = offsets[u]; j < offsets[u + 1]; ++j) {
    g += static_cast<double>(LoadGrad(grads, grad_type, static_cast<size_t>(positions[j]) * dim + i));
  }
  return g;
}

}  // namespace kernels
}  // namespace cuda
}  // namespace pserver

#endif  // PSERVER_CC_CUDA_UPDATE_MATH_H_
