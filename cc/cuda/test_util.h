// Test helpers for cc/cuda: skip GPU tests with the runtime's reason where
// there is no CUDA device (CI), half-precision encodings for gradients, and
// fresh directories for checkpoints.
#ifndef PSERVER_CC_CUDA_TEST_UTIL_H_
#define PSERVER_CC_CUDA_TEST_UTIL_H_

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "absl/status/statusor.h"
#include "cc/cuda/device.h"
#include "gtest/gtest.h"

// In a TEST body: GTEST_SKIP()s "no CUDA device: <reason from the runtime>"
// unless CUDA device 0 exists.
#define PS_SKIP_WITHOUT_CUDA_DEVICE()                                          \
  do {                                                                         \
    ::absl::StatusOr<int> ps_cuda_count_ = ::pserver::cuda::CudaDeviceCount(); \
    if (!ps_cuda_count_.ok()) {                                                \
      GTEST_SKIP() << "no CUDA device: " << ps_cuda_count_.status().message(); \
    }                                                                          \
  } while (0)

namespace pserver {
namespace cuda {
namespace testing {

inline uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

inline float BitsFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// bfloat16 bits of a float whose low 16 bits are zero (exact).
inline uint16_t ExactBfloat16(float f) { return static_cast<uint16_t>(FloatBits(f) >> 16); }
inline float Bfloat16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

// float16 bits of zero or a normal float16 value given as a float (exact:
// the caller picks values float16 represents, e.g. k / 1024 for |k| <= 2048).
inline uint16_t ExactFloat16(float f) {
  const uint32_t b = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  if ((b & 0x7fffffffu) == 0) return sign;
  const int exp = static_cast<int>((b >> 23) & 0xff) - 127 + 15;
  return static_cast<uint16_t>(sign | (exp << 10) | ((b >> 13) & 0x3ff));
}

inline float Float16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0 && mant == 0) return BitsFloat(sign);
  return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));  // normal values only
}

// A new, empty directory $TEST_TMPDIR/<name> (/tmp without TEST_TMPDIR).
inline std::string FreshTestDir(const std::string& name) {
  namespace fs = std::filesystem;
  const char* root = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(root != nullptr ? root : "/tmp") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

}  // namespace testing
}  // namespace cuda
}  // namespace pserver

#endif  // PSERVER_CC_CUDA_TEST_UTIL_H_
