#include "cc/core/row_optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "cc/core/status_macros.h"

namespace pserver {
namespace {

absl::Status Positive(double value, absl::string_view what, absl::string_view field) {
  if (std::isfinite(value) && value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": ", field, " must be finite and > 0, got ", value));
}

absl::Status NonNegative(double value, absl::string_view what, absl::string_view field) {
  if (std::isfinite(value) && value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": ", field, " must be finite and >= 0, got ", value));
}

absl::Status Beta(double value, absl::string_view what, absl::string_view field) {
  if (std::isfinite(value) && value >= 0 && value < 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": ", field, " must be in [0, 1), got ", value));
}

}  // namespace

absl::StatusOr<RowOptimizer> RowOptimizer::Create(const v1::RowOptimizer& config,
                                                  absl::string_view what) {
  RowOptimizer opt;
  switch (config.kind_case()) {
    case v1::RowOptimizer::kAdagrad: {
      const auto& c = config.adagrad();
      opt.kind_ = Kind::kAdagrad;
      opt.state_factor_ = 1;
      opt.lr_ = c.has_learning_rate() ? c.learning_rate() : 0.01;
      opt.epsilon_ = c.has_epsilon() ? c.epsilon() : 1e-10;
      opt.initial_accumulator_ = c.initial_accumulator();
      PS_RETURN_IF_ERROR(Positive(opt.lr_, what, "adagrad.learning_rate"));
      PS_RETURN_IF_ERROR(Positive(opt.epsilon_, what, "adagrad.epsilon"));
      PS_RETURN_IF_ERROR(
          NonNegative(opt.initial_accumulator_, what, "adagrad.initial_accumulator"));
      break;
    }
    case v1::RowOptimizer::kAdam: {
      const auto& c = config.adam();
      opt.kind_ = Kind::kAdam;
      opt.state_factor_ = 2;
      opt.lr_ = c.has_learning_rate() ? c.learning_rate() : 0.001;
      opt.beta1_ = c.has_beta1() ? c.beta1() : 0.9;
      opt.beta2_ = c.has_beta2() ? c.beta2() : 0.999;
      opt.epsilon_ = c.has_epsilon() ? c.epsilon() : 1e-8;
      PS_RETURN_IF_ERROR(Positive(opt.lr_, what, "adam.learning_rate"));
      PS_RETURN_IF_ERROR(Beta(opt.beta1_, what, "adam.beta1"));
      PS_RETURN_IF_ERROR(Beta(opt.beta2_, what, "adam.beta2"));
      PS_RETURN_IF_ERROR(Positive(opt.epsilon_, what, "adam.epsilon"));
      break;
    }
    case v1::RowOptimizer::kFtrl: {
      const auto& c = config.ftrl();
      opt.kind_ = Kind::kFtrl;
      opt.state_factor_ = 2;
      opt.alpha_ = c.has_alpha() ? c.alpha() : 0.05;
      opt.beta_ = c.has_beta() ? c.beta() : 1.0;
      opt.l1_ = c.l1();
      opt.l2_ = c.l2();
      PS_RETURN_IF_ERROR(Positive(opt.alpha_, what, "ftrl.alpha"));
      PS_RETURN_IF_ERROR(NonNegative(opt.beta_, what, "ftrl.beta"));
      PS_RETURN_IF_ERROR(NonNegative(opt.l1_, what, "ftrl.l1"));
      PS_RETURN_IF_ERROR(NonNegative(opt.l2_, what, "ftrl.l2"));
      break;
    }
    case v1::RowOptimizer::kAdd:
      opt.kind_ = Kind::kAdd;
      opt.state_factor_ = 0;
      break;
    default: {  // sgd, also when unset
      opt.kind_ = Kind::kSgd;
      opt.state_factor_ = 0;
      const auto& c = config.sgd();
      opt.lr_ = c.has_learning_rate() ? c.learning_rate() : 0.01;
      PS_RETURN_IF_ERROR(Positive(opt.lr_, what, "sgd.learning_rate"));
      break;
    }
  }
  return opt;
}

const char* RowOptimizer::name() const {
  switch (kind_) {
    case Kind::kSgd:
      return "sgd";
    case Kind::kAdagrad:
      return "adagrad";
    case Kind::kAdam:
      return "adam";
    case Kind::kFtrl:
      return "ftrl";
    case Kind::kAdd:
      return "add";
  }
  return "sgd";
}

