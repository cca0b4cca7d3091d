// MemoryBudget: the bytes of one kind of state (dense parameters, table rows)
// that a server may hold, and how many it holds now. Whoever creates such
// state reserves its bytes first and gives them back when it is freed, so a
// client cannot make a server allocate until the OOM killer ends it
// (docs/limits.md, --max_param_bytes and --max_table_row_bytes).
//
//   MemoryBudget budget(64 << 20);
//   if (!budget.TryReserve(bytes)) return RESOURCE_EXHAUSTED naming the flag;
//   ...                        // create the state
//   budget.Release(bytes);     // once it is freed
//
// Add takes bytes whatever the limit: what a checkpoint, a live move or a
// standby's copy brings in was acknowledged elsewhere and is taken whole
// (used() may then exceed limit() until enough is freed).
//
// Thread-safe: one atomic counter, no lock.
#ifndef PSERVER_CC_CORE_MEMORY_BUDGET_H_
#define PSERVER_CC_CORE_MEMORY_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <limits>

namespace pserver {

class MemoryBudget {
 public:
  static constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();

  explicit MemoryBudget(uint64_t limit = kUnlimited) : limit_(limit) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  uint64_t limit() const { return limit_; }
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }

  // Takes `bytes` if used() + bytes stays within limit(); otherwise takes
  // nothing and returns false.
  bool TryReserve(uint64_t bytes) {
    uint64_t used = used_.load(std::memory_order_relaxed);
    do {
      if (bytes > limit_ || used > limit_ - bytes) return false;
    } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    return true;
  }
  // Takes `bytes` whatever the limit.
  void Add(uint64_t bytes) { used_.fetch_add(bytes, std::memory_order_relaxed); }
  // Gives back `bytes` taken by TryReserve or Add.
  void Release(uint64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }
  // Turns a reservation of `reserved` bytes into a use of `used` bytes.
  void Settle(uint64_t reserved, uint64_t used) {
    if (used > reserved) Add(used - reserved);
    if (reserved > used) Release(reserved - used);
  }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};
};

// The physical memory of this machine in bytes (sysconf), 0 if unknown.
uint64_t PhysicalMemoryBytes();

}  // namespace pserver

#endif  // PSERVER_CC_CORE_MEMORY_BUDGET_H_
