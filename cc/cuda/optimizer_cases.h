// The optimizer configurations and gradients the agreement tests run
// (device_optimizer_test and device_rows_test on a GPU, kernel_math_test
// everywhere).
#ifndef PSERVER_CC_CUDA_OPTIMIZER_CASES_H_
#define PSERVER_CC_CUDA_OPTIMIZER_CASES_H_

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cc/core/element_type.h"
#include "cc/cuda/test_util.h"
#include "pserver/v1/config.pb.h"
#include "pserver/v1/table.pb.h"

namespace pserver {
namespace cuda {
namespace testing {

constexpr size_t kElements = 10007;  // not a multiple of any block size

struct Case {
  std::string name;
  v1::ParameterConfig config;
};

inline std::vector<Case> Cases() {
  std::vector<Case> cases;
  auto add = [&](std::string name, auto fill) {
    Case c;
    c.name = std::move(name);
    fill(c.config);
    cases.push_back(std::move(c));
  };
  add("sgd", [](v1::ParameterConfig& c) {
    c.mutable_optimizer()->mutable_sgd();
    c.mutable_learning_rate()->set_learning_rate(0.1);
  });
  add("sgd_default", [](v1::ParameterConfig&) {});
  add("sgd_momentum_decay", [](v1::ParameterConfig& c) {
    auto* s = c.mutable_optimizer()->mutable_sgd();
    s->set_momentum(0.9);
    s->set_weight_decay(0.01);
    c.mutable_learning_rate()->set_learning_rate(0.05);
  });
  add("sgd_nesterov", [](v1::ParameterConfig& c) {
    auto* s = c.mutable_optimizer()->mutable_sgd();
    s->set_momentum(0.8);
    s->set_nesterov(true);
    c.mutable_learning_rate()->set_learning_rate(0.05);
  });
  add("sgd_clipped", [](v1::ParameterConfig& c) {
    c.mutable_optimizer()->mutable_sgd()->set_momentum(0.5);
    c.mutable_clipping()->set_clip_norm(3.0);
    c.mutable_clipping()->set_clip_value(0.25);
  });
  add("adagrad", [](v1::ParameterConfig& c) {
    auto* a = c.mutable_optimizer()->mutable_adagrad();
    a->set_initial_accumulator(0.1);
    a->set_weight_decay(0.001);
    c.mutable_learning_rate()->set_learning_rate(0.05);
  });
  add("adagrad_default", [](v1::ParameterConfig& c) { c.mutable_optimizer()->mutable_adagrad(); });
  add("adam", [](v1::ParameterConfig& c) {
    c.mutable_optimizer()->mutable_adam();
    c.mutable_learning_rate()->set_learning_rate(0.01);
  });
  add("adam_l2_custom", [](v1::ParameterConfig& c) {
    auto* a = c.mutable_optimizer()->mutable_adam();
    a->set_beta1(0.8);
    a->set_beta2(0.99);
    a->set_epsilon(1e-6);
    a->set_weight_decay(0.01);
  });
  add("adamw", [](v1::ParameterConfig& c) {
    c.mutable_optimizer()->mutable_adamw();
    c.mutable_learning_rate()->set_learning_rate(0.01);
  });
  add("adamw_cosine_warmup", [](v1::ParameterConfig& c) {
    c.mutable_optimizer()->mutable_adamw()->set_weight_decay(0.1);
    auto* lr = c.mutable_learning_rate();
    lr->set_learning_rate(0.02);
    lr->mutable_cosine()->set_decay_steps(80);
    lr->mutable_cosine()->set_min_learning_rate(0.001);
    lr->set_warmup_steps(10);
    lr->set_warmup_start_factor(0.1);
  });
  add("adam_step_decay_clip_norm", [](v1::ParameterConfig& c) {
    c.mutable_optimizer()->mutable_adam();
    c.mutable_learning_rate()->mutable_step()->set_step_size(25);
    c.mutable_learning_rate()->mutable_step()->set_gamma(0.5);
    c.mutable_clipping()->set_clip_norm(10.0);
  });
  return cases;
}

// Gradients of one step: as float (what the host optimizer gets) and as the
// bytes of `type` (what the device gets), the same values exactly.
struct Gradient {
  std::vector<float> values;
  std::string bytes;
};

inline Gradient MakeGradient(ElementType type, std::mt19937& rng) {
  Gradient g;
  g.values.resize(kElements);
  if (type == v1::FLOAT32) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : g.values) v = normal(rng);
    g.bytes.assign(reinterpret_cast<const char*>(g.values.data()), kElements * 4);
    return g;
  }
  std::vector<uint16_t> half(kElements);
  std::uniform_int_distribution<int> k(type == v1::FLOAT16 ? -2048 : -256,
                                       type == v1::FLOAT16 ? 2048 : 256);
  for (size_t i = 0; i < kElements; ++i) {
    if (type == v1::FLOAT16) {
      g.values[i] = static_cast<float>(k(rng)) / 1024.0f;
      half[i] = ExactFloat16(g.values[i]);
    } else {
      g.values[i] = static_cast<float>(k(rng)) / 128.0f;
      half[i] = ExactBfloat16(g.values[i]);
    }
  }
  g.bytes.assign(reinterpret_cast<const char*>(half.data()), kElements * 2);
  return g;
}

// The row optimizers the sparse agreement tests run, by name.
inline std::vector<std::string> RowCaseNames() { return {"sgd", "adagrad", "adam", "add"}; }

inline v1::RowOptimizer RowConfig(const std::string& name) {
  v1::RowOptimizer c;
  if (name == "sgd") c.mutable_sgd()->set_learning_rate(0.1);
  if (name == "adagrad") c.mutable_adagrad()->set_initial_accumulator(0.1);
  if (name == "adam") c.mutable_adam()->set_learning_rate(0.01);
  if (name == "add") c.mutable_add();
  return c;
}

}  // namespace testing
}  // namespace cuda
}  // namespace pserver

#endif  // PSERVER_CC_CUDA_OPTIMIZER_CASES_H_
