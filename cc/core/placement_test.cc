#include "cc/core/placement.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::testing::Each;
using ::testing::Ge;
using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

// The server KeyServer gives, or -1 on an error.
int ServerOrMinusOne(uint64_t key, const v1::Partitioning& partitioning, const Placement& p) {
  absl::StatusOr<int> server = KeyServer(key, partitioning, p);
  return server.ok() ? *server : -1;
}

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

// ---- MODULO: the placement before versioned placements ------------------------

Placement Modulo(int n, size_t block_bytes) {
  v1::Placement spec;
  spec.set_kind(v1::Placement::MODULO);
  spec.set_num_servers(n);
  absl::StatusOr<Placement> placement = Placement::FromSpec(spec, block_bytes);
  EXPECT_TRUE(placement.ok()) << placement.status();
  return *placement;
}

TEST(ModuloPlacementTest, HomeIsTheHashModuloNAndBlockBOnHomePlusB) {
  for (int n = 1; n <= 9; ++n) {
    const Placement placement = Modulo(n, 8);
    EXPECT_EQ(placement.kind(), v1::Placement::MODULO);
    for (int i = 0; i < 200; ++i) {
      const std::string name = absl::StrCat("layer", i, ".weight");
      const int home = placement.HomeServer(name);
      EXPECT_EQ(static_cast<uint64_t>(home), Fnv1a64(name) % static_cast<uint64_t>(n)) << name;
      for (uint32_t b = 0; b < 12; ++b) {
        EXPECT_EQ(placement.ServerOf(name, b), (home + static_cast<int>(b)) % n) << name;
      }
    }
    for (uint64_t key = 0; key < 100; ++key) {
      EXPECT_EQ(static_cast<uint64_t>(placement.HashKeyServer(key)),
                Mix64(key) % static_cast<uint64_t>(n));
    }
  }
}

// ---- the spec -------------------------------------------------------------------

TEST(PlacementSpecTest, DerivedPlacementIsJumpVersionZero) {
  const Placement placement(3, 1 << 20);
  EXPECT_EQ(placement.kind(), v1::Placement::JUMP);
  EXPECT_EQ(placement.version(), 0u);
  const v1::Placement spec = placement.spec();
  EXPECT_EQ(spec.kind(), v1::Placement::JUMP);
  EXPECT_EQ(spec.num_servers(), 3u);
  EXPECT_EQ(spec.version(), 0u);
}

TEST(PlacementSpecTest, FromSpecKeepsKindVersionAndCount) {
  v1::Placement spec;
  spec.set_kind(v1::Placement::JUMP);
  spec.set_num_servers(7);
  spec.set_version(42);
  ASSERT_OK_AND_ASSIGN(Placement placement, Placement::FromSpec(spec, 16));
  EXPECT_EQ(placement.num_servers(), 7);
  EXPECT_EQ(placement.version(), 42u);
  EXPECT_EQ(placement.block_bytes(), 16u);
  EXPECT_EQ(placement.spec().SerializeAsString(), spec.SerializeAsString());
}

TEST(PlacementSpecTest, RefusesAnUnknownKindAndCountsOutOfRange) {
  v1::Placement spec;
  spec.set_num_servers(3);
  spec.set_kind(static_cast<v1::Placement::Kind>(7));
  EXPECT_THAT(Placement::FromSpec(spec, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("placement kind 7")));
  spec.set_kind(v1::Placement::JUMP);
  for (uint32_t n : {0u, kMaxPlacementServers + 1}) {
    spec.set_num_servers(n);
    EXPECT_THAT(Placement::FromSpec(spec, 1).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("num_servers must be in [1, 4096], got ", n))));
  }
  spec.set_num_servers(kMaxPlacementServers);
  EXPECT_OK(Placement::FromSpec(spec, 1).status());
}

TEST(PlacementSpecTest, SameMappingIgnoresVersionAndKindOfOneServer) {
  v1::Placement a, b;
  a.set_kind(v1::Placement::JUMP);
  a.set_num_servers(3);
  b = a;
  b.set_version(9);
  EXPECT_TRUE(SameMapping(a, b));
  b.set_kind(v1::Placement::MODULO);
  EXPECT_FALSE(SameMapping(a, b));
  b.set_kind(v1::Placement::JUMP);
  b.set_num_servers(4);
  EXPECT_FALSE(SameMapping(a, b));
  a.set_num_servers(1);
  b.set_num_servers(1);
  b.set_kind(v1::Placement::MODULO);
  EXPECT_TRUE(SameMapping(a, b));
}

// ---- JUMP: HomeServer / ServerOf / HashKeyServer --------------------------------

