#include "cc/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"
#include "cc/cuda/runtime.h"

namespace pserver {
namespace cuda {

absl::Status CudaStatus(int code, absl::string_view what) {
  if (code == 0) return absl::OkStatus();
  std::string message =
      absl::StrCat(what, ": ", rt::ErrorString(code), " (", rt::ErrorName(code), ")");
  if (rt::IsNoDeviceError(code)) return absl::UnavailableError(message);
  if (rt::IsOutOfMemoryError(code)) return absl::ResourceExhaustedError(message);
  if (rt::IsInvalidValueError(code)) return absl::InvalidArgumentError(message);
  return absl::InternalError(message);
}

}  // namespace cuda
}  // namespace pserver
