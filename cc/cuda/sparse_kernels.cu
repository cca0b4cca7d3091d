// Sparse-row kernels: gather rows into a contiguous buffer, and apply the
// per-row optimizers of cc/core/row_optimizer.cc (sgd, adagrad, adam, add) to
// rows addressed by index with summed gradients. As on the host, gradients
// are summed in double and every update is computed in double and rounded to
// float once per stored value.
#include <cuda_runtime.h>

#include "cc/cuda/grid.cuh"
#include "cc/cuda/kernels.h"
#include "cc/cuda/update_math.h"

namespace pserver {
namespace cuda {
namespace kernels {
namespace {

constexpr unsigned kThreads = 256;

__global__ void GatherKernel(const float* __restrict__ values, uint32_t dim,
                             const uint32_t* __restrict__ rows, size_t n,
                             float* __restrict__ out) {
  const size_t total = n * dim;
  for (size_t e = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<size_t>(blockDim.x) * gridDim.x) {
    const size_t k = e / dim, i = e % dim;
    out[e] = values[static_cast<size_t>(rows[k]) * dim + i];
  }
}

__global__ void ApplyKernel(RowStep s, float* __restrict__ values, float* __restrict__ state,
                            const uint64_t* __restrict__ steps, uint32_t dim,
                            uint32_t state_factor, const uint32_t* __restrict__ rows,
                            const uint32_t* __restrict__ offsets,
                            const uint32_t* __restrict__ positions, size_t num_unique,
                            const void* __restrict__ grads, int grad_type) {
  const size_t total = num_unique * dim;
  for (size_t e = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<size_t>(blockDim.x) * gridDim.x) {
    const size_t u = e / dim, i = e % dim;
    const size_t row = rows[u];
    const double g = RowGradSum(grads, grad_type, dim, offsets, positions, u, i);
    RowElement(s, values + row * dim, state + row * state_factor * dim, dim, i, g,
               steps[row] + 1);
  }
}

__global__ void CountStepsKernel(uint64_t* __restrict__ steps, const uint32_t* __restrict__ rows,
                                 size_t num_unique) {
  for (size_t u = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; u < num_unique;
       u += static_cast<size_t>(blockDim.x) * gridDim.x) {
    steps[rows[u]] += 1;
  }
}

}  // namespace

int GatherRows(const float* values, uint32_t dim, const uint32_t* rows, size_t n, float* out,
               void* stream) {
  if (n == 0 || dim == 0) return cudaSuccess;
  GatherKernel<<<GridFor(n * dim, kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      values, dim, rows, n, out);
  return cudaGetLastError();
}

int ScatterApplyRows(const RowStep& step, float* values, float* state, uint64_t* steps,
                     uint32_t dim, uint32_t state_factor, const uint32_t* rows,
                     const uint32_t* offsets, const uint32_t* positions, size_t num_unique,
                     const void* grads, int grad_type, void* stream) {
  if (num_unique == 0 || dim == 0) return cudaSuccess;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  ApplyKernel<<<GridFor(num_unique * dim, kThreads), kThreads, 0, s>>>(
      step, values, state, steps, dim, state_factor, rows, offsets, positions, num_unique, grads,
      grad_type);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  CountStepsKernel<<<GridFor(num_unique, kThreads), kThreads, 0, s>>>(steps, rows, num_unique);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace cuda
}  // namespace pserver
