// End-to-end benchmark of pserver on this machine, with the ceilings it is
// judged against measured in the same run.
//
//   bazel run -c opt //bench:e2e -- [--quick] [--json=FILE] [--only=dense,latency]
//   bazel run -c opt //bench:e2e -- --only=sparse --json=/tmp/sparse.json
//   bazel run -c opt //bench:e2e -- --only=bindings      # Python and Go next to C++
//
// Servers run as separate `pserver` processes on 127.0.0.1 (the embedded
// group, and the sparse group's embedded_* results, run them in-process);
// workers are threads, each with its own client. Every figure is the
// min/median/max over the repetitions, after warm-up.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/barrier.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bindings_driver.h"
#include "ceilings.h"
#include "compression_group.h"
#include "elastic_group.h"
#include "cc/client/client.h"
#include "cc/client/table.h"
#include "cc/core/checkpoint.h"
#include "cc/core/optimizer.h"
#include "cc/core/parameter_store.h"
#include "cc/core/status_macros.h"
#include "cc/rpc/allocator.h"
#include "cc/rpc/buffer_pool.h"
#include "cc/server/in_process_transport.h"
#include "cc/server/local_cluster.h"
#include "cc/testing/child_process.h"
#include "cc/testing/run_program.h"
#include "harness.h"
#include "params.h"
#include "hosts_group.h"
#include "replication_group.h"
#include "sparse_group.h"
#include "tls_group.h"

ABSL_FLAG(bool, quick, false, "A short run (under 2 minutes): fewer sizes and repetitions.");
ABSL_FLAG(int, repetitions, 0,
          "Repetitions of each measurement after its warm-up (0: 5, or 3 with --quick); more "
          "show how often a repetition falls off the median (the dense and latency groups "
          "print those with their page faults, context switches and run-queue waits).");
ABSL_FLAG(uint64_t, client_buffer_pool_bytes, uint64_t{256} << 20,
          "Free large reply buffers the clients of this process keep for reuse (as pserver's "
          "--bulk_buffer_pool_bytes; 0: none, every large reply in a fresh buffer).");
ABSL_FLAG(int, client_read_spin_micros, 50,
          "How long the clients of the dense and latency groups poll for a bulk channel reply "
          "before sleeping (ClientOptions::bulk_read_spin; the servers' is "
          "--server_flags=--bulk_read_spin_micros=N); 0: never.");
ABSL_FLAG(std::string, json, "", "Also write the results as JSON to this file.");
ABSL_FLAG(std::string, only, "",
          "Comma-separated groups to run (ceiling, dense, latency, optimizer, embedded, "
          "checkpoint, memory, scaling, sparse, hosts, compression, tls, replication, elastic, "
          "bindings, rejoin); empty runs all (bindings only "
          "without --quick; rejoin only when named).");
ABSL_FLAG(std::vector<std::string>, sizes_kib, {},
          "Payload sizes in KiB for the ceiling and dense groups (e.g. 1024,4096); default: "
          "4, 64, 1024, 4096, 16384, 65536.");
ABSL_FLAG(std::string, pserver, "", "The pserver binary; default: from the runfiles.");
ABSL_FLAG(std::vector<std::string>, server_flags, {},
          "Extra flags for every pserver process the groups start, comma-separated "
          "(e.g. --server_flags=--device=cuda:0 serves dense shards from a GPU).");
ABSL_FLAG(std::vector<std::string>, dense_kinds, {},
          "Operations of the dense group (push, pull, pushpull); default: all three. One "
          "kind alone suits `perf stat` of a run.");
ABSL_FLAG(int, failover_kills, 20,
          "Kills (kill -9 of a primary) the replication group times failover over (--quick: at "
          "most 5); 0: no failover run.");
ABSL_FLAG(int, failover_pauses, 3,
          "Primaries paused (SIGSTOP: a silent host, taken over at lease expiry) after the "
          "kills, timed the same way (replication group, failover_silent).");
ABSL_FLAG(std::vector<std::string>, replication_replicas, {},
          "Replication factors R of the replication group (e.g. 1,2); default: 1, 2, 3.");
ABSL_FLAG(std::vector<std::string>, replication_servers, {},
          "Server counts of the replication group (e.g. 1); default: 1, 3.");
ABSL_FLAG(std::vector<std::string>, replication_sizes_kib, {},
          "Payload sizes in KiB of the replication group's push/pull (e.g. 1024); default: "
          "1024, 16384 and (without --quick) 65536.");
ABSL_FLAG(std::vector<std::string>, dense_configs, {},
          "Servers x workers of the dense group (e.g. 1x1,2x2); default: 1x1, 1x2, 2x1, 2x2 "
          "(1x1 and 2x2 with --quick).");

