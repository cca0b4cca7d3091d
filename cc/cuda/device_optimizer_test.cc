// DeviceOptimizer against cc/core's Optimizer: 100 steps of every supported
// rule, with float32, float16 and bfloat16 gradients, from the same start.
//
// Tolerance: 1e-5 relative (plus 1e-7 absolute near zero) on parameters and
// state. The kernels repeat the host's float operations in the host's order,
// compiled without FMA, so they are expected to agree bit for bit (the
// largest difference seen is reported as the test property max_ulps); the
// margin covers clip-by-norm, whose norm the device sums in a different
// order, i.e. at most one float rounding per step: 100 steps x 2^-24 ~ 6e-6.
//
// Needs a CUDA device; skips with the runtime's reason without one.
#include "cc/cuda/device_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/core/optimizer.h"
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
using ::pserver::cuda::testing::Case;

constexpr double kRelTolerance = 1e-5;
constexpr double kAbsTolerance = 1e-7;
constexpr int kSteps = 100;

// Largest difference between host and device floats, checked against the
// tolerance; returns the largest difference in units in the last place.
int64_t ExpectClose(const float* host, const float* device, size_t n, const std::string& what) {
  int64_t max_ulps = 0;
  int failures = 0;
  for (size_t i = 0; i < n; ++i) {
    const double a = host[i], b = device[i];
    const double diff = std::abs(a - b);
    if (!(diff <= kRelTolerance * std::max(std::abs(a), std::abs(b)) + kAbsTolerance)) {
      if (++failures <= 5) {
        ADD_FAILURE() << what << "[" << i << "]: host " << a << ", device " << b;
      }
    }
    const int64_t ulps = std::abs(static_cast<int64_t>(static_cast<int32_t>(FloatBits(host[i]))) -
                                  static_cast<int64_t>(static_cast<int32_t>(FloatBits(device[i]))));
    max_ulps = std::max(max_ulps, ulps);
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << n << " values differ";
  return max_ulps;
}

class DeviceOptimizerAgreementTest
    : public ::testing::TestWithParam<std::tuple<Case, ElementType>> {};

TEST_P(DeviceOptimizerAgreementTest, AgreesWithTheHostOptimizerOver100Steps) {
  PS_SKIP_WITHOUT_CUDA_DEVICE();
  const Case& c = std::get<0>(GetParam());
  const ElementType grad_type = std::get<1>(GetParam());

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Optimizer> host,
                       Optimizer::Create(c.config, v1::FLOAT32, kElements));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceOptimizer> device,
                       DeviceOptimizer::Create(c.config, kElements, 0));
  EXPECT_EQ(device->name(), host->name());
  EXPECT_EQ(device->state_bytes(), host->state_bytes());

  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> host_params(kElements);
  for (float& v : host_params) v = uniform(rng);
  ASSERT_OK_AND_ASSIGN(DeviceBuffer params, DeviceBuffer::Allocate(0, kElements * 4));
  ASSERT_OK(CopyToDevice(params, 0, host_params.data(), kElements * 4));
  ASSERT_OK_AND_ASSIGN(
      DeviceBuffer grad,
      DeviceBuffer::Allocate(0, kElements * (grad_type == v1::FLOAT32 ? 4 : 2)));

  for (int step = 0; step < kSteps; ++step) {
    Gradient g = MakeGradient(grad_type, rng);
    host->Apply(host_params.data(), g.values.data(), std::nullopt);
    ASSERT_OK(CopyToDevice(grad, 0, g.bytes.data(), g.bytes.size()));
    ASSERT_OK(device->Apply(params, grad, grad_type));
  }
  EXPECT_EQ(device->steps(), static_cast<uint64_t>(kSteps));

  std::vector<float> device_params(kElements);
  ASSERT_OK(CopyToHost(device_params.data(), params, 0, kElements * 4));
  int64_t max_ulps = ExpectClose(host_params.data(), device_params.data(), kElements, "params");

  OptimizerState want = host->ExportState();
  ASSERT_OK_AND_ASSIGN(OptimizerState got, device->ExportState());
  EXPECT_EQ(got.steps, want.steps);
  ASSERT_EQ(got.slots.size(), want.slots.size());
  for (size_t s = 0; s < want.slots.size(); ++s) {
    EXPECT_EQ(got.slots[s].first, want.slots[s].first);
    ASSERT_EQ(got.slots[s].second.size(), want.slots[s].second.size());
    max_ulps = std::max(
        max_ulps, ExpectClose(reinterpret_cast<const float*>(want.slots[s].second.data()),
                              reinterpret_cast<const float*>(got.slots[s].second.data()),
                              kElements, "slot " + want.slots[s].first));
  }
  RecordProperty("max_ulps", static_cast<int>(std::min<int64_t>(max_ulps, INT32_MAX)));
  std::printf("%s/%s: largest host/device difference %lld ulp\n", c.name.c_str(),
              ElementTypeName(grad_type).c_str(), static_cast<long long>(max_ulps));
}

