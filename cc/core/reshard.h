// Offline resharding: the checkpoints of a cluster of N servers rewritten as
// the checkpoints a cluster of M servers loads, every dense block, table row
// (with its optimizer state) and held-back BSP add placed where M servers
// look for it (cc/core/placement.h, the client's own placement).
//
//   ReshardOptions options;
//   options.num_servers = 5;
//   options.progress = [](const std::string& line) { std::cerr << line << "\n"; };
//   PS_ASSIGN_OR_RETURN(ReshardResult result,
//                       ReshardCheckpoints("/ckpt/job", "/ckpt/job-5", options));
//   // then start 5 servers with --checkpoint_dir=/ckpt/job-5 --num_servers=5
//
// Input: a cluster's --checkpoint_dir, holding shard-<k> directories for k in
// 0..N-1. Of each shard the newest checkpoint that verifies whole (every
// checksum, as loading does) is used; newer damaged ones are skipped and
// listed in ReshardResult::notes. N is the server count the manifests record
// (or, for checkpoints that record none, the highest shard + 1).
//
// Output: `to` (which must not exist or be an empty directory) gets
// shard-0 .. shard-<M-1>, each holding one checkpoint in the same format,
// numbered one above the newest input checkpoint, of the same cluster, with
// num_servers = M and placement JUMP over M. Everything is written under a temporary sibling
// directory (".<name of to>.tmp-reshard-<random>"), fsynced and renamed to
// `to` at the end: on any error nothing is left under `to`.
//
// What happens to per-server state:
//   - dense blocks keep their cutting (index, count, offset: the client's
//     block size does not depend on the server count) and move to
//     Placement(M).ServerOf(name, index), with config, optimizer slots and
//     steps, whatever placement the input was laid out by (MODULO for
//     checkpoints from before placements were recorded, JUMP since);
//   - table rows, their optimizer state and step counts, and keys waiting
//     for admission move to KeyServer(key, partitioning, Placement(M)); a
//     table is on every output shard (also one that gets no rows). The
//     counters evictions, keys_pulled and keys_pushed are summed onto shard
//     0, so the cluster's totals are kept;
//   - worker clocks ("clocks/<table>") are the same on every output shard:
//     each worker found on any input shard, at the lowest clock any input
//     shard records for it (a lower clock only makes consistent reads wait,
//     never lets one through early); disagreements are listed in notes;
//   - held-back BSP adds ("pending/<table>") are split by key and move with
//     their rows, keeping their clock and, per key, their order;
//   - exactly-once sets ("pserver.applied_sequences") are dropped: clients'
//     per-server sequences mean nothing to another server count (the job is
//     restarted after an offline reshard);
//   - collectives are never in checkpoints.
// An extension the resharder does not know is refused (FAILED_PRECONDITION
// naming it) rather than dropped.
//
// Memory: one output shard's blocks and rows at a time, plus one input
// table part; each input table part is read once per output shard.
//
// Errors (nothing written): INVALID_ARGUMENT for bad options or `from` ==
// `to`; NOT_FOUND when `from` holds no shard-<k> checkpoints;
// FAILED_PRECONDITION for a missing shard, checkpoints of different
// clusters or server counts, a `to` that is not an empty directory, a table
// whose rows would exceed its eviction.capacity on one output server;
// DATA_LOSS naming each checkpoint of a shard when none verifies, or for
// inconsistent content (a block twice or missing, tables that disagree).
#ifndef PSERVER_CC_CORE_RESHARD_H_
#define PSERVER_CC_CORE_RESHARD_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cc/core/checkpoint.h"
#include "cc/core/placement.h"

namespace pserver {

// The most servers a reshard writes for.
inline constexpr uint32_t kMaxReshardServers = kMaxPlacementServers;

struct ReshardOptions {
  // M: the server count to write for, 1 .. kMaxReshardServers. The output is
  // laid out by Placement(M) (JUMP) and its manifests record that placement.
  uint32_t num_servers = 0;
  // When set, of each shard only checkpoints written for a placement that
  // MapsLike this one are read (the newest of them that verifies), and a
  // shard with none is taken as absent: how a server picks one generation
  // out of a directory that holds several. Unset: the newest of each shard.
  std::optional<v1::Placement> from_placement;
  // Permission bits of the files written (as CheckpointWriteOptions).
  uint32_t file_mode = kDefaultCheckpointFileMode;
  // Called with one line of progress at a time (shards read and verified,
  // output shards written with their blocks, rows and bytes). May be empty.
  std::function<void(const std::string&)> progress;
};

struct ReshardResult {
  uint32_t from_servers = 0;
  uint32_t to_servers = 0;
  std::string cluster;
  uint64_t sequence = 0;  // of every checkpoint written
  std::vector<std::string> inputs;  // the checkpoint read for each input shard
  std::vector<CheckpointInfo> written;  // one per output shard, paths under `to`
  uint64_t blocks = 0;      // dense blocks written
  uint64_t table_rows = 0;  // table rows written
  uint64_t bytes = 0;       // data bytes written (values, state, extensions)
  // What the caller should know: skipped damaged checkpoints, clocks that
  // disagreed, state dropped.
  std::vector<std::string> notes;
};

absl::StatusOr<ReshardResult> ReshardCheckpoints(const std::string& from, const std::string& to,
                                                 const ReshardOptions& options);

// Output shard `shard` (< options.num_servers) of the same reshard, in memory
// and written nowhere: what a server of a cluster of M loads at start from
// N servers' checkpoints. result.written stays empty; result.sequence is the
// one a checkpoint of it should get. Errors as ReshardCheckpoints.
struct ReshardedShard {
  StoreSnapshot snapshot;
  ReshardResult result;
};
absl::StatusOr<ReshardedShard> ReshardShard(const std::string& from, uint32_t shard,
                                            const ReshardOptions& options);

// The shard-<k> directories of cluster checkpoint directory `from` that hold
// checkpoints, by k, each's oldest first (ListCheckpoints). NOT_FOUND when
// `from` is not a directory.
absl::StatusOr<std::map<uint32_t, std::vector<CheckpointEntry>>> ListShardCheckpoints(
    const std::string& from);

// Whether data laid out for placement `a` is where placement `b` looks for
// it: the same kind and server count, where a count of 0 (unknown: a
// server without --num_servers, or an old manifest) matches any, and with
// one server every kind is the same.
bool MapsLike(const v1::Placement& a, const v1::Placement& b);

// What a server of shard `shard` with placement `current`, started on
// cluster checkpoint directory `dir`, must reshard from: the placement of
// the newest checkpoint (by sequence, manifests read, not verified) under any
// shard-<k> of `dir` that does not MapsLike `current`, when it is newer than
// every checkpoint of shard-<shard> that does. nullopt: load as usual.
absl::StatusOr<std::optional<v1::Placement>> PlacementToReshardFrom(const std::string& dir,
                                                                   uint32_t shard,
                                                                   const v1::Placement& current);

}  // namespace pserver

#endif  // PSERVER_CC_CORE_RESHARD_H_
