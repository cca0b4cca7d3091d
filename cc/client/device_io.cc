#include "cc/client/device_io.h"

#include <algorithm>
#include <cmath>
#include <future>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/core/finite.h"
#include "cc/core/status_macros.h"
#include "cc/cuda/buffer.h"
#include "cc/cuda/device.h"
#include "cc/cuda/memory/memory.h"

namespace pserver {
namespace {

class PinnedStaging : public StagingBuffer {
 public:
  explicit PinnedStaging(cuda::PinnedBuffer buffer) : buffer_(std::move(buffer)) {}
  char* data() const override { return buffer_.as<char>(); }
  size_t size() const override { return buffer_.size(); }

 private:
  cuda::PinnedBuffer buffer_;
};

class CudaSpace : public MemorySpace {
 public:
  CudaSpace(int device, std::vector<cuda::Stream> streams)
      : device_(device), streams_(std::move(streams)) {}

  std::string name() const override { return absl::StrCat("cuda:", device_); }
  int lanes() const override { return static_cast<int>(streams_.size()); }

  absl::Status CheckRange(const void* ptr, size_t bytes) override {
    return cuda::CheckDeviceRange(ptr, bytes, device_);
  }
  absl::Status BeginCall() override { return cuda::SynchronizeDevice(device_); }
  absl::StatusOr<std::unique_ptr<StagingBuffer>> AllocateStaging(size_t bytes) override {
    PS_ASSIGN_OR_RETURN(cuda::PinnedBuffer buffer, cuda::PinnedBuffer::Allocate(bytes));
    return std::unique_ptr<StagingBuffer>(new PinnedStaging(std::move(buffer)));
  }
  absl::Status StartCopyToHost(int lane, void* dst, const void* src, size_t bytes) override {
    return cuda::CopyToHostAsync(dst, src, bytes, streams_.at(lane));
  }
  absl::Status StartCopyFromHost(int lane, void* dst, const void* src, size_t bytes) override {
    return cuda::CopyFromHostAsync(dst, src, bytes, streams_.at(lane));
  }
  absl::Status Wait(int lane) override { return streams_.at(lane).Synchronize(); }

 private:
  const int device_;
  std::vector<cuda::Stream> streams_;
};

const char* ModeName(int mode) {
  return mode == 0 ? "device push" : mode == 1 ? "device pull" : "device push-pull";
}

}  // namespace

// Consecutive whole blocks of a parameter, `offset` and `bytes` in its bytes.
struct DeviceIo::Chunk {
  std::vector<BlockSpec> blocks;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

absl::StatusOr<std::unique_ptr<MemorySpace>> CudaMemorySpace(int device, int lanes) {
  absl::StatusOr<int> count = cuda::CudaDeviceCount();
  if (!count.ok()) {
    return absl::UnavailableError(absl::StrCat("no CUDA device: ", count.status().message()));
  }
  if (device < 0 || device >= *count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA device ", device, " does not exist: ", *count, " device(s), 0..", *count - 1));
  }
  std::vector<cuda::Stream> streams;
  for (int i = 0; i < std::max(1, lanes); ++i) {
    PS_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create(device));
    streams.push_back(std::move(stream));
  }
  return std::unique_ptr<MemorySpace>(new CudaSpace(device, std::move(streams)));
}

absl::StatusOr<std::unique_ptr<DeviceIo>> DeviceIo::ForCuda(Client* client, int device,
                                                            DeviceIoOptions options) {
  if (client == nullptr) return absl::InvalidArgumentError("DeviceIo: the client is null");
  PS_ASSIGN_OR_RETURN(std::unique_ptr<MemorySpace> space,
                      CudaMemorySpace(device, std::max(1, options.depth)));
  return std::unique_ptr<DeviceIo>(new DeviceIo(client, std::move(space), options));
}

DeviceIo::DeviceIo(Client* client, std::unique_ptr<MemorySpace> space, DeviceIoOptions options)
    : DeviceIo(client, space.get(), options) {
  owned_space_ = std::move(space);
}

DeviceIo::DeviceIo(Client* client, MemorySpace* space, DeviceIoOptions options)
    : client_(client), space_(space), options_([&] {
        DeviceIoOptions o = options;
        o.chunk_bytes = std::max<size_t>(1, o.chunk_bytes);
        o.depth = std::clamp(o.depth, 1, std::max(1, space->lanes()));
        return o;
      }()) {}

DeviceIo::~DeviceIo() = default;

absl::StatusOr<char*> DeviceIo::Staging(std::vector<std::unique_ptr<StagingBuffer>>& slots,
                                        size_t slot, size_t bytes) {
  if (slots.size() <= slot) slots.resize(slot + 1);
  if (slots[slot] == nullptr || slots[slot]->size() < bytes) {
    slots[slot].reset();  // free the old one first
    PS_ASSIGN_OR_RETURN(slots[slot], space_->AllocateStaging(bytes));
  }
  return slots[slot]->data();
}

absl::StatusOr<Client::Layout> DeviceIo::FindOrLearnLayout(const std::string& name,
                                                           absl::Time deadline,
                                                           TraceRecorder* trace) {
  return client_->FindOrLearnLayout(name, deadline, trace);
}

absl::Status DeviceIo::CheckGradientLayout(const std::string& name, ElementType type,
                                           const Shape& shape, const Client::Layout& layout) const {
  const std::string what = absl::StrCat("gradient for parameter '", name, "'");
  PS_RETURN_IF_ERROR(ValidateStorableType(type, what));
  PS_ASSIGN_OR_RETURN(int64_t n, NumElements(shape));
  if (n == 0) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (type != layout.type) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": element type ", ElementTypeName(type),
                                                   " received, ", ElementTypeName(layout.type),
                                                   " expected"));
  }
  if (static_cast<uint64_t>(n) != layout.elements) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", n, " values (shape ", ShapeString(shape), ") received, ",
                     layout.elements, " expected (shape ", ShapeString(layout.shape), ")"));
  }
  const uint32_t blocks = client_->placement().BlockCount(layout.elements, ElementSize(type));
  if (blocks != layout.blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter '", name, "' is stored as ", layout.blocks,
                     " blocks; this client's block_bytes gives ", blocks,
                     ": every client of a cluster must use the same block size"));
  }
  return absl::OkStatus();
}