INSTANTIATE_TEST_SUITE_P(
    AllRules, DeviceOptimizerAgreementTest,
    ::testing::Combine(::testing::ValuesIn(Cases()),
                       ::testing::Values(v1::FLOAT32, v1::FLOAT16, v1::BFLOAT16)),
    [](const ::testing::TestParamInfo<std::tuple<Case, ElementType>>& info) {
      return absl::StrCat(std::get<0>(info.param).name, "_",
                          ElementTypeName(std::get<1>(info.param)));
    });

TEST(DeviceOptimizerTest, StateMovesBetweenHostAndDevice) {
  PS_SKIP_WITHOUT_CUDA_DEVICE();
  v1::ParameterConfig config;
  config.mutable_optimizer()->mutable_adam();
  const size_t n = 257;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Optimizer> host, Optimizer::Create(config, v1::FLOAT32, n));
  std::vector<float> p(n, 0.5f), g(n, 0.25f);
  for (int i = 0; i < 3; ++i) host->Apply(p.data(), g.data(), std::nullopt);

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceOptimizer> device,
                       DeviceOptimizer::Create(config, n, 0));
  ASSERT_OK(device->ImportState(host->ExportState()));
  EXPECT_EQ(device->steps(), 3u);
  ASSERT_OK_AND_ASSIGN(DeviceBuffer params, DeviceBuffer::Allocate(0, n * 4));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer grad, DeviceBuffer::Allocate(0, n * 4));
  ASSERT_OK(CopyToDevice(params, 0, p.data(), n * 4));
  ASSERT_OK(CopyToDevice(grad, 0, g.data(), n * 4));
  ASSERT_OK(device->Apply(params, grad, v1::FLOAT32));
  host->Apply(p.data(), g.data(), std::nullopt);
  std::vector<float> q(n);
  ASSERT_OK(CopyToHost(q.data(), params, 0, n * 4));
  ExpectClose(p.data(), q.data(), n, "params after import");

  // And back: the host continues from the device's state.
  ASSERT_OK_AND_ASSIGN(OptimizerState state, device->ExportState());
  ASSERT_OK(host->ImportState(state));
  EXPECT_EQ(host->steps(), 4u);
}

TEST(DeviceOptimizerTest, MismatchesAreInvalidArgumentAndChangeNothing) {
  PS_SKIP_WITHOUT_CUDA_DEVICE();
  v1::ParameterConfig config;
  config.mutable_optimizer()->mutable_sgd()->set_momentum(0.9);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceOptimizer> opt, DeviceOptimizer::Create(config, 8, 0));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer params, DeviceBuffer::Allocate(0, 8 * 4));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer short_params, DeviceBuffer::Allocate(0, 7 * 4));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer grad, DeviceBuffer::Allocate(0, 8 * 4));
  EXPECT_THAT(opt->Apply(short_params, grad, v1::FLOAT32),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("parameter buffer holds 28 bytes, 8 float32 values need 32")));
  EXPECT_THAT(opt->Apply(params, grad, v1::FLOAT16),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("gradient buffer holds 32 bytes, 8 float16 values need 16")));
  EXPECT_THAT(opt->Apply(params, grad, v1::FLOAT64),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("gradient element type float64 is not accepted")));
  EXPECT_EQ(opt->steps(), 0u);

  OptimizerState wrong;
  wrong.slots.emplace_back("m", std::string(32, '\0'));
  EXPECT_THAT(opt->ImportState(wrong),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("has state slots [momentum], the state to import has [m]")));
  OptimizerState short_state;
  short_state.slots.emplace_back("momentum", std::string(4, '\0'));
  EXPECT_THAT(opt->ImportState(short_state),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("state slot 'momentum' holds 32 bytes")));
}

}  // namespace
}  // namespace cuda
}  // namespace pserver
