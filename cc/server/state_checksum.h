// ShardStateChecksum: a CRC32C (cc/core/crc32c.h) of one shard's whole
// state, taken in a canonical order, so that two replicas that applied the
// same writes in the same order report the same value whatever they served
// in between (reads, LRU touches of sparse rows, hash-map iteration order).
//
//   PS_ASSIGN_OR_RETURN(StoreSnapshot snapshot, dispatcher.Snapshot());
//   PS_ASSIGN_OR_RETURN(uint32_t crc, ShardStateChecksum(snapshot));
//
// What it covers (the checkpoint's content, docs/checkpoint-format.md):
// - the store: whether FinishInit ran; every block in (name, block index)
//   order with its element type, shape, block reference, configuration,
//   content and optimizer state (steps and every slot);
// - every extension, by name: sparse and KV tables ("table/<name>") as their
//   name, configuration, rows sorted by key (values, optimizer state, step),
//   keys seen but not admitted yet sorted by key (with their counts), and the
//   count of keys pushed; worker clocks ("clocks/<name>") sorted by worker;
//   held-back BSP adds ("pending/<name>") in clock order as held; the applied
//   request ids ("pserver.applied_sequences") sorted by client and sequence;
//   any other extension as its bytes.
// What it leaves out, being no state a write sets: the read counters
// (keys pulled) and the count of rows evicted by TTL (a row evicted is
// still absent from the rows compared).
//
// Every field is framed by its length, so that moving bytes from one field to
// the next changes the checksum. A 32-bit checksum: two different states
// collide with probability about 2^-32.
//
// Thread safety: a plain function of its argument.
#ifndef PSERVER_CC_SERVER_STATE_CHECKSUM_H_
#define PSERVER_CC_SERVER_STATE_CHECKSUM_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "cc/core/parameter_store.h"

namespace pserver {

// DATA_LOSS naming the extension when a table, clock or applied-id
// extension does not parse or its arrays disagree with its row count.
absl::StatusOr<uint32_t> ShardStateChecksum(const StoreSnapshot& snapshot);

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_STATE_CHECKSUM_H_
