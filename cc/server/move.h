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
//      /ps/<j>), which loads them (LoadSnapshotFiles, every CRC checked),
//      checks that each block is its own under M, merges them into its store
//      (ParameterStore::Merge) and serves them from then on,
//   3. refuses the block from then on with PlacementMoved(V)
//      (PlacementGate::Release). If the copy fails the block is served here
//      again and MoveBlocks fails; calling it again sends what is left.
//
// Not moved: sparse/KV table rows, worker clocks and held-back adds (tables
// are not placed by the gate yet), and the exactly-once ids: a client
// numbers its pushes per server, so the old owner keeps its ids (a retried
// push applied before the move is acknowledged there) and the new owner's
// ids start from the client's own sequence for it.
//
// Thread-safe; one MoveBlocks runs at a time.
#ifndef PSERVER_CC_SERVER_MOVE_H_
#define PSERVER_CC_SERVER_MOVE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cc/core/checkpoint.h"
#include "cc/core/parameter_store.h"
#include "cc/server/dispatcher.h"
#include "cc/server/placement_gate.h"
#include "pserver/v1/service.pb.h"

namespace pserver {

// The default and bounds of --move_batch_bytes.
inline constexpr uint64_t kDefaultMoveBatchBytes = 16 << 20;
inline constexpr uint64_t kMinMoveBatchBytes = 1 << 10;

struct BlockMoverOptions {
  Dispatcher* dispatcher = nullptr;  // must outlive it (its apply lock)
  ParameterStore* store = nullptr;   // must outlive it
  PlacementGate* gate = nullptr;     // must outlive it
  // Where server `index` listens (etcd /ps/<index>); an error while it is
  // not registered.
  std::function<absl::StatusOr<std::string>(uint32_t index)> address_of;
  CheckpointWriteOptions write_options;  // how a copy is written
  // The most bytes of values and optimizer state sent in one ReceiveBlocks
  // (a block larger than this goes alone): --move_batch_bytes.
  uint64_t batch_bytes = kDefaultMoveBatchBytes;
  // How long one ReceiveBlocks may take, retries of UNAVAILABLE included.
  absl::Duration send_timeout = absl::Seconds(60);
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
  // ReceiveBlocks: all or nothing. FAILED_PRECONDITION for a block that is
  // not this server's under the move's placement, INVALID_ARGUMENT (or
  // DATA_LOSS) for files that are not one valid checkpoint.
  absl::StatusOr<v1::ReceiveBlocksResponse> Receive(const v1::ReceiveBlocksRequest& request);

 private:
  // Sends `batch` (held) to server `to`; returns the bytes sent.
  absl::Status Send(uint64_t version, uint32_t to, const StoreSnapshot& batch);

  const BlockMoverOptions options_;
  absl::Mutex move_mu_;
  absl::Mutex worker_mu_;
  std::thread worker_ ABSL_GUARDED_BY(worker_mu_);
  bool running_ ABSL_GUARDED_BY(worker_mu_) = false;
};

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

// The newest sequence of any checkpoint under cluster directory `dir`, every
// shard-<k> included; 0 when there is none.
uint64_t NewestSequenceOfAnyShard(const std::string& dir);

// Whether a server that claimed index `index` while etcd's /placement is
// `placement` joins a move to more servers: it then starts empty (its
// blocks come from their old owners), whatever its shard-<index> holds.
bool JoinsMove(const v1::Placement& placement, uint32_t index);

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_MOVE_H_
