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
// Before it writes a new move it asks every old owner whether it would
// take part (MoveBlocks for the stable version, which moves nothing): a
// server that refuses the coordinator's credentials (PERMISSION_DENIED,
// UNAUTHENTICATED, a TLS handshake that fails) or takes part in no move
// (no --placement_redirects, --replicas) fails the call with nothing
// written.
//
// Needs every server started with --etcd and --placement_redirects, without
// --replicas. On a secured cluster (docs/security.md) the coordinator
// presents `tls` and `token`, which must name the admin role of the job
// (MoveBlocks needs it); the servers hand blocks to each other with their
// own certificate and --peer_token_file (cc/server/peer_channel.h).
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
#include "cc/etcd/etcd_client.h"
#include "cc/security/tls.h"

namespace pserver {

struct ScaleOptions {
  std::vector<std::string> etcd_endpoints;
  std::string cluster = "default";
  uint32_t to = 0;  // M, 1 .. 4096
  // The whole operation, waiting for new servers included.
  absl::Duration timeout = absl::Minutes(10);
  std::function<void(const std::string& line)> progress;  // null: quiet
  // --- a secured cluster (docs/security.md) ---
  // Mutual TLS to the servers with this certificate (off: plaintext).
  TlsOptions tls;
  // A bearer token for servers with roles ("": none); an admin's of the job.
  std::string token;
  // etcd over TLS (off: plaintext).
  EtcdTlsOptions etcd_tls;
};

struct ScaleResult {
  uint32_t from = 0;  // N
  uint32_t to = 0;    // M
  uint64_t version = 0;  // the stable placement's, now in etcd
  bool moved = false;    // false: it was at M already
  uint64_t blocks_moved = 0;
  uint64_t bytes_moved = 0;  // values and optimizer state handed over by this run
};

// See above. INVALID_ARGUMENT for a count outside 1..4096, TLS files that
// are not a certificate, key and CA, or a token with whitespace in it;
// PERMISSION_DENIED / UNAUTHENTICATED (naming the server and the method)
// when an old owner refuses the coordinator's credentials, with nothing
// written; FAILED_PRECONDITION when etcd holds no /placement (no server has
// started), an old owner takes part in no move (nothing written)
// or a move to another count is under way; DEADLINE_EXCEEDED when the new
// servers did not register in time (the move stays under way: run again).
absl::StatusOr<ScaleResult> ScaleCluster(const ScaleOptions& options);

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_MOVE_COORDINATOR_H_
