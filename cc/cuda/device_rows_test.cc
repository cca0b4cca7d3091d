// DeviceRows against cc/core's RowOptimizer: gather is exact, and 50
// scatter-applies with duplicate rows (summed) agree with the host to 1e-5
// relative (both compute in double and round to float once per value; the
// device's pow in Adam's bias corrections may differ from glibc's by 2 ulp in
// double, which moves a float result by at most one rounding).
//
// Needs a CUDA device; skips with the runtime's reason without one.
#include "cc/cuda/device_rows.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/core/row_optimizer.h"
#include "cc/cuda/buffer.h"
#include "cc/cuda/optimizer_cases.h"
#include "cc/cuda/test_util.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace cuda {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;
using namespace ::pserver::cuda::testing;  // NOLINT

constexpr uint32_t kDim = 17;
constexpr uint32_t kRows = 64;
constexpr int kSteps = 50;
constexpr size_t kPerPush = 40;

void ExpectClose(const std::vector<float>& host, const std::vector<float>& device,
                 const std::string& what) {
  ASSERT_EQ(host.size(), device.size());
  int failures = 0;
  for (size_t i = 0; i < host.size(); ++i) {
    const double a = host[i], b = device[i];
    if (!(std::abs(a - b) <= 1e-5 * std::max(std::abs(a), std::abs(b)) + 1e-7)) {
      if (++failures <= 5) ADD_FAILURE() << what << "[" << i << "]: host " << a << ", device " << b;
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

class DeviceRowsAgreementTest
    : public ::testing::TestWithParam<std::tuple<std::string, ElementType>> {};

TEST_P(DeviceRowsAgreementTest, ScatterApplyMatchesTheHostRowOptimizer) {
  PS_SKIP_WITHOUT_CUDA_DEVICE();
  const std::string& name = std::get<0>(GetParam());
  const ElementType type = std::get<1>(GetParam());
  const v1::RowOptimizer config = RowConfig(name);
  ASSERT_OK_AND_ASSIGN(RowOptimizer host, RowOptimizer::Create(config, "host"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceRows> device,
                       DeviceRows::Create(config, kDim, kRows, 0, "table 't'"));
  ASSERT_EQ(device->state_per_row(), host.state_per_row(kDim));
  const uint32_t spr = host.state_per_row(kDim);

  std::mt19937 rng(99);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(size_t{kRows} * kDim);
  for (float& v : values) v = uniform(rng);
  std::vector<float> state(size_t{kRows} * spr);
  for (uint32_t r = 0; r < kRows; ++r) host.InitState(state.data() + r * spr, kDim);
  std::vector<uint64_t> steps(kRows, 0);
  std::vector<uint32_t> all(kRows);
  for (uint32_t r = 0; r < kRows; ++r) all[r] = r;
  ASSERT_OK(device->WriteRows(all, values.data()));

  const size_t element = type == v1::FLOAT32 ? 4 : 2;
  ASSERT_OK_AND_ASSIGN(DeviceBuffer grads, DeviceBuffer::Allocate(0, kPerPush * kDim * element));
  std::uniform_int_distribution<uint32_t> pick(0, 24);  // few rows: many duplicates
  std::uniform_int_distribution<int> k(-256, 256);
  for (int s = 0; s < kSteps; ++s) {
    std::vector<uint32_t> rows(kPerPush);
    for (uint32_t& r : rows) r = pick(rng) * 2 + (s % 2);
    std::vector<float> g(kPerPush * kDim);
    std::vector<uint16_t> half(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = static_cast<float>(k(rng)) / 128.0f;  // exact in float16 and bfloat16
      half[i] = type == v1::FLOAT16 ? ExactFloat16(g[i]) : ExactBfloat16(g[i]);
    }
    ASSERT_OK(CopyToDevice(grads, 0,
                           type == v1::FLOAT32 ? static_cast<const void*>(g.data())
                                               : static_cast<const void*>(half.data()),
                           grads.size()));
    ASSERT_OK(device->ScatterApply(rows, grads, type));
    // Host: sum each distinct row's gradients in double, in listed order.
    std::vector<uint32_t> distinct;
    for (uint32_t r : rows) {
      if (std::find(distinct.begin(), distinct.end(), r) == distinct.end()) distinct.push_back(r);
    }
    for (uint32_t r : distinct) {
      std::vector<double> sum(kDim, 0.0);
      for (size_t p = 0; p < rows.size(); ++p) {
        if (rows[p] != r) continue;
        for (uint32_t i = 0; i < kDim; ++i) sum[i] += static_cast<double>(g[p * kDim + i]);
      }
      host.Apply(values.data() + size_t{r} * kDim, state.data() + size_t{r} * spr, sum.data(), kDim,
                 ++steps[r]);
    }
  }

  std::vector<float> got_values(values.size()), got_state(state.size());
  std::vector<uint64_t> got_steps(kRows);
  ASSERT_OK(device->ReadRows(all, got_values.data(), got_state.data(), got_steps.data()));
  ExpectClose(values, got_values, "values");
  ExpectClose(state, got_state, "state");
  EXPECT_EQ(got_steps, steps);

  // Gather reads exactly what is stored, duplicates included.
  std::vector<uint32_t> order = {5, 63, 0, 5, 17};
  ASSERT_OK_AND_ASSIGN(DeviceBuffer out, DeviceBuffer::Allocate(0, order.size() * kDim * 4));
  ASSERT_OK(device->Gather(order, out));
  std::vector<float> gathered(order.size() * kDim);
  ASSERT_OK(CopyToHost(gathered.data(), out, 0, gathered.size() * 4));
  for (size_t k2 = 0; k2 < order.size(); ++k2) {
    for (uint32_t i = 0; i < kDim; ++i) {
      EXPECT_EQ(FloatBits(gathered[k2 * kDim + i]), FloatBits(got_values[order[k2] * kDim + i]));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllRules, DeviceRowsAgreementTest,
    ::testing::Combine(::testing::ValuesIn(RowCaseNames()),
                       ::testing::Values(v1::FLOAT32, v1::FLOAT16, v1::BFLOAT16)),
    [](const ::testing::TestParamInfo<std::tuple<std::string, ElementType>>& info) {
      return absl::StrCat(std::get<0>(info.param), "_", ElementTypeName(std::get<1>(info.param)));
    });

TEST(DeviceRowsTest, BadIndicesAndSizesAreInvalidArgument) {
  PS_SKIP_WITHOUT_CUDA_DEVICE();
  v1::RowOptimizer config;
  config.mutable_adagrad();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceRows> rows,
                       DeviceRows::Create(config, 4, 8, 0, "table 'emb'"));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer out, DeviceBuffer::Allocate(0, 2 * 4 * 4));
  EXPECT_THAT(rows->Gather({1, 8}, out),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("table 'emb': row index 8 (position 1) is out of range: 8 rows")));
  EXPECT_THAT(rows->Gather({1, 2, 3}, out),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("needs 48 bytes, the output buffer holds 32")));
  EXPECT_THAT(rows->ScatterApply({1, 2}, out, v1::FLOAT16),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("need 16 bytes, the gradient buffer holds 32")));
  EXPECT_THAT(rows->ScatterApply({1, 2}, out, v1::INT32),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("int32 is not accepted")));
  uint64_t steps[2] = {7, 7};
  ASSERT_OK(rows->ReadRows({1, 2}, nullptr, nullptr, steps));
  EXPECT_EQ(steps[0], 0u);  // nothing was applied
  EXPECT_EQ(steps[1], 0u);
}

}  // namespace
}  // namespace cuda
}  // namespace pserver
