// float16 and bfloat16 to and from float, one value at a time: the one
// definition of these conversions, used by cc/core/compression.h (the wire)
// and by cc/cuda's kernels (update_math.h, also compiled by nvcc, where the
// functions are __host__ __device__). Plain C++, no dependencies.
#ifndef PSERVER_CC_CORE_HALF_FLOAT_H_
#define PSERVER_CC_CORE_HALF_FLOAT_H_

#include <cstdint>
#include <cstring>

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
// Branch-free (each case computed, one selected), so loops vectorize.
PS_HALF_HD float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t bits = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t exp = bits & 0x0f800000u;  // the float16 exponent, in place
  const uint32_t normal = bits + (112u << 23);                             // rebias 15 -> 127
  const uint32_t special = normal + (112u << 23);                          // inf, NaN: all ones
  const float subnormal = BitsToFloat(bits + (113u << 23)) - BitsToFloat(113u << 23);  // exact
  const uint32_t out = exp == 0x0f800000u ? special
                       : exp == 0         ? FloatToBits(subnormal)
                                          : normal;
  return BitsToFloat(out | sign);
}

PS_HALF_HD float Bfloat16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

// float to IEEE binary16, rounded to nearest even: |f| >= 65520 gives
// infinity, NaN the quiet NaN 0x7e00 (with f's sign), tiny values subnormals.
// Branch-free, like HalfToFloat.
PS_HALF_HD uint16_t FloatToHalf(float f) {
  const uint32_t all = FloatToBits(f);
  const uint32_t sign = (all >> 16) & 0x8000u;
  const uint32_t x = all & 0x7fffffffu;
  const uint32_t special = x > 0x7f800000u ? 0x7e00u : 0x7c00u;  // NaN, else inf
  // Below 2^-14: adding 0.5 aligns the 10 mantissa bits at the bottom, and
  // the float addition rounds to nearest even.
  const uint32_t subnormal = FloatToBits(BitsToFloat(x) + BitsToFloat(126u << 23)) - (126u << 23);
  // Rebias the exponent (-112 << 23) and round to nearest even.
  const uint32_t normal = (x + 0xc8000fffu + ((x >> 13) & 1u)) >> 13;
  const uint32_t out = x >= 0x47800000u ? special : x < 0x38800000u ? subnormal : normal;
  return static_cast<uint16_t>(out | sign);
}

// float to bfloat16, rounded to nearest even; NaN stays NaN (quiet).
PS_HALF_HD uint16_t FloatToBfloat16(float f) {
  const uint32_t x = FloatToBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace half
}  // namespace pserver

#endif  // PSERVER_CC_CORE_HALF_FLOAT_H_
