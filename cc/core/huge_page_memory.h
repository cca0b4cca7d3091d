// Memory for large arrays read at random (a sparse table's rows): an array
// of at least kHugePageBytes is rounded up to whole 2 MiB pages, starts on a
// 2 MiB boundary and is marked for transparent huge pages (madvise
// MADV_HUGEPAGE), so that random reads miss the TLB far less often (in a VM
// a TLB miss walks two page tables). The rounding costs less than 2 MiB per
// array (HugePageArrayBytes says how much is reserved). Smaller arrays come
// from plain malloc. Where the kernel has transparent huge pages off, the
// memory is the same, in 4 KiB pages.
//
//   HugePageArray slots = AllocateHugePageArray(bytes);  // uninitialized
//   std::memset(slots.get(), 0, bytes);
//
// Thread-safe (no shared state); throws std::bad_alloc when out of memory,
// as `new char[bytes]` does.
#ifndef PSERVER_CC_CORE_HUGE_PAGE_MEMORY_H_
#define PSERVER_CC_CORE_HUGE_PAGE_MEMORY_H_

#include <cstddef>
#include <cstdlib>
#include <memory>

namespace pserver {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

struct FreeHugePageArray {
  void operator()(char* p) const { std::free(p); }
};
using HugePageArray = std::unique_ptr<char[], FreeHugePageArray>;

// `bytes` uninitialized bytes (null for 0).
HugePageArray AllocateHugePageArray(size_t bytes);

// The bytes AllocateHugePageArray(bytes) reserves: `bytes` rounded up to
// whole huge pages from kHugePageBytes on.
size_t HugePageArrayBytes(size_t bytes);

}  // namespace pserver

#endif  // PSERVER_CC_CORE_HUGE_PAGE_MEMORY_H_
