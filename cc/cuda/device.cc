#include "cc/cuda/device.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cc/core/status_macros.h"
#include "cc/cuda/cuda_status.h"
#include "cc/cuda/runtime.h"

namespace pserver {
namespace cuda {

bool BuiltWithCuda() { return rt::Built(); }

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  PS_RETURN_IF_ERROR(CudaStatus(rt::GetDeviceCount(&count), "cudaGetDeviceCount"));
  if (count <= 0) return absl::UnavailableError("cudaGetDeviceCount: no CUDA device (count 0)");
  return count;
}

std::string DeviceInfo::ToString() const {
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  std::string out = absl::StrFormat("cuda:%d %s, sm_%d%d, %d SMs, %.1f GiB (%.1f free)", ordinal,
                                    name, compute_major, compute_minor, multiprocessors,
                                    total_memory_bytes / kGiB, free_memory_bytes / kGiB);
  if (memory_bandwidth_gbps > 0) absl::StrAppendFormat(&out, ", ~%.0f GB/s", memory_bandwidth_gbps);
  return out;
}

namespace {

// GetDeviceInfo once the device count is known.
absl::StatusOr<DeviceInfo> DeviceInfoOf(int ordinal, int count) {
  if (ordinal < 0 || ordinal >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA device ", ordinal, " does not exist: ", count, " device(s), 0..", count - 1));
  }
  rt::RawDeviceProperties props;
  PS_RETURN_IF_ERROR(CudaStatus(rt::GetDeviceProperties(ordinal, &props),
                                absl::StrCat("cudaGetDeviceProperties(", ordinal, ")")));
  DeviceInfo info;
  info.ordinal = ordinal;
  info.name = props.name;
  info.total_memory_bytes = props.total_memory;
  info.compute_major = props.major;
  info.compute_minor = props.minor;
  info.multiprocessors = props.multiprocessors;
  if (props.memory_clock_khz > 0 && props.memory_bus_bits > 0) {
    info.memory_bandwidth_gbps =
        2.0 * props.memory_clock_khz * 1e3 * (props.memory_bus_bits / 8.0) / 1e9;
  }
  size_t free_bytes = 0, total_bytes = 0;
  if (rt::MemGetInfo(ordinal, &free_bytes, &total_bytes) == 0) {
    info.free_memory_bytes = free_bytes;
  }
  return info;
}

}  // namespace

absl::StatusOr<DeviceInfo> GetDeviceInfo(int ordinal) {
  PS_ASSIGN_OR_RETURN(int count, CudaDeviceCount());
  return DeviceInfoOf(ordinal, count);
}

absl::StatusOr<DeviceChoice> ChooseDevice(absl::string_view spec) {
  DeviceChoice choice;
  if (spec == "cpu") {
    choice.name = "cpu";
    choice.reason = "host memory (--device=cpu)";
    return choice;
  }
  if (spec == "auto") {
    absl::StatusOr<DeviceInfo> info = GetDeviceInfo(0);
    if (!info.ok()) {
      choice.name = "cpu";
      choice.reason =
          absl::StrCat("no CUDA device (", info.status().message(), "): serving from host memory");
      return choice;
    }
    choice.cuda = true;
    choice.ordinal = 0;
    choice.name = "cuda:0";
    choice.reason = info->ToString();
    return choice;
  }
  int ordinal = -1;
  const absl::string_view digits = absl::StartsWith(spec, "cuda:") ? spec.substr(5) : "";
  const bool all_digits = !digits.empty() && digits.size() <= 6 &&
                          digits.find_first_not_of("0123456789") == absl::string_view::npos;
  if (!all_digits || !absl::SimpleAtoi(digits, &ordinal)) {
    return absl::InvalidArgumentError(
        absl::StrCat("device '", spec, "' is not one of cpu, auto, cuda:<N> (N >= 0)"));
  }
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) {
    return absl::UnavailableError(
        absl::StrCat("device ", spec, ": no CUDA device: ", count.status().message()));
  }
  absl::StatusOr<DeviceInfo> info = DeviceInfoOf(ordinal, *count);
  if (!info.ok()) {
    return absl::Status(info.status().code(),
                        absl::StrCat("device ", spec, ": ", info.status().message()));
  }
  choice.cuda = true;
  choice.ordinal = ordinal;
  choice.name = absl::StrCat("cuda:", ordinal);
  choice.reason = info->ToString();
  return choice;
}

}  // namespace cuda
}  // namespace pserver
