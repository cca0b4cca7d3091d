// ReshardCheckpoints on hand-made checkpoints: where every block, row,
// pending key and held-back add goes, what happens to clocks, counters and
// exactly-once sets, and every refusal (with nothing written).
// tests/reshard_test.cc runs it on a real cluster's checkpoints.
#include "cc/core/reshard.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/core/checkpoint.h"
#include "cc/core/parameter_store.h"
#include "cc/core/placement.h"
#include "cc/core/tables.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pserver/v1/table.pb.h"

namespace pserver {
namespace {

namespace fs = std::filesystem;
using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

MATCHER(IsOkAndHoldsNothing, "is OK and holds nullopt") {
  return arg.ok() && !arg->has_value();
}

// A fresh, empty directory for one test under $TEST_TMPDIR.
std::string TestDir() {
  const char* root = std::getenv("TEST_TMPDIR");
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(root != nullptr ? root : "/tmp") /
                 absl::StrCat("reshard.", info->test_suite_name(), ".", info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

ReshardOptions To(uint32_t m) {
  ReshardOptions options;
  options.num_servers = m;
  return options;
}

std::string Bytes(const void* data, size_t n) {
  return std::string(static_cast<const char*>(data), n);
}
template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return Bytes(v.data(), v.size() * sizeof(T));
}

constexpr uint32_t kIn = 3;
constexpr uint32_t kParamBlocks = 7;
constexpr uint32_t kBlockElements = 4;
constexpr uint64_t kRows = 60;

v1::TableConfig EmbConfig() {
  v1::TableConfig config;
  config.set_dim(2);
  config.mutable_optimizer()->mutable_adam()->set_learning_rate(0.1);
  return config;
}

// A value that tells where it came from.
float Value(uint64_t key, int i) { return static_cast<float>(key) * 10 + i + 0.25f; }

// The checkpoints a 3-server cluster of "job" would write: parameter "w" of
// 7 Adam blocks on (home + b) % 3, table "emb" (dim 2, Adam: 4 state values
// per row) with rows 0..59 and pending keys 100..104 on KeyServer(key, 3),
// worker clocks, held-back adds of a BSP table "kv", exactly-once sets.
class ReshardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestDir();
    from_ = dir_ + "/from";
    const Placement placement(kIn, kBlockElements * sizeof(float));
    std::vector<StoreSnapshot> shards(kIn);
    for (uint32_t b = 0; b < kParamBlocks; ++b) {
      BlockSnapshot block;
      block.name = "w";
      block.type = v1::FLOAT32;
      block.shape = {kParamBlocks * kBlockElements};
      block.block.set_index(b);
      block.block.set_count(kParamBlocks);
      block.block.set_offset(b * kBlockElements);
      block.config.mutable_optimizer()->mutable_adam()->set_beta1(0.8);
      std::vector<float> content(kBlockElements), m(kBlockElements), v(kBlockElements);
      for (uint32_t i = 0; i < kBlockElements; ++i) {
        content[i] = b * 100.0f + i;
        m[i] = -content[i];
        v[i] = content[i] / 3;
      }
      block.content = Bytes(content);
      block.optimizer.steps = 5 + b;
      block.optimizer.slots = {{"m", Bytes(m)}, {"v", Bytes(v)}};
      blocks_.push_back(block);
      shards[placement.ServerOf("w", b)].blocks.push_back(block);
      shards[placement.ServerOf("w", b)].initialized = true;
    }
    std::vector<v1::SparseTableSnapshot> emb(kIn), kv(kIn);
    for (uint32_t s = 0; s < kIn; ++s) {
      emb[s].set_name("emb");
      *emb[s].mutable_config() = EmbConfig();
      emb[s].set_state_per_row(4);
      emb[s].set_evictions(s + 1);
      emb[s].set_keys_pulled(10 * (s + 1));
      emb[s].set_keys_pushed(100 * (s + 1));
      kv[s].set_name("kv");
      kv[s].mutable_config()->set_dim(1);
      kv[s].mutable_config()->set_element_type(v1::FLOAT64);
      kv[s].mutable_config()->mutable_optimizer()->mutable_add();
      kv[s].mutable_config()->mutable_consistency()->set_model(v1::Consistency::BSP);
    }
    for (uint64_t key = 0; key < kRows; ++key) {
      v1::SparseTableSnapshot& t = emb[Server(key, kIn)];
      t.set_rows(t.rows() + 1);
      t.mutable_keys()->append(Bytes(&key, 8));
      std::vector<float> values = {Value(key, 0), Value(key, 1)};
      std::vector<float> state = {Value(key, 2), Value(key, 3), Value(key, 4), Value(key, 5)};
      const uint64_t steps = key + 7;
      t.mutable_values()->append(Bytes(values));
      t.mutable_state()->append(Bytes(state));
      t.mutable_steps()->append(Bytes(&steps, 8));
    }
    for (uint64_t key = 100; key < 105; ++key) {
      v1::SparseTableSnapshot& t = emb[Server(key, kIn)];
      const uint32_t count = static_cast<uint32_t>(key - 99);
      t.mutable_pending_keys()->append(Bytes(&key, 8));
      t.mutable_pending_counts()->append(Bytes(&count, 4));
    }
    // Held-back adds of "kv": at clocks 3 and 4, keys 0..11, two adds per
    // key at clock 3 (their order matters for the sum's rounding).
    std::vector<v1::PendingAdds> pending(kIn);
    for (int64_t clock : {3, 4, 3}) {
      std::vector<v1::PendingAdds::Add> adds(kIn);
      for (uint64_t key = 0; key < 12; ++key) {
        const uint32_t s = Server(key, kIn);
        adds[s].set_clock(clock);
        const double value = key + clock * 0.5 + pending[s].adds_size();
        adds[s].mutable_keys()->append(Bytes(&key, 8));
        adds[s].mutable_values()->append(Bytes(&value, 8));
      }
      for (uint32_t s = 0; s < kIn; ++s) *pending[s].add_adds() = adds[s];
    }
    for (uint32_t s = 0; s < kIn; ++s) {
      StoreSnapshot& snap = shards[s];
      snap.extensions["table/emb"] = emb[s].SerializeAsString();
      snap.extensions["table/kv"] = kv[s].SerializeAsString();
      v1::WorkerClocksSnapshot clocks;
      auto* w0 = clocks.add_workers();
      w0->set_id("w0");
      w0->set_clock(4);
      auto* w1 = clocks.add_workers();
      w1->set_id("w1");
      w1->set_clock(s == 1 ? 2 : 3);  // shard 1 saved before w1's last tick
      snap.extensions["clocks/kv"] = clocks.SerializeAsString();
      snap.extensions["pending/kv"] = pending[s].SerializeAsString();
      snap.extensions["pserver.applied_sequences"] = "opaque";
      Write(snap, s, 40 + s);
    }
  }

