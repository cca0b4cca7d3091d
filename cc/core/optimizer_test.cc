#include "cc/core/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cc/core/element_type.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "pserver/v1/config.pb.h"

namespace pserver {
namespace {

using ::pserver::testing::IsOk;
using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using Vec = std::vector<double>;
using Trajectory = std::vector<Vec>;  // the parameters after each step

constexpr double kPi = 3.14159265358979323846;

v1::ParameterConfig Config(const std::string& text) {
  v1::ParameterConfig config;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &config)) << text;
  return config;
}

// Tolerances against the double-precision reference: relative, with an
// absolute floor of the same size for values near zero.
template <typename T>
constexpr double kRelTol = std::is_same_v<T, float> ? 1e-5 : 1e-12;

void ExpectNearRel(double got, double want, double rel, const std::string& where) {
  EXPECT_NEAR(got, want, rel * std::max(1.0, std::abs(want))) << where;
}

// Creates the optimizer for T, applies `grads` in order (each gradient a
// fresh copy, so clipping in place cannot leak between steps) and records the
// parameters after every step.
template <typename T>
absl::StatusOr<Trajectory> RunOptimizer(const v1::ParameterConfig& config, const Vec& p0,
                                        const std::vector<Vec>& grads,
                                        std::optional<double> global_norm = std::nullopt) {
  absl::StatusOr<std::unique_ptr<Optimizer>> opt =
      Optimizer::Create(config, kElementTypeOf<T>, p0.size());
  if (!opt.ok()) return opt.status();
  absl::Status can_apply = (*opt)->CheckCanApply("test parameter");
  if (!can_apply.ok()) return can_apply;
  std::vector<T> p(p0.begin(), p0.end());
  Trajectory out;
  for (const Vec& g : grads) {
    std::vector<T> grad(g.begin(), g.end());
    (*opt)->Apply(p.data(), grad.data(), global_norm);
    out.emplace_back(p.begin(), p.end());
  }
  if ((*opt)->steps() != grads.size()) {
    return absl::InternalError("steps() does not count the applied gradients");
  }
  return out;
}

// Applies one gradient to `p` with a fresh optimizer; returns the new values.
template <typename T>
absl::StatusOr<std::vector<T>> StepOnce(const std::string& config, std::vector<T> p,
                                        std::vector<T> g,
                                        std::optional<double> global_norm = std::nullopt) {
  absl::StatusOr<std::unique_ptr<Optimizer>> opt =
      Optimizer::Create(Config(config), kElementTypeOf<T>, p.size());
  if (!opt.ok()) return opt.status();
  absl::Status can_apply = (*opt)->CheckCanApply("test parameter");
  if (!can_apply.ok()) return can_apply;
  (*opt)->Apply(p.data(), g.data(), global_norm);
  return p;
}

// ---- textbook references ------------------------------------------------------
// Straight transcriptions of the PyTorch / paper formulas in double precision,
// one scalar loop per step. They share nothing with optimizer.cc.

// Updates p in place for the t-th step (t = 0, 1, ...) with learning rate lr.
using RefStep = std::function<void(Vec& p, const Vec& g, double lr, int t)>;

// torch.optim.SGD with dampening 0.
RefStep RefSgd(double momentum, bool nesterov, double weight_decay) {
  return [=, buf = Vec()](Vec& p, const Vec& g, double lr, int t) mutable {
    const size_t n = p.size();
    Vec d(n);
    for (size_t i = 0; i < n; ++i) d[i] = g[i] + weight_decay * p[i];
    if (momentum != 0) {
      if (t == 0) {
        buf = d;
      } else {
        for (size_t i = 0; i < n; ++i) buf[i] = momentum * buf[i] + d[i];
      }
      for (size_t i = 0; i < n; ++i) d[i] = nesterov ? d[i] + momentum * buf[i] : buf[i];
    }
    for (size_t i = 0; i < n; ++i) p[i] = p[i] - lr * d[i];
  };
}

// torch.optim.Adagrad with lr_decay 0.
RefStep RefAdagrad(double initial_accumulator, double eps, double weight_decay) {
  return [=, sum = Vec()](Vec& p, const Vec& g, double lr, int) mutable {
    if (sum.empty()) sum.assign(p.size(), initial_accumulator);
    for (size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + weight_decay * p[i];
      sum[i] = sum[i] + d * d;
      p[i] = p[i] - lr * d / (std::sqrt(sum[i]) + eps);
    }
  };
}

// torch.optim.Adadelta (Zeiler 2012 with a learning rate).
RefStep RefAdadelta(double rho, double eps, double weight_decay) {
  return [=, square_avg = Vec(), acc_delta = Vec()](Vec& p, const Vec& g, double lr, int) mutable {
    if (square_avg.empty()) {
      square_avg.assign(p.size(), 0.0);
      acc_delta.assign(p.size(), 0.0);
    }
    for (size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + weight_decay * p[i];
      square_avg[i] = rho * square_avg[i] + (1 - rho) * d * d;
      double rms_update = std::sqrt(acc_delta[i] + eps);
      double rms_grad = std::sqrt(square_avg[i] + eps);
      double delta = rms_update / rms_grad * d;
      acc_delta[i] = rho * acc_delta[i] + (1 - rho) * delta * delta;
      p[i] = p[i] - lr * delta;
    }
  };
}

