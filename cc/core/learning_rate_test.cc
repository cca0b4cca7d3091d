#include "cc/core/learning_rate.h"

#include <cmath>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "pserver/v1/config.pb.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

constexpr double kTol = 1e-12;

v1::LearningRateSchedule Schedule(const std::string& text) {
  v1::LearningRateSchedule schedule;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &schedule)) << text;
  return schedule;
}

TEST(LearningRateTest, DefaultRateWhenUnset) {
  ASSERT_OK_AND_ASSIGN(LearningRate lr, LearningRate::Create({}, 0.01));
  EXPECT_DOUBLE_EQ(lr.base(), 0.01);
  EXPECT_DOUBLE_EQ(lr.At(0), 0.01);
  EXPECT_DOUBLE_EQ(lr.At(1000000), 0.01);

  ASSERT_OK_AND_ASSIGN(LearningRate adadelta, LearningRate::Create({}, 1.0));
  EXPECT_DOUBLE_EQ(adadelta.At(7), 1.0);
}

TEST(LearningRateTest, ExplicitRateOverridesDefault) {
  ASSERT_OK_AND_ASSIGN(LearningRate lr, LearningRate::Create(Schedule("learning_rate: 0.5"), 0.01));
  EXPECT_DOUBLE_EQ(lr.base(), 0.5);
  EXPECT_DOUBLE_EQ(lr.At(3), 0.5);
}

TEST(LearningRateTest, ExplicitZeroRateIsKept) {
  // learning_rate is optional: an explicit 0 is not "unset".
  ASSERT_OK_AND_ASSIGN(LearningRate lr, LearningRate::Create(Schedule("learning_rate: 0"), 0.01));
  EXPECT_EQ(lr.base(), 0.0);
  EXPECT_EQ(lr.At(5), 0.0);
}

TEST(LearningRateTest, Constant) {
  ASSERT_OK_AND_ASSIGN(LearningRate lr,
                       LearningRate::Create(Schedule("learning_rate: 0.3 constant {}"), 0.01));
  for (uint64_t t : {0, 1, 2, 100, 1000000}) EXPECT_DOUBLE_EQ(lr.At(t), 0.3) << t;
}

TEST(LearningRateTest, LinearDecay) {
  // base 1.0, end 0.2, 4 steps: 1.0 + (0.2 - 1.0) * min(t, 4) / 4
  //   t=0: 1.0   t=1: 0.8   t=2: 0.6   t=3: 0.4   t=4: 0.2   t=10: 0.2
  ASSERT_OK_AND_ASSIGN(
      LearningRate lr,
      LearningRate::Create(
          Schedule("learning_rate: 1.0 linear { end_learning_rate: 0.2 decay_steps: 4 }"), 0.01));
  EXPECT_NEAR(lr.At(0), 1.0, kTol);
  EXPECT_NEAR(lr.At(1), 0.8, kTol);
  EXPECT_NEAR(lr.At(2), 0.6, kTol);
  EXPECT_NEAR(lr.At(3), 0.4, kTol);
  EXPECT_NEAR(lr.At(4), 0.2, kTol);
  EXPECT_NEAR(lr.At(10), 0.2, kTol);
}

TEST(LearningRateTest, LinearDecayCanRise) {
  // base 0.1, end 0.5, 2 steps: t=1: 0.1 + 0.4 * 1/2 = 0.3; t>=2: 0.5.
  ASSERT_OK_AND_ASSIGN(
      LearningRate lr,
      LearningRate::Create(
          Schedule("learning_rate: 0.1 linear { end_learning_rate: 0.5 decay_steps: 2 }"), 0.01));
  EXPECT_NEAR(lr.At(1), 0.3, kTol);
  EXPECT_NEAR(lr.At(2), 0.5, kTol);
  EXPECT_NEAR(lr.At(99), 0.5, kTol);
}

