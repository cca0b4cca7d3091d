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
// The receiver takes them all or nothing (Tables::ImportRows).
//
// Not moved: the exactly-once ids: a client
// numbers its pushes per server, so the old owner keeps its ids (a retried
// push applied before the move is acknowledged there) and the new owner's
// ids start from the client's own sequence for it.
//
// Thread-safe; one MoveBlocks runs at a time.
#ifndef PSERVER_CC_SERVER_MOVE_H_
#define PSERVER_CC_SERVER_MOVE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cc/core/checkpoint.h"
#include "cc/core/parameter_store.h"
#include "cc/core/tables.h"
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
  Tables* tables = nullptr;          // must outlive it; null: no tables move
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
  // Sends `batch` (held) to server `to`, with the table buckets it hands
  // over.
  absl::Status Send(uint64_t version, uint32_t to, const StoreSnapshot& batch,
                    const std::vector<v1::MovedBuckets>& buckets = {});
  // The table part of Move: every table's keys that leave this server.
  absl::Status MoveTables(uint64_t version, v1::MoveBlocksResponse* response);
  // Buckets [begin, end) of `table` (held) to every other server of the new
  // count: the rows going to each.
  absl::Status SendBuckets(uint64_t version, const std::string& table,
                           const v1::TableConfig& config, uint32_t begin, uint32_t end,
                           v1::MoveBlocksResponse* response);
  // The table part of Receive; returns the rows taken.
  absl::StatusOr<uint64_t> ReceiveTable(const v1::ReceiveBlocksRequest& request,
                                        const std::map<std::string, std::string>& extensions);

  const BlockMoverOptions options_;
  absl::Mutex move_mu_;
  absl::Mutex worker_mu_;
  std::thread worker_ ABSL_GUARDED_BY(worker_mu_);
  bool running_ ABSL_GUARDED_BY(worker_mu_) = false;
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_MOVE_H_