// torch.optim.RMSprop.
RefStep RefRmsProp(double alpha, double eps, double momentum, bool centered, double weight_decay) {
  return [=, square_avg = Vec(), grad_avg = Vec(), buf = Vec()](Vec& p, const Vec& g, double lr,
                                                                int) mutable {
    if (square_avg.empty()) {
      square_avg.assign(p.size(), 0.0);
      grad_avg.assign(p.size(), 0.0);
      buf.assign(p.size(), 0.0);
    }
    for (size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + weight_decay * p[i];
      square_avg[i] = alpha * square_avg[i] + (1 - alpha) * d * d;
      double avg;
      if (centered) {
        grad_avg[i] = alpha * grad_avg[i] + (1 - alpha) * d;
        avg = std::sqrt(square_avg[i] - grad_avg[i] * grad_avg[i]) + eps;
      } else {
        avg = std::sqrt(square_avg[i]) + eps;
      }
      if (momentum > 0) {
        buf[i] = momentum * buf[i] + d / avg;
        p[i] = p[i] - lr * buf[i];
      } else {
        p[i] = p[i] - lr * d / avg;
      }
    }
  };
}

// Adam (Kingma & Ba, bias-corrected m_hat / v_hat form) with L2 weight decay
// added to the gradient, and AdamW's decoupled decay p *= 1 - lr * wd first.
RefStep RefAdam(double beta1, double beta2, double eps, double l2, double decoupled) {
  return [=, m = Vec(), v = Vec()](Vec& p, const Vec& g, double lr, int t) mutable {
    if (m.empty()) {
      m.assign(p.size(), 0.0);
      v.assign(p.size(), 0.0);
    }
    const int step = t + 1;
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] = p[i] * (1 - lr * decoupled);
      double d = g[i] + l2 * p[i];
      m[i] = beta1 * m[i] + (1 - beta1) * d;
      v[i] = beta2 * v[i] + (1 - beta2) * d * d;
      double m_hat = m[i] / (1 - std::pow(beta1, step));
      double v_hat = v[i] / (1 - std::pow(beta2, step));
      p[i] = p[i] - lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  };
}

RefStep RefAdd() {
  return [](Vec& p, const Vec& g, double, int) {
    for (size_t i = 0; i < p.size(); ++i) p[i] = p[i] + g[i];
  };
}

Trajectory RunReference(RefStep step, Vec p, const std::vector<Vec>& grads,
                        const std::function<double(int)>& lr) {
  Trajectory out;
  for (int t = 0; t < static_cast<int>(grads.size()); ++t) {
    step(p, grads[t], lr(t), t);
    out.push_back(p);
  }
  return out;
}

// ---- every optimizer against its reference --------------------------------------

constexpr int kSteps = 7;

const Vec& InitialParams() {
  static const Vec* p = new Vec{0.5, -1.25, 2.0, -0.75, 1.5};  // exact in float
  return *p;
}

// Gradients of varying sign and size, rounded to T so that the reference and
// the optimizer see exactly the same inputs.
template <typename T>
std::vector<Vec> Gradients() {
  std::vector<Vec> grads(kSteps, Vec(InitialParams().size()));
  for (int t = 0; t < kSteps; ++t) {
    for (size_t i = 0; i < grads[t].size(); ++i) {
      double g = std::sin(0.9 * (i + 1) + 1.7 * t) * (1.0 + 0.25 * i);
      grads[t][i] = static_cast<double>(static_cast<T>(g));
    }
  }
  return grads;
}

struct ReferenceCase {
  std::string name;
  std::string config;             // text-format v1::ParameterConfig
  std::function<double(int)> lr;  // the rate the reference uses at step t
  std::function<RefStep()> reference;
};

// Names the case in gtest's failure messages instead of dumping its bytes.
void PrintTo(const ReferenceCase& c, std::ostream* os) { *os << c.name; }

std::function<double(int)> ConstantRate(double lr) {
  return [lr](int) { return lr; };
}

