#include "cc/client/testing/placement_moves.h"

#include "absl/strings/str_cat.h"
#include "cc/core/placement.h"
#include "gtest/gtest.h"

namespace pserver {
namespace testing {

std::string NameMoving(int from, int to) {
  for (int i = 0; i < 10000; ++i) {
    const std::string name = absl::StrCat("p", i);
    if (Placement::Jump(2, 1).ServerOf(name, 0) == from &&
        Placement::Jump(3, 1).ServerOf(name, 0) == to) {
      return name;
    }
  }
  ADD_FAILURE() << "no name from server " << from << " of 2 to " << to << " of 3";
  return "";
}

v1::Placement PlacementSpec(uint64_t version, uint32_t servers, uint32_t from) {
  v1::Placement spec;
  spec.set_version(version);
  spec.set_kind(v1::Placement::JUMP);
  spec.set_num_servers(servers);
  spec.set_moving(from != 0);
  spec.set_from_num_servers(from);
  return spec;
}

}  // namespace testing
}  // namespace pserver
