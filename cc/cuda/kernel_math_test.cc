// The kernels' math without a GPU: update_math.h (the element code the CUDA
// kernels run) and plan.h (the per-step scalars the host passes them),
// executed on the CPU and compared with cc/core's Optimizer and RowOptimizer
// over 100 (dense) and 50 (sparse) steps, bit for bit. Runs everywhere; on a
// GPU, device_optimizer_test and device_rows_test check the same code on the
// device (nvcc, --fmad=false) against the same references.
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/core/optimizer.h"
#include "cc/core/row_optimizer.h"
#include "cc/cuda/optimizer_cases.h"
#include "cc/cuda/plan.h"
#include "cc/cuda/test_util.h"
#include "cc/cuda/update_math.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace cuda {
namespace {

using namespace ::pserver::cuda::testing;  // NOLINT

// Counts values whose bits differ, reporting the first few.
int CountBitDifferences(const float* want, const float* got, size_t n, const std::string& what) {
  int differ = 0;
  for (size_t i = 0; i < n; ++i) {
    if (FloatBits(want[i]) != FloatBits(got[i]) && ++differ <= 3) {
      ADD_FAILURE() << what << "[" << i << "]: cc/core " << want[i] << ", kernel math " << got[i];
    }
  }
  return differ;
}

class KernelMathDenseTest : public ::testing::TestWithParam<std::tuple<Case, ElementType>> {};

TEST_P(KernelMathDenseTest, MatchesTheHostOptimizerBitForBit) {
  const Case& c = std::get<0>(GetParam());
  const ElementType grad_type = std::get<1>(GetParam());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Optimizer> host,
                       Optimizer::Create(c.config, v1::FLOAT32, kElements));
  ASSERT_OK_AND_ASSIGN(LearningRate lr, LearningRate::Create(c.config.learning_rate(), 0.01));
  const int rule = DenseRuleFor(c.config.optimizer());
  ASSERT_GE(rule, 0);
  const size_t num_slots = host->ExportState().slots.size();
  std::vector<std::vector<float>> slots(num_slots, std::vector<float>(kElements, 0.0f));
  if (rule == kernels::kDenseAdagrad) {
    for (float& v : slots[0])
      v = static_cast<float>(c.config.optimizer().adagrad().initial_accumulator());
  }

  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> want(kElements);
  for (float& v : want) v = uniform(rng);
  std::vector<float> got = want;
  for (uint64_t step = 0; step < 100; ++step) {
    Gradient g = MakeGradient(grad_type, rng);
    host->Apply(want.data(), g.values.data(), std::nullopt);
    double sum = 0;  // as the host's L2Norm: serial, in double
    for (float v : g.values) sum += static_cast<double>(v) * v;
    const kernels::DenseStep plan =
        PlanDenseStep(c.config, rule, static_cast<float>(lr.At(step)), step, std::sqrt(sum));
    kernels::DenseUpdateOnHost(plan, got.data(), g.bytes.data(), GradTypeOf(grad_type)->first,
                               num_slots > 0 ? slots[0].data() : nullptr,
                               num_slots > 1 ? slots[1].data() : nullptr, kElements);
  }
  EXPECT_EQ(CountBitDifferences(want.data(), got.data(), kElements, "params"), 0);
  OptimizerState state = host->ExportState();
  ASSERT_EQ(state.slots.size(), num_slots);
  for (size_t s = 0; s < num_slots; ++s) {
    EXPECT_EQ(CountBitDifferences(reinterpret_cast<const float*>(state.slots[s].second.data()),
                                  slots[s].data(), kElements, "slot " + state.slots[s].first),
              0);
  }
}

INSTANTIATE_TEST_SUITE_P(AllRules, KernelMathDenseTest,
                         ::testing::Combine(::testing::ValuesIn(Cases()),
                                            ::testing::Values(v1::FLOAT32, v1::FLOAT16,
                                                              v1::BFLOAT16)),
                         [](const ::testing::TestParamInfo<std::tuple<Case, ElementType>>& info) {
                           return absl::StrCat(std::get<0>(info.param).name, "_",
                                               ElementTypeName(std::get<1>(info.param)));
                         });

class KernelMathRowsTest : public ::testing::TestWithParam<std::tuple<std::string, ElementType>> {};

