// The CUDA runtime calls memory.h makes, behind plain C++ declarations (no
// CUDA types), as cc/cuda/runtime.h does: compiled by nvcc in
// memory_runtime.cu (static CUDA runtime), or answered kNotBuilt by
// memory_runtime_stub.cc. Internal to cc/cuda/memory. Thread-safe as the
// CUDA runtime is.
#ifndef PSERVER_CC_CUDA_MEMORY_MEMORY_RUNTIME_H_
#define PSERVER_CC_CUDA_MEMORY_MEMORY_RUNTIME_H_

#include <cstddef>

namespace pserver {
namespace cuda {
namespace memrt {

// What the stub returns for every call.
constexpr int kNotBuilt = -1;

// cudaMemoryType values.
constexpr int kMemoryUnregistered = 0;
constexpr int kMemoryHost = 1;
constexpr int kMemoryDevice = 2;
constexpr int kMemoryManaged = 3;

// Error codes are cudaError_t values as ints (or kNotBuilt): cc/cuda's
// CudaStatus (cuda_status.h) names and classifies them.

// cudaPointerGetAttributes: *memory_type gets one of the values above and
// *device the owning device (-1 for unregistered host memory). Returns a
// cudaError_t as an int (0: success).
int PointerGetAttributes(const void* ptr, int* memory_type, int* device);

// cudaMemcpyAsync device-to-host (to_host) or host-to-device on `stream`
// (a cudaStream_t).
int MemcpyAsync(void* dst, const void* src, size_t bytes, bool to_host, void* stream);

// cudaSetDevice + cudaDeviceSynchronize.
int DeviceSynchronize(int device);

}  // namespace memrt
}  // namespace cuda
}  // namespace pserver

#endif  // PSERVER_CC_CUDA_MEMORY_MEMORY_RUNTIME_H_
