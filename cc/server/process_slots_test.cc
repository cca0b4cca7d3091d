#include "cc/server/process_slots.h"

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

}  // namespace
}  // namespace pserver
