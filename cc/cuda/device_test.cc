// Probing and device choice. These pass on every machine: without a GPU (or
// without CUDA in the build) the calls return a clear status, never crash.
#include "cc/cuda/device.h"

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "cc/cuda/buffer.h"
#include "cc/cuda/device_optimizer.h"
#include "cc/cuda/device_rows.h"
#include "cc/cuda/test_util.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace cuda {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

TEST(CudaDeviceCountTest, ReturnsACountOrAClearReason) {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (count.ok()) {
    EXPECT_GE(*count, 1);
    return;
  }
  EXPECT_EQ(count.status().code(), absl::StatusCode::kUnavailable) << count.status();
  EXPECT_THAT(std::string(count.status().message()), HasSubstr("cudaGetDeviceCount: "));
  // The runtime's own words follow the call's name.
  EXPECT_GT(count.status().message().size(), std::string("cudaGetDeviceCount: ").size() + 5)
      << count.status();
  if (!BuiltWithCuda()) {
    EXPECT_THAT(std::string(count.status().message()), HasSubstr("built without CUDA"));
  }
  RecordProperty("no_device_reason", std::string(count.status().message()));
}

TEST(GetDeviceInfoTest, DescribesDeviceZeroOrSaysWhyNot) {
  absl::StatusOr<DeviceInfo> info = GetDeviceInfo(0);
  if (!CudaDeviceCount().ok()) {
    EXPECT_THAT(info.status(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cudaGetDeviceCount")));
    return;
  }
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->name.empty());
  EXPECT_GT(info->total_memory_bytes, 0u);
  EXPECT_THAT(info->ToString(), HasSubstr("cuda:0 "));
  EXPECT_THAT(GetDeviceInfo(1000).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("does not exist")));
}

TEST(ChooseDeviceTest, CpuProbesNothing) {
  ASSERT_OK_AND_ASSIGN(DeviceChoice choice, ChooseDevice("cpu"));
  EXPECT_FALSE(choice.cuda);
  EXPECT_EQ(choice.name, "cpu");
}

TEST(ChooseDeviceTest, AutoFallsBackToHostWithTheReason) {
  ASSERT_OK_AND_ASSIGN(DeviceChoice choice, ChooseDevice("auto"));
  if (CudaDeviceCount().ok()) {
    EXPECT_TRUE(choice.cuda);
    EXPECT_EQ(choice.name, "cuda:0");
  } else {
    EXPECT_FALSE(choice.cuda);
    EXPECT_EQ(choice.name, "cpu");
    EXPECT_THAT(choice.reason, HasSubstr("no CUDA device ("));
    EXPECT_THAT(choice.reason, HasSubstr("serving from host memory"));
  }
}

TEST(ChooseDeviceTest, CudaWithoutADeviceIsUnavailableNamingTheReason) {
  if (CudaDeviceCount().ok()) GTEST_SKIP() << "this machine has a CUDA device";
  EXPECT_THAT(ChooseDevice("cuda:0").status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("device cuda:0: no CUDA device: cudaGetDeviceCount: ")));
}

TEST(ChooseDeviceTest, RejectsMalformedSpecs) {
  for (const char* spec : {"", "gpu", "cuda", "cuda:", "cuda:-1", "cuda:x", "CPU", "cuda:0 "}) {
    EXPECT_THAT(ChooseDevice(spec).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cpu, auto, cuda:<N>")))
        << "spec '" << spec << "'";
  }
}

TEST(NoDeviceTest, AllocationsAndOptimizersFailCleanly) {
  if (CudaDeviceCount().ok()) GTEST_SKIP() << "this machine has a CUDA device";
  EXPECT_THAT(DeviceBuffer::Allocate(0, 1024).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cudaMalloc(1024 bytes)")));
  EXPECT_THAT(PinnedBuffer::Allocate(1024).status(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cudaMallocHost(1024 bytes)")));
  EXPECT_THAT(Stream::Create(0).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cudaStreamCreate on cuda:0")));
  v1::ParameterConfig config;
  config.mutable_optimizer()->mutable_adam();
  EXPECT_THAT(DeviceOptimizer::Create(config, 16).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cudaSetDevice(0)")));
  v1::RowOptimizer row_config;
  row_config.mutable_adagrad();
  EXPECT_THAT(DeviceRows::Create(row_config, 8, 16, 0, "table 'emb'").status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("table 'emb': cudaSetDevice")));
  // An empty buffer needs no device, and copying into it is a range error.
  ASSERT_OK_AND_ASSIGN(DeviceBuffer empty, DeviceBuffer::Allocate(0, 0));
  float value = 1;
  EXPECT_THAT(CopyToDevice(empty, 0, &value, sizeof(value)),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("past the end of a 0-byte")));
}

// Config errors come before any device call, so they read the same everywhere.
TEST(DeviceOptimizerConfigTest, UnsupportedOptimizersAreNamed) {
  v1::ParameterConfig config;
  config.mutable_optimizer()->mutable_adadelta();
  EXPECT_THAT(DeviceOptimizer::Create(config, 16).status(),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("optimizer adadelta does not run on a CUDA device")));
  config.mutable_optimizer()->mutable_rmsprop();
  EXPECT_THAT(DeviceOptimizer::Create(config, 16).status(),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("optimizer rmsprop")));
  config.mutable_optimizer()->mutable_add();
  EXPECT_THAT(DeviceOptimizer::Create(config, 16).status(),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("optimizer add")));
}

TEST(DeviceOptimizerConfigTest, BadHyperParametersReadAsOnTheHost) {
  v1::ParameterConfig config;
  config.mutable_optimizer()->mutable_adam()->set_beta1(1.5);
  EXPECT_THAT(DeviceOptimizer::Create(config, 16).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("optimizer.adam.beta1")));
  config.Clear();
  config.mutable_optimizer()->mutable_sgd()->set_nesterov(true);
  EXPECT_THAT(DeviceOptimizer::Create(config, 16).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nesterov")));
}

TEST(DeviceRowsConfigTest, FtrlAndBadConfigsAreNamed) {
  v1::RowOptimizer config;
  config.mutable_ftrl();
  EXPECT_THAT(DeviceRows::Create(config, 8, 16, 0, "table 'emb'").status(),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("table 'emb': row optimizer ftrl does not run on a CUDA device")));
  config.mutable_adam()->set_beta2(2);
  EXPECT_THAT(DeviceRows::Create(config, 8, 16, 0, "table 'emb'").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("table 'emb': adam.beta2")));
  config.mutable_sgd();
  EXPECT_THAT(DeviceRows::Create(config, 0, 16, 0, "table 'emb'").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dim must be > 0")));
}

TEST(HalfEncodingTest, TestEncodersRoundTrip) {
  using namespace ::pserver::cuda::testing;  // NOLINT
  for (int k = -2048; k <= 2048; k += 7) {
    const float f = k / 1024.0f;
    EXPECT_EQ(Float16ToFloat(ExactFloat16(f)), f) << k;
  }
  EXPECT_EQ(ExactFloat16(1.0f), 0x3c00);
  EXPECT_EQ(ExactFloat16(-2.0f), 0xc000);
  EXPECT_EQ(ExactBfloat16(1.0f), 0x3f80);
  EXPECT_EQ(Bfloat16ToFloat(0xc000), -2.0f);
}

}  // namespace
}  // namespace cuda
}  // namespace pserver
