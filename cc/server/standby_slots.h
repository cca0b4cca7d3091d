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
#include <optional>
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
// of its own once it took over, port 0, no metrics listener, no
// on_departed (a slot whose shard departs is replaced; the process goes
// on). `process` must carry process_slots and stop.
ServerOptions StandbySlotOptions(const ServerOptions& process);

// Whether a server started with `options` comes back as a standby once it
// steps down (ServerSeat): with etcd and --accept_standbys (--replicas and
// --standby processes included), since then the shard's new primary takes
// standbys. An R=1 server (no --accept_standbys) stays fenced, as its
// successor would take no standby.
bool RejoinsAfterSteppingDown(const ServerOptions& options);

// The fresh standby that replaces a server of `options` which stepped down
// from shard `shard`: a standby (accepting standbys once it took over) that
// prefers `shard` among the shards with the fewest backups. Same port,
// metrics and checkpoint directory: the server it replaces is shut down
// first.
ServerOptions RejoinOptions(const ServerOptions& options, uint32_t shard);

// One server at a time (docs/replication.md, "A stepped-down server rejoins
// as a standby"): it serves until it steps down (fenced by a newer epoch),
// then it is shut down, dropping its state, and a fresh standby
// (RejoinOptions) starts in its place: it copies a shard from its primary,
// its old one when that has the fewest backups, catches up and is listed as
// a backup, and serves again if it takes that shard over. A start that
// fails (no shard to back up within --register_timeout, etcd unreachable)
// is retried after a backoff (kFirstBackoff, doubling up to kMaxBackoff;
// back to the first once a start succeeded), until `standby.stop` is
// notified. A start answered ABORTED (its standby left its shard: the shard
// departed, or it goes to back up one lacking a backup) starts a fresh
// standby at once. With `depart_linger`, a server whose shard departs in a
// live move answers redirects for that long, then is replaced as one that
// stepped down (without it, departures are the caller's: on_departed). The
// process's own server (pserver with --accept_standbys) and each standby
// slot of a --replicas process sit in one.
class ServerSeat {
 public:
  // `standby`: what a replacement starts from (standby set; stop set).
  // `name` opens its log lines; `serving` is called (from Run's thread)
  // when a replacement starts serving a shard.
  ServerSeat(ServerOptions standby, std::string name,
             std::function<void(const Server&)> serving,
             std::function<void(const std::string&)> log,
             std::optional<absl::Duration> depart_linger = std::nullopt);

  // Until standby.stop is notified: serves `first` (null: a standby starts
  // first) and replaces each server that steps down.
  void Run(std::unique_ptr<Server> first);
  // After Run returned: shuts the serving server down with `grace`; its
  // final checkpoint's status (OK when none serves).
  absl::Status Stop(absl::Duration grace);

  // Whether a server serves a shard now (not a standby waiting).
  bool serving() const;
  // Servers that stepped down or departed and were replaced by a fresh
  // standby.
  int replaced() const;
  // Standbys that left their shard and were started afresh.
  int left() const;

  static constexpr absl::Duration kFirstBackoff = absl::Seconds(1);
  static constexpr absl::Duration kMaxBackoff = absl::Seconds(30);

 private:
  // Waits until `server` (serving) steps down or departs (why) or the
  // process stops ("").
  std::string UntilGone(const Server& server) const;

  const ServerOptions standby_;
  const std::string name_;
  const std::function<void(const Server&)> serving_callback_;
  const std::function<void(const std::string&)> log_;
  const std::optional<absl::Duration> depart_linger_;
  mutable absl::Mutex mu_;
  std::unique_ptr<Server> serving_ ABSL_GUARDED_BY(mu_);
  int replaced_ ABSL_GUARDED_BY(mu_) = 0;
  int left_ ABSL_GUARDED_BY(mu_) = 0;
};

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
  // Slots whose server stepped down and was replaced by a fresh standby.
  int replaced() const;
  // Standbys that left their shard (departed, or rebalanced) and were
  // started afresh.
  int left() const;

  // The first and the longest wait before a failed start is retried.
  static constexpr absl::Duration kFirstBackoff = ServerSeat::kFirstBackoff;
  static constexpr absl::Duration kMaxBackoff = ServerSeat::kMaxBackoff;

 private:
  const ServerOptions options_;
  std::vector<std::unique_ptr<ServerSeat>> seats_;  // one per slot
  std::vector<std::thread> threads_;
  bool stopped_ = false;
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_STANDBY_SLOTS_H_
