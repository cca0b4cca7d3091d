#include "cc/server/placement_gate.h"

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cc/core/placement.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusCodeIs;
using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

v1::BlockRef Block(uint32_t index, uint32_t count) {
  v1::BlockRef block;
  block.set_index(index);
  block.set_count(count);
  return block;
}

TEST(PlacementMovedTest, VersionIsReadBackOnlyFromItsOwnStatus) {
  absl::Status moved = PlacementMoved(7, "parameter 'w'", 2, 0);
  EXPECT_THAT(moved,
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("parameter 'w' is on server 2 under it, not on this server 0")));
  EXPECT_EQ(PlacementMovedVersion(moved), std::optional<uint64_t>(7));
  EXPECT_EQ(PlacementMovedVersion(absl::FailedPreconditionError("placement moved: version x: y")),
            std::nullopt);
  EXPECT_EQ(PlacementMovedVersion(absl::FailedPreconditionError("other")), std::nullopt);
  EXPECT_EQ(PlacementMovedVersion(absl::UnavailableError(moved.message())), std::nullopt);
  EXPECT_EQ(PlacementMovedVersion(absl::OkStatus()), std::nullopt);
}

TEST(PlacementGateTest, OwnsExactlyThePlacementsBlocksAndFollowsNewerVersions) {
  const Placement two = Placement::Jump(2, 1);
  const Placement three = Placement::Jump(3, 2);
  PlacementGate gate0(0, two);
  PlacementGate gate1(1, two);
  int moved_to_new = 0;
  for (uint32_t b = 0; b < 64; ++b) {
    const std::string name = absl::StrCat("p", b % 5);
    const int owner = two.ServerOf(name, b);
    EXPECT_OK((owner == 0 ? gate0 : gate1).CheckBlock(name, Block(b, 64)));
    absl::Status refused = (owner == 0 ? gate1 : gate0).CheckBlock(name, Block(b, 64));
    EXPECT_EQ(PlacementMovedVersion(refused), std::optional<uint64_t>(1)) << refused;
    EXPECT_THAT(refused.message(), HasSubstr(absl::StrCat("on server ", owner, " under it")));
    if (three.ServerOf(name, b) == 2) ++moved_to_new;
  }
  ASSERT_GT(moved_to_new, 0);
  gate0.Set(three);
  EXPECT_EQ(gate0.version(), 2u);
  for (uint32_t b = 0; b < 64; ++b) {
    const std::string name = absl::StrCat("p", b % 5);
    const int owner = three.ServerOf(name, b);
    absl::Status status = gate0.CheckBlock(name, Block(b, 64));
    if (owner == 0) {
      EXPECT_OK(status);
    } else {
      EXPECT_EQ(PlacementMovedVersion(status), std::optional<uint64_t>(2)) << status;
    }
  }
  // An older version (a replayed watch event) is ignored.
  gate0.Set(two);
  EXPECT_EQ(gate0.version(), 2u);
}


v1::Placement Moving(uint64_t version, uint32_t from, uint32_t to) {
  v1::Placement spec = Placement::Jump(static_cast<int>(to), version).spec();
  spec.set_moving(true);
  spec.set_from_num_servers(from);
  return spec;
}

// A block that moves from server 0 to server 2 when 2 servers become 3.
struct Moved {
  std::string name;
  uint32_t index = 0;
};
Moved FirstMovingFrom0To2() {
  const Placement two = Placement::Jump(2, 1), three = Placement::Jump(3, 2);
  for (uint32_t b = 0;; ++b) {
    if (two.ServerOf("w", b) == 0 && three.ServerOf("w", b) == 2) return {"w", b};
  }
}

