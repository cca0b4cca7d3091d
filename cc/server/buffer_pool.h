// BufferPool: buffers for received bytes, reused rather than allocated,
// zero-filled and faulted in afresh for every frame (a standby receives
// each replicated write into one: docs/replication.md, "Replication over
// the bulk channel").
//
//   BufferPool pool(/*max_idle_bytes=*/64 << 20);
//   std::shared_ptr<char> buffer = pool.Get(size);   // `size` bytes, not zeroed
//   stream.Read(buffer.get(), size);
//   // ... the last copy of `buffer` gone: back in the pool for a later Get
//
// A buffer is handed out only while nobody holds it: it goes back to the
// pool when the last copy of its shared_ptr goes (or is freed when the pool
// is gone). Get reuses an idle buffer whose size is within an eighth above
// the one asked for, else allocates one (without zero-filling it). Idle
// buffers are bounded by `max_idle_bytes` and kMaxIdleBuffers: a buffer
// returned past either frees the older idle ones first, and one larger than
// the byte bound is freed.
//
// Thread-safe.
#ifndef PSERVER_CC_SERVER_BUFFER_POOL_H_
#define PSERVER_CC_SERVER_BUFFER_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>

namespace pserver {

class BufferPool {
 public:
  static constexpr size_t kMaxIdleBuffers = 64;

  explicit BufferPool(uint64_t max_idle_bytes);
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A buffer of at least `size` bytes whose contents are undefined (what
  // its last user left), held by nobody else.
  std::shared_ptr<char> Get(size_t size);

  // Bytes and buffers idle in the pool now; buffers Get reused so far.
  uint64_t idle_bytes() const;
  size_t idle_buffers() const;
  uint64_t reused() const;

 private:
  struct State;
  struct GiveBack;
  std::shared_ptr<State> state_;
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_BUFFER_POOL_H_
