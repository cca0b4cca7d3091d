// memory_runtime.h over the CUDA runtime API (linked statically).
#include <cuda_runtime.h>

#include "cc/cuda/memory/memory_runtime.h"

namespace pserver {
namespace cuda {
namespace memrt {

int PointerGetAttributes(const void* ptr, int* memory_type, int* device) {
  *memory_type = kMemoryUnregistered;
  *device = -1;
  cudaPointerAttributes attributes;
  cudaError_t err = cudaPointerGetAttributes(&attributes, ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();  // not sticky: later calls report their own errors
    return err;
  }
  *memory_type = static_cast<int>(attributes.type);
  *device = attributes.type == cudaMemoryTypeUnregistered ? -1 : attributes.device;
  return cudaSuccess;
}

int MemcpyAsync(void* dst, const void* src, size_t bytes, bool to_host, void* stream) {
  return cudaMemcpyAsync(dst, src, bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                         static_cast<cudaStream_t>(stream));
}

int DeviceSynchronize(int device) {
  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) return err;
  return cudaDeviceSynchronize();
}

}  // namespace memrt
}  // namespace cuda
}  // namespace pserver
