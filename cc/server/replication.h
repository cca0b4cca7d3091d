// Replication on the standby model (issue 15, docs/replication.md): the
// pieces of cc/server/{primary_log,backup_log}.h wired to a server.
//
// - PrimaryReplication: a primary's write path (Dispatcher::SetShipper).
//   With no backup a write is applied as it comes. AttachStandby copies the
//   shard (writes held meanwhile, as Save holds them), adds the standby to
//   /shards/<i>.replicas (epoch + 1) and from then on every write goes
//   through a PrimaryLog whose backups are the attached standbys (at most
//   max_standbys), sent to all at once, each over its ReplicaChannel (one
//   long-lived bulk channel connection per backup, gRPC Replicate when the
//   backup's channel cannot be opened; cc/server/replica_channel.h). The backups
//   that do not acknowledge a write are dropped from /shards/<i> by one
//   transaction before the write is acknowledged; a primary that cannot
//   drop them (etcd unreachable) acknowledges nothing; a backup that answers
//   FAILED_PRECONDITION (it knows a newer epoch) makes the primary step down.
//   Writes carry the epoch this primary started serving at (its term): a
//   change of backups it makes itself bumps /shards/<i> but not the term,
//   so the backups attached earlier go on accepting its writes, while a
//   successor's term is above it and fences it.
// - BackupReplication: a standby's side: the copy it loaded and a BackupLog
//   applying the primary's writes in LSN order.
// - SnapshotToFiles / LoadSnapshotFiles: a shard's state as the files of
//   one checkpoint (docs/checkpoint-format.md), as AttachStandby carries it.
//
// Thread-safe.
#ifndef PSERVER_CC_SERVER_REPLICATION_H_
#define PSERVER_CC_SERVER_REPLICATION_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "cc/core/checkpoint.h"
#include "cc/core/parameter_store.h"
#include "cc/etcd/etcd_client.h"
#include "cc/server/backup_log.h"
#include "cc/server/dispatcher.h"
#include "cc/server/peer_channel.h"
#include "cc/server/primary_log.h"
#include "cc/server/recent_writes.h"
#include "cc/server/replica_channel.h"
#include "pserver/v1/service.grpc.pb.h"

namespace pserver {

// The shard configuration this server last wrote to /shards/<i> (epoch and
// value): what a checkpoint publish and a configuration change compare
// against. Changes when a standby attaches or a backup is dropped.
class ShardConfigCell {
 public:
  void Set(uint64_t epoch, std::string value) {
    absl::MutexLock lock(&mu_);
    epoch_ = epoch;
    value_ = std::move(value);
  }
  uint64_t epoch() const {
    absl::MutexLock lock(&mu_);
    return epoch_;
  }
  std::string value() const {
    absl::MutexLock lock(&mu_);
    return value_;
  }

