// CUDA device probing and the choice behind `pserver --device=`.
//
//   absl::StatusOr<int> n = pserver::cuda::CudaDeviceCount();
//   if (!n.ok()) std::cerr << "no CUDA device: " << n.status().message();
//   PS_ASSIGN_OR_RETURN(DeviceInfo info, GetDeviceInfo(0));
//   PS_ASSIGN_OR_RETURN(DeviceChoice choice, ChooseDevice("auto"));
//
// Binaries link the static CUDA runtime, so all of this runs on machines
// without a GPU or a driver: the calls then return UNAVAILABLE with the
// runtime's reason (e.g. "CUDA driver version is insufficient for CUDA
// runtime version"), or "built without CUDA" when nvcc was missing at build
// time. Nothing here aborts.
//
// Thread-safe.
#ifndef PSERVER_CC_CUDA_DEVICE_H_
#define PSERVER_CC_CUDA_DEVICE_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pserver {
namespace cuda {

// True if cc/cuda was compiled with nvcc (false: the stub).
bool BuiltWithCuda();

// The number of CUDA devices (>= 1). UNAVAILABLE naming the reason when there
// is no driver, no device, or no CUDA in this build ("no CUDA device" for a
// count of zero).
absl::StatusOr<int> CudaDeviceCount();

struct DeviceInfo {
  int ordinal = 0;
  std::string name;               // "NVIDIA H100 80GB HBM3"
  size_t total_memory_bytes = 0;
  size_t free_memory_bytes = 0;
  int compute_major = 0, compute_minor = 0;
  int multiprocessors = 0;
  // Peak DRAM bandwidth in GB/s (1e9 bytes/s) from the memory clock and bus
  // width (2 transfers per clock); 0 if the runtime does not report them.
  double memory_bandwidth_gbps = 0;

  // "cuda:0 NVIDIA H100 80GB HBM3, sm_90, 132 SMs, 79.1 GiB (78.6 free), ~3352 GB/s"
  std::string ToString() const;
};

// UNAVAILABLE without a device; INVALID_ARGUMENT for an ordinal out of range.
absl::StatusOr<DeviceInfo> GetDeviceInfo(int ordinal);

// Where a server keeps its shards.
struct DeviceChoice {
  bool cuda = false;      // false: host memory
  int ordinal = 0;        // the CUDA device if cuda
  std::string name;       // "cpu" or "cuda:<ordinal>"
  std::string reason;     // for the startup log: what was probed and why this
};

// `spec` is "cpu", "auto" or "cuda:<N>":
//   cpu     host memory, nothing probed;
//   auto    cuda:0 if a device is present, else host memory (reason says why);
//   cuda:N  that device; UNAVAILABLE "no CUDA device: <runtime's reason>"
//           without one, INVALID_ARGUMENT if N >= the device count.
// INVALID_ARGUMENT for anything else.
absl::StatusOr<DeviceChoice> ChooseDevice(absl::string_view spec);

}  // namespace cuda
}  // namespace pserver

#endif  // PSERVER_CC_CUDA_DEVICE_H_