  static uint32_t Server(uint64_t key, uint32_t n) {
    absl::StatusOr<int> s = KeyServer(key, v1::Partitioning(), Placement(static_cast<int>(n), 1));
    EXPECT_TRUE(s.ok());
    return static_cast<uint32_t>(*s);
  }

  void Write(const StoreSnapshot& snap, uint32_t shard, uint64_t sequence,
             const std::string& cluster = "job", uint32_t num_servers = kIn) {
    CheckpointWriteOptions options;
    options.cluster = cluster;
    options.num_servers = num_servers;
    ASSERT_OK(SaveCheckpoint(snap, absl::StrCat(from_, "/shard-", shard), shard, sequence, options)
                  .status());
  }

  absl::StatusOr<ReshardResult> Reshard(uint32_t m, const std::string& to) {
    ReshardOptions options = To(m);
    options.progress = [this](const std::string& line) { progress_.push_back(line); };
    return ReshardCheckpoints(from_, to, options);
  }

  // What `to` holds: the loaded checkpoint of every shard.
  std::vector<LoadedCheckpoint> Load(const std::string& to, uint32_t m) {
    std::vector<LoadedCheckpoint> out;
    for (uint32_t s = 0; s < m; ++s) {
      absl::StatusOr<LoadedCheckpoint> loaded =
          LoadLatestCheckpoint(absl::StrCat(to, "/shard-", s));
      EXPECT_OK(loaded.status());
      if (!loaded.ok()) return {};
      EXPECT_EQ(loaded->info.shard, s);
      EXPECT_EQ(loaded->info.num_servers, m);
      EXPECT_EQ(loaded->info.cluster, "job");
      EXPECT_EQ(loaded->info.sequence, 43u);  // above the newest input (42)
      out.push_back(*std::move(loaded));
    }
    return out;
  }

