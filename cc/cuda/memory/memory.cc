#include "cc/cuda/memory/memory.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "cc/core/status_macros.h"
#include "cc/cuda/cuda_status.h"
#include "cc/cuda/runtime.h"

namespace pserver {
namespace cuda {
namespace {

std::string Describe(const PointerInfo& info) {
  if (info.device < 0) return MemoryKindName(info.kind);
  return absl::StrCat(MemoryKindName(info.kind), " of cuda:", info.device);
}

}  // namespace

std::string MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kUnregisteredHost:
      return "host memory";
    case MemoryKind::kPinnedHost:
      return "pinned host memory";
    case MemoryKind::kDevice:
      return "device memory";
    case MemoryKind::kManaged:
      return "managed memory";
  }
  return "unknown memory";
}

absl::StatusOr<PointerInfo> GetPointerInfo(const void* ptr) {
  int type = rt::kMemoryUnregistered;
  int device = -1;
  PS_RETURN_IF_ERROR(
      CudaStatus(rt::PointerGetAttributes(ptr, &type, &device), "cudaPointerGetAttributes"));
  PointerInfo info;
  info.device = device;
  switch (type) {
    case rt::kMemoryHost:
      info.kind = MemoryKind::kPinnedHost;
      break;
    case rt::kMemoryDevice:
      info.kind = MemoryKind::kDevice;
      break;
    case rt::kMemoryManaged:
      info.kind = MemoryKind::kManaged;
      break;
    default:
      info.kind = MemoryKind::kUnregisteredHost;
      info.device = -1;
  }
  return info;
}

absl::Status CheckDeviceRange(const void* ptr, size_t bytes, int device) {
  if (bytes == 0) return absl::OkStatus();
  if (ptr == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("null device pointer for ", bytes, " bytes"));
  }
  const void* last = static_cast<const char*>(ptr) + bytes - 1;
  for (const void* p : {ptr, last}) {
    PS_ASSIGN_OR_RETURN(PointerInfo info, GetPointerInfo(p));
    const bool on_device = info.kind == MemoryKind::kDevice || info.kind == MemoryKind::kManaged;
    if (!on_device || info.device != device) {
      return absl::InvalidArgumentError(
          absl::StrCat(p == ptr ? "pointer 0x" : "end of the range at 0x",
                       absl::Hex(reinterpret_cast<uintptr_t>(p)),
                       " is not device memory of cuda:", device, ": it is ", Describe(info)));
    }
  }
  return absl::OkStatus();
}

absl::Status SynchronizeDevice(int device) {
  return CudaStatus(rt::DeviceSynchronize(device),
                    absl::StrCat("cudaDeviceSynchronize on cuda:", device));
}

absl::Status CopyToHostAsync(void* dst, const void* src, size_t bytes, const Stream& stream) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(rt::MemcpyAsync(dst, src, bytes, rt::kDeviceToHost, stream.native()),
                    absl::StrCat("cudaMemcpyAsync (device to host, ", bytes, " bytes)"));
}

absl::Status CopyFromHostAsync(void* dst, const void* src, size_t bytes, const Stream& stream) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(rt::MemcpyAsync(dst, src, bytes, rt::kHostToDevice, stream.native()),
                    absl::StrCat("cudaMemcpyAsync (host to device, ", bytes, " bytes)"));
}

}  // namespace cuda
}  // namespace pserver
