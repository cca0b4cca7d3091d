// memory_runtime.h for a build without CUDA: every call fails with
// kNotBuilt, reported as UNAVAILABLE "built without CUDA".
#include "cc/cuda/memory/memory_runtime.h"

namespace pserver {
namespace cuda {
namespace memrt {

int PointerGetAttributes(const void*, int* memory_type, int* device) {
  *memory_type = kMemoryUnregistered;
  *device = -1;
  return kNotBuilt;
}

int MemcpyAsync(void*, const void*, size_t, bool, void*) { return kNotBuilt; }
int DeviceSynchronize(int) { return kNotBuilt; }

}  // namespace memrt
}  // namespace cuda
}  // namespace pserver
