#include "cc/core/checkpoint_set.h"

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/core/checkpoint.h"
#include "cc/core/parameter_store.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pserver/v1/table.pb.h"

namespace pserver {
namespace {

namespace fs = std::filesystem;
using ::pserver::testing::IsOk;
using ::pserver::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A fresh, empty directory for one test under $TEST_TMPDIR.
std::string TestDir() {
  const char* root = std::getenv("TEST_TMPDIR");
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(root != nullptr ? root : "/tmp") /
                 absl::StrCat("checkpoint_set.", info->test_suite_name(), ".", info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string Floats(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// Block `index` of `count` of float32 parameter `name` of `shape`, at `offset`.
BlockSnapshot Block(const std::string& name, Shape shape, uint32_t index, uint32_t count,
                    uint64_t offset, std::vector<float> values) {
  BlockSnapshot b;
  b.name = name;
  b.type = v1::FLOAT32;
  b.shape = std::move(shape);
  b.block.set_index(index);
  b.block.set_count(count);
  b.block.set_offset(offset);
  b.content = Floats(std::move(values));
  return b;
}

// Rows of a float32 table of dim 2, as a checkpoint extension.
std::string TableRows(std::vector<uint64_t> keys, std::vector<float> values) {
  v1::SparseTableSnapshot t;
  t.set_name("t");
  t.mutable_config()->set_dim(2);
  t.set_rows(keys.size());
  t.set_keys(std::string(reinterpret_cast<const char*>(keys.data()), keys.size() * 8));
  t.set_values(Floats(std::move(values)));
  return t.SerializeAsString();
}

// Two shards under dir/shard-0 and dir/shard-1: "w" float32[2, 3] cut into
// two blocks (one per shard), "b" float32[2] on shard 0, table "t" over
// both. Shard 0 also holds an older checkpoint with other values.
void WriteCluster(const std::string& dir) {
  StoreSnapshot old0;
  old0.blocks = {Block("w", {2, 3}, 0, 2, 0, {-1, -1, -1})};
  ASSERT_THAT(SaveCheckpoint(old0, dir + "/shard-0", 0, 1).status(), IsOk());

  StoreSnapshot s0;
  s0.initialized = true;
  s0.blocks = {Block("b", {2}, 0, 1, 0, {7, 8}), Block("w", {2, 3}, 0, 2, 0, {1, 2, 3})};
  s0.extensions["table/t"] = TableRows({9, 3}, {90, 91, 30, 31});
  ASSERT_THAT(SaveCheckpoint(s0, dir + "/shard-0", 0, 2).status(), IsOk());

  StoreSnapshot s1;
  s1.initialized = true;
  s1.blocks = {Block("w", {2, 3}, 1, 2, 3, {4, 5, 6})};
  s1.extensions["table/t"] = TableRows({5}, {50, 51});
  ASSERT_THAT(SaveCheckpoint(s1, dir + "/shard-1", 1, 2).status(), IsOk());
}

TEST(CheckpointSetTest, OpensTheNewestCheckpointOfEveryShard) {
  const std::string dir = TestDir();
  WriteCluster(dir);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointSet> set, CheckpointSet::Open(dir));
  ASSERT_EQ(set->num_checkpoints(), 2u);
  EXPECT_EQ(set->checkpoint_path(0), dir + "/shard-0/" + CheckpointDirName(2));
  EXPECT_EQ(set->checkpoint_path(1), dir + "/shard-1/" + CheckpointDirName(2));
  EXPECT_THAT(set->param_names(), ElementsAre("b", "w"));
  EXPECT_THAT(set->table_names(), ElementsAre("t"));
  EXPECT_THAT(set->Verify(), IsOk());
}

TEST(CheckpointSetTest, ReadsAParameterFromTheBlocksOfEveryShard) {
  const std::string dir = TestDir();
  WriteCluster(dir);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointSet> set, CheckpointSet::Open(dir));
  ASSERT_OK_AND_ASSIGN(CheckpointSet::ParamInfo info, set->param_info("w"));
  EXPECT_EQ(info.type, v1::FLOAT32);
  EXPECT_THAT(info.shape, ElementsAre(2, 3));
  std::vector<float> w(6);
  ASSERT_THAT(set->ReadParam("w", absl::MakeSpan(reinterpret_cast<char*>(w.data()), 24)), IsOk());
  EXPECT_THAT(w, ElementsAre(1, 2, 3, 4, 5, 6));
}

TEST(CheckpointSetTest, UnknownNamesAreNotFound) {
  const std::string dir = TestDir();
  WriteCluster(dir);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointSet> set, CheckpointSet::Open(dir));
  EXPECT_THAT(set->param_info("nope").status(),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("parameter 'nope' is not in the checkpoint")));
  EXPECT_THAT(
      set->table_info("nope").status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("table 'nope' is not in the checkpoint")));
}

