// The pieces of a live move that survive a takeover or a restart
// (cc/server/move.h): a backup's MoveMarks seed the gate its successor
// starts; what a standby may attach to mid-move; what a checkpoint keeps
// after a move.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "cc/core/placement.h"
#include "cc/server/move.h"
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
  EXPECT_THAT(ApplyMoveWriteOnBackup("SendGrad", "", empty, marks),
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
  MoveMarks marks;
  ASSERT_OK(marks.Apply(Marks(5, v1::MoveMarks::HANDED_OVER, {leaving[0], leaving[1]})));
  ASSERT_OK(ApplyMoveWriteOnBackup(kMoveMarksWrite,
                                   Marks(5, v1::MoveMarks::DROPPED, {leaving[0], leaving[1]}),
                                   store, marks));
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
  EXPECT_THAT(CheckStandbyMayAttach(old_owner), IsOk());
  ASSERT_OK(old_owner.SetSpec(Moving(2, 3, 2)));
  ASSERT_OK(new_owner.SetSpec(Moving(2, 3, 2)));
  EXPECT_THAT(CheckStandbyMayAttach(old_owner),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("attaches once it ends")));
  EXPECT_THAT(CheckStandbyMayAttach(new_owner), IsOk());
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

}  // namespace
}  // namespace pserver
