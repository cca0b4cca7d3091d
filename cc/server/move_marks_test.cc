// The pieces of a live move that survive a takeover or a restart
// (cc/server/move.h): a backup's MoveMarks seed the gate its successor
// starts; what a standby may attach to mid-move; what a checkpoint keeps
// after a move.
#include <cstring>
#include <map>
#include <set>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cc/core/checkpoint.h"
#include "cc/core/placement.h"
#include "cc/core/tables.h"
#include "cc/server/move.h"
#include "cc/server/replication.h"
#include "pserver/v1/table.pb.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::IsOk;
using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

v1::BlockRef Block(uint32_t index) {
  v1::BlockRef block;
  block.set_index(index);
  block.set_count(64);
  return block;
}

// /placement moving from `from` to `to` servers at `version`.
v1::Placement Moving(uint32_t from, uint32_t to, uint64_t version) {
  v1::Placement spec;
  spec.set_kind(v1::Placement::JUMP);
  spec.set_version(version);
  spec.set_num_servers(to);
  spec.set_moving(true);
  spec.set_from_num_servers(from);
  return spec;
}

// The first `n` blocks of "w" (of 64) server `from` owns under 3 servers
// that go to another server under 2.
std::vector<uint32_t> Leaving(int from, size_t n) {
  const Placement three = Placement::Jump(3, 0);
  const Placement two = Placement::Jump(2, 0);
  std::vector<uint32_t> leaving;
  for (uint32_t b = 0; b < 64 && leaving.size() < n; ++b) {
    if (three.ServerOf("w", b) == from && two.ServerOf("w", b) != from) leaving.push_back(b);
  }
  return leaving;
}

std::string Marks(uint64_t version, v1::MoveMarks::State state,
                  const std::vector<uint32_t>& blocks) {
  v1::MoveMarks marks;
  marks.set_version(version);
  marks.set_state(state);
  for (uint32_t b : blocks) {
    v1::ParamRef* ref = marks.add_blocks();
    ref->set_name("w");
    ref->mutable_block()->set_index(b);
  }
  return marks.SerializeAsString();
}

TEST(MoveMarksTest, ASuccessorsGateHoldsWhatWasHeldAndRedirectsWhatWasHandedOver) {
  const std::vector<uint32_t> leaving = Leaving(2, 3);
  ASSERT_EQ(leaving.size(), 3u);
  MoveMarks marks;
  ASSERT_OK(marks.Apply(Marks(5, v1::MoveMarks::HELD, leaving)));
  ASSERT_OK(marks.Apply(Marks(5, v1::MoveMarks::HANDED_OVER, {leaving[0], leaving[1]})));
  // An older move's marks change nothing.
  ASSERT_OK(marks.Apply(Marks(4, v1::MoveMarks::HANDED_OVER, {leaving[2]})));

  PlacementGate gate(/*self=*/2, Placement::Jump(3, 4));
  ASSERT_OK(gate.SetSpec(Moving(3, 2, 5)));
  ParameterStore empty;
  marks.SeedGate(gate, empty);
  for (int i : {0, 1}) {
    EXPECT_TRUE(PlacementMovedVersion(gate.CheckBlock("w", Block(leaving[i]))).has_value());
    EXPECT_FALSE(gate.Destination(5, "w", leaving[i]).has_value());  // not sent again
  }
  // Held: no write, read served, sent again.
  EXPECT_THAT(gate.CheckBlock("w", Block(leaving[2])),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("is being handed to server")));
  EXPECT_THAT(gate.CheckRead("w", Block(leaving[2])), IsOk());
  EXPECT_TRUE(gate.Destination(5, "w", leaving[2]).has_value());
  EXPECT_EQ(gate.handed_over(), 2u);

  // A gate at another version takes none of them.
  PlacementGate later(/*self=*/2, Placement::Jump(3, 4));
  ASSERT_OK(later.SetSpec(Moving(3, 2, 7)));
  marks.SeedGate(later, empty);
  EXPECT_EQ(later.handed_over(), 0u);
  EXPECT_THAT(later.CheckBlock("w", Block(leaving[2])), IsOk());
  // Cleared (a standby copying anew): nothing.
  marks.Clear();
  PlacementGate fresh(/*self=*/2, Placement::Jump(3, 4));
  ASSERT_OK(fresh.SetSpec(Moving(3, 2, 5)));
  marks.SeedGate(fresh, empty);
  EXPECT_EQ(fresh.handed_over(), 0u);

  EXPECT_THAT(marks.Apply("\xff\xff\xff"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("malformed")));
  Tables tables;
  EXPECT_THAT(ApplyMoveWriteOnBackup("SendGrad", "", empty, tables, marks),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a move's write")));
  EXPECT_TRUE(IsMoveWrite(kMoveMarksWrite));
  EXPECT_TRUE(IsMoveWrite("ReceiveBlocks"));
  EXPECT_FALSE(IsMoveWrite("SendGrad"));
}