TEST(CheckpointSetTest, OneShardAloneMissesABlockAndWritesNothing) {
  const std::string dir = TestDir();
  WriteCluster(dir);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointSet> set, CheckpointSet::Open(dir + "/shard-1"));
  EXPECT_EQ(set->num_checkpoints(), 1u);
  std::vector<float> w(6, 0);
  EXPECT_THAT(set->ReadParam("w", absl::MakeSpan(reinterpret_cast<char*>(w.data()), 24)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("block 0 is in none")));
  EXPECT_THAT(w, ElementsAre(0, 0, 0, 0, 0, 0));
}

TEST(CheckpointSetTest, ReadsTableRowsOfEveryShardSortedByKey) {
  const std::string dir = TestDir();
  WriteCluster(dir);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointSet> set, CheckpointSet::Open(dir));
  ASSERT_OK_AND_ASSIGN(CheckpointSet::TableInfo info, set->table_info("t"));
  EXPECT_EQ(info.dim, 2u);
  EXPECT_EQ(info.type, v1::FLOAT32);
  EXPECT_EQ(info.rows, 3u);
  std::vector<uint64_t> keys(3);
  std::vector<float> values(6);
  ASSERT_THAT(set->ReadTable("t", keys.data(), 24, values.data(), 24), IsOk());
  EXPECT_THAT(keys, ElementsAre(3, 5, 9));
  EXPECT_THAT(values, ElementsAre(30, 31, 50, 51, 90, 91));
  EXPECT_THAT(set->ReadTable("t", keys.data(), 16, values.data(), 24),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("3 rows need 24 bytes of keys and 24 of values, the buffers "
                                 "have 16 and 24")));
}

TEST(CheckpointSetTest, OpensOneCheckpointDirectly) {
  const std::string dir = TestDir();
  WriteCluster(dir);
  const std::string one = dir + "/shard-0/" + CheckpointDirName(1);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointSet> set, CheckpointSet::Open(one));
  EXPECT_EQ(set->checkpoint_path(0), one);
  EXPECT_THAT(set->param_names(), ElementsAre("w"));
}

TEST(CheckpointSetTest, NothingToOpenIsNotFound) {
  const std::string dir = TestDir();
  EXPECT_THAT(CheckpointSet::Open(dir + "/missing").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("it does not exist")));
  EXPECT_THAT(CheckpointSet::Open(dir).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no MANIFEST")));
}

TEST(CheckpointSetTest, ShardsThatDisagreeAreDataLoss) {
  const std::string dir = TestDir();
  StoreSnapshot s0;
  s0.blocks = {Block("w", {2}, 0, 1, 0, {1, 2})};
  ASSERT_THAT(SaveCheckpoint(s0, dir + "/a", 0, 1).status(), IsOk());
  StoreSnapshot s1;
  s1.blocks = {Block("w", {3}, 0, 1, 0, {1, 2, 3})};
  ASSERT_THAT(SaveCheckpoint(s1, dir + "/b", 1, 1).status(), IsOk());
  EXPECT_THAT(CheckpointSet::Open(dir).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checkpoints disagree on parameter "
                                                              "'w'")));
}

}  // namespace
}  // namespace pserver
