#include "cc/server/process_slots.h"

#include <optional>
#include <vector>

#include "gtest/gtest.h"

namespace pserver {
namespace {

google::protobuf::RepeatedPtrField<std::string> Replicas(std::initializer_list<const char*> ids) {
  google::protobuf::RepeatedPtrField<std::string> out;
  for (const char* id : ids) *out.Add() = id;
  return out;
}

TEST(ProcessSlotsTest, AShardHeldOrBackedUpByAnotherSlotOfTheProcessIsOurs) {
  ProcessSlots slots;
  slots.Add("own");
  slots.Add("slot-1");
  // Held by this process's own server, or backed up by its other slot.
  EXPECT_TRUE(slots.HoldsAnyOf("own", Replicas({}), "slot-1"));
  EXPECT_TRUE(slots.HoldsAnyOf("elsewhere", Replicas({"x", "own"}), "slot-1"));
  // Only other processes' servers: free to back up.
  EXPECT_FALSE(slots.HoldsAnyOf("elsewhere", Replicas({"x"}), "slot-1"));
  // The asking slot itself does not count (it may re-read its own shard).
  EXPECT_FALSE(slots.HoldsAnyOf("elsewhere", Replicas({"slot-1"}), "slot-1"));
  // A server that left the process no longer counts.
  slots.Remove("own");
  EXPECT_FALSE(slots.HoldsAnyOf("own", Replicas({}), "slot-1"));
}

TEST(ProcessSlotsTest, AShardAnotherSlotCopiedIsTakenUntilItLeaves) {
  ProcessSlots slots;
  slots.Add("slot-1");
  slots.Add("slot-2");
  // slot-1 copied shard 3 and is joining (not in /shards/3 yet).
  slots.Attached("slot-1", 3);
  EXPECT_TRUE(slots.AnotherAttachedTo(3, "slot-2"));
  EXPECT_FALSE(slots.AnotherAttachedTo(3, "slot-1"));  // itself
  EXPECT_FALSE(slots.AnotherAttachedTo(4, "slot-2"));
  slots.Detached("slot-1");
  EXPECT_FALSE(slots.AnotherAttachedTo(3, "slot-2"));
  slots.Attached("slot-1", 3);
  slots.Remove("slot-1");  // a slot that left the process
  EXPECT_FALSE(slots.AnotherAttachedTo(3, "slot-2"));
}

TEST(ProcessSlotsTest, ASlotLeavesAnOverBackedShardOnlyForOneLackingABackupItMayTake) {
  EXPECT_EQ(ProcessSlots(2).backups_wanted(), 2);
  EXPECT_EQ(ProcessSlots(0).backups_wanted(), 1);  // at least one
  // Shard 0 (mine) has 2 live backups, 1 wanted; shard 2 has none.
  const std::vector<ShardBackups> shards = {
      {.shard = 1, .live = 1, .eligible = true},
      {.shard = 2, .live = 0, .eligible = true},
  };
  EXPECT_EQ(ShardToRebalanceTo(0, 2, 1, shards), 2u);
  // Not over: stay, whatever lacks a backup.
  EXPECT_EQ(ShardToRebalanceTo(0, 1, 1, shards), std::nullopt);
  // The shard lacking one is this process's (not eligible): stay.
  EXPECT_EQ(ShardToRebalanceTo(0, 2, 1, {{.shard = 1, .live = 1, .eligible = true},
                                         {.shard = 2, .live = 0, .eligible = false}}),
            std::nullopt);
  // Every other shard has its backups: stay.
  EXPECT_EQ(ShardToRebalanceTo(0, 2, 1, {{.shard = 1, .live = 1, .eligible = true}}),
            std::nullopt);
  // The fewest first, then the lowest index; its own shard never.
  EXPECT_EQ(ShardToRebalanceTo(0, 3, 2, {{.shard = 0, .live = 0, .eligible = true},
                                         {.shard = 4, .live = 1, .eligible = true},
                                         {.shard = 5, .live = 0, .eligible = true},
                                         {.shard = 6, .live = 0, .eligible = true}}),
            5u);
}

}  // namespace
}  // namespace pserver