// "w" of 64 blocks of 4 float32, every block held (a server before a move).
void InitW(ParameterStore& store) {
  for (uint32_t b = 0; b < 64; ++b) {
    v1::Parameter param;
    param.set_name("w");
    param.set_element_type(v1::FLOAT32);
    param.add_shape(256);
    *param.mutable_block() = Block(b);
    param.mutable_block()->set_offset(4 * b);
    param.set_content(std::string(16, '\0'));
    ASSERT_OK(store.Init(std::move(param), v1::ParameterConfig()));
  }
  store.FinishInit();
}

TEST(MoveMarksTest, WhatWasHandedOverIsDroppedOnceStableHereAndOnBackups) {
  const std::vector<uint32_t> leaving = Leaving(2, 3);
  ASSERT_EQ(leaving.size(), 3u);
  std::vector<PlacementGate::BlockKey> keys;
  for (uint32_t b : leaving) keys.emplace_back("w", b);
  v1::Placement stable = Moving(3, 2, 6);
  stable.set_moving(false);
  stable.set_from_num_servers(0);

  // The old owner's gate: what it handed over in the move of version 5,
  // taken once when the placement is stable at the move's count.
  PlacementGate gate(/*self=*/2, Placement::Jump(3, 4));
  ASSERT_OK(gate.SetSpec(Moving(3, 2, 5)));
  gate.Hold(keys);
  gate.Release({keys[0], keys[1]}, /*handed_over=*/true);
  gate.Release({keys[2]}, /*handed_over=*/false);  // its copy failed: not handed over
  EXPECT_FALSE(gate.TakeHandedOver().has_value());  // still moving
  ASSERT_OK(gate.SetSpec(stable));
  std::optional<PlacementGate::HandedOver> done = gate.TakeHandedOver();
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->version, 5u);
  EXPECT_EQ(done->stable.version(), 6u);
  EXPECT_EQ(done->blocks, (std::vector<PlacementGate::BlockKey>{keys[0], keys[1]}));
  EXPECT_FALSE(gate.TakeHandedOver().has_value());  // once
  // A placement written stable at another count than the move's (by hand)
  // lets go of nothing.
  PlacementGate by_hand(/*self=*/2, Placement::Jump(3, 4));
  ASSERT_OK(by_hand.SetSpec(Moving(3, 2, 5)));
  by_hand.Hold(keys);
  by_hand.Release(keys, /*handed_over=*/true);
  v1::Placement other = stable;
  other.set_num_servers(3);
  ASSERT_OK(by_hand.SetSpec(other));
  EXPECT_FALSE(by_hand.TakeHandedOver().has_value());

  // A backup applies the DROPPED marks: the blocks leave its store, the
  // others stay, and the marks of the move forget them.
  ParameterStore store;
  InitW(store);
  ASSERT_FALSE(HasFatalFailure());
  const uint64_t before = store.GetStats().parameter_bytes;
  Tables tables;
  MoveMarks marks;
  ASSERT_OK(marks.Apply(Marks(5, v1::MoveMarks::HANDED_OVER, {leaving[0], leaving[1]})));
  ASSERT_OK(ApplyMoveWriteOnBackup(kMoveMarksWrite,
                                   Marks(5, v1::MoveMarks::DROPPED, {leaving[0], leaving[1]}),
                                   store, tables, marks));
  EXPECT_EQ(store.GetStats().parameter_bytes, before - 2 * 16);
  EXPECT_EQ(store.GetStats().blocks, 62u);
  v1::ParamRef ref;
  ref.set_name("w");
  *ref.mutable_block() = Block(leaving[0]);
  v1::Parameter out;
  EXPECT_THAT(store.Get(ref, &out),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("not found")));
  *ref.mutable_block() = Block(leaving[2]);
  EXPECT_THAT(store.Get(ref, &out), IsOk());
  PlacementGate successor(/*self=*/2, Placement::Jump(3, 4));
  ASSERT_OK(successor.SetSpec(Moving(3, 2, 5)));
  marks.SeedGate(successor, store);
  EXPECT_EQ(successor.handed_over(), 0u);
  // Dropping again, or blocks not held, changes nothing.
  EXPECT_EQ(store.EraseBlocks(keys), 16u);  // only the third was still held
  EXPECT_EQ(store.EraseBlocks(keys), 0u);
  EXPECT_EQ(store.GetStats().blocks, 61u);
}