namespace pserver::bench {
namespace {

constexpr double kGB = 1e9;
constexpr uint64_t kKiB = 1 << 10;
constexpr uint64_t kMiB = 1 << 20;
constexpr int kIperfBufferBytes = 4 << 20;  // socket buffers of the iperf3-style ceiling

std::string g_argv0;

// ---- servers and workers -------------------------------------------------------------

// N pserver processes on 127.0.0.1; killed (by PID) when this goes away.
struct ServerProcesses {
  std::vector<std::unique_ptr<ChildProcess>> children;
  std::vector<std::string> addresses;
  ~ServerProcesses() {
    for (auto& child : children) {
      kill(child->pid(), SIGTERM);
      (void)child->WaitForExit(absl::Now() + absl::Seconds(10));
    }
  }
};

std::string PserverBinary() {
  const std::string binary = absl::GetFlag(FLAGS_pserver);
  return binary.empty() ? RunfilesPath("cc/server/pserver", g_argv0) : binary;
}

absl::StatusOr<std::unique_ptr<ServerProcesses>> StartServers(int n) {
  const std::string binary = PserverBinary();
  auto servers = std::make_unique<ServerProcesses>();
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> args = {"--port=0", absl::StrCat("--index=", i)};
    for (const std::string& flag : absl::GetFlag(FLAGS_server_flags)) args.push_back(flag);
    PS_ASSIGN_OR_RETURN(auto child, ChildProcess::Spawn(binary, args));
    PS_ASSIGN_OR_RETURN(std::string address,
                        WaitForPserverAddress(*child, i, absl::Now() + absl::Seconds(20)));
    servers->addresses.push_back(address);
    servers->children.push_back(std::move(child));
  }
  return servers;
}

// Runs `op(worker)` `ops` times on each of `workers` threads, started
// together; returns the wall time of the slowest.
absl::StatusOr<double> RunWorkers(int workers, int ops,
                                  const std::function<absl::Status(int)>& op) {
  std::vector<absl::Status> results(workers);
  absl::Barrier* start = new absl::Barrier(workers + 1);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      if (start->Block()) delete start;
      for (int i = 0; i < ops && results[w].ok(); ++i) results[w] = op(w);
    });
  }
  const double begin = NowSeconds();
  if (start->Block()) delete start;
  for (auto& t : threads) t.join();
  const double seconds = NowSeconds() - begin;
  for (const auto& r : results) PS_RETURN_IF_ERROR(r);
  return seconds;
}

// Operations per repetition for a payload: enough bytes to time well.
int OpsFor(const Harness& h, uint64_t bytes) {
  const uint64_t target = h.quick() ? 48 * kMiB : 256 * kMiB;
  const int cap = h.quick() ? 400 : 2000;
  return static_cast<int>(std::clamp<uint64_t>(target / bytes, 2, cap));
}

// ---- groups ----------------------------------------------------------------------------

absl::Status Ceilings(Harness& h, const std::vector<uint64_t>& sizes) {
  {
    Result& r = h.Add("ceiling", "memcpy");
    r.set_payload_bytes(64 * kMiB);
    PS_RETURN_IF_ERROR(h.Measure(&r, "GB/s", [&]() -> absl::StatusOr<double> {
      return MemcpyBandwidth(64 * kMiB, h.quick() ? 4 : 16) / kGB;
    }));
  }
  {
    Result& r = h.Add("ceiling", "socket");
    r.set_payload_bytes(kMiB);
    const uint64_t total = h.quick() ? 512 * kMiB : 2048 * kMiB;
    PS_RETURN_IF_ERROR(h.Measure(&r, "GB/s", [&]() -> absl::StatusOr<double> {
      PS_ASSIGN_OR_RETURN(double bps, SocketStreamBandwidth(total, kMiB));
      return bps / kGB;
    }));
  }
  {
    // As iperf3 measures (the reference): large buffers, 1 MiB
    // writes, several seconds.
    Result& r = h.Add("ceiling", "socket_iperf");
    r.set_payload_bytes(kMiB);
    PS_RETURN_IF_ERROR(h.Measure(&r, "GB/s", [&]() -> absl::StatusOr<double> {
      PS_ASSIGN_OR_RETURN(double bps, SocketStreamBandwidthFor(h.quick() ? 1 : 3, kMiB,
                                                               kIperfBufferBytes));
      return bps / kGB;
    }));
  }
  if (absl::StatusOr<std::string> iperf3 = FindProgram("iperf3"); iperf3.ok()) {
    Result& r = h.Add("ceiling", "iperf3");
    r.set_payload_bytes(kMiB);
    PS_RETURN_IF_ERROR(h.Measure(&r, "GB/s", [&]() -> absl::StatusOr<double> {
      PS_ASSIGN_OR_RETURN(double bps, Iperf3Bandwidth(h.quick() ? 1 : 3));
      return bps / kGB;
    }));
  } else {
    std::printf("ceiling iperf3: skipped (%s)\n", iperf3.status().ToString().c_str());
  }
  // Every "% of socket" in the run is judged against the highest of them.
  h.SetCeilingAlternatives("socket", {"socket_iperf", "iperf3"});
  PS_ASSIGN_OR_RETURN(auto echo, GrpcEcho::Start());
  for (uint64_t bytes : sizes) {
    Result& r = h.Add("ceiling", "grpc_echo");
    r.set_payload_bytes(bytes);
    const int calls = std::max(2, OpsFor(h, bytes) / 2);
    PS_RETURN_IF_ERROR(h.Measure(&r, "GB/s", [&]() -> absl::StatusOr<double> {
      PS_ASSIGN_OR_RETURN(double bps, echo->Bandwidth(bytes, calls));
      return bps / kGB;
    }));
  }
  h.PrintGroup("ceiling");
  return absl::OkStatus();
}

