// What a Server exports on --metrics_port (docs/operations.md lists every
// name): the dispatcher's per-method request metrics, the counters GetStats
// and TableStats report (read at scrape time, not counted twice), checkpoint
// saves, the etcd session and the process.
//
//   metrics::Registry registry;
//   ServerMetricsSources sources;
//   sources.dispatcher = &dispatcher;
//   sources.tables = &tables;
//   AddServerCollectors(sources, &registry);
//   std::string page = registry.Render();
//
// CheckpointMetrics is thread-safe and lock-free; the collectors read their
// sources under those sources' own locks.
#ifndef PSERVER_CC_SERVER_SERVER_METRICS_H_
#define PSERVER_CC_SERVER_SERVER_METRICS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "cc/core/tables.h"
#include "cc/metrics/metrics.h"
#include "cc/server/dispatcher.h"

namespace pserver {

// Checkpoint saves: how many, how many failed, how long they took and when
// the newest good one was written (or loaded at start).
struct CheckpointMetrics {
  metrics::Counter saves;
  metrics::Counter failures;
  metrics::Histogram duration{metrics::LatencyBoundsNanos()};
  std::atomic<int64_t> last_success_unix_nanos{0};  // 0: none yet
};

// Times one save: a failure unless Succeeded() is called before it is
// destroyed.
class CheckpointTimer {
 public:
  explicit CheckpointTimer(CheckpointMetrics* metrics)
      : metrics_(metrics), start_(std::chrono::steady_clock::now()) {}
  ~CheckpointTimer();
  CheckpointTimer(const CheckpointTimer&) = delete;
  CheckpointTimer& operator=(const CheckpointTimer&) = delete;
  void Succeeded() { succeeded_ = true; }

 private:
  CheckpointMetrics* const metrics_;
  const std::chrono::steady_clock::time_point start_;
  bool succeeded_ = false;
};

// The etcd session as the metrics show it.
struct EtcdSessionState {
  bool registered = false;  // the server's key is held under a live lease now
  uint64_t registrations = 0;
  uint64_t leases_lost = 0;
};

// The shard this server holds, as the metrics show it (with etcd).
struct ShardState {
  uint64_t epoch = 0;          // of the claim on /shards/<index>; 0: not claimed yet
  bool fenced = false;         // a write fence is in force (after the claim)
  bool confirmed = false;      // the fence confirms the index now (writes are acknowledged)
  bool stepped_down = false;   // for good (another server took the shard)
};

// Replication on the standby model (docs/replication.md), as the metrics
// show it.
struct ReplicationState {
  bool primary = false;      // --accept_standbys and serving its shard
  uint64_t backups = 0;      // live backups of its shard
  uint64_t last_lsn = 0;     // the last write it numbered
  uint64_t dropped = 0;      // backups dropped so far
  uint64_t joined = 0;       // standbys listed after catching up
  uint64_t caught_up = 0;    // writes they caught up on, in all
  uint64_t sent_over_channel = 0;  // writes sent to a backup over the bulk channel
  uint64_t sent_over_grpc = 0;     // and over gRPC Replicate
  bool standby = false;      // started as --standby
  uint64_t applied_lsn = 0;  // the last of its primary's writes applied here
};

struct ServerMetricsSources {
  const Dispatcher* dispatcher = nullptr;  // required
  const Tables* tables = nullptr;          // required
  const CheckpointMetrics* checkpoints = nullptr;  // null: no checkpoint families
  std::function<EtcdSessionState()> etcd;         // null: no etcd families
  std::function<ShardState()> shard;              // null: no epoch or fence families
  std::function<bool()> healthy;                  // what the health service says
  std::function<ReplicationState()> replication;  // null: no replication families
  std::string cluster;
};

// Adds the server's collectors to `registry`; the sources must outlive it.
void AddServerCollectors(ServerMetricsSources sources, metrics::Registry* registry);

// process_resident_memory_bytes, process_threads, process_open_fds and
// process_max_fds, from /proc/self: the standard names Prometheus's own
// client libraries export (not prefixed, so dashboards for any process work).
void CollectProcess(metrics::TextWriter& out);

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_SERVER_METRICS_H_
