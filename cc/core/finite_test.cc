#include "cc/core/finite.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pserver {
namespace {

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

template <typename T>
void ExpectFirstAt(ElementType type, size_t n) {
  // The same value at every position of arrays longer than a chunk, and a
  // second bad value later: the first is reported.
  for (size_t at : {size_t{0}, size_t{1}, size_t{255}, size_t{256}, size_t{700}, n - 1}) {
    std::vector<T> values(n, T(1.5));
    values[at] = std::numeric_limits<T>::quiet_NaN();
    if (at + 1 < n) values[n - 1] = std::numeric_limits<T>::infinity();
    std::optional<NonFinite> bad = FindNonFinite(type, Bytes(values));
    ASSERT_TRUE(bad.has_value()) << at;
    EXPECT_EQ(bad->index, at);
    EXPECT_STREQ(bad->kind, "NaN");
  }
}

TEST(FindNonFiniteTest, FindsTheFirstNaNInFloat32AndFloat64) {
  ExpectFirstAt<float>(v1::FLOAT32, 1000);
  ExpectFirstAt<double>(v1::FLOAT64, 1000);
}

TEST(FindNonFiniteTest, TellsNaNFromInfinities) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_STREQ(FindNonFinite(v1::FLOAT32, Bytes<float>({0, inf}))->kind, "inf");
  EXPECT_STREQ(FindNonFinite(v1::FLOAT32, Bytes<float>({-inf}))->kind, "-inf");
  EXPECT_STREQ(
      FindNonFinite(v1::FLOAT32, Bytes<float>({-std::numeric_limits<float>::quiet_NaN()}))->kind,
      "NaN");
}

TEST(FindNonFiniteTest, FiniteExtremesPass) {
  EXPECT_FALSE(FindNonFinite(v1::FLOAT32,
                             Bytes<float>({std::numeric_limits<float>::max(),
                                           -std::numeric_limits<float>::max(),
                                           std::numeric_limits<float>::denorm_min(), -0.0f, 0.0f}))
                   .has_value());
  EXPECT_FALSE(FindNonFinite(v1::FLOAT64, Bytes<double>({std::numeric_limits<double>::max(),
                                                         std::numeric_limits<double>::lowest()}))
                   .has_value());
  EXPECT_FALSE(FindNonFinite(v1::FLOAT32, "").has_value());
}

TEST(FindNonFiniteTest, HalfPrecisionTransportTypes) {
  // float16: 0x7c00 inf, 0xfc00 -inf, 0x7e00 NaN, 0x7bff the largest finite.
  EXPECT_FALSE(FindNonFinite(v1::FLOAT16, Bytes<uint16_t>({0x3c00, 0x7bff, 0xfbff})).has_value());
  EXPECT_EQ(FindNonFinite(v1::FLOAT16, Bytes<uint16_t>({0x3c00, 0xfc00}))->index, 1u);
  EXPECT_STREQ(FindNonFinite(v1::FLOAT16, Bytes<uint16_t>({0x3c00, 0xfc00}))->kind, "-inf");
  EXPECT_STREQ(FindNonFinite(v1::FLOAT16, Bytes<uint16_t>({0x7e00}))->kind, "NaN");
  // bfloat16: 0x7f80 inf, 0x7fc0 NaN, 0x7f7f the largest finite.
  EXPECT_FALSE(FindNonFinite(v1::BFLOAT16, Bytes<uint16_t>({0x3f80, 0x7f7f})).has_value());
  EXPECT_STREQ(FindNonFinite(v1::BFLOAT16, Bytes<uint16_t>({0x3f80, 0x7f80}))->kind, "inf");
  EXPECT_STREQ(FindNonFinite(v1::BFLOAT16, Bytes<uint16_t>({0x7fc0}))->kind, "NaN");
}

TEST(FindNonFiniteTest, IntegersHaveNone) {
  // The bits of a float NaN, read as integers, are a number.
  EXPECT_FALSE(FindNonFinite(v1::INT32, Bytes<uint32_t>({0x7fc00000u})).has_value());
  EXPECT_FALSE(FindNonFinite(v1::UINT64, Bytes<uint64_t>({~uint64_t{0}})).has_value());
}

TEST(FindNonFiniteTest, UnalignedBytes) {
  std::vector<float> values(300, 1.0f);
  values[299] = std::numeric_limits<float>::infinity();
  std::string bytes = "x" + Bytes(values);
  EXPECT_EQ(FindNonFinite(v1::FLOAT32, absl::string_view(bytes).substr(1))->index, 299u);
}

}  // namespace
}  // namespace pserver