TEST(MoveMarksTest, AStandbyAttachesMidMoveOnlyToAServerNewInTheMove) {
  PlacementGate old_owner(/*self=*/1, Placement::Jump(2, 1));
  PlacementGate new_owner(/*self=*/2, Placement::Jump(2, 1));
  EXPECT_THAT(CheckStandbyMayAttach(old_owner, false), IsOk());
  ASSERT_OK(old_owner.SetSpec(Moving(2, 3, 2)));
  ASSERT_OK(new_owner.SetSpec(Moving(2, 3, 2)));
  EXPECT_THAT(CheckStandbyMayAttach(old_owner, false),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("attaches once it ends")));
  EXPECT_THAT(CheckStandbyMayAttach(new_owner, false), IsOk());
  // A new owner holding table rows: its copy would not say which buckets
  // it received.
  EXPECT_THAT(CheckStandbyMayAttach(new_owner, true),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("which holds table rows")));
  EXPECT_THAT(CheckNoMoveUnderWay(old_owner),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("a live move from 2 to 3 servers is under way")));
  EXPECT_TRUE(JoinsMove(Moving(2, 3, 2), 2));
  EXPECT_FALSE(JoinsMove(Moving(2, 3, 2), 1));
  EXPECT_FALSE(JoinsMove(Moving(3, 2, 2), 2));  // a move to fewer: no one joins
  v1::Placement stable = Moving(2, 3, 3);
  stable.set_moving(false);
  EXPECT_FALSE(JoinsMove(stable, 2));
}

TEST(MoveMarksTest, ACheckpointAfterAMoveKeepsOnlyTheBlocksOwnedUnderIt) {
  PlacementGate gate(/*self=*/0, Placement::Jump(3, 3));
  const Placement three = Placement::Jump(3, 3);
  StoreSnapshot snapshot;
  size_t owned = 0;
  for (uint32_t b = 0; b < 64; ++b) {
    BlockSnapshot block;
    block.name = "w";
    block.block = Block(b);
    snapshot.blocks.push_back(block);
    owned += three.ServerOf("w", b) == 0;
  }
  ASSERT_GT(owned, 0u);
  ASSERT_LT(owned, 64u);
  EXPECT_EQ(KeepOwnedBlocks(gate, &snapshot), 64 - owned);
  ASSERT_EQ(snapshot.blocks.size(), owned);
  for (const BlockSnapshot& block : snapshot.blocks) {
    EXPECT_EQ(three.ServerOf(block.name, block.block.index()), 0);
  }
}

// A table with one row (dim 2, SGD) for each of `keys` in `tables`.
void TableWithRows(Tables& tables, const std::vector<uint64_t>& keys) {
  v1::CreateTableRequest create;
  create.set_name("emb");
  create.mutable_config()->set_dim(2);
  create.mutable_config()->mutable_optimizer()->mutable_sgd()->set_learning_rate(1);
  ASSERT_OK(tables.Create(create));
  std::vector<float> grads(keys.size() * 2, 1.0f);
  TableRowsView push;
  push.table = "emb";
  push.keys = keys;
  push.values = absl::string_view(reinterpret_cast<const char*>(grads.data()), grads.size() * 4);
  ASSERT_OK(tables.PushRows(push));
}

