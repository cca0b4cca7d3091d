// BlockMover: a server's side of a live move (docs/elastic.md, issue 16).
//
// While etcd's /placement is *moving* (version V: from_num_servers N to
// num_servers M), the coordinator (psctl scale, cc/server/move_coordinator.h)
// calls MoveBlocks(V) on each server. The server then, for every dense block
// it owns under N whose owner under M is another server j, in batches of at
// most batch_bytes:
//   1. holds writes to the block (PlacementGate::Hold, taken with the
//      dispatcher's apply lock held exclusively: no write to it is half
//      applied; writes to other blocks go on),
//   2. copies its values and optimizer state as the files of one checkpoint
//      (SnapshotToFiles, the format AttachStandby carries) and sends them to
//      server j (ReceiveBlocks, a server-to-server call to j's address in
//      /ps/<j>, dialled with this server's own credentials: its TLS
//      certificate and --peer_token_file, cc/server/peer_channel.h), which
//      loads them (LoadSnapshotFiles, every CRC checked),
//      checks that each block is its own under M, merges them into its store
//      (ParameterStore::Merge) and serves them from then on,
//   3. refuses the block from then on with PlacementMoved(V)
//      (PlacementGate::Release). If the copy fails the block is served here
//      again and MoveBlocks fails; calling it again sends what is left.
//
// Then, table by table (MoveTables), the same for table keys, by key bucket
// (KeyBucket, 256 a table) instead of by block: a run of buckets at a time
// (as many as hold about batch_bytes of the table's rows) is held
// (PlacementGate::HoldBuckets), the rows of those buckets that leave this
// server, with their optimizer state and step counts, keys awaiting
// admission and held-back BSP adds, go to each new owner as the table's
// checkpoint extensions (Tables::ExportRows: the checkpoint's table
// section), with the table's config and worker clocks, so that a server
// without the table gets it; every other server gets the bucket range too,
// without rows, so that each new owner knows those buckets are handed over.
// The receiver takes them all or nothing (Tables::ImportRows). Table rows
// move on replicated shards and with checkpoints as blocks do (below).
//
// Not moved: the exactly-once ids: a client
// numbers its pushes per server, so the old owner keeps its ids (a retried
// push applied before the move is acknowledged there) and the new owner's
// ids start from the client's own sequence for it.
//
// Thread-safe; one MoveBlocks runs at a time.
#ifndef PSERVER_CC_SERVER_MOVE_H_
#define PSERVER_CC_SERVER_MOVE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cc/core/checkpoint.h"
#include "cc/core/parameter_store.h"
#include "cc/core/tables.h"
#include "cc/server/dispatcher.h"
#include "cc/server/peer_channel.h"
#include "cc/server/placement_gate.h"
#include "pserver/v1/service.pb.h"

namespace pserver {

// The default and bounds of --move_batch_bytes.
inline constexpr uint64_t kDefaultMoveBatchBytes = 16 << 20;
inline constexpr uint64_t kMinMoveBatchBytes = 1 << 10;

// What a DROPPED MoveMarks dropped (DropMarked, below).
struct DroppedMarked {
  uint64_t bytes = 0;  // values and optimizer state of the blocks
  uint64_t rows = 0;
};

struct BlockMoverOptions {
  Dispatcher* dispatcher = nullptr;  // must outlive it (its apply lock)
  ParameterStore* store = nullptr;   // must outlive it
  Tables* tables = nullptr;          // must outlive it; null: no tables move
  PlacementGate* gate = nullptr;     // must outlive it
  // Where server `index` listens (etcd /ps/<index>); an error while it is
  // not registered.
  std::function<absl::StatusOr<std::string>(uint32_t index)> address_of;
  // What this server presents to the new owner (its TLS certificate, the
  // token of --peer_token_file): ReceiveBlocks needs the admin role.
  PeerCredentials peer;
  CheckpointWriteOptions write_options;  // how a copy is written
  // The most bytes of values and optimizer state sent in one ReceiveBlocks
  // (a block larger than this goes alone): --move_batch_bytes.
  uint64_t batch_bytes = kDefaultMoveBatchBytes;
  // How long one ReceiveBlocks may take, retries of UNAVAILABLE included.
  absl::Duration send_timeout = absl::Seconds(60);
  // Whether this server replicates its shard (it is a primary with
  // --accept_standbys; null: no). Then the moves are made to survive a kill
  // of either side (below, "Moves with replication").
  std::function<bool()> replicated;
  // Testing only (--testing_move_stall_after_batches): when > 0, `stall` is
  // called (and is expected not to return before the process is killed)
  // once this server handed over that many batches in one MoveBlocks (after
  // the last reached the new owner, before it is marked handed over), and
  // before it takes one more ReceiveBlocks batch than that. A batch is one
  // ReceiveBlocks of blocks, or one run of a table's key buckets (sent to
  // every other server).
  uint32_t stall_after_batches = 0;
  std::function<void()> stall;
  std::function<void(const std::string& line)> log;
};

class BlockMover {
 public:
  explicit BlockMover(BlockMoverOptions options) : options_(std::move(options)) {}
  // Waits for a MoveAsync under way.
  ~BlockMover();