std::vector<ReferenceCase> ReferenceCases() {
  return {
      {"SgdDefault", "", ConstantRate(0.01),  // unset optimizer: SGD, lr 0.01
       [] { return RefSgd(0, false, 0); }},
      {"SgdPlain", "optimizer { sgd {} } learning_rate { learning_rate: 0.1 }", ConstantRate(0.1),
       [] { return RefSgd(0, false, 0); }},
      {"SgdMomentum", "optimizer { sgd { momentum: 0.9 } } learning_rate { learning_rate: 0.05 }",
       ConstantRate(0.05), [] { return RefSgd(0.9, false, 0); }},
      {"SgdNesterov",
       "optimizer { sgd { momentum: 0.8 nesterov: true } } "
       "learning_rate { learning_rate: 0.05 }",
       ConstantRate(0.05), [] { return RefSgd(0.8, true, 0); }},
      {"SgdWeightDecay",
       "optimizer { sgd { weight_decay: 0.1 } } learning_rate { learning_rate: 0.1 }",
       ConstantRate(0.1), [] { return RefSgd(0, false, 0.1); }},
      {"SgdNesterovWeightDecay",
       "optimizer { sgd { momentum: 0.5 nesterov: true weight_decay: 0.2 } } "
       "learning_rate { learning_rate: 0.1 }",
       ConstantRate(0.1), [] { return RefSgd(0.5, true, 0.2); }},
      {"AdagradDefaults", "optimizer { adagrad {} } learning_rate { learning_rate: 0.1 }",
       ConstantRate(0.1), [] { return RefAdagrad(0, 1e-10, 0); }},
      {"AdagradCustom",
       "optimizer { adagrad { initial_accumulator: 0.1 epsilon: 1e-3 weight_decay: 0.05 } } "
       "learning_rate { learning_rate: 0.2 }",
       ConstantRate(0.2), [] { return RefAdagrad(0.1, 1e-3, 0.05); }},
      {"AdadeltaDefaults", "optimizer { adadelta {} }",  // lr defaults to 1.0
       ConstantRate(1.0), [] { return RefAdadelta(0.9, 1e-6, 0); }},
      {"AdadeltaCustom",
       "optimizer { adadelta { rho: 0.95 epsilon: 1e-4 weight_decay: 0.1 } } "
       "learning_rate { learning_rate: 0.5 }",
       ConstantRate(0.5), [] { return RefAdadelta(0.95, 1e-4, 0.1); }},
      {"RmsPropPlain", "optimizer { rmsprop {} } learning_rate { learning_rate: 0.01 }",
       ConstantRate(0.01), [] { return RefRmsProp(0.99, 1e-8, 0, false, 0); }},
      {"RmsPropCentered",
       "optimizer { rmsprop { alpha: 0.9 centered: true } } "
       "learning_rate { learning_rate: 0.01 }",
       ConstantRate(0.01), [] { return RefRmsProp(0.9, 1e-8, 0, true, 0); }},
      {"RmsPropMomentum",
       "optimizer { rmsprop { alpha: 0.95 momentum: 0.9 epsilon: 1e-6 } } "
       "learning_rate { learning_rate: 0.01 }",
       ConstantRate(0.01), [] { return RefRmsProp(0.95, 1e-6, 0.9, false, 0); }},
      {"RmsPropCenteredMomentumWeightDecay",
       "optimizer { rmsprop { alpha: 0.9 momentum: 0.5 centered: true weight_decay: 0.1 } } "
       "learning_rate { learning_rate: 0.02 }",
       ConstantRate(0.02), [] { return RefRmsProp(0.9, 1e-8, 0.5, true, 0.1); }},
      {"AdamDefaults", "optimizer { adam {} }",  // lr defaults to 0.01
       ConstantRate(0.01), [] { return RefAdam(0.9, 0.999, 1e-8, 0, 0); }},
      {"AdamCustom",
       "optimizer { adam { beta1: 0.8 beta2: 0.99 epsilon: 1e-6 } } "
       "learning_rate { learning_rate: 0.05 }",
       ConstantRate(0.05), [] { return RefAdam(0.8, 0.99, 1e-6, 0, 0); }},
      {"AdamL2", "optimizer { adam { weight_decay: 0.1 } } learning_rate { learning_rate: 0.05 }",
       ConstantRate(0.05), [] { return RefAdam(0.9, 0.999, 1e-8, 0.1, 0); }},
      {"AdamWDefaults", "optimizer { adamw {} } learning_rate { learning_rate: 0.05 }",
       ConstantRate(0.05), [] { return RefAdam(0.9, 0.999, 1e-8, 0, 0.01); }},
      {"AdamWCustom",
       "optimizer { adamw { beta1: 0.85 beta2: 0.98 epsilon: 1e-7 weight_decay: 0.3 } } "
       "learning_rate { learning_rate: 0.1 }",
       ConstantRate(0.1), [] { return RefAdam(0.85, 0.98, 1e-7, 0, 0.3); }},
      {"AdamWithWarmupAndCosine",
       "optimizer { adam {} } learning_rate { learning_rate: 0.1 warmup_steps: 2 "
       "warmup_start_factor: 0.5 cosine { decay_steps: 3 min_learning_rate: 0.01 } }",
       [](int t) {
         if (t < 2) return 0.1 * (0.5 + 0.5 * t / 2.0);
         double frac = std::min(t - 2, 3) / 3.0;
         return 0.01 + (0.1 - 0.01) * (1 + std::cos(kPi * frac)) / 2;
       },
       [] { return RefAdam(0.9, 0.999, 1e-8, 0, 0); }},
      {"AddFloat", "optimizer { add {} } learning_rate { learning_rate: 0.5 }", ConstantRate(0.5),
       [] { return RefAdd(); }},
  };
}

class OptimizerReferenceTest : public ::testing::TestWithParam<ReferenceCase> {
 protected:
  template <typename T>
  void CheckAgainstReference() {
    const ReferenceCase& c = GetParam();
    const std::vector<Vec> grads = Gradients<T>();
    ASSERT_OK_AND_ASSIGN(Trajectory got, RunOptimizer<T>(Config(c.config), InitialParams(), grads));
    Trajectory want = RunReference(c.reference(), InitialParams(), grads, c.lr);
    ASSERT_EQ(got.size(), want.size());
    for (size_t t = 0; t < want.size(); ++t) {
      for (size_t i = 0; i < want[t].size(); ++i) {
        ExpectNearRel(got[t][i], want[t][i], kRelTol<T>,
                      "step " + std::to_string(t) + " element " + std::to_string(i));
      }
      // Every step must actually move the parameters.
      const Vec& before = t == 0 ? InitialParams() : want[t - 1];
      EXPECT_NE(want[t], before) << "step " << t;
    }
  }
};

TEST_P(OptimizerReferenceTest, Float32MatchesReference) { CheckAgainstReference<float>(); }
TEST_P(OptimizerReferenceTest, Float64MatchesReference) { CheckAgainstReference<double>(); }

INSTANTIATE_TEST_SUITE_P(AllOptimizers, OptimizerReferenceTest,
                         ::testing::ValuesIn(ReferenceCases()),
                         [](const ::testing::TestParamInfo<ReferenceCase>& info) {
                           return info.param.name;
                         });

// ---- first steps worked out by hand -------------------------------------------

