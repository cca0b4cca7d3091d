// Placement: which server holds a parameter's blocks and a table's keys.
//
//   Placement placement(/*num_servers=*/3, /*block_bytes=*/1 << 20);  // JUMP
//   int home = placement.HomeServer("w");          // = ServerOf("w", 0)
//   for (const BlockSpec& b : placement.Blocks("w", n, 4)) { ... b.server ... }
//   absl::StatusOr<int> s = KeyServer(key, table_config.partitioning(), placement);
//
// A placement is a value: a kind, a version and the server count
// (v1::Placement, proto/pserver/v1/checkpoint.proto). The client, the servers
// (loading a checkpoint of another placement) and the resharder all map
// through these functions, so they agree by construction.
//
// JUMP (the default): block b of a parameter lives on
// JumpConsistentHash(Mix64(fnv1a64(name) + b), N), a HASH-partitioned table
// key on JumpConsistentHash(Mix64(key), N). Going from N to N+1 servers moves
// exactly the blocks and keys that land on the new server, 1/(N+1) of them in
// expectation, and N -> N-1 moves only the last server's (docs/elastic.md
// has the measured fractions). The hash is FNV-1a 64 over the name's bytes,
// so every client, in any language, places a name the same way.
//
// MODULO: the placement before versioned placements (checkpoints whose
// manifest records none): fnv1a64(name) % N, block b on (home + b) % N, a key
// on Mix64(key) % N. Kept so that their checkpoints can be mapped.
//
// RANGE-partitioned tables are cut into N equal contiguous ranges under
// either kind (the user chose the ranges).
//
// Every client of a cluster must use the same block size. Immutable, so
// thread-safe.
#ifndef PSERVER_CC_CORE_PLACEMENT_H_
#define PSERVER_CC_CORE_PLACEMENT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pserver/v1/checkpoint.pb.h"
#include "pserver/v1/table.pb.h"

namespace pserver {

// The most servers a placement maps to.
inline constexpr uint32_t kMaxPlacementServers = 4096;

uint64_t Fnv1a64(absl::string_view bytes);

// splitmix64's finalizer: a bijection that spreads sequential inputs.
uint64_t Mix64(uint64_t x);

// Lamping & Veach's jump consistent hash: a bucket in [0, num_buckets)
// (num_buckets >= 1); growing num_buckets by one moves a key only to the new
// bucket.
int JumpConsistentHash(uint64_t key, int num_buckets);

// OK when `spec` is one a Placement can be built from: a known kind and
// 1 <= num_servers <= kMaxPlacementServers. INVALID_ARGUMENT naming the field
// otherwise.
absl::Status CheckPlacementSpec(const v1::Placement& spec);

struct BlockSpec {
  uint32_t index = 0;
  uint32_t count = 1;
  uint64_t offset = 0;    // first element
  uint64_t elements = 0;  // elements in this block
  int server = 0;
};

class Placement {
 public:
  // The placement a cluster of `num_servers` derives without etcd: JUMP,
  // version 0. num_servers >= 1 and block_bytes >= 1 (the client checks its
  // options; smaller values are raised to 1).
  Placement(int num_servers, size_t block_bytes);
  // JUMP over `num_servers` (>= 1) at `version`, as etcd would hold it.
  static Placement Jump(int num_servers, uint64_t version, size_t block_bytes = 1 << 20) {
    return Placement(num_servers, block_bytes, v1::Placement::JUMP, version);
  }
  // `spec` must pass CheckPlacementSpec.
  static absl::StatusOr<Placement> FromSpec(const v1::Placement& spec, size_t block_bytes);

  int num_servers() const { return num_servers_; }
  size_t block_bytes() const { return block_bytes_; }
  v1::Placement::Kind kind() const { return kind_; }
  uint64_t version() const { return version_; }
  v1::Placement spec() const;

  int HomeServer(absl::string_view name) const;
  int ServerOf(absl::string_view name, uint32_t block) const;
  // A HASH-partitioned table key's server (see KeyServer for both kinds).
  int HashKeyServer(uint64_t key) const;

  // Elements per block for values of `element_size` bytes (at least 1).
  uint64_t BlockElements(size_t element_size) const;
  uint32_t BlockCount(uint64_t elements, size_t element_size) const;

  // The blocks of a parameter of `elements` values, in order.
  std::vector<BlockSpec> Blocks(absl::string_view name, uint64_t elements,
                                size_t element_size) const;

 private:
  Placement(int num_servers, size_t block_bytes, v1::Placement::Kind kind, uint64_t version);

  int num_servers_;
  size_t block_bytes_;
  v1::Placement::Kind kind_;
  uint64_t version_;
};

// The server (0 .. N-1) holding table key `key`. HASH: the placement's
// HashKeyServer. RANGE: [range_begin, range_end) (range_end 0: 2^64) cut into
// N equal contiguous ranges; INVALID_ARGUMENT for a key outside it.
absl::StatusOr<int> KeyServer(uint64_t key, const v1::Partitioning& partitioning,
                              const Placement& placement);

// Live moves hand a table's keys over bucket by bucket (docs/elastic.md): a
// key's bucket, one of kKeyBuckets, comes from its hash alone (not from any
// server count), so both sides of a move agree on it.
inline constexpr uint32_t kKeyBuckets = 256;
uint32_t KeyBucket(uint64_t key);

// True when a and b map every block and key the same way (same kind and
// count; the version does not matter; one server is one server).
bool SameMapping(const v1::Placement& a, const v1::Placement& b);

// The answer of a server that does not own a block under its current
// placement (live moves, docs/elastic.md): FAILED_PRECONDITION whose message
// starts with kPlacementMovedPrefix and the version, so that it survives
// every transport (gRPC, bulk channel, in-process) as plain code + text:
// "placement moved: version 3: parameter 'w' block 2 of 4 is on server 2
// under it, not on this server 0; nothing of the request was applied;
// re-read /placement and re-route".
inline constexpr char kPlacementMovedPrefix[] = "placement moved: version ";
absl::Status PlacementMoved(uint64_t version, absl::string_view what, int owner, int self);
// The version a PlacementMoved status names; nullopt for any other status.
std::optional<uint64_t> PlacementMovedVersion(const absl::Status& status);

}  // namespace pserver

#endif  // PSERVER_CC_CORE_PLACEMENT_H_