// One client per worker, over gRPC to `addresses` or in-process to `dispatchers`
absl::StatusOr<std::vector<std::unique_ptr<Client>>> MakeClients(
    int workers, const std::vector<std::string>& addresses,
    const std::vector<Dispatcher*>& dispatchers = {}) {
  std::vector<std::unique_ptr<Client>> clients;
  for (int w = 0; w < workers; ++w) {
    ClientOptions options;
    options.servers = addresses;
    options.timeout = absl::Seconds(120);
    options.bulk_read_spin = absl::Microseconds(absl::GetFlag(FLAGS_client_read_spin_micros));
    if (dispatchers.empty()) {
      PS_ASSIGN_OR_RETURN(auto c, Client::Connect(options));
      clients.push_back(std::move(c));
    } else {
      PS_ASSIGN_OR_RETURN(auto c, Client::Create(options, InProcessTransports(dispatchers)));
      clients.push_back(std::move(c));
    }
  }
  return clients;
}

// Push, pull and push+pull of each size, by `workers` workers, each on its
// own parameter. Aggregate payload GB/s, and extra["cpu_s_per_GB"]: CPU
// seconds of this process and `server_pids` per GB moved (push+pull moves
// its payload both ways).
// Results are named `prefix` + the op.
absl::Status DenseOps(Harness& h, const std::string& group, std::vector<std::unique_ptr<Client>>& clients,
                      int servers, const std::vector<uint64_t>& sizes,
                      const std::string& ceiling, const std::vector<pid_t>& server_pids = {},
                      const std::string& prefix = "") {
  const int workers = static_cast<int>(clients.size());
  // Every parameter is initialized before FinishInitParams opens the servers.
  std::vector<std::vector<std::string>> all_names(sizes.size());
  for (size_t s = 0; s < sizes.size(); ++s) {
    for (int w = 0; w < workers; ++w) {
      all_names[s].push_back(absl::StrCat(group, "_", sizes[s], "_w", w));
      PS_RETURN_IF_ERROR(clients[w]->InitParam(all_names[s][w], Filled(sizes[s], 1.0f), Sgd()));
    }
  }
  for (auto& c : clients) PS_RETURN_IF_ERROR(c->FinishInitParams());
  for (size_t s = 0; s < sizes.size(); ++s) {
    const uint64_t bytes = sizes[s];
    const std::vector<std::string>& names = all_names[s];
    std::vector<Tensor> grads, outs(workers);
    for (int w = 0; w < workers; ++w) grads.push_back(Filled(bytes, 0.5f));
    const int ops = OpsFor(h, bytes * workers);
    const std::vector<std::pair<std::string, std::function<absl::Status(int)>>> kinds = {
        {"push", [&](int w) { return clients[w]->SendGrad(names[w], grads[w]); }},
        {"pull",
         [&](int w) {
           return clients[w]->GetParamsInto(absl::MakeConstSpan(&names[w], 1),
                                            absl::MakeSpan(&outs[w], 1));
         }},
        {"pushpull", [&](int w) { return clients[w]->PushPull(names[w], grads[w], &outs[w]); }},
    };
    const std::vector<std::string> only = absl::GetFlag(FLAGS_dense_kinds);
    for (const auto& [kind, op] : kinds) {
      if (!only.empty() && std::find(only.begin(), only.end(), kind) == only.end()) continue;
      Result& r = h.Add(group, prefix + kind);
      r.set_payload_bytes(bytes);
      r.set_servers(servers);
      r.set_workers(workers);
      CpuPerGB cpu(server_pids);
      const RepetitionProbe probe(server_pids);
      const double directions = kind == "pushpull" ? 2 : 1;
      PS_RETURN_IF_ERROR(h.Measure(
          &r, "GB/s",
          [&]() -> absl::StatusOr<double> {
            cpu.Start();
            PS_ASSIGN_OR_RETURN(double seconds, RunWorkers(workers, ops, op));
            cpu.Stop(directions * bytes * workers * ops);
            // push+pull moves the payload both ways; count it once, as ps-lite does.
            return static_cast<double>(bytes) * workers * ops / seconds / kGB;
          },
          &probe));
      (*r.mutable_extra())["cpu_s_per_GB"] = cpu.SecondsPerGB();
      h.Compare(&r, ceiling);
    }
  }
  return absl::OkStatus();
}