TEST(OptimizerHandTest, SgdFirstSteps) {
  // p = 1, g = 0.5, lr = 0.1: p = 1 - 0.1 * 0.5 = 0.95.
  ASSERT_OK_AND_ASSIGN(auto plain,
                       StepOnce<double>("learning_rate { learning_rate: 0.1 }", {1.0}, {0.5}));
  EXPECT_NEAR(plain[0], 0.95, 1e-15);
  // Weight decay 0.1: g' = 0.5 + 0.1 * 1 = 0.6, p = 1 - 0.06 = 0.94.
  ASSERT_OK_AND_ASSIGN(auto decayed, StepOnce<float>("optimizer { sgd { weight_decay: 0.1 } } "
                                                     "learning_rate { learning_rate: 0.1 }",
                                                     {1.0f}, {0.5f}));
  EXPECT_NEAR(decayed[0], 0.94f, 1e-6);
  // Nesterov m = 0.9: buf = g = 0.5 on the first step, g' = 0.5 + 0.9 * 0.5 =
  // 0.95, p = 1 - 0.095 = 0.905.
  ASSERT_OK_AND_ASSIGN(auto nesterov,
                       StepOnce<double>("optimizer { sgd { momentum: 0.9 nesterov: true } } "
                                        "learning_rate { learning_rate: 0.1 }",
                                        {1.0}, {0.5}));
  EXPECT_NEAR(nesterov[0], 0.905, 1e-15);
}

TEST(OptimizerHandTest, SgdMomentumTwoSteps) {
  // m = 0.9, lr = 0.1, g = 0.5 twice: step 1 buf = g = 0.5, p = 0.95;
  // step 2 buf = 0.9 * 0.5 + 0.5 = 0.95, p = 0.95 - 0.095 = 0.855.
  ASSERT_OK_AND_ASSIGN(Trajectory got,
                       RunOptimizer<double>(Config("optimizer { sgd { momentum: 0.9 } } "
                                                   "learning_rate { learning_rate: 0.1 }"),
                                            {1.0}, {{0.5}, {0.5}}));
  EXPECT_NEAR(got[0][0], 0.95, 1e-15);
  EXPECT_NEAR(got[1][0], 0.855, 1e-15);
}

TEST(OptimizerHandTest, AdagradFirstStep) {
  // acc = 0 + 2^2 = 4, p = 1 - 0.1 * 2 / (2 + 1e-10) ~ 0.9: the first step
  // moves by lr * sign(g).
  ASSERT_OK_AND_ASSIGN(auto p, StepOnce<double>("optimizer { adagrad {} } "
                                                "learning_rate { learning_rate: 0.1 }",
                                                {1.0}, {2.0}));
  EXPECT_NEAR(p[0], 0.9, 1e-10);
  // initial_accumulator 5: acc = 9, p = 1 - 0.1 * 2 / 3 = 0.93333.
  ASSERT_OK_AND_ASSIGN(auto q, StepOnce<float>("optimizer { adagrad { initial_accumulator: 5 } } "
                                               "learning_rate { learning_rate: 0.1 }",
                                               {1.0f}, {2.0f}));
  EXPECT_NEAR(q[0], 1.0 - 0.2 / 3, 1e-6);
}

TEST(OptimizerHandTest, AdadeltaFirstStep) {
  // rho 0.9, eps 1e-6, lr 1 (the Adadelta default), g = 2:
  // sq = 0.1 * 4 = 0.4; delta = sqrt(0 + 1e-6) / sqrt(0.4 + 1e-6) * 2
  //    = 1e-3 / 0.6324563 * 2 = 0.0031622737; p = 1 - delta = 0.9968377263.
  ASSERT_OK_AND_ASSIGN(auto p, StepOnce<double>("optimizer { adadelta {} }", {1.0}, {2.0}));
  EXPECT_NEAR(p[0], 0.9968377263, 1e-10);
}

TEST(OptimizerHandTest, RmsPropFirstSteps) {
  // alpha 0.99, lr 0.01, g = 2: sq = 0.01 * 4 = 0.04, sqrt = 0.2,
  // p = 1 - 0.01 * 2 / 0.2 = 0.9 (ten times the rate on the first step).
  ASSERT_OK_AND_ASSIGN(auto plain, StepOnce<double>("optimizer { rmsprop {} } "
                                                    "learning_rate { learning_rate: 0.01 }",
                                                    {1.0}, {2.0}));
  EXPECT_NEAR(plain[0], 0.9, 1e-8);
  // Centered: mean g = 0.01 * 2 = 0.02, var = 0.04 - 0.0004 = 0.0396,
  // sqrt = 0.198997, p = 1 - 0.02 / 0.198997 = 0.899496.
  ASSERT_OK_AND_ASSIGN(auto centered, StepOnce<double>("optimizer { rmsprop { centered: true } } "
                                                       "learning_rate { learning_rate: 0.01 }",
                                                       {1.0}, {2.0}));
  EXPECT_NEAR(centered[0], 0.899496, 1e-6);
  // Momentum 0.9, g = 2 twice: buf = 2 / 0.2 = 10, p = 0.9; then
  // sq = 0.99 * 0.04 + 0.04 = 0.0796, sqrt = 0.282135, buf = 9 + 7.088812,
  // p = 0.9 - 0.01 * 16.088812 = 0.739112.
  ASSERT_OK_AND_ASSIGN(Trajectory momentum,
                       RunOptimizer<double>(Config("optimizer { rmsprop { momentum: 0.9 } } "
                                                   "learning_rate { learning_rate: 0.01 }"),
                                            {1.0}, {{2.0}, {2.0}}));
  EXPECT_NEAR(momentum[0][0], 0.9, 1e-8);
  EXPECT_NEAR(momentum[1][0], 0.739112, 1e-6);
}