// Keys server `from` owns under 3 servers that go to server `to` under 2,
// with the first bucket range [begin, end) holding them.
std::vector<uint64_t> KeysFromTo(int from, int to, uint32_t begin, uint32_t end, size_t n) {
  const Placement three = Placement::Jump(3, 0);
  const Placement two = Placement::Jump(2, 0);
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 100000 && keys.size() < n; ++k) {
    const uint32_t bucket = KeyBucket(k);
    if (bucket >= begin && bucket < end && three.HashKeyServer(k) == from &&
        two.HashKeyServer(k) == to) {
      keys.push_back(k);
    }
  }
  return keys;
}

std::string BucketMarks(uint64_t version, v1::MoveMarks::State state, uint32_t begin,
                        uint32_t end) {
  v1::MoveMarks marks;
  marks.set_version(version);
  marks.set_state(state);
  v1::MovedBuckets* moved = marks.add_buckets();
  moved->set_table("emb");
  moved->set_begin(begin);
  moved->set_end(end);
  return marks.SerializeAsString();
}

// The old owner's side: a run of buckets held, and the runs before it
// handed over, are what its successor's gate holds and redirects.
TEST(MoveMarksTest, ASuccessorsGateHoldsAndRedirectsTableBucketsAsMarked) {
  MoveMarks marks;
  ASSERT_OK(marks.Apply(BucketMarks(5, v1::MoveMarks::HELD, 0, 12)));
  ASSERT_OK(marks.Apply(BucketMarks(5, v1::MoveMarks::HANDED_OVER, 0, 8)));
  PlacementGate gate(/*self=*/2, Placement::Jump(3, 4));
  ASSERT_OK(gate.SetSpec(Moving(3, 2, 5)));
  ParameterStore empty;
  marks.SeedGate(gate, empty);
  const v1::Partitioning hash;
  for (uint32_t b = 0; b < 16; ++b) EXPECT_EQ(gate.BucketHandedOver("emb", b), b < 8) << b;
  const std::vector<uint64_t> over = KeysFromTo(2, 0, 0, 8, 1);
  const std::vector<uint64_t> held = KeysFromTo(2, 0, 8, 12, 1);
  const std::vector<uint64_t> served = KeysFromTo(2, 0, 12, kKeyBuckets, 1);
  ASSERT_EQ(over.size() + held.size() + served.size(), 3u);
  EXPECT_TRUE(PlacementMovedVersion(gate.CheckKeys("emb", hash, over, true)).has_value());
  EXPECT_THAT(gate.CheckKeys("emb", hash, held, /*write=*/true),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("is being handed to server 0")));
  EXPECT_THAT(gate.CheckKeys("emb", hash, held, /*write=*/false), IsOk());
  EXPECT_THAT(gate.CheckKeys("emb", hash, served, /*write=*/true), IsOk());
}

