#include "cc/client/memory_space.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace pserver {
namespace {

class HostStaging : public StagingBuffer {
 public:
  explicit HostStaging(size_t bytes) : data_(new char[bytes == 0 ? 1 : bytes]), size_(bytes) {}
  char* data() const override { return data_.get(); }
  size_t size() const override { return size_; }

 private:
  std::unique_ptr<char[]> data_;
  size_t size_;
};

}  // namespace

absl::Status HostMemorySpace::CheckRange(const void* ptr, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (ptr == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("null pointer for ", bytes, " bytes"));
  }
  const char* p = static_cast<const char*>(ptr);
  const char* begin = static_cast<const char*>(options_.refuse_begin);
  const char* end = static_cast<const char*>(options_.refuse_end);
  if (begin != nullptr && p < end && p + bytes > begin) {
    return absl::InvalidArgumentError(
        absl::StrCat("pointer 0x", absl::Hex(reinterpret_cast<uintptr_t>(ptr)),
                     " is not memory of ", name(), " (refused by the test)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<StagingBuffer>> HostMemorySpace::AllocateStaging(size_t bytes) {
  absl::MutexLock lock(&mu_);
  staging_bytes_ += bytes;
  return std::unique_ptr<StagingBuffer>(new HostStaging(bytes));
}

absl::Status HostMemorySpace::DoCopy(bool to_host, int lane, void* dst, const void* src,
                                     size_t bytes) {
  if (lane < 0 || lane >= options_.lanes) {
    return absl::InvalidArgumentError(absl::StrCat("lane ", lane, " of ", options_.lanes));
  }
  Copy copy;
  copy.to_host = to_host;
  copy.lane = lane;
  copy.space_ptr = to_host ? src : dst;
  copy.bytes = bytes;
  copy.started = absl::Now();
  int index;
  {
    absl::MutexLock lock(&mu_);
    index = static_cast<int>(copies_.size());
  }
  if (index == options_.fail_copy) {
    absl::MutexLock lock(&mu_);
    copies_.push_back(copy);
    return absl::InternalError(absl::StrCat("injected copy failure (copy ", index, ")"));
  }
  if (options_.on_copy_start) options_.on_copy_start();
  if (options_.copy_delay > absl::ZeroDuration()) absl::SleepFor(options_.copy_delay);
  if (bytes > 0) std::memcpy(dst, src, bytes);
  copy.finished = absl::Now();
  absl::MutexLock lock(&mu_);
  copies_.push_back(copy);
  return absl::OkStatus();
}

absl::Status HostMemorySpace::StartCopyToHost(int lane, void* dst, const void* src, size_t bytes) {
  return DoCopy(/*to_host=*/true, lane, dst, src, bytes);
}

absl::Status HostMemorySpace::StartCopyFromHost(int lane, void* dst, const void* src,
                                                size_t bytes) {
  return DoCopy(/*to_host=*/false, lane, dst, src, bytes);
}

absl::Status HostMemorySpace::Wait(int lane) {
  if (lane < 0 || lane >= options_.lanes) {
    return absl::InvalidArgumentError(absl::StrCat("lane ", lane, " of ", options_.lanes));
  }
  absl::MutexLock lock(&mu_);
  ++waits_;
  return absl::OkStatus();
}

std::vector<HostMemorySpace::Copy> HostMemorySpace::copies() const {
  absl::MutexLock lock(&mu_);
  return copies_;
}

size_t HostMemorySpace::staging_bytes_allocated() const {
  absl::MutexLock lock(&mu_);
  return staging_bytes_;
}

int HostMemorySpace::waits() const {
  absl::MutexLock lock(&mu_);
  return waits_;
}

}  // namespace pserver
