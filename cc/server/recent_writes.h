// RecentWrites: the last writes a primary numbered, kept in memory so that a
// standby rejoining with the shard's state up to an earlier LSN of this
// primary's lineage receives only the writes after it instead of a copy of
// the whole shard (docs/replication.md, "Catch-up from a backup's own LSN").
// At most `max_bytes` (method and request bytes); the lowest LSNs go first.
// Writes may be added out of LSN order (a primary ships concurrent writes
// from their own threads).
//
//   RecentWrites recent(64 << 20);
//   recent.Add(write);                       // each numbered write, once
//   recent.Release(n);                       // every backup holds 1 .. n
//   auto after = recent.Since(n, last_lsn);  // n+1 .. last_lsn, or why not
//
// Thread-safe.
#ifndef PSERVER_CC_SERVER_RECENT_WRITES_H_
#define PSERVER_CC_SERVER_RECENT_WRITES_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cc/server/backup_log.h"

namespace pserver {

class RecentWrites {
 public:
  using Kept = std::shared_ptr<const BackupLog::Write>;

  explicit RecentWrites(uint64_t max_bytes) : max_bytes_(max_bytes) {}

  // Keeps `write` (a write larger than max_bytes is not kept, nor one at or
  // below the last Release), dropping the lowest LSNs past the bound.
  void Add(const BackupLog::Write& write);
  // Lets go of the writes numbered up to `lsn` (every backup holds them:
  // none will rejoin from below it); a later Add at or below it keeps
  // nothing. Since then reports them missing, as dropped for the bound.
  void Release(uint64_t lsn);
  // The writes numbered after `lsn` up to `last`, in LSN order (empty when
  // lsn >= last); FAILED_PRECONDITION naming the first one missing (dropped
  // for the bound, or never kept) and what is kept.
  absl::StatusOr<std::vector<Kept>> Since(uint64_t lsn, uint64_t last) const;

  uint64_t bytes() const;
  static uint64_t Bytes(const BackupLog::Write& write) {
    return write.method.size() + write.request_size();
  }

 private:
  const uint64_t max_bytes_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, Kept> writes_ ABSL_GUARDED_BY(mu_);  // by LSN
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t released_ ABSL_GUARDED_BY(mu_) = 0;  // the highest LSN released
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_RECENT_WRITES_H_