TEST(LearningRateTest, StepDecay) {
  // base 0.8, gamma 0.5 every 3 steps: 0.8 * 0.5^floor(t / 3)
  //   t=0..2: 0.8   t=3..5: 0.4   t=6: 0.2   t=9: 0.1   t=30: 0.8/1024
  ASSERT_OK_AND_ASSIGN(
      LearningRate lr,
      LearningRate::Create(Schedule("learning_rate: 0.8 step { step_size: 3 gamma: 0.5 }"), 0.01));
  EXPECT_NEAR(lr.At(0), 0.8, kTol);
  EXPECT_NEAR(lr.At(2), 0.8, kTol);
  EXPECT_NEAR(lr.At(3), 0.4, kTol);
  EXPECT_NEAR(lr.At(5), 0.4, kTol);
  EXPECT_NEAR(lr.At(6), 0.2, kTol);
  EXPECT_NEAR(lr.At(9), 0.1, kTol);
  EXPECT_NEAR(lr.At(30), 0.8 / 1024, kTol);
}

TEST(LearningRateTest, CosineDecay) {
  // base 1.0, min 0.2, 4 steps: 0.2 + 0.8 * (1 + cos(pi * min(t, 4) / 4)) / 2
  //   t=0: cos 0 = 1            -> 0.2 + 0.8 = 1.0
  //   t=1: cos(pi/4) = 0.70711  -> 0.2 + 0.4 * 1.70711 = 0.882843
  //   t=2: cos(pi/2) = 0        -> 0.2 + 0.4 = 0.6
  //   t=3: cos(3pi/4) = -0.70711 -> 0.2 + 0.4 * 0.29289 = 0.317157
  //   t=4: cos(pi) = -1         -> 0.2
  //   t=7: clamped at 4         -> 0.2
  ASSERT_OK_AND_ASSIGN(
      LearningRate lr,
      LearningRate::Create(
          Schedule("learning_rate: 1.0 cosine { decay_steps: 4 min_learning_rate: 0.2 }"), 0.01));
  const double half_sqrt2 = std::sqrt(2.0) / 2;
  EXPECT_NEAR(lr.At(0), 1.0, kTol);
  EXPECT_NEAR(lr.At(1), 0.2 + 0.4 * (1 + half_sqrt2), kTol);
  EXPECT_NEAR(lr.At(1), 0.882843, 1e-6);
  EXPECT_NEAR(lr.At(2), 0.6, kTol);
  EXPECT_NEAR(lr.At(3), 0.2 + 0.4 * (1 - half_sqrt2), kTol);
  EXPECT_NEAR(lr.At(3), 0.317157, 1e-6);
  EXPECT_NEAR(lr.At(4), 0.2, kTol);
  EXPECT_NEAR(lr.At(7), 0.2, kTol);
}

TEST(LearningRateTest, WarmupWithoutStartFactor) {
  // f = 0, 4 warm-up steps: 0.4 * t / 4 for t < 4, then constant 0.4.
  //   t=0: 0   t=1: 0.1   t=2: 0.2   t=3: 0.3   t=4: 0.4   t=100: 0.4
  ASSERT_OK_AND_ASSIGN(LearningRate lr,
                       LearningRate::Create(Schedule("learning_rate: 0.4 warmup_steps: 4"), 0.01));
  EXPECT_NEAR(lr.At(0), 0.0, kTol);
  EXPECT_NEAR(lr.At(1), 0.1, kTol);
  EXPECT_NEAR(lr.At(2), 0.2, kTol);
  EXPECT_NEAR(lr.At(3), 0.3, kTol);
  EXPECT_NEAR(lr.At(4), 0.4, kTol);
  EXPECT_NEAR(lr.At(100), 0.4, kTol);
}

TEST(LearningRateTest, WarmupWithStartFactor) {
  // f = 0.5, 5 warm-up steps: 1.0 * (0.5 + 0.5 * t / 5) for t < 5.
  //   t=0: 0.5   t=1: 0.6   t=2: 0.7   t=4: 0.9   t=5: 1.0
  ASSERT_OK_AND_ASSIGN(
      LearningRate lr,
      LearningRate::Create(Schedule("learning_rate: 1.0 warmup_steps: 5 warmup_start_factor: 0.5"),
                           0.01));
  EXPECT_NEAR(lr.At(0), 0.5, kTol);
  EXPECT_NEAR(lr.At(1), 0.6, kTol);
  EXPECT_NEAR(lr.At(2), 0.7, kTol);
  EXPECT_NEAR(lr.At(4), 0.9, kTol);
  EXPECT_NEAR(lr.At(5), 1.0, kTol);
}