  // Nothing at `to`, and no temporary directory left beside it.
  void ExpectNothingWritten(const std::string& to) {
    EXPECT_FALSE(fs::exists(to) && !fs::is_empty(to)) << to;
    for (const auto& e : fs::directory_iterator(fs::path(to).parent_path())) {
      EXPECT_THAT(e.path().filename().string(), Not(HasSubstr("tmp-reshard"))) << e.path();
    }
  }

  std::string dir_, from_;
  std::vector<BlockSnapshot> blocks_;
  std::vector<std::string> progress_;
};

TEST_F(ReshardTest, EveryBlockRowAndAddGoesWhereMServersLookForIt) {
  for (uint32_t m : {1u, 2u, 5u}) {
    SCOPED_TRACE(m);
    const std::string to = absl::StrCat(dir_, "/to-", m);
    ASSERT_OK_AND_ASSIGN(ReshardResult result, Reshard(m, to));
    EXPECT_EQ(result.from_servers, kIn);
    EXPECT_EQ(result.to_servers, m);
    EXPECT_EQ(result.blocks, kParamBlocks);
    EXPECT_EQ(result.table_rows, kRows);
    EXPECT_EQ(result.written.size(), m);
    std::vector<LoadedCheckpoint> out = Load(to, m);
    ASSERT_EQ(out.size(), m);

    // Dense blocks: each exactly once, on Placement(m)'s server, bytes and state intact.
    const Placement placement(static_cast<int>(m), 1);
    size_t found = 0;
    for (uint32_t s = 0; s < m; ++s) {
      for (const BlockSnapshot& got : out[s].snapshot.blocks) {
        ++found;
        EXPECT_EQ(placement.ServerOf(got.name, got.block.index()), static_cast<int>(s));
        const BlockSnapshot& want = blocks_[got.block.index()];
        EXPECT_EQ(got.content, want.content);
        EXPECT_EQ(got.optimizer.steps, want.optimizer.steps);
        EXPECT_EQ(got.optimizer.slots, want.optimizer.slots);
        EXPECT_EQ(got.block.offset(), want.block.offset());
        EXPECT_EQ(got.block.count(), kParamBlocks);
      }
      EXPECT_TRUE(out[s].snapshot.initialized);
      // Exactly-once sets are dropped.
      EXPECT_EQ(out[s].snapshot.extensions.count("pserver.applied_sequences"), 0u);
    }
    EXPECT_EQ(found, kParamBlocks);

    // Table rows, state and steps on KeyServer(key, m); counters summed on 0.
    std::map<uint64_t, uint32_t> row_shard, pending_shard;
    for (uint32_t s = 0; s < m; ++s) {
      v1::SparseTableSnapshot t;
      ASSERT_TRUE(t.ParseFromString(out[s].snapshot.extensions.at("table/emb")));
      EXPECT_EQ(t.config().SerializeAsString(), EmbConfig().SerializeAsString());
      EXPECT_EQ(t.evictions(), s == 0 ? 6u : 0u);
      EXPECT_EQ(t.keys_pulled(), s == 0 ? 60u : 0u);
      EXPECT_EQ(t.keys_pushed(), s == 0 ? 600u : 0u);
      for (uint64_t r = 0; r < t.rows(); ++r) {
        uint64_t key, steps;
        float row[6];
        std::memcpy(&key, t.keys().data() + 8 * r, 8);
        std::memcpy(&steps, t.steps().data() + 8 * r, 8);
        std::memcpy(row, t.values().data() + 8 * r, 8);
        std::memcpy(row + 2, t.state().data() + 16 * r, 16);
        EXPECT_EQ(Server(key, m), s) << key;
        EXPECT_TRUE(row_shard.emplace(key, s).second) << key;
        EXPECT_EQ(steps, key + 7);
        for (int i = 0; i < 6; ++i) EXPECT_EQ(row[i], Value(key, i)) << key << " " << i;
      }
      for (size_t p = 0; p < t.pending_keys().size() / 8; ++p) {
        uint64_t key;
        uint32_t count;
        std::memcpy(&key, t.pending_keys().data() + 8 * p, 8);
        std::memcpy(&count, t.pending_counts().data() + 4 * p, 4);
        EXPECT_EQ(Server(key, m), s);
        EXPECT_EQ(count, key - 99);
        pending_shard.emplace(key, s);
      }
      // The KV table is on every shard, with the same clocks: the lowest.
      ASSERT_EQ(out[s].snapshot.extensions.count("table/kv"), 1u);
      v1::WorkerClocksSnapshot clocks;
      ASSERT_TRUE(clocks.ParseFromString(out[s].snapshot.extensions.at("clocks/kv")));
      ASSERT_EQ(clocks.workers_size(), 2);
      EXPECT_EQ(clocks.workers(0).id(), "w0");
      EXPECT_EQ(clocks.workers(0).clock(), 4);
      EXPECT_EQ(clocks.workers(1).id(), "w1");
      EXPECT_EQ(clocks.workers(1).clock(), 2);
      // Held-back adds: by clock; per key the same values in the same order.
      auto pending = out[s].snapshot.extensions.find("pending/kv");
      std::map<uint64_t, std::vector<std::pair<int64_t, double>>> per_key;
      if (pending != out[s].snapshot.extensions.end()) {
        v1::PendingAdds adds;
        ASSERT_TRUE(adds.ParseFromString(pending->second));
        int64_t last = -1;
        for (const auto& add : adds.adds()) {
          EXPECT_GE(add.clock(), last);
          last = add.clock();
          for (size_t k = 0; k < add.keys().size() / 8; ++k) {
            uint64_t key;
            double value;
            std::memcpy(&key, add.keys().data() + 8 * k, 8);
            std::memcpy(&value, add.values().data() + 8 * k, 8);
            EXPECT_EQ(Server(key, m), s);
            per_key[key].emplace_back(add.clock(), value);
          }
        }
      }
      for (const auto& [key, adds] : per_key) {
        // Input order was clock 3 (add 0), 4 (add 1), 3 (add 2); by clock: 0, 2, 1.
        ASSERT_EQ(adds.size(), 3u);
        EXPECT_EQ(adds[0], std::make_pair(int64_t{3}, key + 1.5));
        EXPECT_EQ(adds[1], std::make_pair(int64_t{3}, key + 1.5 + 2));
        EXPECT_EQ(adds[2], std::make_pair(int64_t{4}, key + 2.0 + 1));
      }
    }
    EXPECT_EQ(row_shard.size(), kRows);
    EXPECT_EQ(pending_shard.size(), 5u);
    EXPECT_THAT(result.notes, Contains(HasSubstr("worker 'w1' has clocks 2..3")));
    EXPECT_THAT(result.notes, Contains(HasSubstr("dropped the exactly-once sets")));
    EXPECT_THAT(progress_, Contains(HasSubstr(absl::StrCat("wrote shard ", m, "/", m))));
    ExpectNothingWritten(absl::StrCat(dir_, "/none"));  // no temporary left
  }
}

TEST_F(ReshardTest, ADamagedNewestCheckpointFallsBackToTheOlderOneAndSaysSo) {
  // Shard 2 gets a newer checkpoint whose data is then damaged.
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint two, LoadLatestCheckpoint(from_ + "/shard-2"));
  Write(two.snapshot, 2, 50);
  const std::string data = from_ + "/shard-2/" + CheckpointDirName(50) + "/data-00000.bin";
  {
    std::fstream f(data, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3);
    f.put('\x7f');
  }
  const std::string to = dir_ + "/to";
  ASSERT_OK_AND_ASSIGN(ReshardResult result, Reshard(2, to));
  EXPECT_THAT(result.inputs, Contains(HasSubstr(CheckpointDirName(42))));
  EXPECT_THAT(result.notes, Contains(AllOf(HasSubstr("skipped"), HasSubstr(CheckpointDirName(50)),
                                           HasSubstr("checksum validation failed"))));
  // Only the damaged one: DATA_LOSS naming it, nothing written.
  fs::remove_all(from_ + "/shard-2/" + CheckpointDirName(42));
  const std::string again = dir_ + "/again";
  EXPECT_THAT(Reshard(2, again).status(),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("no checkpoint in " + from_ + "/shard-2 verifies"),
                             HasSubstr(CheckpointDirName(50)))));
  ExpectNothingWritten(again);
}

