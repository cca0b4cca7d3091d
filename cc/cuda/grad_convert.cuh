// In-kernel conversion of float32 / float16 / bfloat16 gradient elements to
// float (exact: both half formats are subsets of float). Internal to cc/cuda.
#ifndef PSERVER_CC_CUDA_GRAD_CONVERT_CUH_
#define PSERVER_CC_CUDA_GRAD_CONVERT_CUH_

#include <cuda_fp16.h>

#include <cstdint>

#include "cc/cuda/kernels.h"

namespace pserver {
namespace cuda {
namespace kernels {

__device__ __forceinline__ float LoadGrad(const void* grad, int grad_type, size_t i) {
  switch (grad_type) {
    case kGradFloat16:
      return __half2float(__ushort_as_half(static_cast<const unsigned short*>(grad)[i]));
    case kGradBfloat16:
      return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(grad)[i]) << 16);
    default:
      return static_cast<const float*>(grad)[i];
  }
}

// Blocks for a grid-stride loop over n elements.
inline unsigned GridFor(size_t n, unsigned threads) {
  size_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535u * 8) blocks = 65535u * 8;
  return blocks == 0 ? 1u : static_cast<unsigned>(blocks);
}

}  // namespace kernels
}  // namespace cuda
}  // namespace pserver

#endif  // PSERVER_CC_CUDA_GRAD_CONVERT_CUH_
