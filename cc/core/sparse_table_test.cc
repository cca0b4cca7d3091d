#include "cc/core/sparse_table.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cc/core/memory_budget.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "pserver/v1/table.pb.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusCodeIs;
using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::Eq;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pointwise;

v1::TableConfig Config(const std::string& text) {
  v1::TableConfig config;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &config)) << text;
  return config;
}

std::unique_ptr<SparseTable> MakeTable(const std::string& text, SparseTableOptions options = {}) {
  absl::StatusOr<std::unique_ptr<SparseTable>> table =
      SparseTable::Create("emb", Config(text), std::move(options));
  EXPECT_TRUE(table.ok()) << table.status();
  return table.ok() ? std::move(*table) : nullptr;
}

template <typename T>
absl::Span<char> Bytes(std::vector<T>& v) {
  return absl::MakeSpan(reinterpret_cast<char*>(v.data()), v.size() * sizeof(T));
}

template <typename T>
absl::string_view ConstBytes(const std::vector<T>& v) {
  return absl::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <typename T = float>
std::vector<T> Pull(SparseTable& table, const std::vector<uint64_t>& keys) {
  std::vector<T> out(keys.size() * table.dim());
  EXPECT_OK(table.Pull(keys, Bytes(out)));
  return out;
}

template <typename T = float>
absl::Status Push(SparseTable& table, const std::vector<uint64_t>& keys,
                  const std::vector<T>& grads) {
  return table.Push(keys, ConstBytes(grads));
}

template <typename T = float>
std::vector<T> Initial(const SparseTable& table, uint64_t key) {
  std::vector<T> out(table.dim());
  table.InitialRow(key, Bytes(out));
  return out;
}

// A clock the test moves by hand.
struct FakeClock {
  absl::Time now = absl::FromUnixSeconds(1'000'000);
  SparseTableOptions Options() {
    SparseTableOptions options;
    options.now = [this] { return now; };
    return options;
  }
};

// ---- configuration -----------------------------------------------------------

TEST(SparseTableTest, CreateNormalizesElementTypeAndReportsSizes) {
  auto table = MakeTable("dim: 8");
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->name(), "emb");
  EXPECT_EQ(table->element_type(), v1::FLOAT32);
  EXPECT_EQ(table->config().element_type(), v1::FLOAT32);
  EXPECT_EQ(table->config().dim(), 8u);
  EXPECT_EQ(table->dim(), 8u);
  EXPECT_EQ(table->row_bytes(), 32u);
  auto table64 = MakeTable("dim: 3 element_type: FLOAT64 optimizer { adam {} }");
  ASSERT_NE(table64, nullptr);
  EXPECT_EQ(table64->row_bytes(), 24u);
  EXPECT_EQ(table64->state_per_row(), 6u);
}

struct BadConfigCase {
  std::string config;
  std::string message;
};

