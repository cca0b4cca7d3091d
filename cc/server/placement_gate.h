// PlacementGate: whether this server serves a dense block (or table key) under the
// cluster's current placement (live moves, docs/elastic.md). A server
// started with --placement_redirects sets one on its dispatcher and keeps it
// at etcd's /placement (it watches the key); every bulk push and read then
// checks each block before anything is applied or read, and a block this
// server does not serve is refused, never applied.
//
//   PlacementGate gate(/*self=*/0, placement);
//   dispatcher.SetPlacementGate(&gate);
//   gate.SetSpec(newer);                       // /placement changed
//   PS_RETURN_IF_ERROR(gate.CheckBlock("w", block));
//
// While a placement is *moving* (v1::Placement.moving: from_num_servers N
// to num_servers M, version V) a block is served by its owner under N until
// that owner handed it to its owner under M (cc/server/move.h):
//   - the old owner: served; while being copied (Hold .. Release) writes get
//     UNAVAILABLE "... is being handed to server j; retry" (reads are
//     served); once handed over, PlacementMoved(V) naming its owner under M;
//   - the new owner: UNAVAILABLE "... not yet received; retry" until it
//     received it (Received), served afterwards;
//   - any other server: PlacementMoved(V) naming the owner under N.
// Under a stable placement a block is served by its owner, PlacementMoved
// elsewhere. Every refusal applied nothing: IsGateRefusal tells the
// dispatcher to abandon the request's id rather than use it up.
//
// Table keys are decided the same way (CheckKeys), by the key's owner under
// N and M (KeyServer of the table's partitioning); what is held, handed
// over and received is a key *bucket* (KeyBucket, one of kKeyBuckets) of a
// table, per old owner. Control methods (InitParam, GetParam, ...) are not
// checked (docs/elastic.md, limits).
//
// Thread-safe: changes take a writer lock, checks a reader lock.
#ifndef PSERVER_CC_SERVER_PLACEMENT_GATE_H_
#define PSERVER_CC_SERVER_PLACEMENT_GATE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "absl/synchronization/mutex.h"
#include "cc/core/placement.h"
#include "pserver/v1/checkpoint.pb.h"
#include "pserver/v1/table.pb.h"
#include "pserver/v1/types.pb.h"

namespace pserver {

// True for a status the gate answered (a refused block: nothing applied).
// Only for statuses made in this process (it reads a payload).
bool IsGateRefusal(const absl::Status& status);

class PlacementGate {
 public:
  using BlockKey = std::pair<std::string, uint32_t>;  // parameter name, block index

  PlacementGate(int self, Placement placement);
  PlacementGate(const PlacementGate&) = delete;
  PlacementGate& operator=(const PlacementGate&) = delete;

  // From now on blocks are checked against `placement` (stable); an older
  // version than the one held is ignored (etcd's watch may replay).
  void Set(const Placement& placement) ABSL_LOCKS_EXCLUDED(mu_);
  // The same for a placement as etcd holds it, moving or not.
  // INVALID_ARGUMENT (nothing changed) for a spec a Placement cannot be made
  // of, or a moving one whose from_num_servers is outside 1..4096.
  absl::Status SetSpec(const v1::Placement& spec) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t version() const ABSL_LOCKS_EXCLUDED(mu_);
  v1::Placement spec() const ABSL_LOCKS_EXCLUDED(mu_);
  int self() const { return self_; }

