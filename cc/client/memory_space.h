// MemorySpace: where the tensors of a device push/pull live, and how bytes
// move between that memory and host staging buffers (cc/client/device_io.h).
// DeviceIo's staging pipeline speaks only to this interface, so its logic
// (chunking, ordering, overlap, errors, deadlines) runs and is tested
// without a GPU against HostMemorySpace; CudaMemorySpace (device_io.h) is
// the one trainers use.
//
//   HostMemorySpace space(HostMemorySpace::Options{});
//   PS_ASSIGN_OR_RETURN(auto staging, space.AllocateStaging(4 << 20));
//   PS_RETURN_IF_ERROR(space.StartCopyToHost(/*lane=*/0, staging->data(), src, n));
//   PS_RETURN_IF_ERROR(space.Wait(0));
//
// Copies are queued on lanes (0 .. lanes()-1): copies on one lane run in
// order, lanes run independently of each other and of the caller, and
// Wait(lane) returns once everything queued on it is done (with the first
// error of that work). Not thread-safe: one pipeline uses a space at a time.
#ifndef PSERVER_CC_CLIENT_MEMORY_SPACE_H_
#define PSERVER_CC_CLIENT_MEMORY_SPACE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pserver {

// Host memory a space copies into and out of (pinned for CUDA); freed by
// the destructor.
class StagingBuffer {
 public:
  virtual ~StagingBuffer() = default;
  virtual char* data() const = 0;
  virtual size_t size() const = 0;
};

class MemorySpace {
 public:
  virtual ~MemorySpace() = default;

  // For messages: "cuda:0", "host".
  virtual std::string name() const = 0;
  virtual int lanes() const = 0;

  // OK if [ptr, ptr + bytes) is memory of this space; INVALID_ARGUMENT
  // saying what it is otherwise.
  virtual absl::Status CheckRange(const void* ptr, size_t bytes) = 0;

  // Called before a call's first copy: waits for work already queued that
  // may still write the caller's memory (CUDA: on any stream of the device,
  // since the caller's stream is not known).
  virtual absl::Status BeginCall() { return absl::OkStatus(); }

  virtual absl::StatusOr<std::unique_ptr<StagingBuffer>> AllocateStaging(size_t bytes) = 0;

  // Queue `bytes` from this space's `src` to host `dst`, or from host `src`
  // to this space's `dst`, on `lane`. The memory must stay valid until
  // Wait(lane) returns.
  virtual absl::Status StartCopyToHost(int lane, void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status StartCopyFromHost(int lane, void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status Wait(int lane) = 0;
};

// A MemorySpace over ordinary host memory, for tests and benchmarks of the
// pipeline: copies are memcpy (optionally slowed down), every copy is
// logged, and failures can be injected.
class HostMemorySpace : public MemorySpace {
 public:
  struct Options {
    int lanes = 2;
    // Each copy takes at least this long (a slow PCIe link), so that tests
    // can see copies overlap network calls.
    absl::Duration copy_delay = absl::ZeroDuration();
    // Called as each copy starts, before it runs (tests that order copies
    // against network calls).
    std::function<void()> on_copy_start;
    // The copy with this 0-based index (counting both directions) fails
    // with INTERNAL "injected copy failure"; -1: none fails.
    int fail_copy = -1;
    // CheckRange refuses pointers in [refuse_begin, refuse_end) as "not
    // memory of this space" (tests of the pointer check).
    const void* refuse_begin = nullptr;
    const void* refuse_end = nullptr;
  };

  struct Copy {
    bool to_host = false;
    int lane = 0;
    const void* space_ptr = nullptr;  // the end in this space
    size_t bytes = 0;
    absl::Time started;
    absl::Time finished;
  };

  explicit HostMemorySpace(Options options) : options_(options) {}

  std::string name() const override { return "host"; }
  int lanes() const override { return options_.lanes; }
  absl::Status CheckRange(const void* ptr, size_t bytes) override;
  absl::StatusOr<std::unique_ptr<StagingBuffer>> AllocateStaging(size_t bytes) override;
  absl::Status StartCopyToHost(int lane, void* dst, const void* src, size_t bytes) override;
  absl::Status StartCopyFromHost(int lane, void* dst, const void* src, size_t bytes) override;
  absl::Status Wait(int lane) override;

  // Every copy made so far, in the order they ran.
  std::vector<Copy> copies() const;
  // Bytes of staging allocated so far, and Waits.
  size_t staging_bytes_allocated() const;
  int waits() const;

 private:
  absl::Status DoCopy(bool to_host, int lane, void* dst, const void* src, size_t bytes);

  const Options options_;
  mutable absl::Mutex mu_;
  std::vector<Copy> copies_ ABSL_GUARDED_BY(mu_);
  size_t staging_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int waits_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_MEMORY_SPACE_H_