TEST(SparseTableTest, BadConfigsNameTheField) {
  const std::vector<BadConfigCase> cases = {
      {"dim: 0", "table 'emb': dim must be in [1, 1048576], got 0"},
      {"dim: 1048577", "dim must be in [1, 1048576], got 1048577"},
      {"dim: 4 element_type: INT32", "element_type must be FLOAT32 or FLOAT64, got int32"},
      {"dim: 4 element_type: FLOAT16", "element_type must be FLOAT32 or FLOAT64"},
      {"dim: 4 initializer { uniform { low: 1 high: 1 } }",
       "initializer.uniform.low must be < high, got low=1, high=1"},
      {"dim: 4 initializer { uniform { low: nan high: 1 } }",
       "initializer.uniform.low must be finite"},
      {"dim: 4 initializer { normal { stddev: -1 } }",
       "initializer.normal.stddev must be finite and >= 0, got -1"},
      {"dim: 4 initializer { normal { mean: inf stddev: 1 } }",
       "initializer.normal.mean must be finite"},
      {"dim: 4 eviction { ttl_seconds: -1 }",
       "eviction.ttl_seconds must be finite and >= 0, got -1"},
      {"dim: 4 eviction { ttl_seconds: inf }", "eviction.ttl_seconds must be finite"},
      {"dim: 4 optimizer { adam { beta1: 1.5 } }",
       "table 'emb': adam.beta1 must be in [0, 1), got 1.5"},
      {"dim: 4 optimizer { adam { beta2: 1 } }", "adam.beta2 must be in [0, 1), got 1"},
      {"dim: 4 optimizer { adam { epsilon: 0 } }", "adam.epsilon must be finite and > 0"},
      {"dim: 4 optimizer { adam { learning_rate: -0.1 } }",
       "adam.learning_rate must be finite and > 0, got -0.1"},
      {"dim: 4 optimizer { sgd { learning_rate: 0 } }",
       "sgd.learning_rate must be finite and > 0, got 0"},
      {"dim: 4 optimizer { sgd { learning_rate: nan } }", "sgd.learning_rate must be finite"},
      {"dim: 4 optimizer { adagrad { epsilon: -1 } }", "adagrad.epsilon must be finite and > 0"},
      {"dim: 4 optimizer { adagrad { initial_accumulator: -1 } }",
       "adagrad.initial_accumulator must be finite and >= 0, got -1"},
      {"dim: 4 optimizer { ftrl { alpha: 0 } }", "ftrl.alpha must be finite and > 0, got 0"},
      {"dim: 4 optimizer { ftrl { beta: -1 } }", "ftrl.beta must be finite and >= 0"},
      {"dim: 4 optimizer { ftrl { l1: -1 } }", "ftrl.l1 must be finite and >= 0, got -1"},
      {"dim: 4 optimizer { ftrl { l2: -0.5 } }", "ftrl.l2 must be finite and >= 0, got -0.5"},
  };
  for (const BadConfigCase& c : cases) {
    EXPECT_THAT(SparseTable::Create("emb", Config(c.config)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.config;
  }
}

// ---- initializers ------------------------------------------------------------

// Rows of 128 KiB: the one shard of a table with a capacity holds 16 slots
// (2 MiB and more) from the start, so its slots lie in huge-page arrays
// (cc/core/huge_page_memory.h) through every growth and a checkpoint.
TEST(SparseTableTest, LargeRowsKeepTheirValuesThroughGrowthAndCheckpoints) {
  constexpr uint32_t kDim = 32768;
  auto table = MakeTable("dim: 32768 optimizer { add {} } eviction { capacity: 1000 }");
  ASSERT_NE(table, nullptr);
  auto row_of = [](uint64_t key) {
    std::vector<float> row(kDim);
    for (uint32_t c = 0; c < kDim; ++c) row[c] = static_cast<float>(key + 1 + c % 7);
    return row;
  };
  std::vector<uint64_t> keys;
  for (uint64_t key = 0; key < 40; ++key) {  // grows 16 -> 32 -> 64 slots
    keys.push_back(key * 1000003);
    ASSERT_OK(Push(*table, {keys.back()}, row_of(keys.back())));
  }
  auto check = [&](SparseTable& t) {
    const std::vector<float> rows = Pull(t, keys);
    for (size_t i = 0; i < keys.size(); ++i) {
      const std::vector<float> want = row_of(keys[i]);
      ASSERT_TRUE(std::equal(want.begin(), want.end(), rows.begin() + i * kDim)) << keys[i];
    }
  };
  check(*table);
  absl::StatusOr<std::unique_ptr<SparseTable>> restored =
      SparseTable::Deserialize(table->Serialize());
  ASSERT_OK(restored.status());
  check(**restored);
}

TEST(SparseTableTest, ZerosIsTheDefaultInitializer) {
  auto table = MakeTable("dim: 4");
  EXPECT_THAT(Pull(*table, {5, 1ull << 63}), Pointwise(Eq(), std::vector<float>(8, 0.0f)));
}

TEST(SparseTableTest, InitializerIsDeterministicAcrossTablesAndDependsOnSeed) {
  const std::string config = "dim: 16 initializer { normal { stddev: 1 } seed: 7 }";
  auto a = MakeTable(config);
  auto b = MakeTable(config);
  auto c = MakeTable("dim: 16 initializer { normal { stddev: 1 } seed: 8 }");
  const std::vector<uint64_t> keys = {0, 1, 2, 99, 1ull << 40, ~0ull};
  // b reads the keys in another order and creates them in another order.
  std::vector<uint64_t> reversed(keys.rbegin(), keys.rend());
  std::vector<float> from_a = Pull(*a, keys);
  std::vector<float> from_b_reversed = Pull(*b, reversed);
  for (size_t i = 0; i < keys.size(); ++i) {
    const size_t j = keys.size() - 1 - i;
    EXPECT_TRUE(std::equal(from_a.begin() + i * 16, from_a.begin() + (i + 1) * 16,
                           from_b_reversed.begin() + j * 16))
        << "key " << keys[i];
    EXPECT_THAT(Initial(*a, keys[i]),
                ElementsAreArray(from_a.begin() + i * 16, from_a.begin() + (i + 1) * 16));
  }
  std::vector<float> from_c = Pull(*c, keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_FALSE(
        std::equal(from_a.begin() + i * 16, from_a.begin() + (i + 1) * 16, from_c.begin() + i * 16))
        << "seeds 7 and 8 give key " << keys[i] << " the same row";
  }
  // Columns of one row differ from each other.
  EXPECT_NE(from_a[0], from_a[1]);
}

TEST(SparseTableTest, UniformValuesStayInRange) {
  auto table = MakeTable("dim: 8 initializer { uniform { low: -0.25 high: 0.5 } seed: 3 }");
  double sum = 0;
  int n = 0;
  for (uint64_t key = 0; key < 2000; ++key) {
    for (float v : Initial(*table, key)) {
      ASSERT_GE(v, -0.25f);
      ASSERT_LT(v, 0.5f);
      sum += v;
      ++n;
    }
  }
  EXPECT_NEAR(sum / n, 0.125, 0.01);
  // A range narrower than float resolution still stays half-open.
  auto narrow = MakeTable("dim: 4 initializer { uniform { low: 1 high: 1.00000001 } }");
  for (float v : Initial(*narrow, 17)) EXPECT_EQ(v, 1.0f);
}

TEST(SparseTableTest, NormalHasTheConfiguredMeanAndStddev) {
  auto table = MakeTable(
      "dim: 4 element_type: FLOAT64 initializer { normal { mean: 2 stddev: 0.5 } seed: 11 }");
  double sum = 0, sum_sq = 0;
  int n = 0;
  for (uint64_t key = 0; key < 50000; ++key) {
    for (double v : Initial<double>(*table, key * 7919)) {
      sum += v;
      sum_sq += v * v;
      ++n;
    }
  }
  const double mean = sum / n;
  const double stddev = std::sqrt(sum_sq / n - mean * mean);
  EXPECT_NEAR(mean, 2.0, 0.01);
  EXPECT_NEAR(stddev, 0.5, 0.01);
}

// ---- pull and push -------------------------------------------------------------

TEST(SparseTableTest, PullFollowsKeyOrderWithDuplicates) {
  auto table = MakeTable("dim: 2 optimizer { add {} }");
  ASSERT_OK(Push<float>(*table, {1, 2, 3}, {1, 10, 2, 20, 3, 30}));
  EXPECT_THAT(Pull(*table, {3, 1, 3, 2, 1}), ElementsAre(3, 30, 1, 10, 3, 30, 2, 20, 1, 10));
  EXPECT_THAT(Pull(*table, {}), ElementsAre());
  v1::TableStats stats = table->Stats();
  EXPECT_EQ(stats.keys_pulled(), 5u);
  EXPECT_EQ(stats.keys_pushed(), 3u);
}

// Batches of the sizes the server sees (up to 16384 keys), keys spread over
// every internal shard, duplicates within a batch, checked against a plain
// per-key reference (a map of rows, one key at a time). The add optimizer
// on integer-valued gradients keeps every sum exact.
TEST(SparseTableTest, LargeBatchesWithDuplicatesAcrossShardsMatchAPerKeyReference) {
  for (const uint32_t dim : {1u, 3u, 8u, 64u}) {
    SCOPED_TRACE(dim);
    auto table = MakeTable(absl::StrCat("dim: ", dim, " optimizer { add {} }"));
    std::map<uint64_t, std::vector<double>> reference;
    std::mt19937_64 rng(dim);
    // Keys from a range a batch revisits often, spread over the whole
    // 64-bit space (high bits set) so the hash places them everywhere.
    auto key_of = [](uint64_t k) { return (k * 0x9E3779B97F4A7C15ull) ^ (k << 40); };
    for (const size_t batch : {size_t{16384}, size_t{1024}, size_t{5000}, size_t{1}}) {
      std::vector<uint64_t> keys(batch);
      std::vector<float> grads(batch * dim);
      for (size_t i = 0; i < batch; ++i) {
        keys[i] = key_of(rng() % 6000);
        for (uint32_t c = 0; c < dim; ++c) {
          grads[i * dim + c] = static_cast<float>(static_cast<int>(rng() % 7) - 3);
        }
      }
      ASSERT_OK(Push<float>(*table, keys, grads));
      for (size_t i = 0; i < batch; ++i) {
        std::vector<double>& row = reference[keys[i]];
        row.resize(dim, 0.0);
        for (uint32_t c = 0; c < dim; ++c) row[c] += grads[i * dim + c];
      }
      // A pull in another order, with repeats and keys never pushed.
      std::vector<uint64_t> ask(batch + 64);
      for (uint64_t& k : ask) k = key_of(rng() % 6200);
      const std::vector<float> got = Pull(*table, ask);
      for (size_t i = 0; i < ask.size(); ++i) {
        auto it = reference.find(ask[i]);
        for (uint32_t c = 0; c < dim; ++c) {
          const double want = it == reference.end() ? 0.0 : it->second[c];
          ASSERT_EQ(got[i * dim + c], want) << "key " << ask[i] << " column " << c;
        }
      }
    }
    EXPECT_EQ(table->Stats().rows(), reference.size());
  }
}

TEST(SparseTableTest, AddOptimizerIsKeyValueAdd) {
  auto table = MakeTable("dim: 3 element_type: FLOAT64 optimizer { add {} }");
  ASSERT_OK(Push<double>(*table, {9}, {1, 2, 3}));
  ASSERT_OK(Push<double>(*table, {9, 4}, {0.5, -2, 1, 7, 8, 9}));
  EXPECT_THAT(Pull<double>(*table, {9, 4, 5}), ElementsAre(1.5, 0, 4, 7, 8, 9, 0, 0, 0));
}

// A push of k twice with g equals one push with 2 g; for Adam that is not
// the same as two pushes of g.
void ExpectDuplicatesAreSummed(const std::string& config) {
  SCOPED_TRACE(config);
  auto twice = MakeTable(config);
  auto doubled = MakeTable(config);
  auto separate = MakeTable(config);
  const std::vector<float> g = {0.5f, -1.0f, 0.25f};
  ASSERT_OK(Push<float>(*twice, {4, 8, 4}, {0.5f, -1.0f, 0.25f, 1, 1, 1, 0.5f, -1.0f, 0.25f}));
  ASSERT_OK(Push<float>(*doubled, {4, 8}, {1.0f, -2.0f, 0.5f, 1, 1, 1}));
  ASSERT_OK(Push<float>(*separate, {4, 8}, {0.5f, -1.0f, 0.25f, 1, 1, 1}));
  ASSERT_OK(Push<float>(*separate, {4}, g));
  EXPECT_EQ(Pull(*twice, {4, 8}), Pull(*doubled, {4, 8}));
  // One more identical push: both rows have taken exactly one step.
  ASSERT_OK(Push<float>(*twice, {4}, g));
  ASSERT_OK(Push<float>(*doubled, {4}, g));
  EXPECT_EQ(Pull(*twice, {4}), Pull(*doubled, {4}));
  EXPECT_EQ(twice->Stats().keys_pushed(), 4u);
  if (config.find("adam") != std::string::npos) {
    ASSERT_OK(Push<float>(*doubled, {4}, {-0.5f, 1.0f, -0.25f}));
    EXPECT_NE(Pull(*separate, {4}), Pull(*doubled, {4}));
  }
}

TEST(SparseTableTest, PushSumsDuplicateKeysSgd) {
  ExpectDuplicatesAreSummed(
      "dim: 3 optimizer { sgd { learning_rate: 0.1 } } "
      "initializer { uniform { low: -1 high: 1 } }");
}

TEST(SparseTableTest, PushSumsDuplicateKeysAdam) {
  ExpectDuplicatesAreSummed(
      "dim: 3 optimizer { adam { learning_rate: 0.1 } } "
      "initializer { uniform { low: -1 high: 1 } }");
  // Two separate pushes of g differ from one push of 2g under Adam.
  const std::string config = "dim: 1 optimizer { adam { learning_rate: 0.1 } }";
  auto once = MakeTable(config);
  auto two_steps = MakeTable(config);
  ASSERT_OK(Push<float>(*once, {1, 1}, {1, 1}));
  ASSERT_OK(Push<float>(*two_steps, {1}, {1}));
  ASSERT_OK(Push<float>(*two_steps, {1}, {1}));
  EXPECT_NE(Pull(*once, {1}), Pull(*two_steps, {1}));
}

// ---- bad input -------------------------------------------------------------------

TEST(SparseTableTest, WrongSizesAreRejectedAndChangeNothing) {
  auto table = MakeTable("dim: 4 optimizer { add {} }");
  ASSERT_OK(Push<float>(*table, {1}, {1, 2, 3, 4}));
  std::vector<float> small(7);
  EXPECT_THAT(table->Pull({1, 2}, Bytes(small)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("table 'emb'"), HasSubstr("2 keys"), HasSubstr("32 bytes"),
                             HasSubstr("got 28"))));
  EXPECT_THAT(Push<float>(*table, {1, 2}, {1, 1, 1, 1, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("2 keys"), HasSubstr("32 bytes"), HasSubstr("got 20"))));
  v1::TableStats stats = table->Stats();
  EXPECT_EQ(stats.rows(), 1u);
  EXPECT_EQ(stats.keys_pulled(), 0u);
  EXPECT_EQ(stats.keys_pushed(), 1u);
  EXPECT_THAT(Pull(*table, {1}), ElementsAre(1, 2, 3, 4));
}

TEST(SparseTableTest, NonFiniteGradientNamesTheKeyAndAppliesNothing) {
  auto table = MakeTable("dim: 2 optimizer { adam {} } initializer { normal { stddev: 1 } }");
  auto reference = MakeTable("dim: 2 optimizer { adam {} } initializer { normal { stddev: 1 } }");
  ASSERT_OK(Push<float>(*table, {1}, {0.5f, 0.5f}));
  ASSERT_OK(Push<float>(*reference, {1}, {0.5f, 0.5f}));
  const std::vector<float> before = Pull(*table, {1});
  Pull(*reference, {1});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(Push<float>(*table, {1, 77}, {1, 1, 0, nan}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("table 'emb'"), HasSubstr("key 77"), HasSubstr("column 1"),
                             HasSubstr("non-finite"))));
  EXPECT_THAT(Push<float>(*table, {1}, {std::numeric_limits<float>::infinity(), 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key 1 ")));
  EXPECT_EQ(Pull(*table, {1}), before);
  v1::TableStats stats = table->Stats();
  EXPECT_EQ(stats.rows(), 1u);  // key 77 was not created
  EXPECT_EQ(stats.keys_pushed(), 1u);
  // The step count did not move either: the next update matches a table that
  // never saw the bad pushes.
  ASSERT_OK(Push<float>(*table, {1}, {0.25f, -0.25f}));
  ASSERT_OK(Push<float>(*reference, {1}, {0.25f, -0.25f}));
  EXPECT_EQ(Pull(*table, {1}), Pull(*reference, {1}));

  auto table64 = MakeTable("dim: 1 element_type: FLOAT64 optimizer { add {} }");
  const double big = std::numeric_limits<double>::max();
  EXPECT_THAT(Push<double>(*table64, {3, 3}, {big, big}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("key 3"), HasSubstr("overflows"))));
  EXPECT_EQ(table64->Stats().rows(), 0u);
}

// ---- eviction and admission --------------------------------------------------------

TEST(SparseTableTest, TtlEvictsRowsUntouchedForLonger) {
  FakeClock clock;
  auto table = MakeTable(
      "dim: 2 optimizer { add {} } initializer { uniform { low: 0 high: 1 } } "
      "eviction { ttl_seconds: 10 }",
      clock.Options());
  ASSERT_OK(Push<float>(*table, {1}, {5, 5}));
  clock.now += absl::Seconds(5);
  ASSERT_OK(Push<float>(*table, {2}, {5, 5}));
  EXPECT_EQ(table->EvictExpired(), 0u);
  clock.now += absl::Seconds(5);  // key 1 is exactly 10 s old: not longer
  EXPECT_EQ(table->EvictExpired(), 0u);
  clock.now += absl::Seconds(1);
  EXPECT_EQ(table->EvictExpired(), 1u);  // key 1
  v1::TableStats stats = table->Stats();
  EXPECT_EQ(stats.rows(), 1u);
  EXPECT_EQ(stats.evictions(), 1u);
  // A pull keeps key 2 alive.
  Pull(*table, {2});
  clock.now += absl::Seconds(9);
  EXPECT_EQ(table->EvictExpired(), 0u);
  // Key 1 comes back with its initial value; key 2 kept its update.
  EXPECT_EQ(Pull(*table, {1}), Initial(*table, 1));
  EXPECT_EQ(table->Stats().rows(), 1u);         // a read creates no row
  ASSERT_OK(Push<float>(*table, {1}, {0, 0}));  // a push recreates it
  std::vector<float> two = Pull(*table, {2});
  EXPECT_FLOAT_EQ(two[0], Initial(*table, 2)[0] + 5);
  clock.now += absl::Seconds(11);
  EXPECT_EQ(table->EvictExpired(), 2u);
  EXPECT_EQ(table->Stats().rows(), 0u);
  EXPECT_EQ(table->Stats().evictions(), 3u);

  auto no_ttl = MakeTable("dim: 2", clock.Options());
  Pull(*no_ttl, {1});
  clock.now += absl::Hours(1000);
  EXPECT_EQ(no_ttl->EvictExpired(), 0u);
}

TEST(SparseTableTest, CapacityEvictsTheLeastRecentlyTouchedRow) {
  FakeClock clock;
  auto table = MakeTable("dim: 1 optimizer { add {} } eviction { capacity: 3 }", clock.Options());
  ASSERT_OK(Push<float>(*table, {1, 2, 3}, {1, 2, 3}));  // LRU: 1 2 3
  clock.now += absl::Seconds(1);
  Pull(*table, {1});                         // LRU: 2 3 1
  ASSERT_OK(Push<float>(*table, {4}, {4}));  // evicts 2; LRU: 3 1 4
  v1::TableStats stats = table->Stats();
  EXPECT_EQ(stats.rows(), 3u);
  EXPECT_EQ(stats.evictions(), 1u);
  EXPECT_THAT(Pull(*table, {1, 4}), ElementsAre(1, 4));  // LRU: 3 1 4
  EXPECT_THAT(Pull(*table, {2}), ElementsAre(0));        // a read: no row, no eviction
  EXPECT_EQ(table->Stats().evictions(), 1u);
  ASSERT_OK(Push<float>(*table, {2}, {0}));  // recreated; evicts 3
  EXPECT_THAT(Pull(*table, {1, 4}), ElementsAre(1, 4));
  ASSERT_OK(Push<float>(*table, {3}, {0}));  // evicts 2
  EXPECT_THAT(Pull(*table, {3}), ElementsAre(0));
  stats = table->Stats();
  EXPECT_EQ(stats.rows(), 3u);
  EXPECT_EQ(stats.evictions(), 3u);
}

TEST(SparseTableTest, AdmissionWaitsForNSightings) {
  auto table = MakeTable(
      "dim: 2 optimizer { add {} } initializer { uniform { low: 1 high: 2 } } "
      "eviction { admission_count: 3 }");
  const std::vector<float> initial = Initial(*table, 42);
  ASSERT_OK(Push<float>(*table, {42}, {10, 10}));  // sighting 1: dropped
  EXPECT_EQ(
      Pull(*table, {42, 42, 42}),  // sighting 2 (once per call)
      std::vector<float>({initial[0], initial[1], initial[0], initial[1], initial[0], initial[1]}));
  v1::TableStats stats = table->Stats();
  EXPECT_EQ(stats.rows(), 0u);
  EXPECT_EQ(stats.pending_keys(), 1u);
  EXPECT_EQ(stats.bytes(), 0u);
  EXPECT_EQ(stats.admissions(), 0u);
  EXPECT_EQ(stats.admission_refusals(), 1u);  // the push's gradient; a read refuses nothing
  ASSERT_OK(Push<float>(*table, {42, 42}, {1, 1, 2, 2}));  // sighting 3: admitted, applied
  std::vector<float> row = Pull(*table, {42});
  EXPECT_FLOAT_EQ(row[0], initial[0] + 3);
  EXPECT_FLOAT_EQ(row[1], initial[1] + 3);
  stats = table->Stats();
  EXPECT_EQ(stats.rows(), 1u);
  EXPECT_EQ(stats.pending_keys(), 0u);
  EXPECT_EQ(stats.bytes(), 8u);
  EXPECT_EQ(stats.admissions(), 1u);
  EXPECT_EQ(stats.admission_refusals(), 1u);
  ASSERT_OK(Push<float>(*table, {42, 7}, {1, 1, 1, 1}));  // 42 has a row; 7 is refused
  stats = table->Stats();
  EXPECT_EQ(stats.admissions(), 1u);
  EXPECT_EQ(stats.admission_refusals(), 2u);
}

TEST(SparseTableTest, PullsOfUnknownKeysCreateNoRowsAndReadTheInitialValue) {
  const std::string config =
      "dim: 3 optimizer { sgd { learning_rate: 0.5 } } "
      "initializer { normal { stddev: 0.1 } seed: 11 } eviction { capacity: 1000 }";
  auto table = MakeTable(config);
  ASSERT_OK(Push<float>(*table, {7}, {1, 1, 1}));
  const std::vector<float> seven = Pull(*table, {7});
  std::vector<uint64_t> keys(50000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = 1000 + 3 * i;
  const std::vector<float> read = Pull(*table, keys);
  v1::TableStats stats = table->Stats();
  EXPECT_EQ(stats.rows(), 1u);
  EXPECT_EQ(stats.bytes(), 3u * 4);
  EXPECT_EQ(stats.evictions(), 0u);  // nothing was made room for
  EXPECT_EQ(stats.keys_pulled(), 1 + keys.size());
  EXPECT_EQ(Pull(*table, {7}), seven);
  // Each value is the initializer's, and the row a push creates starts from
  // it: a zero gradient leaves exactly the value the read returned.
  auto pushed = MakeTable(config);
  for (size_t i : {size_t{0}, size_t{1}, keys.size() - 1}) {
    const std::vector<float> want(read.begin() + 3 * i, read.begin() + 3 * i + 3);
    EXPECT_EQ(Initial(*table, keys[i]), want);
    ASSERT_OK(Push<float>(*pushed, {keys[i]}, {0, 0, 0}));
    EXPECT_EQ(Pull(*pushed, {keys[i]}), want);
  }
  EXPECT_EQ(pushed->Stats().rows(), 3u);
}

TEST(SparseTableTest, ReadsCountSightingsButOnlyAPushAdmits) {
  auto table = MakeTable("dim: 1 optimizer { add {} } eviction { admission_count: 2 }");
  Pull(*table, {5});
  Pull(*table, {5});
  Pull(*table, {5});
  v1::TableStats stats = table->Stats();
  EXPECT_EQ(stats.rows(), 0u);
  EXPECT_EQ(stats.pending_keys(), 1u);
  ASSERT_OK(Push<float>(*table, {5}, {2}));  // the second sighting: admitted, applied
  EXPECT_THAT(Pull(*table, {5}), ElementsAre(2));
  EXPECT_EQ(table->Stats().rows(), 1u);
  EXPECT_EQ(table->Stats().pending_keys(), 0u);
  EXPECT_EQ(table->Stats().admissions(), 1u);
  EXPECT_EQ(table->Stats().admission_refusals(), 0u);
}

TEST(SparseTableTest, PendingKeysAreBoundedDroppingTheOldest) {
  // capacity 2 -> at most 8 pending keys.
  auto table = MakeTable("dim: 1 optimizer { add {} } eviction { admission_count: 2 capacity: 2 }");
  for (uint64_t key = 100; key < 110; ++key) Pull(*table, {key});
  EXPECT_EQ(table->Stats().pending_keys(), 8u);
  // 100 and 101 were forgotten: a second sighting does not admit them.
  ASSERT_OK(Push<float>(*table, {100, 109}, {0, 0}));
  v1::TableStats stats = table->Stats();
  EXPECT_EQ(stats.rows(), 1u);  // 109
  // 100 again pushed out 102; 109 left for its row: 103..108 and 100.
  EXPECT_EQ(stats.pending_keys(), 7u);
}

TEST(SparseTableTest, StatsCountBytesOfValuesAndState) {
  auto table = MakeTable("dim: 4 optimizer { adam {} }");
  ASSERT_OK(Push<float>(*table, {1, 2, 3}, std::vector<float>(12, 0.0f)));
  Pull(*table, {1, 2, 3});
  v1::TableStats stats = table->Stats();
  EXPECT_EQ(stats.name(), "emb");
  EXPECT_EQ(stats.rows(), 3u);
  EXPECT_EQ(stats.bytes(), 3u * (4 + 8) * 4);
  EXPECT_EQ(stats.keys_pulled(), 3u);
  EXPECT_EQ(stats.min_clock(), 0);  // left unset for the server to fill
  EXPECT_EQ(stats.workers(), 0u);
}

// ---- checkpoints -------------------------------------------------------------------

TEST(SparseTableTest, SerializeRoundTripKeepsRowsStateStepsAndCounters) {
  FakeClock clock;
  const std::string config =
      "dim: 3 optimizer { adam { learning_rate: 0.05 } } "
      "initializer { normal { stddev: 0.1 } seed: 5 } eviction { admission_count: 2 }";
  auto table = MakeTable(config, clock.Options());
  // Rows with different step counts, and keys still pending.
  for (int round = 0; round < 2; ++round) {
    ASSERT_OK(Push<float>(*table, {1, 2, 3}, {0.5f, -1, 2, 1, 1, 1, -3, 0.25f, 0}));
  }
  ASSERT_OK(Push<float>(*table, {1}, {1, 2, 3}));
  Pull(*table, {500, 501});
  const std::string bytes = table->Serialize();

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SparseTable> restored,
                       SparseTable::Deserialize(bytes, clock.Options()));
  EXPECT_EQ(restored->name(), "emb");
  EXPECT_EQ(restored->config().SerializeAsString(), table->config().SerializeAsString());
  v1::TableStats a = table->Stats(), b = restored->Stats();
  EXPECT_EQ(a.SerializeAsString(), b.SerializeAsString());
  EXPECT_EQ(b.rows(), 3u);
  EXPECT_EQ(b.pending_keys(), 2u);
  EXPECT_EQ(restored->Serialize(), bytes);

  v1::SparseTableSnapshot snap;
  ASSERT_TRUE(snap.ParseFromString(bytes));
  EXPECT_EQ(snap.rows(), 3u);
  EXPECT_EQ(snap.state_per_row(), 6u);
  EXPECT_EQ(snap.keys().size(), 3u * 8);
  EXPECT_EQ(snap.values().size(), 3u * 3 * 4);
  EXPECT_EQ(snap.state().size(), 3u * 6 * 4);
  std::map<uint64_t, uint64_t> steps;
  for (size_t i = 0; i < snap.rows(); ++i) {
    uint64_t key, step;
    std::memcpy(&key, snap.keys().data() + 8 * i, 8);
    std::memcpy(&step, snap.steps().data() + 8 * i, 8);
    steps[key] = step;
  }
  // Keys are admitted on their second sighting: the first push was dropped.
  EXPECT_THAT(steps, ElementsAre(std::pair<const uint64_t, uint64_t>(1, 2),
                                 std::pair<const uint64_t, uint64_t>(2, 1),
                                 std::pair<const uint64_t, uint64_t>(3, 1)));

  // Adam continues identically, admission too.
  for (SparseTable* t : {table.get(), restored.get()}) {
    ASSERT_OK(Push<float>(*t, {1, 2, 500}, {0.1f, 0.2f, 0.3f, -1, -2, -3, 1, 1, 1}));
    ASSERT_OK(Push<float>(*t, {3, 500}, {1, 0, -1, 1, 1, 1}));
  }
  EXPECT_EQ(Pull(*table, {1, 2, 3, 500, 501}), Pull(*restored, {1, 2, 3, 500, 501}));
  EXPECT_EQ(table->Stats().SerializeAsString(), restored->Stats().SerializeAsString());
}

// Rows live inline in open-addressing tables that grow and reuse deleted
// slots: values, the LRU order and checkpoints survive both.
TEST(SparseTableTest, RowsAndLruOrderSurviveGrowthAndChurn) {
  FakeClock clock;
  auto table =
      MakeTable("dim: 2 optimizer { add {} } eviction { capacity: 200 }", clock.Options());
  for (uint64_t round = 0; round < 10; ++round) {
    std::vector<uint64_t> keys;
    std::vector<float> values;
    for (uint64_t k = round * 100; k < round * 100 + 100; ++k) {
      keys.push_back(k);
      values.push_back(static_cast<float>(k));
      values.push_back(-static_cast<float>(k));
    }
    ASSERT_OK(Push<float>(*table, keys, values));
  }
  EXPECT_EQ(table->Stats().rows(), 200u);
  EXPECT_EQ(table->Stats().evictions(), 800u);
  std::vector<uint64_t> older, newer;
  for (uint64_t k = 800; k < 900; ++k) older.push_back(k);
  for (uint64_t k = 900; k < 1000; ++k) newer.push_back(k);
  std::vector<float> pulled = Pull(*table, older);  // LRU: 900..999, then 800..899
  for (size_t i = 0; i < older.size(); ++i) {
    ASSERT_EQ(pulled[2 * i], static_cast<float>(older[i]));
    ASSERT_EQ(pulled[2 * i + 1], -static_cast<float>(older[i]));
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SparseTable> restored,
                       SparseTable::Deserialize(table->Serialize(), clock.Options()));
  for (SparseTable* t : {table.get(), restored.get()}) {
    std::vector<uint64_t> fresh;
    for (uint64_t k = 5000; k < 5100; ++k) fresh.push_back(k);
    ASSERT_OK(Push<float>(*t, fresh, std::vector<float>(200, 1)));  // evicts 900..999
    EXPECT_EQ(Pull(*t, {900, 999}), std::vector<float>(4, 0));
    EXPECT_THAT(Pull(*t, {800, 899, 5000}), ElementsAre(800, -800, 899, -899, 1, 1));
    EXPECT_EQ(t->Stats().rows(), 200u);
  }

  // Without a capacity: many rows over every shard, pushed in batches with
  // duplicates, read back whole after a round trip through a checkpoint.
  auto big = MakeTable("dim: 1 optimizer { add {} }");
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 40000; ++k) keys.push_back(k * 7919);
  for (size_t begin = 0; begin < keys.size(); begin += 997) {
    std::vector<uint64_t> batch(keys.begin() + begin,
                                keys.begin() + std::min(keys.size(), begin + 997));
    batch.push_back(batch.front());  // listed twice: summed
    std::vector<float> ones(batch.size(), 1);
    ASSERT_OK(Push<float>(*big, batch, ones));
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SparseTable> copy, SparseTable::Deserialize(big->Serialize()));
  for (SparseTable* t : {big.get(), copy.get()}) {
    EXPECT_EQ(t->Stats().rows(), keys.size());
    std::vector<float> rows = Pull(*t, keys);
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_EQ(rows[i], i % 997 == 0 ? 2 : 1) << "key " << keys[i];
    }
  }
}

