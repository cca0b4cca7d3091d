// runtime.h over the CUDA runtime API (linked statically: cudart_static).
#include <cuda_runtime.h>

#include <cstring>

#include "cc/cuda/runtime.h"

namespace pserver {
namespace cuda {
namespace rt {

bool Built() { return true; }

const char* ErrorName(int code) {
  if (code == kNotBuilt) return "cudaErrorNotBuilt";
  return cudaGetErrorName(static_cast<cudaError_t>(code));
}

const char* ErrorString(int code) {
  if (code == kNotBuilt) return "built without CUDA";
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

bool IsNoDeviceError(int code) {
  switch (static_cast<cudaError_t>(code)) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorStubLibrary:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorNoKernelImageForDevice:
      return true;
    default:
      return false;
  }
}

bool IsOutOfMemoryError(int code) { return code == cudaErrorMemoryAllocation; }

bool IsInvalidValueError(int code) {
  return code == cudaErrorInvalidValue || code == cudaErrorInvalidDevice ||
         code == cudaErrorInvalidDevicePointer;
}

int GetDeviceCount(int* count) {
  *count = 0;
  cudaError_t err = cudaGetDeviceCount(count);
  if (err != cudaSuccess) {
    *count = 0;
    cudaGetLastError();  // clear the sticky-free error so later calls report their own
  }
  return err;
}

int GetDeviceProperties(int device, RawDeviceProperties* props) {
  cudaDeviceProp p;
  cudaError_t err = cudaGetDeviceProperties(&p, device);
  if (err != cudaSuccess) return err;
  std::memset(props->name, 0, sizeof(props->name));
  std::strncpy(props->name, p.name, sizeof(props->name) - 1);
  props->total_memory = p.totalGlobalMem;
  props->major = p.major;
  props->minor = p.minor;
  props->multiprocessors = p.multiProcessorCount;
  // CUDA 13 dropped these from cudaDeviceProp; the attributes remain.
  int value = 0;
  props->memory_clock_khz =
      cudaDeviceGetAttribute(&value, cudaDevAttrMemoryClockRate, device) == cudaSuccess ? value : 0;
  value = 0;
  props->memory_bus_bits =
      cudaDeviceGetAttribute(&value, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess ? value
                                                                                             : 0;
  cudaGetLastError();
  return cudaSuccess;
}

int MemGetInfo(int device, size_t* free_bytes, size_t* total_bytes) {
  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) return err;
  return cudaMemGetInfo(free_bytes, total_bytes);
}

int SetDevice(int device) { return cudaSetDevice(device); }
int GetLastError() { return cudaGetLastError(); }

int Malloc(int device, void** ptr, size_t bytes) {
  *ptr = nullptr;
  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) return err;
  err = cudaMalloc(ptr, bytes);
  if (err != cudaSuccess) {
    *ptr = nullptr;
    cudaGetLastError();
  }
  return err;
}

int Free(int device, void* ptr) {
  cudaSetDevice(device);
  return cudaFree(ptr);
}

int MallocHost(void** ptr, size_t bytes) {
  *ptr = nullptr;
  cudaError_t err = cudaMallocHost(ptr, bytes);
  if (err != cudaSuccess) {
    *ptr = nullptr;
    cudaGetLastError();
  }
  return err;
}

int FreeHost(void* ptr) { return cudaFreeHost(ptr); }

int MemcpyAsync(void* dst, const void* src, size_t bytes, CopyKind kind, void* stream) {
  cudaMemcpyKind k = kind == kHostToDevice   ? cudaMemcpyHostToDevice
                     : kind == kDeviceToHost ? cudaMemcpyDeviceToHost
                                             : cudaMemcpyDeviceToDevice;
  return cudaMemcpyAsync(dst, src, bytes, k, static_cast<cudaStream_t>(stream));
}

int MemsetAsync(void* dst, int value, size_t bytes, void* stream) {
  return cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream));
}

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

int StreamCreate(int device, void** stream) {
  *stream = nullptr;
  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) return err;
  cudaStream_t s = nullptr;
  err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (err == cudaSuccess) *stream = s;
  return err;
}

int StreamDestroy(void* stream) { return cudaStreamDestroy(static_cast<cudaStream_t>(stream)); }

int StreamSynchronize(void* stream) {
  return cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
}

int DeviceSynchronize(int device) {
  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) return err;
  return cudaDeviceSynchronize();
}

}  // namespace rt
}  // namespace cuda
}  // namespace pserver
