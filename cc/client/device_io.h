// Push gradients straight from, and pull parameters straight into, device
// memory (a CUDA trainer's tensors), staged through pinned host memory.
//
//   // One call (staging allocated for the call):
//   PS_RETURN_IF_ERROR(SendGradFromDevice(*client, "w", v1::FLOAT32, {1024, 1024}, d_grad,
//                                         /*device=*/0));
//   PS_RETURN_IF_ERROR(GetParamToDevice(*client, "w", d_param, 4 << 20, /*device=*/0));
//
//   // A training loop: one DeviceIo keeps its streams and pinned buffers.
//   PS_ASSIGN_OR_RETURN(auto io, DeviceIo::ForCuda(client.get(), /*device=*/0));
//   PS_RETURN_IF_ERROR(io->PushPull("w", v1::FLOAT32, {1024, 1024}, d_grad, d_param));
//
// The pipeline: a parameter's blocks (ClientOptions::block_bytes, spread
// over the servers) are grouped into chunks of about `chunk_bytes`; `depth`
// staging slots are used in turn. A push copies chunk i+1 from the device
// while chunk i is on the network; a pull copies chunk i to the device
// while chunk i+1 is on the network (a push-pull does both). Every chunk's
// requests carry request ids and are retried like the Client's own, within
// the call's deadline (CallOptions and ClientOptions::timeout, as Client).
// A parameter that fits in one block is one chunk: nothing to overlap.
// Each call first waits for the work already queued on the device (any
// stream: the trainer's stream is not known), so a gradient written by a
// kernel just launched is read whole, and returns once the parameter is in
// device memory.
// A parameter of several blocks that clips by norm needs the whole
// gradient's norm before its first block is sent: its gradient is staged
// whole first (chunk by chunk), then sent. The first call for a parameter
// this client has not seen reads its block 0 once to learn its layout.
//
// Non-finite gradients (as Client, client.h): the staged gradient is
// scanned for NaN and infinity before it is sent. A gradient that is one
// chunk, or is staged whole (clip-by-norm over several blocks), is checked
// whole first: refused with nothing sent (non_finite: REJECT), or every
// block marked to be skipped by every server (SKIP). A gradient pipelined
// over several chunks is checked chunk by chunk, each before it is sent:
// a NaN in chunk k refuses chunks k.. (REJECT) or marks them skipped
// (SKIP), but chunks 0..k-1 were already sent and stay applied. Make
// chunk_bytes at least the parameter's size for an all-or-nothing push.
//
// Errors: UNAVAILABLE "no CUDA device: ..." without a device or CUDA;
// INVALID_ARGUMENT for a pointer that is not device memory of that device
// (saying what it is), a size, type or shape that does not match the
// parameter; DEADLINE_EXCEEDED past the deadline; a server's error as the
// Client reports it. A failed push may have been applied by some servers
// and not others (as a Client push over several servers); a failed pull
// leaves the device memory's contents unspecified.
//
// DeviceIo is not thread-safe: one thread at a time (use one per trainer
// thread; the Client itself may be shared).
#ifndef PSERVER_CC_CLIENT_DEVICE_IO_H_
#define PSERVER_CC_CLIENT_DEVICE_IO_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/client/memory_space.h"
#include "cc/core/tensor.h"

namespace pserver {

struct DeviceIoOptions {
  // Bytes per chunk (whole blocks; a block larger than this is a chunk).
  size_t chunk_bytes = size_t{4} << 20;
  // Staging slots in turn (>= 1; 2 overlaps one copy with one network call).
  int depth = 2;
};

// What the last call did: for tests, benchmarks and the curious.
struct DeviceIoStats {
  int chunks = 0;                    // network calls (one per chunk)
  uint64_t bytes_to_host = 0;        // device -> staging
  uint64_t bytes_to_device = 0;      // staging -> device
  int copy_waits = 0;                // waits for copies
  int copy_waits_overlapped = 0;     // ... made while a network call was in flight
  int max_network_in_flight = 0;     // chunks on the network at once
  bool staged_whole = false;         // the gradient was staged whole (clip-by-norm)
  absl::Duration copy_wait_time;     // spent waiting for copies
  absl::Duration network_wait_time;  // spent waiting for the network
};

class DeviceIo {
 public:
  // For CUDA device `device`, with streams (one per staging slot) made now.
  // UNAVAILABLE "no CUDA device: <the runtime's reason>" without a device;
  // INVALID_ARGUMENT for a device that does not exist.
  static absl::StatusOr<std::unique_ptr<DeviceIo>> ForCuda(Client* client, int device,
                                                           DeviceIoOptions options = {});
  // Over any memory space (HostMemorySpace in tests), whose lanes() must be
  // at least options.depth. `client` and `space` must outlive this.
  DeviceIo(Client* client, MemorySpace* space, DeviceIoOptions options = {});
  ~DeviceIo();