TEST(SparseTableTest, SerializeKeepsLruOrderForCapacity) {
  FakeClock clock;
  const std::string config = "dim: 1 optimizer { add {} } eviction { capacity: 3 }";
  auto table = MakeTable(config, clock.Options());
  ASSERT_OK(Push<float>(*table, {1, 2, 3}, {1, 2, 3}));
  Pull(*table, {1});  // LRU: 2 3 1
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SparseTable> restored,
                       SparseTable::Deserialize(table->Serialize(), clock.Options()));
  ASSERT_OK(Push<float>(*restored, {4}, {0}));  // evicts 2
  EXPECT_THAT(Pull(*restored, {1, 3, 4}), ElementsAre(1, 3, 0));
  EXPECT_EQ(restored->Stats().evictions(), 1u);
}

TEST(SparseTableTest, DeserializeRejectsCorruptBytes) {
  auto table = MakeTable("dim: 2 optimizer { adagrad {} } eviction { admission_count: 3 }");
  ASSERT_OK(Push<float>(*table, {1, 2}, {1, 2, 3, 4}));
  ASSERT_OK(Push<float>(*table, {1, 2}, {1, 2, 3, 4}));
  ASSERT_OK(Push<float>(*table, {1, 2}, {1, 2, 3, 4}));
  Pull(*table, {9});
  const std::string good = table->Serialize();
  ASSERT_OK(SparseTable::Deserialize(good).status());

  EXPECT_THAT(SparseTable::Deserialize("\xff\xff\xff\xff"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("does not parse")));
  // Cut short: either it no longer parses or its arrays no longer agree.
  for (size_t size : {good.size() / 2, good.size() - 1, size_t{10}}) {
    EXPECT_THAT(SparseTable::Deserialize(good.substr(0, size)),
                StatusCodeIs(absl::StatusCode::kDataLoss))
        << size;
  }

  auto mutated = [&](auto mutate) {
    v1::SparseTableSnapshot snap;
    EXPECT_TRUE(snap.ParseFromString(good));
    mutate(snap);
    return SparseTable::Deserialize(snap.SerializeAsString());
  };
  EXPECT_THAT(mutated([](v1::SparseTableSnapshot& s) { s.set_rows(3); }),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("table 'emb' snapshot"), HasSubstr("'keys'"))));
  EXPECT_THAT(mutated([](v1::SparseTableSnapshot& s) { s.mutable_values()->pop_back(); }),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("'values'")));
  EXPECT_THAT(mutated([](v1::SparseTableSnapshot& s) { s.mutable_state()->append("1234"); }),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("'state'")));
  EXPECT_THAT(mutated([](v1::SparseTableSnapshot& s) { s.clear_steps(); }),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("'steps'")));
  EXPECT_THAT(mutated([](v1::SparseTableSnapshot& s) { s.set_state_per_row(4); }),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("state_per_row is 4"), HasSubstr("keeps 2"))));
  EXPECT_THAT(mutated([](v1::SparseTableSnapshot& s) { s.mutable_pending_counts()->clear(); }),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("'pending_counts'")));
  EXPECT_THAT(mutated([](v1::SparseTableSnapshot& s) {
                // Both rows get key 1.
                std::string keys = s.keys();
                std::memcpy(&keys[8], keys.data(), 8);
                s.set_keys(keys);
              }),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("appears twice")));
  EXPECT_THAT(mutated([](v1::SparseTableSnapshot& s) {
                const uint32_t count = 7;
                s.set_pending_counts(std::string(reinterpret_cast<const char*>(&count), 4));
              }),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("has count 7")));
  EXPECT_THAT(mutated([](v1::SparseTableSnapshot& s) { s.mutable_config()->set_dim(0); }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dim must be")));
}

// ---- concurrency -------------------------------------------------------------------

TEST(SparseTableTest, ConcurrentPushesAndPullsAddUpExactly) {
  auto table = MakeTable("dim: 4 element_type: FLOAT64 optimizer { add {} }");
  constexpr int kThreads = 4;
  constexpr int kIterations = 2000;
  constexpr uint64_t kKeys = 64;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&table, t] {
      std::vector<double> out;
      for (int i = 0; i < kIterations; ++i) {
        // Overlapping keys, with a duplicate in every push.
        const uint64_t a = (i * 7 + t) % kKeys, b = (i * 13 + 3 * t) % kKeys;
        const std::vector<uint64_t> keys = {a, b, a};
        std::vector<double> grads(3 * 4, 1.0);
        grads[4] = 2.0;  // key b gets 2 in column 0
        EXPECT_OK(table->Push(keys, ConstBytes(grads)));
        out.resize(2 * 4);
        EXPECT_OK(table->Pull({b, a}, Bytes(out)));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();

  std::vector<std::vector<double>> want(kKeys, std::vector<double>(4, 0.0));
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kIterations; ++i) {
      const uint64_t a = (i * 7 + t) % kKeys, b = (i * 13 + 3 * t) % kKeys;
      for (int c = 0; c < 4; ++c) want[a][c] += 2;
      want[b][0] += 2;
      for (int c = 1; c < 4; ++c) want[b][c] += 1;
    }
  }
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < kKeys; ++k) keys.push_back(k);
  std::vector<double> got = Pull<double>(*table, keys);
  for (uint64_t k = 0; k < kKeys; ++k) {
    for (int c = 0; c < 4; ++c) EXPECT_EQ(got[k * 4 + c], want[k][c]) << k << "," << c;
  }
  v1::TableStats stats = table->Stats();
  EXPECT_EQ(stats.keys_pushed(), uint64_t{kThreads} * kIterations * 3);
  EXPECT_EQ(stats.keys_pulled(), uint64_t{kThreads} * kIterations * 2 + kKeys);
}