absl::Status Dense(Harness& h, const std::vector<uint64_t>& sizes) {
  std::vector<std::pair<int, int>> configs = {{1, 1}, {1, 2}, {2, 1}, {2, 2}};
  if (h.quick()) configs = {{1, 1}, {2, 2}};
  if (const std::vector<std::string> wanted = absl::GetFlag(FLAGS_dense_configs); !wanted.empty()) {
    configs.clear();
    for (const std::string& config : wanted) {
      int servers = 0, workers = 0;
      if (std::sscanf(config.c_str(), "%dx%d", &servers, &workers) != 2 || servers < 1 ||
          workers < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("--dense_configs: '", config, "' is not SERVERSxWORKERS, e.g. 1x1"));
      }
      configs.emplace_back(servers, workers);
    }
  }
  for (const auto& [servers, workers] : configs) {
    PS_ASSIGN_OR_RETURN(auto procs, StartServers(servers));
    PS_ASSIGN_OR_RETURN(auto clients, MakeClients(workers, procs->addresses, {}));
    std::vector<uint64_t> these = sizes;
    if (h.quick() && servers > 1) these = {kMiB, 16 * kMiB};
    std::vector<pid_t> pids;
    for (const auto& child : procs->children) pids.push_back(child->pid());
    PS_RETURN_IF_ERROR(DenseOps(h, "dense", clients, servers, these, "socket", pids));
  }
  h.PrintGroup("dense");
  return absl::OkStatus();
}

absl::Status Latency(Harness& h) {
  PS_ASSIGN_OR_RETURN(auto procs, StartServers(1));
  PS_ASSIGN_OR_RETURN(auto clients, MakeClients(1, procs->addresses, {}));
  Client& client = *clients[0];
  const std::string name = "small";
  const Tensor grad = Filled(4 * kKiB, 0.5f);
  PS_RETURN_IF_ERROR(client.InitParam(name, Filled(4 * kKiB, 1.0f), Sgd()));
  PS_RETURN_IF_ERROR(client.FinishInitParams());
  std::vector<Tensor> out(1);
  const std::vector<std::pair<std::string, std::function<absl::Status()>>> kinds = {
      {"push", [&] { return client.SendGrad(name, grad); }},
      {"pull", [&] { return client.GetParamsInto(absl::MakeConstSpan(&name, 1), absl::MakeSpan(out)); }},
  };
  const int ops = h.quick() ? 2000 : 10000;
  for (const auto& [kind, op] : kinds) {
    Result& r = h.Add("latency", kind);
    r.set_payload_bytes(4 * kKiB);
    r.set_servers(1);
    r.set_workers(1);
    std::vector<double> all;
    const RepetitionProbe probe({procs->children[0]->pid()});
    const double cpu_before = SelfCpuSeconds() + ProcessCpuSeconds(procs->children[0]->pid());
    PS_RETURN_IF_ERROR(h.Measure(&r, "ops/s", [&] { return TimeOps(ops, op, &all); }, &probe));
    const double cpu = SelfCpuSeconds() + ProcessCpuSeconds(procs->children[0]->pid()) - cpu_before;
    std::sort(all.begin(), all.end());
    (*r.mutable_extra())["p50_us"] = all[all.size() / 2];
    (*r.mutable_extra())["p99_us"] = all[all.size() * 99 / 100];
    // Client and server CPU per operation (warm-up included): a spin that
    // waits for replies shows here.
    (*r.mutable_extra())["cpu_us_per_op"] = cpu / all.size() * 1e6;
  }
  h.PrintGroup("latency");
  return absl::OkStatus();
}

absl::Status OptimizerApply(Harness& h) {
  const uint64_t bytes = h.quick() ? 16 * kMiB : 64 * kMiB;
  const size_t n = bytes / sizeof(float);
  // Bytes each element moves: read+written, as memcpy's 2 (read, write).
  const std::vector<std::tuple<std::string, double, std::function<void(v1::ParameterConfig*)>>>
      kinds = {
          {"sgd", 3, [](v1::ParameterConfig* c) { c->mutable_optimizer()->mutable_sgd(); }},
          {"sgd_momentum", 5,
           [](v1::ParameterConfig* c) { c->mutable_optimizer()->mutable_sgd()->set_momentum(0.9); }},
          {"adam", 7, [](v1::ParameterConfig* c) { c->mutable_optimizer()->mutable_adam(); }},
      };
  std::vector<float> params(n, 1.0f), grad(n, 0.001f);
  for (const auto& [name, traffic, configure] : kinds) {
    v1::ParameterConfig config;
    configure(&config);
    PS_ASSIGN_OR_RETURN(auto optimizer, Optimizer::Create(config, v1::FLOAT32, n));
    Result& r = h.Add("optimizer", name);
    r.set_payload_bytes(bytes);
    const int rounds = h.quick() ? 3 : 6;
    PS_RETURN_IF_ERROR(h.Measure(&r, "GB/s", [&]() -> absl::StatusOr<double> {
      const double begin = NowSeconds();
      for (int i = 0; i < rounds; ++i) optimizer->Apply(params.data(), grad.data(), std::nullopt);
      return traffic * bytes * rounds / (NowSeconds() - begin) / kGB;
    }));
    (*r.mutable_extra())["bytes_moved_per_param_byte"] = traffic;
    h.Compare(&r, "memcpy", /*scale=*/2.0);  // memcpy moves 2 bytes per byte copied
  }
  h.PrintGroup("optimizer");
  return absl::OkStatus();
}

