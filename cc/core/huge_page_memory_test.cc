#include "cc/core/huge_page_memory.h"

#include <cstdint>
#include <cstring>

#include "gtest/gtest.h"

namespace pserver {
namespace {

TEST(HugePageMemoryTest, LargeArraysStartOnAHugePageBoundaryAndHoldWhatIsWritten) {
  for (size_t bytes : {kHugePageBytes, kHugePageBytes + 4096 + 7, 3 * kHugePageBytes}) {
    HugePageArray a = AllocateHugePageArray(bytes);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.get()) % kHugePageBytes, 0u) << bytes;
    std::memset(a.get(), 0x5A, bytes);
    a[bytes - 1] = 1;
    EXPECT_EQ(a[0], 0x5A);
    EXPECT_EQ(a[bytes / 2], 0x5A);
    EXPECT_EQ(a[bytes - 1], 1);
  }
}

TEST(HugePageMemoryTest, ReservesWholeHugePagesFromOneHugePageOn) {
  EXPECT_EQ(HugePageArrayBytes(0), 0u);
  EXPECT_EQ(HugePageArrayBytes(kHugePageBytes - 1), kHugePageBytes - 1);
  EXPECT_EQ(HugePageArrayBytes(kHugePageBytes), kHugePageBytes);
  EXPECT_EQ(HugePageArrayBytes(kHugePageBytes + 1), 2 * kHugePageBytes);
  EXPECT_EQ(HugePageArrayBytes(3 * (size_t{1} << 20)), 2 * kHugePageBytes);
}

TEST(HugePageMemoryTest, SmallArraysAreUsableAndZeroBytesIsNull) {
  EXPECT_EQ(AllocateHugePageArray(0), nullptr);
  HugePageArray a = AllocateHugePageArray(100);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.get()) % alignof(std::max_align_t), 0u);
  std::memset(a.get(), 7, 100);
  EXPECT_EQ(a[99], 7);
}

}  // namespace
}  // namespace pserver
