// runtime.h and kernels.h for a build without CUDA (no nvcc when it was
// built): every call fails with rt::kNotBuilt, which the public API reports
// as UNAVAILABLE "built without CUDA".
#include "cc/cuda/kernels.h"
#include "cc/cuda/runtime.h"

namespace pserver {
namespace cuda {
namespace rt {

bool Built() { return false; }
const char* ErrorName(int) { return "cudaErrorNotBuilt"; }
const char* ErrorString(int) {
  return "built without CUDA (no nvcc when pserver was built; see docs/cuda.md)";
}
bool IsNoDeviceError(int code) { return code == kNotBuilt; }
bool IsOutOfMemoryError(int) { return false; }
bool IsInvalidValueError(int) { return false; }

int GetDeviceCount(int* count) {
  *count = 0;
  return kNotBuilt;
}
int GetDeviceProperties(int, RawDeviceProperties*) { return kNotBuilt; }
int MemGetInfo(int, size_t*, size_t*) { return kNotBuilt; }
int SetDevice(int) { return kNotBuilt; }
int GetLastError() { return kNotBuilt; }
int Malloc(int, void** ptr, size_t) {
  *ptr = nullptr;
  return kNotBuilt;
}
int Free(int, void*) { return kNotBuilt; }
int MallocHost(void** ptr, size_t) {
  *ptr = nullptr;
  return kNotBuilt;
}
int FreeHost(void*) { return kNotBuilt; }
int MemcpyAsync(void*, const void*, size_t, CopyKind, void*) { return kNotBuilt; }
int MemsetAsync(void*, int, size_t, void*) { return kNotBuilt; }
int PointerGetAttributes(const void*, int* memory_type, int* device) {
  *memory_type = kMemoryUnregistered;
  *device = -1;
  return kNotBuilt;
}
int StreamCreate(int, void** stream) {
  *stream = nullptr;
  return kNotBuilt;
}
int StreamDestroy(void*) { return kNotBuilt; }
int StreamSynchronize(void*) { return kNotBuilt; }
int DeviceSynchronize(int) { return kNotBuilt; }

}  // namespace rt

namespace kernels {

int DenseUpdate(const DenseStep&, float*, const void*, int, float*, float*, size_t, void*) {
  return rt::kNotBuilt;
}
int SumSquares(const void*, int, size_t, double*, void*) { return rt::kNotBuilt; }
int GatherRows(const float*, uint32_t, const uint32_t*, size_t, float*, void*) {
  return rt::kNotBuilt;
}
int ScatterApplyRows(const RowStep&, float*, float*, uint64_t*, uint32_t, uint32_t, const uint32_t*,
                     const uint32_t*, const uint32_t*, size_t, const void*, int, void*) {
  return rt::kNotBuilt;
}

}  // namespace kernels
}  // namespace cuda
}  // namespace pserver