TEST_P(KernelMathRowsTest, MatchesTheHostRowOptimizerBitForBit) {
  const std::string& name = std::get<0>(GetParam());
  const ElementType type = std::get<1>(GetParam());
  const v1::RowOptimizer config = RowConfig(name);
  ASSERT_OK_AND_ASSIGN(RowOptimizer host, RowOptimizer::Create(config, "t"));
  const kernels::RowStep step = PlanRowStep(config, host.kind());
  constexpr uint32_t kDim = 17, kRows = 64;
  const uint32_t spr = host.state_per_row(kDim);

  std::mt19937 rng(99);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> want(size_t{kRows} * kDim);
  for (float& v : want) v = uniform(rng);
  std::vector<float> want_state(size_t{kRows} * spr);
  for (uint32_t r = 0; r < kRows; ++r) host.InitState(want_state.data() + r * spr, kDim);
  std::vector<uint64_t> want_steps(kRows, 0);
  std::vector<float> got = want, got_state = want_state;
  std::vector<uint64_t> got_steps = want_steps;

  std::uniform_int_distribution<uint32_t> pick(0, 24);
  std::uniform_int_distribution<int> k(-256, 256);
  for (int s = 0; s < 50; ++s) {
    std::vector<uint32_t> rows(40);
    for (uint32_t& r : rows) r = pick(rng) * 2 + (s % 2);
    std::vector<float> g(rows.size() * kDim);
    std::vector<uint16_t> half(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = static_cast<float>(k(rng)) / 128.0f;
      half[i] = type == v1::FLOAT16 ? ExactFloat16(g[i]) : ExactBfloat16(g[i]);
    }
    const RowPlan plan = PlanRows(rows);
    kernels::ScatterApplyRowsOnHost(step, got.data(), got_state.data(), got_steps.data(), kDim,
                                    host.state_per_row_factor(), plan,
                                    type == v1::FLOAT32 ? static_cast<const void*>(g.data())
                                                        : static_cast<const void*>(half.data()),
                                    GradTypeOf(type)->first);
    for (size_t u = 0; u < plan.num_unique; ++u) {
      const uint32_t r = plan.rows()[u];
      std::vector<double> sum(kDim, 0.0);
      for (size_t p = 0; p < rows.size(); ++p) {
        if (rows[p] != r) continue;
        for (uint32_t i = 0; i < kDim; ++i) sum[i] += static_cast<double>(g[p * kDim + i]);
      }
      host.Apply(want.data() + size_t{r} * kDim, want_state.data() + size_t{r} * spr, sum.data(),
                 kDim, ++want_steps[r]);
    }
  }
  EXPECT_EQ(CountBitDifferences(want.data(), got.data(), want.size(), "values"), 0);
  EXPECT_EQ(CountBitDifferences(want_state.data(), got_state.data(), want_state.size(), "state"),
            0);
  EXPECT_EQ(got_steps, want_steps);
}

INSTANTIATE_TEST_SUITE_P(
    AllRules, KernelMathRowsTest,
    ::testing::Combine(::testing::ValuesIn(RowCaseNames()),
                       ::testing::Values(v1::FLOAT32, v1::FLOAT16, v1::BFLOAT16)),
    [](const ::testing::TestParamInfo<std::tuple<std::string, ElementType>>& info) {
      return absl::StrCat(std::get<0>(info.param), "_", ElementTypeName(std::get<1>(info.param)));
    });

TEST(KernelMathTest, RowPlanGroupsDuplicatesInListedOrder) {
  const std::vector<uint32_t> rows = {7, 3, 7, 9, 3, 7};
  const RowPlan plan = PlanRows(rows);
  ASSERT_EQ(plan.num_unique, 3u);
  EXPECT_THAT(std::vector<uint32_t>(plan.rows(), plan.rows() + 3), ::testing::ElementsAre(7, 3, 9));
  EXPECT_THAT(std::vector<uint32_t>(plan.offsets(), plan.offsets() + 4),
              ::testing::ElementsAre(0, 3, 5, 6));
  EXPECT_THAT(std::vector<uint32_t>(plan.positions(), plan.positions() + 6),
              ::testing::ElementsAre(0, 2, 5, 1, 4, 3));
}

TEST(KernelMathTest, HalfConversionsAreExact) {
  using kernels::Bfloat16ToFloat;
  using kernels::HalfToFloat;
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(FloatBits(HalfToFloat(0x8000)), 0x80000000u);
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  // Every finite float16 value converts to the float with the same value.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0x1f) continue;
    const double magnitude = exp == 0 ? std::ldexp(static_cast<double>(mant), -24)
                                      : std::ldexp(1.0 + mant / 1024.0, static_cast<int>(exp) - 15);
    const double want = (h & 0x8000) ? -magnitude : magnitude;
    ASSERT_EQ(static_cast<double>(HalfToFloat(static_cast<uint16_t>(h))), want) << std::hex << h;
  }
  EXPECT_EQ(Bfloat16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(Bfloat16ToFloat(ExactBfloat16(-0.375f)), -0.375f);
}

}  // namespace
}  // namespace cuda
}  // namespace pserver