  // MoveBlocks (above). UNAVAILABLE while this server has not seen
  // placement `version` yet (retry); FAILED_PRECONDITION when etcd's
  // placement is another version or is not moving, naming both.
  absl::StatusOr<v1::MoveBlocksResponse> Move(const v1::MoveBlocksRequest& request)
      ABSL_LOCKS_EXCLUDED(move_mu_);
  // Move on a thread of its own (the MoveBlocks RPC: a server's call to
  // another must not hold a gRPC callback thread): fills `response` and
  // calls `done` from that thread. UNAVAILABLE (retry) at once while
  // another is under way.
  void MoveAsync(const v1::MoveBlocksRequest& request, v1::MoveBlocksResponse* response,
                 std::function<void(absl::Status)> done) ABSL_LOCKS_EXCLUDED(worker_mu_);
  // Once the placement is stable after a move (PlacementGate::
  // TakeHandedOver): drops the blocks this server handed over (values and
  // optimizer state; here and on its backups, a DROPPED MoveMarks) and the
  // rows, keys awaiting admission and held-back adds of its table keys that
  // left it (the tables and their clocks stay). Requests for them are
  // redirected by the placement as before. Nothing to drop: does nothing.
  // The exactly-once ids stay (they are per client, not per block).
  absl::Status DropHandedOver() ABSL_LOCKS_EXCLUDED(move_mu_);
  // ReceiveBlocks: all or nothing. FAILED_PRECONDITION for a block that is
  // not this server's under the move's placement, INVALID_ARGUMENT (or
  // DATA_LOSS) for files that are not one valid checkpoint.
  absl::StatusOr<v1::ReceiveBlocksResponse> Receive(const v1::ReceiveBlocksRequest& request);

 private:
  // Sends `batch` (held) to server `to`, with the table buckets it hands
  // over.
  absl::Status Send(uint64_t version, uint32_t to, const StoreSnapshot& batch,
                    const std::vector<v1::MovedBuckets>& buckets = {});
  // The table part of Move: every table's keys that leave this server.
  // `batches_sent` counts the batches of this Move (stall_after_batches).
  absl::Status MoveTables(uint64_t version, v1::MoveBlocksResponse* response,
                          uint32_t* batches_sent);
  // Buckets [begin, end) of `table` (held) to every other server of the new
  // count: the rows going to each.
  absl::Status SendBuckets(uint64_t version, const std::string& table,
                           const v1::TableConfig& config, uint32_t begin, uint32_t end,
                           v1::MoveBlocksResponse* response, uint32_t* batches_sent);
  // Called once a batch reached its new owner(s), before it is marked
  // handed over (stall_after_batches).
  void BatchSent(uint32_t* batches_sent) const;
  // The table part of Receive; returns the rows taken.
  absl::StatusOr<uint64_t> ReceiveTable(const v1::ReceiveBlocksRequest& request,
                                        std::map<std::string, std::string> extensions);
  // Marks `blocks` and table `buckets` `state` here and on this shard's
  // backups (a replicated write, Dispatcher::Ship): HELD applies nothing
  // here (Hold/HoldBuckets did), HANDED_OVER releases them to
  // PlacementMoved.
  absl::Status Mark(uint64_t version, v1::MoveMarks::State state,
                    const std::vector<PlacementGate::BlockKey>& blocks,
                    const std::vector<v1::MovedBuckets>& buckets = {});
  // Ships `marks` as Mark does (in records of at most kMaxMoveMarkBlocks
  // blocks); a DROPPED one drops what it names here (DropMarked; what was
  // dropped goes to `dropped`) as its backups do.
  absl::Status ShipMarks(const v1::MoveMarks& marks, DroppedMarked* dropped = nullptr);
  bool replicated() const { return options_.replicated && options_.replicated(); }

