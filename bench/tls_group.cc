#include "tls_group.h"

#include <signal.h>

#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "bindings_driver.h"
#include "cc/core/status_macros.h"
#include "cc/testing/child_process.h"
#include "cc/testing/netns.h"
#include "cc/testing/test_certs.h"

ABSL_FLAG(int, tls_rounds, 3,
          "Rounds of the tls group: each round runs every mode once (plain, plain_tcp, "
          "plain_grpc, tls, tls_aead, one after another) with its share of the repetitions, so "
          "that a slow spell of the machine falls on every mode alike (--quick: 1).");

namespace pserver::bench {
namespace {

constexpr uint64_t kKiB = 1 << 10;
constexpr uint64_t kMiB = 1 << 20;
constexpr char kOps[][9] = {"push", "pull", "pushpull"};
// plain: the bulk channel as a client would get it (a Unix socket on
// loopback, TCP between hosts); plain_tcp: the bulk channel over TCP, as
// TLS is (the fair comparison on loopback); plain_grpc: bulk data over gRPC.
constexpr char kModes[][11] = {"plain", "plain_tcp", "plain_grpc", "tls", "tls_aead"};

struct Pki {
  std::unique_ptr<TestCerts> certs;
  CertFiles server, client;
  std::string ca;
};

absl::StatusOr<Pki> MakePki(const std::vector<std::string>& server_ips) {
  Pki pki;
  PS_ASSIGN_OR_RETURN(pki.certs, TestCerts::Create());
  PS_ASSIGN_OR_RETURN(TestCa * ca, pki.certs->AddCa("bench-ca"));
  pki.ca = ca->cert_path();
  CertRequest server;
  server.common_name = "pserver-bench";
  server.ip_addresses = server_ips;
  PS_ASSIGN_OR_RETURN(pki.server, ca->Issue("server", server));
  CertRequest client;
  client.common_name = "tls-link";
  PS_ASSIGN_OR_RETURN(pki.client, ca->Issue("client", client));
  return pki;
}

// `aead`: --tls_bulk_aead=true (the default: the server offers the bulk AEAD
// layer, the client asks for it); false: =false, TLS records on both ends.
std::vector<std::string> TlsFlags(const CertFiles& files, const std::string& ca,
                                  bool aead) {
  std::vector<std::string> flags = {absl::StrCat("--tls_cert=", files.cert),
                                    absl::StrCat("--tls_key=", files.key),
                                    absl::StrCat("--tls_ca=", ca)};
  flags.push_back(absl::StrCat("--tls_bulk_aead=", aead ? "true" : "false"));
  return flags;
}

// Where the server and the client run: this host's loopback, or hosts 0 and
// 1 of a NetnsCluster.
struct Link {
  std::string name;
  NetnsCluster* cluster = nullptr;  // null: loopback
};

// Stops a pserver (by PID) when it goes out of scope; the cluster's own are
// also killed with it.
struct ServerChild {
  ChildProcess* child = nullptr;
  std::unique_ptr<ChildProcess> owned;
  ~ServerChild() {
    if (child != nullptr) {
      kill(child->pid(), SIGTERM);
      (void)child->WaitForExit(absl::Now() + absl::Seconds(10));
    }
  }
};

absl::StatusOr<std::string> StartServer(const Link& link, const std::string& binary,
                                        const std::vector<std::string>& tls, ServerChild* out) {
  std::vector<std::string> args = {"--port=0"};
  if (link.cluster != nullptr) args.push_back(absl::StrCat("--host=", link.cluster->address(0)));
  args.insert(args.end(), tls.begin(), tls.end());
  if (link.cluster != nullptr) {
    PS_ASSIGN_OR_RETURN(out->child, link.cluster->Spawn(0, binary, args));
  } else {
    PS_ASSIGN_OR_RETURN(out->owned, ChildProcess::Spawn(binary, args));
    out->child = out->owned.get();
  }
  return WaitForPserverAddress(*out->child, 0, absl::Now() + absl::Seconds(30));
}

absl::StatusOr<DriverResults> RunLink(const Link& link, const std::string& driver,
                                      const std::vector<std::string>& args) {
  const absl::Time deadline = absl::Now() + absl::Minutes(10);
  if (link.cluster == nullptr) return RunDriver(driver, args, deadline);
  PS_ASSIGN_OR_RETURN(ChildProcess * child, link.cluster->Spawn(1, driver, args));
  return WaitForDriver(*child, "tls_link", deadline);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Every mode over `link`: mode -> the link's figures.
absl::Status MeasureLink(Harness& h, const Link& link, const Pki& pki,
                         const std::string& pserver_binary, const std::string& driver,
                         const std::vector<uint64_t>& sizes) {
  const int warmup = h.options().warmup;
  const int repetitions = warmup + h.options().repetitions;
  // The repetitions are split over rounds; in each round every mode runs
  // once (its own server and client), its first `warmup` values dropped but
  // in the first round, where the harness drops them.
  const int rounds = std::max(1, std::min(h.quick() ? 1 : absl::GetFlag(FLAGS_tls_rounds),
                                          h.options().repetitions));
  const int per_round = (h.options().repetitions + rounds - 1) / rounds;
  const std::vector<std::string> common = {
      absl::StrCat("--sizes=", absl::StrJoin(sizes, ",")),
      absl::StrCat("--repetitions=", warmup + per_round),
      absl::StrCat("--bytes_per_repetition=", h.quick() ? 16 * kMiB : 128 * kMiB)};
  std::map<std::string, DriverResults> by_mode;
  // Each mode: the server's flags and whether the client uses the bulk channel.
  struct Mode {
    const char* name;
    std::vector<std::string> server_flags;
    bool bulk;
  };
  const std::vector<Mode> modes = {
      {"plain", {}, true},
      {"plain_tcp", {"--bulk_unix_socket=false"}, true},
      {"plain_grpc", {}, false},
      {"tls", TlsFlags(pki.server, pki.ca, false), true},
      {"tls_aead", TlsFlags(pki.server, pki.ca, true), true},
  };
  for (int round = 0; round < rounds; ++round) {
    for (const Mode& mode : modes) {
      if (link.cluster != nullptr && std::string(mode.name) == "plain_tcp") continue;  // = plain
      ServerChild server;
      PS_ASSIGN_OR_RETURN(std::string address,
                          StartServer(link, pserver_binary, mode.server_flags, &server));
      std::vector<std::string> args = common;
      args.push_back(absl::StrCat("--servers=", address));
      args.push_back(absl::StrCat("--bulk_channel=", mode.bulk ? "true" : "false"));
      if (absl::StartsWith(mode.name, "tls")) {
        const bool aead = std::string(mode.name) == "tls_aead";
        for (const std::string& flag : TlsFlags(pki.client, pki.ca, aead)) args.push_back(flag);
      }
      PS_ASSIGN_OR_RETURN(DriverResults got, RunLink(link, driver, args));
      for (auto& [key, values] : got) {
        std::vector<double>& all = by_mode[mode.name][key];
        const size_t skip = round == 0 ? 0 : std::min<size_t>(warmup, values.size());
        all.insert(all.end(), values.begin() + skip, values.end());
        if (all.size() > static_cast<size_t>(repetitions)) all.resize(repetitions);
      }
    }
  }
  // Between hosts the bulk channel is TCP already: plain_tcp is plain.
  if (link.cluster != nullptr) by_mode["plain_tcp"] = by_mode["plain"];
  for (uint64_t bytes : sizes) {
    for (const char* op : kOps) {
      for (const char* mode : kModes) {
        if (link.cluster != nullptr && std::string(mode) == "plain_tcp") continue;
        const std::vector<double>& values = by_mode[mode][{op, bytes}];
        if (values.size() != static_cast<size_t>(repetitions)) {
          return absl::InternalError(absl::StrCat("tls_link (", link.name, ", ", mode,
                                                  ") reported ", values.size(), " of ",
                                                  repetitions, " values for ", op, " ", bytes));
        }
        Result& r = h.Add("tls", absl::StrCat(link.name, "_", mode, "_", op));
        r.set_payload_bytes(bytes);
        r.set_servers(1);
        r.set_workers(1);
        size_t next = 0;
        PS_RETURN_IF_ERROR(
            h.Measure(&r, "GB/s", [&]() -> absl::StatusOr<double> { return values[next++]; }));
        if (absl::StartsWith(mode, "tls")) {
          const double tls = Median(values);
          (*r.mutable_extra())["vs_plain"] = tls / Median(by_mode["plain"][{op, bytes}]);
          (*r.mutable_extra())["vs_plain_tcp"] = tls / Median(by_mode["plain_tcp"][{op, bytes}]);
          (*r.mutable_extra())["vs_plain_grpc"] =
              tls / Median(by_mode["plain_grpc"][{op, bytes}]);
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status TlsGroup(Harness& h, const std::string& pserver_binary, const std::string& argv0) {
  std::vector<uint64_t> sizes = {4 * kKiB, 1 * kMiB, 16 * kMiB};
  if (!h.quick()) sizes.push_back(64 * kMiB);
  const std::string driver = RunfilesPath("bench/tls_link", argv0);

  std::unique_ptr<NetnsCluster> cluster;
  std::string netns_problem;
  if (absl::Status supported = NetnsSupported(); supported.ok()) {
    NetnsOptions options;
    options.hosts = 2;
    options.rate = "10gbit";
    options.burst = "4mb";  // tbf needs at least rate / HZ of burst at 10 Gbit/s
    absl::StatusOr<std::unique_ptr<NetnsCluster>> made = NetnsCluster::Create(options);
    if (made.ok()) {
      cluster = *std::move(made);
    } else {
      netns_problem = made.status().ToString();
    }
  } else {
    netns_problem = std::string(supported.message());
  }
  std::vector<std::string> server_ips = {"127.0.0.1"};
  if (cluster != nullptr) server_ips.push_back(cluster->address(0));
  PS_ASSIGN_OR_RETURN(Pki pki, MakePki(server_ips));

  PS_RETURN_IF_ERROR(MeasureLink(h, Link{"loopback", nullptr}, pki, pserver_binary, driver, sizes));
  if (cluster != nullptr) {
    PS_RETURN_IF_ERROR(
        MeasureLink(h, Link{"10gbit", cluster.get()}, pki, pserver_binary, driver, sizes));
  } else {
    std::printf("tls: the 10 Gbit/s NetnsCluster link skipped: %s\n", netns_problem.c_str());
  }
  h.PrintGroup("tls");
  return absl::OkStatus();
}

}  // namespace pserver::bench
