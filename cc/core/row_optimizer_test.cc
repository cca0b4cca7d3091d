#include "cc/core/row_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "cc/core/sparse_table.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "pserver/v1/table.pb.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

template <typename M>
M Parse(const std::string& text) {
  M message;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &message)) << text;
  return message;
}

// ---- the optimizer on its own ---------------------------------------------------

TEST(RowOptimizerTest, StatePerRowAndNames) {
  struct Case {
    std::string config;
    const char* name;
    uint32_t state_for_dim_5;
  };
  for (const Case& c : std::vector<Case>{{"", "sgd", 0},
                                         {"sgd {}", "sgd", 0},
                                         {"adagrad {}", "adagrad", 5},
                                         {"adam {}", "adam", 10},
                                         {"ftrl {}", "ftrl", 10},
                                         {"add {}", "add", 0}}) {
    ASSERT_OK_AND_ASSIGN(RowOptimizer opt,
                         RowOptimizer::Create(Parse<v1::RowOptimizer>(c.config), "table 't'"));
    EXPECT_STREQ(opt.name(), c.name);
    EXPECT_EQ(opt.state_per_row(5), c.state_for_dim_5) << c.config;
  }
}

TEST(RowOptimizerTest, ErrorsNameTheTableAndField) {
  EXPECT_THAT(RowOptimizer::Create(Parse<v1::RowOptimizer>("adam { beta1: 1.5 }"), "table 'emb'"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "table 'emb': adam.beta1 must be in [0, 1), got 1.5"));
  EXPECT_THAT(RowOptimizer::Create(Parse<v1::RowOptimizer>("ftrl { alpha: -1 }"), "table 'x'"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "table 'x': ftrl.alpha must be finite and > 0, got -1"));
  EXPECT_THAT(RowOptimizer::Create(Parse<v1::RowOptimizer>("adagrad { learning_rate: inf }"), "t"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("adagrad.learning_rate must be finite and > 0, got inf")));
  // Edge values that are allowed.
  EXPECT_OK(
      RowOptimizer::Create(Parse<v1::RowOptimizer>("adam { beta1: 0 beta2: 0 }"), "t").status());
  EXPECT_OK(
      RowOptimizer::Create(Parse<v1::RowOptimizer>("ftrl { beta: 0 l1: 0 l2: 0 }"), "t").status());
}

TEST(RowOptimizerTest, DefaultsFollowTheProto) {
  // One step from w = 0 with g = 1.
  auto step = [](const std::string& config) {
    absl::StatusOr<RowOptimizer> opt = RowOptimizer::Create(Parse<v1::RowOptimizer>(config), "t");
    EXPECT_TRUE(opt.ok()) << opt.status();
    double w = 0;
    std::vector<double> state(opt->state_per_row(1));
    opt->InitState(state.data(), 1);
    const double g = 1;
    opt->Apply(&w, state.data(), &g, 1, 1);
    return w;
  };
  EXPECT_DOUBLE_EQ(step(""), -0.01);
  EXPECT_DOUBLE_EQ(step("sgd {}"), -0.01);
  EXPECT_NEAR(step("adagrad {}"), -0.01 / (1 + 1e-10), 1e-15);     // lr 0.01, eps 1e-10
  EXPECT_NEAR(step("adam {}"), -0.001 / (1 + 1e-8), 1e-15);        // lr 1e-3, eps 1e-8
  EXPECT_DOUBLE_EQ(step("ftrl {}"), -1.0 / ((1.0 + 1.0) / 0.05));  // alpha 0.05, beta 1
  EXPECT_DOUBLE_EQ(step("add {}"), 1.0);
  EXPECT_NEAR(step("adagrad { initial_accumulator: 3 }"), -0.01 / 2, 1e-12);
}

// ---- through a table, against reference implementations -----------------------------

// A row as the reference keeps it, all in double.
struct RefRow {
  std::vector<double> w, a, b;  // values; adagrad acc / adam m / ftrl z; adam v / ftrl n
  uint64_t t = 0;
};
using RefUpdate = std::function<void(RefRow&, const std::vector<double>&)>;

RefUpdate RefSgd(double lr) {
  return [lr](RefRow& r, const std::vector<double>& g) {
    for (size_t i = 0; i < g.size(); ++i) r.w[i] -= lr * g[i];
  };
}

RefUpdate RefAdagrad(double lr, double eps) {
  return [lr, eps](RefRow& r, const std::vector<double>& g) {
    for (size_t i = 0; i < g.size(); ++i) {
      r.a[i] += g[i] * g[i];
      r.w[i] -= lr * g[i] / (std::sqrt(r.a[i]) + eps);
    }
  };
}

