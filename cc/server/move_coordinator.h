// ScaleCluster: the coordinator of a live move (psctl scale, docs/elastic.md).
//
//   ScaleOptions options;
//   options.etcd_endpoints = {"127.0.0.1:2379"};
//   options.cluster = "demo";
//   options.to = 3;
//   options.progress = [](const std::string& line) { std::puts(line.c_str()); };
//   PS_ASSIGN_OR_RETURN(ScaleResult result, ScaleCluster(options));
//
// From a stable /placement (version v, N servers) to M servers:
//   1. writes /placement {v+1, M, moving, from N} (a transaction guarded by
//      what it read: two coordinators cannot both start a move);
//   2. growing: sets /ps_desired = M, so that servers started with --etcd
//      claim the free indexes N..M-1; waits until /ps/0 .. /ps/max(N,M)-1
//      are all registered (start the new servers meanwhile);
//   3. asks every server 0..N-1 at once to hand its leaving blocks over
//      (MoveBlocks; retried while UNAVAILABLE);
//   4. writes /placement {v+2, M, stable}; shrinking: sets /ps_desired = M.
//      Servers M..N-1 see that they are left out and exit (pserver does).
// Safe to run again after it died or failed midway: a /placement still
// moving to M resumes at step 2 (servers do not send a block twice); a
// stable one for M only makes sure /ps_desired is M. A move to another
// count while one is under way is refused (FAILED_PRECONDITION naming it).
//
// Needs every server started with --etcd and --placement_redirects, without
// --replicas, TLS or roles (the calls are plaintext, without credentials).
// With standbys (--accept_standbys, --standby) a primary killed mid-move is
// taken over and asked again: MoveBlocks goes to whoever holds /ps/<i> at
// each attempt (cc/server/move.h, "Moves with replication").
// Thread-safe (no shared state).
#ifndef PSERVER_CC_SERVER_MOVE_COORDINATOR_H_
#define PSERVER_CC_SERVER_MOVE_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pserver {

struct ScaleOptions {
  std::vector<std::string> etcd_endpoints;
  std::string cluster = "default";
  uint32_t to = 0;  // M, 1 .. 4096
  // The whole operation, waiting for new servers included.
  absl::Duration timeout = absl::Minutes(10);
  std::function<void(const std::string& line)> progress;  // null: quiet
};

struct ScaleResult {
  uint32_t from = 0;  // N
  uint32_t to = 0;    // M
  uint64_t version = 0;  // the stable placement's, now in etcd
  bool moved = false;    // false: it was at M already
  uint64_t blocks_moved = 0;
  uint64_t bytes_moved = 0;  // values and optimizer state handed over by this run
};

// See above. INVALID_ARGUMENT for a count outside 1..4096;
// FAILED_PRECONDITION when etcd holds no /placement (no server has started)
// or a move to another count is under way; DEADLINE_EXCEEDED when the new
// servers did not register in time (the move stays under way: run again).
absl::StatusOr<ScaleResult> ScaleCluster(const ScaleOptions& options);

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_MOVE_COORDINATOR_H_
