#include "cc/server/server_metrics.h"

#include <dirent.h>
#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace pserver {
namespace {

using metrics::TextWriter;
using metrics::Type;

// Workers per table whose clocks are exported (the slowest): bounds a scrape.
constexpr size_t kMaxWorkerSeries = 256;

void Gauge(TextWriter& out, absl::string_view name, const char* help, double value,
           const metrics::Labels& labels = {}) {
  out.Family(name, help, Type::kGauge);
  out.Sample(name, labels, value);
}

void Count(TextWriter& out, const char* name, const char* help, uint64_t value) {
  out.Family(name, help, Type::kCounter);
  out.Sample(name, {}, value);
}

// A counter family with one sample per label value of `label`.
void CountEach(TextWriter& out, const char* name, const char* help, const char* label,
               const std::vector<std::pair<std::string, uint64_t>>& values) {
  out.Family(name, help, Type::kCounter);
  for (const auto& [value, count] : values) out.Sample(name, {{label, value}}, count);
}

void CollectStats(const Dispatcher& dispatcher, TextWriter& out) {
  v1::ServerStats s;
  dispatcher.FillStats(&s);
  Gauge(out, "pserver_initialized", "1 once FinishInitParams opened the server.",
        s.initialized() ? 1 : 0);
  Gauge(out, "pserver_parameter_blocks", "Parameter blocks held (an unsplit parameter is one).",
        static_cast<double>(s.parameters()));
  Gauge(out, "pserver_parameter_bytes", "Bytes of parameter values held.",
        static_cast<double>(s.parameter_bytes()));
  Gauge(out, "pserver_optimizer_state_bytes", "Bytes of optimizer state held.",
        static_cast<double>(s.optimizer_state_bytes()));
  const MemoryBudget& params = dispatcher.param_budget();
  Gauge(out, "pserver_param_budget_used_bytes",
        "Bytes of parameter values and optimizer state counted against --max_param_bytes.",
        static_cast<double>(params.used()));
  Gauge(out, "pserver_param_budget_limit_bytes", "--max_param_bytes as resolved at start.",
        static_cast<double>(params.limit()));
  Count(out, "pserver_gradients_applied_total", "Gradients applied to parameters.",
        s.gradients_applied());
  Count(out, "pserver_gets_served_total", "Parameter blocks read.", s.gets_served());
  Count(out, "pserver_requests_rejected_total",
        "Requests refused as invalid (bad names, shapes, non-finite gradients refused, ...).",
        s.requests_rejected());
  Count(out, "pserver_duplicate_pushes_total",
        "Retried pushes acknowledged without applying them again.", s.duplicates_ignored());
  Count(out, "pserver_non_finite_gradients_skipped_total",
        "Gradients with a NaN or infinity skipped (non_finite: SKIP).", s.non_finite_skipped());
  Count(out, "pserver_non_finite_gradients_refused_total",
        "Gradients with a NaN or infinity refused (non_finite: REJECT), failing their request.",
        s.non_finite_refused());
  Gauge(out, "pserver_reply_bytes_in_flight",
        "Bytes of read replies built but not yet sent (--max_reply_bytes_in_flight).",
        static_cast<double>(s.reply_bytes_in_flight()));
  Count(out, "pserver_reads_refused_for_memory_total",
        "Reads refused because --max_reply_bytes_in_flight was reached.",
        s.reads_refused_for_memory());
  Gauge(out, "pserver_uptime_seconds", "Seconds since the server started.", s.uptime_seconds());
  Gauge(out, "pserver_checkpoint_sequence",
        "Sequence of the newest checkpoint saved or loaded; 0: none.",
        static_cast<double>(s.checkpoint_sequence()));
}

// Per worker of each table (BSP/SSP clocks): its clock and how many clocks it
// is behind the table's fastest worker; the kMaxWorkerSeries slowest only.
void CollectWorkerClocks(const Tables& tables, TextWriter& out) {
  struct TableClocks {
    std::string table;
    Tables::Clocks slowest;  // ascending clock
    int64_t fastest = 0;
  };
  std::vector<TableClocks> all;
  for (auto& [table, clocks] : tables.AllWorkerClocks()) {
    if (clocks.empty()) continue;
    std::stable_sort(clocks.begin(), clocks.end(),
                     [](const auto& a, const auto& b) { return a.second < b.second; });
    const int64_t fastest = clocks.back().second;
    if (clocks.size() > kMaxWorkerSeries) clocks.resize(kMaxWorkerSeries);
    all.push_back({table, std::move(clocks), fastest});
  }
  out.Family("pserver_table_worker_clock", "A registered worker's clock, by table and worker.",
             Type::kGauge);
  for (const TableClocks& t : all) {
    for (const auto& [worker, clock] : t.slowest) {
      out.Sample("pserver_table_worker_clock", {{"table", t.table}, {"worker", worker}},
                 static_cast<int64_t>(clock));
    }
  }
  out.Family("pserver_table_worker_clock_lag",
             "Clocks a worker is behind the table's fastest worker (SSP/BSP staleness).",
             Type::kGauge);
  for (const TableClocks& t : all) {
    for (const auto& [worker, clock] : t.slowest) {
      out.Sample("pserver_table_worker_clock_lag", {{"table", t.table}, {"worker", worker}},
                 static_cast<int64_t>(t.fastest - clock));
    }
  }
}

void CollectTables(const Tables& tables, TextWriter& out) {
  v1::TableStatsResponse response;
  tables.Stats(&response);
  const struct {
    const char* name;
    const char* help;
    Type type;
    std::function<double(const v1::TableStats&)> value;
  } families[] = {
      {"pserver_table_rows", "Rows held (admitted, not evicted), by table.", Type::kGauge,
       [](const v1::TableStats& t) { return static_cast<double>(t.rows()); }},
      {"pserver_table_bytes", "Bytes of values and optimizer state held, by table.",
       Type::kGauge, [](const v1::TableStats& t) { return static_cast<double>(t.bytes()); }},
      {"pserver_table_pending_keys", "Keys seen but not yet admitted, by table.", Type::kGauge,
       [](const v1::TableStats& t) { return static_cast<double>(t.pending_keys()); }},
      {"pserver_table_evictions_total", "Rows evicted (TTL and capacity), by table.",
       Type::kCounter, [](const v1::TableStats& t) { return static_cast<double>(t.evictions()); }},
      {"pserver_table_admissions_total",
       "Keys admitted (given a row on their admission_count-th sighting), by table.",
       Type::kCounter,
       [](const v1::TableStats& t) { return static_cast<double>(t.admissions()); }},
      {"pserver_table_admission_refusals_total",
       "Pushed keys whose gradient was dropped: not admitted yet, by table.", Type::kCounter,
       [](const v1::TableStats& t) { return static_cast<double>(t.admission_refusals()); }},
      {"pserver_table_keys_pulled_total", "Keys pulled, by table (rate(): keys/s).",
       Type::kCounter,
       [](const v1::TableStats& t) { return static_cast<double>(t.keys_pulled()); }},
      {"pserver_table_keys_pushed_total", "Keys pushed, by table (rate(): keys/s).",
       Type::kCounter,
       [](const v1::TableStats& t) { return static_cast<double>(t.keys_pushed()); }},
      {"pserver_table_workers", "Workers registered with the table's clocks.", Type::kGauge,
       [](const v1::TableStats& t) { return static_cast<double>(t.workers()); }},
      {"pserver_table_min_clock", "The slowest registered worker's clock; -1: no worker.",
       Type::kGauge, [](const v1::TableStats& t) { return static_cast<double>(t.min_clock()); }},
  };
  for (const auto& family : families) {
    out.Family(family.name, family.help, family.type);
    for (const v1::TableStats& t : response.tables()) {
      out.Sample(family.name, {{"table", t.name()}}, family.value(t));
    }
  }
  CollectWorkerClocks(tables, out);
  Gauge(out, "pserver_table_row_budget_used_bytes",
        "Bytes of table rows, all tables, counted against --max_table_row_bytes.",
        static_cast<double>(tables.row_budget().used()));
  Gauge(out, "pserver_table_row_budget_limit_bytes", "--max_table_row_bytes as resolved at start.",
        static_cast<double>(tables.row_budget().limit()));
  Gauge(out, "pserver_collective_rounds", "Collective rounds open.",
        static_cast<double>(response.collective_rounds()));
  Gauge(out, "pserver_collective_bytes",
        "Bytes held by collectives waiting for participants (--max_collective_bytes).",
        static_cast<double>(response.collective_bytes()));
  Gauge(out, "pserver_waiting_calls",
        "Calls waiting on clocks or collectives (they hold no thread).",
        static_cast<double>(response.waiting_calls()));
}

void CollectCheckpoints(const CheckpointMetrics& c, TextWriter& out) {
  Count(out, "pserver_checkpoint_saves_total", "Checkpoint saves attempted.", c.saves.value());
  Count(out, "pserver_checkpoint_failures_total", "Checkpoint saves that failed.",
        c.failures.value());
  out.Family("pserver_checkpoint_duration_seconds", "Time a checkpoint save took.",
             Type::kHistogram);
  const metrics::Histogram::Snapshot s = c.duration.Read();
  out.Histogram("pserver_checkpoint_duration_seconds", {}, c.duration.bounds(), s.buckets, s.sum,
                1e9);
  const int64_t last = c.last_success_unix_nanos.load(std::memory_order_relaxed);
  if (last != 0) {
    Gauge(out, "pserver_checkpoint_last_success_timestamp_seconds",
          "Unix time of the newest checkpoint saved (or loaded at start).",
          static_cast<double>(last) / 1e9);
    Gauge(out, "pserver_checkpoint_age_seconds",
          "Seconds since the newest checkpoint was saved (or loaded at start).",
          static_cast<double>(absl::GetCurrentTimeNanos() - last) / 1e9);
  }
}

void CollectEtcd(const EtcdSessionState& state, TextWriter& out) {
  Gauge(out, "pserver_etcd_registered",
        "1 while the server's index is held in etcd under a live lease.",
        state.registered ? 1 : 0);
  Count(out, "pserver_etcd_registrations_total",
        "Successful etcd registrations (1 at start, one more per re-registration).",
        state.registrations);
  Count(out, "pserver_etcd_leases_lost_total", "etcd leases lost.", state.leases_lost);
}

// The number after `key` in /proc/self/status ("VmRSS:\t  1234 kB"); -1 if absent.
int64_t ProcStatusField(const std::string& status, absl::string_view key) {
  size_t at = status.find(absl::StrCat("\n", key, ":"));
  if (at == std::string::npos) return -1;
  at += key.size() + 2;
  absl::string_view rest(status);
  rest.remove_prefix(at);
  rest = absl::StripLeadingAsciiWhitespace(rest.substr(0, rest.find('\n')));
  rest = rest.substr(0, rest.find(' '));
  int64_t value = -1;
  return absl::SimpleAtoi(rest, &value) ? value : -1;
}

}  // namespace

