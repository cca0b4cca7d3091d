// Device and pinned buffers: host -> device -> host round trips are exact.
// Needs a CUDA device; skips with the runtime's reason without one.
#include "cc/cuda/buffer.h"

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "cc/cuda/test_util.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace cuda {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(n);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

TEST(DeviceBufferTest, PageableRoundTripIsExact) {
  PS_SKIP_WITHOUT_CUDA_DEVICE();
  for (size_t n : {size_t{1}, size_t{4097}, size_t{3} << 20}) {
    const std::vector<uint8_t> in = RandomBytes(n, static_cast<uint32_t>(n));
    ASSERT_OK_AND_ASSIGN(DeviceBuffer d, DeviceBuffer::Allocate(0, n));
    ASSERT_OK(CopyToDevice(d, 0, in.data(), n));
    std::vector<uint8_t> out(n);
    ASSERT_OK(CopyToHost(out.data(), d, 0, n));
    EXPECT_EQ(in, out) << n << " bytes";
  }
}

TEST(DeviceBufferTest, PinnedRoundTripOnAStreamIsExact) {
  PS_SKIP_WITHOUT_CUDA_DEVICE();
  const size_t n = size_t{8} << 20;
  ASSERT_OK_AND_ASSIGN(Stream stream, Stream::Create(0));
  ASSERT_OK_AND_ASSIGN(PinnedBuffer in, PinnedBuffer::Allocate(n));
  ASSERT_OK_AND_ASSIGN(PinnedBuffer out, PinnedBuffer::Allocate(n));
  const std::vector<uint8_t> bytes = RandomBytes(n, 7);
  std::copy(bytes.begin(), bytes.end(), in.as<uint8_t>());
  std::fill(out.as<uint8_t>(), out.as<uint8_t>() + n, 0);
  ASSERT_OK_AND_ASSIGN(DeviceBuffer a, DeviceBuffer::Allocate(0, n));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer b, DeviceBuffer::Allocate(0, n));
  ASSERT_OK(CopyToDevice(a, 0, in.data(), n, &stream));
  ASSERT_OK(CopyDeviceToDevice(b, a, n, &stream));
  ASSERT_OK(CopyToHost(out.data(), b, 0, n, &stream));
  ASSERT_OK(stream.Synchronize());
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), out.as<uint8_t>()));
}

TEST(DeviceBufferTest, FloatsSurviveBitForBit) {
  PS_SKIP_WITHOUT_CUDA_DEVICE();
  std::vector<float> in = {0.0f, -0.0f, 1e-45f, 3.4e38f, -1.5f, 0.1f};
  in.push_back(std::numeric_limits<float>::infinity());
  in.push_back(std::numeric_limits<float>::quiet_NaN());
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d, DeviceBuffer::Allocate(0, in.size() * 4));
  ASSERT_OK(CopyToDevice(d, 0, in.data(), in.size() * 4));
  std::vector<float> out(in.size());
  ASSERT_OK(CopyToHost(out.data(), d, 0, out.size() * 4));
  EXPECT_EQ(std::memcmp(in.data(), out.data(), in.size() * 4), 0);
}

TEST(DeviceBufferTest, OffsetsAndRangeErrors) {
  PS_SKIP_WITHOUT_CUDA_DEVICE();
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d, DeviceBuffer::Allocate(0, 16));
  ASSERT_OK(d.Fill(0));
  const uint32_t value = 0xdeadbeef;
  ASSERT_OK(CopyToDevice(d, 12, &value, 4));
  uint32_t words[4] = {1, 1, 1, 1};
  ASSERT_OK(CopyToHost(words, d, 0, 16));
  EXPECT_THAT(words, ::testing::ElementsAre(0u, 0u, 0u, 0xdeadbeefu));
  EXPECT_THAT(CopyToDevice(d, 13, &value, 4),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("bytes [13, 17)")));
  EXPECT_THAT(CopyToHost(words, d, 17, 0), StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("past the end")));
}

TEST(DeviceBufferTest, MovesTransferOwnership) {
  PS_SKIP_WITHOUT_CUDA_DEVICE();
  ASSERT_OK_AND_ASSIGN(DeviceBuffer a, DeviceBuffer::Allocate(0, 64));
  void* p = a.data();
  DeviceBuffer b = std::move(a);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.size(), 64u);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(a.size(), 0u);
}

TEST(DeviceBufferTest, AnImpossibleAllocationIsResourceExhausted) {
  PS_SKIP_WITHOUT_CUDA_DEVICE();
  EXPECT_THAT(DeviceBuffer::Allocate(0, size_t{1} << 50).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("cudaMalloc")));
}

}  // namespace
}  // namespace cuda
}  // namespace pserver
