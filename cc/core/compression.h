// Compression on the wire: float32 values in float16 or bfloat16, and top-k
// with error feedback (ParameterConfig.wire_compression, config.proto). The
// store keeps float32; trainers encode gradients and decode pulled values,
// servers decode gradients and encode pulled values.
//
//   std::string wire(n * 2, '\0');
//   EncodeFloats(v1::FLOAT16, values, n, wire.data());          // float32 -> float16
//   DecodeFloats(v1::FLOAT16, wire.data(), n, values);          // float16 -> float32
//
//   ErrorFeedback feedback(elements);                           // one per parameter
//   SparseGradient sent = feedback.AddAndSelect(grad, offset, n, k);
//
// The scalar conversions are the ones cc/cuda's kernels use on the device
// (update_math.h calls them): exact widening, and narrowing rounded to
// nearest even with overflow to infinity, NaN kept NaN (quiet) and
// subnormals kept. Everything is little-endian, as the rest of the wire.
// Functions are pure and thread-safe; an ErrorFeedback is thread-compatible.
#ifndef PSERVER_CC_CORE_COMPRESSION_H_
#define PSERVER_CC_CORE_COMPRESSION_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cc/core/element_type.h"
#include "pserver/v1/config.pb.h"

#if defined(__CUDACC__)
#define PS_HALF_HD __host__ __device__ __forceinline__
#else
#define PS_HALF_HD inline
#endif

namespace pserver {
namespace half {

PS_HALF_HD float BitsToFloat(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

PS_HALF_HD uint32_t FloatToBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
#endif
}

// IEEE binary16 to float, exact (normals, subnormals, zeros, inf, NaN).
PS_HALF_HD float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return BitsToFloat(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return BitsToFloat(sign);
    exp = 113;  // 127 - 15 + 1: normalize the subnormal
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    return BitsToFloat(sign | (exp << 23) | ((mant & 0x3ffu) << 13));
  }
  return BitsToFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

PS_HALF_HD float Bfloat16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

// float to IEEE binary16, rounded to nearest even: |f| >= 65520 gives
// infinity, NaN the quiet NaN 0x7e00 (with f's sign), tiny values subnormals.
PS_HALF_HD uint16_t FloatToHalf(float f) {
  uint32_t x = FloatToBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  uint32_t out;
  if (x >= 0x47800000u) {  // 2^16 and above, inf, NaN
    out = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (x < 0x38800000u) {  // below 2^-14: subnormal or zero
    // Adding 0.5 aligns the 10 mantissa bits at the bottom; the float
    // addition rounds to nearest even.
    const float magic = BitsToFloat(126u << 23);
    out = FloatToBits(BitsToFloat(x) + magic) - (126u << 23);
  } else {
    const uint32_t odd = (x >> 13) & 1u;
    out = (x + 0xc8000fffu + odd) >> 13;  // rebias the exponent (-112 << 23), round
  }
  return static_cast<uint16_t>(out | sign);
}

// float to bfloat16, rounded to nearest even; NaN stays NaN (quiet).
PS_HALF_HD uint16_t FloatToBfloat16(float f) {
  const uint32_t x = FloatToBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace half

// Whether `type` is a wire form of float32 values: FLOAT32, FLOAT16, BFLOAT16.
bool IsWireFloatType(ElementType type);

// The ElementType values of `config` travel in: FLOAT16, BFLOAT16 or FLOAT32.
ElementType WireValueType(const v1::WireCompression& config);

// Whether `config` compresses anything (a half value type or top-k).
bool Compresses(const v1::WireCompression& config);

// INVALID_ARGUMENT naming `what` and the field for a config that cannot be
// used: a top-k fraction outside [0, 1] or not finite, an unknown value type.
absl::Status ValidateWireCompression(const v1::WireCompression& config, const std::string& what);

// k for a block of `elements` values: topk_count (at most `elements`) if set,
// else ceil(topk_fraction * elements), at least 1; 0 if top-k is off.
size_t TopKCount(const v1::WireCompression& config, size_t elements);

// n float32 values to `type` (FLOAT32, FLOAT16 or BFLOAT16) at `out`
// (n * ElementSize(type) bytes, any alignment), and back.
void EncodeFloats(ElementType type, const float* in, size_t n, char* out);
void DecodeFloats(ElementType type, const char* in, size_t n, float* out);

// What a top-k push carries for one block: element indices within the block
// and their values (float32, before any narrowing).
struct SparseGradient {
  std::vector<uint32_t> indices;
  std::vector<float> values;
};

// The error-feedback residual of one float32 parameter on one trainer.
class ErrorFeedback {
 public:
  explicit ErrorFeedback(size_t elements) : residual_(elements, 0.0f) {}

  // residual[offset, offset + n) += grad[0, n); then takes the k largest
  // |residual| of that range (ties: lowest index first), returns them and
  // sets them to 0 in the residual. Requires offset + n <= elements().
  SparseGradient AddAndSelect(const float* grad, size_t offset, size_t n, size_t k);

  size_t elements() const { return residual_.size(); }
  const std::vector<float>& residual() const { return residual_; }

 private:
  std::vector<float> residual_;
};

// A gradient block as it arrived (in `type`, FLOAT32/FLOAT16/BFLOAT16; with
// `indices` for top-k, else dense) widened to `elements` float32 values (a
// top-k one: zero but at its indices, repeated indices summed). Checks
// everything first: INVALID_ARGUMENT naming `what` for an unknown type, a
// content of the wrong length, indices not a multiple of 4 bytes, or an
// index out of range.
absl::StatusOr<std::string> WidenGradient(ElementType type, absl::string_view content,
                                          absl::string_view indices, size_t elements,
                                          const std::string& what);

}  // namespace pserver

#endif  // PSERVER_CC_CORE_COMPRESSION_H_