CheckpointTimer::~CheckpointTimer() {
  metrics_->saves.Add();
  metrics_->duration.Observe(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                           start_)
          .count()));
  if (succeeded_) {
    metrics_->last_success_unix_nanos.store(absl::GetCurrentTimeNanos(),
                                            std::memory_order_relaxed);
  } else {
    metrics_->failures.Add();
  }
}

namespace {

void CollectShard(const ShardState& shard, TextWriter& out) {
  Gauge(out, "pserver_shard_epoch",
        "The epoch of this server's claim on its shard (/shards/<index>); 0: not claimed yet.",
        static_cast<double>(shard.epoch));
  if (shard.fenced) {
    Gauge(out, "pserver_fence_confirmed",
          "1 while the lease confirms this server's index: writes are acknowledged.",
          shard.confirmed ? 1 : 0);
    Gauge(out, "pserver_fence_stepped_down",
          "1 once this server stepped down for good (another server holds its shard).",
          shard.stepped_down ? 1 : 0);
  }
}

void CollectReplication(const ReplicationState& r, TextWriter& out) {
  if (r.primary) {
    Gauge(out, "pserver_replication_backups",
          "Live backups of this primary's shard (0 after a backup was dropped).",
          static_cast<double>(r.backups));
    Gauge(out, "pserver_replication_last_lsn",
          "LSN of the last write this primary numbered (shipped to its backups).",
          static_cast<double>(r.last_lsn));
    Count(out, "pserver_replication_dropped_total",
          "Backups this primary dropped from /shards/<i> for not acknowledging a write.",
          r.dropped);
    Count(out, "pserver_replication_joined_total",
          "Standbys listed as backups once they caught up on the writes made during their copy.",
          r.joined);
    Count(out, "pserver_replication_caught_up_writes_total",
          "Writes joining standbys caught up on (made while their copy was taken and sent).",
          r.caught_up);
    CountEach(out, "pserver_replication_sent_total",
              "Writes sent to a backup (each backup's copy, retries included), by transport: "
              "the bulk channel or gRPC Replicate (when the backup's channel cannot be opened).",
              "transport", {{"channel", r.sent_over_channel}, {"grpc", r.sent_over_grpc}});
    Gauge(out, "pserver_replication_degraded",
          "1 while this primary has no backup after dropping one (GetStats' degraded).",
          r.dropped > 0 && r.backups == 0 ? 1 : 0);
  }
  if (r.standby) {
    Gauge(out, "pserver_backup_applied_lsn",
          "LSN of the last of its primary's writes this standby applied.",
          static_cast<double>(r.applied_lsn));
  }
}

}  // namespace

