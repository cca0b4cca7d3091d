#include "cc/core/placement.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::testing::Each;
using ::testing::Ge;

// ---- Fnv1a64 --------------------------------------------------------------------

TEST(Fnv1a64Test, MatchesPublishedTestVectors) {
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ull);  // the offset basis
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Fnv1a64("b"), 0xaf63df4c8601f1a5ull);
  EXPECT_EQ(Fnv1a64("foo"), 0xdcb27518fed9d577ull);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ull);
}

TEST(Fnv1a64Test, TreatsBytesAsUnsigned) {
  // A sign-extended 0xff would xor in 0xffffffffffffffff instead of 0xff.
  EXPECT_EQ(Fnv1a64(absl::string_view("\xff", 1)), 0xaf64724c8602eb6eull);
}

TEST(Fnv1a64Test, HashesEmbeddedNulBytes) {
  const std::string with_nul("a\0b", 3);
  EXPECT_NE(Fnv1a64(with_nul), Fnv1a64("a"));
  EXPECT_NE(Fnv1a64(with_nul), Fnv1a64("ab"));
}

// ---- HomeServer / ServerOf ------------------------------------------------------

TEST(PlacementTest, HomeServerIsInRangeStableAndTheHashModuloN) {
  for (int n = 1; n <= 9; ++n) {
    const Placement placement(n, 1 << 20);
    const Placement other_block_size(n, 7);
    EXPECT_EQ(placement.num_servers(), n);
    for (int i = 0; i < 200; ++i) {
      const std::string name = absl::StrCat("layer", i, ".weight");
      const int home = placement.HomeServer(name);
      EXPECT_GE(home, 0) << name;
      EXPECT_LT(home, n) << name;
      EXPECT_EQ(placement.HomeServer(name), home) << name;
      EXPECT_EQ(other_block_size.HomeServer(name), home) << name;
      EXPECT_EQ(static_cast<uint64_t>(home), Fnv1a64(name) % static_cast<uint64_t>(n)) << name;
      EXPECT_EQ(placement.ServerOf(name, 0), home) << name;
    }
  }
}

TEST(PlacementTest, OneServerHoldsEverything) {
  const Placement placement(1, 16);
  EXPECT_EQ(placement.HomeServer("anything"), 0);
  for (const BlockSpec& block : placement.Blocks("anything", 100, 4)) {
    EXPECT_EQ(block.server, 0);
  }
}

TEST(PlacementTest, BlockBLivesOnHomePlusBModuloN) {
  for (int n = 1; n <= 5; ++n) {
    const Placement placement(n, 8);
    for (const std::string name : {"w", "embedding", "bias"}) {
      const int home = placement.HomeServer(name);
      // 100 float32 values, 2 per block: 50 blocks, wrapping around N many times.
      const std::vector<BlockSpec> blocks = placement.Blocks(name, 100, 4);
      ASSERT_EQ(blocks.size(), 50u);
      for (const BlockSpec& block : blocks) {
        EXPECT_EQ(block.server, (home + static_cast<int>(block.index)) % n)
            << name << " block " << block.index << " of " << n << " servers";
        EXPECT_EQ(placement.ServerOf(name, block.index), block.server);
      }
    }
  }
}

TEST(PlacementTest, SpreadsNamesOverAllServers) {
  const Placement placement(3, 1 << 20);
  std::vector<int> per_server(3, 0);
  for (int i = 0; i < 1000; ++i) {
    ++per_server[placement.HomeServer(absl::StrCat("param_", i))];
  }
  EXPECT_THAT(per_server, Each(Ge(200)));
  EXPECT_EQ(per_server[0] + per_server[1] + per_server[2], 1000);
}

// ---- blocks ---------------------------------------------------------------------