TEST(LearningRateTest, WarmupStartFactorOneIsFlat) {
  ASSERT_OK_AND_ASSIGN(
      LearningRate lr,
      LearningRate::Create(Schedule("learning_rate: 0.7 warmup_steps: 3 warmup_start_factor: 1"),
                           0.01));
  for (uint64_t t : {0, 1, 2, 3, 4}) EXPECT_NEAR(lr.At(t), 0.7, kTol) << t;
}

TEST(LearningRateTest, WarmupThenStepDecay) {
  // 2 warm-up steps from f = 0.5, then 0.8 * 0.5^floor((t - 2) / 2).
  //   t=0: 0.8 * 0.5 = 0.4    t=1: 0.8 * 0.75 = 0.6
  //   t=2: decay step 0 -> 0.8    t=3: step 1 -> 0.8
  //   t=4: step 2 -> 0.4          t=5: step 3 -> 0.4    t=6: step 4 -> 0.2
  ASSERT_OK_AND_ASSIGN(LearningRate lr,
                       LearningRate::Create(Schedule("learning_rate: 0.8 warmup_steps: 2 "
                                                     "warmup_start_factor: 0.5 "
                                                     "step { step_size: 2 gamma: 0.5 }"),
                                            0.01));
  EXPECT_NEAR(lr.At(0), 0.4, kTol);
  EXPECT_NEAR(lr.At(1), 0.6, kTol);
  EXPECT_NEAR(lr.At(2), 0.8, kTol);
  EXPECT_NEAR(lr.At(3), 0.8, kTol);
  EXPECT_NEAR(lr.At(4), 0.4, kTol);
  EXPECT_NEAR(lr.At(5), 0.4, kTol);
  EXPECT_NEAR(lr.At(6), 0.2, kTol);
}

TEST(LearningRateTest, WarmupThenLinearDecay) {
  // 4 warm-up steps (f = 0) to 1.0, then linear to 0 over 2 steps.
  //   t=0: 0   t=2: 0.5   t=3: 0.75   t=4: 1.0   t=5: 0.5   t=6: 0   t=9: 0
  ASSERT_OK_AND_ASSIGN(
      LearningRate lr,
      LearningRate::Create(Schedule("learning_rate: 1.0 warmup_steps: 4 "
                                    "linear { end_learning_rate: 0 decay_steps: 2 }"),
                           0.01));
  EXPECT_NEAR(lr.At(0), 0.0, kTol);
  EXPECT_NEAR(lr.At(2), 0.5, kTol);
  EXPECT_NEAR(lr.At(3), 0.75, kTol);
  EXPECT_NEAR(lr.At(4), 1.0, kTol);
  EXPECT_NEAR(lr.At(5), 0.5, kTol);
  EXPECT_NEAR(lr.At(6), 0.0, kTol);
  EXPECT_NEAR(lr.At(9), 0.0, kTol);
}

TEST(LearningRateTest, WarmupThenCosineDecay) {
  // 1 warm-up step (f = 0.2) at 0.5 * 0.2 = 0.1; then cosine from 0.5 to 0
  // over 2 steps: t=1: 0.5, t=2: 0.25 (cos(pi/2) = 0), t=3: 0.
  ASSERT_OK_AND_ASSIGN(LearningRate lr,
                       LearningRate::Create(Schedule("learning_rate: 0.5 warmup_steps: 1 "
                                                     "warmup_start_factor: 0.2 "
                                                     "cosine { decay_steps: 2 }"),
                                            0.01));
  EXPECT_NEAR(lr.At(0), 0.1, kTol);
  EXPECT_NEAR(lr.At(1), 0.5, kTol);
  EXPECT_NEAR(lr.At(2), 0.25, kTol);
  EXPECT_NEAR(lr.At(3), 0.0, kTol);
}

