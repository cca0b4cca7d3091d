// Dense optimizer kernels: the per-element loops of cc/core/optimizer.cc's
// SgdRule, AdagradRule and AdamRule (Adam and AdamW) for float32 parameters,
// with the same operations in the same order (update_math.h). Compiled with --fmad=false
// (see third_party/cuda/nvcc.bzl) so each operation rounds as on the host;
// sqrtf and '/' are IEEE round-to-nearest by nvcc's defaults.
#include <cuda_runtime.h>

#include "cc/cuda/grid.cuh"
#include "cc/cuda/kernels.h"
#include "cc/cuda/update_math.h"

namespace pserver {
namespace cuda {
namespace kernels {
namespace {

constexpr unsigned kThreads = 256;

template <int kRule>
__global__ void DenseKernel(DenseStep s, float* __restrict__ p, const void* __restrict__ grad,
                            int grad_type, float* __restrict__ slot0, float* __restrict__ slot1,
                            size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(blockDim.x) * gridDim.x) {
    DenseElement<kRule>(s, p, grad, grad_type, slot0, slot1, i);
  }
}

__global__ void SumSquaresKernel(const void* __restrict__ grad, int grad_type, size_t n,
                                 double* sum) {
  __shared__ double partial[kThreads];
  double acc = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(blockDim.x) * gridDim.x) {
    const double g = LoadGrad(grad, grad_type, i);
    acc += g * g;
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(sum, partial[0]);
}

}  // namespace

int DenseUpdate(const DenseStep& step, float* params, const void* grad, int grad_type,
                float* slot0, float* slot1, size_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  const unsigned blocks = GridFor(n, kThreads);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (step.rule) {
    case kDenseSgd:
      DenseKernel<kDenseSgd><<<blocks, kThreads, 0, s>>>(step, params, grad, grad_type, slot0,
                                                          slot1, n);
      break;
    case kDenseAdagrad:
      DenseKernel<kDenseAdagrad><<<blocks, kThreads, 0, s>>>(step, params, grad, grad_type,
                                                              slot0, slot1, n);
      break;
    default:
      DenseKernel<kDenseAdam><<<blocks, kThreads, 0, s>>>(step, params, grad, grad_type, slot0,
                                                           slot1, n);
      break;
  }
  return cudaGetLastError();
}

int SumSquares(const void* grad, int grad_type, size_t n, double* sum, void* stream) {
  if (n == 0) return cudaSuccess;
  size_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > 1024) blocks = 1024;
  SumSquaresKernel<<<static_cast<unsigned>(blocks), kThreads, 0,
                     static_cast<cudaStream_t>(stream)>>>(grad, grad_type, n, sum);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace cuda
}  // namespace pserver
