// The standby slots of a process started with --replicas=R
// (docs/replication.md, "Replicas in the serving processes"): R-1 Servers
// started as standbys beside the process's own, each on a port of its own
// (port 0: any free one), without a metrics listener, sharing the process's
// ProcessSlots so that none backs up a shard this process already holds or
// backs up. Each slot runs Server::Start in a thread of its own; Start
// returns once the slot took a shard over, and the slot then serves it as
// its primary until Stop, or until that server steps down (fenced by a
// newer epoch): then the slot shuts it down and starts a fresh standby in
// its place, so that the process backs up a shard again. A slot whose
// Start fails (no shard to back up within --register_timeout, etcd
// unreachable, ...) says why and starts again after a backoff (1 s,
// doubling up to 30 s; back to 1 s once a start succeeded), until the
// process stops. A slot hosts one server at a time: never more than
// `count` servers besides the process's own.
//
// Live moves (docs/elastic.md, "Moves with --replicas"): a slot's standby
// leaves its shard when the shard departs (it does not take it over) or to
// back up a shard that lacks a backup (Server::Start answers ABORTED): the
// slot starts a fresh standby at once. A slot serving a shard that departs
// answers redirects for `depart_linger`, then is shut down and replaced by
// a fresh standby (the process goes on: only the process's own server's
// departure stops it).
//
//   StandbySlots slots(options, replicas - 1, [](const Server& s) { ... });
//   ...                       // the process serves
//   slots.Stop(grace);        // after options.stop was notified
//
// Thread-safe.
#ifndef PSERVER_CC_SERVER_STANDBY_SLOTS_H_
#define PSERVER_CC_SERVER_STANDBY_SLOTS_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cc/server/server.h"

namespace pserver {

// `process` with what makes it a standby slot: standby, accepting standbys
// of its own once it took over, port 0, no metrics listener. `process` must
// carry process_slots and stop.
ServerOptions StandbySlotOptions(const ServerOptions& process);

class StandbySlots {
 public:
  // Starts `count` slots from `process` (StandbySlotOptions). `took_over`
  // is called (from the slot's thread) when a slot starts serving a shard;
  // `log` with each failed start.
  StandbySlots(const ServerOptions& process, int count,
               std::function<void(const Server&)> took_over,
               std::function<void(const std::string&)> log,
               absl::Duration depart_linger = absl::ZeroDuration());
  // Without Stop: notifies options.stop (the process is ending), then Stop(0).
  ~StandbySlots();

  // Waits for every slot's thread (options.stop must have been notified,
  // or the threads go on starting), then shuts the serving ones down with
  // `grace`. OK, or the first failed final checkpoint of a serving slot.
  absl::Status Stop(absl::Duration grace);

  // The slots serving a shard now.
  int serving() const;
  // Slots whose server stepped down or departed and was replaced by a
  // fresh standby.
  int replaced() const;
  // Standbys that left their shard (departed, or rebalanced) and were
  // started afresh.
  int left() const;

  // The first and the longest wait before a failed start is retried.
  static constexpr absl::Duration kFirstBackoff = absl::Seconds(1);
  static constexpr absl::Duration kMaxBackoff = absl::Seconds(30);

 private:
  void Run(int slot);
  // Waits until `server` (serving) steps down or departs (its reason) or
  // the process stops ("").
  std::string UntilGone(const Server& server) const;

  const ServerOptions options_;
  const absl::Duration depart_linger_;
  const std::function<void(const Server&)> took_over_;
  const std::function<void(const std::string&)> log_;
  std::vector<std::thread> threads_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Server>> serving_ ABSL_GUARDED_BY(mu_);
  int replaced_ ABSL_GUARDED_BY(mu_) = 0;
  int left_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ = false;
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_STANDBY_SLOTS_H_