  // OK when this server may apply a write to block `block` of `name` now;
  // the refusal otherwise (see above).
  absl::Status CheckBlock(absl::string_view name, const v1::BlockRef& block) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The same for a read: a block being handed over is still read here.
  absl::Status CheckRead(absl::string_view name, const v1::BlockRef& block) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // ---- the old owner's side of a move of placement `version` ----
  // The server block (name, index) goes to in the move of `version`: its
  // owner under M when this server owns it under N, the owner under M
  // differs and it was not handed over yet; nullopt otherwise (also when
  // `version` is not the moving placement held).
  std::optional<int> Destination(uint64_t version, absl::string_view name, uint32_t index) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Writes to `blocks` are refused (UNAVAILABLE, retry) from now on. The
  // caller holds the dispatcher's apply lock exclusively meanwhile, so no
  // write to them is half applied.
  void Hold(const std::vector<BlockKey>& blocks) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends Hold: `handed_over` true: PlacementMoved from now on; false (the
  // copy failed): served here again.
  void Release(const std::vector<BlockKey>& blocks, bool handed_over) ABSL_LOCKS_EXCLUDED(mu_);
  size_t handed_over() const ABSL_LOCKS_EXCLUDED(mu_);

  // ---- table keys ----
  // The check of CheckBlock/CheckRead for table keys: the first refusal.
  // `partitioning` is the table's; a key outside a RANGE partitioning is
  // INVALID_ARGUMENT.
  absl::Status CheckKeys(absl::string_view table, const v1::Partitioning& partitioning,
                         absl::Span<const uint64_t> keys, bool write) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether placement `version` is the moving one held.
  bool Moving(uint64_t version) const ABSL_LOCKS_EXCLUDED(mu_);
  bool moving() const ABSL_LOCKS_EXCLUDED(mu_);
  // The server `key` goes to in the move of `version` when server `from`
  // owns it under N and not under M; nullopt otherwise.
  absl::StatusOr<std::optional<int>> KeyDestination(uint64_t version, int from,
                                                    const v1::Partitioning& partitioning,
                                                    uint64_t key) const ABSL_LOCKS_EXCLUDED(mu_);
  // The old owner's buckets [begin, end) of `table`: held (writes refused,
  // caller holds the apply lock exclusively), released, handed over yet.
  void HoldBuckets(absl::string_view table, uint32_t begin, uint32_t end) ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseBuckets(absl::string_view table, uint32_t begin, uint32_t end, bool handed_over)
      ABSL_LOCKS_EXCLUDED(mu_);
  bool BucketHandedOver(absl::string_view table, uint32_t bucket) const ABSL_LOCKS_EXCLUDED(mu_);
  // The new owner: OK when `key` is this server's under M in the move of
  // `version` and server `from` owns it under N (as CheckReceive).
  absl::Status CheckReceiveKey(uint64_t version, int from, absl::string_view table,
                               const v1::Partitioning& partitioning, uint64_t key) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // UNAVAILABLE (retry) while this server has not seen placement `version`,
  // FAILED_PRECONDITION unless it is the moving one held.
  absl::Status CheckReceiveVersion(uint64_t version) const ABSL_LOCKS_EXCLUDED(mu_);
  // Keys of `table` in buckets [begin, end) that server `from` owned under
  // N are served here from now on.
  void ReceivedBuckets(absl::string_view table, int from, uint32_t begin, uint32_t end)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether bucket `bucket` of `table` from server `from` was received here
  // in the move under way.
  bool BucketReceived(absl::string_view table, uint32_t bucket, int from) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // ---- after a move: what this server may drop ----
  // What this server handed over in a move (every server acknowledged it:
  // the coordinator then wrote the placement stable at the move's count).
  // Its blocks, and the rows of its table buckets whose keys the stable
  // placement gives to another server, are not served here again: a request
  // for them is redirected by the placement alone.
  struct HandedOver {
    uint64_t version = 0;      // the move's (moving) placement version
    Placement stable;          // the placement that ended it
    std::vector<BlockKey> blocks;
    std::vector<std::pair<std::string, uint32_t>> buckets;  // table, bucket
  };
  // Taken once: set when this gate goes from a moving placement straight to
  // a stable one of a newer version and the same count (a placement written
  // otherwise, e.g. by hand, sets nothing); cleared, untaken, by any newer
  // placement (its blocks may come back to this server in a later move).
  std::optional<HandedOver> TakeHandedOver() ABSL_LOCKS_EXCLUDED(mu_);

  // ---- the new owner's side ----
  // OK when block (name, index) is this server's under M in the move of
  // `version`: UNAVAILABLE (retry) while this server has not seen that
  // version yet, FAILED_PRECONDITION naming what is wrong otherwise.
  absl::Status CheckReceive(uint64_t version, absl::string_view name, uint32_t index) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Served here from now on.
  void Received(const std::vector<BlockKey>& blocks) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class State { kHeld, kHandedOver, kReceived };
  // A table's key bucket, by the server that owned its keys under N.
  using BucketKey = std::tuple<std::string, uint32_t, int>;  // table, bucket, old owner
  absl::Status Check(absl::string_view name, const v1::BlockRef& block, bool write) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The verdict for an item (`what`) owned by `from` under N and `to` under
  // M (`from` unset: not moving), whose move is in `state`.
  absl::Status Decide(absl::string_view what, std::optional<int> from, int to,
                      std::optional<State> state, bool write) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status CheckReceiveLocked(uint64_t version) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void SetLocked(const Placement& to, std::optional<Placement> from)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int self_;
  mutable absl::Mutex mu_;
  Placement placement_ ABSL_GUARDED_BY(mu_);             // M, and the version
  std::optional<Placement> from_ ABSL_GUARDED_BY(mu_);   // N while moving
  // Blocks of the move under way; cleared when the placement changes.
  absl::flat_hash_map<BlockKey, State> blocks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<BucketKey, State> buckets_ ABSL_GUARDED_BY(mu_);  // the same for tables
  std::optional<HandedOver> handed_over_ ABSL_GUARDED_BY(mu_);  // for TakeHandedOver
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_PLACEMENT_GATE_H_