RefUpdate RefAdam(double lr, double beta1, double beta2, double eps) {
  return [=](RefRow& r, const std::vector<double>& g) {
    r.t += 1;
    for (size_t i = 0; i < g.size(); ++i) {
      r.a[i] = beta1 * r.a[i] + (1 - beta1) * g[i];
      r.b[i] = beta2 * r.b[i] + (1 - beta2) * g[i] * g[i];
      const double m_hat = r.a[i] / (1 - std::pow(beta1, r.t));
      const double v_hat = r.b[i] / (1 - std::pow(beta2, r.t));
      r.w[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  };
}

RefUpdate RefFtrl(double alpha, double beta, double l1, double l2) {
  return [=](RefRow& r, const std::vector<double>& g) {
    for (size_t i = 0; i < g.size(); ++i) {
      double& z = r.a[i];
      double& n = r.b[i];
      const double n_new = n + g[i] * g[i];
      const double sigma = (std::sqrt(n_new) - std::sqrt(n)) / alpha;
      z += g[i] - sigma * r.w[i];
      n = n_new;
      if (std::fabs(z) <= l1) {
        r.w[i] = 0;
      } else {
        const double sign_z = z > 0 ? 1 : -1;
        r.w[i] = -(z - sign_z * l1) / ((beta + std::sqrt(n)) / alpha + l2);
      }
    }
  };
}

template <typename T>
class RowOptimizerTableTest : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(RowOptimizerTableTest, ElementTypes);

// Runs `steps` pushes over three rows: every step pushes some of the rows
// (so their step counts differ), some with a duplicated key; checks every row
// against the reference after every step.
template <typename T>
void RunAgainstReference(const std::string& optimizer, double initial_state_a,
                         const RefUpdate& ref) {
  SCOPED_TRACE(optimizer);
  constexpr uint32_t kDim = 5;
  const std::string element = std::is_same_v<T, float> ? "FLOAT32" : "FLOAT64";
  v1::TableConfig config = Parse<v1::TableConfig>(
      "dim: 5 element_type: " + element +
      " initializer { normal { stddev: 0.3 } seed: 21 } optimizer { " + optimizer + " }");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SparseTable> table, SparseTable::Create("t", config));
  const std::vector<uint64_t> keys = {3, 17, 123456789};
  std::map<uint64_t, RefRow> ref_rows;
  for (uint64_t key : keys) {
    std::vector<T> initial(kDim);
    table->InitialRow(key,
                      absl::MakeSpan(reinterpret_cast<char*>(initial.data()), kDim * sizeof(T)));
    RefRow& r = ref_rows[key];
    r.w.assign(initial.begin(), initial.end());
    r.a.assign(kDim, initial_state_a);
    r.b.assign(kDim, 0.0);
  }
  // Relative, with an absolute floor (as in optimizer_test): float32 rows are
  // rounded to float after every step, the reference never is.
  const double tol = std::is_same_v<T, float> ? 1e-6 : 1e-12;
  for (int step = 0; step < 8; ++step) {
    // Which rows this step pushes, as positions into `keys`; 0 twice on odd steps.
    std::vector<size_t> pushed = {0, 1};
    if (step % 3 != 2) pushed.push_back(2);
    if (step % 2 == 1) pushed.push_back(0);
    std::vector<uint64_t> push_keys;
    std::vector<T> grads;
    std::map<uint64_t, std::vector<double>> summed;
    for (size_t p = 0; p < pushed.size(); ++p) {
      const uint64_t key = keys[pushed[p]];
      push_keys.push_back(key);
      std::vector<double>& sum = summed[key];
      sum.resize(kDim, 0.0);
      for (uint32_t c = 0; c < kDim; ++c) {
        // Exactly representable in float: multiples of 1/8 in [-5/8, 5/8].
        const double g =
            static_cast<double>((pushed[p] * 3 + step * 5 + c * 7 + p) % 11) / 8 - 0.625;
        grads.push_back(static_cast<T>(g));
        sum[c] += g;
      }
    }
    ASSERT_OK(table->Push(push_keys, absl::string_view(reinterpret_cast<const char*>(grads.data()),
                                                       grads.size() * sizeof(T))));
    for (auto& [key, g] : summed) ref(ref_rows[key], g);

    std::vector<T> got(keys.size() * kDim);
    ASSERT_OK(table->Pull(
        keys, absl::MakeSpan(reinterpret_cast<char*>(got.data()), got.size() * sizeof(T))));
    for (size_t k = 0; k < keys.size(); ++k) {
      for (uint32_t c = 0; c < kDim; ++c) {
        const double want = ref_rows[keys[k]].w[c];
        EXPECT_NEAR(static_cast<double>(got[k * kDim + c]), want,
                    tol * std::max(std::fabs(want), 1.0))
            << "step " << step << " key " << keys[k] << " column " << c;
      }
    }
  }
}

TYPED_TEST(RowOptimizerTableTest, Sgd) {
  RunAgainstReference<TypeParam>("sgd { learning_rate: 0.3 }", 0, RefSgd(0.3));
}

TYPED_TEST(RowOptimizerTableTest, Adagrad) {
  RunAgainstReference<TypeParam>("adagrad { learning_rate: 0.2 initial_accumulator: 0.1 }", 0.1,
                                 RefAdagrad(0.2, 1e-10));
  RunAgainstReference<TypeParam>("adagrad { learning_rate: 0.05 epsilon: 0.01 }", 0,
                                 RefAdagrad(0.05, 0.01));
}

TYPED_TEST(RowOptimizerTableTest, Adam) {
  RunAgainstReference<TypeParam>("adam { learning_rate: 0.01 }", 0,
                                 RefAdam(0.01, 0.9, 0.999, 1e-8));
  RunAgainstReference<TypeParam>(
      "adam { learning_rate: 0.1 beta1: 0.5 beta2: 0.75 epsilon: 0.001 }", 0,
      RefAdam(0.1, 0.5, 0.75, 0.001));
}

TYPED_TEST(RowOptimizerTableTest, Ftrl) {
  RunAgainstReference<TypeParam>("ftrl { alpha: 0.1 beta: 1 l1: 0.05 l2: 0.01 }", 0,
                                 RefFtrl(0.1, 1, 0.05, 0.01));
  RunAgainstReference<TypeParam>("ftrl {}", 0, RefFtrl(0.05, 1, 0, 0));
}

TYPED_TEST(RowOptimizerTableTest, Add) {
  RunAgainstReference<TypeParam>("add {}", 0, [](RefRow& r, const std::vector<double>& g) {
    for (size_t i = 0; i < g.size(); ++i) r.w[i] += g[i];
  });
}

}  // namespace
}  // namespace pserver
