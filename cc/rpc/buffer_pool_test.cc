#include "cc/rpc/buffer_pool.h"

#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pserver {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

const void* Data(const grpc::Slice& slice) { return slice.begin(); }

TEST(BufferPoolTest, AReleasedBufferServesTheNextTakeOfItsSize) {
  BufferPool pool(64 * kMiB);
  const void* first = nullptr;
  {
    grpc::Slice a = pool.Take(4 * kMiB + 100);  // a payload and its header bytes
    ASSERT_EQ(a.size(), 4 * kMiB + 100);
    std::memset(MutableData(a), 7, a.size());
    first = Data(a);
  }
  EXPECT_EQ(pool.stats().free_buffers, 1u);
  grpc::Slice b = pool.Take(4 * kMiB + 50);
  EXPECT_EQ(Data(b), first);
  EXPECT_EQ(b.size(), 4 * kMiB + 50);
  EXPECT_EQ(pool.stats().reused, 1u);
  EXPECT_EQ(pool.stats().mapped, 1u);
  EXPECT_EQ(pool.stats().free_buffers, 0u);
}

TEST(BufferPoolTest, ABufferIsKeptWhileAnyReferenceToItsSliceLives) {
  BufferPool pool(64 * kMiB);
  std::optional<grpc::Slice> copy;
  {
    grpc::Slice a = pool.Take(kMiB);
    copy.emplace(a);  // a second reference (as a reply sharing the request's bytes)
  }
  EXPECT_EQ(pool.stats().free_buffers, 0u);
  grpc::Slice other = pool.Take(kMiB);
  EXPECT_NE(Data(other), Data(*copy));
  copy.reset();
  EXPECT_EQ(pool.stats().free_buffers, 1u);
}

TEST(BufferPoolTest, SmallRequestsAndAZeroLimitAreNotPooled) {
  BufferPool pool(64 * kMiB);
  { grpc::Slice small = pool.Take(BufferPool::kDefaultMinBytes - 1); }
  EXPECT_EQ(pool.stats().mapped, 0u);
  EXPECT_EQ(pool.stats().free_buffers, 0u);
  BufferPool off(0);
  { grpc::Slice big = off.Take(4 * kMiB); }
  EXPECT_EQ(off.stats().mapped, 0u);
  EXPECT_EQ(off.stats().free_buffers, 0u);
}

TEST(BufferPoolTest, KeepsAtMostMaxBytesDroppingTheOldestFirst) {
  BufferPool pool(2 * kMiB);
  std::vector<grpc::Slice> slices;
  for (int i = 0; i < 3; ++i) slices.push_back(pool.Take(kMiB));
  const void* oldest = Data(slices[0]);
  std::vector<const void*> newer = {Data(slices[1]), Data(slices[2])};
  slices.clear();  // released in order 0, 1, 2
  BufferPool::Stats stats = pool.stats();
  EXPECT_EQ(stats.free_bytes, 2 * kMiB);
  EXPECT_EQ(stats.free_buffers, 2u);
  EXPECT_EQ(stats.unmapped, 1u);
  grpc::Slice a = pool.Take(kMiB), b = pool.Take(kMiB);
  EXPECT_NE(Data(a), oldest);
  EXPECT_NE(Data(b), oldest);
  EXPECT_EQ(pool.stats().reused, 2u);
}

TEST(BufferPoolTest, ABufferOverTheLimitAloneIsUnmapped) {
  BufferPool pool(kMiB);
  { grpc::Slice big = pool.Take(2 * kMiB); }
  EXPECT_EQ(pool.stats().free_buffers, 0u);
  EXPECT_EQ(pool.stats().unmapped, 1u);
}

TEST(BufferPoolTest, AFarLargerBufferDoesNotServeASmallTake) {
  BufferPool pool(64 * kMiB);
  { grpc::Slice big = pool.Take(16 * kMiB); }
  grpc::Slice small = pool.Take(kMiB);
  EXPECT_EQ(pool.stats().reused, 0u);
  EXPECT_EQ(pool.stats().free_bytes, 16 * kMiB);  // still there for the next large frame
}

TEST(BufferPoolTest, SetMaxBytesFreesBuffersBeyondIt) {
  BufferPool pool(8 * kMiB);
  {
    grpc::Slice a = pool.Take(kMiB), b = pool.Take(kMiB), c = pool.Take(kMiB);
  }
  EXPECT_EQ(pool.stats().free_buffers, 3u);
  pool.SetMaxBytes(kMiB);
  EXPECT_EQ(pool.stats().free_buffers, 1u);
  pool.SetMaxBytes(0);
  EXPECT_EQ(pool.stats().free_buffers, 0u);
  EXPECT_EQ(pool.stats().unmapped, 3u);
}

TEST(BufferPoolTest, ASliceMayOutliveItsPool) {
  std::optional<grpc::Slice> kept;
  {
    BufferPool pool(8 * kMiB);
    kept.emplace(pool.Take(kMiB));
    std::memset(MutableData(*kept), 1, kept->size());
  }
  EXPECT_EQ(kept->begin()[kMiB - 1], 1);
  kept.reset();  // unmapped now, not kept by a pool that is gone
}

TEST(BufferPoolTest, ThreadsTakingAndReleasingGetTheirOwnBytes) {
  BufferPool pool(4 * kMiB);
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        grpc::Slice s = pool.Take(kMiB + t * 4096);
        std::memset(MutableData(s), t + 1, s.size());
        std::this_thread::yield();
        for (size_t k = 0; k < s.size(); k += 4096) bad[t] += s.begin()[k] != t + 1;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t;
  EXPECT_LE(pool.stats().free_bytes, 4 * kMiB);
}

TEST(BufferPoolTest, TheProcessPoolKeepsNothingUntilMainSetsALimit) {
  { grpc::Slice s = ProcessBufferPool().Take(4 * kMiB); }
  EXPECT_EQ(ProcessBufferPool().stats().free_buffers, 0u);
}

}  // namespace
}  // namespace pserver