absl::Status Embedded(Harness& h, const std::vector<uint64_t>& sizes) {
  PS_ASSIGN_OR_RETURN(auto cluster, LocalCluster::Start(1));
  PS_ASSIGN_OR_RETURN(auto clients, MakeClients(1, cluster->addresses(), cluster->dispatchers()));
  PS_RETURN_IF_ERROR(DenseOps(h, "embedded", clients, 1, sizes, "memcpy"));
  h.PrintGroup("embedded");
  return absl::OkStatus();
}

absl::Status Checkpoint(Harness& h) {
  const uint64_t bytes = h.quick() ? 64 * kMiB : 256 * kMiB;
  ParameterStore store;
  v1::ParameterConfig adam;
  adam.mutable_optimizer()->mutable_adam();
  const uint64_t per_param = 16 * kMiB;
  for (uint64_t i = 0; i < bytes / per_param; ++i) {
    Tensor t = Filled(per_param, 1.0f);
    v1::Parameter p;
    p.set_name(absl::StrCat("p", i));
    p.set_element_type(v1::FLOAT32);
    p.add_shape(t.num_elements());
    p.set_content(std::move(t).ReleaseBytes());
    PS_RETURN_IF_ERROR(store.Init(std::move(p), adam));
  }
  store.FinishInit();
  const uint64_t total = bytes * 3;  // parameters + Adam's two moments
  char dir_template[] = "/tmp/pserver-bench-ckpt-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) return absl::InternalError("mkdtemp failed");
  uint64_t sequence = 0;
  std::string last;
  {
    Result& r = h.Add("checkpoint", "save");
    r.set_payload_bytes(total);
    PS_RETURN_IF_ERROR(h.Measure(&r, "GB/s", [&]() -> absl::StatusOr<double> {
      const double begin = NowSeconds();
      StoreSnapshot snapshot = store.Snapshot();
      PS_ASSIGN_OR_RETURN(CheckpointInfo info, SaveCheckpoint(snapshot, dir, 0, ++sequence, {}));
      last = info.path;
      PS_RETURN_IF_ERROR(PruneCheckpoints(dir, 1).status());
      return total / (NowSeconds() - begin) / kGB;
    }));
  }
  {
    Result& r = h.Add("checkpoint", "load");
    r.set_payload_bytes(total);
    PS_RETURN_IF_ERROR(h.Measure(&r, "GB/s", [&]() -> absl::StatusOr<double> {
      const double begin = NowSeconds();
      PS_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadCheckpoint(last));
      ParameterStore restored;
      PS_RETURN_IF_ERROR(restored.Restore(std::move(loaded.snapshot)));
      return total / (NowSeconds() - begin) / kGB;
    }));
  }
  (void)PruneCheckpoints(dir, 1);
  std::system(absl::StrCat("rm -rf '", dir, "'").c_str());
  h.PrintGroup("checkpoint");
  return absl::OkStatus();
}

