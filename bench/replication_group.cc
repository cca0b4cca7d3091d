#include "replication_group.h"

#include <signal.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cc/core/status_macros.h"
#include "cc/core/tensor.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/shard_config.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/testing/child_process.h"
#include "params.h"

namespace pserver::bench {
namespace {

constexpr uint64_t kKiB = 1 << 10;
constexpr uint64_t kMiB = 1 << 20;
constexpr char kCluster[] = "bench";
constexpr absl::Duration kWait = absl::Seconds(60);

// `servers` pserver processes registered in a fresh etcd, with `standbys`
// standbys each (0, 1 or 2: R = standbys + 1). Every process is killed (by
// PID) when this goes.
class Cluster {
 public:
  // `extra`: flags every process gets besides the cluster's.
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(const std::string& binary, int servers,
                                                        int standbys,
                                                        std::vector<std::string> extra = {}) {
    std::unique_ptr<Cluster> cluster(new Cluster(binary, servers, standbys));
    cluster->extra_ = std::move(extra);
    PS_ASSIGN_OR_RETURN(cluster->etcd_, testing::EtcdProcess::Start());
    EtcdClientOptions options;
    options.endpoints = {cluster->etcd_->endpoint()};
    options.prefix = etcd_keys::ClusterPrefix(kCluster);
    PS_ASSIGN_OR_RETURN(cluster->etcd_client_, EtcdClient::Connect(options));
    for (int i = 0; i < servers; ++i) {
      std::vector<std::string> flags = cluster->Flags();
      PS_ASSIGN_OR_RETURN(std::unique_ptr<ChildProcess> child, ChildProcess::Spawn(binary, flags));
      PS_ASSIGN_OR_RETURN(std::string address,
                          WaitForPserverAddress(*child, i, absl::Now() + kWait));
      cluster->processes_[address] = std::move(child);
    }
    // Round r gives every shard its r-th standby (a standby attaches to the
    // shard with the fewest backups, the lowest index first).
    for (int r = 1; r <= standbys; ++r) {
      for (int i = 0; i < servers; ++i) PS_RETURN_IF_ERROR(cluster->AddStandby(i, r));
    }
    return cluster;
  }

  absl::StatusOr<std::unique_ptr<Client>> Connect() const {
    ClientOptions options;
    options.etcd_endpoints = {etcd_->endpoint()};
    options.cluster = kCluster;
    options.timeout = absl::Seconds(120);
    return Client::Connect(options);
  }