TEST(OptimizerHandTest, AdamFirstStepMovesByLearningRateTimesSign) {
  // m = 0.1 g, v = 0.001 g^2; bias-corrected m_hat = g, v_hat = g^2, so
  // p -= lr * g / (|g| + eps) ~ lr * sign(g), whatever |g|.
  ASSERT_OK_AND_ASSIGN(auto p, StepOnce<float>("optimizer { adam {} } "
                                               "learning_rate { learning_rate: 0.01 }",
                                               {1.0f, 1.0f, -2.0f}, {3.0f, -0.5f, 1e-3f}));
  EXPECT_THAT(p, ElementsAre(::testing::FloatNear(0.99f, 1e-6), ::testing::FloatNear(1.01f, 1e-6),
                             ::testing::FloatNear(-2.01f, 1e-5)));
  // With L2 weight decay the sign is that of g + wd * p: 0.5 + 1 * (-2) < 0.
  ASSERT_OK_AND_ASSIGN(auto l2, StepOnce<double>("optimizer { adam { weight_decay: 1 } } "
                                                 "learning_rate { learning_rate: 0.01 }",
                                                 {-2.0}, {0.5}));
  EXPECT_NEAR(l2[0], -1.99, 1e-9);
}

TEST(OptimizerHandTest, AdamWFirstStepDecaysThenSteps) {
  // lr 0.1, wd 0.5: p = 1 * (1 - 0.05) = 0.95, then - 0.1 * sign(g) = 0.85.
  ASSERT_OK_AND_ASSIGN(auto p, StepOnce<double>("optimizer { adamw { weight_decay: 0.5 } } "
                                                "learning_rate { learning_rate: 0.1 }",
                                                {1.0}, {4.0}));
  EXPECT_NEAR(p[0], 0.85, 1e-9);
}

TEST(OptimizerHandTest, AddIgnoresTheLearningRate) {
  // p = 1.5 + 0.25 = 1.75 whatever the rate.
  ASSERT_OK_AND_ASSIGN(auto p, StepOnce<float>("optimizer { add {} } "
                                               "learning_rate { learning_rate: 0.001 }",
                                               {1.5f}, {0.25f}));
  EXPECT_THAT(p, ElementsAre(1.75f));
}

// ---- clipping -------------------------------------------------------------------
// SGD with lr 1 from p = 0 leaves p = -clipped gradient.

constexpr char kSgdLrOne[] = "optimizer { sgd {} } learning_rate { learning_rate: 1 } ";

TEST(OptimizerClipTest, ClipByValue) {
  ASSERT_OK_AND_ASSIGN(auto p,
                       StepOnce<double>(std::string(kSgdLrOne) + "clipping { clip_value: 0.5 }",
                                        {0, 0, 0, 0}, {2.0, -3.0, 0.25, -0.5}));
  EXPECT_THAT(p, ElementsAre(-0.5, 0.5, -0.25, 0.5));
  ASSERT_OK_AND_ASSIGN(
      auto f, StepOnce<float>(std::string(kSgdLrOne) + "clipping { clip_value: 0.5 }", {0, 0},
                              {2.0f, -3.0f}));
  EXPECT_THAT(f, ElementsAre(-0.5f, 0.5f));
}

TEST(OptimizerClipTest, ClipByLocalNorm) {
  // ||(3, 4)|| = 5 > 1: g *= 1 / 5 -> (0.6, 0.8).
  const std::string config = std::string(kSgdLrOne) + "clipping { clip_norm: 1 }";
  ASSERT_OK_AND_ASSIGN(auto p, StepOnce<double>(config, {0, 0}, {3.0, 4.0}));
  EXPECT_NEAR(p[0], -0.6, 1e-15);
  EXPECT_NEAR(p[1], -0.8, 1e-15);
  ASSERT_OK_AND_ASSIGN(auto f, StepOnce<float>(config, {0, 0}, {3.0f, 4.0f}));
  EXPECT_NEAR(f[0], -0.6, 1e-6);
  EXPECT_NEAR(f[1], -0.8, 1e-6);
  // ||(0.3, 0.4)|| = 0.5 <= 1: unchanged.
  ASSERT_OK_AND_ASSIGN(auto small, StepOnce<double>(config, {0, 0}, {0.3, 0.4}));
  EXPECT_THAT(small, ElementsAre(-0.3, -0.4));
}

TEST(OptimizerClipTest, ClipByGlobalNormUsesTheGivenNorm) {
  const std::string config = std::string(kSgdLrOne) + "clipping { clip_norm: 1 }";
  // Whole gradient has norm 10: this block is scaled by 1 / 10, not 1 / 5.
  ASSERT_OK_AND_ASSIGN(auto p, StepOnce<double>(config, {0, 0}, {3.0, 4.0}, 10.0));
  EXPECT_NEAR(p[0], -0.3, 1e-15);
  EXPECT_NEAR(p[1], -0.4, 1e-15);
  // Global norm 0.5 <= 1: no clipping, although this block's own norm is 5.
  ASSERT_OK_AND_ASSIGN(auto q, StepOnce<float>(config, {0, 0}, {3.0f, 4.0f}, 0.5));
  EXPECT_THAT(q, ElementsAre(-3.0f, -4.0f));
}

TEST(OptimizerClipTest, ClipNormThenValue) {
  // g = (0.5, 10), clip_norm 1, clip_value 0.2.
  // Norm first: ||g|| = sqrt(100.25) = 10.012492, g -> (0.049938, 0.998752),
  // then value: (0.049938, 0.2). (Value first would give (0.2, 0.2).)
  ASSERT_OK_AND_ASSIGN(
      auto p, StepOnce<double>(std::string(kSgdLrOne) + "clipping { clip_norm: 1 clip_value: 0.2 }",
                               {0, 0}, {0.5, 10.0}));
  EXPECT_NEAR(p[0], -0.5 / std::sqrt(100.25), 1e-15);
  EXPECT_NEAR(p[0], -0.049938, 1e-6);
  EXPECT_NEAR(p[1], -0.2, 1e-15);
}

