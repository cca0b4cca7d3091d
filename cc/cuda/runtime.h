// The CUDA runtime calls cc/cuda makes, behind plain C++ declarations (no
// CUDA types), so that the public classes compile with the host compiler and
// link either against runtime.cu (nvcc, static CUDA runtime) or against
// runtime_stub.cc (no CUDA at build time). Internal to cc/cuda (and
// cc/cuda/memory).
//
// Every function returns a cudaError_t value as an int (0: success), or
// kNotBuilt from the stub. Streams are cudaStream_t passed as void*
// (nullptr: the legacy default stream).
//
// Thread-safe as the CUDA runtime is.
#ifndef PSERVER_CC_CUDA_RUNTIME_H_
#define PSERVER_CC_CUDA_RUNTIME_H_

#include <cstddef>
#include <cstdint>

namespace pserver {
namespace cuda {
namespace rt {

// What the stub returns for every call.
constexpr int kNotBuilt = -1;

// True in the nvcc build, false in the stub.
bool Built();

// cudaGetErrorName / cudaGetErrorString, or the stub's "built without CUDA".
const char* ErrorName(int code);
const char* ErrorString(int code);

// Error classes the callers map to absl status codes.
bool IsNoDeviceError(int code);      // no driver, no device, driver too old
bool IsOutOfMemoryError(int code);   // cudaErrorMemoryAllocation
bool IsInvalidValueError(int code);  // cudaErrorInvalidValue, InvalidDevice

struct RawDeviceProperties {
  char name[256];
  size_t total_memory = 0;
  int major = 0, minor = 0;
  int multiprocessors = 0;
  int memory_clock_khz = 0;  // 0 if unknown
  int memory_bus_bits = 0;   // 0 if unknown
};

int GetDeviceCount(int* count);
int GetDeviceProperties(int device, RawDeviceProperties* props);
int MemGetInfo(int device, size_t* free_bytes, size_t* total_bytes);
int SetDevice(int device);
int GetLastError();

int Malloc(int device, void** ptr, size_t bytes);
int Free(int device, void* ptr);
int MallocHost(void** ptr, size_t bytes);  // pinned (page-locked) host memory
int FreeHost(void* ptr);

enum CopyKind : int { kHostToDevice = 1, kDeviceToHost = 2, kDeviceToDevice = 3 };
int MemcpyAsync(void* dst, const void* src, size_t bytes, CopyKind kind, void* stream);
int MemsetAsync(void* dst, int value, size_t bytes, void* stream);

// cudaMemoryType values.
constexpr int kMemoryUnregistered = 0;
constexpr int kMemoryHost = 1;
constexpr int kMemoryDevice = 2;
constexpr int kMemoryManaged = 3;

// cudaPointerGetAttributes: *memory_type gets one of the values above and
// *device the owning device (-1 for unregistered host memory).
int PointerGetAttributes(const void* ptr, int* memory_type, int* device);

int StreamCreate(int device, void** stream);  // non-blocking w.r.t. the default stream
int StreamDestroy(void* stream);
int StreamSynchronize(void* stream);
int DeviceSynchronize(int device);

}  // namespace rt
}  // namespace cuda
}  // namespace pserver

#endif  // PSERVER_CC_CUDA_RUNTIME_H_
