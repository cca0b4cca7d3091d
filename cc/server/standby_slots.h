// The standby slots of a process started with --replicas=R
// (docs/replication.md, "Replicas in the serving processes"): R-1 Servers
// started as standbys beside the process's own, each on a port of its own
// (port 0: any free one), without a metrics listener, sharing the process's
// ProcessSlots so that none backs up a shard this process already holds or
// backs up. Each slot runs Server::Start in a thread of its own; Start
// returns once the slot took a shard over, and the slot then serves it as
// its primary until Stop. A slot whose Start fails (no shard to back up
// within --register_timeout, etcd unreachable, ...) says why and starts
// again a second later, until the process stops.
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
               std::function<void(const std::string&)> log);
  // Without Stop: notifies options.stop (the process is ending), then Stop(0).
  ~StandbySlots();

  // Waits for every slot's thread (options.stop must have been notified,
  // or the threads go on starting), then shuts the serving ones down with
  // `grace`. OK, or the first failed final checkpoint of a serving slot.
  absl::Status Stop(absl::Duration grace);

  // The slots serving a shard now.
  int serving() const;

 private:
  void Run(int slot);

  const ServerOptions options_;
  const std::function<void(const Server&)> took_over_;
  const std::function<void(const std::string&)> log_;
  std::vector<std::thread> threads_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Server>> serving_ ABSL_GUARDED_BY(mu_);
  bool stopped_ = false;
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_STANDBY_SLOTS_H_
