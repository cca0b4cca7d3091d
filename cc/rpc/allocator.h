// Allocator settings for processes that move large tensors.
//
// On this kind of (virtual) machine a page fault costs far more than a copy,
// and glibc by default returns freed buffers of a megabyte or more to the
// kernel, so every 1 MiB message buffer is faulted in afresh. Keeping freed
// memory for reuse made the gRPC data path 2-3x faster here (bench/RESULTS.md).
//
//   int main(int argc, char** argv) {
//     pserver::KeepFreedMemoryForReuse();   // first thing, before any thread
//     ...
//
// Process-wide: call it from main(), never from a library. Thread-safe.
#ifndef PSERVER_CC_RPC_ALLOCATOR_H_
#define PSERVER_CC_RPC_ALLOCATOR_H_

#include <cstddef>

namespace pserver {

// Serves allocations up to `mmap_threshold` bytes from the heap and keeps up
// to `trim_threshold` freed bytes at its top instead of returning them to the
// kernel. Returns false if the C library refused (then nothing changed).
bool KeepFreedMemoryForReuse(size_t mmap_threshold = size_t{256} << 20,
                             size_t trim_threshold = size_t{1} << 30);

}  // namespace pserver

#endif  // PSERVER_CC_RPC_ALLOCATOR_H_
