// The `sparse` group of bench/e2e: Table::Pull and Table::Push in keys/s over
// gRPC and in-process, next to a sparse ceiling measured in the same run (one
// thread gathering and SGD-updating the same rows of a 1M-row
// absl::flat_hash_map, no locks, no network).
//
//   SparseEnv env{start_cluster, run_workers};
//   PS_RETURN_IF_ERROR(SparseGroup(h, env));
#ifndef PSERVER_BENCH_SPARSE_GROUP_H_
#define PSERVER_BENCH_SPARSE_GROUP_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cc/client/client.h"
#include "harness.h"

namespace pserver::bench {

// Servers and their workers' clients; `servers` (processes or an in-process
// cluster) stay up while this lives.
struct SparseCluster {
  std::shared_ptr<void> servers;
  std::vector<std::unique_ptr<Client>> clients;
  // The server processes, whose CPU time is counted per key (none in-process:
  // then this process's CPU time holds the servers' too).
  std::vector<pid_t> server_pids;
};

struct SparseEnv {
  // `servers` servers (in-process when `embedded`) and one client per worker.
  std::function<absl::StatusOr<SparseCluster>(int servers, int workers, bool embedded)> start;
  // Runs op(worker) `ops` times on each of `workers` threads started
  // together; the wall seconds of the slowest.
  std::function<absl::StatusOr<double>(int workers, int ops,
                                       const std::function<absl::Status(int)>& op)>
      run_workers;
};

// Results (group "sparse", unit keys/s): ceiling_pull, ceiling_push, then
// pull, push (gRPC) and embedded_pull, embedded_push, each compared with the
// ceiling of its op, dim and batch; with --sparse_in_flight k > 1 also
// pull_async, push_async (and embedded_*): k PullAsync/PushAsync tickets in
// flight per worker, extra["in_flight"] = k. Each with
// extra["client_cpu_ns_per_key"] (this
// process, every thread) and extra["server_cpu_ns_per_key"] (the server
// processes): CPU time per key moved, which a loaded machine changes far
// less than keys/s.
absl::Status SparseGroup(Harness& h, const SparseEnv& env);

}  // namespace pserver::bench

#endif  // PSERVER_BENCH_SPARSE_GROUP_H_
