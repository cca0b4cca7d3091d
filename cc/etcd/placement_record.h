// The cluster's placement in etcd (<prefix>/placement, a v1::Placement in
// protobuf JSON, no lease): which kind of mapping and over how many servers,
// with a version bumped on every change (cc/core/placement.h).
//
//   // A server, once it knows the desired count (after claiming its index):
//   PS_ASSIGN_OR_RETURN(v1::Placement placement, EnsurePlacement(*etcd, desired));
//   // A client, at connect:
//   PS_ASSIGN_OR_RETURN(std::optional<v1::Placement> placement, ReadPlacement(*etcd));
//
// EnsurePlacement writes {version 1, JUMP, desired} when the key is missing,
// and {version + 1, JUMP, desired} when it holds another count or kind, each
// in a transaction guarded by what it read, so concurrent servers agree on
// one value (the first write wins; the others read it back). A placement
// that is moving (a live move under way, psctl scale) is returned as it is,
// whatever the count: the move's coordinator owns the key. A server
// records its version in the checkpoints it writes, and with
// --placement_redirects refuses blocks it no longer owns under the newest
// one (cc/server/placement_gate.h); clients do not re-route by it yet.
//
// etcd's contents are untrusted: a value that is not a well-formed placement
// is INVALID_ARGUMENT naming the key and what is wrong, and nothing is
// written over it (an operator fixes or deletes it: docs/operations.md).
//
// Thread safety: plain functions of their arguments (and the client's).
#ifndef PSERVER_CC_ETCD_PLACEMENT_RECORD_H_
#define PSERVER_CC_ETCD_PLACEMENT_RECORD_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cc/etcd/etcd_client.h"
#include "pserver/v1/checkpoint.pb.h"

namespace pserver {

// The largest /placement value read; a longer one is refused unparsed.
inline constexpr size_t kMaxPlacementRecordBytes = 4 << 10;

// The value of /placement. INVALID_ARGUMENT naming the key when it is too
// long, not JSON of a Placement, of a kind other than JUMP (an unknown one
// included), version 0, or a server count outside [1, kMaxPlacementServers].
absl::StatusOr<v1::Placement> ParsePlacementRecord(absl::string_view value);
std::string FormatPlacementRecord(const v1::Placement& placement);

// /placement as it is; nullopt when the key is missing.
absl::StatusOr<std::optional<v1::Placement>> ReadPlacement(
    EtcdClient& etcd, absl::Time deadline = absl::InfiniteFuture());

// /placement for `num_servers` servers (JUMP), written if needed (see
// above); returns what etcd holds afterwards. INVALID_ARGUMENT for a
// malformed value (nothing written), ABORTED when it kept changing under
// it for 16 tries.
absl::StatusOr<v1::Placement> EnsurePlacement(EtcdClient& etcd, uint32_t num_servers,
                                              absl::Time deadline = absl::InfiniteFuture());

}  // namespace pserver

#endif  // PSERVER_CC_ETCD_PLACEMENT_RECORD_H_