// The new owner's side: a backup applies the rows of a table ReceiveBlocks
// as they are and records the buckets, which its successor's gate serves.
TEST(MoveMarksTest, ABackupTakesReceivedTableRowsAndItsSuccessorServesTheirBuckets) {
  const std::vector<uint64_t> moved = KeysFromTo(2, 0, 0, 12, 8);
  const std::vector<uint64_t> later = KeysFromTo(2, 0, 12, kKeyBuckets, 1);
  ASSERT_EQ(moved.size(), 8u);
  ASSERT_EQ(later.size(), 1u);
  Tables sender;
  TableWithRows(sender, moved);
  std::map<std::string, std::string> extensions;
  ASSERT_OK_AND_ASSIGN(Tables::Exported exported,
                       sender.ExportRows("emb", nullptr, &extensions));
  ASSERT_EQ(exported.rows, moved.size());
  StoreSnapshot snapshot;
  snapshot.extensions = extensions;
  ASSERT_OK_AND_ASSIGN(std::vector<v1::SnapshotFile> files,
                       SnapshotToFiles(snapshot, 2, CheckpointWriteOptions()));
  v1::ReceiveBlocksRequest receive;
  receive.set_version(5);
  receive.set_from_server(2);
  for (v1::SnapshotFile& file : files) *receive.add_files() = std::move(file);
  v1::MovedBuckets* buckets = receive.add_table_buckets();
  buckets->set_table("emb");
  buckets->set_begin(0);
  buckets->set_end(12);

  ParameterStore store;
  Tables backup;
  MoveMarks marks;
  ASSERT_OK(ApplyMoveWriteOnBackup("ReceiveBlocks", receive.SerializeAsString(), store, backup,
                                   marks));
  std::map<std::string, std::string> taken;
  ASSERT_OK(backup.ExportRows("emb", nullptr, &taken).status());
  v1::SparseTableSnapshot sent_rows, taken_rows;
  ASSERT_TRUE(sent_rows.ParseFromString(extensions.at("table/emb")));
  ASSERT_TRUE(taken_rows.ParseFromString(taken.at("table/emb")));
  EXPECT_EQ(taken_rows.rows(), moved.size());
  EXPECT_EQ(taken_rows.keys(), sent_rows.keys());
  EXPECT_EQ(taken_rows.values(), sent_rows.values());
  EXPECT_EQ(taken_rows.state(), sent_rows.state());
  EXPECT_EQ(taken_rows.steps(), sent_rows.steps());

  PlacementGate gate(/*self=*/0, Placement::Jump(3, 4));
  ASSERT_OK(gate.SetSpec(Moving(3, 2, 5)));
  marks.SeedGate(gate, store);
  const v1::Partitioning hash;
  EXPECT_THAT(gate.CheckKeys("emb", hash, moved, /*write=*/true), IsOk());
  EXPECT_TRUE(gate.BucketReceived("emb", KeyBucket(moved[0]), 2));
  EXPECT_THAT(gate.CheckKeys("emb", hash, later, /*write=*/true),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("not yet received")));
}

// After a move a checkpoint keeps only the table keys the server owns now.
TEST(MoveMarksTest, ACheckpointAfterAMoveKeepsOnlyTheTableKeysOwnedUnderIt) {
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 256; ++k) keys.push_back(k);
  Tables tables;
  TableWithRows(tables, keys);
  PlacementGate gate(/*self=*/0, Placement::Jump(3, 3));
  std::map<std::string, std::string> extensions;
  tables.SaveTo(&extensions, OwnedKeys(gate));
  Tables restored;
  ASSERT_OK(restored.RestoreFrom(extensions));
  v1::TableStatsResponse stats;
  restored.Stats(&stats);
  ASSERT_EQ(stats.tables_size(), 1);
  const Placement three = Placement::Jump(3, 3);
  uint64_t owned = 0;
  for (uint64_t k : keys) owned += three.HashKeyServer(k) == 0;
  ASSERT_GT(owned, 0u);
  ASSERT_LT(owned, keys.size());
  EXPECT_EQ(stats.tables(0).rows(), owned);
  // Without a filter, every row.
  std::map<std::string, std::string> all;
  tables.SaveTo(&all);
  Tables whole;
  ASSERT_OK(whole.RestoreFrom(all));
  v1::TableStatsResponse whole_stats;
  whole.Stats(&whole_stats);
  EXPECT_EQ(whole_stats.tables(0).rows(), keys.size());
}

// Every row of table `name` in `tables`, as exported (keys, values,
// optimizer state, steps).
v1::SparseTableSnapshot RowsOfTable(Tables& tables, const std::string& name) {
  std::map<std::string, std::string> section;
  EXPECT_OK(tables.ExportRows(name, nullptr, &section).status());
  v1::SparseTableSnapshot snap;
  EXPECT_TRUE(snap.ParseFromString(section[absl::StrCat(Tables::kTablePrefix, name)]));
  return snap;
}

uint64_t RowCount(Tables& tables) {
  v1::TableStatsResponse stats;
  tables.Stats(&stats);
  uint64_t rows = 0;
  for (const v1::TableStats& table : stats.tables()) rows += table.rows();
  return rows;
}

