#include "cc/core/huge_page_memory.h"

#include <sys/mman.h>

#include <new>

namespace pserver {

size_t HugePageArrayBytes(size_t bytes) {
  if (bytes < kHugePageBytes) return bytes;
  return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
}

HugePageArray AllocateHugePageArray(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  if (bytes < kHugePageBytes) {
    p = std::malloc(bytes);
    if (p == nullptr) throw std::bad_alloc();
    return HugePageArray(static_cast<char*>(p));
  }
  // Whole huge pages: a tail in small pages would still miss the TLB on
  // every read that lands in it.
  const size_t whole = HugePageArrayBytes(bytes);
  if (posix_memalign(&p, kHugePageBytes, whole) != 0) throw std::bad_alloc();
  // A kernel with transparent huge pages off refuses the advice: still memory.
  (void)madvise(p, whole, MADV_HUGEPAGE);
  return HugePageArray(static_cast<char*>(p));
}

}  // namespace pserver
