#include "cc/core/learning_rate.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace pserver {
namespace {

constexpr double kPi = 3.14159265358979323846;

absl::Status NonNegative(double value, const char* field) {
  if (std::isfinite(value) && value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "learning_rate.", field, " must be finite and >= 0, got ", value));
}

absl::Status Positive(uint64_t value, const char* field) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("learning_rate.", field, " must be > 0"));
}

absl::Status Validate(const v1::LearningRateSchedule& s, double base) {
  absl::Status status = NonNegative(base, "learning_rate");
  if (!status.ok()) return status;
  switch (s.decay_case()) {
    case v1::LearningRateSchedule::kLinear:
      status = NonNegative(s.linear().end_learning_rate(), "linear.end_learning_rate");
      if (status.ok()) status = Positive(s.linear().decay_steps(), "linear.decay_steps");
      break;
    case v1::LearningRateSchedule::kStep:
      status = Positive(s.step().step_size(), "step.step_size");
      if (status.ok() && !(s.step().gamma() > 0 && std::isfinite(s.step().gamma()))) {
        status = absl::InvalidArgumentError(absl::StrCat(
            "learning_rate.step.gamma must be > 0, got ", s.step().gamma()));
      }
      break;
    case v1::LearningRateSchedule::kCosine:
      status = Positive(s.cosine().decay_steps(), "cosine.decay_steps");
      if (status.ok()) {
        status = NonNegative(s.cosine().min_learning_rate(), "cosine.min_learning_rate");
      }
      break;
    default:
      break;
  }
  if (!status.ok()) return status;
  double f = s.warmup_start_factor();
  if (!(f >= 0 && f <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "learning_rate.warmup_start_factor must be in [0, 1], got ", f));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LearningRate> LearningRate::Create(
    const v1::LearningRateSchedule& schedule, double default_rate) {
  double base = schedule.has_learning_rate() ? schedule.learning_rate() : default_rate;
  absl::Status status = Validate(schedule, base);
  if (!status.ok()) return status;
  LearningRate lr;
  lr.schedule_ = schedule;
  lr.base_ = base;
  return lr;
}

double LearningRate::Decayed(uint64_t t) const {
  switch (schedule_.decay_case()) {
    case v1::LearningRateSchedule::kLinear: {
      const auto& c = schedule_.linear();
      double frac = static_cast<double>(std::min<uint64_t>(t, c.decay_steps())) /
                    static_cast<double>(c.decay_steps());
      return base_ + (c.end_learning_rate() - base_) * frac;
    }
    case v1::LearningRateSchedule::kStep: {
      const auto& c = schedule_.step();
      return base_ * std::pow(c.gamma(), static_cast<double>(t / c.step_size()));
    }
    case v1::LearningRateSchedule::kCosine: {
      const auto& c = schedule_.cosine();
      double frac = static_cast<double>(std::min<uint64_t>(t, c.decay_steps())) /
                    static_cast<double>(c.decay_steps());
      return c.min_learning_rate() +
             (base_ - c.min_learning_rate()) * (1 + std::cos(kPi * frac)) / 2;
    }
    default:
      return base_;
  }
}

double LearningRate::At(uint64_t t) const {
  uint64_t warmup = schedule_.warmup_steps();
  if (t < warmup) {
    double f = schedule_.warmup_start_factor();
    return Decayed(0) *
           (f + (1 - f) * static_cast<double>(t) / static_cast<double>(warmup));
  }
  return Decayed(t - warmup);
}

}  // namespace pserver
