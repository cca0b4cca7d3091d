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

}  // namespace
}  // namespace pserver