 private:
  mutable absl::Mutex mu_;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::string value_ ABSL_GUARDED_BY(mu_);
};

// The files of one checkpoint of `snapshot`, produced in memory
// (CheckpointToMemory: nothing is written to disk).
absl::StatusOr<std::vector<v1::SnapshotFile>> SnapshotToFiles(
    const StoreSnapshot& snapshot, uint32_t shard, const CheckpointWriteOptions& options);
// Loads the checkpoint `files` hold (verified as any checkpoint is).
// INVALID_ARGUMENT for a file name that is not a plain name (empty, ".",
// "..", a '/' or a NUL) or given twice.
absl::StatusOr<LoadedCheckpoint> LoadSnapshotFiles(
    const google::protobuf::RepeatedPtrField<v1::SnapshotFile>& files);

struct PrimaryReplicationOptions {
  uint32_t shard = 0;
  std::string instance_id;               // this server's (the holder)
  EtcdClient* etcd = nullptr;            // must outlive it
  ShardConfigCell* config = nullptr;     // must outlive it
  Dispatcher* dispatcher = nullptr;      // must outlive it (its Snapshot)
  CheckpointWriteOptions write_options;  // how the copy is written
  // How this server dials its backups (TLS, token).
  PeerCredentials peer;
  // How long one write may take to reach the backup, retries of
  // UNAVAILABLE included; then the backup is dropped.
  absl::Duration replicate_timeout = absl::Seconds(10);
  // How writes reach each backup (the bulk channel, else gRPC).
  ReplicaChannelOptions channel;
  // The most standbys attached at once (--max_standbys, >= 1): one more is
  // refused with FAILED_PRECONDITION naming the flag.
  size_t max_standbys = 2;
  // A joining standby's queue of writes made since its copy (bytes,
  // --max_joining_bytes): past it the standby is let go, unlisted, told so
  // at its next CheckJoin, and copies again.
  uint64_t max_joining_bytes = uint64_t{256} << 20;
  // How long a joining standby may take to load its copy and apply the
  // first queued write (--join_timeout); then it is let go the same way.
  absl::Duration join_timeout = absl::Minutes(2);
  // How long a joiner's catch-up waits for the first write made since its
  // copy before it holds writes and sends the queue (a write that comes in
  // time is delivered while writes go on, within join_timeout). Tests that
  // need that first write delivered while writes go on set it long.
  absl::Duration join_first_write_wait = absl::Milliseconds(20);
  // Bytes of the last numbered writes kept (RecentWrites) for standbys that
  // rejoin holding the shard up to an earlier LSN of this primary's lineage
  // (--catch_up_bytes): such a standby is sent only the writes after its
  // LSN, no copy. 0: none kept, every standby copies the shard. With it
  // every write is numbered, also while no backup is attached. Writes are
  // kept only while a standby may be away (see KeepsAckedWrites); else a
  // write every backup acknowledged is let go at once.
  uint64_t catch_up_bytes = 0;
  // A promoted standby's: the term of the primary it backed up (its state
  // up to last_lsn holds that primary's writes); 0 for a server that
  // claimed its shard. A standby holding that term's state at exactly
  // last_lsn catches up too (the other backup at R=3).
  uint64_t predecessor_term = 0;
  // A backup knows a newer epoch: this primary must step down.
  std::function<void(const std::string& why)> step_down;
  std::function<void(const std::string& line)> log;
};

class PrimaryReplication : public WriteShipper {
 public:
  // `last_lsn`: the last LSN in this replica's state (a promoted backup's).
  // The term is options.config's epoch now.
  PrimaryReplication(PrimaryReplicationOptions options, uint64_t last_lsn);
  ~PrimaryReplication() override;

  absl::Status Write(absl::string_view method, absl::FunctionRef<SharedBytes()> request,
                     absl::FunctionRef<absl::Status(absl::FunctionRef<void()>)> apply) override;
  // A standby asking for a copy (the AttachStandby RPC). Writes are held
  // only while the shard's state is copied in memory (Dispatcher::Snapshot);
  // the copy is then encoded and answered while writes go on, and the
  // standby *joins*: the writes numbered after its copy are queued for it,
  // without the clients waiting for it, while it loads the copy (a thread of
  // its own delivers the first once it has); then, with writes held, the
  // rest of the queue is delivered and it is added to /shards/<i>.replicas
  // (epoch + 1) and is a backup like the others. One that does not catch up (its queue past
  // max_joining_bytes, a write not delivered in time) is let go, unlisted.
  // FAILED_PRECONDITION when the shard has max_standbys backups and joining
  // standbys already.
  // A request with check_join set asks CheckJoin only (nothing copied). A
  // standby attaching again after it was let go replaces its old joiner.
  absl::StatusOr<v1::AttachStandbyResponse> Attach(const v1::AttachStandbyRequest& request);
  // Whether standby `instance_id`'s join goes on: OK while it joins (and
  // was not let go) or is a backup; FAILED_PRECONDITION naming why once it
  // was let go (its queue past max_joining_bytes, its first write not
  // delivered within join_timeout, its listing refused), or when this
  // primary knows it neither as joining nor as a backup.
  absl::Status CheckJoin(const std::string& instance_id) const;
  // The backups' instance ids, in attach order; empty when none.
  std::vector<std::string> backups() const;
  // The LSN of the last write numbered (the last in this replica's state).
  uint64_t last_lsn() const;
  // How many backups were dropped (not acknowledging a write) so far.
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  // Standbys joined (listed after catching up) so far, and the writes they
  // caught up on in all: what their copies missed.
  uint64_t joined() const { return joined_.load(std::memory_order_relaxed); }
  uint64_t caught_up_writes() const { return caught_up_writes_.load(std::memory_order_relaxed); }
  // Bytes of writes kept for catch-ups now (0 without catch_up_bytes).
  uint64_t kept_write_bytes() const { return recent_ != nullptr ? recent_->bytes() : 0; }
  // Standbys that rejoined from their own LSN (no copy) so far.
  uint64_t rejoined_without_copy() const {
    return rejoined_without_copy_.load(std::memory_order_relaxed);
  }
  // Writes sent to a backup (each backup's copy counted, retries included)
  // over the bulk channel, and over gRPC Replicate, so far.
  uint64_t sent_over_channel() const;
  uint64_t sent_over_grpc() const;