TEST_F(ReshardTest, RefusesBadInputAndWritesNothing) {
  const std::string to = dir_ + "/to";
  EXPECT_THAT(Reshard(0, to).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got 0")));
  EXPECT_THAT(Reshard(kMaxReshardServers + 1, to).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[1, 4096]")));
  EXPECT_THAT(Reshard(2, from_).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is the input")));
  EXPECT_THAT(ReshardCheckpoints(dir_ + "/nothing", to, To(2)).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("does not exist")));
  fs::create_directories(dir_ + "/empty");
  EXPECT_THAT(ReshardCheckpoints(dir_ + "/empty", to, To(2)).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no shard-<k> directory")));

  // An output that is not empty, or a file.
  fs::create_directories(to);
  std::ofstream(to + "/keep") << "x";
  EXPECT_THAT(Reshard(2, to).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("is not empty")));
  EXPECT_TRUE(fs::exists(to + "/keep"));
  EXPECT_THAT(Reshard(2, to + "/keep").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not a directory")));
  fs::remove_all(to);

  // A missing shard.
  fs::rename(from_ + "/shard-1", dir_ + "/shard-1-away");
  EXPECT_THAT(Reshard(2, to).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("shard 1 of 3 is missing: no checkpoint in " + from_ +
                                 "/shard-1")));
  ExpectNothingWritten(to);
  fs::rename(dir_ + "/shard-1-away", from_ + "/shard-1");

  // A shard of another cluster, then of another server count.
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint one, LoadLatestCheckpoint(from_ + "/shard-1"));
  Write(one.snapshot, 1, 60, "other");
  EXPECT_THAT(Reshard(2, to).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("different clusters"), HasSubstr("'other'"))));
  fs::remove_all(from_ + "/shard-1/" + CheckpointDirName(60));
  Write(one.snapshot, 1, 61, "job", 4);
  EXPECT_THAT(Reshard(2, to).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("different server counts"), HasSubstr("by 4"))));
  fs::remove_all(from_ + "/shard-1/" + CheckpointDirName(61));
  Write(one.snapshot, 3, 62);  // a shard-3 in a 3-server cluster
  EXPECT_THAT(Reshard(2, to).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("there is shard 3")));
  fs::remove_all(from_ + "/shard-3");
  ExpectNothingWritten(to);
}

