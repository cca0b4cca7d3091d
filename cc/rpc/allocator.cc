#include "cc/rpc/allocator.h"

#include <malloc.h>

#include <climits>

namespace pserver {

bool KeepFreedMemoryForReuse(size_t mmap_threshold, size_t trim_threshold) {
  if (mmap_threshold > INT_MAX || trim_threshold > INT_MAX) return false;
  return mallopt(M_MMAP_THRESHOLD, static_cast<int>(mmap_threshold)) == 1 &&
         mallopt(M_TRIM_THRESHOLD, static_cast<int>(trim_threshold)) == 1;
}

}  // namespace pserver
