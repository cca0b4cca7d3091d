// Raw device pointers: what the CUDA runtime says a pointer is, and queued
// copies between caller-owned device memory and host memory on a Stream.
// For memory cc/cuda did not allocate (a trainer's tensors), where
// buffer.h's range-checked copies need a DeviceBuffer.
//
//   PS_RETURN_IF_ERROR(CheckDeviceRange(ptr, bytes, /*device=*/0));
//   PS_ASSIGN_OR_RETURN(Stream stream, Stream::Create(0));
//   PS_RETURN_IF_ERROR(CopyToHostAsync(pinned.data(), ptr, bytes, stream));
//   PS_RETURN_IF_ERROR(stream.Synchronize());
//
// Errors: UNAVAILABLE without a device ("built without CUDA" for a build
// without nvcc), INVALID_ARGUMENT for a pointer that is not memory of the
// device, with what the runtime says it is. Thread-safe.
#ifndef PSERVER_CC_CUDA_MEMORY_MEMORY_H_
#define PSERVER_CC_CUDA_MEMORY_MEMORY_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cc/cuda/buffer.h"

namespace pserver {
namespace cuda {

enum class MemoryKind {
  kUnregisteredHost,  // ordinary (pageable) host memory
  kPinnedHost,        // cudaMallocHost / cudaHostRegister
  kDevice,            // cudaMalloc
  kManaged,           // cudaMallocManaged
};

// "host memory", "pinned host memory", "device memory", "managed memory"
std::string MemoryKindName(MemoryKind kind);

struct PointerInfo {
  MemoryKind kind = MemoryKind::kUnregisteredHost;
  int device = -1;  // owning device; -1 for unregistered host memory
};

// cudaPointerGetAttributes.
absl::StatusOr<PointerInfo> GetPointerInfo(const void* ptr);

// OK if `ptr` and `ptr + bytes - 1` are device (or managed) memory of
// `device`. INVALID_ARGUMENT naming what they are otherwise ("host memory",
// "device memory of cuda:1"); a null pointer is refused unless bytes is 0.
// (The runtime does not give allocation sizes: a range that runs past its
// allocation into another one of the same device is not caught.)
absl::Status CheckDeviceRange(const void* ptr, size_t bytes, int device);

// Waits for all work queued on `device`, by any stream (cudaDeviceSynchronize):
// what a copy on another stream must wait for when it does not know which
// stream wrote the memory.
absl::Status SynchronizeDevice(int device);

// `bytes` from device memory `src` into host `dst` (pinned for the copy to
// be asynchronous), queued on `stream`; the caller synchronizes it.
absl::Status CopyToHostAsync(void* dst, const void* src, size_t bytes, const Stream& stream);
// `bytes` from host `src` into device memory `dst`, queued on `stream`.
absl::Status CopyFromHostAsync(void* dst, const void* src, size_t bytes, const Stream& stream);

}  // namespace cuda
}  // namespace pserver

#endif  // PSERVER_CC_CUDA_MEMORY_MEMORY_H_
