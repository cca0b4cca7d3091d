#include "cc/core/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/core/status_macros.h"

namespace pserver {
namespace {

// ---- hyper-parameter validation -------------------------------------------

absl::Status InRange(double value, double lo, double hi, bool hi_open,
                     const std::string& field) {
  bool ok = std::isfinite(value) && value >= lo && (hi_open ? value < hi : value <= hi);
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "optimizer.", field, " must be in [", lo, ", ", hi, hi_open ? ")" : "]",
      ", got ", value));
}

absl::Status NonNegative(double value, const std::string& field) {
  if (std::isfinite(value) && value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer.", field, " must be finite and >= 0, got ", value));
}

absl::Status PositiveEpsilon(double value, const std::string& field) {
  if (std::isfinite(value) && value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer.", field, " must be > 0, got ", value));
}

// ---- update rules -----------------------------------------------------------
// Each rule is the textbook (PyTorch-equivalent) algorithm in T precision.

template <typename T>
class TypedRule : public UpdateRule {
 public:
  explicit TypedRule(size_t n) : n_(n) {}
  void Update(void* params, const void* grad, double lr, uint64_t step) final {
    Step(static_cast<T*>(params), static_cast<const T*>(grad), static_cast<T>(lr), step);
  }
  size_t state_bytes() const final { return slots_ * n_ * sizeof(T); }
  std::vector<StateSlot> state_slots() final {
    std::vector<StateSlot> slots;
    for (auto& [name, values] : NamedSlots()) {
      slots.push_back(StateSlot{name, values->data(), values->size() * sizeof(T)});
    }
    return slots;
  }

 protected:
  virtual void Step(T* p, const T* g, T lr, uint64_t step) = 0;
  // The vectors made by Slot(), named, in a fixed order (the checkpoint's).
  using Named = std::vector<std::pair<const char*, std::vector<T>*>>;
  virtual Named NamedSlots() { return {}; }
  std::vector<T> Slot(T initial = T(0)) {
    ++slots_;
    return std::vector<T>(n_, initial);
  }
  const size_t n_;

 private:
  size_t slots_ = 0;
};

template <typename T>
class AddRule final : public TypedRule<T> {
 public:
  using TypedRule<T>::TypedRule;
  void Step(T* p, const T* g, T, uint64_t) override {
    for (size_t i = 0; i < this->n_; ++i) p[i] = Wrap(p[i], g[i]);
  }

 private:
  // Integer addition wraps around (two's complement) instead of overflowing.
  static T Wrap(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  }
};

template <typename T>
class SgdRule final : public TypedRule<T> {
 public:
  SgdRule(size_t n, const v1::SgdConfig& c)
      : TypedRule<T>(n),
        momentum_(static_cast<T>(c.momentum())),
        decay_(static_cast<T>(c.weight_decay())),
        nesterov_(c.nesterov()),
        buf_(c.momentum() > 0 ? this->Slot() : std::vector<T>()) {}

  void Step(T* p, const T* g, T lr, uint64_t step) override {
    const T m = momentum_;
    for (size_t i = 0; i < this->n_; ++i) {
      T d = g[i] + decay_ * p[i];
      if (m > 0) {
        T b = step == 0 ? d : m * buf_[i] + d;
        buf_[i] = b;
        d = nesterov_ ? d + m * b : b;
      }
      p[i] -= lr * d;
    }
  }
  typename TypedRule<T>::Named NamedSlots() override {
    if (momentum_ > 0) return {{"momentum", &buf_}};
    return {};
  }

 private:
  const T momentum_, decay_;
  const bool nesterov_;
  std::vector<T> buf_;
};

template <typename T>
class AdagradRule final : public TypedRule<T> {
 public:
  AdagradRule(size_t n, const v1::AdagradConfig& c)
      : TypedRule<T>(n),
        eps_(static_cast<T>(c.has_epsilon() ? c.epsilon() : 1e-10)),
        decay_(static_cast<T>(c.weight_decay())),
        acc_(this->Slot(static_cast<T>(c.initial_accumulator()))) {}

  void Step(T* p, const T* g, T lr, uint64_t) override {
    for (size_t i = 0; i < this->n_; ++i) {
      T d = g[i] + decay_ * p[i];
      acc_[i] += d * d;
      p[i] -= lr * d / (std::sqrt(acc_[i]) + eps_);
    }
  }
  typename TypedRule<T>::Named NamedSlots() override { return {{"accumulator", &acc_}}; }

 private:
  const T eps_, decay_;
  std::vector<T> acc_;
};

template <typename T>
class AdadeltaRule final : public TypedRule<T> {
 public:
  AdadeltaRule(size_t n, const v1::AdadeltaConfig& c)
      : TypedRule<T>(n),
        rho_(static_cast<T>(c.has_rho() ? c.rho() : 0.9)),
        eps_(static_cast<T>(c.has_epsilon() ? c.epsilon() : 1e-6)),
        decay_(static_cast<T>(c.weight_decay())),
        square_avg_(this->Slot()),
        acc_delta_(this->Slot()) {}

  void Step(T* p, const T* g, T lr, uint64_t) override {
    const T one = 1;
    for (size_t i = 0; i < this->n_; ++i) {
      T d = g[i] + decay_ * p[i];
      square_avg_[i] = rho_ * square_avg_[i] + (one - rho_) * d * d;
      T delta = std::sqrt(acc_delta_[i] + eps_) / std::sqrt(square_avg_[i] + eps_) * d;
      acc_delta_[i] = rho_ * acc_delta_[i] + (one - rho_) * delta * delta;
      p[i] -= lr * delta;
    }
  }
  typename TypedRule<T>::Named NamedSlots() override {
    return {{"square_avg", &square_avg_}, {"acc_delta", &acc_delta_}};
  }

 private:
  const T rho_, eps_, decay_;
  std::vector<T> square_avg_, acc_delta_;
};

template <typename T>
class RmsPropRule final : public TypedRule<T> {
 public:
  RmsPropRule(size_t n, const v1::RmsPropConfig& c)
      : TypedRule<T>(n),
        alpha_(static_cast<T>(c.has_alpha() ? c.alpha() : 0.99)),
        eps_(static_cast<T>(c.has_epsilon() ? c.epsilon() : 1e-8)),
        momentum_(static_cast<T>(c.momentum())),
        decay_(static_cast<T>(c.weight_decay())),
        square_avg_(this->Slot()),
        grad_avg_(c.centered() ? this->Slot() : std::vector<T>()),
        buf_(c.momentum() > 0 ? this->Slot() : std::vector<T>()),
        centered_(c.centered()),
        has_momentum_(c.momentum() > 0) {}

  void Step(T* p, const T* g, T lr, uint64_t) override {
    const T one = 1;
    const bool centered = !grad_avg_.empty();
    for (size_t i = 0; i < this->n_; ++i) {
      T d = g[i] + decay_ * p[i];
      square_avg_[i] = alpha_ * square_avg_[i] + (one - alpha_) * d * d;
      T var = square_avg_[i];
      if (centered) {
        grad_avg_[i] = alpha_ * grad_avg_[i] + (one - alpha_) * d;
        var -= grad_avg_[i] * grad_avg_[i];
      }
      T avg = std::sqrt(var) + eps_;
      if (momentum_ > 0) {
        buf_[i] = momentum_ * buf_[i] + d / avg;
        p[i] -= lr * buf_[i];
      } else {
        p[i] -= lr * d / avg;
      }
    }
  }
  typename TypedRule<T>::Named NamedSlots() override {
    typename TypedRule<T>::Named slots = {{"square_avg", &square_avg_}};
    if (centered_) slots.push_back({"grad_avg", &grad_avg_});
    if (has_momentum_) slots.push_back({"momentum", &buf_});
    return slots;
  }

 private:
  const T alpha_, eps_, momentum_, decay_;
  std::vector<T> square_avg_, grad_avg_, buf_;
  const bool centered_, has_momentum_;
};

// Adam and AdamW share the moment updates; AdamW decays the weights first.
template <typename T>
class AdamRule final : public TypedRule<T> {
 public:
  AdamRule(size_t n, double beta1, double beta2, double eps, double l2,
           double decoupled)
      : TypedRule<T>(n),
        beta1_(static_cast<T>(beta1)),
        beta2_(static_cast<T>(beta2)),
        eps_(static_cast<T>(eps)),
        l2_(static_cast<T>(l2)),
        decoupled_(decoupled),
        m_(this->Slot()),
        v_(this->Slot()) {}

  void Step(T* p, const T* g, T lr, uint64_t step) override {
    const T one = 1;
    const double t = static_cast<double>(step + 1);
    const T bias1 = static_cast<T>(1 - std::pow(static_cast<double>(beta1_), t));
    const T bias2_sqrt = static_cast<T>(std::sqrt(1 - std::pow(static_cast<double>(beta2_), t)));
    const T step_size = lr / bias1;
    // Without decoupled decay the factor is exactly 1, which changes nothing:
    // one branch-free loop that GCC vectorizes.
    const T shrink = static_cast<T>(1 - static_cast<double>(lr) * decoupled_);
    T* __restrict pp = p;
    const T* __restrict gg = g;
    T* __restrict m = m_.data();
    T* __restrict v = v_.data();
    const T beta1 = beta1_, beta2 = beta2_, eps = eps_, l2 = l2_;
    for (size_t i = 0; i < this->n_; ++i) {
      const T w = pp[i] * shrink;
      const T d = gg[i] + l2 * w;
      m[i] = beta1 * m[i] + (one - beta1) * d;
      v[i] = beta2 * v[i] + (one - beta2) * d * d;
      pp[i] = w - step_size * m[i] / (std::sqrt(v[i]) / bias2_sqrt + eps);
    }
  }
  typename TypedRule<T>::Named NamedSlots() override { return {{"m", &m_}, {"v", &v_}}; }

 private:
  const T beta1_, beta2_, eps_, l2_;
  const double decoupled_;
  std::vector<T> m_, v_;
};

// ---- construction -----------------------------------------------------------

absl::Status ValidateConfig(const v1::OptimizerConfig& c) {
  switch (c.kind_case()) {
    case v1::OptimizerConfig::kSgd:
      PS_RETURN_IF_ERROR(NonNegative(c.sgd().momentum(), "sgd.momentum"));
      PS_RETURN_IF_ERROR(NonNegative(c.sgd().weight_decay(), "sgd.weight_decay"));
      if (c.sgd().nesterov() && c.sgd().momentum() <= 0) {
        return absl::InvalidArgumentError(
            "optimizer.sgd.nesterov needs optimizer.sgd.momentum > 0");
      }
      return absl::OkStatus();
    case v1::OptimizerConfig::kAdagrad:
      PS_RETURN_IF_ERROR(NonNegative(c.adagrad().initial_accumulator(),
                                     "adagrad.initial_accumulator"));
      if (c.adagrad().has_epsilon()) {
        PS_RETURN_IF_ERROR(PositiveEpsilon(c.adagrad().epsilon(), "adagrad.epsilon"));
      }
      return NonNegative(c.adagrad().weight_decay(), "adagrad.weight_decay");
    case v1::OptimizerConfig::kAdadelta:
      if (c.adadelta().has_rho()) {
        PS_RETURN_IF_ERROR(InRange(c.adadelta().rho(), 0, 1, false, "adadelta.rho"));
      }
      if (c.adadelta().has_epsilon()) {
        PS_RETURN_IF_ERROR(PositiveEpsilon(c.adadelta().epsilon(), "adadelta.epsilon"));
      }
      return NonNegative(c.adadelta().weight_decay(), "adadelta.weight_decay");
    case v1::OptimizerConfig::kRmsprop:
      if (c.rmsprop().has_alpha()) {
        PS_RETURN_IF_ERROR(InRange(c.rmsprop().alpha(), 0, 1, false, "rmsprop.alpha"));
      }
      if (c.rmsprop().has_epsilon()) {
        PS_RETURN_IF_ERROR(PositiveEpsilon(c.rmsprop().epsilon(), "rmsprop.epsilon"));
      }
      PS_RETURN_IF_ERROR(NonNegative(c.rmsprop().momentum(), "rmsprop.momentum"));
      return NonNegative(c.rmsprop().weight_decay(), "rmsprop.weight_decay");
    case v1::OptimizerConfig::kAdam:
      if (c.adam().has_beta1()) {
        PS_RETURN_IF_ERROR(InRange(c.adam().beta1(), 0, 1, true, "adam.beta1"));
      }
      if (c.adam().has_beta2()) {
        PS_RETURN_IF_ERROR(InRange(c.adam().beta2(), 0, 1, true, "adam.beta2"));
      }
      if (c.adam().has_epsilon()) {
        PS_RETURN_IF_ERROR(PositiveEpsilon(c.adam().epsilon(), "adam.epsilon"));
      }
      return NonNegative(c.adam().weight_decay(), "adam.weight_decay");
    case v1::OptimizerConfig::kAdamw:
      if (c.adamw().has_beta1()) {
        PS_RETURN_IF_ERROR(InRange(c.adamw().beta1(), 0, 1, true, "adamw.beta1"));
      }
      if (c.adamw().has_beta2()) {
        PS_RETURN_IF_ERROR(InRange(c.adamw().beta2(), 0, 1, true, "adamw.beta2"));
      }
      if (c.adamw().has_epsilon()) {
        PS_RETURN_IF_ERROR(PositiveEpsilon(c.adamw().epsilon(), "adamw.epsilon"));
      }
      if (c.adamw().has_weight_decay()) {
        PS_RETURN_IF_ERROR(NonNegative(c.adamw().weight_decay(), "adamw.weight_decay"));
      }
      return absl::OkStatus();
    default:
      return absl::OkStatus();
  }
}

template <typename T>
std::unique_ptr<UpdateRule> MakeFloatRule(const v1::OptimizerConfig& c, size_t n) {
  switch (c.kind_case()) {
    case v1::OptimizerConfig::kAdd:
      return std::make_unique<AddRule<T>>(n);
    case v1::OptimizerConfig::kAdagrad:
      return std::make_unique<AdagradRule<T>>(n, c.adagrad());
    case v1::OptimizerConfig::kAdadelta:
      return std::make_unique<AdadeltaRule<T>>(n, c.adadelta());
    case v1::OptimizerConfig::kRmsprop:
      return std::make_unique<RmsPropRule<T>>(n, c.rmsprop());
    case v1::OptimizerConfig::kAdam: {
      const auto& a = c.adam();
      return std::make_unique<AdamRule<T>>(
          n, a.has_beta1() ? a.beta1() : 0.9, a.has_beta2() ? a.beta2() : 0.999,
          a.has_epsilon() ? a.epsilon() : 1e-8, a.weight_decay(), 0.0);
    }
    case v1::OptimizerConfig::kAdamw: {
      const auto& a = c.adamw();
      return std::make_unique<AdamRule<T>>(
          n, a.has_beta1() ? a.beta1() : 0.9, a.has_beta2() ? a.beta2() : 0.999,
          a.has_epsilon() ? a.epsilon() : 1e-8, 0.0,
          a.has_weight_decay() ? a.weight_decay() : 0.01);
    }
    case v1::OptimizerConfig::kSgd:
    default:
      return std::make_unique<SgdRule<T>>(n, c.sgd());
  }
}

template <typename T>
double L2Norm(const T* g, size_t n) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += static_cast<double>(g[i]) * g[i];
  return std::sqrt(sum);
}

template <typename T>
void Clip(T* g, size_t n, const v1::Clipping& clip, std::optional<double> global_norm) {
  if (clip.clip_norm() > 0) {
    double norm = global_norm.has_value() ? *global_norm : L2Norm(g, n);
    if (norm > clip.clip_norm()) {
      const T scale = static_cast<T>(clip.clip_norm() / norm);
      for (size_t i = 0; i < n; ++i) g[i] *= scale;
    }
  }
  if (clip.clip_value() > 0) {
    const T hi = static_cast<T>(clip.clip_value());
    for (size_t i = 0; i < n; ++i) g[i] = std::clamp(g[i], -hi, hi);
  }
}

}  // namespace

