#include "cc/core/compression.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"

namespace pserver {
namespace {

// The loops below are plain per-element code over contiguous arrays with no
// aliasing, which the compiler vectorizes.
template <uint16_t (*kNarrow)(float)>
void Narrow(const float* in, size_t n, char* out) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = kNarrow(in[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

template <float (*kWiden)(uint16_t)>
void Widen(const char* in, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = kWiden(h);
  }
}

}  // namespace

bool IsWireFloatType(ElementType type) {
  return type == v1::FLOAT32 || type == v1::FLOAT16 || type == v1::BFLOAT16;
}

ElementType WireValueType(const v1::WireCompression& config) {
  switch (config.value_type()) {
    case v1::WireCompression::FLOAT16: return v1::FLOAT16;
    case v1::WireCompression::BFLOAT16: return v1::BFLOAT16;
    default: return v1::FLOAT32;
  }
}

bool Compresses(const v1::WireCompression& config) {
  return WireValueType(config) != v1::FLOAT32 || TopKCount(config, 1) > 0;
}

absl::Status ValidateWireCompression(const v1::WireCompression& config, const std::string& what) {
  if (!v1::WireCompression::ValueType_IsValid(config.value_type())) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": wire_compression.value_type ",
                                                   config.value_type(),
                                                   " is unknown; want AS_STORED, FLOAT16 or "
                                                   "BFLOAT16"));
  }
  const double f = config.topk_fraction();
  if (!std::isfinite(f) || f < 0 || f > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": wire_compression.topk_fraction must be in [0, 1] (0: off), got ", f));
  }
  return absl::OkStatus();
}

size_t TopKCount(const v1::WireCompression& config, size_t elements) {
  if (config.topk_count() > 0) {
    return static_cast<size_t>(std::min<uint64_t>(config.topk_count(), elements));
  }
  if (!(config.topk_fraction() > 0)) return 0;
  const double k = std::ceil(config.topk_fraction() * static_cast<double>(elements));
  return std::clamp<size_t>(static_cast<size_t>(k), 1, std::max<size_t>(elements, 1));
}

void EncodeFloats(ElementType type, const float* in, size_t n, char* out) {
  switch (type) {
    case v1::FLOAT16: return Narrow<half::FloatToHalf>(in, n, out);
    case v1::BFLOAT16: return Narrow<half::FloatToBfloat16>(in, n, out);
    default: std::memcpy(out, in, n * sizeof(float));
  }
}

void DecodeFloats(ElementType type, const char* in, size_t n, float* out) {
  switch (type) {
    case v1::FLOAT16: return Widen<half::HalfToFloat>(in, n, out);
    case v1::BFLOAT16: return Widen<half::Bfloat16ToFloat>(in, n, out);
    default: std::memcpy(out, in, n * sizeof(float));
  }
}

SparseGradient ErrorFeedback::AddAndSelect(const float* grad, size_t offset, size_t n, size_t k) {
  float* r = residual_.data() + offset;
  for (size_t i = 0; i < n; ++i) r[i] += grad[i];
  k = std::min(k, n);
  SparseGradient out;
  if (k == 0) return out;
  // The k-th largest magnitude, then one pass in index order: every value
  // above it, and values equal to it until k are taken.
  std::vector<float> magnitudes(r, r + n);
  for (float& m : magnitudes) m = std::fabs(m);
  std::nth_element(magnitudes.begin(), magnitudes.begin() + (k - 1), magnitudes.end(),
                   std::greater<float>());
  const float threshold = magnitudes[k - 1];
  size_t above = 0;
  for (size_t i = 0; i < k; ++i) above += magnitudes[i] > threshold;
  size_t ties = k - above;
  out.indices.reserve(k);
  out.values.reserve(k);
  for (size_t i = 0; i < n && out.indices.size() < k; ++i) {
    const float m = std::fabs(r[i]);
    const bool take = m > threshold || (m == threshold && ties > 0);
    if (!take) continue;
    if (!(m > threshold)) --ties;
    out.indices.push_back(static_cast<uint32_t>(i));
    out.values.push_back(r[i]);
    r[i] = 0.0f;
  }
  return out;
}

absl::StatusOr<std::string> WidenGradient(ElementType type, absl::string_view content,
                                          absl::string_view indices, size_t elements,
                                          const std::string& what) {
  if (!IsWireFloatType(type)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": element type ", ElementTypeName(type),
        " cannot carry a float32 parameter's gradient; want float32, float16 or bfloat16"));
  }
  const size_t esize = ElementSize(type);
  if (indices.size() % sizeof(uint32_t) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": top-k indices are ", indices.size(), " bytes, not a multiple of 4 (uint32)"));
  }
  const bool sparse = !indices.empty();
  const size_t values = sparse ? indices.size() / sizeof(uint32_t) : elements;
  if (content.size() != values * esize) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", content.size(), " bytes received, ", values * esize,
                     " expected (", values, " ", ElementTypeName(type), " values",
                     sparse ? ", one per top-k index)" : ")"));
  }
  std::string out(elements * sizeof(float), '\0');
  float* dense = reinterpret_cast<float*>(out.data());
  if (!sparse) {
    DecodeFloats(type, content.data(), elements, dense);
    return out;
  }
  std::vector<float> decoded(values);
  DecodeFloats(type, content.data(), values, decoded.data());
  for (size_t i = 0; i < values; ++i) {
    uint32_t index;
    std::memcpy(&index, indices.data() + i * sizeof(index), sizeof(index));
    if (index >= elements) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": top-k index ", index, " (entry ", i,
                                                     ") is out of range; the block has ",
                                                     elements, " elements"));
    }
    dense[index] += decoded[i];
  }
  return out;
}

}  // namespace pserver
