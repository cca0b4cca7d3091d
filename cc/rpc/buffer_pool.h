// BufferPool: large buffers (a bulk frame's payload, a pulled block) kept
// for reuse once their slices are released, so that their pages stay
// faulted in.
//
// Why: glibc serves a thread's allocation of 64 MiB or more (the size of a
// thread arena's heap) with mmap and gives it back with munmap on free, and
// deletes a thread arena's extra heap once everything in it is free; on
// these (virtual) machines the kernel then hands the free pages back to the
// host (free page reporting), and faulting them in again costs about 20 us
// a page: a 64 MiB buffer took 300-400 ms to fault in against 5 ms to fill
// warm, measured on this project's 2-core VM). A frame that happened
// to get such memory made its whole repetition several times slower.
//
//   BufferPool pool(/*max_bytes=*/256 << 20);
//   grpc::Slice payload = pool.Take(n);   // pooled when n >= min_bytes
//   stream.Read(MutableData(payload), n);
//   ...                                   // the last reference back to the pool
//
// Buffers of at least `min_bytes` come from the pool (best fit among free
// buffers of n to 2n bytes, else freshly mapped); when a slice's last
// reference goes, its buffer is kept unless that would make the free
// buffers exceed `max_bytes`, in which case the least recently freed ones
// go first (a buffer over `max_bytes` alone is unmapped). Smaller requests,
// and every request with `max_bytes` 0, are plain gRPC slices. A taken
// buffer's contents are unspecified (the caller fills all of it). Slices may
// outlive the pool (their buffers are then unmapped when released).
//
// Thread-safe.
#ifndef PSERVER_CC_RPC_BUFFER_POOL_H_
#define PSERVER_CC_RPC_BUFFER_POOL_H_

#include <grpcpp/support/slice.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace pserver {

class BufferPool {
 public:
  // Requests below this many bytes are not pooled by default.
  static constexpr size_t kDefaultMinBytes = size_t{256} << 10;

  explicit BufferPool(size_t max_bytes, size_t min_bytes = kDefaultMinBytes);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A slice of exactly `n` bytes, contents unspecified.
  grpc::Slice Take(size_t n);

  // Changes the most free bytes kept (frees buffers beyond it now).
  void SetMaxBytes(size_t max_bytes);

  struct Stats {
    uint64_t reused = 0;      // Takes served by a kept buffer
    uint64_t mapped = 0;      // Takes that mapped a new buffer
    uint64_t unmapped = 0;    // buffers given back to the kernel
    uint64_t free_bytes = 0;  // kept now, free
    uint64_t free_buffers = 0;
  };
  Stats stats() const;

  struct State;  // shared with the slices it lent

 private:
  std::shared_ptr<State> state_;
};

// The pool this process's bulk channel takes its large buffers from (the
// server's request payloads and pulled blocks, the client's replies). It
// keeps nothing until main() sets a limit: `pserver --bulk_buffer_pool_bytes`,
// and bench/e2e for its clients.
BufferPool& ProcessBufferPool();

// The bytes of a slice Take returned, writable.
inline char* MutableData(const grpc::Slice& slice) {
  return reinterpret_cast<char*>(const_cast<uint8_t*>(slice.begin()));
}

}  // namespace pserver

#endif  // PSERVER_CC_RPC_BUFFER_POOL_H_