TEST(PlacementGateTest, AMovingBlockIsServedByItsOldOwnerUntilHandedOverThenByTheNewOne) {
  const Moved m = FirstMovingFrom0To2();
  const v1::BlockRef ref = Block(m.index, 1u << 20);
  PlacementGate old_owner(0, Placement::Jump(2, 1));
  PlacementGate new_owner(2, Placement::Jump(3, 1));
  PlacementGate bystander(1, Placement::Jump(2, 1));
  for (PlacementGate* gate : {&old_owner, &new_owner, &bystander}) {
    ASSERT_OK(gate->SetSpec(Moving(2, 2, 3)));
    EXPECT_TRUE(gate->spec().moving());
    EXPECT_EQ(gate->spec().from_num_servers(), 2u);
  }
  // Routed by the 2 servers while moving.
  EXPECT_OK(old_owner.CheckBlock(m.name, ref));
  EXPECT_EQ(PlacementMovedVersion(bystander.CheckBlock(m.name, ref)), std::optional<uint64_t>(2));
  EXPECT_THAT(bystander.CheckBlock(m.name, ref).message(), HasSubstr("on server 0 under it"));
  absl::Status early = new_owner.CheckBlock(m.name, ref);
  EXPECT_THAT(early, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("not yet received")));
  EXPECT_TRUE(IsGateRefusal(early));
  EXPECT_FALSE(IsGateRefusal(absl::UnavailableError("not yet received")));  // not the gate's

  EXPECT_EQ(old_owner.Destination(2, m.name, m.index), std::optional<int>(2));
  EXPECT_EQ(old_owner.Destination(1, m.name, m.index), std::nullopt);  // another move
  EXPECT_EQ(bystander.Destination(2, m.name, m.index), std::nullopt);
  old_owner.Hold({{m.name, m.index}});
  EXPECT_OK(old_owner.CheckRead(m.name, ref));
  absl::Status held = old_owner.CheckBlock(m.name, ref);
  EXPECT_THAT(held, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("handed to server 2")));
  EXPECT_TRUE(IsGateRefusal(held));
  old_owner.Release({{m.name, m.index}}, /*handed_over=*/false);  // the copy failed
  EXPECT_OK(old_owner.CheckBlock(m.name, ref));

  EXPECT_THAT(new_owner.CheckReceive(3, m.name, m.index),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("not yet 3")));
  EXPECT_THAT(bystander.CheckReceive(2, m.name, m.index),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("goes to server 2")));
  ASSERT_OK(new_owner.CheckReceive(2, m.name, m.index));
  new_owner.Received({{m.name, m.index}});
  old_owner.Hold({{m.name, m.index}});
  old_owner.Release({{m.name, m.index}}, /*handed_over=*/true);
  EXPECT_EQ(old_owner.handed_over(), 1u);
  EXPECT_EQ(old_owner.Destination(2, m.name, m.index), std::nullopt);  // done: not sent again
  EXPECT_OK(new_owner.CheckBlock(m.name, ref));
  absl::Status moved = old_owner.CheckBlock(m.name, ref);
  EXPECT_EQ(PlacementMovedVersion(moved), std::optional<uint64_t>(2));
  EXPECT_THAT(moved.message(), HasSubstr("on server 2 under it"));

  // A replayed event keeps the progress; the stable placement ends the move.
  ASSERT_OK(old_owner.SetSpec(Moving(2, 2, 3)));
  EXPECT_EQ(old_owner.handed_over(), 1u);
  for (PlacementGate* gate : {&old_owner, &new_owner, &bystander}) {
    ASSERT_OK(gate->SetSpec(Placement::Jump(3, 3).spec()));
    EXPECT_FALSE(gate->spec().moving());
  }
  EXPECT_EQ(old_owner.handed_over(), 0u);
  EXPECT_OK(new_owner.CheckBlock(m.name, ref));
  EXPECT_EQ(PlacementMovedVersion(old_owner.CheckBlock(m.name, ref)), std::optional<uint64_t>(3));
}

TEST(PlacementGateTest, AMovingSpecWithABadFromCountIsRefusedAndChangesNothing) {
  PlacementGate gate(0, Placement::Jump(2, 1));
  EXPECT_THAT(gate.SetSpec(Moving(2, 0, 3)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("from_num_servers")));
  EXPECT_THAT(gate.SetSpec(Moving(2, 5000, 3)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("from_num_servers")));
  EXPECT_EQ(gate.version(), 1u);
  EXPECT_FALSE(gate.spec().moving());
}