TEST(OptimizerClipTest, ClippingHappensBeforeTheOptimizer) {
  // Momentum 0.5 and clip_value 1: both steps see g = 1, not 4.
  // buf = 1, p = -1; buf = 0.5 + 1 = 1.5, p = -2.5.
  ASSERT_OK_AND_ASSIGN(Trajectory got,
                       RunOptimizer<double>(Config("optimizer { sgd { momentum: 0.5 } } "
                                                   "learning_rate { learning_rate: 1 } "
                                                   "clipping { clip_value: 1 }"),
                                            {0.0}, {{4.0}, {4.0}}));
  EXPECT_NEAR(got[0][0], -1.0, 1e-15);
  EXPECT_NEAR(got[1][0], -2.5, 1e-15);
}

TEST(OptimizerClipTest, ZeroTurnsClippingOff) {
  ASSERT_OK_AND_ASSIGN(
      auto p, StepOnce<double>(std::string(kSgdLrOne) + "clipping { clip_norm: 0 clip_value: 0 }",
                               {0, 0}, {300.0, -400.0}));
  EXPECT_THAT(p, ElementsAre(-300.0, 400.0));
}

// ---- learning-rate schedule --------------------------------------------------------

TEST(OptimizerScheduleTest, StepDecayAppliedPerStep) {
  // lr 0.1 halved every 2 steps, g = 1: rates 0.1, 0.1, 0.05, 0.05, 0.025.
  // p = 1 - 0.1 = 0.9, 0.8, 0.75, 0.7, 0.675.
  absl::StatusOr<std::unique_ptr<Optimizer>> opt =
      Optimizer::Create(Config("optimizer { sgd {} } learning_rate { learning_rate: 0.1 "
                               "step { step_size: 2 gamma: 0.5 } }"),
                        v1::FLOAT64, 1);
  ASSERT_OK(opt.status());
  const double want_rate[] = {0.1, 0.1, 0.05, 0.05, 0.025};
  const double want_p[] = {0.9, 0.8, 0.75, 0.7, 0.675};
  double p = 1.0;
  for (int t = 0; t < 5; ++t) {
    EXPECT_NEAR((*opt)->current_learning_rate(), want_rate[t], 1e-15) << t;
    double g = 1.0;
    (*opt)->Apply(&p, &g, std::nullopt);
    EXPECT_NEAR(p, want_p[t], 1e-14) << t;
    EXPECT_EQ((*opt)->steps(), static_cast<uint64_t>(t + 1));
  }
  EXPECT_NEAR((*opt)->current_learning_rate(), 0.025, 1e-15);
}

TEST(OptimizerScheduleTest, WarmupAppliedPerStep) {
  // lr 0.4 with 4 warm-up steps from 0: rates 0, 0.1, 0.2, 0.3, 0.4.
  // g = 1 each step: p = 1, 0.9, 0.7, 0.4, 0.
  ASSERT_OK_AND_ASSIGN(Trajectory got,
                       RunOptimizer<double>(Config("learning_rate { learning_rate: 0.4 "
                                                   "warmup_steps: 4 }"),
                                            {1.0}, {{1}, {1}, {1}, {1}, {1}}));
  EXPECT_NEAR(got[0][0], 1.0, 1e-15);
  EXPECT_NEAR(got[1][0], 0.9, 1e-15);
  EXPECT_NEAR(got[2][0], 0.7, 1e-15);
  EXPECT_NEAR(got[3][0], 0.4, 1e-15);
  EXPECT_NEAR(got[4][0], 0.0, 1e-15);
}

// ---- integer parameters ------------------------------------------------------------

template <typename T>
class IntegerAddTest : public ::testing::Test {};
using IntegerTypes = ::testing::Types<int32_t, uint32_t, int64_t, uint64_t>;
TYPED_TEST_SUITE(IntegerAddTest, IntegerTypes);

TYPED_TEST(IntegerAddTest, AddWrapsAround) {
  using T = TypeParam;
  constexpr T kMax = std::numeric_limits<T>::max();
  constexpr T kMin = std::numeric_limits<T>::min();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Optimizer> opt,
                       Optimizer::Create(Config("optimizer { add {} }"), kElementTypeOf<T>, 4));
  EXPECT_OK(opt->CheckCanApply("parameter 'counts'"));
  EXPECT_EQ(opt->name(), "add");
  EXPECT_EQ(opt->state_bytes(), 0u);
  // max + 1 wraps to min; min + max = -1 (signed) or max (unsigned min = 0).
  std::vector<T> p = {kMax, kMin, T{5}, T{7}};
  std::vector<T> g = {T{1}, kMax, T{7}, static_cast<T>(kMax)};
  opt->Apply(p.data(), g.data(), std::nullopt);
  EXPECT_EQ(p[0], kMin);
  EXPECT_EQ(p[1], static_cast<T>(kMin + kMax));
  EXPECT_EQ(p[2], T{12});
  // 7 + max wraps to 7 + max - 2^bits = min + 6.
  EXPECT_EQ(p[3], static_cast<T>(kMin + 6));
  // Subtracting through a negative (two's complement) gradient: p[2] + (-12) = 0.
  std::vector<T> g2 = {T{0}, T{0}, static_cast<T>(T{0} - T{12}), T{0}};
  opt->Apply(p.data(), g2.data(), std::nullopt);
  EXPECT_EQ(p[2], T{0});
  EXPECT_EQ(opt->steps(), 2u);
}

