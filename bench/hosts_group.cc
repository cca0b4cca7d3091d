#include "hosts_group.h"

#include <signal.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "bindings_driver.h"
#include "cc/core/status_macros.h"
#include "cc/testing/child_process.h"
#include "cc/testing/netns.h"

ABSL_FLAG(int, hosts_rate_mbit, 1000, "hosts group: tc tbf rate of every host's link, Mbit/s.");
ABSL_FLAG(int, hosts_workers_per_server, 2,
          "hosts group: workers (hosts) per server; 2 keep every server's link busy.");
ABSL_FLAG(uint64_t, hosts_bytes, 4 << 20, "hosts group: bytes of each worker's parameter.");
ABSL_FLAG(int, hosts_unsent_bytes, -1,
          "hosts group: the workers' ClientOptions::bulk_unsent_bytes (0: the kernel's "
          "default); -1: the option's default.");

namespace pserver::bench {
namespace {

constexpr int kMaxServers = 4;
constexpr int kMaxWorkersPerServer = 4;

// The servers of one configuration, on hosts [0, n); stopped (SIGTERM, then
// the cluster's SIGKILL) when this goes away.
struct HostServers {
  std::vector<ChildProcess*> children;
  std::vector<std::string> addresses;
  ~HostServers() {
    for (ChildProcess* child : children) {
      kill(child->pid(), SIGTERM);
      (void)child->WaitForExit(absl::Now() + absl::Seconds(10));
    }
  }
};

absl::StatusOr<std::unique_ptr<HostServers>> StartHostServers(NetnsCluster& cluster, int n,
                                                              const std::string& binary) {
  auto servers = std::make_unique<HostServers>();
  for (int i = 0; i < n; ++i) {
    PS_ASSIGN_OR_RETURN(ChildProcess * child,
                        cluster.Spawn(i, binary,
                                      {absl::StrCat("--host=", cluster.address(i)), "--port=0",
                                       absl::StrCat("--index=", i)}));
    servers->children.push_back(child);
    PS_ASSIGN_OR_RETURN(std::string address,
                        WaitForPserverAddress(*child, i, absl::Now() + absl::Seconds(20)));
    servers->addresses.push_back(address);
  }
  return servers;
}

// Busy and total jiffies of all cores so far (the first line of /proc/stat).
std::pair<double, double> MachineJiffies() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  stat >> cpu;
  double busy = 0, total = 0, value = 0;
  for (int field = 0; field < 8 && stat >> value; ++field) {
    total += value;
    if (field != 3 && field != 4) busy += value;  // idle and iowait are not busy
  }
  return {busy, total};
}

// How busy the links were over the measured rounds: bytes each way (as the
// tbf qdiscs counted them, headers included) per second, as a share of the
// rate; `server_min` is the least busy direction of any server's link.
struct LinkUse {
  double server_in = 0, server_out = 0, server_min = 0;  // mean over servers
  double worker_in = 0, worker_out = 0;                  // mean over workers
  uint64_t dropped = 0;                                  // packets, all links
};

struct Rounds {
  std::vector<double> aggregate;  // GB/s of each round, all workers
  double machine_cpu_busy = 0;    // share of all cores busy (by anyone) meanwhile
  LinkUse links;
};

// One reading of every host's link counters, each with when it was taken.
struct Reading {
  std::vector<NetnsCluster::LinkCounters> counters;
  std::vector<double> at;  // steady-clock seconds
};

// Every host's reading runs on a thread of its own (each is two `tc` runs),
// so that on a loaded machine one reading still takes about as long as one
// host's, well inside the measured rounds.
absl::StatusOr<Reading> ReadLinks(const NetnsCluster& cluster, const std::vector<int>& hosts) {
  Reading reading;
  reading.counters.resize(hosts.size());
  reading.at.resize(hosts.size());
  std::vector<absl::Status> statuses(hosts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < hosts.size(); ++i) {
    threads.emplace_back([&, i] {
      const double before = NowSeconds();
      absl::StatusOr<NetnsCluster::LinkCounters> counters = cluster.Counters(hosts[i]);
      reading.at[i] = (before + NowSeconds()) / 2;
      if (counters.ok()) {
        reading.counters[i] = *counters;
      } else {
        statuses[i] = counters.status();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& status : statuses) PS_RETURN_IF_ERROR(status);
  return reading;
}

// hosts[0, servers) are servers, the rest workers.
LinkUse Use(const Reading& first, const Reading& last, int servers, double rate_bits) {
  LinkUse use;
  use.server_min = 1e9;
  const int hosts = static_cast<int>(first.counters.size());
  for (int i = 0; i < hosts; ++i) {
    const double seconds = std::max(1e-3, last.at[i] - first.at[i]);
    const auto share = [&](uint64_t to, uint64_t from) {
      return static_cast<double>(to - from) * 8 / seconds / rate_bits;
    };
    const double in = share(last.counters[i].received_bytes, first.counters[i].received_bytes);
    const double out = share(last.counters[i].sent_bytes, first.counters[i].sent_bytes);
    const bool server = i < servers;
    (server ? use.server_in : use.worker_in) += in / (server ? servers : hosts - servers);
    (server ? use.server_out : use.worker_out) += out / (server ? servers : hosts - servers);
    if (server) use.server_min = std::min({use.server_min, in, out});
    use.dropped += last.counters[i].dropped - first.counters[i].dropped;
  }
  return use;
}

// The rounds of `workers` workers on hosts [first_worker, first_worker +
// workers), started together, against the servers on hosts [0, servers).
absl::StatusOr<Rounds> RunRounds(Harness& h, NetnsCluster& cluster,
                                 const std::string& worker_binary, const HostServers& servers,
                                 int first_worker, int workers, uint64_t bytes, double rate_bits) {
  const std::string server_list = absl::StrCat("--servers=", absl::StrJoin(servers.addresses, ","));
  std::vector<std::string> params;
  for (int w = 0; w < workers; ++w) params.push_back(absl::StrCat("hosts_w", w));
  const std::string bytes_flag = absl::StrCat("--bytes=", bytes);
  const std::string unsent_flag =
      absl::StrCat("--bulk_unsent_bytes=", absl::GetFlag(FLAGS_hosts_unsent_bytes));
  PS_RETURN_IF_ERROR(cluster
                         .Run(first_worker, worker_binary,
                              {server_list, "--init",
                               absl::StrCat("--params=", absl::StrJoin(params, ",")), bytes_flag})
                         .status());
  const int rounds = h.options().warmup + h.options().repetitions;
  const double round_seconds = h.quick() ? 1 : 2;
  const double start_at = NowSeconds() + (h.quick() ? 3 : 5);
  std::vector<ChildProcess*> children;
  for (int w = 0; w < workers; ++w) {
    PS_ASSIGN_OR_RETURN(ChildProcess * child,
                        cluster.Spawn(first_worker + w, worker_binary,
                                      {server_list, absl::StrCat("--params=", params[w]),
                                       bytes_flag, unsent_flag,
                                       absl::StrFormat("--start_at=%.6f", start_at),
                                       absl::StrCat("--round_seconds=", round_seconds),
                                       absl::StrCat("--rounds=", rounds)}));
    children.push_back(child);
  }
  const absl::Time deadline =
      absl::Now() + absl::Seconds(start_at - NowSeconds() + rounds * round_seconds + 60);
  const auto sleep_until = [](double when) {
    absl::SleepFor(absl::Seconds(std::max(0.0, when - NowSeconds())));
  };
  // Links and the machine's load are read over the measured rounds only
  // (not the start-up, not the warm-up rounds), every link's second reading
  // before the last round ends (the workers stop then).
  std::vector<int> hosts;
  for (int i = 0; i < static_cast<int>(servers.addresses.size()); ++i) hosts.push_back(i);
  for (int w = 0; w < workers; ++w) hosts.push_back(first_worker + w);
  const double measured_from = start_at + h.options().warmup * round_seconds;
  const double measured_to = start_at + rounds * round_seconds;
  sleep_until(measured_from);
  const auto [busy_before, total_before] = MachineJiffies();
  const double reading_started = NowSeconds();
  PS_ASSIGN_OR_RETURN(const Reading first, ReadLinks(cluster, hosts));
  const double reading_took = NowSeconds() - reading_started;
  sleep_until(std::max(NowSeconds() + round_seconds / 2, measured_to - 2 * reading_took - 0.1));
  PS_ASSIGN_OR_RETURN(const Reading last, ReadLinks(cluster, hosts));
  const auto [busy_after, total_after] = MachineJiffies();
  Rounds result;
  result.links = Use(first, last, static_cast<int>(servers.addresses.size()), rate_bits);
  if (total_after > total_before) {
    result.machine_cpu_busy = (busy_after - busy_before) / (total_after - total_before);
  }
  result.aggregate.assign(rounds, 0);
  for (int w = 0; w < workers; ++w) {
    PS_ASSIGN_OR_RETURN(DriverResults results,
                        WaitForDriver(*children[w], absl::StrCat("hosts_worker ", w), deadline));
    const std::vector<double>& values = results[{"pushpull", bytes}];
    if (values.size() != static_cast<size_t>(rounds)) {
      return absl::InternalError(
          absl::StrCat("hosts_worker ", w, " reported ", values.size(), " of ", rounds, " rounds"));
    }
    for (int r = 0; r < rounds; ++r) result.aggregate[r] += values[r];
  }
  return result;
}

}  // namespace

absl::Status Hosts(Harness& h, const std::string& pserver_binary, const std::string& argv0) {
  if (absl::Status supported = NetnsSupported(); !supported.ok()) {
    h.Skip("hosts", std::string(supported.message()));
    return absl::OkStatus();
  }
  const int per_server = absl::GetFlag(FLAGS_hosts_workers_per_server);
  const int rate_mbit = absl::GetFlag(FLAGS_hosts_rate_mbit);
  const uint64_t bytes = absl::GetFlag(FLAGS_hosts_bytes);
  if (per_server < 1 || per_server > kMaxWorkersPerServer || rate_mbit < 1 || bytes < 4 ||
      absl::GetFlag(FLAGS_hosts_unsent_bytes) < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--hosts_workers_per_server must be 1 to ", kMaxWorkersPerServer,
        ", --hosts_rate_mbit at least 1, --hosts_bytes at least 4 and --hosts_unsent_bytes at "
        "least -1"));
  }
  NetnsOptions options;
  options.hosts = kMaxServers * (1 + per_server);
  options.rate = absl::StrCat(rate_mbit, "mbit");
  PS_ASSIGN_OR_RETURN(auto cluster, NetnsCluster::Create(options));
  const std::string worker_binary = RunfilesPath("bench/hosts_worker", argv0);
  double one_server = 0;
  for (int servers : {1, 2, 4}) {
    PS_ASSIGN_OR_RETURN(auto procs, StartHostServers(*cluster, servers, pserver_binary));
    const int workers = servers * per_server;
    PS_ASSIGN_OR_RETURN(Rounds rounds, RunRounds(h, *cluster, worker_binary, *procs, kMaxServers,
                                                 workers, bytes, rate_mbit * 1e6));
    Result& r = h.Add("hosts", "pushpull");
    r.set_payload_bytes(bytes);
    r.set_servers(servers);
    r.set_workers(workers);
    size_t next = 0;
    PS_RETURN_IF_ERROR(h.Measure(&r, "GB/s", [&]() -> absl::StatusOr<double> {
      return rounds.aggregate[next++];  // RunRounds made warmup + repetitions rounds
    }));
    if (servers == 1) one_server = r.value().median();
    r.set_ceiling("linear");
    r.set_ratio(one_server > 0 ? r.value().median() / (servers * one_server) : 0);
    auto& extra = *r.mutable_extra();
    extra["link_mbit"] = rate_mbit;
    // How busy the machine's cores were (by anyone) meanwhile: near 1, the
    // cores, not the links, set the pace.
    extra["machine_cpu_busy"] = rounds.machine_cpu_busy;
    // The payload (counted once, as the GB/s are) against what the
    // servers' links can carry each way, and how busy each link was, in
    // wire bytes (headers included) against its rate: "% of line".
    extra["payload_of_line"] = r.value().median() * 8e9 / (servers * rate_mbit * 1e6);
    extra["server_link_in"] = rounds.links.server_in;
    extra["server_link_out"] = rounds.links.server_out;
    extra["server_link_min"] = rounds.links.server_min;
    extra["worker_link_in"] = rounds.links.worker_in;
    extra["worker_link_out"] = rounds.links.worker_out;
    extra["dropped_packets"] = static_cast<double>(rounds.links.dropped);
  }
  h.PrintGroup("hosts");
  return absl::OkStatus();
}

}  // namespace pserver::bench
