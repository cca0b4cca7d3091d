#include "cc/core/compression.h"

#include <cmath>
#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::IsOk;
using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

float Bits(uint32_t b) { return half::BitsToFloat(b); }

TEST(HalfTest, EveryFloat16WidensAndNarrowsBackExactly) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = half::HalfToFloat(static_cast<uint16_t>(h));
    const bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
    if (nan) {
      EXPECT_TRUE(std::isnan(f)) << h;
      EXPECT_TRUE(std::isnan(half::HalfToFloat(half::FloatToHalf(f)))) << h;
    } else {
      EXPECT_EQ(half::FloatToHalf(f), h) << h;
    }
  }
}

TEST(HalfTest, EveryBfloat16WidensAndNarrowsBackExactly) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = half::Bfloat16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(half::Bfloat16ToFloat(half::FloatToBfloat16(f)))) << h;
    } else {
      EXPECT_EQ(half::FloatToBfloat16(f), h) << h;
    }
  }
}

TEST(HalfTest, Float16RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to the even 1.
  EXPECT_EQ(half::FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9: up.
  EXPECT_EQ(half::FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  // Just above halfway rounds up.
  EXPECT_EQ(half::FloatToHalf(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
  EXPECT_EQ(half::FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(half::FloatToHalf(65504.0f), 0x7bff);  // the largest float16
  EXPECT_EQ(half::FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(half::FloatToHalf(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(half::FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(half::FloatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(half::FloatToHalf(std::numeric_limits<float>::quiet_NaN()) & 0x7e00, 0x7e00);
  // Subnormals: 2^-24 is the smallest; half of it ties to zero, a bit more rounds up.
  EXPECT_EQ(half::FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(half::FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(half::FloatToHalf(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(half::FloatToHalf(-std::ldexp(3.0f, -24)), 0x8003);
  EXPECT_EQ(half::FloatToHalf(std::ldexp(1.0f, -14)), 0x0400);  // the smallest normal
  EXPECT_EQ(half::FloatToHalf(-0.0f), 0x8000);
}

TEST(HalfTest, Bfloat16RoundsToNearestEven) {
  EXPECT_EQ(half::FloatToBfloat16(Bits(0x3f808000)), 0x3f80);  // tie, even stays
  EXPECT_EQ(half::FloatToBfloat16(Bits(0x3f818000)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(half::FloatToBfloat16(Bits(0x3f808001)), 0x3f81);
  EXPECT_EQ(half::FloatToBfloat16(Bits(0x7f7fffff)), 0x7f80);  // max float: infinity
  EXPECT_EQ(half::FloatToBfloat16(Bits(0x00000001)), 0x0000);  // denormal rounds to 0
  EXPECT_EQ(half::FloatToBfloat16(Bits(0x00018000)), 0x0002);  // denormals kept
  const uint16_t nan = half::FloatToBfloat16(Bits(0x7f800001));  // signalling NaN
  EXPECT_TRUE(std::isnan(half::Bfloat16ToFloat(nan)));
}

TEST(HalfTest, RandomValuesRoundWithinHalfAnUlp) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1000.0f, 1000.0f);
  std::vector<float> in(4099);
  for (float& v : in) v = dist(rng);
  for (ElementType type : {v1::FLOAT16, v1::BFLOAT16, v1::FLOAT32}) {
    std::string wire(in.size() * ElementSize(type), '\0');
    EncodeFloats(type, in.data(), in.size(), wire.data() + 0);
    std::vector<float> back(in.size());
    DecodeFloats(type, wire.data(), in.size(), back.data());
    const int mantissa = type == v1::FLOAT16 ? 10 : type == v1::BFLOAT16 ? 7 : 23;
    for (size_t i = 0; i < in.size(); ++i) {
      int exp;
      std::frexp(in[i], &exp);
      // Half an ulp of the narrow type at in[i]'s binade (float16 normals here).
      const float half_ulp = std::ldexp(1.0f, exp - 1 - mantissa - 1);
      ASSERT_LE(std::fabs(back[i] - in[i]), half_ulp) << ElementTypeName(type) << " " << in[i];
    }
  }
}

TEST(TopKTest, CountFromConfig) {
  v1::WireCompression c;
  EXPECT_EQ(TopKCount(c, 100), 0u);
  c.set_topk_fraction(0.011);
  EXPECT_EQ(TopKCount(c, 100), 2u);
  EXPECT_EQ(TopKCount(c, 10), 1u);
  c.set_topk_count(7);
  EXPECT_EQ(TopKCount(c, 100), 7u);
  EXPECT_EQ(TopKCount(c, 5), 5u);
  EXPECT_TRUE(Compresses(c));
  EXPECT_FALSE(Compresses(v1::WireCompression()));
}

TEST(TopKTest, ValidateNamesTheField) {
  v1::WireCompression c;
  c.set_topk_fraction(1.5);
  EXPECT_THAT(ValidateWireCompression(c, "parameter 'w'"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("parameter 'w': wire_compression.topk_fraction")));
  c.set_topk_fraction(0.5);
  c.set_value_type(static_cast<v1::WireCompression::ValueType>(9));
  EXPECT_THAT(ValidateWireCompression(c, "parameter 'w'"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("value_type 9")));
}

TEST(TopKTest, SelectsLargestMagnitudesAndKeepsTheRest) {
  ErrorFeedback feedback(6);
  const float g[] = {0.5f, -3.0f, 1.0f, 2.0f, -0.1f, 2.0f};
  SparseGradient sent = feedback.AddAndSelect(g, 0, 6, 3);
  // -3, then the tie at 2.0: both (k = 3).
  EXPECT_THAT(sent.indices, ::testing::ElementsAre(1, 3, 5));
  EXPECT_THAT(sent.values, ::testing::ElementsAre(-3.0f, 2.0f, 2.0f));
  EXPECT_THAT(feedback.residual(), ::testing::ElementsAre(0.5f, 0.0f, 1.0f, 0.0f, -0.1f, 0.0f));
  // Ties beyond k: lowest index first.
  ErrorFeedback ties(4);
  const float same[] = {1.0f, -1.0f, 1.0f, 1.0f};
  EXPECT_THAT(ties.AddAndSelect(same, 0, 4, 2).indices, ::testing::ElementsAre(0, 1));
}

TEST(TopKTest, ErrorFeedbackSumsToTheUncompressedGradient) {
  // Over steps, what was sent plus what is left equals the sum of the
  // gradients, element by element (exact with these dyadic values).
  constexpr size_t kN = 64;
  constexpr size_t kOffset = 16, kBlock = 32;
  ErrorFeedback feedback(kN);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> k(-64, 64);
  std::vector<float> total(kN, 0.0f), sent(kN, 0.0f);
  for (int step = 0; step < 50; ++step) {
    std::vector<float> g(kBlock);
    for (size_t i = 0; i < kBlock; ++i) {
      g[i] = static_cast<float>(k(rng)) / 64.0f;
      total[kOffset + i] += g[i];
    }
    SparseGradient s = feedback.AddAndSelect(g.data(), kOffset, kBlock, 4);
    ASSERT_EQ(s.indices.size(), 4u);
    for (size_t j = 0; j < s.indices.size(); ++j) sent[kOffset + s.indices[j]] += s.values[j];
  }
  for (size_t i = 0; i < kN; ++i) {
    EXPECT_EQ(sent[i] + feedback.residual()[i], total[i]) << i;
  }
}

// The sampled threshold (large blocks) takes exactly what a full sort
// would: the k largest magnitudes, ties to the lowest index, also with many
// ties and with a distribution the sample misjudges.
TEST(TopKTest, LargeBlocksSelectExactlyAsAFullSort) {
  constexpr size_t kN = 1 << 16;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> coarse(-8, 8);
  for (int pattern = 0; pattern < 3; ++pattern) {
    std::vector<float> g(kN);
    for (size_t i = 0; i < kN; ++i) {
      g[i] = pattern == 0 ? normal(rng) : static_cast<float>(coarse(rng));
      if (pattern == 2 && i % 4096 != 7) g[i] *= 1e-3f;  // the sample sees only small values
    }
    for (size_t k : {size_t{1}, size_t{100}, size_t{655}, size_t{5000}}) {
      std::vector<uint32_t> order(kN);
      for (uint32_t i = 0; i < kN; ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        return std::fabs(g[a]) > std::fabs(g[b]);
      });
      std::vector<uint32_t> want(order.begin(), order.begin() + k);
      std::sort(want.begin(), want.end());
      ErrorFeedback feedback(kN);
      SparseGradient sent = feedback.AddAndSelect(g.data(), 0, kN, k);
      EXPECT_EQ(sent.indices, want) << "pattern " << pattern << " k " << k;
      for (size_t j = 0; j < sent.indices.size(); ++j) {
        EXPECT_EQ(sent.values[j], g[sent.indices[j]]);
        EXPECT_EQ(feedback.residual()[sent.indices[j]], 0.0f);
      }
    }
  }
}

TEST(WireTypeTest, ValidateForTypeAndTravel) {
  v1::WireCompression c;
  c.set_value_type(v1::WireCompression::BFLOAT16);
  EXPECT_THAT(ValidateWireCompressionFor(c, v1::FLOAT32, "table 't'", "table"), IsOk());
  EXPECT_THAT(ValidateWireCompressionFor(c, v1::FLOAT64, "table 't'", "table"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("table 't': wire_compression needs a float32 table; this one is "
                                 "float64")));
  EXPECT_TRUE(CanTravelAs(v1::FLOAT32, v1::FLOAT16));
  EXPECT_FALSE(CanTravelAs(v1::FLOAT64, v1::FLOAT16));
  EXPECT_FALSE(CanTravelAs(v1::FLOAT32, v1::INT32));
  const float values[] = {1.5f, -2.0f};
  std::string bytes(1 + sizeof(values), '\0');  // unaligned on purpose
  std::memcpy(bytes.data() + 1, values, sizeof(values));
  const std::string narrow = NarrowFloats(v1::FLOAT16, absl::string_view(bytes).substr(1));
  float back[2];
  DecodeFloats(v1::FLOAT16, narrow.data(), 2, back);
  EXPECT_THAT(back, ::testing::ElementsAre(1.5f, -2.0f));
}

std::string Indices(std::vector<uint32_t> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

TEST(WidenGradientTest, DenseAndSparse) {
  const float values[] = {1.5f, -2.0f, 0.25f};
  std::string half(6, '\0');
  EncodeFloats(v1::FLOAT16, values, 3, half.data());
  absl::StatusOr<std::string> dense = WidenGradient(v1::FLOAT16, half, "", 3, "g");
  ASSERT_THAT(dense, IsOk());
  EXPECT_EQ(*dense, std::string(reinterpret_cast<const char*>(values), 12));

  absl::StatusOr<std::string> sparse =
      WidenGradient(v1::FLOAT16, half, Indices({4, 0, 4}), 5, "g");
  ASSERT_THAT(sparse, IsOk());
  std::vector<float> got(5);
  std::memcpy(got.data(), sparse->data(), 20);
  EXPECT_THAT(got, ::testing::ElementsAre(-2.0f, 0.0f, 0.0f, 0.0f, 1.75f));
}

TEST(WidenGradientTest, BadInputIsNamed) {
  const std::string four(4, '\0');
  EXPECT_THAT(WidenGradient(v1::INT32, four, "", 1, "gradient for parameter 'w'"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("gradient for parameter 'w': element type int32")));
  EXPECT_THAT(WidenGradient(v1::FLOAT16, four, "", 3, "g"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("4 bytes received, 6")));
  EXPECT_THAT(WidenGradient(v1::FLOAT16, four, "abc", 3, "g"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a multiple of 4")));
  EXPECT_THAT(WidenGradient(v1::FLOAT32, four, Indices({3}), 3, "g"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("top-k index 3 (entry 0) is out of range")));
  EXPECT_THAT(WidenGradient(v1::FLOAT32, four, Indices({0, 1}), 3, "g"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one per top-k index")));
}

}  // namespace
}  // namespace pserver
