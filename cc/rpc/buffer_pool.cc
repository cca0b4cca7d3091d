#include "cc/rpc/buffer_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace pserver {
namespace {

// Buffers are mapped in multiples of this, so that frames of nearly the same
// size (a payload and its few header bytes) share them.
constexpr size_t kGranuleBytes = size_t{64} << 10;

struct Buffer {
  char* data = nullptr;
  size_t capacity = 0;
  uint64_t freed_at = 0;  // order of release, oldest first out
};

void Unmap(const Buffer& buffer) { munmap(buffer.data, buffer.capacity); }

}  // namespace

struct BufferPool::State {
  explicit State(size_t max, size_t min) : max_bytes(max), min_bytes(min) {}

  // Keeps `buffer` unless that would exceed max_bytes (oldest ones go
  // first); what is dropped is unmapped outside the lock.
  void Release(Buffer buffer) {
    std::vector<Buffer> drop;
    {
      absl::MutexLock lock(&mu);
      if (buffer.capacity > max_bytes || closed) {
        drop.push_back(buffer);
      } else {
        buffer.freed_at = ++clock;
        free.push_back(buffer);
        free_bytes += buffer.capacity;
        TrimLocked(&drop);
      }
      stats.unmapped += drop.size();
    }
    for (const Buffer& b : drop) Unmap(b);
  }

  void TrimLocked(std::vector<Buffer>* drop) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    while (free_bytes > max_bytes && !free.empty()) {
      auto oldest = std::min_element(free.begin(), free.end(), [](const Buffer& a, const Buffer& b) {
        return a.freed_at < b.freed_at;
      });
      free_bytes -= oldest->capacity;
      drop->push_back(*oldest);
      free.erase(oldest);
    }
  }

  absl::Mutex mu;
  size_t max_bytes ABSL_GUARDED_BY(mu);
  const size_t min_bytes;
  bool closed ABSL_GUARDED_BY(mu) = false;  // the pool is gone: keep nothing
  std::vector<Buffer> free ABSL_GUARDED_BY(mu);
  size_t free_bytes ABSL_GUARDED_BY(mu) = 0;
  uint64_t clock ABSL_GUARDED_BY(mu) = 0;
  Stats stats ABSL_GUARDED_BY(mu);
};

namespace {

// A taken buffer, until its slice's last reference goes.
struct Lease {
  std::shared_ptr<BufferPool::State> state;
  Buffer buffer;
};

void ReleaseLease(void* arg) {
  Lease* lease = static_cast<Lease*>(arg);
  lease->state->Release(lease->buffer);
  delete lease;
}

}  // namespace

BufferPool::BufferPool(size_t max_bytes, size_t min_bytes)
    : state_(std::make_shared<State>(max_bytes, std::max<size_t>(1, min_bytes))) {}

BufferPool::~BufferPool() {
  std::vector<Buffer> drop;
  {
    absl::MutexLock lock(&state_->mu);
    state_->closed = true;
    drop.swap(state_->free);
    state_->free_bytes = 0;
  }
  for (const Buffer& b : drop) Unmap(b);
}

grpc::Slice BufferPool::Take(size_t n) {
  Buffer buffer;
  {
    absl::MutexLock lock(&state_->mu);
    if (n < state_->min_bytes || state_->max_bytes == 0) return grpc::Slice(n);
    // The smallest free buffer that holds n bytes without wasting more than n.
    auto best = state_->free.end();
    for (auto it = state_->free.begin(); it != state_->free.end(); ++it) {
      if (it->capacity >= n && it->capacity / 2 <= n &&
          (best == state_->free.end() || it->capacity < best->capacity)) {
        best = it;
      }
    }
    if (best != state_->free.end()) {
      buffer = *best;
      state_->free_bytes -= best->capacity;
      state_->free.erase(best);
      ++state_->stats.reused;
    } else {
      ++state_->stats.mapped;
    }
  }
  if (buffer.data == nullptr) {
    buffer.capacity = (n + kGranuleBytes - 1) / kGranuleBytes * kGranuleBytes;
    void* p = mmap(nullptr, buffer.capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (p == MAP_FAILED) return grpc::Slice(n);
    buffer.data = static_cast<char*>(p);
  }
  auto* lease = new Lease{state_, buffer};
  return grpc::Slice(buffer.data, n, &ReleaseLease, lease);
}

void BufferPool::SetMaxBytes(size_t max_bytes) {
  std::vector<Buffer> drop;
  {
    absl::MutexLock lock(&state_->mu);
    state_->max_bytes = max_bytes;
    state_->TrimLocked(&drop);
    state_->stats.unmapped += drop.size();
  }
  for (const Buffer& b : drop) Unmap(b);
}

BufferPool::Stats BufferPool::stats() const {
  absl::MutexLock lock(&state_->mu);
  Stats stats = state_->stats;
  stats.free_bytes = state_->free_bytes;
  stats.free_buffers = state_->free.size();
  return stats;
}

BufferPool& ProcessBufferPool() {
  static BufferPool* const pool = new BufferPool(0);  // never destroyed: slices may outlive main
  return *pool;
}

}  // namespace pserver