std::string OptimizerName(const v1::OptimizerConfig& config) {
  switch (config.kind_case()) {
    case v1::OptimizerConfig::kAdagrad: return "adagrad";
    case v1::OptimizerConfig::kAdadelta: return "adadelta";
    case v1::OptimizerConfig::kRmsprop: return "rmsprop";
    case v1::OptimizerConfig::kAdam: return "adam";
    case v1::OptimizerConfig::kAdamw: return "adamw";
    case v1::OptimizerConfig::kAdd: return "add";
    default: return "sgd";
  }
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(
    const v1::ParameterConfig& config, ElementType type, size_t num_elements) {
  PS_RETURN_IF_ERROR(ValidateStorableType(type, "optimizer"));
  const v1::OptimizerConfig& oc = config.optimizer();
  PS_RETURN_IF_ERROR(ValidateConfig(oc));
  PS_RETURN_IF_ERROR(NonNegative(config.clipping().clip_norm(), "clipping.clip_norm"));
  PS_RETURN_IF_ERROR(NonNegative(config.clipping().clip_value(), "clipping.clip_value"));
  const bool is_add = oc.kind_case() == v1::OptimizerConfig::kAdd;
  const bool is_set = oc.kind_case() != v1::OptimizerConfig::KIND_NOT_SET;
  if (IsInteger(type) && is_set && !is_add) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer ", OptimizerName(oc), " cannot update ", ElementTypeName(type),
        " values; integer parameters take optimizer 'add' or none"));
  }
  const double default_rate = oc.kind_case() == v1::OptimizerConfig::kAdadelta ? 1.0 : 0.01;
  PS_ASSIGN_OR_RETURN(LearningRate lr, LearningRate::Create(config.learning_rate(), default_rate));

  std::unique_ptr<Optimizer> opt(new Optimizer());
  opt->name_ = IsInteger(type) && !is_set ? "none" : OptimizerName(oc);
  opt->type_ = type;
  opt->num_elements_ = num_elements;
  opt->learning_rate_ = std::move(lr);
  opt->clipping_ = config.clipping();
  if (is_add) {
    DispatchStorable(type, [&](auto tag) {
      opt->rule_ = std::make_unique<AddRule<typename decltype(tag)::type>>(num_elements);
    });
  } else {
    DispatchFloating(type, [&](auto tag) {
      opt->rule_ = MakeFloatRule<typename decltype(tag)::type>(oc, num_elements);
    });
  }
  return opt;
}