  // Starts a standby and waits until /shards/<shard> lists `backups`
  // backups, the last of them the new standby (the shard with the fewest).
  absl::Status AddStandby(uint32_t shard, int backups = 1) {
    std::vector<std::string> flags = Flags();
    flags.push_back("--standby");
    PS_ASSIGN_OR_RETURN(std::unique_ptr<ChildProcess> child, ChildProcess::Spawn(binary_, flags));
    const absl::Time deadline = absl::Now() + kWait;
    while (Replicas(shard) != backups) {
      if (absl::Now() >= deadline) {
        // Stopped to read what it said (the run fails anyway).
        kill(child->pid(), SIGKILL);
        child->WaitForExit(absl::Now() + kWait).IgnoreError();
        return absl::DeadlineExceededError(absl::StrCat(
            "no standby attached to shard ", shard, " (/shards/", shard, " lists ", Replicas(shard),
            " backups) within ", absl::FormatDuration(kWait), "; its output:\n", child->output()));
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    PS_ASSIGN_OR_RETURN(v1::ShardConfig config, Config(shard));
    PS_ASSIGN_OR_RETURN(std::string address,
                        AddressAt(etcd_keys::StandbyKey(
                            shard, config.replicas(config.replicas_size() - 1))));
    processes_[address] = std::move(child);
    return absl::OkStatus();
  }

  // kill -9 of shard `shard`'s primary; returns once it is reaped.
  absl::Status KillPrimary(uint32_t shard) {
    PS_ASSIGN_OR_RETURN(std::string address, PausePrimary(shard));
    return KillPaused(address);
  }
  // SIGSTOP of shard `shard`'s primary (a silent host: its kernel still
  // accepts connections, so nothing is refused); returns its address.
  absl::StatusOr<std::string> PausePrimary(uint32_t shard) {
    PS_ASSIGN_OR_RETURN(std::string address, AddressAt(etcd_keys::ServerKey(shard)));
    auto it = processes_.find(address);
    if (it == processes_.end()) {
      return absl::NotFoundError(absl::StrCat("no process of this run serves ", address));
    }
    if (kill(it->second->pid(), SIGSTOP) != 0) return absl::InternalError("SIGSTOP failed");
    return address;
  }
  // kill -9 of the (paused) process at `address`; returns once it is reaped.
  absl::Status KillPaused(const std::string& address) {
    auto it = processes_.find(address);
    if (it == processes_.end()) {
      return absl::NotFoundError(absl::StrCat("no process of this run serves ", address));
    }
    if (kill(it->second->pid(), SIGKILL) != 0) return absl::InternalError("kill failed");
    PS_RETURN_IF_ERROR(it->second->WaitForExit(absl::Now() + kWait).status());
    processes_.erase(it);
    return absl::OkStatus();
  }

  // The process at `address` (null: none of this run's).
  ChildProcess* At(const std::string& address) const {
    auto it = processes_.find(address);
    return it == processes_.end() ? nullptr : it->second.get();
  }
  // Shard `shard`'s primary's and first backup's addresses.
  absl::StatusOr<std::string> PrimaryAddress(uint32_t shard) const {
    return AddressAt(etcd_keys::ServerKey(shard));
  }
  absl::StatusOr<std::string> BackupAddress(uint32_t shard) const {
    PS_ASSIGN_OR_RETURN(v1::ShardConfig config, Config(shard));
    if (config.replicas_size() == 0) return absl::NotFoundError("no backup");
    return AddressAt(etcd_keys::StandbyKey(shard, config.replicas(0)));
  }
  // Waits (up to kWait) until /shards/<shard> lists `backups` backups.
  absl::Status AwaitBackups(uint32_t shard, int backups) const {
    const absl::Time deadline = absl::Now() + kWait;
    while (Replicas(shard) != backups) {
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("shard ", shard, " never had ", backups,
                                                        " backups"));
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    return absl::OkStatus();
  }

  std::vector<pid_t> pids() const {
    std::vector<pid_t> out;
    for (const auto& [address, child] : processes_) out.push_back(child->pid());
    return out;
  }

 private:
  Cluster(std::string binary, int servers, int standbys)
      : binary_(std::move(binary)), servers_(servers), standbys_(standbys) {}

  std::vector<std::string> Flags() const {
    std::vector<std::string> flags = {"--host=127.0.0.1",
                                      "--port=0",
                                      "--etcd=" + etcd_->endpoint(),
                                      absl::StrCat("--cluster=", kCluster),
                                      absl::StrCat("--num_servers=", servers_),
                                      "--lease_ttl=2",
                                      "--register_timeout=60"};
    if (standbys_ > 0) flags.push_back("--accept_standbys");
    flags.insert(flags.end(), extra_.begin(), extra_.end());
    return flags;
  }

  absl::StatusOr<v1::ShardConfig> Config(uint32_t shard) const {
    PS_ASSIGN_OR_RETURN(KeyValue kv, etcd_client_->Get(etcd_keys::ShardKey(shard)));
    return ParseShardConfig(shard, kv.value);
  }
  int Replicas(uint32_t shard) const {
    absl::StatusOr<v1::ShardConfig> config = Config(shard);
    return config.ok() ? config->replicas_size() : -1;
  }

  absl::StatusOr<std::string> AddressAt(const std::string& key) const {
    PS_ASSIGN_OR_RETURN(KeyValue kv, etcd_client_->Get(key));
    PS_ASSIGN_OR_RETURN(etcd_keys::ServerEntry entry, etcd_keys::ParseServerValue(kv.value));
    return entry.address;
  }

  std::string binary_;
  int servers_;
  int standbys_;
  std::unique_ptr<testing::EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> etcd_client_;
  std::map<std::string, std::unique_ptr<ChildProcess>> processes_;  // by address
  std::vector<std::string> extra_;
};

constexpr char kSmall[] = "small";

// The latency R=1 measured, by kind ("push", "pull"): (p50, p99) in us.
using Baseline = std::map<std::string, std::pair<double, double>>;

// 4 KiB push and pull of parameter kSmall (initialised), one at a time:
// ops/s, extra p50_us and p99_us; with `baseline` (R > 1), also what
// replication adds to them: added_p50_us, added_p99_us. Without, fills it.
absl::Status Latency4K(Harness& h, const std::string& prefix, Client& client,
                       Baseline* baseline, bool replicated) {
  const std::string name = kSmall;
  const Tensor grad = Filled(4 * kKiB, 0.5f);
  std::vector<Tensor> out(1);
  const std::vector<std::pair<std::string, std::function<absl::Status()>>> kinds = {
      {"push", [&] { return client.SendGrad(name, grad); }},
      {"pull",
       [&] { return client.GetParamsInto(absl::MakeConstSpan(&name, 1), absl::MakeSpan(out)); }},
  };
  const int ops = h.quick() ? 500 : 5000;
  for (const auto& [kind, op] : kinds) {
    Result& r = h.Add("replication", absl::StrCat(prefix, "latency_", kind));
    r.set_payload_bytes(4 * kKiB);
    r.set_servers(1);
    r.set_workers(1);
    std::vector<double> all;
    PS_RETURN_IF_ERROR(h.Measure(&r, "ops/s", [&] { return TimeOps(ops, op, &all); }));
    const double p50 = Percentile(all, 50), p99 = Percentile(all, 99);
    (*r.mutable_extra())["p50_us"] = p50;
    (*r.mutable_extra())["p99_us"] = p99;
    if (!replicated) {
      (*baseline)[kind] = {p50, p99};
    } else if (auto it = baseline->find(kind); it != baseline->end()) {
      (*r.mutable_extra())["added_p50_us"] = p50 - it->second.first;
      (*r.mutable_extra())["added_p99_us"] = p99 - it->second.second;
    }
  }
  return absl::OkStatus();
}

// Steps of 8 x 1M float32 (SendGrads of the whole model) in a thread; the
// time each step completed.
class Trainer {
 public:
  static constexpr int kParams = 8;
  static constexpr uint64_t kParamBytes = 4 * kMiB;  // 1M float32

  explicit Trainer(Client& client) : client_(client) {
    for (int p = 0; p < kParams; ++p) {
      grads_.push_back({absl::StrCat("model", p), Filled(kParamBytes, 0.5f)});
    }
  }
  ~Trainer() { Stop().IgnoreError(); }

  absl::Status Init() {
    for (const NamedTensor& g : grads_) {
      PS_RETURN_IF_ERROR(client_.InitParam(g.name, Filled(kParamBytes, 1.0f), Sgd()));
    }
    PS_RETURN_IF_ERROR(client_.FinishInitParams());
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        absl::Status step = client_.SendGrads(grads_);
        absl::MutexLock lock(&mu_);
        if (!step.ok()) {
          status_ = step;
          return;
        }
        completed_.push_back(NowSeconds());
      }
    });
    return absl::OkStatus();
  }