// Live moves (docs/elastic.md): a part of a table's rows, with their
// optimizer state and step counts, joins another table of the same config.
TEST(SparseTableTest, RowsMoveWithTheirStateAndReplaceOnlyWhatTheyMayReplace) {
  const std::string adam = "dim: 2 optimizer { adam { learning_rate: 0.1 } }";
  std::unique_ptr<SparseTable> from = MakeTable(adam);
  ASSERT_NE(from, nullptr);
  const std::vector<uint64_t> keys = {1, 2, 3};
  const std::vector<float> grads = {0.5f, -1.0f, 0.25f, 2.0f, -0.75f, 1.5f};
  ASSERT_OK(from->Push(keys, ConstBytes(grads)));
  ASSERT_OK(from->Push(keys, ConstBytes(grads)));
  v1::SparseTableSnapshot part;
  ASSERT_TRUE(part.ParseFromString(from->SerializeRows([](uint64_t key) { return key != 3; })));
  EXPECT_EQ(part.rows(), 2u);
  EXPECT_EQ(part.keys_pushed(), 0u);  // counters stay with the whole table
  v1::SparseTableSnapshot whole;
  ASSERT_TRUE(whole.ParseFromString(from->Serialize()));
  EXPECT_EQ(whole.keys_pushed(), 6u);

  std::unique_ptr<SparseTable> to = MakeTable(adam);
  ASSERT_NE(to, nullptr);
  ASSERT_OK_AND_ASSIGN(uint64_t taken, to->MergeRows(part));
  EXPECT_EQ(taken, 2u);
  v1::SparseTableSnapshot moved;
  ASSERT_TRUE(moved.ParseFromString(to->Serialize()));
  EXPECT_EQ(moved.keys(), part.keys());
  EXPECT_EQ(moved.values(), part.values());
  EXPECT_EQ(moved.state(), part.state());  // Adam's moments
  EXPECT_EQ(moved.steps(), part.steps());
  // Both go on alike.
  const std::vector<uint64_t> two = {1, 2};
  const std::vector<float> more = {1.0f, 1.0f, -1.0f, 0.5f};
  ASSERT_OK(from->Push(two, ConstBytes(more)));
  ASSERT_OK(to->Push(two, ConstBytes(more)));
  std::vector<float> a(4), b(4);
  ASSERT_OK(from->Pull(two, Bytes(a)));
  ASSERT_OK(to->Pull(two, Bytes(b)));
  EXPECT_EQ(a, b);

  // Keys held already: refused whole, unless they may be replaced.
  EXPECT_THAT(to->MergeRows(part), StatusIs(absl::StatusCode::kFailedPrecondition,
                                            HasSubstr("key 1 is here already; nothing taken")));
  ASSERT_OK_AND_ASSIGN(taken, to->MergeRows(part, [](uint64_t key) { return key <= 2; }));
  EXPECT_EQ(taken, 2u);
  ASSERT_TRUE(moved.ParseFromString(to->Serialize()));
  EXPECT_EQ(moved.values(), part.values());  // the copy replaced
  EXPECT_EQ(to->Stats().rows(), 2u);
  // Another config, or arrays that disagree: refused.
  std::unique_ptr<SparseTable> sgd = MakeTable("dim: 2");
  ASSERT_NE(sgd, nullptr);
  EXPECT_THAT(sgd->MergeRows(part),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("config")));
  v1::SparseTableSnapshot broken = part;
  broken.mutable_steps()->resize(3);
  std::unique_ptr<SparseTable> empty = MakeTable(adam);
  EXPECT_THAT(empty->MergeRows(broken), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("steps")));
  EXPECT_EQ(empty->Stats().rows(), 0u);
  EXPECT_EQ(to->EraseRows([](uint64_t key) { return key == 1; }), 1u);
  EXPECT_EQ(to->Stats().rows(), 1u);
}

