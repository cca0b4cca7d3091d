// BackupLog: the backup side of one shard's ordered log shipping (issue 15,
// docs/replication.md). The primary numbers every write of a shard with a
// log sequence number (LSN) and ships (epoch, LSN, method, request bytes) to
// each backup; calls may arrive in any order and be retried. BackupLog
// applies each write exactly once, strictly in LSN order, so that replicas
// stay bit-identical; a write from an epoch older than the one the backup
// knows is refused, so a stale primary never gets an acknowledgement.
//
//   BackupLog log(/*epoch=*/3, /*applied_lsn=*/0, {}, [&](const Write& w) {
//     std::string storage;
//     return dispatcher.Apply(w.method, w.request_view(&storage));   // the very same path
//   });
//   absl::Status acked = log.Deliver({3, 1, "SendGrads", bytes}, deadline);
//
// Bounded: writes held while an earlier LSN is missing are limited in count
// and bytes (Options); past either a new write is UNAVAILABLE ("retry"),
// except the next LSN, which is applied at once and drains the rest.
//
// Thread-safe; writes are applied on the thread of the Deliver that
// completed a run of consecutive LSNs, one at a time.
#ifndef PSERVER_CC_SERVER_BACKUP_LOG_H_
#define PSERVER_CC_SERVER_BACKUP_LOG_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pserver {

// Bytes held where they were received (a request's gRPC slices, a bulk
// channel frame's buffer), not copied: `parts`, in order, kept alive by
// `owner`. A primary ships a push's bytes this way.
struct SharedBytes {
  std::vector<absl::string_view> parts;
  std::shared_ptr<const void> owner;

  size_t size() const {
    size_t total = 0;
    for (absl::string_view part : parts) total += part.size();
    return total;
  }
  // One copy of the bytes, for a path that needs them in one string.
  std::string Flatten() const {
    std::string out;
    out.reserve(size());
    for (absl::string_view part : parts) out.append(part.data(), part.size());
    return out;
  }
  // `bytes`, owned.
  static SharedBytes Own(std::string bytes) {
    auto owned = std::make_shared<const std::string>(std::move(bytes));
    SharedBytes shared;
    shared.parts.emplace_back(*owned);
    shared.owner = std::move(owned);
    return shared;
  }
  // A buffer of `size` bytes left as the allocator hands it over (not
  // zero-filled: the caller writes every byte, through `*data`, before
  // anyone reads them), in one part.
  static SharedBytes Uninitialized(size_t size, char** data) {
    std::shared_ptr<char> buffer(new char[size], std::default_delete<char[]>());
    *data = buffer.get();
    SharedBytes shared;
    shared.parts.emplace_back(buffer.get(), size);
    shared.owner = std::move(buffer);
    return shared;
  }
};

class PushFiniteScan;  // cc/rpc/wire.h

class BackupLog {
 public:
  struct Write {
    uint64_t epoch = 0;
    uint64_t lsn = 0;     // >= 1, consecutive across epochs
    std::string method;   // e.g. "SendGrads"
    std::string request;  // the request's own bytes
    // The request's bytes may be held here instead, where they were received
    // (`request` is then empty): a primary ships a push's bytes without a
    // copy; a backup reads a shipped write into one such part, which is not
    // zero-filled first.
    SharedBytes shared;
    // A shipped push's NaN/infinity scan, made by the backup that received
    // it over the bulk channel while its bytes arrived (null: none made;
    // the store scans them as it applies them).
    std::shared_ptr<const PushFiniteScan> finite_scan;