TEST(OptimizerIntegerTest, AddIgnoresClippingOnIntegers) {
  ASSERT_OK_AND_ASSIGN(auto p, StepOnce<int32_t>("optimizer { add {} } "
                                                 "clipping { clip_value: 1 clip_norm: 1 }",
                                                 {10, -10}, {100, -100}));
  EXPECT_THAT(p, ElementsAre(110, -110));
}

TEST(OptimizerIntegerTest, UnsetOptimizerCannotApply) {
  for (ElementType type : {v1::INT32, v1::UINT32, v1::INT64, v1::UINT64}) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Optimizer> opt, Optimizer::Create({}, type, 3));
    EXPECT_THAT(opt->CheckCanApply("parameter 'step'"),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("parameter 'step'"), HasSubstr(ElementTypeName(type)),
                               HasSubstr("'add'"))))
        << ElementTypeName(type);
    EXPECT_EQ(opt->name(), "none");
    EXPECT_EQ(opt->state_bytes(), 0u);
  }
}

TEST(OptimizerIntegerTest, ExplicitFloatOptimizerIsRejected) {
  EXPECT_THAT(Optimizer::Create(Config("optimizer { sgd {} }"), v1::INT32, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("sgd"), HasSubstr("int32"), HasSubstr("'add'"))));
  EXPECT_THAT(
      Optimizer::Create(Config("optimizer { adam {} }"), v1::UINT64, 3),
      StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr("adam"), HasSubstr("uint64"))));
  EXPECT_THAT(Optimizer::Create(Config("optimizer { rmsprop {} }"), v1::INT64, 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rmsprop")));
}

TEST(OptimizerCreateTest, RejectsTransportOnlyTypes) {
  EXPECT_THAT(Optimizer::Create({}, v1::FLOAT16, 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("float16")));
  EXPECT_THAT(Optimizer::Create({}, v1::ELEMENT_TYPE_UNSPECIFIED, 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unspecified")));
}

// ---- hyper-parameter validation ---------------------------------------------------

struct InvalidCase {
  const char* config;
  const char* field;
};

TEST(OptimizerValidationTest, EveryBadHyperParameterNamesItsField) {
  const InvalidCase cases[] = {
      {"optimizer { sgd { momentum: -0.1 } }", "optimizer.sgd.momentum"},
      {"optimizer { sgd { momentum: nan } }", "optimizer.sgd.momentum"},
      {"optimizer { sgd { weight_decay: -1 } }", "optimizer.sgd.weight_decay"},
      {"optimizer { sgd { nesterov: true } }", "optimizer.sgd.nesterov"},
      {"optimizer { adagrad { initial_accumulator: -1 } }",
       "optimizer.adagrad.initial_accumulator"},
      {"optimizer { adagrad { epsilon: 0 } }", "optimizer.adagrad.epsilon"},
      {"optimizer { adagrad { epsilon: -1e-8 } }", "optimizer.adagrad.epsilon"},
      {"optimizer { adagrad { weight_decay: -0.1 } }", "optimizer.adagrad.weight_decay"},
      {"optimizer { adadelta { rho: 1.5 } }", "optimizer.adadelta.rho"},
      {"optimizer { adadelta { rho: -0.1 } }", "optimizer.adadelta.rho"},
      {"optimizer { adadelta { epsilon: 0 } }", "optimizer.adadelta.epsilon"},
      {"optimizer { adadelta { weight_decay: -1 } }", "optimizer.adadelta.weight_decay"},
      {"optimizer { rmsprop { alpha: 1.01 } }", "optimizer.rmsprop.alpha"},
      {"optimizer { rmsprop { alpha: -0.5 } }", "optimizer.rmsprop.alpha"},
      {"optimizer { rmsprop { epsilon: 0 } }", "optimizer.rmsprop.epsilon"},
      {"optimizer { rmsprop { momentum: -0.9 } }", "optimizer.rmsprop.momentum"},
      {"optimizer { rmsprop { weight_decay: -1 } }", "optimizer.rmsprop.weight_decay"},
      {"optimizer { adam { beta1: 1 } }", "optimizer.adam.beta1"},
      {"optimizer { adam { beta1: -0.1 } }", "optimizer.adam.beta1"},
      {"optimizer { adam { beta2: 1 } }", "optimizer.adam.beta2"},
      {"optimizer { adam { beta2: inf } }", "optimizer.adam.beta2"},
      {"optimizer { adam { epsilon: 0 } }", "optimizer.adam.epsilon"},
      {"optimizer { adam { weight_decay: -0.01 } }", "optimizer.adam.weight_decay"},
      {"optimizer { adamw { beta1: 1.5 } }", "optimizer.adamw.beta1"},
      {"optimizer { adamw { beta2: 1 } }", "optimizer.adamw.beta2"},
      {"optimizer { adamw { epsilon: -1 } }", "optimizer.adamw.epsilon"},
      {"optimizer { adamw { weight_decay: -0.01 } }", "optimizer.adamw.weight_decay"},
      {"clipping { clip_norm: -1 }", "clipping.clip_norm"},
      {"clipping { clip_norm: inf }", "clipping.clip_norm"},
      {"clipping { clip_value: -0.5 }", "clipping.clip_value"},
      {"learning_rate { learning_rate: -0.1 }", "learning_rate.learning_rate"},
      {"learning_rate { step { step_size: 0 gamma: 0.5 } }", "learning_rate.step.step_size"},
      {"learning_rate { warmup_start_factor: 2 }", "learning_rate.warmup_start_factor"},
  };
  for (const InvalidCase& c : cases) {
    for (ElementType type : {v1::FLOAT32, v1::FLOAT64}) {
      EXPECT_THAT(Optimizer::Create(Config(c.config), type, 4),
                  StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field)))
          << c.config << " " << ElementTypeName(type);
    }
  }
}

TEST(OptimizerValidationTest, BoundaryValuesAreAccepted) {
  for (const char* config : {
           "optimizer { sgd { momentum: 0 weight_decay: 0 } }",
           "optimizer { adagrad { initial_accumulator: 0 epsilon: 1e-30 } }",
           "optimizer { adadelta { rho: 0 } }",
           "optimizer { adadelta { rho: 1 } }",
           "optimizer { rmsprop { alpha: 0 } }",
           "optimizer { adam { beta1: 0 beta2: 0 } }",
           "optimizer { adamw { weight_decay: 0 } }",
           "clipping { clip_norm: 0 clip_value: 0 }",
       }) {
    EXPECT_THAT(Optimizer::Create(Config(config), v1::FLOAT32, 4), IsOk()) << config;
  }
}

TEST(OptimizerValidationTest, AddOnIntegersStillValidatesClipping) {
  EXPECT_THAT(
      Optimizer::Create(Config("optimizer { add {} } clipping { clip_value: -1 }"), v1::INT32, 4),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("clipping.clip_value")));
}

