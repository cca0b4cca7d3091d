#include "cc/server/checkpoint_schedule.h"

#include "gtest/gtest.h"

namespace pserver {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(CheckpointScheduleTest, SavesAreAnIntervalApartStartToStart) {
  // A save that took 0.4 s of a 1 s interval: the next starts 1 s after the
  // last one started, not 1 s after it ended (which made checkpoints 1.4 s
  // apart and the newest up to 1.8 s old).
  EXPECT_EQ(NextPeriodicSave(kT0, absl::Seconds(1), kT0 + absl::Milliseconds(400)),
            kT0 + absl::Seconds(1));
  EXPECT_FALSE(SaveOverran(kT0, kT0 + absl::Milliseconds(400), absl::Seconds(1)));
}

TEST(CheckpointScheduleTest, AnOverrunningSaveIsFollowedAtOnceNotQueued) {
  const absl::Time finished = kT0 + absl::Milliseconds(2500);
  EXPECT_EQ(NextPeriodicSave(kT0, absl::Seconds(1), finished), finished);
  EXPECT_TRUE(SaveOverran(kT0, finished, absl::Seconds(1)));
}

}  // namespace
}  // namespace pserver