    bool is_shared() const { return shared.owner != nullptr; }
    size_t request_size() const { return is_shared() ? shared.size() : request.size(); }
    // The request's bytes as parts (views into this write).
    std::vector<absl::string_view> request_parts() const {
      if (is_shared()) return shared.parts;
      return {absl::string_view(request)};
    }
    std::string request_bytes() const { return is_shared() ? shared.Flatten() : request; }
    // The request's bytes in one piece: a view when they are (`request`, or
    // one shared part, as a write a backup receives), else a copy in
    // `*storage`.
    absl::string_view request_view(std::string* storage) const {
      if (!is_shared()) return request;
      if (shared.parts.size() == 1) return shared.parts[0];
      *storage = shared.Flatten();
      return *storage;
    }
  };
  struct Options {
    // Writes held waiting for an earlier LSN, and their bytes (method and
    // request). Each must be >= 1.
    uint64_t max_held_writes = 1024;
    uint64_t max_held_bytes = uint64_t{256} << 20;
    // Bytes of applied writes kept for AppliedSince (a takeover at R=3
    // bringing the successor to the most advanced backup); the oldest go
    // first. 0: none kept, as the server keeps none: AppliedSince is not
    // wired to an RPC yet, and keeping 64 MiB of writes made every write
    // a standby receives land in memory gone cold (bench/RESULTS.md,
    // "Replication: the standby's receive buffer").
    uint64_t max_retained_bytes = 0;
  };
  // Applies one write; an error means this replica no longer matches the
  // primary (the primary applied it): the log breaks for good.
  using Apply = std::function<absl::Status(const Write& write)>;

  // `applied_lsn`: the last LSN already in the state (0: none).
  BackupLog(uint64_t epoch, uint64_t applied_lsn, Options options, Apply apply);
  BackupLog(const BackupLog&) = delete;
  BackupLog& operator=(const BackupLog&) = delete;

  // Returns once `write` is applied (OK; at once for an LSN applied before:
  // a retry is acknowledged, never applied twice), or:
  // - FAILED_PRECONDITION: its epoch is older than this backup's (a stale
  //   primary), or it was held and dropped by a newer epoch;
  // - UNAVAILABLE: its epoch is newer than this backup knows (the caller
  //   learns the new configuration, SetEpoch, and the primary retries), or
  //   the held writes are at their bound;
  // - DEADLINE_EXCEEDED: an earlier LSN did not arrive by `deadline` (the
  //   write stays held; a retry waits for it again);
  // - DATA_LOSS: applying a write failed (this one or an earlier one): the
  //   replica must be rebuilt (rejoin);
  // - INVALID_ARGUMENT: LSN 0, or another write already held under its LSN.
  absl::Status Deliver(Write write, absl::Time deadline);

  // A new configuration: writes of older epochs are refused from now on and
  // those held are dropped (their Deliver calls fail). Returns once a write
  // being applied is done, so that applied_lsn() is then final for the old
  // epoch. An older `epoch` is ignored.
  void SetEpoch(uint64_t epoch);

  // The applied writes after `lsn`, in LSN order (empty when `lsn` is at or
  // past applied_lsn()): what a successor taking over lacks and this backup
  // got from the old primary. FAILED_PRECONDITION when the oldest of them is
  // no longer retained (the successor must then be rebuilt from a replica).
  absl::StatusOr<std::vector<Write>> AppliedSince(uint64_t lsn) const;

  uint64_t epoch() const;
  uint64_t applied_lsn() const;
  uint64_t held_writes() const;
  uint64_t held_bytes() const;

 private:
  static uint64_t Bytes(const Write& write) { return write.method.size() + write.request_size(); }
  // Applies held writes while the next LSN is there; called with mu_ held
  // and applying_ false, returns with mu_ held.
  void Drain() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const Apply apply_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;  // applied_, held_, broken_ or epoch_ changed
  uint64_t epoch_ ABSL_GUARDED_BY(mu_);
  uint64_t applied_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Write> held_ ABSL_GUARDED_BY(mu_);  // by LSN, all > applied_
  uint64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool applying_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  std::deque<Write> retained_ ABSL_GUARDED_BY(mu_);  // the last applied, in LSN order
  uint64_t retained_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_BACKUP_LOG_H_
