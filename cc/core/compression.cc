#include "cc/core/compression.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "cc/core/status_macros.h"

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

absl::Status ValidateWireCompressionFor(const v1::WireCompression& config, ElementType type,
                                        const std::string& what, absl::string_view noun) {
  PS_RETURN_IF_ERROR(ValidateWireCompression(config, what));
  if (Compresses(config) && type != v1::FLOAT32) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": wire_compression needs a float32 ",
                                                   noun, "; this one is ", ElementTypeName(type)));
  }
  return absl::OkStatus();
}

bool CanTravelAs(ElementType stored, ElementType wire) {
  return stored == v1::FLOAT32 && (wire == v1::FLOAT16 || wire == v1::BFLOAT16);
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

namespace {

// Values sampled to guess a threshold below the k-th largest magnitude.
constexpr size_t kSamples = 4096;

// A magnitude at most the k-th largest of |r[i] + g[i]| (i < n), guessed
// from kSamples evenly spaced elements with a margin, or 0 (take all as
// candidates) when the guess would not save a pass. Not exact: the caller
// checks that at least k elements reach it.
float GuessThreshold(const float* r, const float* g, size_t n, size_t k) {
  if (n < 4 * kSamples || k > n / 8) return 0.0f;
  std::vector<float> sample(kSamples);
  const size_t stride = n / kSamples;
  for (size_t s = 0; s < kSamples; ++s) sample[s] = std::fabs(r[s * stride] + g[s * stride]);
  // Expect k * kSamples / n samples above the k-th; aim at twice that (and
  // a few more), so that the candidates hold the top k but rarely many more.
  const size_t rank = std::min<size_t>(
      kSamples - 1, 2 * (k * kSamples + n - 1) / n + 16);
  std::nth_element(sample.begin(), sample.begin() + rank, sample.end(), std::greater<float>());
  return sample[rank];
}

// r[i] += g[i] for i < n, and the indices whose |r[i]| >= threshold.
std::vector<uint32_t> AddAndCollect(float* r, const float* g, size_t n, float threshold,
                                    size_t expected) {
  std::vector<uint32_t> candidates;
  candidates.reserve(expected);
  for (size_t i = 0; i < n; ++i) {
    r[i] += g[i];
    if (std::fabs(r[i]) >= threshold) candidates.push_back(static_cast<uint32_t>(i));
  }
  return candidates;
}

// The k largest |r[i]| of `candidates` (in index order; k <= their count),
// ties to the lowest index: taken out of r into `out`.
void TakeTopK(float* r, const std::vector<uint32_t>& candidates, size_t k, SparseGradient* out) {
  // The k-th largest magnitude, then one pass in index order: every value
  // above it, and values equal to it until k are taken.
  std::vector<float> magnitudes(candidates.size());
  for (size_t c = 0; c < candidates.size(); ++c) magnitudes[c] = std::fabs(r[candidates[c]]);
  std::nth_element(magnitudes.begin(), magnitudes.begin() + (k - 1), magnitudes.end(),
                   std::greater<float>());
  const float threshold = magnitudes[k - 1];
  size_t above = 0;
  for (size_t i = 0; i < k; ++i) above += magnitudes[i] > threshold;
  size_t ties = k - above;
  out->indices.reserve(k);
  out->values.reserve(k);
  for (size_t c = 0; c < candidates.size() && out->indices.size() < k; ++c) {
    const uint32_t i = candidates[c];
    const float m = std::fabs(r[i]);
    const bool take = m > threshold || (m == threshold && ties > 0);
    if (!take) continue;
    if (!(m > threshold)) --ties;
    out->indices.push_back(i);
    out->values.push_back(r[i]);
    r[i] = 0.0f;
  }
}

}  // namespace

std::string NarrowFloats(ElementType type, absl::string_view float32_bytes) {
  const size_t n = float32_bytes.size() / sizeof(float);
  std::string out(n * ElementSize(type), '\0');
  std::vector<float> aligned;
  const float* values = reinterpret_cast<const float*>(float32_bytes.data());
  if (reinterpret_cast<uintptr_t>(values) % alignof(float) != 0) {
    aligned.resize(n);
    std::memcpy(aligned.data(), float32_bytes.data(), n * sizeof(float));
    values = aligned.data();
  }
  EncodeFloats(type, values, n, out.data());
  return out;
}

SparseGradient ErrorFeedback::AddAndSelect(const float* grad, size_t offset, size_t n, size_t k) {
  float* r = residual_.data() + offset;
  k = std::min(k, n);
  SparseGradient out;
  if (k == 0) {
    for (size_t i = 0; i < n; ++i) r[i] += grad[i];
    return out;
  }
  // Candidates: the elements at or above a sampled threshold, found in the
  // pass that adds the gradient. Too few (the guess was above the k-th
  // largest): every element is one.
  const float guess = GuessThreshold(r, grad, n, k);
  std::vector<uint32_t> candidates = AddAndCollect(r, grad, n, guess, 4 * k + 64);
  if (candidates.size() < k) {
    candidates.resize(n);
    for (size_t i = 0; i < n; ++i) candidates[i] = static_cast<uint32_t>(i);
  }
  TakeTopK(r, candidates, k, &out);
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
