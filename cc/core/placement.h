// Placement: which server holds a parameter, and how a large parameter is cut
// into blocks spread over all servers.
//
//   Placement placement(/*num_servers=*/3, /*block_bytes=*/1 << 20);
//   int home = placement.HomeServer("w");          // fnv1a64("w") % 3
//   for (const BlockSpec& b : placement.Blocks("w", n, 4)) { ... b.server ... }
//
// The hash is FNV-1a 64 over the name's bytes, so every client, in any
// language, places a name on the same server. Block b of a parameter lives on
// (home + b) % N. Every client of a cluster must use the same block size.
// Immutable, so thread-safe.
#ifndef PSERVER_CC_CORE_PLACEMENT_H_
#define PSERVER_CC_CORE_PLACEMENT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pserver/v1/table.pb.h"

namespace pserver {

uint64_t Fnv1a64(absl::string_view bytes);

// The server (0 .. num_servers-1) holding table key `key`. HASH: a
// splitmix64 mix of the key modulo N, so sequential keys spread evenly.
// RANGE: [range_begin, range_end) (range_end 0: 2^64) cut into N equal
// contiguous ranges; INVALID_ARGUMENT for a key outside it.
absl::StatusOr<int> KeyServer(uint64_t key, const v1::Partitioning& partitioning, int num_servers);

struct BlockSpec {
  uint32_t index = 0;
  uint32_t count = 1;
  uint64_t offset = 0;    // first element
  uint64_t elements = 0;  // elements in this block
  int server = 0;
};

class Placement {
 public:
  // num_servers >= 1 and block_bytes >= 1 (the client checks its options).
  Placement(int num_servers, size_t block_bytes);

  int num_servers() const { return num_servers_; }
  size_t block_bytes() const { return block_bytes_; }

  int HomeServer(absl::string_view name) const;
  int ServerOf(absl::string_view name, uint32_t block) const;

  // Elements per block for values of `element_size` bytes (at least 1).
  uint64_t BlockElements(size_t element_size) const;
  uint32_t BlockCount(uint64_t elements, size_t element_size) const;

  // The blocks of a parameter of `elements` values, in order.
  std::vector<BlockSpec> Blocks(absl::string_view name, uint64_t elements,
                                size_t element_size) const;

 private:
  int num_servers_;
  size_t block_bytes_;
};

}  // namespace pserver

#endif  // PSERVER_CC_CORE_PLACEMENT_H_
