#include "cc/cuda/buffer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/core/status_macros.h"
#include "cc/cuda/cuda_status.h"
#include "cc/cuda/runtime.h"

namespace pserver {
namespace cuda {
namespace {

absl::Status CheckRange(size_t offset, size_t bytes, size_t size, const char* what) {
  if (offset <= size && bytes <= size - offset) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat(what, ": bytes [", offset, ", ", offset + bytes,
                                            ") are past the end of a ", size,
                                            "-byte device buffer"));
}

// Queues the copy; without a stream waits for it on the default stream.
absl::Status Copy(void* dst, const void* src, size_t bytes, rt::CopyKind kind, int device,
                  const Stream* stream, const char* what) {
  if (bytes == 0) return absl::OkStatus();
  PS_RETURN_IF_ERROR(CudaStatus(rt::SetDevice(device), what));
  void* s = stream != nullptr ? stream->native() : nullptr;
  PS_RETURN_IF_ERROR(CudaStatus(rt::MemcpyAsync(dst, src, bytes, kind, s), what));
  if (stream == nullptr) PS_RETURN_IF_ERROR(CudaStatus(rt::StreamSynchronize(nullptr), what));
  return absl::OkStatus();
}

}  // namespace

// ---- Stream -------------------------------------------------------------------

absl::StatusOr<Stream> Stream::Create(int device) {
  Stream stream;
  PS_RETURN_IF_ERROR(CudaStatus(rt::StreamCreate(device, &stream.stream_),
                                absl::StrCat("cudaStreamCreate on cuda:", device)));
  stream.device_ = device;
  return stream;
}

Stream::~Stream() {
  if (stream_ != nullptr) rt::StreamDestroy(stream_);
}

Stream::Stream(Stream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), device_(other.device_) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) rt::StreamDestroy(stream_);
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

absl::Status Stream::Synchronize() const {
  PS_RETURN_IF_ERROR(CudaStatus(rt::SetDevice(device_), "cudaSetDevice"));
  return CudaStatus(rt::StreamSynchronize(stream_), "cudaStreamSynchronize");
}

// ---- DeviceBuffer -------------------------------------------------------------

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(int device, size_t bytes) {
  DeviceBuffer buffer;
  buffer.device_ = device;
  if (bytes == 0) return buffer;
  PS_RETURN_IF_ERROR(CudaStatus(rt::Malloc(device, &buffer.data_, bytes),
                                absl::StrCat("cudaMalloc(", bytes, " bytes) on cuda:", device)));
  buffer.bytes_ = bytes;
  return buffer;
}

void DeviceBuffer::Release() {
  if (data_ != nullptr) rt::Free(device_, data_);
  data_ = nullptr;
  bytes_ = 0;
}

DeviceBuffer::~DeviceBuffer() { Release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_(other.device_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = other.device_;
  }
  return *this;
}

absl::Status DeviceBuffer::Fill(int value, const Stream* stream) {
  if (bytes_ == 0) return absl::OkStatus();
  PS_RETURN_IF_ERROR(CudaStatus(rt::SetDevice(device_), "cudaSetDevice"));
  void* s = stream != nullptr ? stream->native() : nullptr;
  PS_RETURN_IF_ERROR(CudaStatus(rt::MemsetAsync(data_, value, bytes_, s), "cudaMemsetAsync"));
  if (stream == nullptr) {
    PS_RETURN_IF_ERROR(CudaStatus(rt::StreamSynchronize(nullptr), "cudaMemsetAsync"));
  }
  return absl::OkStatus();
}

// ---- PinnedBuffer -------------------------------------------------------------

absl::StatusOr<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes) {
  PinnedBuffer buffer;
  if (bytes == 0) return buffer;
  PS_RETURN_IF_ERROR(CudaStatus(rt::MallocHost(&buffer.data_, bytes),
                                absl::StrCat("cudaMallocHost(", bytes, " bytes)")));
  buffer.bytes_ = bytes;
  return buffer;
}

void PinnedBuffer::Release() {
  if (data_ != nullptr) rt::FreeHost(data_);
  data_ = nullptr;
  bytes_ = 0;
}

PinnedBuffer::~PinnedBuffer() { Release(); }

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

// ---- copies -------------------------------------------------------------------

absl::Status CopyToDevice(DeviceBuffer& dst, size_t offset, const void* src, size_t bytes,
                          const Stream* stream) {
  PS_RETURN_IF_ERROR(CheckRange(offset, bytes, dst.size(), "copy to device"));
  return Copy(static_cast<char*>(dst.data()) + offset, src, bytes, rt::kHostToDevice,
              dst.device(), stream, "cudaMemcpyAsync host to device");
}

absl::Status CopyToHost(void* dst, const DeviceBuffer& src, size_t offset, size_t bytes,
                        const Stream* stream) {
  PS_RETURN_IF_ERROR(CheckRange(offset, bytes, src.size(), "copy to host"));
  return Copy(dst, static_cast<const char*>(src.data()) + offset, bytes, rt::kDeviceToHost,
              src.device(), stream, "cudaMemcpyAsync device to host");
}

absl::Status CopyDeviceToDevice(DeviceBuffer& dst, const DeviceBuffer& src, size_t bytes,
                                const Stream* stream) {
  PS_RETURN_IF_ERROR(CheckRange(0, bytes, dst.size(), "copy device to device (destination)"));
  PS_RETURN_IF_ERROR(CheckRange(0, bytes, src.size(), "copy device to device (source)"));
  return Copy(dst.data(), src.data(), bytes, rt::kDeviceToDevice, dst.device(), stream,
              "cudaMemcpyAsync device to device");
}

}  // namespace cuda
}  // namespace pserver