  // Waits until a step completes after time `after` (NowSeconds) and at
  // least `steps` have completed in all; returns that step's end.
  absl::StatusOr<double> AwaitStep(double after, size_t steps) {
    const absl::Time deadline = absl::Now() + kWait;
    absl::MutexLock lock(&mu_);
    auto done = [&] {
      return !status_.ok() || (completed_.size() >= steps && completed_.back() > after);
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) {
      return absl::DeadlineExceededError("training made no step for 60 s");
    }
    PS_RETURN_IF_ERROR(status_);
    for (double t : completed_) {
      if (t > after) return t;
    }
    return completed_.back();
  }

  size_t steps() {
    absl::MutexLock lock(&mu_);
    return completed_.size();
  }

  absl::Status Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  Client& client_;
  std::vector<NamedTensor> grads_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  std::vector<double> completed_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

absl::Status Failover(Harness& h, const ReplicationGroupOptions& options) {
  constexpr int kServers = 3;
  const int kills = h.quick() ? std::min(options.failover_kills, 5) : options.failover_kills;
  if (kills < 1) return absl::InvalidArgumentError("--failover_kills must be at least 1");
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Cluster> cluster,
                      Cluster::Start(options.pserver_binary, kServers, /*standbys=*/1));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, cluster->Connect());
  Trainer trainer(*client);
  PS_RETURN_IF_ERROR(trainer.Init());
  std::mt19937 random(12345);
  std::vector<double> seconds;
  // kill -9 (evident: the dead primary's port refuses) or SIGSTOP (silent:
  // taken over at lease expiry, --lease_ttl=2 here) of shard k's primary.
  auto fail_over = [&](int k, bool silent, std::vector<double>* out) -> absl::Status {
    // A few steps between failures, at a seeded random count.
    PS_RETURN_IF_ERROR(trainer.AwaitStep(0, trainer.steps() + 2 + random() % 4).status());
    const double failed = NowSeconds();
    std::string paused;
    if (silent) {
      PS_ASSIGN_OR_RETURN(paused, cluster->PausePrimary(k % kServers));
    } else {
      PS_RETURN_IF_ERROR(cluster->KillPrimary(k % kServers));
    }
    PS_ASSIGN_OR_RETURN(double next, trainer.AwaitStep(failed, 1));
    out->push_back(next - failed);
    if (silent) PS_RETURN_IF_ERROR(cluster->KillPaused(paused));
    return cluster->AddStandby(k % kServers);
  };
  for (int k = 0; k < kills; ++k) PS_RETURN_IF_ERROR(fail_over(k, /*silent=*/false, &seconds));
  std::vector<double> silent_seconds;
  const int pauses = std::max(0, h.quick() ? std::min(options.failover_pauses, 1)
                                            : options.failover_pauses);
  for (int k = 0; k < pauses; ++k) {
    PS_RETURN_IF_ERROR(fail_over(kills + k, /*silent=*/true, &silent_seconds));
  }
  PS_RETURN_IF_ERROR(trainer.Stop());
  if (!silent_seconds.empty()) {
    Result& r = h.Add("replication", "failover_silent");
    r.set_payload_bytes(Trainer::kParams * Trainer::kParamBytes);
    r.set_servers(kServers);
    r.set_workers(1);
    r.set_unit("s");
    r.set_repetitions(static_cast<uint32_t>(silent_seconds.size()));
    *r.mutable_value() = Summarize(silent_seconds);
    (*r.mutable_extra())["pauses"] = static_cast<double>(silent_seconds.size());
    (*r.mutable_extra())["lease_ttl_s"] = 2;
  }
  Result& r = h.Add("replication", "failover");
  r.set_payload_bytes(Trainer::kParams * Trainer::kParamBytes);
  r.set_servers(kServers);
  r.set_workers(1);
  r.set_unit("s");
  r.set_repetitions(static_cast<uint32_t>(seconds.size()));
  *r.mutable_value() = Summarize(seconds);
  (*r.mutable_extra())["kills"] = static_cast<double>(seconds.size());
  (*r.mutable_extra())["p50_s"] = Percentile(seconds, 50);
  (*r.mutable_extra())["p99_s"] = Percentile(seconds, 99);
  (*r.mutable_extra())["max_s"] = Summarize(seconds).max();
  return absl::OkStatus();
}