template <typename T>
void RowOptimizer::InitState(T* state, uint32_t dim) const {
  const size_t n = static_cast<size_t>(state_factor_) * dim;
  const T initial = kind_ == Kind::kAdagrad ? static_cast<T>(initial_accumulator_) : T(0);
  for (size_t i = 0; i < n; ++i) state[i] = initial;
}

template <typename T, typename G>
void RowOptimizer::Apply(T* __restrict w, T* __restrict state, const G* __restrict g,
                         uint32_t dim, uint64_t step) const {
  switch (kind_) {
    case Kind::kSgd: {
      const double lr = lr_;
      for (uint32_t i = 0; i < dim; ++i) {
        const double gi = static_cast<double>(g[i]);
        w[i] = static_cast<T>(static_cast<double>(w[i]) - lr * gi);
      }
      return;
    }
    case Kind::kAdd:
      for (uint32_t i = 0; i < dim; ++i) {
        const double gi = static_cast<double>(g[i]);
        w[i] = static_cast<T>(static_cast<double>(w[i]) + gi);
      }
      return;
    case Kind::kAdagrad: {
      const double lr = lr_, eps = epsilon_;
      T* __restrict acc = state;
      for (uint32_t i = 0; i < dim; ++i) {
        const double gi = static_cast<double>(g[i]);
        const double a = static_cast<double>(acc[i]) + gi * gi;
        acc[i] = static_cast<T>(a);
        w[i] = static_cast<T>(static_cast<double>(w[i]) - lr * gi / (std::sqrt(a) + eps));
      }
      return;
    }
    case Kind::kAdam: {
      const double t = static_cast<double>(step);
      const double b1 = beta1_, b2 = beta2_, eps = epsilon_;
      const double step_size = lr_ / (1 - std::pow(b1, t));
      const double bias2_sqrt = std::sqrt(1 - std::pow(b2, t));
      T* __restrict m = state;
      T* __restrict v = state + dim;
      for (uint32_t i = 0; i < dim; ++i) {
        const double gi = static_cast<double>(g[i]);
        const double mi = b1 * static_cast<double>(m[i]) + (1 - b1) * gi;
        const double vi = b2 * static_cast<double>(v[i]) + (1 - b2) * gi * gi;
        m[i] = static_cast<T>(mi);
        v[i] = static_cast<T>(vi);
        w[i] = static_cast<T>(static_cast<double>(w[i]) -
                              step_size * mi / (std::sqrt(vi) / bias2_sqrt + eps));
      }
      return;
    }
    case Kind::kFtrl: {
      const double alpha = alpha_, beta = beta_, l1 = l1_, l2 = l2_;
      T* __restrict z = state;
      T* __restrict n = state + dim;
      for (uint32_t i = 0; i < dim; ++i) {
        const double gi = static_cast<double>(g[i]);
        const double n_old = static_cast<double>(n[i]);
        const double n_new = n_old + gi * gi;
        const double sigma = (std::sqrt(n_new) - std::sqrt(n_old)) / alpha;
        const double zi = static_cast<double>(z[i]) + gi - sigma * static_cast<double>(w[i]);
        z[i] = static_cast<T>(zi);
        n[i] = static_cast<T>(n_new);
        if (std::abs(zi) <= l1) {
          w[i] = T(0);
        } else {
          const double sign = zi < 0 ? -1.0 : 1.0;
          w[i] = static_cast<T>(-(zi - sign * l1) / ((beta + std::sqrt(n_new)) / alpha + l2));
        }
      }
      return;
    }
  }
}

template void RowOptimizer::InitState<float>(float*, uint32_t) const;
template void RowOptimizer::InitState<double>(double*, uint32_t) const;
template void RowOptimizer::Apply<float, double>(float*, float*, const double*, uint32_t,
                                                 uint64_t) const;
template void RowOptimizer::Apply<double, double>(double*, double*, const double*, uint32_t,
                                                  uint64_t) const;
template void RowOptimizer::Apply<float, float>(float*, float*, const float*, uint32_t,
                                                uint64_t) const;

}  // namespace pserver