// ---- the row budget (--max_table_row_bytes) --------------------------------------

// A table whose rows count against a budget of `rows` rows of its own size.
struct BudgetedTable {
  std::shared_ptr<MemoryBudget> budget;
  std::unique_ptr<SparseTable> table;
  uint64_t cost = 0;  // bytes a row counts
};

BudgetedTable MakeBudgetedTable(const std::string& text, uint64_t rows,
                                SparseTableOptions options = {}) {
  BudgetedTable t;
  // The cost of a row does not depend on the budget: ask a table without one.
  t.cost = MakeTable(text)->row_budget_bytes();
  t.budget = std::make_shared<MemoryBudget>(rows * t.cost);
  options.row_budget = t.budget;
  t.table = MakeTable(text, std::move(options));
  return t;
}

// A push that would create rows past the budget creates none and applies
// nothing, rows already there included; a push of mostly held keys near the
// limit is counted exactly and taken; duplicates count once; erased rows and
// a dropped table give their bytes back.
TEST(SparseTableTest, PushesPastTheRowBudgetCreateNoRowAndApplyNothing) {
  BudgetedTable t = MakeBudgetedTable("dim: 2 optimizer { sgd { learning_rate: 1 } }", 10);
  SparseTable& table = *t.table;
  EXPECT_EQ(t.cost, 8 + 8 + 8 + 17u);  // key, 2 float32 values, step; LRU links, stamp, ctrl
  ASSERT_OK(Push<float>(table, {0, 1, 2, 3, 4, 5, 6, 7}, std::vector<float>(16, 1)));
  EXPECT_EQ(t.budget->used(), 8 * t.cost);

  // Keys 0 and 1 are held, 100..102 would be 3 more rows: 11 > 10.
  EXPECT_THAT(Push<float>(table, {0, 1, 100, 101, 102}, std::vector<float>(10, 1)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("table 'emb'"), HasSubstr("would create 3 rows"),
                             HasSubstr(absl::StrCat("--max_table_row_bytes=", 10 * t.cost)),
                             HasSubstr("nothing was applied"))));
  EXPECT_EQ(table.Stats().rows(), 8u);
  EXPECT_EQ(table.Stats().keys_pushed(), 8u);
  EXPECT_EQ(t.budget->used(), 8 * t.cost);
  EXPECT_THAT(Pull(table, {0, 1, 100}), ElementsAre(-1, -1, -1, -1, 0, 0));

  // 8 held keys and 2 new ones: the reservation for all 10 keys does not
  // fit, the exact count does.
  ASSERT_OK(Push<float>(table, {0, 1, 2, 3, 4, 5, 6, 7, 100, 101}, std::vector<float>(20, 1)));
  EXPECT_EQ(table.Stats().rows(), 10u);
  EXPECT_EQ(t.budget->used(), 10 * t.cost);
  EXPECT_THAT(Pull(table, {0, 100}), ElementsAre(-2, -2, -1, -1));
  // Held keys alone need no room.
  ASSERT_OK(Push<float>(table, {5, 5, 6}, std::vector<float>(6, 1)));
  EXPECT_THAT(Push<float>(table, {200}, {1, 1}),
              StatusCodeIs(absl::StatusCode::kResourceExhausted));

  // Erased rows give their bytes back; a key listed three times is one row.
  EXPECT_EQ(table.EraseRows([](uint64_t key) { return key < 5; }), 5u);
  EXPECT_EQ(t.budget->used(), 5 * t.cost);
  ASSERT_OK(Push<float>(table, {300, 300, 300, 301, 302, 303, 304}, std::vector<float>(14, 1)));
  EXPECT_EQ(table.Stats().rows(), 10u);
  EXPECT_EQ(t.budget->used(), 10 * t.cost);
  t.table.reset();  // a dropped table gives back every row
  EXPECT_EQ(t.budget->used(), 0u);
}

