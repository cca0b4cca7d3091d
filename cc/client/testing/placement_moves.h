// Test helpers for live moves (docs/elastic.md): names whose block moves
// between given servers when 2 servers become 3, and /placement records.
//
//   const std::string name = NameMoving(/*from=*/0, /*to=*/2);
//   client->UpdatePlacement(PlacementSpec(/*version=*/2, /*servers=*/3, /*from=*/2));
#ifndef PSERVER_CC_CLIENT_TESTING_PLACEMENT_MOVES_H_
#define PSERVER_CC_CLIENT_TESTING_PLACEMENT_MOVES_H_

#include <cstdint>
#include <string>

#include "pserver/v1/checkpoint.pb.h"

namespace pserver {
namespace testing {

// The first name "p<i>" whose block 0 is on server `from` of 2 (JUMP) and
// on server `to` of 3; a test failure and "" when none of 10000 is.
std::string NameMoving(int from, int to);

// A JUMP /placement record: `servers` servers at `version`, moving from
// `from` servers when `from` is not 0.
v1::Placement PlacementSpec(uint64_t version, uint32_t servers, uint32_t from = 0);

}  // namespace testing
}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_TESTING_PLACEMENT_MOVES_H_