 private:
  struct Backup {
    std::string id;
    std::string address;
    std::unique_ptr<v1::ParameterServer::Stub> stub;
    std::unique_ptr<ReplicaChannel> channel;  // over `stub`'s backup
  };
  // A standby that copied the shard and is catching up (Attach): the
  // writes numbered after its copy, in LSN order, for its thread to send.
  struct Joiner {
    Backup backup;
    uint64_t from_lsn = 0;  // the copy's last LSN
    absl::Mutex mu;
    std::map<uint64_t, std::shared_ptr<const BackupLog::Write>> queue ABSL_GUARDED_BY(mu);
    uint64_t queued_bytes ABSL_GUARDED_BY(mu) = 0;
    std::string failed ABSL_GUARDED_BY(mu);  // why it fell behind; "": it did not
  };
  absl::Status Send(const Backup& backup, const BackupLog::Write& write)
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Hands `write` to `backup` over its channel before this replica applies
  // it (PrimaryLog::Post): what then awaits its answer and retries as Send
  // does; null when the channel cannot take it at once (Send, afterwards).
  std::function<absl::Status()> Post(const Backup& backup, const BackupLog::Write& write)
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // One Replicate call to `backup`, UNAVAILABLE retried until `deadline`
  // (a backup whose address refuses connections fails at once).
  absl::Status Deliver(const Backup& backup, const BackupLog::Write& write, absl::Time deadline);
  // Queues `write` for a joining standby (never fails the write).
  absl::Status Enqueue(Joiner& joiner, const BackupLog::Write& write)
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // A joiner's thread: the first queued write once the standby loaded its
  // copy, then (writes held) the rest in LSN order, then it is listed.
  void CatchUp(std::shared_ptr<Joiner> joiner);
  // Adds a caught-up joiner to /shards/<i>.replicas and to backups_.
  absl::Status List(const std::shared_ptr<Joiner>& joiner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `joiner` out (if still in); a non-empty `why` is what CheckJoin
  // answers its standby from then on (let_go_).
  void RemoveJoiner(const std::shared_ptr<Joiner>& joiner, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the backups `failed` names (id, its failure) out of /shards/<i>,
  // those still attached; OK when none is left to drop.
  absl::Status DropBackups(const std::vector<std::pair<std::string, absl::Status>>& failed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a write every backup acknowledged is still kept for catch-ups:
  // while a standby may be away and come back holding this lineage's state
  // (fewer backups than this primary had listed at most, one joining, or,
  // for a promoted standby, none yet: the predecessor's other backup).
  // Otherwise every backup holds it and none will rejoin from below it.
  bool KeepsAckedWrites() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // A PrimaryLog over backups_ and then joiners_ (null when there is
  // neither and no RecentWrites) from the last LSN; its first sink also
  // keeps each write in recent_.
  void RebuildLog() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The writes a standby holding `request`'s (have_epoch, have_lsn) lacks
  // up to `last`, when it may catch up: its state is of this primary's
  // lineage (this term from base_lsn_ on, or the predecessor's term at
  // exactly base_lsn_), every write after it is kept, and they fit
  // max_joining_bytes. FAILED_PRECONDITION saying why not otherwise.
  absl::StatusOr<std::vector<RecentWrites::Kept>> WritesAfter(
      const v1::AttachStandbyRequest& request, uint64_t last) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PrimaryReplicationOptions options_;
  const uint64_t term_;  // the epoch this primary's writes carry
  const uint64_t base_lsn_;  // the last LSN in its state when it started
  // The last writes numbered (options.catch_up_bytes; null: none kept).
  const std::unique_ptr<RecentWrites> recent_;
  // Shared by every write (for its whole apply and shipping), exclusive for
  // a change of backups: a copy is taken with no write half done.
  mutable absl::Mutex mu_;
  uint64_t last_lsn_ ABSL_GUARDED_BY(mu_);                // while there is no log
  std::unique_ptr<PrimaryLog> log_ ABSL_GUARDED_BY(mu_);  // null: no backup
  std::vector<Backup> backups_ ABSL_GUARDED_BY(mu_);     // log_'s, in its order
  std::vector<std::shared_ptr<Joiner>> joiners_ ABSL_GUARDED_BY(mu_);  // log_'s, after backups_
  size_t most_backups_ ABSL_GUARDED_BY(mu_) = 0;  // listed at once, at most
  // Standbys let go while joining, (instance id, why), oldest first: at
  // most kMaxLetGo, one entry per id.
  static constexpr size_t kMaxLetGo = 64;
  std::deque<std::pair<std::string, std::string>> let_go_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stopping_{false};
  absl::Mutex threads_mu_;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(threads_mu_);  // the joiners'
  std::atomic<uint64_t> joined_{0};
  std::atomic<uint64_t> caught_up_writes_{0};
  std::atomic<uint64_t> rejoined_without_copy_{0};
  std::atomic<uint64_t> dropped_{0};
  // Sent by the channels of backups dropped since.
  std::atomic<uint64_t> dropped_over_channel_{0};
  std::atomic<uint64_t> dropped_over_grpc_{0};
};

// A standby's test of whether its primary is evidently gone: its gRPC
// channel to the primary is not connected and a fresh TCP dial to the address
// in /ps/<i> is refused (nothing listens there: the process died on a live
// host). A silent host (no answer) is not evidence; the lease decides then.
// Not thread-safe.
class PrimaryProbe {
 public:
  explicit PrimaryProbe(PeerCredentials peer) : peer_(std::move(peer)) {}
  // `entry`: /ps/<i> as read.
  bool Refuses(const KeyValue& entry);
  // The address the last Refuses looked at.
  const std::string& address() const { return address_; }

 private:
  PeerCredentials peer_;
  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
};

class BackupReplication {
 public:
  // `apply_move_write` applies a shipped write of a live move (IsMoveWrite,
  // cc/server/move.h; null: such a write is refused).
  using MoveWriteApply =
      std::function<absl::Status(absl::string_view method, absl::string_view request)>;
  explicit BackupReplication(Dispatcher* dispatcher, MoveWriteApply apply_move_write = nullptr)
      : dispatcher_(dispatcher), apply_move_write_(std::move(apply_move_write)) {}
  // The copy of shard `shard` whose writes carry epoch `epoch`, up to
  // `last_lsn`, is loaded: writes are applied from now on. Called again
  // after Detach, for a fresh copy.
  void Attached(uint32_t shard, uint64_t epoch, uint64_t last_lsn);
  // Stops applying (before a fresh copy replaces the state): writes are
  // refused, those of the old log first, and a write being applied is done
  // when this returns; Replicate answers UNAVAILABLE until Attached.
  void Detach();
  // The Replicate RPC: returns once the write is applied (BackupLog::Deliver).
  // UNAVAILABLE while no copy is loaded (for up to `wait`).
  absl::Status Replicate(const v1::ReplicateRequest& request,
                         absl::Duration wait = absl::Seconds(10));
  // The same for a write of shard `shard` that came over the bulk channel
  // (frame.h kReplicate); INVALID_ARGUMENT for another shard.
  absl::Status Deliver(uint32_t shard, BackupLog::Write write,
                       absl::Duration wait = absl::Seconds(10));
  // Taking over: the old primary's writes are refused from now on.
  void SetEpoch(uint64_t epoch);
  // This backup leaves its shard for good (a --replicas slot: the shard
  // departed, or another lacks a backup): every write from now on is
  // answered ABORTED naming `why`, which makes the primary drop it at once
  // (rather than retry until its timeout).
  void Leave(const std::string& why);
  uint64_t applied_lsn() const;
  // The term of the writes applied since the last Attached (0: none yet).
  uint64_t term() const;

  // What a detached replica holds: shard `shard`'s state with the writes
  // of term `term` up to `lsn`, each applied whole. Empty while attached,
  // before the first copy, once an apply failed (it may have left part of
  // a write), and after Forget (a fresh copy is being loaded over it).
  struct Held {
    uint32_t shard = 0;
    uint64_t term = 0;
    uint64_t lsn = 0;
  };
  std::optional<Held> held() const;
  void Forget();

 private:
  std::shared_ptr<BackupLog> log() const;

  Dispatcher* const dispatcher_;
  const MoveWriteApply apply_move_write_;
  mutable absl::Mutex mu_;
  uint32_t shard_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t term_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<BackupLog> log_ ABSL_GUARDED_BY(mu_);  // null: no copy loaded
  std::optional<Held> held_ ABSL_GUARDED_BY(mu_);
  std::string left_ ABSL_GUARDED_BY(mu_);  // Leave's reason; "": attached
  std::atomic<bool> damaged_{false};  // an apply failed since Attached
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_REPLICATION_H_