// Keys 0..n-1.
std::vector<uint64_t> FirstKeys(uint64_t n) {
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < n; ++k) keys.push_back(k);
  return keys;
}

// A DROPPED record of the move of `version` by server `server`: blocks `blocks` of "w",
// table "emb" buckets [begin, end), and the stable placement of `count`
// servers at `stable_version`.
v1::MoveMarks DroppedRows(uint64_t version, uint32_t server, const std::vector<uint32_t>& blocks,
                          uint32_t begin, uint32_t end, uint32_t count, uint64_t stable_version) {
  v1::MoveMarks marks;
  EXPECT_TRUE(marks.ParseFromString(Marks(version, v1::MoveMarks::DROPPED, blocks)));
  v1::MovedBuckets* moved = marks.add_buckets();
  moved->set_table("emb");
  moved->set_begin(begin);
  moved->set_end(end);
  marks.mutable_stable()->set_kind(v1::Placement::JUMP);
  marks.mutable_stable()->set_version(stable_version);
  marks.mutable_stable()->set_num_servers(count);
  marks.set_server(server);
  return marks;
}

// Issue 16: a shard with standbys drops the table rows it handed over on
// every replica alike. Server 0 of 2 handed buckets [0, 128) of "emb" over
// in a move to 3 servers: the DROPPED record names them with the stable
// placement, and a backup applying it drops exactly the rows its primary
// drops (DropMarked): those of the named buckets whose keys are server
// 2's under 3, no other; what is left is server 0's share of those buckets
// plus every row of the others.
TEST(MoveMarksTest, ABackupDropsExactlyTheTableRowsItsPrimaryDropped) {
  const std::vector<uint64_t> keys = FirstKeys(4000);
  Tables primary, backup;
  TableWithRows(primary, keys);
  TableWithRows(backup, keys);
  ASSERT_FALSE(HasFatalFailure());
  ParameterStore primary_store, backup_store;
  InitW(primary_store);
  InitW(backup_store);
  ASSERT_FALSE(HasFatalFailure());
  const std::vector<uint32_t> leaving = Leaving(2, 2);  // any two blocks
  const v1::MoveMarks marks = DroppedRows(5, /*server=*/0, leaving, 0, 128, 3, 6);
  ASSERT_OK(CheckMoveMarks(marks));

  const DroppedMarked here = DropMarked(marks, primary_store, &primary);
  MoveMarks backup_marks;
  ASSERT_OK(ApplyMoveWriteOnBackup(kMoveMarksWrite, marks.SerializeAsString(), backup_store,
                                   backup, backup_marks));
  const Placement three = Placement::Jump(3, 6);
  std::set<uint64_t> kept;
  uint64_t gone = 0;
  for (uint64_t k : keys) {
    if (KeyBucket(k) < 128 && three.HashKeyServer(k) != 0) {
      ++gone;
    } else {
      kept.insert(k);
    }
  }
  ASSERT_GT(gone, 0u);
  EXPECT_EQ(here.rows, gone);
  EXPECT_EQ(here.bytes, 2u * 16);
  const v1::SparseTableSnapshot a = RowsOfTable(primary, "emb");
  const v1::SparseTableSnapshot b = RowsOfTable(backup, "emb");
  EXPECT_EQ(a.rows(), kept.size());
  EXPECT_EQ(b.rows(), kept.size());
  EXPECT_TRUE(a.keys() == b.keys()) << "keys";
  EXPECT_TRUE(a.values() == b.values()) << "values";
  EXPECT_TRUE(a.state() == b.state()) << "state";
  EXPECT_TRUE(a.steps() == b.steps()) << "steps";
  std::set<uint64_t> left;
  for (size_t i = 0; i + 8 <= b.keys().size(); i += 8) {
    uint64_t k;
    std::memcpy(&k, b.keys().data() + i, 8);
    left.insert(k);
  }
  EXPECT_EQ(left, kept);
  EXPECT_EQ(backup_store.GetStats().blocks, 62u);
  EXPECT_EQ(primary_store.GetStats().blocks, 62u);
}