absl::Status Optimizer::CheckCanApply(const std::string& what) const {
  if (rule_ != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, " has element type ", ElementTypeName(type_),
      " and no optimizer: gradients on integer parameters need optimizer 'add'"));
}

OptimizerState Optimizer::ExportState() const {
  OptimizerState state;
  state.steps = steps_;
  if (rule_ == nullptr) return state;
  for (const StateSlot& slot : rule_->state_slots()) {
    state.slots.emplace_back(slot.name,
                             std::string(static_cast<const char*>(slot.data), slot.bytes));
  }
  return state;
}

absl::Status Optimizer::ImportState(const OptimizerState& state) {
  std::vector<StateSlot> slots;
  if (rule_ != nullptr) slots = rule_->state_slots();
  auto names = [](auto begin, auto end) {
    std::string out;
    for (auto it = begin; it != end; ++it) {
      absl::StrAppend(&out, out.empty() ? "" : ", ", it->first);
    }
    return absl::StrCat("[", out, "]");
  };
  std::vector<std::pair<std::string, size_t>> want;
  for (const StateSlot& slot : slots) want.emplace_back(slot.name, slot.bytes);
  bool names_match = want.size() == state.slots.size();
  for (size_t i = 0; names_match && i < want.size(); ++i) {
    names_match = want[i].first == state.slots[i].first;
  }
  if (!names_match) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer ", name_, " has state slots ", names(want.begin(), want.end()),
        ", the state to import has ", names(state.slots.begin(), state.slots.end())));
  }
  for (size_t i = 0; i < want.size(); ++i) {
    if (state.slots[i].second.size() != want[i].second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer ", name_, " state slot '", want[i].first, "' holds ", want[i].second,
          " bytes, the state to import has ", state.slots[i].second.size()));
    }
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].bytes > 0) {
      std::memcpy(slots[i].data, state.slots[i].second.data(), slots[i].bytes);
    }
  }
  steps_ = state.steps;
  return absl::OkStatus();
}

void Optimizer::Apply(void* params, const void* grad, std::optional<double> global_norm) {
  if (rule_ == nullptr) return;
  const bool clips = clipping_.clip_norm() > 0 || clipping_.clip_value() > 0;
  if (clips && IsFloatingPoint(type_)) {
    clipped_.assign(static_cast<const char*>(grad), num_elements_ * ElementSize(type_));
    DispatchFloating(type_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      Clip(reinterpret_cast<T*>(clipped_.data()), num_elements_, clipping_, global_norm);
    });
    grad = clipped_.data();
  }
  rule_->Update(params, grad, learning_rate_.At(steps_), steps_);
  ++steps_;
}

}  // namespace pserver
