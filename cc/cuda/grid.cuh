// Launch geometry shared by cc/cuda's kernels. Internal to cc/cuda.
#ifndef PSERVER_CC_CUDA_GRID_CUH_
#define PSERVER_CC_CUDA_GRID_CUH_

#include <cstddef>

namespace pserver {
namespace cuda {
namespace kernels {

// Blocks for a grid-stride loop over n elements.
inline unsigned GridFor(size_t n, unsigned threads) {
  size_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535u * 8) blocks = 65535u * 8;
  return blocks == 0 ? 1u : static_cast<unsigned>(blocks);
}

}  // namespace kernels
}  // namespace cuda
}  // namespace pserver

#endif  // PSERVER_CC_CUDA_GRID_CUH_
