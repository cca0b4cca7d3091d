// A shard's configuration in etcd (/shards/<i>, a v1::ShardConfig in
// protobuf JSON, no lease): its epoch and holder. It changes only in etcd
// transactions: a server claiming index i writes epoch + 1 in the same
// transaction as its claim of /ps/<i>, guarded by the mod_revision it read,
// so two claims cannot both bump from the same epoch (docs/replication.md).
//
//   absl::StatusOr<KeyValue> current = etcd->Get(etcd_keys::ShardKey(i));
//   PS_ASSIGN_OR_RETURN(ShardClaim claim,
//                       NextShardClaim(i, current.ok() ? &*current : nullptr, id, address));
//   // claim.compare and claim.put go into the transaction that claims /ps/<i>.
//
// etcd's contents are untrusted: a value that is not a well-formed config
// is INVALID_ARGUMENT naming the key and what is wrong, never a crash.
//
// Thread safety: plain functions of their arguments.
#ifndef PSERVER_CC_ETCD_SHARD_CONFIG_H_
#define PSERVER_CC_ETCD_SHARD_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cc/etcd/etcd_client.h"
#include "pserver/v1/registry.pb.h"

namespace pserver {

// The largest /shards/<i> value read; a longer one is refused unparsed.
inline constexpr size_t kMaxShardConfigBytes = 64 << 10;
// The most replicas a config may list.
inline constexpr int kMaxShardReplicas = 64;

// The value of /shards/<shard> (protobuf JSON). INVALID_ARGUMENT naming the
// key when it is not JSON of a ShardConfig, its epoch is 0 or 2^64-1, its
// holder is not 1-64 letters and digits, its holder address is not printable
// ASCII of at most 300 bytes, a replica is not an instance id, or it is too
// long.
absl::StatusOr<v1::ShardConfig> ParseShardConfig(uint32_t shard, absl::string_view value);
std::string FormatShardConfig(const v1::ShardConfig& config);

// The writes of a claim of shard `shard` by `holder`.
struct ShardClaim {
  v1::ShardConfig config;  // the new one: epoch one above the current
  std::string value;       // FormatShardConfig(config)
  Compare unchanged;       // /shards/<shard> is still what was read
  TxnOp put;               // writes `value`
};

// The next claim over `current` (null: the key does not exist, epoch 0):
// epoch max(current's, floor) + 1. `floor` is the highest epoch the claimer
// knows of otherwise (its checkpoints on disk), so that a claim after etcd
// lost its data never goes below the epochs already written.
// INVALID_ARGUMENT when `current` does not parse (ParseShardConfig): a
// server does not claim over a config it cannot read.
absl::StatusOr<ShardClaim> NextShardClaim(uint32_t shard, const KeyValue* current,
                                          absl::string_view holder,
                                          absl::string_view holder_address, uint64_t floor = 0);

// ---- replica sets (issue 15; docs/replication.md) -------------------------
// With --replicas=R a shard lives on R servers: its holder (the primary) and
// ShardConfig.replicas, the backups' instance ids in takeover order (the
// holder is never among them; empty at R=1). Every change below is a new
// config one epoch up, written in a transaction guarded by the mod_revision
// read, so two changes cannot both be made from the same epoch.

// The server indices that start with a copy of shard `shard`:
// shard, shard+1, ..., shard+R-1 (mod num_servers), the primary first.
// INVALID_ARGUMENT unless 1 <= replicas <= num_servers and shard < num_servers.
absl::StatusOr<std::vector<uint32_t>> InitialReplicaIndices(uint32_t shard, uint32_t num_servers,
                                                            uint32_t replicas);
// The shards server `index` starts with a copy of (the inverse of
// InitialReplicaIndices): index, index-1, ..., index-R+1 (mod num_servers),
// its own shard first. The same errors.
absl::StatusOr<std::vector<uint32_t>> ShardsStartingOn(uint32_t index, uint32_t num_servers,
                                                       uint32_t replicas);

// A backup taking over from a holder that failed: `successor`, which must
// be listed in current's replicas, becomes holder at `successor_address`;
// the old holder leaves the set; the other backups keep their order, or,
// with `drop_other_backups`, leave the set too (they copy the successor's
// state anew: one may hold a write the old primary shipped to it and not
// to the successor, never acknowledged, which the successor's log would
// number differently).
// FAILED_PRECONDITION naming the key when `successor` is not a backup of
// the current config (only a replica holds the shard's state);
// INVALID_ARGUMENT when `current` does not parse.
absl::StatusOr<ShardClaim> NextTakeover(uint32_t shard, const KeyValue& current,
                                        absl::string_view successor,
                                        absl::string_view successor_address,
                                        bool drop_other_backups = false);
// The holder dropping a backup it cannot reach (before it acknowledges
// anything more without it): the same holder, `backup` out of the set.
// FAILED_PRECONDITION when `holder` is not current's holder (a stale
// primary changes nothing) or `backup` is not listed.
absl::StatusOr<ShardClaim> NextWithoutReplica(uint32_t shard, const KeyValue& current,
                                              absl::string_view holder,
                                              absl::string_view backup);
// The same for several backups at once (one epoch up): each must be listed.
absl::StatusOr<ShardClaim> NextWithoutReplicas(uint32_t shard, const KeyValue& current,
                                               absl::string_view holder,
                                               const std::vector<std::string>& backups);
// The holder adding a backup that has copied its state (a standby attaching,
// docs/replication.md): the same holder, `backup` last in the set.
// FAILED_PRECONDITION when `holder` is not current's holder or `backup` is
// already listed (or 64 are); INVALID_ARGUMENT when `backup` is not an
// instance id or is the holder.
absl::StatusOr<ShardClaim> NextWithReplica(uint32_t shard, const KeyValue& current,
                                           absl::string_view holder, absl::string_view backup);

}  // namespace pserver

#endif  // PSERVER_CC_ETCD_SHARD_CONFIG_H_
