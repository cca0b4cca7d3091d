// LearningRate: the rate for the t-th update of a parameter, from a
// v1::LearningRateSchedule (constant, linear, step or cosine decay, with an
// optional linear warm-up). See proto/pserver/v1/config.proto for the formulas.
//
//   PS_ASSIGN_OR_RETURN(LearningRate lr, LearningRate::Create(schedule, 0.01));
//   double rate = lr.At(step);
//
// Immutable after creation, so safe to share between threads.
#ifndef PSERVER_CC_CORE_LEARNING_RATE_H_
#define PSERVER_CC_CORE_LEARNING_RATE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "pserver/v1/config.pb.h"

namespace pserver {

class LearningRate {
 public:
  // INVALID_ARGUMENT naming the field for a negative or non-finite rate, zero
  // decay steps, a non-positive gamma, or a warm-up factor outside [0, 1].
  // `default_rate` is used when the schedule leaves learning_rate unset.
  static absl::StatusOr<LearningRate> Create(
      const v1::LearningRateSchedule& schedule, double default_rate);

  double At(uint64_t step) const;
  double base() const { return base_; }

 private:
  double Decayed(uint64_t step) const;

  v1::LearningRateSchedule schedule_;
  double base_ = 0;
};

}  // namespace pserver

#endif  // PSERVER_CC_CORE_LEARNING_RATE_H_