  // Sends a gradient of `type` and `shape` (the parameter's) from `grad`,
  // C-contiguous memory of this space.
  absl::Status SendGrad(const std::string& name, ElementType type, const Shape& shape,
                        const void* grad, const CallOptions& call = {});
  // Reads parameter `name` into `out`: `bytes` must be its size exactly,
  // and `type`, unless ELEMENT_TYPE_UNSPECIFIED, its element type.
  absl::Status GetParam(const std::string& name, void* out, size_t bytes,
                        ElementType type = v1::ELEMENT_TYPE_UNSPECIFIED,
                        const CallOptions& call = {});
  // Sends the gradient and reads the updated parameter into `out` (the
  // parameter's size), one round trip per chunk. `out` may be `grad`.
  absl::Status PushPull(const std::string& name, ElementType type, const Shape& shape,
                        const void* grad, void* out, const CallOptions& call = {});

  const DeviceIoStats& last_stats() const { return stats_; }
  MemorySpace& space() { return *space_; }

 private:
  struct Chunk;
  enum class Mode { kPush, kPull, kPushPull };

  // The parameter's layout, learned from block 0 if the client has not seen it.
  absl::StatusOr<Client::Layout> FindOrLearnLayout(const std::string& name, absl::Time deadline,
                                                   TraceRecorder* trace);
  absl::Status CheckGradientLayout(const std::string& name, ElementType type, const Shape& shape,
                                   const Client::Layout& layout) const;
  absl::Status Transfer(Mode mode, const std::string& name, const Client::Layout& layout,
                        const char* grad, char* out, absl::Time deadline, TraceRecorder* trace);
  // One chunk's requests (pushes of its blocks from `grad_stage`, reads of
  // them into `param_stage`), retried like the Client's.
  absl::Status ExchangeChunk(const std::string& name, const Client::Layout& layout,
                             const Chunk& chunk, const char* grad_stage, char* param_stage,
                             std::optional<double> norm, bool skip, absl::Time deadline,
                             TraceRecorder* trace);
  // Staging of at least `bytes` in slot `slot` of `slots`.
  absl::StatusOr<char*> Staging(std::vector<std::unique_ptr<StagingBuffer>>& slots, size_t slot,
                                size_t bytes);

  Client* const client_;
  std::unique_ptr<MemorySpace> owned_space_;  // ForCuda's
  MemorySpace* const space_;
  const DeviceIoOptions options_;
  std::vector<std::unique_ptr<StagingBuffer>> grad_slots_;   // kept between calls
  std::vector<std::unique_ptr<StagingBuffer>> param_slots_;  // kept between calls
  DeviceIoStats stats_;

  DeviceIo(Client* client, std::unique_ptr<MemorySpace> space, DeviceIoOptions options);
};

// The CUDA space of `device`: pinned staging, one stream per lane,
// pointers checked with cudaPointerGetAttributes. UNAVAILABLE "no CUDA
// device: ..." without one.
absl::StatusOr<std::unique_ptr<MemorySpace>> CudaMemorySpace(int device, int lanes);

// One-call forms over a DeviceIo made for the call (streams and pinned
// staging allocated each time: a loop should keep a DeviceIo).
absl::Status SendGradFromDevice(Client& client, const std::string& name, ElementType type,
                                const Shape& shape, const void* device_ptr, int device,
                                const CallOptions& call = {}, const DeviceIoOptions& io = {});
absl::Status GetParamToDevice(Client& client, const std::string& name, void* device_ptr,
                              size_t bytes, int device, const CallOptions& call = {},
                              const DeviceIoOptions& io = {});
absl::Status PushPullDevice(Client& client, const std::string& name, ElementType type,
                            const Shape& shape, const void* grad_device_ptr, void* param_device_ptr,
                            int device, const CallOptions& call = {},
                            const DeviceIoOptions& io = {});

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_DEVICE_IO_H_