TEST(JumpConsistentHashTest, InRangeAndOneBucketIsZero) {
  for (uint64_t key = 0; key < 2000; ++key) {
    EXPECT_EQ(JumpConsistentHash(Mix64(key), 1), 0);
    for (int n : {2, 3, 7, 64, 4096}) {
      const int b = JumpConsistentHash(Mix64(key), n);
      EXPECT_GE(b, 0);
      EXPECT_LT(b, n);
    }
  }
}

TEST(PlacementTest, HomeServerIsInRangeStableAndBlockZerosServer) {
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
      EXPECT_EQ(home, JumpConsistentHash(Mix64(Fnv1a64(name)), n)) << name;
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
  for (uint64_t key = 0; key < 100; ++key) EXPECT_EQ(placement.HashKeyServer(key), 0);
}

TEST(PlacementTest, BlockBLivesOnTheJumpHashOfNamePlusB) {
  for (int n = 1; n <= 5; ++n) {
    const Placement placement(n, 8);
    for (const std::string name : {"w", "embedding", "bias"}) {
      const std::vector<BlockSpec> blocks = placement.Blocks(name, 100, 4);
      ASSERT_EQ(blocks.size(), 50u);
      for (const BlockSpec& block : blocks) {
        EXPECT_EQ(block.server, JumpConsistentHash(Mix64(Fnv1a64(name) + block.index), n))
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
  EXPECT_THAT(per_server, Each(Ge(280)));
  EXPECT_EQ(per_server[0] + per_server[1] + per_server[2], 1000);
}

// Growing by one moves a block or key only onto the new server; shrinking by
// one moves only the last server's.
TEST(PlacementTest, GrowingMovesOnlyOntoTheNewServerAndShrinkingOnlyOffTheLast) {
  for (int n = 1; n <= 16; ++n) {
    const Placement before(n, 1), after(n + 1, 1);
    for (int i = 0; i < 300; ++i) {
      const std::string name = absl::StrCat("p", i);
      for (uint32_t b = 0; b < 8; ++b) {
        const int was = before.ServerOf(name, b);
        const int is = after.ServerOf(name, b);
        if (was != is) EXPECT_EQ(is, n) << name << " block " << b << ": " << n << " -> " << n + 1;
      }
    }
    for (uint64_t key = 0; key < 3000; ++key) {
      const int was = before.HashKeyServer(key);
      const int is = after.HashKeyServer(key);
      if (was != is) EXPECT_EQ(is, n) << "key " << key << ": " << n << " -> " << n + 1;
    }
  }
}

// ---- KeyServer ------------------------------------------------------------------

TEST(KeyServerTest, HashKeysGoThroughThePlacementAndRangesAreCutEvenly) {
  const Placement jump(4, 1);
  const Placement modulo = Modulo(4, 1);
  v1::Partitioning hash;
  for (uint64_t key = 0; key < 500; ++key) {
    EXPECT_EQ(ServerOrMinusOne(key, hash, jump), jump.HashKeyServer(key));
    EXPECT_EQ(ServerOrMinusOne(key, hash, modulo), modulo.HashKeyServer(key));
  }
  v1::Partitioning range;
  range.set_kind(v1::Partitioning::RANGE);
  range.set_range_begin(100);
  range.set_range_end(500);  // 4 ranges of 100
  for (const Placement* p : {&jump, &modulo}) {
    EXPECT_EQ(ServerOrMinusOne(100, range, *p), 0);
    EXPECT_EQ(ServerOrMinusOne(199, range, *p), 0);
    EXPECT_EQ(ServerOrMinusOne(200, range, *p), 1);
    EXPECT_EQ(ServerOrMinusOne(499, range, *p), 3);
    EXPECT_THAT(KeyServer(500, range, *p),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside")));
    EXPECT_THAT(KeyServer(99, range, *p),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[100, 500)")));
  }
}

// ---- bytes moved when N changes, and the spread ---------------------------------

// A deterministic stream of numbers (not std::distributions, whose output
// differs between standard libraries).
class Lcg {
 public:
  explicit Lcg(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return Mix64(state_++); }
  // Log-uniform in [lo, hi].
  uint64_t LogUniform(uint64_t lo, uint64_t hi) {
    const double u = static_cast<double>(Next() >> 11) / static_cast<double>(uint64_t{1} << 53);
    return static_cast<uint64_t>(std::exp(std::log(double(lo)) +
                                          u * (std::log(double(hi)) - std::log(double(lo)))));
  }

 private:
  uint64_t state_;
};

// A model as the servers hold it: dense parameters cut into 1 MiB blocks,
// and one sparse table's rows (HASH partitioned).
struct Model {
  struct Param {
    std::string name;
    uint64_t bytes;
  };
  std::vector<Param> params;
  std::vector<uint64_t> keys;
  uint64_t row_bytes = 0;
};

// 400 parameters: 60% small (256 B .. 64 KiB: biases, norms), 30% medium
// (64 KiB .. 4 MiB), 10% large (4 .. 256 MiB: embeddings, projections),
// float32; a table of 200,000 keys (half sequential ids, half random 64-bit
// ids), rows of 64 float32 with Adam's two slots (768 bytes).
Model RealisticModel() {
  Model model;
  Lcg lcg(16);
  for (int i = 0; i < 400; ++i) {
    const uint64_t pick = lcg.Next() % 10;
    const uint64_t bytes = pick < 6   ? lcg.LogUniform(256, 64 << 10)
                           : pick < 9 ? lcg.LogUniform(64 << 10, 4 << 20)
                                      : lcg.LogUniform(4 << 20, 256 << 20);
    model.params.push_back({absl::StrCat("layer", i / 4, i % 4 == 0 ? ".weight" : ".bias", i),
                            bytes / 4 * 4 + 4});
  }
  for (uint64_t k = 0; k < 100000; ++k) model.keys.push_back(k);
  for (uint64_t k = 0; k < 100000; ++k) model.keys.push_back(lcg.Next());
  model.row_bytes = 64 * 4 * 3;
  return model;
}

constexpr size_t kBlockBytes = size_t{1} << 20;

// Bytes per server under `placement`, and (with `other`) the bytes whose
// server differs between the two.
struct Layout {
  std::vector<uint64_t> per_server;
  uint64_t total = 0;
  uint64_t moved = 0;
};

Layout Measure(const Model& model, const Placement& placement, const Placement& other) {
  Layout layout;
  layout.per_server.assign(placement.num_servers(), 0);
  auto add = [&](int server, int other_server, uint64_t bytes) {
    layout.per_server[server] += bytes;
    layout.total += bytes;
    if (server != other_server) layout.moved += bytes;
  };
  for (const Model::Param& p : model.params) {
    const uint64_t elements = p.bytes / 4;
    for (const BlockSpec& b : placement.Blocks(p.name, elements, 4)) {
      add(b.server, other.ServerOf(p.name, b.index), b.elements * 4);
    }
  }
  v1::Partitioning hash;
  for (uint64_t key : model.keys) {
    add(*KeyServer(key, hash, placement), *KeyServer(key, hash, other), model.row_bytes);
  }
  return layout;
}

double Imbalance(const Layout& layout) {
  const uint64_t most = *std::max_element(layout.per_server.begin(), layout.per_server.end());
  return static_cast<double>(most) * layout.per_server.size() / layout.total;
}

// The table docs/elastic.md quotes: for N = 1..8 -> N+1 and N+1 -> N, the
// fraction of the model's bytes that changes server against the ideal
// (1/(N+1): what the new server, or the leaving one, holds), for JUMP and
// (for comparison) MODULO; and the imbalance (most loaded server / mean).
TEST(PlacementMovementTest, GrowingOrShrinkingByOneMovesAboutTheIdealFraction) {
  const Model model = RealisticModel();
  const Layout one = Measure(model, Placement(1, kBlockBytes), Placement(1, kBlockBytes));
  std::cout << "model: " << model.params.size() << " parameters, " << model.keys.size()
            << " table rows, " << one.total << " bytes\n";
  std::cout << "N -> M | ideal | JUMP moved (x ideal) | MODULO moved (x ideal) | JUMP imbalance at M\n";
  for (int n = 1; n <= 8; ++n) {
    for (const auto& [from, to] : {std::pair<int, int>{n, n + 1}, std::pair<int, int>{n + 1, n}}) {
      const Layout jump = Measure(model, Placement(to, kBlockBytes), Placement(from, kBlockBytes));
      const Layout modulo =
          Measure(model, Modulo(to, kBlockBytes), Modulo(from, kBlockBytes));
      const double ideal = 1.0 / std::max(from, to);
      const double moved = static_cast<double>(jump.moved) / jump.total;
      const double modulo_moved = static_cast<double>(modulo.moved) / modulo.total;
      std::cout << absl::StrFormat("%d -> %d | %.3f | %.3f (%.2fx) | %.3f (%.2fx) | %.3f\n", from,
                                   to, ideal, moved, moved / ideal, modulo_moved,
                                   modulo_moved / ideal, Imbalance(jump));
      EXPECT_LE(moved, 1.5 * ideal) << from << " -> " << to;
      EXPECT_GE(moved, ideal / 1.5) << from << " -> " << to;
      // Even spread: no server above 1.25x the mean.
      EXPECT_LE(Imbalance(jump), 1.25) << to << " servers";
      if (n >= 2) {  // the old placement moved far more than the ideal
        EXPECT_GT(modulo_moved, 2 * ideal) << from << " -> " << to;
      }
    }
  }
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