absl::Status DeviceIo::SendGrad(const std::string& name, ElementType type, const Shape& shape,
                                const void* grad, const CallOptions& call) {
  stats_ = {};
  const absl::Time deadline = client_->Deadline(call);
  PS_RETURN_IF_ERROR(
      ValidateStorableType(type, absl::StrCat("gradient for parameter '", name, "'")));
  PS_ASSIGN_OR_RETURN(int64_t n, NumElements(shape));
  PS_RETURN_IF_ERROR(space_->CheckRange(grad, static_cast<size_t>(n) * ElementSize(type)));
  PS_ASSIGN_OR_RETURN(Client::Layout layout, FindOrLearnLayout(name, deadline, call.trace));
  PS_RETURN_IF_ERROR(CheckGradientLayout(name, type, shape, layout));
  return Transfer(Mode::kPush, name, layout, static_cast<const char*>(grad), nullptr, deadline,
                  call.trace);
}

absl::Status DeviceIo::GetParam(const std::string& name, void* out, size_t bytes, ElementType type,
                                const CallOptions& call) {
  stats_ = {};
  const absl::Time deadline = client_->Deadline(call);
  PS_RETURN_IF_ERROR(space_->CheckRange(out, bytes));
  PS_ASSIGN_OR_RETURN(Client::Layout layout, FindOrLearnLayout(name, deadline, call.trace));
  const std::string what = absl::StrCat("parameter '", name, "'");
  if (type != v1::ELEMENT_TYPE_UNSPECIFIED && type != layout.type) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has element type ", ElementTypeName(layout.type),
                     ", the device buffer is ", ElementTypeName(type)));
  }
  const uint64_t want = layout.elements * ElementSize(layout.type);
  if (bytes != want) {
    return absl::InvalidArgumentError(absl::StrCat(what, " (", ElementTypeName(layout.type),
                                                   ShapeString(layout.shape), ") needs ", want,
                                                   " bytes, the device buffer has ", bytes));
  }
  return Transfer(Mode::kPull, name, layout, nullptr, static_cast<char*>(out), deadline,
                  call.trace);
}

