// Device memory, pinned host memory and streams, as move-only RAII objects,
// and range-checked copies between them.
//
//   PS_ASSIGN_OR_RETURN(Stream stream, Stream::Create(/*device=*/0));
//   PS_ASSIGN_OR_RETURN(DeviceBuffer d, DeviceBuffer::Allocate(0, n * sizeof(float)));
//   PS_ASSIGN_OR_RETURN(PinnedBuffer h, PinnedBuffer::Allocate(n * sizeof(float)));
//   PS_RETURN_IF_ERROR(CopyToDevice(d, 0, h.data(), h.size(), &stream));  // async
//   PS_RETURN_IF_ERROR(stream.Synchronize());
//
// Copies with a null stream run on the default stream and return when done;
// with a stream they are queued and the caller synchronizes it (the host
// memory must then stay valid, and be pinned for the copy to overlap).
// Errors name what failed: UNAVAILABLE without a device ("built without CUDA"
// for a build without nvcc), RESOURCE_EXHAUSTED when memory runs out,
// OUT_OF_RANGE for a copy past a buffer's end.
//
// Not thread-safe: one object is used by one thread at a time (distinct
// objects may be used concurrently).
#ifndef PSERVER_CC_CUDA_BUFFER_H_
#define PSERVER_CC_CUDA_BUFFER_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pserver {
namespace cuda {

// A CUDA stream of one device (non-blocking with respect to the default stream).
class Stream {
 public:
  static absl::StatusOr<Stream> Create(int device);
  Stream() = default;  // the default stream of device 0
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Waits for everything queued; reports the first error of the queued work.
  absl::Status Synchronize() const;
  void* native() const { return stream_; }  // cudaStream_t
  int device() const { return device_; }

 private:
  void* stream_ = nullptr;
  int device_ = 0;
};

// Device memory (cudaMalloc); freed by the destructor.
class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer> Allocate(int device, size_t bytes);
  DeviceBuffer() = default;  // empty
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return bytes_; }
  int device() const { return device_; }

  // Sets every byte to `value` (synchronously when stream is null).
  absl::Status Fill(int value, const Stream* stream = nullptr);

 private:
  void Release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
  int device_ = 0;
};

// Page-locked host memory (cudaMallocHost): copies from and into it run at
// full PCIe/NVLink speed and overlap with other work.
class PinnedBuffer {
 public:
  static absl::StatusOr<PinnedBuffer> Allocate(size_t bytes);
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return bytes_; }

 private:
  void Release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// `bytes` from host `src` to dst at byte `offset`.
absl::Status CopyToDevice(DeviceBuffer& dst, size_t offset, const void* src, size_t bytes,
                          const Stream* stream = nullptr);
// `bytes` from src at byte `offset` to host `dst`.
absl::Status CopyToHost(void* dst, const DeviceBuffer& src, size_t offset, size_t bytes,
                        const Stream* stream = nullptr);
// `bytes` from src to dst (same device), both from byte 0.
absl::Status CopyDeviceToDevice(DeviceBuffer& dst, const DeviceBuffer& src, size_t bytes,
                                const Stream* stream = nullptr);

}  // namespace cuda
}  // namespace pserver

#endif  // PSERVER_CC_CUDA_BUFFER_H_