TEST_F(ReshardTest, RefusesInconsistentContentAndUnknownExtensions) {
  const std::string to = dir_ + "/to";
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint zero, LoadLatestCheckpoint(from_ + "/shard-0"));
  ASSERT_FALSE(zero.snapshot.blocks.empty());

  StoreSnapshot changed = zero.snapshot;
  changed.extensions["mystery"] = "?";
  Write(changed, 0, 70);
  EXPECT_THAT(Reshard(2, to).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("extension 'mystery'")));
  fs::remove_all(from_ + "/shard-0/" + CheckpointDirName(70));

  changed = zero.snapshot;
  changed.blocks.pop_back();  // a block nobody holds
  Write(changed, 0, 71);
  EXPECT_THAT(Reshard(2, to).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("cut into 7 blocks")));
  fs::remove_all(from_ + "/shard-0/" + CheckpointDirName(71));

  changed = zero.snapshot;
  v1::SparseTableSnapshot emb;
  ASSERT_TRUE(emb.ParseFromString(changed.extensions["table/emb"]));
  emb.mutable_config()->set_dim(3);
  emb.clear_rows();
  emb.clear_keys();
  emb.clear_values();
  emb.clear_state();
  emb.clear_steps();
  changed.extensions["table/emb"] = emb.SerializeAsString();
  Write(changed, 0, 72);
  EXPECT_THAT(Reshard(2, to).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("disagree on table 'emb'")));
  fs::remove_all(from_ + "/shard-0/" + CheckpointDirName(72));
  ExpectNothingWritten(to);
}

TEST_F(ReshardTest, RefusesATableThatWouldPassItsCapacityOnOneServer) {
  // 60 rows with a capacity of 25 per server fit 3 servers (about 20 each)
  // but not 2 (about 30 each).
  for (uint32_t s = 0; s < kIn; ++s) {
    const std::string shard = absl::StrCat(from_, "/shard-", s);
    ASSERT_OK_AND_ASSIGN(LoadedCheckpoint in, LoadLatestCheckpoint(shard));
    v1::SparseTableSnapshot emb;
    ASSERT_TRUE(emb.ParseFromString(in.snapshot.extensions["table/emb"]));
    ASSERT_LE(emb.rows(), 25u);
    emb.mutable_config()->mutable_eviction()->set_capacity(25);
    in.snapshot.extensions["table/emb"] = emb.SerializeAsString();
    Write(in.snapshot, s, 80);
  }
  const std::string to = dir_ + "/to";
  EXPECT_THAT(Reshard(2, to).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("table 'emb' would hold"), HasSubstr("capacity 25"),
                             HasSubstr("reshard to more servers"))));
  ExpectNothingWritten(to);
  EXPECT_OK(Reshard(5, to).status());
}

}  // namespace
}  // namespace pserver

