#include "cc/core/finite.h"

#include <cstdint>
#include <cstring>

namespace pserver {
namespace {

// Bits of one value, and the mask of its exponent: a value is NaN or infinite
// exactly when its exponent bits are all ones; NaN when its mantissa (the
// bits below the exponent) is not zero as well.
template <typename Bits>
struct Format {
  Bits exponent;
  Bits mantissa;
};
constexpr Format<uint16_t> kFloat16{0x7c00, 0x03ff};
constexpr Format<uint16_t> kBfloat16{0x7f80, 0x007f};
constexpr Format<uint32_t> kFloat32{0x7f800000u, 0x007fffffu};
constexpr Format<uint64_t> kFloat64{0x7ff0000000000000ull, 0x000fffffffffffffull};

// Values per chunk: a chunk is tested without branches (vectorized), and
// scanned element by element only when it holds a non-finite value.
constexpr size_t kChunk = 256;

template <typename Bits>
Bits Load(const char* p) {
  Bits bits;
  std::memcpy(&bits, p, sizeof(bits));
  return bits;
}

template <typename Bits>
bool ChunkHasNonFinite(const char* p, size_t n, Bits exponent) {
  Bits any = 0;
  for (size_t i = 0; i < n; ++i) {
    any |= static_cast<Bits>((Load<Bits>(p + i * sizeof(Bits)) & exponent) == exponent);
  }
  return any != 0;
}

template <typename Bits>
std::optional<NonFinite> Find(absl::string_view bytes, Format<Bits> format) {
  const size_t n = bytes.size() / sizeof(Bits);
  for (size_t start = 0; start < n; start += kChunk) {
    const size_t len = n - start < kChunk ? n - start : kChunk;
    const char* chunk = bytes.data() + start * sizeof(Bits);
    if (!ChunkHasNonFinite<Bits>(chunk, len, format.exponent)) continue;
    for (size_t i = 0; i < len; ++i) {
      const Bits bits = Load<Bits>(chunk + i * sizeof(Bits));
      if ((bits & format.exponent) != format.exponent) continue;
      const bool negative = (bits >> (8 * sizeof(Bits) - 1)) != 0;
      const char* kind = (bits & format.mantissa) != 0 ? "NaN" : negative ? "-inf" : "inf";
      return NonFinite{start + i, kind};
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<NonFinite> FindNonFinite(ElementType type, absl::string_view bytes) {
  switch (type) {
    case v1::FLOAT32:
      return Find(bytes, kFloat32);
    case v1::FLOAT64:
      return Find(bytes, kFloat64);
    case v1::FLOAT16:
      return Find(bytes, kFloat16);
    case v1::BFLOAT16:
      return Find(bytes, kBfloat16);
    default:
      return std::nullopt;
  }
}

}  // namespace pserver
