#include "cc/core/row_initializer.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace pserver {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr double kTwoPi = 6.28318530717958647692;

absl::Status Finite(double value, absl::string_view what, absl::string_view field) {
  if (std::isfinite(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": initializer.", field, " must be finite, got ", value));
}

}  // namespace

double HashUniform(uint64_t seed, uint64_t key, uint64_t stream) {
  // The seed is mixed before it meets the key, so that two seeds do not just
  // permute each other's keys (as a plain seed ^ key would).
  const uint64_t row = SplitMix64(SplitMix64(seed) ^ key);
  const uint64_t x = SplitMix64(row + (stream + 1) * kGolden);
  return static_cast<double>(x >> 11) * 0x1.0p-53;  // 53 random bits
}

absl::StatusOr<RowInitializer> RowInitializer::Create(const v1::RowInitializer& config,
                                                      absl::string_view what) {
  RowInitializer init;
  init.seed_ = config.seed();
  switch (config.kind_case()) {
    case v1::RowInitializer::kUniform: {
      const auto& u = config.uniform();
      if (absl::Status s = Finite(u.low(), what, "uniform.low"); !s.ok()) return s;
      if (absl::Status s = Finite(u.high(), what, "uniform.high"); !s.ok()) return s;
      if (!(u.low() < u.high())) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": initializer.uniform.low must be < high, got low=", u.low(),
                         ", high=", u.high()));
      }
      if (!std::isfinite(u.high() - u.low())) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": initializer.uniform high - low must be finite, got low=", u.low(),
                         ", high=", u.high()));
      }
      init.kind_ = Kind::kUniform;
      init.a_ = u.low();
      init.b_ = u.high();
      break;
    }
    case v1::RowInitializer::kNormal: {
      const auto& n = config.normal();
      if (absl::Status s = Finite(n.mean(), what, "normal.mean"); !s.ok()) return s;
      if (!std::isfinite(n.stddev()) || n.stddev() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": initializer.normal.stddev must be finite and >= 0, got ", n.stddev()));
      }
      init.kind_ = Kind::kNormal;
      init.a_ = n.mean();
      init.b_ = n.stddev();
      break;
    }
    default:
      init.kind_ = Kind::kZeros;
      break;
  }
  return init;
}

double RowInitializer::Value(uint64_t key, uint64_t column) const {
  switch (kind_) {
    case Kind::kZeros:
      return 0;
    case Kind::kUniform:
      return a_ + (b_ - a_) * HashUniform(seed_, key, 2 * column);
    case Kind::kNormal: {
      // Box-Muller; 1 - u is in (0, 1], so the log is finite.
      const double u1 = 1.0 - HashUniform(seed_, key, 2 * column);
      const double u2 = HashUniform(seed_, key, 2 * column + 1);
      return a_ + b_ * std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
    }
  }
  return 0;
}

template <typename T>
void RowInitializer::Fill(uint64_t key, absl::Span<T> out) const {
  if (kind_ == Kind::kZeros) {
    for (T& v : out) v = T(0);
    return;
  }
  for (size_t c = 0; c < out.size(); ++c) {
    T v = static_cast<T>(Value(key, c));
    if (kind_ == Kind::kUniform) {
      // Rounding to T may reach `high` (or leave [low, high) by a hair).
      const T low = static_cast<T>(a_);
      const T high = static_cast<T>(b_);
      if (v >= high) v = std::nextafter(high, low);
      if (v < low) v = low;
    }
    out[c] = v;
  }
}

template void RowInitializer::Fill<float>(uint64_t, absl::Span<float>) const;
template void RowInitializer::Fill<double>(uint64_t, absl::Span<double>) const;

}  // namespace pserver