// CPU seconds (user + system) process `pid` used so far; -1 if unknown.
double CpuSeconds(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(stat, line);
  const size_t close = line.rfind(')');  // the name may hold spaces
  if (close == std::string::npos) return -1;
  std::vector<std::string> fields = absl::StrSplit(line.substr(close + 2), ' ');
  // After the name: state is field 3 of stat(5), utime 14, stime 15.
  double utime = 0, stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtod(fields[11], &utime) ||
      !absl::SimpleAtod(fields[12], &stime)) {
    return -1;
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// A standby briefly away: 1 server, 1 standby, the 8 x 1M float32 model
// pushed whole every step. The standby is paused (SIGSTOP) until its
// primary drops it (the 10 s replicate timeout), training makes `away`
// more steps, then it is resumed and rejoins: with --catch_up_bytes off it
// copies the shard; on, it is sent the writes since its own LSN. Reported:
// seconds from SIGCONT until /shards/0 lists it again, the writes delivered
// to it (the primary's log: "caught up on <n> writes": requests of the
// client's pushes, each a part of a step), the steps made from the pause to
// the listing and during the join (each 32 MiB of writes: a catch-up sends
// all steps since the pause, a copy sends the 32 MiB state and the steps
// made during the join), and the CPU seconds both processes spent
// meanwhile.
absl::Status Rejoin(Harness& h, const ReplicationGroupOptions& options) {
  constexpr uint64_t kModelBytes = Trainer::kParams * Trainer::kParamBytes;
  for (const uint64_t catch_up : {uint64_t{0}, uint64_t{256} * kMiB}) {
    for (const int away : {1, 4}) {
      PS_ASSIGN_OR_RETURN(
          std::unique_ptr<Cluster> cluster,
          Cluster::Start(options.pserver_binary, 1, /*standbys=*/1,
                         {absl::StrCat("--catch_up_bytes=", catch_up),
                          absl::StrCat("--max_joining_bytes=", 1024 * kMiB)}));
      PS_ASSIGN_OR_RETURN(std::string primary_address, cluster->PrimaryAddress(0));
      PS_ASSIGN_OR_RETURN(std::string standby_address, cluster->BackupAddress(0));
      ChildProcess* primary = cluster->At(primary_address);
      ChildProcess* standby = cluster->At(standby_address);
      if (primary == nullptr || standby == nullptr) return absl::InternalError("no processes");
      PS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, cluster->Connect());
      Trainer trainer(*client);
      PS_RETURN_IF_ERROR(trainer.Init());
      PS_RETURN_IF_ERROR(trainer.AwaitStep(0, 3).status());
      const size_t steps_paused = trainer.steps();
      if (kill(standby->pid(), SIGSTOP) != 0) return absl::InternalError("SIGSTOP failed");
      PS_RETURN_IF_ERROR(cluster->AwaitBackups(0, 0));
      PS_RETURN_IF_ERROR(trainer.AwaitStep(NowSeconds(), trainer.steps() + away).status());
      const double cpu_before = CpuSeconds(primary->pid()) + CpuSeconds(standby->pid());
      const size_t steps_resumed = trainer.steps();
      const double resumed = NowSeconds();
      if (kill(standby->pid(), SIGCONT) != 0) return absl::InternalError("SIGCONT failed");
      PS_RETURN_IF_ERROR(cluster->AwaitBackups(0, 1));
      const double joined = NowSeconds();
      const double cpu = CpuSeconds(primary->pid()) + CpuSeconds(standby->pid()) - cpu_before;
      const size_t steps_listed = trainer.steps();
      PS_RETURN_IF_ERROR(trainer.Stop());
      // The primary's line, read from its stderr (WaitForLine reads both
      // pipes; no stdout line matches).
      const std::string caught_up = "caught up on ";
      primary->WaitForLine("\x01", absl::Now() + absl::Milliseconds(500)).IgnoreError();
      const std::string& err = primary->err();
      const size_t at = err.rfind(caught_up);
      double writes = -1;
      if (at != std::string::npos) {
        const size_t end = err.find(' ', at + caught_up.size());
        absl::SimpleAtod(err.substr(at + caught_up.size(), end - at - caught_up.size()), &writes);
      }
      const bool copied = err.find("but is sent a full copy") != std::string::npos ||
                          catch_up == 0;
      Result& r = h.Add("rejoin", absl::StrCat("rejoin_", catch_up == 0 ? "copy" : "catch_up",
                                                     "_away", away));
      r.set_payload_bytes(kModelBytes);
      r.set_servers(1);
      r.set_workers(1);
      r.set_unit("s");
      r.set_repetitions(1);
      *r.mutable_value() = Summarize({joined - resumed});
      (*r.mutable_extra())["catch_up_bytes"] = static_cast<double>(catch_up);
      (*r.mutable_extra())["writes_delivered"] = writes;
      (*r.mutable_extra())["copied"] = copied ? 1 : 0;
      (*r.mutable_extra())["steps_away"] = static_cast<double>(steps_listed - steps_paused);
      (*r.mutable_extra())["steps_during_join"] = static_cast<double>(steps_listed - steps_resumed);
      (*r.mutable_extra())["cpu_s"] = cpu;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReplicationGroup(Harness& h, const ReplicationGroupOptions& options,
                              const DenseRunner& dense) {
  std::vector<uint64_t> sizes = options.sizes;
  if (sizes.empty()) sizes = {kMiB, 16 * kMiB};
  if (options.sizes.empty() && !h.quick()) sizes.push_back(64 * kMiB);
  const std::vector<int> all_replicas =
      options.replicas.empty() ? std::vector<int>{1, 2, 3} : options.replicas;
  const std::vector<int> all_servers =
      options.servers.empty() ? std::vector<int>{1, 3} : options.servers;
  Baseline baseline;  // R=1's 4 KiB latency
  for (int replicas : all_replicas) {
    if (replicas < 1 || replicas > 3) {
      return absl::InvalidArgumentError("--replication_replicas: each must be 1, 2 or 3");
    }
    const std::string prefix = absl::StrCat("r", replicas, "_");
    for (int servers : all_servers) {
      if (servers < 1) return absl::InvalidArgumentError("--replication_servers: each >= 1");
      PS_ASSIGN_OR_RETURN(std::unique_ptr<Cluster> cluster,
                          Cluster::Start(options.pserver_binary, servers, replicas - 1,
                                         options.server_flags));
      std::vector<std::unique_ptr<Client>> clients;
      PS_ASSIGN_OR_RETURN(clients.emplace_back(), cluster->Connect());
      // Initialised before the dense run's FinishInitParams, measured after.
      if (servers == 1) {
        PS_RETURN_IF_ERROR(clients[0]->InitParam(kSmall, Filled(4 * kKiB, 1.0f), Sgd()));
      }
      PS_RETURN_IF_ERROR(dense(prefix, clients, servers, sizes, cluster->pids()));
      if (servers == 1) {
        PS_RETURN_IF_ERROR(Latency4K(h, prefix, *clients[0], &baseline, replicas > 1));
      }
    }
  }
  if (options.failover_kills != 0) PS_RETURN_IF_ERROR(Failover(h, options));
  h.PrintGroup("replication");
  return absl::OkStatus();
}

absl::Status RejoinGroup(Harness& h, const ReplicationGroupOptions& options) {
  PS_RETURN_IF_ERROR(Rejoin(h, options));
  h.PrintGroup("rejoin");
  return absl::OkStatus();
}

}  // namespace pserver::bench