uint64_t RssBytes(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

absl::Status Memory(Harness& h) {
  const uint64_t bytes = h.quick() ? 256 * kMiB : 1024 * kMiB;
  const uint64_t per_param = 64 * kMiB;
  PS_ASSIGN_OR_RETURN(auto procs, StartServers(1));
  PS_ASSIGN_OR_RETURN(auto clients, MakeClients(1, procs->addresses, {}));
  Client& client = *clients[0];
  v1::ParameterConfig adam;
  adam.mutable_optimizer()->mutable_adam();
  std::vector<std::string> names;
  for (uint64_t i = 0; i < bytes / per_param; ++i) {
    names.push_back(absl::StrCat("m", i));
    PS_RETURN_IF_ERROR(client.InitParam(names.back(), Filled(per_param, 1.0f), adam));
  }
  PS_RETURN_IF_ERROR(client.FinishInitParams());
  const pid_t pid = procs->children[0]->pid();
  const uint64_t expected = bytes * 3;  // parameters + Adam's m and v
  const Tensor grad = Filled(per_param, 0.01f);
  std::vector<Tensor> out(1);
  Result& r = h.Add("memory", "server_rss");
  r.set_payload_bytes(bytes);
  r.set_servers(1);
  r.set_workers(1);
  PS_RETURN_IF_ERROR(h.Measure(&r, "x", [&]() -> absl::StatusOr<double> {
    for (const std::string& name : names) {  // traffic through the data path first
      PS_RETURN_IF_ERROR(client.SendGrad(name, grad));
      PS_RETURN_IF_ERROR(client.GetParamsInto(absl::MakeConstSpan(&name, 1), absl::MakeSpan(out)));
    }
    return static_cast<double>(RssBytes(pid)) / expected;
  }));
  (*r.mutable_extra())["rss_mib"] = static_cast<double>(RssBytes(pid)) / kMiB;
  (*r.mutable_extra())["params_plus_state_mib"] = static_cast<double>(expected) / kMiB;
  h.PrintGroup("memory");
  return absl::OkStatus();
}

absl::Status Scaling(Harness& h) {
  const uint64_t bytes = h.quick() ? 4 * kMiB : 16 * kMiB;
  constexpr int kMaxWorkers = 2;
  for (int servers : {1, 2, 4}) {
    PS_ASSIGN_OR_RETURN(auto procs, StartServers(servers));
    PS_ASSIGN_OR_RETURN(auto clients, MakeClients(kMaxWorkers, procs->addresses, {}));
    std::vector<std::string> names;
    std::vector<Tensor> grads, outs(kMaxWorkers);
    for (int w = 0; w < kMaxWorkers; ++w) {
      names.push_back(absl::StrCat("scale_w", w));
      grads.push_back(Filled(bytes, 0.5f));
      PS_RETURN_IF_ERROR(clients[w]->InitParam(names[w], Filled(bytes, 1.0f), Sgd()));
    }
    for (auto& c : clients) PS_RETURN_IF_ERROR(c->FinishInitParams());
    for (int workers = 1; workers <= kMaxWorkers; ++workers) {
      Result& r = h.Add("scaling", "pushpull");
      r.set_payload_bytes(bytes);
      r.set_servers(servers);
      r.set_workers(workers);
      const int ops = OpsFor(h, bytes * workers);
      PS_RETURN_IF_ERROR(h.Measure(&r, "GB/s", [&]() -> absl::StatusOr<double> {
        PS_ASSIGN_OR_RETURN(double seconds, RunWorkers(workers, ops, [&](int w) {
          return clients[w]->PushPull(names[w], grads[w], &outs[w]);
        }));
        return static_cast<double>(bytes) * workers * ops / seconds / kGB;
      }));
      h.Compare(&r, "socket");
    }
  }
  h.PrintGroup("scaling");
  return absl::OkStatus();
}

// ---- sparse tables ---------------------------------------------------------------------

// The sparse group (bench/sparse_group.cc) on pserver processes over gRPC and
// on the embedded in-process cluster.
absl::Status Sparse(Harness& h) {
  SparseEnv env;
  env.start = [](int servers, int workers, bool embedded) -> absl::StatusOr<SparseCluster> {
    SparseCluster cluster;
    if (embedded) {
      PS_ASSIGN_OR_RETURN(std::shared_ptr<LocalCluster> local, LocalCluster::Start(servers));
      PS_ASSIGN_OR_RETURN(cluster.clients,
                          MakeClients(workers, local->addresses(), local->dispatchers()));
      cluster.servers = std::move(local);
    } else {
      PS_ASSIGN_OR_RETURN(std::shared_ptr<ServerProcesses> procs, StartServers(servers));
      PS_ASSIGN_OR_RETURN(cluster.clients, MakeClients(workers, procs->addresses, {}));
      for (const auto& child : procs->children) cluster.server_pids.push_back(child->pid());
      cluster.servers = std::move(procs);
    }
    return cluster;
  };
  env.run_workers = RunWorkers;
  return SparseGroup(h, env);
}

// ---- bindings ---------------------------------------------------------------------

// Each binding must reach this share of the C++ client's throughput.
constexpr double kBindingsCeiling = 0.9;

// Python and Go push, pull and push+pull next to the C++ client, against the
// same pserver process, one op after the other (1 server x 1 worker). The
// C++ results are the ceilings: each binding's result carries its ratio to
// the C++ median and extra["pass"] (1 when >= kBindingsCeiling).
absl::Status Bindings(Harness& h) {
  std::vector<uint64_t> sizes = {kMiB, 16 * kMiB, 64 * kMiB};
  if (h.quick()) sizes = {kMiB, 16 * kMiB};
  std::vector<std::string> drivers = {"cxx", "python", "go"};
  PS_ASSIGN_OR_RETURN(auto procs, StartServers(1));
  PS_ASSIGN_OR_RETURN(auto clients, MakeClients(1, procs->addresses, {}));
  Client& client = *clients[0];
  auto name_of = [](const std::string& driver, uint64_t bytes) {
    return absl::StrCat("bind_", driver, "_", bytes);
  };
  // Every parameter exists before the drivers start.
  for (const std::string& driver : drivers) {
    for (uint64_t bytes : sizes) {
      PS_RETURN_IF_ERROR(client.InitParam(name_of(driver, bytes), Filled(bytes, 1.0f), Sgd()));
    }
  }
  PS_RETURN_IF_ERROR(client.FinishInitParams());
  DriverResults all;  // by (driver_op, bytes)
  // The C++ client, in this process, before the drivers ("cxx") and again
  // after them ("cxxafter": whether what the servers went through meanwhile
  // changed their speed).
  auto measure_cxx = [&](const std::string& driver) -> absl::Status {
  for (uint64_t bytes : sizes) {
    const std::string name = name_of("cxx", bytes);
    const Tensor grad = Filled(bytes, 0.5f);
    std::vector<Tensor> out(1);
    const std::vector<std::pair<std::string, std::function<absl::Status()>>> kinds = {
        {"push", [&] { return client.SendGrad(name, grad); }},
        {"pull",
         [&] { return client.GetParamsInto(absl::MakeConstSpan(&name, 1), absl::MakeSpan(out)); }},
        {"pushpull", [&] { return client.PushPull(name, grad, &out[0]); }},
    };
    const int ops = OpsFor(h, bytes);
    for (const auto& [kind, op] : kinds) {
      std::vector<double>& values = all[{absl::StrCat(driver, "_", kind), bytes}];
      for (int i = 0; i < h.options().warmup + h.options().repetitions; ++i) {
        const double begin = NowSeconds();
        for (int j = 0; j < ops; ++j) PS_RETURN_IF_ERROR(op());
        values.push_back(static_cast<double>(bytes) * ops / (NowSeconds() - begin) / kGB);
      }
    }
  }
  return absl::OkStatus();
  };
  PS_RETURN_IF_ERROR(measure_cxx("cxx"));
  for (const char* driver : {"python", "go"}) {
    std::vector<std::string> params;
    for (uint64_t bytes : sizes) {
      params.push_back(absl::StrCat(name_of(driver, bytes), ":", bytes, ":", OpsFor(h, bytes)));
    }
    PS_ASSIGN_OR_RETURN(
        DriverResults results,
        RunDriver(RunfilesPath(absl::StrCat("bench/bindings_", driver, ".sh"), g_argv0),
                  {absl::StrCat("--servers=", absl::StrJoin(procs->addresses, ",")),
                   absl::StrCat("--params=", absl::StrJoin(params, ",")),
                   absl::StrCat("--warmup=", h.options().warmup),
                   absl::StrCat("--repetitions=", h.options().repetitions)},
                  absl::Now() + absl::Minutes(20)));
    for (auto& [key, values] : results) {
      all[{absl::StrCat(driver, "_", key.first), key.second}] = std::move(values);
    }
  }
  PS_RETURN_IF_ERROR(measure_cxx("cxxafter"));
  drivers.push_back("cxxafter");
  for (uint64_t bytes : sizes) {
    for (const char* kind : {"push", "pull", "pushpull"}) {
      double cxx_median = 0;
      for (const std::string& driver : drivers) {
        const std::string name = absl::StrCat(driver, "_", kind);
        const std::vector<double>& values = all[{name, bytes}];
        Result& r = h.Add("bindings", name);
        r.set_payload_bytes(bytes);
        r.set_servers(1);
        r.set_workers(1);
        size_t next = 0;
        PS_RETURN_IF_ERROR(h.Measure(&r, "GB/s", [&]() -> absl::StatusOr<double> {
          if (next >= values.size()) {
            return absl::InternalError(absl::StrCat("bindings: ", name, " at ", bytes,
                                                    " bytes has ", values.size(), " rounds"));
          }
          return values[next++];
        }));
        if (driver == "cxx") {
          cxx_median = r.value().median();
          continue;
        }
        r.set_ceiling(absl::StrCat("cxx_", kind));
        r.set_ratio(cxx_median > 0 ? r.value().median() / cxx_median : 0);
        (*r.mutable_extra())["pass"] = r.ratio() >= kBindingsCeiling ? 1 : 0;
        std::printf("bindings %-16s %8s: %5.1f%% of C++ (%s, needs %.0f%%)\n", name.c_str(),
                    FormatBytes(bytes).c_str(), 100 * r.ratio(),
                    r.ratio() >= kBindingsCeiling ? "PASS" : "FAIL", 100 * kBindingsCeiling);
      }
    }
  }
  h.PrintGroup("bindings");
  return absl::OkStatus();
}

absl::Status Run(int argc, char** argv) {
  HarnessOptions options;
  options.quick = absl::GetFlag(FLAGS_quick);
  options.warmup = 1;
  options.repetitions = options.quick ? 3 : 5;
  if (const int n = absl::GetFlag(FLAGS_repetitions); n != 0) {
    if (n < 1 || n > 1000) {
      return absl::InvalidArgumentError(
          absl::StrCat("--repetitions: ", n, " is not between 1 and 1000"));
    }
    options.repetitions = n;
  }
  std::vector<std::string> args(argv, argv + argc);
  const std::string only = absl::GetFlag(FLAGS_only);
  options.command = absl::StrCat("bazel run -c opt //bench:e2e --",
                                 options.quick ? " --quick" : "",
                                 only.empty() ? "" : absl::StrCat(" --only=", only));
  Harness h(options);

  const std::vector<std::string> groups = absl::StrSplit(only, ',', absl::SkipEmpty());
  auto wanted = [&](const std::string& g) {
    return groups.empty() || std::find(groups.begin(), groups.end(), g) != groups.end();
  };
  std::vector<uint64_t> sizes = {4 * kKiB, 64 * kKiB, kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB};
  if (const auto kib = absl::GetFlag(FLAGS_sizes_kib); !kib.empty()) {
    sizes.clear();
    for (const std::string& k : kib) {
      uint64_t n = 0;
      if (!absl::SimpleAtoi(k, &n) || n == 0) return absl::InvalidArgumentError("bad --sizes_kib");
      sizes.push_back(n * kKiB);
    }
  }
  const std::vector<uint64_t> big = {kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB};

  const double begin = NowSeconds();
  // Ceilings first: the other groups are compared with them.
  if (wanted("ceiling") || groups.empty() || wanted("dense") || wanted("optimizer") ||
      wanted("embedded") || wanted("scaling")) {
    PS_RETURN_IF_ERROR(Ceilings(h, sizes));
  }
  if (wanted("dense")) PS_RETURN_IF_ERROR(Dense(h, sizes));
  if (wanted("latency")) PS_RETURN_IF_ERROR(Latency(h));
  if (wanted("optimizer")) PS_RETURN_IF_ERROR(OptimizerApply(h));
  if (wanted("embedded")) PS_RETURN_IF_ERROR(Embedded(h, big));
  if (wanted("checkpoint")) PS_RETURN_IF_ERROR(Checkpoint(h));
  if (wanted("memory")) PS_RETURN_IF_ERROR(Memory(h));
  if (wanted("scaling")) PS_RETURN_IF_ERROR(Scaling(h));
  if (wanted("sparse")) PS_RETURN_IF_ERROR(Sparse(h));
  if (wanted("hosts")) PS_RETURN_IF_ERROR(Hosts(h, PserverBinary(), g_argv0));
  if (wanted("compression")) PS_RETURN_IF_ERROR(CompressionGroup(h, PserverBinary(), g_argv0));
  if (wanted("tls")) PS_RETURN_IF_ERROR(TlsGroup(h, PserverBinary(), g_argv0));
  if (wanted("replication")) {
    ReplicationGroupOptions replication;
    replication.pserver_binary = PserverBinary();
    replication.failover_kills = absl::GetFlag(FLAGS_failover_kills);
    replication.failover_pauses = absl::GetFlag(FLAGS_failover_pauses);
    replication.server_flags = absl::GetFlag(FLAGS_server_flags);
    auto numbers = [](const std::vector<std::string>& texts, const char* flag,
                      auto* out) -> absl::Status {
      for (const std::string& text : texts) {
        int64_t value = 0;
        if (!absl::SimpleAtoi(text, &value) || value < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("--", flag, ": '", text, "' is not a non-negative number"));
        }
        out->push_back(static_cast<typename std::remove_pointer_t<decltype(out)>::value_type>(
            value));
      }
      return absl::OkStatus();
    };
    PS_RETURN_IF_ERROR(numbers(absl::GetFlag(FLAGS_replication_replicas),
                               "replication_replicas", &replication.replicas));
    PS_RETURN_IF_ERROR(numbers(absl::GetFlag(FLAGS_replication_servers), "replication_servers",
                               &replication.servers));
    std::vector<uint64_t> kib;
    PS_RETURN_IF_ERROR(numbers(absl::GetFlag(FLAGS_replication_sizes_kib),
                               "replication_sizes_kib", &kib));
    for (uint64_t k : kib) replication.sizes.push_back(k * kKiB);
    PS_RETURN_IF_ERROR(ReplicationGroup(
        h, replication,
        [&](const std::string& prefix, std::vector<std::unique_ptr<Client>>& clients, int servers,
            const std::vector<uint64_t>& these, const std::vector<pid_t>& pids) {
          return DenseOps(h, "replication", clients, servers, these, "socket", pids, prefix);
        }));
  }
  if (std::find(groups.begin(), groups.end(), "rejoin") != groups.end()) {  // only when named
    ReplicationGroupOptions replication;
    replication.pserver_binary = PserverBinary();
    PS_RETURN_IF_ERROR(RejoinGroup(h, replication));
  }
  if (wanted("elastic")) PS_RETURN_IF_ERROR(ElasticGroup(h, PserverBinary()));
  // Builds the Go driver on first use: only when asked for in a quick run.
  if (wanted("bindings") && (!h.quick() || !groups.empty())) PS_RETURN_IF_ERROR(Bindings(h));
  std::printf("\nbenchmark finished in %.0f s\n", NowSeconds() - begin);

  const std::string json = absl::GetFlag(FLAGS_json);
  if (!json.empty()) {
    PS_RETURN_IF_ERROR(h.WriteJson(json));
    std::printf("results written to %s\n", json.c_str());
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace pserver::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  pserver::KeepFreedMemoryForReuse();  // as pserver does; see cc/rpc/allocator.h
  // As pserver does (--bulk_buffer_pool_bytes): the clients' pulled replies in warm buffers.
  pserver::ProcessBufferPool().SetMaxBytes(absl::GetFlag(FLAGS_client_buffer_pool_bytes));
  // As pserver does: no absl::Mutex deadlock graph (see cc/server/main.cc).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  pserver::bench::g_argv0 = argv[0];
  absl::Status status = pserver::bench::Run(argc, argv);
  if (!status.ok()) {
    std::fprintf(stderr, "e2e: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