// ---- validation ---------------------------------------------------------------

void ExpectInvalid(const std::string& text, const std::string& field, double default_rate = 0.01) {
  EXPECT_THAT(LearningRate::Create(Schedule(text), default_rate),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(field)))
      << text;
}

TEST(LearningRateValidationTest, NegativeOrNonFiniteRate) {
  ExpectInvalid("learning_rate: -0.1", "learning_rate.learning_rate must be finite and >= 0");
  ExpectInvalid("learning_rate: inf", "learning_rate.learning_rate");
  ExpectInvalid("learning_rate: nan", "learning_rate.learning_rate");
  // The default rate is validated too.
  EXPECT_THAT(LearningRate::Create({}, -1.0), StatusIs(absl::StatusCode::kInvalidArgument,
                                                       HasSubstr("learning_rate.learning_rate")));
  EXPECT_THAT(
      LearningRate::Create({}, std::numeric_limits<double>::infinity()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("learning_rate.learning_rate")));
}

TEST(LearningRateValidationTest, Linear) {
  ExpectInvalid("linear { end_learning_rate: 0.1 decay_steps: 0 }",
                "learning_rate.linear.decay_steps must be > 0");
  ExpectInvalid("linear { end_learning_rate: -0.1 decay_steps: 10 }",
                "learning_rate.linear.end_learning_rate");
  ExpectInvalid("linear { end_learning_rate: inf decay_steps: 10 }",
                "learning_rate.linear.end_learning_rate");
}

TEST(LearningRateValidationTest, Step) {
  ExpectInvalid("step { step_size: 0 gamma: 0.5 }", "learning_rate.step.step_size must be > 0");
  ExpectInvalid("step { step_size: 10 gamma: 0 }", "learning_rate.step.gamma must be > 0");
  ExpectInvalid("step { step_size: 10 gamma: -0.5 }", "learning_rate.step.gamma");
  ExpectInvalid("step { step_size: 10 gamma: inf }", "learning_rate.step.gamma");
  ExpectInvalid("step { step_size: 10 gamma: nan }", "learning_rate.step.gamma");
  // An unset gamma is 0, which is invalid, not "no decay".
  ExpectInvalid("step { step_size: 10 }", "learning_rate.step.gamma");
}

TEST(LearningRateValidationTest, Cosine) {
  ExpectInvalid("cosine { decay_steps: 0 }", "learning_rate.cosine.decay_steps must be > 0");
  ExpectInvalid("cosine { decay_steps: 5 min_learning_rate: -1 }",
                "learning_rate.cosine.min_learning_rate");
  ExpectInvalid("cosine { decay_steps: 5 min_learning_rate: nan }",
                "learning_rate.cosine.min_learning_rate");
}

TEST(LearningRateValidationTest, WarmupStartFactor) {
  ExpectInvalid("warmup_steps: 3 warmup_start_factor: -0.1",
                "learning_rate.warmup_start_factor must be in [0, 1]");
  ExpectInvalid("warmup_steps: 3 warmup_start_factor: 1.5", "learning_rate.warmup_start_factor");
  ExpectInvalid("warmup_steps: 3 warmup_start_factor: nan", "learning_rate.warmup_start_factor");
}

TEST(LearningRateValidationTest, BoundaryValuesAreAccepted) {
  for (const char* text : {
           "learning_rate: 0",
           "linear { end_learning_rate: 0 decay_steps: 1 }",
           "step { step_size: 1 gamma: 2 }",
           "cosine { decay_steps: 1 min_learning_rate: 0 }",
           "warmup_steps: 1 warmup_start_factor: 0",
           "warmup_steps: 1 warmup_start_factor: 1",
       }) {
    EXPECT_TRUE(LearningRate::Create(Schedule(text), 0.01).ok()) << text;
  }
}

}  // namespace
}  // namespace pserver