// Issue 16 (the bar): a malformed or hostile MoveMarks arriving over
// replication is refused naming what is wrong, and changes nothing: no
// block or row dropped, no mark recorded (a successor's gate seeded from
// the marks holds and redirects nothing).
TEST(MoveMarksTest, MalformedOrHostileMoveMarksAreRefusedAndChangeNothing) {
  const std::vector<uint64_t> keys = FirstKeys(2000);
  Tables tables;
  TableWithRows(tables, keys);
  ParameterStore store;
  InitW(store);
  ASSERT_FALSE(HasFatalFailure());
  const std::vector<uint32_t> leaving = Leaving(2, 2);
  const v1::MoveMarks good = DroppedRows(5, 0, leaving, 0, 128, 3, 6);
  ASSERT_OK(CheckMoveMarks(good));
  MoveMarks marks;
  const v1::SparseTableSnapshot rows_before = RowsOfTable(tables, "emb");
  const uint64_t blocks_before = store.GetStats().blocks;

  struct Case {
    std::string what;
    std::string bytes;
    absl::StatusCode code;
    std::string says;
  };
  std::vector<Case> cases;
  auto add = [&](std::string what, const v1::MoveMarks& m, absl::StatusCode code,
                 std::string says) {
    cases.push_back({std::move(what), m.SerializeAsString(), code, std::move(says)});
  };
  cases.push_back({"bytes that do not parse", std::string("\x0a\xff\xff\xff", 4),
                   absl::StatusCode::kInvalidArgument, "malformed"});
  {
    v1::MoveMarks m = good;
    m.set_state(static_cast<v1::MoveMarks::State>(7));
    add("an unknown state", m, absl::StatusCode::kInvalidArgument, "state 7 is not known");
    m.set_state(v1::MoveMarks::STATE_UNSPECIFIED);
    add("no state", m, absl::StatusCode::kInvalidArgument, "state 0 is not known");
  }
  {
    v1::MoveMarks m = good;
    m.set_version(0);
    add("version 0", m, absl::StatusCode::kInvalidArgument, "no placement version");
  }
  {
    v1::MoveMarks m = good;
    m.mutable_blocks(0)->mutable_block()->set_index(999);
    add("an unknown block", m, absl::StatusCode::kFailedPrecondition,
        "names parameter 'w' block 999, which this replica does not hold");
    m = good;
    m.mutable_blocks(0)->set_name("nope");
    add("an unknown parameter", m, absl::StatusCode::kFailedPrecondition,
        "names parameter 'nope'");
    m = good;
    m.mutable_blocks(0)->set_name("");
    add("a block without a name", m, absl::StatusCode::kInvalidArgument,
        "a block without a parameter name");
    m = good;
    *m.add_blocks() = m.blocks(0);
    add("a block named twice", m, absl::StatusCode::kInvalidArgument, "is named twice");
  }
  {
    v1::MoveMarks m = good;
    m.mutable_buckets(0)->set_table("other");
    add("an unknown table", m, absl::StatusCode::kFailedPrecondition,
        "names table 'other', which this replica does not hold");
    m.mutable_buckets(0)->set_table("");
    add("a run without a table", m, absl::StatusCode::kInvalidArgument,
        "a bucket run without a table name");
  }
  for (const auto& [begin, end] : std::vector<std::pair<uint32_t, uint32_t>>{
           {0, kKeyBuckets + 1}, {10, 10}, {10, 5}, {0, 0xffffffffu}, {0xfffffff0u, 0xffffffffu}}) {
    v1::MoveMarks m = good;
    m.mutable_buckets(0)->set_begin(begin);
    m.mutable_buckets(0)->set_end(end);
    add(absl::StrCat("run [", begin, ", ", end, ")"), m, absl::StatusCode::kInvalidArgument,
        "is not within [0, 256) or is empty");
  }
  {
    v1::MoveMarks m = good;
    *m.add_buckets() = m.buckets(0);
    add("a run twice", m, absl::StatusCode::kInvalidArgument, "overlaps another run");
    m = good;
    v1::MovedBuckets* other = m.add_buckets();
    *other = m.buckets(0);
    other->set_begin(127);
    other->set_end(200);
    add("overlapping runs", m, absl::StatusCode::kInvalidArgument, "overlaps another run");
    m = good;
    other = m.add_buckets();
    *other = m.buckets(0);
    other->set_begin(0);
    other->set_end(1);
    add("a run inside another", m, absl::StatusCode::kInvalidArgument, "overlaps another run");
  }
  {
    v1::MoveMarks m = good;
    m.clear_stable();
    add("buckets without a stable placement", m, absl::StatusCode::kInvalidArgument,
        "without the stable placement");
    m = good;
    m.mutable_stable()->set_num_servers(0);
    add("no servers", m, absl::StatusCode::kInvalidArgument, "num_servers must be in");
    m.mutable_stable()->set_num_servers(1u << 31);
    add("a huge server count", m, absl::StatusCode::kInvalidArgument, "num_servers must be in");
    m = good;
    m.mutable_stable()->set_moving(true);
    m.mutable_stable()->set_from_num_servers(2);
    add("a moving placement", m, absl::StatusCode::kInvalidArgument,
        "is not a stable one newer than the move");
    m = good;
    m.mutable_stable()->set_version(5);
    add("a placement not newer", m, absl::StatusCode::kInvalidArgument,
        "is not a stable one newer than the move");
    m = good;
    m.set_server(1u << 30);
    add("a huge server index", m, absl::StatusCode::kInvalidArgument, "is not below 4096");
    m = good;
    m.set_state(v1::MoveMarks::HELD);
    add("a stable placement in HELD", m, absl::StatusCode::kInvalidArgument,
        "in a record that is not DROPPED");
  }
  {
    v1::MoveMarks m = good;
    m.clear_buckets();
    m.clear_stable();
    m.set_server(0);
    for (int b = 0; b <= kMaxMoveMarkBlocks; ++b) {
      v1::ParamRef* ref = m.add_blocks();
      ref->set_name("x");
      ref->mutable_block()->set_index(static_cast<uint32_t>(b));
    }
    add("a huge count of blocks", m, absl::StatusCode::kInvalidArgument,
        "one record may name");
  }

  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_THAT(ApplyMoveWriteOnBackup(kMoveMarksWrite, c.bytes, store, tables, marks),
                StatusIs(c.code, HasSubstr(c.says)));
    v1::MoveMarks parsed;
    // (The huge record once only: it takes seconds on a loaded machine.)
    if (c.bytes.size() < (1 << 20) && parsed.ParseFromString(c.bytes) &&
        c.code == absl::StatusCode::kInvalidArgument) {
      EXPECT_THAT(CheckMoveMarks(parsed), StatusIs(c.code, HasSubstr(c.says)));
      EXPECT_THAT(marks.Apply(c.bytes), StatusIs(c.code, HasSubstr(c.says)));
    }
    // Nothing changed.
    EXPECT_EQ(store.GetStats().blocks, blocks_before);
    const v1::SparseTableSnapshot rows = RowsOfTable(tables, "emb");
    EXPECT_TRUE(rows.keys() == rows_before.keys());
    EXPECT_TRUE(rows.values() == rows_before.values());
  }
  // No mark was recorded: a successor's gate at the move holds and
  // redirects nothing.
  PlacementGate gate(/*self=*/0, Placement::Jump(2, 4));
  ASSERT_OK(gate.SetSpec(Moving(2, 3, 5)));
  marks.SeedGate(gate, store);
  EXPECT_EQ(gate.handed_over(), 0u);
  for (uint32_t b = 0; b < kKeyBuckets; ++b) EXPECT_FALSE(gate.BucketHandedOver("emb", b)) << b;
  // The good record is taken (and drops rows), once nothing was wrong.
  ASSERT_OK(ApplyMoveWriteOnBackup(kMoveMarksWrite, good.SerializeAsString(), store, tables,
                                   marks));
  EXPECT_LT(RowCount(tables), keys.size());
  EXPECT_EQ(store.GetStats().blocks, blocks_before - 2);
}

}  // namespace
}  // namespace pserver
