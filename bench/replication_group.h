// bench:e2e's replication group (docs/replication.md, the standby model):
// what a standby per shard costs, and how long a failover takes.
//   r1_* / r2_* / r3_*   push, pull and push+pull of 1, 16 and 64 MiB
//                 (--quick: up to 16 MiB), 1 server x 1 worker and 3 servers
//                 x 1 worker, without standbys (R=1), with one (R=2) and with
//                 two (R=3) per server; all servers discover each other
//                 through a real etcd
//   r1_latency_* / r2_latency_* / r3_latency_*   4 KiB push and pull, ops/s
//                 with p50/p99; R=2 and R=3 also what replication adds to
//                 R=1's (added_p50_us, added_p99_us)
//   failover      kill -9 of a primary -> the next training step completed,
//                 in seconds (min/median/max, extra p50/p99), over
//                 --failover_kills kills (--quick: at most 5), 3 servers,
//                 R=2, a model of 8 x 1M float32 pushed whole every step;
//                 a new standby attaches after each takeover
//   failover_silent  the same after SIGSTOP of a primary (a silent host: no
//                 refused dial, taken over at lease expiry, --lease_ttl=2),
//                 --failover_pauses times after the kills
// --replication_replicas, --replication_servers, --replication_sizes_kib and
// --failover_kills=0 narrow a run (e.g. R=1 and 2, 1 MiB, one server, to
// profile a replicated push).
// bench:e2e's rejoin group (only when named: --only=rejoin):
//   rejoin_copy_away<k> / rejoin_catch_up_away<k>
//                 a standby paused until its primary dropped it, resumed
//                 after k more steps of the same model on 1 server: seconds
//                 until it is listed again, with --catch_up_bytes=0 (a full
//                 copy) and 256 MiB (the writes since its own LSN); extra:
//                 writes delivered, steps from the pause to the listing and
//                 during the join (32 MiB each), CPU s of both processes
#ifndef PSERVER_BENCH_REPLICATION_GROUP_H_
#define PSERVER_BENCH_REPLICATION_GROUP_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cc/client/client.h"
#include "harness.h"

namespace pserver::bench {

// Measures push, pull and push+pull of `sizes` with `clients` on `servers`
// servers (the dense group's measurement, bench/e2e.cc), results named
// `prefix` + op in group "replication"; `pids` are the server processes.
using DenseRunner = std::function<absl::Status(
    const std::string& prefix, std::vector<std::unique_ptr<Client>>& clients, int servers,
    const std::vector<uint64_t>& sizes, const std::vector<pid_t>& pids)>;

struct ReplicationGroupOptions {
  std::string pserver_binary;
  // 0: no failover measured (a narrower run, e.g. under perf).
  int failover_kills = 20;
  // After the kills, primaries paused (SIGSTOP: a silent host, taken over
  // at lease expiry) and timed the same way (failover_silent).
  int failover_pauses = 3;
  // Empty: every default (R = 1, 2, 3; 1 and 3 servers; 1, 16, 64 MiB).
  std::vector<int> replicas;
  std::vector<int> servers;
  std::vector<uint64_t> sizes;
  // Extra flags for every pserver process of the push/pull clusters
  // (e2e's --server_flags), e.g. --catch_up_bytes=0.
  std::vector<std::string> server_flags;
};

absl::Status ReplicationGroup(Harness& h, const ReplicationGroupOptions& options,
                              const DenseRunner& dense);
// The rejoin group (above): what catch-up from a backup's own LSN saves.
absl::Status RejoinGroup(Harness& h, const ReplicationGroupOptions& options);

}  // namespace pserver::bench

#endif  // PSERVER_BENCH_REPLICATION_GROUP_H_
