#include "cc/server/buffer_pool.h"

#include <list>
#include <utility>

#include "absl/synchronization/mutex.h"

namespace pserver {

struct BufferPool::State {
  explicit State(uint64_t max) : max_idle_bytes(max) {}
  struct Idle {
    char* data;
    size_t size;
  };
  const uint64_t max_idle_bytes;
  mutable absl::Mutex mu;
  std::list<Idle> idle ABSL_GUARDED_BY(mu);  // oldest returned first
  uint64_t idle_bytes ABSL_GUARDED_BY(mu) = 0;
  uint64_t reused ABSL_GUARDED_BY(mu) = 0;

  ~State() {
    for (const Idle& buffer : idle) delete[] buffer.data;
  }
  // Takes `buffer` back, freeing older idle buffers to stay within the bound.
  void Return(char* data, size_t size) {
    if (size > max_idle_bytes) {
      delete[] data;
      return;
    }
    std::list<Idle> freed;
    {
      absl::MutexLock lock(&mu);
      while (!idle.empty() &&
             (idle_bytes + size > max_idle_bytes || idle.size() >= kMaxIdleBuffers)) {
        idle_bytes -= idle.front().size;
        freed.splice(freed.end(), idle, idle.begin());
      }
      idle.push_back({data, size});
      idle_bytes += size;
    }
    for (const Idle& buffer : freed) delete[] buffer.data;
  }
};

// Returns a buffer to its pool when its last holder lets go (frees it when
// the pool is gone).
struct BufferPool::GiveBack {
  std::weak_ptr<State> pool;
  size_t size;
  void operator()(char* data) const {
    if (std::shared_ptr<State> state = pool.lock()) {
      state->Return(data, size);
    } else {
      delete[] data;
    }
  }
};

BufferPool::BufferPool(uint64_t max_idle_bytes)
    : state_(std::make_shared<State>(max_idle_bytes)) {}

std::shared_ptr<char> BufferPool::Get(size_t size) {
  char* data = nullptr;
  size_t capacity = size;
  {
    absl::MutexLock lock(&state_->mu);
    // The best fit among idle buffers at most an eighth larger, the most
    // recently returned first (its pages the likeliest in cache); an exact
    // fit ends the search.
    auto best = state_->idle.end();
    for (auto it = state_->idle.end(); it != state_->idle.begin();) {
      --it;
      if (it->size < size || it->size - size > size / 8) continue;
      if (best == state_->idle.end() || it->size < best->size) best = it;
      if (it->size == size) break;
    }
    if (best != state_->idle.end()) {
      data = best->data;
      capacity = best->size;
      state_->idle_bytes -= best->size;
      state_->idle.erase(best);
      ++state_->reused;
    }
  }
  if (data == nullptr) data = new char[capacity > 0 ? capacity : 1];  // not zeroed
  return std::shared_ptr<char>(data, GiveBack{state_, capacity});
}

uint64_t BufferPool::idle_bytes() const {
  absl::MutexLock lock(&state_->mu);
  return state_->idle_bytes;
}

size_t BufferPool::idle_buffers() const {
  absl::MutexLock lock(&state_->mu);
  return state_->idle.size();
}

uint64_t BufferPool::reused() const {
  absl::MutexLock lock(&state_->mu);
  return state_->reused;
}

}  // namespace pserver