TEST(PlacementTest, BlocksCoverAllElementsWithoutGapsOrOverlap) {
  for (size_t element_size : {1, 2, 4, 8}) {
    for (size_t block_bytes : {1, 3, 4, 7, 8, 16, 100, 1024}) {
      const Placement placement(3, block_bytes);
      const uint64_t per_block = placement.BlockElements(element_size);
      ASSERT_EQ(per_block, block_bytes >= element_size ? block_bytes / element_size : 1)
          << block_bytes << " bytes per block, " << element_size << " bytes per element";
      for (uint64_t n : {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{5}, uint64_t{17},
                         uint64_t{128}, uint64_t{129}, uint64_t{1000}, uint64_t{4099}}) {
        SCOPED_TRACE(
            absl::StrCat("n=", n, " element_size=", element_size, " block_bytes=", block_bytes));
        const std::vector<BlockSpec> blocks = placement.Blocks("p", n, element_size);
        const uint64_t want_count = (n + per_block - 1) / per_block;
        ASSERT_EQ(blocks.size(), want_count);
        EXPECT_EQ(placement.BlockCount(n, element_size), want_count);
        uint64_t next = 0;  // the first element not yet covered
        for (size_t i = 0; i < blocks.size(); ++i) {
          const BlockSpec& block = blocks[i];
          EXPECT_EQ(block.index, i);
          EXPECT_EQ(block.count, want_count);
          EXPECT_EQ(block.offset, next);
          EXPECT_GE(block.elements, 1u);
          EXPECT_LE(block.elements, per_block);
          EXPECT_LE(block.elements * element_size, std::max(block_bytes, element_size));
          if (i + 1 < blocks.size()) EXPECT_EQ(block.elements, per_block);
          next = block.offset + block.elements;
        }
        EXPECT_EQ(next, n);
      }
    }
  }
}

TEST(PlacementTest, SmallParameterIsOneBlock) {
  const Placement placement(4, 1 << 20);
  const std::vector<BlockSpec> blocks = placement.Blocks("w", 10, 4);
  ASSERT_EQ(blocks.size(), 1u);
  EXPECT_EQ(blocks[0].index, 0u);
  EXPECT_EQ(blocks[0].count, 1u);
  EXPECT_EQ(blocks[0].offset, 0u);
  EXPECT_EQ(blocks[0].elements, 10u);
  EXPECT_EQ(blocks[0].server, placement.HomeServer("w"));
  // Exactly one block's worth is still one block; one more element is two.
  EXPECT_EQ(placement.BlockCount((1 << 20) / 4, 4), 1u);
  EXPECT_EQ(placement.BlockCount((1 << 20) / 4 + 1, 4), 2u);
}

TEST(PlacementTest, LastBlockIsShorter) {
  // 16-byte blocks hold 4 float32 values; 10 values make blocks of 4, 4 and 2.
  const Placement placement(2, 16);
  const std::vector<BlockSpec> blocks = placement.Blocks("w", 10, 4);
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[0].offset, 0u);
  EXPECT_EQ(blocks[0].elements, 4u);
  EXPECT_EQ(blocks[1].offset, 4u);
  EXPECT_EQ(blocks[1].elements, 4u);
  EXPECT_EQ(blocks[2].offset, 8u);
  EXPECT_EQ(blocks[2].elements, 2u);
  for (const BlockSpec& block : blocks) EXPECT_EQ(block.count, 3u);
}

TEST(PlacementTest, ElementLargerThanBlockGivesOneElementPerBlock) {
  const Placement placement(3, 4);
  EXPECT_EQ(placement.BlockElements(8), 1u);
  const std::vector<BlockSpec> blocks = placement.Blocks("w", 5, 8);
  ASSERT_EQ(blocks.size(), 5u);
  for (uint32_t i = 0; i < 5; ++i) {
    EXPECT_EQ(blocks[i].index, i);
    EXPECT_EQ(blocks[i].count, 5u);
    EXPECT_EQ(blocks[i].offset, i);
    EXPECT_EQ(blocks[i].elements, 1u);
  }
}

TEST(PlacementTest, BlockCountOfAHugeParameterDoesNotOverflow) {
  const Placement placement(2, 1 << 20);
  // 2^40 float32 values in blocks of 2^18 values.
  EXPECT_EQ(placement.BlockCount(uint64_t{1} << 40, 4), uint32_t{1} << 22);
}

}  // namespace
}  // namespace pserver
