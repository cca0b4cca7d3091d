// NetnsCluster: N network namespaces ("hosts") on one machine, each joined to
// one bridge by a veth pair, each with its own address, optionally with every
// link rate-limited by `tc tbf`, for tests and benchmarks that need traffic
// to cross a real (limited) link between processes. Needs CAP_NET_ADMIN and
// CAP_SYS_ADMIN (root); Create says so (FAILED_PRECONDITION) otherwise, so a
// caller can skip with the reason.
//
//   NetnsOptions options;
//   options.hosts = 2;
//   options.rate = "1gbit";  // both directions of every host's link
//   PS_ASSIGN_OR_RETURN(auto cluster, NetnsCluster::Create(options));
//   PS_ASSIGN_OR_RETURN(ChildProcess* server,
//                       cluster->Spawn(0, pserver, {"--host=" + cluster->address(0)}));
//   cluster->RunIn(1, [&] { /* sockets made here live in host 1 */ });
//   // ~NetnsCluster kills (by PID) what Spawn started, then deletes the
//   // namespaces, links and bridge it created (all named prefix()...).
//
// Names are unique per cluster ("ps" + 6 random hex digits + a letter), so runs
// in parallel do not collide; every address lives only inside its
// namespaces. Every command runs under a deadline. Not thread-safe, except
// RunIn and Counters, which only read.
#ifndef PSERVER_CC_TESTING_NETNS_H_
#define PSERVER_CC_TESTING_NETNS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cc/testing/child_process.h"

namespace pserver {

struct NetnsOptions {
  int hosts = 2;  // 1 to 64
  // tc rate of each host's link, in both directions ("1gbit", "100mbit");
  // empty: not limited.
  std::string rate;
  std::string burst = "512kb";   // tbf burst
  std::string latency = "50ms";  // tbf latency (how long a packet may queue)
  // Host i gets <subnet>.<i + 1>/24; the addresses exist only inside the
  // cluster's namespaces.
  std::string subnet = "10.213.0";
  // Also IPv6: host i gets <ipv6_prefix><i + 1>/64 (e.g. "fd00:213::" gives
  // fd00:213::1), usable at once (no duplicate address detection). Empty:
  // IPv4 only.
  std::string ipv6_prefix;
  // Deadline of each ip/tc command.
  absl::Duration command_timeout = absl::Seconds(20);
};

// OK when this process can create network namespaces (CAP_NET_ADMIN and
// CAP_SYS_ADMIN, `ip` and `tc` found); FAILED_PRECONDITION with the reason.
absl::Status NetnsSupported();

class NetnsCluster {
 public:
  static absl::StatusOr<std::unique_ptr<NetnsCluster>> Create(const NetnsOptions& options);

  NetnsCluster(const NetnsCluster&) = delete;
  NetnsCluster& operator=(const NetnsCluster&) = delete;
  ~NetnsCluster();

  int size() const { return static_cast<int>(hosts_.size()); }
  const std::string& prefix() const { return prefix_; }  // of every name created
  const std::string& bridge() const { return bridge_; }
  const std::string& name(int host) const { return hosts_[host].netns; }
  const std::string& address(int host) const { return hosts_[host].address; }
  // Host's IPv6 address; empty without NetnsOptions.ipv6_prefix.
  const std::string& address6(int host) const { return hosts_[host].address6; }
  // The link's device inside host's namespace, and its peer on the bridge.
  const std::string& device(int host) const { return hosts_[host].device; }
  const std::string& bridge_port(int host) const { return hosts_[host].port; }

  // Starts `path args...` inside host's namespace (`ip netns exec`, which
  // execs: the PID is the program's). Owned by the cluster, killed by the
  // destructor; the caller may stop it earlier.
  absl::StatusOr<ChildProcess*> Spawn(int host, const std::string& path,
                                      const std::vector<std::string>& args);

  // Runs `path args...` to completion inside host's namespace; its stdout.
  absl::StatusOr<std::string> Run(int host, const std::string& path,
                                  const std::vector<std::string>& args) const;

  // Runs `fn` on a thread that has entered host's namespace (sockets it
  // creates belong there), and waits for it.
  absl::Status RunIn(int host, const std::function<void()>& fn) const;

  // Cuts host off (false) or connects it again (true): its port on the
  // bridge goes down or up. The host keeps its addresses and its processes
  // run on; while down nothing reaches it or leaves it (its own device has
  // no carrier), as when a machine's cable is pulled. A TCP connection
  // survives a cut shorter than its timeouts.
  absl::Status SetLinkUp(int host, bool up);

  // What host's link has carried so far, as its two tbf qdiscs counted it
  // (frames with their Ethernet, IP and TCP headers, per segment: what the
  // rate limits): `sent` left the host (its device's qdisc), `received`
  // came to it (its bridge port's qdisc); `dropped` packets either qdisc
  // dropped. The difference of two readings over a time, against the
  // rate, is how busy the link was. FAILED_PRECONDITION without a rate
  // (no tbf to count).
  struct LinkCounters {
    uint64_t sent_bytes = 0;
    uint64_t received_bytes = 0;
    uint64_t dropped = 0;
  };
  absl::StatusOr<LinkCounters> Counters(int host) const;

 private:
  struct Host {
    std::string netns, address, address6, device, port;
  };
  NetnsCluster() = default;

  absl::Status Build();
  absl::Status CheckHost(int host) const;
  absl::Status Ip(const std::vector<std::string>& args) const;
  absl::Status Tc(const std::vector<std::string>& args) const;
  // The "Sent B bytes P pkt (dropped D, ...)" of the root qdisc of `dev`.
  absl::Status ReadQdisc(const std::vector<std::string>& netns_args, const std::string& dev,
                         uint64_t* bytes, uint64_t* dropped) const;
  absl::Status LimitRate(const std::vector<std::string>& netns_args, const std::string& dev) const;
  absl::Time Deadline() const { return absl::Now() + options_.command_timeout; }

  NetnsOptions options_;
  std::string ip_, tc_;
  std::string prefix_, bridge_;
  std::vector<Host> hosts_;
  bool bridge_created_ = false;
  int namespaces_created_ = 0;  // hosts_[0 .. n) have a namespace to delete
  std::vector<std::unique_ptr<ChildProcess>> children_;
};

}  // namespace pserver

#endif  // PSERVER_CC_TESTING_NETNS_H_
