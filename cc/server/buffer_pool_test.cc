// BufferPool: a buffer is reused only once nobody holds it, its size close
// to the one asked for; idle buffers stay within their bounds; a buffer
// outliving its pool is freed; many threads getting and returning buffers
// never share one.
#include "cc/server/buffer_pool.h"

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pserver {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(BufferPoolTest, ABufferIsReusedOnlyOnceItsLastHolderLetGo) {
  BufferPool pool(/*max_idle_bytes=*/64 * kMiB);
  std::shared_ptr<char> first = pool.Get(kMiB);
  std::memset(first.get(), 'a', kMiB);
  std::shared_ptr<char> copy = first;  // a second holder (a retained write)
  first.reset();
  // Still held: a Get of the same size is another buffer, and leaves it be.
  std::shared_ptr<char> second = pool.Get(kMiB);
  EXPECT_NE(second.get(), copy.get());
  std::memset(second.get(), 'b', kMiB);
  EXPECT_EQ(std::string(copy.get(), kMiB), std::string(kMiB, 'a'));
  EXPECT_EQ(pool.reused(), 0u);
  EXPECT_EQ(pool.idle_buffers(), 0u);
  const char* const held = copy.get();
  copy.reset();  // the last holder: back in the pool
  EXPECT_EQ(pool.idle_buffers(), 1u);
  EXPECT_EQ(pool.idle_bytes(), kMiB);
  std::shared_ptr<char> third = pool.Get(kMiB);
  EXPECT_EQ(third.get(), held);
  EXPECT_EQ(pool.reused(), 1u);
  EXPECT_EQ(pool.idle_buffers(), 0u);
}

TEST(BufferPoolTest, OnlyABufferCloseToTheSizeAskedForIsReused) {
  BufferPool pool(/*max_idle_bytes=*/64 * kMiB);
  pool.Get(4 * kMiB).reset();  // idle: 4 MiB
  EXPECT_EQ(pool.idle_bytes(), 4 * kMiB);
  // Too small for 5 MiB, too large for 1 MiB (more than an eighth above).
  std::shared_ptr<char> larger = pool.Get(5 * kMiB);
  std::shared_ptr<char> smaller = pool.Get(kMiB);
  EXPECT_EQ(pool.reused(), 0u);
  EXPECT_EQ(pool.idle_bytes(), 4 * kMiB);
  // Within an eighth: reused.
  std::shared_ptr<char> close = pool.Get(4 * kMiB - 1000);
  EXPECT_EQ(pool.reused(), 1u);
  EXPECT_EQ(pool.idle_bytes(), 0u);
}

TEST(BufferPoolTest, IdleBuffersStayWithinTheirBounds) {
  BufferPool pool(/*max_idle_bytes=*/3 * kMiB);
  {
    std::vector<std::shared_ptr<char>> held;
    for (int i = 0; i < 5; ++i) held.push_back(pool.Get(kMiB));
  }  // all five returned: the oldest two are freed
  EXPECT_EQ(pool.idle_bytes(), 3 * kMiB);
  EXPECT_EQ(pool.idle_buffers(), 3u);
  pool.Get(4 * kMiB).reset();  // larger than the bound: freed
  EXPECT_EQ(pool.idle_bytes(), 3 * kMiB);

  BufferPool many(/*max_idle_bytes=*/64 * kMiB);
  {
    std::vector<std::shared_ptr<char>> held;
    for (size_t i = 0; i < 2 * BufferPool::kMaxIdleBuffers; ++i) held.push_back(many.Get(16));
  }
  EXPECT_EQ(many.idle_buffers(), BufferPool::kMaxIdleBuffers);
}

TEST(BufferPoolTest, ABufferOutlivingItsPoolIsFreed) {
  std::shared_ptr<char> kept;
  {
    BufferPool pool(/*max_idle_bytes=*/64 * kMiB);
    kept = pool.Get(kMiB);
    std::memset(kept.get(), 'k', kMiB);
  }
  EXPECT_EQ(kept.get()[kMiB - 1], 'k');
  kept.reset();  // freed, not returned to the pool that is gone
}

TEST(BufferPoolTest, ThreadsNeverShareABuffer) {
  BufferPool pool(/*max_idle_bytes=*/kMiB);
  constexpr int kThreads = 8;
  constexpr int kRounds = 2000;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        const size_t size = 4096 + static_cast<size_t>(round % 3) * 16;
        std::shared_ptr<char> buffer = pool.Get(size);
        std::memset(buffer.get(), 'A' + t, size);
        std::this_thread::yield();
        for (size_t i = 0; i < size; ++i) {
          if (buffer.get()[i] != 'A' + t) {
            ++mismatches[t];
            break;
          }
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
  EXPECT_GT(pool.reused(), 0u);
  EXPECT_LE(pool.idle_bytes(), kMiB);
}

}  // namespace
}  // namespace pserver