  const BlockMoverOptions options_;
  absl::Mutex move_mu_;
  absl::Mutex receive_mu_;  // one Receive at a time: its choice and its write agree
  std::atomic<uint32_t> received_batches_{0};  // for stall_after_batches
  absl::Mutex worker_mu_;
  std::thread worker_ ABSL_GUARDED_BY(worker_mu_);
  bool running_ ABSL_GUARDED_BY(worker_mu_) = false;
};

// ---- Moves with replication (docs/elastic.md, "Moves with replication") ----
//
// On a shard with backups (--accept_standbys) a move survives a kill -9 of
// either side's primary:
//   - the old owner ships "held" marks for a batch to its backups before it
//     sends the batch, and "handed over" marks once the new owner took it
//     (MoveMarks, a replicated write); a copy that fails leaves the blocks
//     held (writes refused, retry) rather than served again, so the copy a
//     retry sends is the one sent before;
//   - the new owner's ReceiveBlocks is a replicated write: its backups hold
//     the blocks before it is acknowledged. A block it received already in
//     this move is kept as it is (it may have taken writes since; the copy
//     sent again is the same as the first);
//   - table rows the same way, by key bucket: the old owner's marks name
//     the buckets of a run (MoveMarks.buckets), a failed run stays held,
//     and the new owner's ReceiveBlocks of table rows (rows, optimizer
//     state, held-back adds, config and clocks) reaches its backups before
//     it is acknowledged; the rows of a bucket it received already from
//     that sender are kept as they are;
//   - a backup keeps the marks (MoveMarks below) and, if it takes the shard
//     over, starts its gate from them; the coordinator asks whoever holds
//     /ps/<i> now, and the sender sends to whoever holds /ps/<j> now.
// A standby may not attach to an old owner while a move is under way (its
// copy would miss the marks): it retries once the move ended. Nor to a new
// owner that holds table rows mid-move (its copy would not say which
// buckets it received).

// The method name MoveMarks travel under to backups.
inline constexpr char kMoveMarksWrite[] = "MoveMarks";

// A backup's record of the move under way, for the gate it starts if it
// takes the shard over. Marks of one placement version at a time (a newer
// one replaces them). Thread-safe.
class MoveMarks {
 public:
  // A shipped v1::MoveMarks (kMoveMarksWrite); INVALID_ARGUMENT, nothing
  // recorded, for bytes that do not parse or marks CheckMoveMarks refuses.
  absl::Status Apply(absl::string_view bytes) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Apply(const v1::MoveMarks& marks) ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks this replica received in the move of `version`.
  void Received(uint64_t version, const std::vector<PlacementGate::BlockKey>& blocks)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Table buckets this replica received from server `from` in that move.
  void ReceivedBuckets(uint64_t version, const std::vector<v1::MovedBuckets>& buckets, int from)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets every mark (a standby copying a shard anew: the marks were of
  // the state it replaces).
  void Clear() ABSL_LOCKS_EXCLUDED(mu_);
  // Gives `gate` the marks when it is at their (moving) version. A server
  // new in the move (index >= from_num_servers: it joined empty) received
  // every block `store` holds, those of a copy taken mid-move included.
  void SeedGate(PlacementGate& gate, const ParameterStore& store) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void SetVersionLocked(uint64_t version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<PlacementGate::BlockKey, v1::MoveMarks::State> marks_ ABSL_GUARDED_BY(mu_);
  std::set<PlacementGate::BlockKey> received_ ABSL_GUARDED_BY(mu_);
  // The same for table key buckets: (table, bucket) of this server, and
  // (table, bucket, sender) received.
  std::map<std::pair<std::string, uint32_t>, v1::MoveMarks::State> bucket_marks_
      ABSL_GUARDED_BY(mu_);
  std::set<std::tuple<std::string, uint32_t, int>> received_buckets_ ABSL_GUARDED_BY(mu_);
};

// The most blocks one MoveMarks may name; a record naming more is refused
// (a server ships more, e.g. a DROPPED of every block it handed over, in
// several records).
inline constexpr int kMaxMoveMarkBlocks = 1 << 20;

// Checks `marks` before anything of it is applied (a backup applying its
// primary's): a known state and a version; at most kMaxMoveMarkBlocks
// blocks, each named once, with a name; table bucket runs with a table name,
// begin < end <= kKeyBuckets, not overlapping (nor repeating) another run of
// the same table; buckets in a DROPPED record only with its `stable`
// placement (valid as etcd's must be, CheckPlacementSpec; not moving, newer
// than the move) and a `server` index below kMaxPlacementServers.
// INVALID_ARGUMENT naming what is wrong.
absl::Status CheckMoveMarks(const v1::MoveMarks& marks);

// What a DROPPED MoveMarks drops, the same on a primary and on its backups
// (whose store and tables equal the primary's): its blocks from `store`,
// and from `tables` (null: none) the rows, keys awaiting admission and
// held-back adds of its table buckets whose keys its `stable` placement
// gives to another server than its `server`. `marks` passed CheckMoveMarks;
// a table this server does not hold is skipped.
DroppedMarked DropMarked(const v1::MoveMarks& marks, ParameterStore& store, Tables* tables);

// Whether `method` is a live move's replicated write (MoveMarks, or the
// new owner's ReceiveBlocks, holding just the blocks or table rows it took).
bool IsMoveWrite(absl::string_view method);
// A backup applying such a write: MoveMarks checked (CheckMoveMarks; a
// DROPPED one naming a block `store` does not hold or a table `tables` does
// not hold is refused too: FAILED_PRECONDITION, nothing changed), recorded
// in `marks` (DROPPED ones also drop what the primary dropped, DropMarked); the
// blocks of a ReceiveBlocks merged into `store`, its table rows into
// `tables` (the primary checked and chose them), and recorded as received.
absl::Status ApplyMoveWriteOnBackup(absl::string_view method, absl::string_view request,
                                    ParameterStore& store, Tables& tables, MoveMarks& marks);
// OK when a standby may attach now: UNAVAILABLE (retry) while a move is
// under way on an old owner (index < from_num_servers), whose copy would
// miss the marks; a new server's standby may attach (its copy holds the
// blocks it received) unless it holds table rows (`holds_tables`: its copy
// would not say which buckets it received).
absl::Status CheckStandbyMayAttach(const PlacementGate& gate, bool holds_tables);

// ---- Live moves and checkpoints (docs/elastic.md, "Moves with checkpoints") ----
//
// A server with --checkpoint_dir saves no checkpoint while a move is under
// way (its blocks are split between two placements); once the placement is
// stable again its checkpoints hold only the blocks it owns under it, record
// its count, and are numbered above every checkpoint of every shard, so a
// restart of everything loads the moved state, not the older generation
// (PlacementToReshardFrom picks the newest generation by sequence).

// OK when a checkpoint may be saved now; UNAVAILABLE (retry) while `gate`'s
// placement is moving, naming the move.
absl::Status CheckNoMoveUnderWay(const PlacementGate& gate);

// Removes from `snapshot` every dense block that `gate`'s placement gives to
// another server (what this server handed over); the number removed.
size_t KeepOwnedBlocks(const PlacementGate& gate, StoreSnapshot* snapshot);
// The table keys `gate`'s placement gives to this server (what a checkpoint
// after a move holds: Tables::SaveTo's `keep`).
Tables::KeyKeep OwnedKeys(const PlacementGate& gate);

// The newest sequence of any checkpoint under cluster directory `dir`, every
// shard-<k> included; 0 when there is none.
uint64_t NewestSequenceOfAnyShard(const std::string& dir);

// Whether a server that claimed index `index` while etcd's /placement is
// `placement` joins a move to more servers: it then starts empty (its
// blocks come from their old owners), whatever its shard-<index> holds.
bool JoinsMove(const v1::Placement& placement, uint32_t index);

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_MOVE_H_