absl::Status DeviceIo::PushPull(const std::string& name, ElementType type, const Shape& shape,
                                const void* grad, void* out, const CallOptions& call) {
  stats_ = {};
  const absl::Time deadline = client_->Deadline(call);
  PS_RETURN_IF_ERROR(
      ValidateStorableType(type, absl::StrCat("gradient for parameter '", name, "'")));
  PS_ASSIGN_OR_RETURN(int64_t n, NumElements(shape));
  const size_t bytes = static_cast<size_t>(n) * ElementSize(type);
  PS_RETURN_IF_ERROR(space_->CheckRange(grad, bytes));
  PS_RETURN_IF_ERROR(space_->CheckRange(out, bytes));
  PS_ASSIGN_OR_RETURN(Client::Layout layout, FindOrLearnLayout(name, deadline, call.trace));
  PS_RETURN_IF_ERROR(CheckGradientLayout(name, type, shape, layout));
  return Transfer(Mode::kPushPull, name, layout, static_cast<const char*>(grad),
                  static_cast<char*>(out), deadline, call.trace);
}

absl::Status DeviceIo::Transfer(Mode mode, const std::string& name, const Client::Layout& layout,
                                const char* grad, char* out, absl::Time deadline,
                                TraceRecorder* trace) {
  const bool push = mode != Mode::kPull;
  const bool pull = mode != Mode::kPush;
  const size_t esize = ElementSize(layout.type);
  if (layout.elements == 0) return absl::OkStatus();

  // The trainer's kernels that write the gradient (or read the parameter's
  // old values) may still be running on a stream of its own.
  PS_RETURN_IF_ERROR(space_->BeginCall());

  // Whole blocks, grouped into chunks of about chunk_bytes.
  std::vector<Chunk> chunks;
  uint64_t total = 0;
  for (const BlockSpec& b : client_->placement().Blocks(name, layout.elements, esize)) {
    const uint64_t bytes = b.elements * esize;
    if (chunks.empty() || chunks.back().bytes + bytes > options_.chunk_bytes) {
      Chunk& c = chunks.emplace_back();
      c.offset = b.offset * esize;
    }
    chunks.back().blocks.push_back(b);
    chunks.back().bytes += bytes;
    total += bytes;
  }
  uint64_t max_chunk = 0;
  for (const Chunk& c : chunks) max_chunk = std::max(max_chunk, c.bytes);
  const size_t n = chunks.size();
  const int depth = static_cast<int>(std::min<size_t>(options_.depth, n));

  auto wait_lane = [&](int lane, int in_flight) {
    const absl::Time start = absl::Now();
    absl::Status status = space_->Wait(lane);
    stats_.copy_wait_time += absl::Now() - start;
    ++stats_.copy_waits;
    if (in_flight > 0) ++stats_.copy_waits_overlapped;
    return status;
  };

  // Clip-by-norm over several blocks: every block carries the whole
  // gradient's norm, so the gradient is staged whole before anything is sent.
  std::optional<double> norm;
  char* whole = nullptr;
  // Every block marked skip_as_non_finite (a NaN or infinity in a parameter
  // that skips them).
  bool skip = false;
  if (push && layout.blocks > 1 && layout.clips_by_norm && IsFloatingPoint(layout.type)) {
    stats_.staged_whole = true;
    PS_ASSIGN_OR_RETURN(whole, Staging(grad_slots_, 0, total));
    absl::Status status;
    for (size_t i = 0; i < n && status.ok(); ++i) {
      status = space_->StartCopyToHost(static_cast<int>(i % depth), whole + chunks[i].offset,
                                       grad + chunks[i].offset, chunks[i].bytes);
      if (status.ok()) stats_.bytes_to_host += chunks[i].bytes;
    }
    for (int lane = 0; lane < depth; ++lane) {
      absl::Status waited = wait_lane(lane, 0);
      if (status.ok()) status = waited;
    }
    PS_RETURN_IF_ERROR(status);
    const absl::string_view bytes(whole, total);
    norm = L2Norm(layout.type, bytes);
    // Checked whole before any of it is sent: refused, or skipped everywhere.
    PS_ASSIGN_OR_RETURN(
        skip, client_->NonFiniteVerdict(name, layout, 0, FindNonFinite(layout.type, bytes), norm));
    if (skip) client_->CountNonFiniteSkipped();
  }

  // Slot s (and lane s) serves chunks s, s + depth, ...: its staging is
  // reused only after its chunk's network call and copy are done.
  std::vector<std::future<absl::Status>> network(depth);
  std::vector<size_t> chunk_of(depth, 0);
  std::vector<char*> param_stage(depth, nullptr);
  int in_flight = 0;
  // Waits for the network call of `slot`; queues its chunk's copy to the
  // device when `copy` (and the call succeeded).
  auto collect = [&](int slot, bool copy) -> absl::Status {
    const absl::Time start = absl::Now();
    absl::Status status = network[slot].get();
    stats_.network_wait_time += absl::Now() - start;
    --in_flight;
    if (!status.ok() || !copy || !pull) return status;
    const Chunk& c = chunks[chunk_of[slot]];
    PS_RETURN_IF_ERROR(space_->StartCopyFromHost(slot, out + c.offset, param_stage[slot], c.bytes));
    stats_.bytes_to_device += c.bytes;
    return absl::OkStatus();
  };

  absl::Status status;
  size_t launched = 0;
  for (size_t i = 0; i < n; ++i) {
    if (absl::Now() >= deadline) {
      status = absl::DeadlineExceededError(
          absl::StrCat(ModeName(static_cast<int>(mode)), " of parameter '", name,
                       "': the call's deadline passed after ", i, " of ", n, " chunks"));
      break;
    }
    const int slot = static_cast<int>(i % depth);
    const Chunk& c = chunks[i];
    if (network[slot].valid()) {
      status = collect(slot, true);
      if (!status.ok()) break;
    }
    const char* grad_stage = nullptr;
    if (push) {
      if (whole != nullptr) {
        grad_stage = whole + c.offset;
      } else {
        absl::StatusOr<char*> stage = Staging(grad_slots_, slot, max_chunk);
        if (!stage.ok()) {
          status = stage.status();
          break;
        }
        status = space_->StartCopyToHost(slot, *stage, grad + c.offset, c.bytes);
        if (!status.ok()) break;
        stats_.bytes_to_host += c.bytes;
        grad_stage = *stage;
      }
    }
    if (pull) {
      absl::StatusOr<char*> stage = Staging(param_slots_, slot, max_chunk);
      if (!stage.ok()) {
        status = stage.status();
        break;
      }
      param_stage[slot] = *stage;
    }
    // This chunk's copy from the device and the previous chunk's copy to
    // it run while the other slots' chunks are on the network.
    status = wait_lane(slot, in_flight);
    if (!status.ok()) break;
    if (push && whole == nullptr && !skip) {
      // Staged chunk by chunk: each is checked before it is sent (the chunks
      // before it may already be applied; see device_io.h).
      absl::StatusOr<bool> verdict = client_->NonFiniteVerdict(
          name, layout, c.offset / esize,
          FindNonFinite(layout.type, absl::string_view(grad_stage, c.bytes)), std::nullopt);
      if (!verdict.ok()) {
        status = verdict.status();
        break;
      }
      skip = *verdict;
      if (skip) client_->CountNonFiniteSkipped();
    }
    chunk_of[slot] = i;
    char* stage = param_stage[slot];
    network[slot] = std::async(std::launch::async, [this, &name, &layout, &c, grad_stage, stage,
                                                    norm, skip, deadline, trace] {
      return ExchangeChunk(name, layout, c, grad_stage, stage, norm, skip, deadline, trace);
    });
    ++launched;
    ++in_flight;
    ++stats_.chunks;
    stats_.max_network_in_flight = std::max(stats_.max_network_in_flight, in_flight);
  }
  // The chunks still on the network, in order; after an error only waited for.
  for (size_t i = launched > static_cast<size_t>(depth) ? launched - depth : 0; i < launched; ++i) {
    const int slot = static_cast<int>(i % depth);
    if (!network[slot].valid()) continue;
    absl::Status done = collect(slot, status.ok());
    if (status.ok()) status = done;
  }
  for (int lane = 0; lane < depth; ++lane) {
    absl::Status waited = wait_lane(lane, 0);
    if (status.ok()) status = waited;
  }
  return status;
}