namespace pserver {
namespace {

// A RANGE-partitioned table's rows go by its own partitioning: M equal
// ranges of [range_begin, range_end), not the hash.
v1::Placement Spec(v1::Placement::Kind kind, uint32_t n) {
  v1::Placement spec;
  spec.set_kind(kind);
  spec.set_num_servers(n);
  return spec;
}

// What a server loads at start is exactly what the offline reshard writes
// for its shard.
TEST_F(ReshardTest, ReshardShardIsWhatReshardCheckpointsWritesForThatShard) {
  for (uint32_t m : {2u, 5u}) {
    SCOPED_TRACE(m);
    const std::string to = absl::StrCat(dir_, "/to-", m);
    ASSERT_OK_AND_ASSIGN(ReshardResult written, Reshard(m, to));
    std::vector<LoadedCheckpoint> out = Load(to, m);
    ASSERT_EQ(out.size(), m);
    for (uint32_t k = 0; k < m; ++k) {
      ASSERT_OK_AND_ASSIGN(ReshardedShard shard, ReshardShard(from_, k, To(m)));
      EXPECT_EQ(shard.result.from_servers, kIn);
      EXPECT_EQ(shard.result.sequence, written.sequence);
      EXPECT_TRUE(shard.result.written.empty());
      // (index -> content and slots), in whatever order each lists them.
      auto by_index = [](const StoreSnapshot& snapshot) {
        std::map<uint32_t, std::pair<std::string, std::map<std::string, std::string>>> blocks;
        for (const BlockSnapshot& b : snapshot.blocks) {
          blocks[b.block.index()] = {b.content, {b.optimizer.slots.begin(), b.optimizer.slots.end()}};
        }
        return blocks;
      };
      EXPECT_EQ(shard.snapshot.blocks.size(), out[k].snapshot.blocks.size());
      EXPECT_EQ(by_index(shard.snapshot), by_index(out[k].snapshot));
      EXPECT_EQ(shard.snapshot.extensions, out[k].snapshot.extensions);
      EXPECT_EQ(out[k].info.placement.kind(), v1::Placement::JUMP);
      EXPECT_EQ(out[k].info.placement.num_servers(), m);
    }
  }
  EXPECT_THAT(ReshardShard(from_, 2, To(2)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shard 2 is not one of 2")));
}

TEST(MapsLikeTest, CountsAndKindsAndUnknownCounts) {
  EXPECT_TRUE(MapsLike(Spec(v1::Placement::JUMP, 3), Spec(v1::Placement::JUMP, 3)));
  EXPECT_FALSE(MapsLike(Spec(v1::Placement::JUMP, 3), Spec(v1::Placement::JUMP, 2)));
  EXPECT_FALSE(MapsLike(Spec(v1::Placement::MODULO, 3), Spec(v1::Placement::JUMP, 3)));
  EXPECT_TRUE(MapsLike(Spec(v1::Placement::MODULO, 1), Spec(v1::Placement::JUMP, 1)));
  EXPECT_TRUE(MapsLike(Spec(v1::Placement::JUMP, 0), Spec(v1::Placement::JUMP, 4)));
  EXPECT_FALSE(MapsLike(Spec(v1::Placement::MODULO, 0), Spec(v1::Placement::JUMP, 4)));
}

// A directory holding two generations: the 3 servers' (sequences 40..42)
// and a newer one of 2 servers on shard 0 (sequence 100).
TEST_F(ReshardTest, ServersFindTheGenerationToReshardFromAndReadOnlyIt) {
  const v1::Placement three = Spec(v1::Placement::JUMP, 3);
  const v1::Placement two = Spec(v1::Placement::JUMP, 2);
  EXPECT_THAT(PlacementToReshardFrom(from_, 0, three), IsOkAndHoldsNothing());
  ASSERT_OK_AND_ASSIGN(auto found, PlacementToReshardFrom(from_, 0, two));
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->num_servers(), 3u);
  // Same count, the old kind: resharded too.
  ASSERT_OK_AND_ASSIGN(found, PlacementToReshardFrom(from_, 1, Spec(v1::Placement::MODULO, 3)));
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->kind(), v1::Placement::JUMP);
  // No directory: nothing to reshard.
  EXPECT_THAT(PlacementToReshardFrom(dir_ + "/none", 0, two), IsOkAndHoldsNothing());

  StoreSnapshot empty;
  empty.initialized = true;
  Write(empty, 0, 100, "job", 2);
  // Shard 0 of 2 has its own newer one; shard 1 of 2 still reshards from 3.
  EXPECT_THAT(PlacementToReshardFrom(from_, 0, two), IsOkAndHoldsNothing());
  ASSERT_OK_AND_ASSIGN(found, PlacementToReshardFrom(from_, 1, two));
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->num_servers(), 3u);
  // For 5 servers, the newest other generation is the 2 servers'.
  ASSERT_OK_AND_ASSIGN(found, PlacementToReshardFrom(from_, 0, Spec(v1::Placement::JUMP, 5)));
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->num_servers(), 2u);