// Evictions give room back: a table at its capacity grows by nothing, so
// its pushes need no room; TTL eviction frees rows for new ones. Keys not
// admitted yet create no row, and a refused push counts no sighting.
TEST(SparseTableTest, EvictionAndAdmissionCountOnlyTheRowsCreated) {
  FakeClock clock;
  BudgetedTable capped =
      MakeBudgetedTable("dim: 1 optimizer { add {} } eviction { capacity: 4 }", 5, clock.Options());
  ASSERT_OK(Push<float>(*capped.table, {0, 1, 2, 3}, {1, 1, 1, 1}));
  ASSERT_OK(Push<float>(*capped.table, {4, 5, 6, 7, 8, 9}, std::vector<float>(6, 1)));
  EXPECT_EQ(capped.table->Stats().rows(), 4u);
  EXPECT_EQ(capped.table->Stats().evictions(), 6u);
  EXPECT_EQ(capped.budget->used(), 4 * capped.cost);

  BudgetedTable ttl =
      MakeBudgetedTable("dim: 1 optimizer { add {} } eviction { ttl_seconds: 10 }", 2,
                        clock.Options());
  ASSERT_OK(Push<float>(*ttl.table, {1, 2}, {1, 1}));
  EXPECT_THAT(Push<float>(*ttl.table, {3}, {1}),
              StatusCodeIs(absl::StatusCode::kResourceExhausted));
  clock.now += absl::Seconds(11);
  EXPECT_EQ(ttl.table->EvictExpired(), 2u);
  EXPECT_EQ(ttl.budget->used(), 0u);
  ASSERT_OK(Push<float>(*ttl.table, {3}, {1}));
  EXPECT_EQ(ttl.budget->used(), ttl.cost);

  BudgetedTable admitted =
      MakeBudgetedTable("dim: 1 optimizer { add {} } eviction { admission_count: 2 }", 2);
  ASSERT_OK(Push<float>(*admitted.table, {1, 2, 3}, {1, 1, 1}));  // sighted once: no rows
  EXPECT_EQ(admitted.budget->used(), 0u);
  const v1::TableStats before = admitted.table->Stats();
  EXPECT_THAT(Push<float>(*admitted.table, {1, 2, 3}, {1, 1, 1}),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("would create 3 rows")));
  const v1::TableStats after = admitted.table->Stats();
  EXPECT_EQ(after.rows(), 0u);
  EXPECT_EQ(after.pending_keys(), before.pending_keys());
  EXPECT_EQ(after.admissions(), before.admissions());
  EXPECT_EQ(after.admission_refusals(), before.admission_refusals());
  ASSERT_OK(Push<float>(*admitted.table, {1, 2}, {1, 1}));
  EXPECT_EQ(admitted.table->Stats().rows(), 2u);
  EXPECT_EQ(admitted.budget->used(), 2 * admitted.cost);
}

