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
}  // namespace pserver

#endif  // PSERVER_CC_CORE_HALF_FLOAT_H_
