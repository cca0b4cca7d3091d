// `pserver --device=` as a user runs it: cuda:N without a GPU exits non-zero
// naming the reason; auto serves from host memory (and says so); a bad
// value is refused. On a machine with a GPU the device cases serve instead.
#include <signal.h>
#include <sys/wait.h>

#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/core/tensor.h"
#include "cc/cuda/device.h"
#include "cc/testing/child_process.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::Duration kTimeout = absl::Seconds(20);

std::unique_ptr<ChildProcess> Spawn(const std::string& device_flag) {
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Spawn(
      RunfilesPath("cc/server/pserver"), {"--host=127.0.0.1", "--port=0", device_flag});
  EXPECT_TRUE(child.ok()) << child.status();
  return child.ok() ? std::move(*child) : nullptr;
}

// Serves a client (one parameter in and out), then stops on SIGTERM with 0.
void ExpectServesAndStops(ChildProcess& child) {
  absl::StatusOr<std::string> address = WaitForPserverAddress(child, 0, absl::Now() + kTimeout);
  ASSERT_TRUE(address.ok()) << address.status();
  ClientOptions options;
  options.servers = {*address};
  options.timeout = absl::Seconds(10);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(options));
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({2}, {1, 2}), v1::ParameterConfig()));
  ASSERT_OK(client->FinishInitParams());
  ASSERT_OK_AND_ASSIGN(Tensor w, client->GetParam("w"));
  EXPECT_EQ(w.num_elements(), 2);
  ASSERT_EQ(kill(child.pid(), SIGTERM), 0);
  ASSERT_OK_AND_ASSIGN(int status, child.WaitForExit(absl::Now() + kTimeout));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << DescribeWaitStatus(status);
}

TEST(PserverDeviceFlagTest, CudaWithoutAGpuExitsNonZeroNamingTheReason) {
  std::unique_ptr<ChildProcess> child = Spawn("--device=cuda:0");
  ASSERT_NE(child, nullptr);
  if (cuda::CudaDeviceCount().ok()) {
    ASSERT_NO_FATAL_FAILURE(ExpectServesAndStops(*child));
    EXPECT_THAT(child->out(), HasSubstr("--device=cuda:0: using cuda:0"));
    return;
  }
  ASSERT_OK_AND_ASSIGN(int status, child->WaitForExit(absl::Now() + kTimeout));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << DescribeWaitStatus(status);
  EXPECT_THAT(child->err(), HasSubstr("pserver: --device=cuda:0: UNAVAILABLE: device cuda:0: "
                                      "no CUDA device: cudaGetDeviceCount: "));
  EXPECT_THAT(child->out(), Not(HasSubstr("listening")));
  std::printf("pserver said: %s", child->err().c_str());
}

TEST(PserverDeviceFlagTest, AutoServesFromHostMemoryWithoutAGpu) {
  std::unique_ptr<ChildProcess> child = Spawn("--device=auto");
  ASSERT_NE(child, nullptr);
  ASSERT_NO_FATAL_FAILURE(ExpectServesAndStops(*child));
  if (cuda::CudaDeviceCount().ok()) {
    EXPECT_THAT(child->out(), HasSubstr("--device=auto: using cuda:0"));
  } else {
    EXPECT_THAT(child->out(), HasSubstr("--device=auto: using cpu: no CUDA device ("));
    EXPECT_THAT(child->out(), HasSubstr("serving from host memory"));
  }
}

TEST(PserverDeviceFlagTest, CpuIsTheDefaultAndSaysNothing) {
  std::unique_ptr<ChildProcess> child = Spawn("--device=cpu");
  ASSERT_NE(child, nullptr);
  ASSERT_NO_FATAL_FAILURE(ExpectServesAndStops(*child));
  EXPECT_THAT(child->out(), Not(HasSubstr("--device")));
}

TEST(PserverDeviceFlagTest, AMalformedDeviceIsRefused) {
  std::unique_ptr<ChildProcess> child = Spawn("--device=gpu0");
  ASSERT_NE(child, nullptr);
  ASSERT_OK_AND_ASSIGN(int status, child->WaitForExit(absl::Now() + kTimeout));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << DescribeWaitStatus(status);
  EXPECT_THAT(child->err(), HasSubstr("INVALID_ARGUMENT: device 'gpu0' is not one of cpu, auto"));
}

}  // namespace
}  // namespace pserver
