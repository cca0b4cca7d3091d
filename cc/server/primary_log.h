// PrimaryLog: the primary side of one shard's ordered log shipping (issue
// 15, docs/replication.md). Each write is applied here and numbered with
// the next log sequence number (LSN) under the shard's order lock, so that
// the LSN order is the order this replica applied them in; it is sent as
// (epoch, LSN, method, request bytes) to every backup at once (one thread
// per backup beyond the first: a slow backup delays a write by its own time,
// not by the sum), whose BackupLog (cc/server/backup_log.h) applies it in LSN
// order. Write returns OK only once every backup acknowledged that LSN; the
// caller learns which backups did not.
//
// Overlapped (WriteShippingFirst): a write whose apply can check it before
// changing anything (a push: every gradient checked against its block) is
// numbered and handed to every backup (Post) once those checks passed and
// before this replica applies it, still under the order lock; the backups
// receive and apply it while this replica does, and the answer waits for
// both. Without a Post, or when one cannot hand the write over at once, it
// is sent after the apply as above.
//
//   PrimaryLog log(epoch, /*last_lsn=*/0, /*backups=*/2, {}, send);
//   absl::Status acked = log.Write("SendGrad", bytes, [&] {
//     return dispatcher.ApplyWrite("SendGrad", bytes);
//   });
//
// Bounded: writes numbered but not yet acknowledged by every backup are
// limited in count and bytes (Options); past either a write is refused with
// UNAVAILABLE before it is applied.
//
// Thread-safe; writes from many threads are applied one at a time and
// shipped concurrently.
#ifndef PSERVER_CC_SERVER_PRIMARY_LOG_H_
#define PSERVER_CC_SERVER_PRIMARY_LOG_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "cc/server/backup_log.h"

namespace pserver {

// Calls send(0), ..., send(count - 1) at once (send(0) on the calling
// thread, each other on a thread of its own) and returns their answers in
// order once all returned.
std::vector<absl::Status> SendToEach(size_t count, absl::FunctionRef<absl::Status(size_t)> send);

class PrimaryLog {
 public:
  // Delivers `write` to backup `backup` (0-based) and returns its answer
  // (BackupLog::Deliver's, or the transport's error).
  using Send = std::function<absl::Status(size_t backup, const BackupLog::Write& write)>;
  // Hands `write` to backup `backup` without waiting for its answer (called
  // under the order lock, in LSN order, so it must not wait for other
  // writes) and returns what completes the delivery: waits for the answer
  // (and retries as Send does). Null: not handed over; Send delivers it.
  using Post = std::function<std::function<absl::Status()>(size_t backup,
                                                           const BackupLog::Write& write)>;
  // A write's apply that calls `ship` once it has checked the write and
  // before it changes this replica's state (at most once; never when it
  // refuses the write).
  using ApplyShipping = absl::FunctionRef<absl::Status(absl::FunctionRef<void()> ship)>;
  struct Options {
    // Writes numbered and not yet acknowledged by every backup, and their
    // bytes (method and request). Each must be >= 1.
    uint64_t max_in_flight_writes = 1024;
    uint64_t max_in_flight_bytes = uint64_t{256} << 20;
  };

  // `last_lsn`: the last LSN already in this replica's state (0: none).
  PrimaryLog(uint64_t epoch, uint64_t last_lsn, size_t backups, Options options, Send send,
             Post post = nullptr);
  PrimaryLog(const PrimaryLog&) = delete;
  PrimaryLog& operator=(const PrimaryLog&) = delete;

  // Runs `apply` (this replica's copy of the write) under the order lock;
  // if it succeeds the write takes the next LSN and is sent to every
  // backup; OK once all of them acknowledged it. Errors:
  // - `apply`'s own: the write took no LSN and was sent nowhere;
  // - UNAVAILABLE before applying: writes in flight are at their bound;
  // - a backup's refusal or the transport's error (the first, when several
  //   failed; every backup is sent the write regardless), prefixed with the
  //   backup and LSN. The write is then applied here and numbered but not
  //   acknowledged: the caller must not answer OK before the configuration
  //   drops that backup (a backup's FAILED_PRECONDITION means a newer epoch
  //   exists: this primary is stale and must step down).
  // `acks`, when given, receives each backup's own answer (one per backup,
  // in order; empty when the write was not sent).
  absl::Status Write(absl::string_view method, std::string request,
                     absl::FunctionRef<absl::Status()> apply,
                     std::vector<absl::Status>* acks = nullptr);
  // Write, overlapped: `request`'s bytes are shipped as they are (no copy).
  // When `apply` calls ship, the write takes the next LSN and is handed to
  // every backup (Post) then, and this replica's apply goes on while they
  // receive and apply it. When `apply` returns OK without calling it (a
  // retried push applied before, or a write it cannot check first), the
  // write is numbered and sent after it, as Write does. An error from
  // `apply` after ship is returned once every backup answered (a backup's
  // failure first): the write was numbered and shipped all the same, and
  // the caller must decide whether this replica still matches its backups
  // (the checks passed, so only what follows them can fail: see
  // PrimaryReplication::Write). `lsn`, when given, receives the LSN the
  // write took (0: none).
  absl::Status WriteShippingFirst(absl::string_view method, SharedBytes request,
                                  ApplyShipping apply,
                                  std::vector<absl::Status>* acks = nullptr,
                                  uint64_t* lsn = nullptr);

  uint64_t epoch() const { return epoch_; }
  uint64_t last_lsn() const;
  uint64_t in_flight_writes() const;
  uint64_t in_flight_bytes() const;

 private:
  const uint64_t epoch_;
  const size_t backups_;
  const Options options_;
  absl::Status WriteImpl(absl::string_view method, std::string request, SharedBytes shared,
                         ApplyShipping apply, std::vector<absl::Status>* acks,
                         uint64_t* lsn = nullptr);

  const Send send_;
  const Post post_;
  absl::Mutex order_mu_;  // held while a write is applied and numbered
  mutable absl::Mutex mu_;
  uint64_t last_lsn_ ABSL_GUARDED_BY(mu_);
  uint64_t in_flight_writes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t in_flight_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_PRIMARY_LOG_H_