  // All generations at once: refused; the 3 servers' alone: read.
  EXPECT_THAT(ReshardShard(from_, 1, To(2)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("checkpoints of different server counts")));
  ReshardOptions options = To(2);
  options.from_placement = three;
  ASSERT_OK_AND_ASSIGN(ReshardedShard shard, ReshardShard(from_, 1, options));
  EXPECT_EQ(shard.result.from_servers, 3u);
  EXPECT_THAT(shard.result.inputs, Not(Contains(HasSubstr("ckpt-00000000000000000100"))));
  EXPECT_EQ(shard.result.sequence, 43u);
  // A generation nobody wrote: NOT_FOUND naming it.
  options.from_placement = Spec(v1::Placement::MODULO, 7);
  EXPECT_THAT(ReshardShard(from_, 1, options).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("num_servers: 7")));
}

TEST(ReshardRangeTest, RowsOfARangeTableGoByItsRanges) {
  const std::string dir = TestDir();
  v1::TableConfig config;
  config.set_dim(1);
  config.mutable_partitioning()->set_kind(v1::Partitioning::RANGE);
  config.mutable_partitioning()->set_range_begin(1000);
  config.mutable_partitioning()->set_range_end(1300);
  for (uint32_t s = 0; s < 3; ++s) {
    v1::SparseTableSnapshot t;
    t.set_name("r");
    *t.mutable_config() = config;
    for (uint64_t key = 1000 + 100 * s; key < 1100 + 100 * s; key += 10) {
      const float value = static_cast<float>(key);
      const uint64_t steps = 1;
      t.set_rows(t.rows() + 1);
      t.mutable_keys()->append(Bytes(&key, 8));
      t.mutable_values()->append(Bytes(&value, 4));
      t.mutable_steps()->append(Bytes(&steps, 8));
    }
    StoreSnapshot snap;
    snap.extensions["table/r"] = t.SerializeAsString();
    CheckpointWriteOptions options;
    options.num_servers = 3;
    ASSERT_OK(
        SaveCheckpoint(snap, absl::StrCat(dir, "/from/shard-", s), s, 1, options).status());
  }
  ASSERT_OK(ReshardCheckpoints(dir + "/from", dir + "/to", To(2)).status());
  uint64_t rows = 0;
  for (uint32_t s = 0; s < 2; ++s) {
    ASSERT_OK_AND_ASSIGN(LoadedCheckpoint out,
                         LoadLatestCheckpoint(absl::StrCat(dir, "/to/shard-", s)));
    v1::SparseTableSnapshot t;
    ASSERT_TRUE(t.ParseFromString(out.snapshot.extensions.at("table/r")));
    for (uint64_t r = 0; r < t.rows(); ++r) {
      uint64_t key;
      std::memcpy(&key, t.keys().data() + 8 * r, 8);
      EXPECT_EQ(key < 1150 ? 0u : 1u, s) << key;  // [1000, 1150) and [1150, 1300)
      ++rows;
    }
  }
  EXPECT_EQ(rows, 30u);
}

}  // namespace
}  // namespace pserver