absl::Status DeviceIo::ExchangeChunk(const std::string& name, const Client::Layout& layout,
                                     const Chunk& chunk, const char* grad_stage, char* param_stage,
                                     std::optional<double> norm, bool skip, absl::Time deadline,
                                     TraceRecorder* trace) {
  const size_t esize = ElementSize(layout.type);
  // One request per server and about max_request_bytes (Client::PackBatches).
  struct Request {
    int server = 0;
    std::vector<GradientView> grads;
    std::vector<v1::ParamRef> refs;
    std::vector<const BlockSpec*> blocks;
    RequestId id;
  };
  std::vector<int> servers;
  std::vector<size_t> sizes;
  servers.reserve(chunk.blocks.size());
  sizes.reserve(chunk.blocks.size());
  for (const BlockSpec& b : chunk.blocks) {
    servers.push_back(b.server);
    sizes.push_back(b.elements * esize);
  }
  std::vector<Request> requests;
  for (const Client::Batch& batch : Client::PackBatches(
           servers, sizes, client_->options().max_request_bytes, client_->num_servers())) {
    Request& request = requests.emplace_back();
    request.server = batch.server;
    for (size_t i : batch.items) {
      const BlockSpec& b = chunk.blocks[i];
      request.blocks.push_back(&b);
      if (grad_stage != nullptr) {
        const size_t at = b.offset * esize - chunk.offset;  // in the staging slot
        request.grads.push_back(Client::BlockGradient(
            name, layout.type, b, norm, absl::string_view(grad_stage + at, sizes[i])));
        request.grads.back().skip_as_non_finite = skip;
      }
      if (param_stage != nullptr) request.refs.push_back(Client::BlockRef(name, b.index, b.count));
    }
  }
  for (Request& r : requests) {
    if (r.grads.empty()) continue;
    r.id.client = client_->client_id();
    r.id.sequence = client_->NextSequence(r.server);
  }
  return client_->RunWithRetries(
      requests.size(), [&](size_t i) { return requests[i].server; },
      [&](size_t i, Transport& t, absl::Time attempt_deadline, Transport::Done done) {
        Request& r = requests[i];
        if (r.refs.empty()) {
          t.Push(r.id, r.grads, attempt_deadline, std::move(done), trace);
          return;
        }
        // Blocks come back in request order; a retry starts over.
        auto next = std::make_shared<size_t>(0);
        Transport::BlockSink sink = [&r, &name, &layout, &chunk, param_stage, esize, next,
                                     address = t.address()](const v1::Parameter& header,
                                                            const Segments& content) {
          if (*next >= r.blocks.size()) {
            return absl::DataLossError(
                absl::StrCat("server ", address, " returned more blocks than asked"));
          }
          const BlockSpec& b = *r.blocks[(*next)++];
          const size_t size = SegmentsSize(content);
          if (header.name() != name || header.element_type() != layout.type ||
              header.block().index() != b.index || size != b.elements * esize) {
            return absl::DataLossError(absl::StrCat("parameter '", name, "' from server ", address,
                                                    ": block ", header.block().index(),
                                                    " does not fit the parameter's layout"));
          }
          CopySegments(content, param_stage + (b.offset * esize - chunk.offset));
          return absl::OkStatus();
        };
        if (r.grads.empty()) {
          t.Pull(r.refs, std::move(sink), attempt_deadline, std::move(done), trace);
        } else {
          t.PushPull(r.id, r.grads, r.refs, std::move(sink), attempt_deadline, std::move(done),
                     trace);
        }
      },
      deadline, trace);
}

// ---- one-call forms ------------------------------------------------------------------

absl::Status SendGradFromDevice(Client& client, const std::string& name, ElementType type,
                                const Shape& shape, const void* device_ptr, int device,
                                const CallOptions& call, const DeviceIoOptions& io) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<DeviceIo> dio, DeviceIo::ForCuda(&client, device, io));
  return dio->SendGrad(name, type, shape, device_ptr, call);
}

absl::Status GetParamToDevice(Client& client, const std::string& name, void* device_ptr,
                              size_t bytes, int device, const CallOptions& call,
                              const DeviceIoOptions& io) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<DeviceIo> dio, DeviceIo::ForCuda(&client, device, io));
  return dio->GetParam(name, device_ptr, bytes, v1::ELEMENT_TYPE_UNSPECIFIED, call);
}

absl::Status PushPullDevice(Client& client, const std::string& name, ElementType type,
                            const Shape& shape, const void* grad_device_ptr, void* param_device_ptr,
                            int device, const CallOptions& call, const DeviceIoOptions& io) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<DeviceIo> dio, DeviceIo::ForCuda(&client, device, io));
  return dio->PushPull(name, type, shape, grad_device_ptr, param_device_ptr, call);
}

}  // namespace pserver