// ---- state, names, steps ------------------------------------------------------------

struct StateCase {
  const char* config;
  ElementType type;
  size_t num_elements;
  size_t bytes;
};

TEST(OptimizerStateTest, StateBytes) {
  const StateCase cases[] = {
      {"optimizer { adam {} }", v1::FLOAT32, 10, 80},  // m and v: 2 * 10 * 4
      {"optimizer { adam {} }", v1::FLOAT64, 10, 160},
      {"optimizer { adamw {} }", v1::FLOAT32, 10, 80},
      {"", v1::FLOAT32, 10, 0},                                      // plain SGD
      {"optimizer { sgd { momentum: 0.9 } }", v1::FLOAT32, 10, 40},  // buf
      {"optimizer { sgd { momentum: 0.9 } }", v1::FLOAT64, 3, 24},
      {"optimizer { adagrad {} }", v1::FLOAT64, 5, 40},                  // acc
      {"optimizer { adadelta {} }", v1::FLOAT32, 5, 40},                 // 2 slots
      {"optimizer { rmsprop {} }", v1::FLOAT32, 5, 20},                  // sq
      {"optimizer { rmsprop { centered: true } }", v1::FLOAT32, 5, 40},  // + mean
      {"optimizer { rmsprop { centered: true momentum: 0.5 } }", v1::FLOAT64, 5, 120},
      {"optimizer { add {} }", v1::FLOAT32, 10, 0},
      {"optimizer { add {} }", v1::INT64, 10, 0},
      {"", v1::INT32, 10, 0},
  };
  for (const StateCase& c : cases) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Optimizer> opt,
                         Optimizer::Create(Config(c.config), c.type, c.num_elements));
    EXPECT_EQ(opt->state_bytes(), c.bytes) << c.config << " " << ElementTypeName(c.type);
  }
}

TEST(OptimizerStateTest, StepsCountApplies) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Optimizer> opt,
                       Optimizer::Create(Config("optimizer { adam {} }"), v1::FLOAT32, 2));
  EXPECT_EQ(opt->steps(), 0u);
  std::vector<float> p = {1, 2};
  for (int i = 0; i < 3; ++i) {
    std::vector<float> g = {0.5f, -0.5f};
    opt->Apply(p.data(), g.data(), std::nullopt);
  }
  EXPECT_EQ(opt->steps(), 3u);
}

TEST(OptimizerStateTest, Names) {
  EXPECT_EQ(OptimizerName(v1::OptimizerConfig()), "sgd");
  EXPECT_EQ(OptimizerName(Config("optimizer { sgd {} }").optimizer()), "sgd");
  EXPECT_EQ(OptimizerName(Config("optimizer { adagrad {} }").optimizer()), "adagrad");
  EXPECT_EQ(OptimizerName(Config("optimizer { adadelta {} }").optimizer()), "adadelta");
  EXPECT_EQ(OptimizerName(Config("optimizer { rmsprop {} }").optimizer()), "rmsprop");
  EXPECT_EQ(OptimizerName(Config("optimizer { adam {} }").optimizer()), "adam");
  EXPECT_EQ(OptimizerName(Config("optimizer { adamw {} }").optimizer()), "adamw");
  EXPECT_EQ(OptimizerName(Config("optimizer { add {} }").optimizer()), "add");

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Optimizer> adam,
                       Optimizer::Create(Config("optimizer { adam {} }"), v1::FLOAT32, 1));
  EXPECT_EQ(adam->name(), "adam");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Optimizer> sgd, Optimizer::Create({}, v1::FLOAT64, 1));
  EXPECT_EQ(sgd->name(), "sgd");
}

TEST(OptimizerStateTest, DefaultLearningRates) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Optimizer> sgd, Optimizer::Create({}, v1::FLOAT32, 1));
  EXPECT_DOUBLE_EQ(sgd->current_learning_rate(), 0.01);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Optimizer> adadelta,
                       Optimizer::Create(Config("optimizer { adadelta {} }"), v1::FLOAT32, 1));
  EXPECT_DOUBLE_EQ(adadelta->current_learning_rate(), 1.0);
}

}  // namespace
}  // namespace pserver