// Rows a snapshot brings in (a checkpoint, a live move) are taken whole,
// past the budget; new rows are then refused until enough are freed.
TEST(SparseTableTest, RowsASnapshotBringsAreTakenWholePastTheRowBudget) {
  const std::string config = "dim: 2 optimizer { add {} }";
  auto source = MakeTable(config);
  ASSERT_OK(Push<float>(*source, {1, 2, 3, 4, 5}, std::vector<float>(10, 1)));
  BudgetedTable t = MakeBudgetedTable(config, 2);
  SparseTableOptions options;
  options.row_budget = t.budget;
  absl::StatusOr<std::unique_ptr<SparseTable>> restored =
      SparseTable::Deserialize(source->Serialize(), options);
  ASSERT_OK(restored.status());
  EXPECT_EQ((*restored)->Stats().rows(), 5u);
  EXPECT_EQ(t.budget->used(), 5 * t.cost);
  EXPECT_THAT(Push<float>(**restored, {6}, {1, 1}),
              StatusCodeIs(absl::StatusCode::kResourceExhausted));
  v1::SparseTableSnapshot snap;
  ASSERT_TRUE(snap.ParseFromString(source->Serialize()));
  ASSERT_OK(t.table->MergeRows(snap).status());
  EXPECT_EQ(t.budget->used(), 10 * t.cost);
  restored->reset();
  t.table.reset();
  EXPECT_EQ(t.budget->used(), 0u);
}

// Pushes racing for the last room never take the tables past it, and the
// budget counts exactly the rows held.
TEST(SparseTableTest, ConcurrentPushesNeverPassTheRowBudget) {
  BudgetedTable t = MakeBudgetedTable("dim: 4 optimizer { add {} }", 1000);
  std::vector<std::thread> threads;
  std::atomic<int> refused{0};
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937_64 rng(w);
      for (int round = 0; round < 200; ++round) {
        std::vector<uint64_t> keys(16);
        for (uint64_t& key : keys) key = rng() % 3000;
        absl::Status status = Push<float>(*t.table, keys, std::vector<float>(64, 1));
        if (!status.ok()) {
          EXPECT_THAT(status, StatusCodeIs(absl::StatusCode::kResourceExhausted));
          refused.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const uint64_t rows = t.table->Stats().rows();
  EXPECT_LE(rows, 1000u);
  EXPECT_GT(refused.load(), 0);  // 3200 pushes of 16 keys over 3000 keys: it filled up
  EXPECT_EQ(t.budget->used(), rows * t.cost);
}

}  // namespace
}  // namespace pserver