// Table keys are decided as blocks are, by bucket (KeyBucket) and old owner.
TEST(PlacementGateTest, TableKeysAreHeldHandedOverAndReceivedByBucket) {
  const Placement two = Placement::Jump(2, 1);
  const Placement three = Placement::Jump(3, 2);
  v1::Placement moving = three.spec();
  moving.set_moving(true);
  moving.set_from_num_servers(2);
  PlacementGate gate0(0, two), gate1(1, two), gate2(2, two);
  for (PlacementGate* gate : {&gate0, &gate1, &gate2}) ASSERT_OK(gate->SetSpec(moving));
  const v1::Partitioning hash;
  std::optional<uint64_t> leaving, other_leaving, staying;
  for (uint64_t key = 0; key < 1000 && (!leaving || !other_leaving || !staying); ++key) {
    if (two.HashKeyServer(key) != 0) continue;
    if (three.HashKeyServer(key) != 2) {
      staying = key;
    } else if (!leaving) {
      leaving = key;
    } else if (KeyBucket(key) != KeyBucket(*leaving)) {
      other_leaving = key;
    }
  }
  ASSERT_TRUE(leaving && other_leaving && staying);
  const uint64_t k = *leaving;
  const uint32_t bucket = KeyBucket(k);
  EXPECT_OK(gate0.CheckKeys("t", hash, {k, *staying}, /*write=*/true));
  EXPECT_THAT(gate2.CheckKeys("t", hash, {k}, true),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("not yet received")));
  absl::Status elsewhere = gate1.CheckKeys("t", hash, {k}, false);
  EXPECT_EQ(PlacementMovedVersion(elsewhere), std::optional<uint64_t>(2)) << elsewhere;
  EXPECT_THAT(elsewhere.message(), HasSubstr("table 't' key"));
  EXPECT_THAT(elsewhere.message(), HasSubstr("on server 0 under it"));

  ASSERT_OK_AND_ASSIGN(std::optional<int> to, gate0.KeyDestination(2, 0, hash, k));
  EXPECT_EQ(to, std::optional<int>(2));
  ASSERT_OK_AND_ASSIGN(to, gate0.KeyDestination(2, 0, hash, *staying));
  EXPECT_EQ(to, std::nullopt);
  ASSERT_OK_AND_ASSIGN(to, gate0.KeyDestination(1, 0, hash, k));  // not the move held
  EXPECT_EQ(to, std::nullopt);

  gate0.HoldBuckets("t", bucket, bucket + 1);
  EXPECT_THAT(gate0.CheckKeys("t", hash, {k}, true),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("being handed to server 2")));
  EXPECT_OK(gate0.CheckKeys("t", hash, {k}, /*write=*/false));
  EXPECT_OK(gate0.CheckKeys("u", hash, {k}, true));  // per table
  EXPECT_OK(gate2.CheckReceiveKey(2, 0, "t", hash, k));
  EXPECT_THAT(gate2.CheckReceiveKey(2, 1, "t", hash, k),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not from server 1")));
  EXPECT_THAT(gate2.CheckReceiveKey(2, 0, "t", hash, *staying),
              StatusCodeIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(gate2.CheckReceiveKey(3, 0, "t", hash, k),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("not yet 3")));
  gate2.ReceivedBuckets("t", 0, bucket, bucket + 1);
  gate0.ReleaseBuckets("t", bucket, bucket + 1, /*handed_over=*/true);
  EXPECT_TRUE(gate0.BucketHandedOver("t", bucket));
  for (bool write : {true, false}) {
    // Every key is checked: one still served here does not let the others by.
    absl::Status moved = gate0.CheckKeys("t", hash, {*staying, *other_leaving, k}, write);
    EXPECT_EQ(PlacementMovedVersion(moved), std::optional<uint64_t>(2)) << moved;
    EXPECT_THAT(moved.message(), HasSubstr("on server 2 under it"));
  }
  EXPECT_OK(gate2.CheckKeys("t", hash, {k}, true));
  // Stable at 3: by the placement alone.
  gate0.Set(Placement::Jump(3, 3));
  EXPECT_FALSE(gate0.BucketHandedOver("t", bucket));
  EXPECT_EQ(PlacementMovedVersion(gate0.CheckKeys("t", hash, {k}, false)),
            std::optional<uint64_t>(3));
  EXPECT_OK(gate0.CheckKeys("t", hash, {*staying}, true));
  // A key outside a RANGE partitioning is named.
  v1::Partitioning range;
  range.set_kind(v1::Partitioning::RANGE);
  range.set_range_begin(10);
  range.set_range_end(20);
  EXPECT_THAT(gate0.CheckKeys("t", range, {5}, true),
              StatusCodeIs(absl::StatusCode::kInvalidArgument));
}

// What a move handed over is taken right after the placement that ended
// it; a list left untaken when a newer placement comes is dropped, not
// handed out later: here the block server 0 handed to server 2 came back to
// server 0 in the next move, and dropping it then would lose it.
TEST(PlacementGateTest, AHandedOverListNotTakenBeforeANewerPlacementIsNeverHandedOut) {
  const Moved m = FirstMovingFrom0To2();
  const v1::BlockRef ref = Block(m.index, 1u << 20);
  for (const bool take_between : {true, false}) {
    SCOPED_TRACE(take_between ? "taken after each move" : "not taken between the moves");
    PlacementGate gate(0, Placement::Jump(2, 1));
    ASSERT_OK(gate.SetSpec(Moving(2, 2, 3)));
    gate.Hold({{m.name, m.index}});
    gate.Release({{m.name, m.index}}, /*handed_over=*/true);
    ASSERT_OK(gate.SetSpec(Placement::Jump(3, 3).spec()));  // the move 2 -> 3 ended
    if (take_between) {
      std::optional<PlacementGate::HandedOver> first = gate.TakeHandedOver();
      ASSERT_TRUE(first.has_value());
      EXPECT_EQ(first->version, 2u);
      ASSERT_EQ(first->blocks.size(), 1u);
      EXPECT_EQ(first->blocks[0], PlacementGate::BlockKey(m.name, m.index));
    }
    // 3 -> 2: the block comes back to server 0.
    ASSERT_OK(gate.SetSpec(Moving(4, 3, 2)));
    ASSERT_OK(gate.CheckReceive(4, m.name, m.index));
    gate.Received({{m.name, m.index}});
    ASSERT_OK(gate.SetSpec(Placement::Jump(2, 5).spec()));  // the move 3 -> 2 ended
    EXPECT_OK(gate.CheckBlock(m.name, ref));  // served here again
    EXPECT_FALSE(gate.TakeHandedOver().has_value()) << "server 0 handed nothing over in 3 -> 2";
  }
}

}  // namespace
}  // namespace pserver
