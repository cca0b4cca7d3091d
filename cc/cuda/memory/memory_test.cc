// memory.h: without a device every runtime call is UNAVAILABLE naming the
// reason (and argument errors come first); with one, what pointers are and
// queued copies of caller-owned memory.
#include "cc/cuda/memory/memory.h"

#include <vector>

#include "cc/cuda/buffer.h"
#include "cc/cuda/device.h"
#include "cc/cuda/test_util.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace cuda {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

TEST(MemoryTest, ArgumentsAreCheckedFirst) {
  EXPECT_OK(CheckDeviceRange(nullptr, 0, 0));
  EXPECT_THAT(CheckDeviceRange(nullptr, 4, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("null device pointer")));
  EXPECT_EQ(MemoryKindName(MemoryKind::kUnregisteredHost), "host memory");
  EXPECT_EQ(MemoryKindName(MemoryKind::kDevice), "device memory");
}

TEST(MemoryTest, WithoutADeviceCallsAreUnavailable) {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (count.ok()) GTEST_SKIP() << "a CUDA device is present";
  int x = 0;
  EXPECT_THAT(GetPointerInfo(&x).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cudaPointerGetAttributes")));
  EXPECT_THAT(CheckDeviceRange(&x, sizeof x, 0),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  EXPECT_THAT(SynchronizeDevice(0), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

TEST(MemoryTest, PointerKinds) {
  PS_SKIP_WITHOUT_CUDA_DEVICE();
  std::vector<float> host(16);
  ASSERT_OK_AND_ASSIGN(PointerInfo info, GetPointerInfo(host.data()));
  EXPECT_EQ(info.kind, MemoryKind::kUnregisteredHost);
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d, DeviceBuffer::Allocate(0, 64));
  ASSERT_OK_AND_ASSIGN(info, GetPointerInfo(d.data()));
  EXPECT_EQ(info.kind, MemoryKind::kDevice);
  EXPECT_EQ(info.device, 0);
  ASSERT_OK_AND_ASSIGN(PinnedBuffer p, PinnedBuffer::Allocate(64));
  ASSERT_OK_AND_ASSIGN(info, GetPointerInfo(p.data()));
  EXPECT_EQ(info.kind, MemoryKind::kPinnedHost);

  EXPECT_OK(CheckDeviceRange(d.data(), 64, 0));
  EXPECT_THAT(CheckDeviceRange(host.data(), 64, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is not device memory of cuda:0: it is host memory")));
  EXPECT_THAT(CheckDeviceRange(p.data(), 64, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pinned host memory")));
}

TEST(MemoryTest, QueuedCopiesRoundTrip) {
  PS_SKIP_WITHOUT_CUDA_DEVICE();
  ASSERT_OK_AND_ASSIGN(Stream stream, Stream::Create(0));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d, DeviceBuffer::Allocate(0, 1024));
  ASSERT_OK_AND_ASSIGN(PinnedBuffer in, PinnedBuffer::Allocate(1024));
  ASSERT_OK_AND_ASSIGN(PinnedBuffer out, PinnedBuffer::Allocate(1024));
  for (int i = 0; i < 1024; ++i) in.as<unsigned char>()[i] = static_cast<unsigned char>(i * 7);
  ASSERT_OK(CopyFromHostAsync(d.data(), in.data(), 1024, stream));
  ASSERT_OK(CopyToHostAsync(out.data(), d.data(), 1024, stream));
  ASSERT_OK(stream.Synchronize());
  ASSERT_OK(SynchronizeDevice(0));
  for (int i = 0; i < 1024; ++i) {
    ASSERT_EQ(out.as<unsigned char>()[i], static_cast<unsigned char>(i * 7)) << i;
  }
}

}  // namespace
}  // namespace cuda
}  // namespace pserver
