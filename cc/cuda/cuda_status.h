// Turns CUDA runtime error codes (cudaError_t as an int, or kNotBuilt from
// a build without CUDA) into absl::Status, for cc/cuda and its subpackages.
#ifndef PSERVER_CC_CUDA_CUDA_STATUS_H_
#define PSERVER_CC_CUDA_CUDA_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pserver {
namespace cuda {

// OK for 0. Otherwise "<what>: <cudaGetErrorString> (<cudaGetErrorName>)" with
// UNAVAILABLE for no driver / no device / built without CUDA,
// RESOURCE_EXHAUSTED for out of memory, INVALID_ARGUMENT for invalid values,
// INTERNAL for anything else.
absl::Status CudaStatus(int code, absl::string_view what);

}  // namespace cuda
}  // namespace pserver

#endif  // PSERVER_CC_CUDA_CUDA_STATUS_H_