void CollectProcess(TextWriter& out) {
  std::ifstream file("/proc/self/status");
  const std::string status((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const std::string text = absl::StrCat("\n", status);
  const int64_t rss_kb = ProcStatusField(text, "VmRSS");
  const int64_t threads = ProcStatusField(text, "Threads");
  if (rss_kb >= 0) {
    Gauge(out, "process_resident_memory_bytes", "Resident memory size in bytes.",
          static_cast<double>(rss_kb) * 1024);
  }
  if (threads >= 0) {
    Gauge(out, "process_threads", "Threads of the process.", static_cast<double>(threads));
  }
  if (DIR* dir = opendir("/proc/self/fd"); dir != nullptr) {
    int64_t fds = 0;
    while (dirent* entry = readdir(dir)) {
      if (entry->d_name[0] != '.') ++fds;
    }
    closedir(dir);
    Gauge(out, "process_open_fds", "Open file descriptors.", static_cast<double>(fds - 1));
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    Gauge(out, "process_max_fds", "The file descriptor limit (ulimit -n).",
          static_cast<double>(limit.rlim_cur));
  }
}

void AddServerCollectors(ServerMetricsSources sources, metrics::Registry* registry) {
  auto shared = std::make_shared<ServerMetricsSources>(std::move(sources));
  registry->Add([shared](TextWriter& out) {
    const ServerMetricsSources& s = *shared;
    Gauge(out, "pserver_server_info", "Always 1; the labels say which server this is.", 1,
          {{"index", absl::StrCat(s.dispatcher->index())}, {"cluster", s.cluster}});
    if (s.healthy) {
      Gauge(out, "pserver_serving",
            "1 while the gRPC health service answers SERVING (registered, loaded, not "
            "draining).",
            s.healthy() ? 1 : 0);
    }
    s.dispatcher->request_metrics().Collect(out);
    CollectStats(*s.dispatcher, out);
    CollectTables(*s.tables, out);
    if (s.checkpoints != nullptr) CollectCheckpoints(*s.checkpoints, out);
    if (s.etcd) CollectEtcd(s.etcd(), out);
    if (s.shard) CollectShard(s.shard(), out);
    if (s.replication) CollectReplication(s.replication(), out);
    CollectProcess(out);
  });
}

}  // namespace pserver
