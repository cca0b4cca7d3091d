#include "cc/testing/netns.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/ascii.h"
#include "cc/core/status_macros.h"
#include "cc/testing/run_program.h"

namespace pserver {
namespace {

constexpr int kMaxHosts = 64;
constexpr int kCapSysAdmin = 21;  // linux/capability.h
constexpr int kCapNetAdmin = 12;

// The effective capability set of this process (CapEff in /proc/self/status).
uint64_t EffectiveCapabilities() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    uint64_t caps = 0;
    if (absl::SimpleHexAtoi(absl::StripAsciiWhitespace(line.substr(7)), &caps)) return caps;
  }
  return 0;
}

// "ps" + 6 random hex digits + a letter counting this process's clusters:
// unique across processes, even across PID namespaces (Bazel's sandbox
// gives every test a small PID), and short enough that "<prefix>h63" fits a
// 15-character interface name.
std::string NextPrefix() {
  static const uint32_t kProcessTag = std::random_device()() & 0xffffff;
  static std::atomic<int> next{0};
  const int n = next.fetch_add(1);
  return absl::StrCat("ps", absl::Hex(kProcessTag, absl::kZeroPad6),
                      std::string(1, static_cast<char>('a' + n % 26)));
}

// The decimal number right after the first `label` in `text`.
std::optional<uint64_t> NumberAfter(const std::string& text, absl::string_view label) {
  const size_t at = text.find(label.data(), 0, label.size());
  if (at == std::string::npos) return std::nullopt;
  const size_t begin = at + label.size();
  size_t end = begin;
  while (end < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[end]))) ++end;
  uint64_t value = 0;
  if (!absl::SimpleAtoi(absl::string_view(text).substr(begin, end - begin), &value)) {
    return std::nullopt;
  }
  return value;
}

}  // namespace

absl::Status NetnsSupported() {
  const uint64_t caps = EffectiveCapabilities();
  std::vector<std::string> missing;
  if ((caps >> kCapNetAdmin & 1) == 0) missing.push_back("CAP_NET_ADMIN");
  if ((caps >> kCapSysAdmin & 1) == 0) missing.push_back("CAP_SYS_ADMIN");
  if (!missing.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("network namespaces need root (this process lacks ",
                     absl::StrJoin(missing, " and "), ")"));
  }
  for (const char* program : {"ip", "tc"}) {
    if (absl::StatusOr<std::string> path = FindProgram(program); !path.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("network namespaces need iproute2: ", path.status().message()));
    }
  }
  // Capabilities held in a user namespace (a sandbox) do not reach the
  // network namespace: try one link.
  const std::string ip = *FindProgram("ip");
  const std::string probe = NextPrefix() + "probe";
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  absl::StatusOr<std::string> added =
      RunProgram(ip, {"link", "add", probe, "type", "bridge"}, deadline);
  if (!added.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create network links here (a sandbox?): ", added.status().message()));
  }
  (void)RunProgram(ip, {"link", "del", probe}, deadline);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NetnsCluster>> NetnsCluster::Create(const NetnsOptions& options) {
  if (options.hosts < 1 || options.hosts > kMaxHosts) {
    return absl::InvalidArgumentError(
        absl::StrCat("NetnsOptions.hosts is ", options.hosts, "; it must be 1 to ", kMaxHosts));
  }
  if (absl::Status supported = NetnsSupported(); !supported.ok()) return supported;
  auto cluster = std::unique_ptr<NetnsCluster>(new NetnsCluster());
  cluster->options_ = options;
  cluster->ip_ = *FindProgram("ip");
  cluster->tc_ = *FindProgram("tc");
  cluster->prefix_ = NextPrefix();
  cluster->bridge_ = cluster->prefix_ + "br";
  for (int i = 0; i < options.hosts; ++i) {
    const std::string p = cluster->prefix_;
    cluster->hosts_.push_back(
        {absl::StrCat(p, "-", i), absl::StrCat(options.subnet, ".", i + 1),
         options.ipv6_prefix.empty() ? "" : absl::StrCat(options.ipv6_prefix, absl::Hex(i + 1)),
         absl::StrCat(p, "n", i), absl::StrCat(p, "h", i)});
  }
  // On failure the destructor removes whatever was made.
  if (absl::Status built = cluster->Build(); !built.ok()) {
    return absl::Status(built.code(),
                        absl::StrCat("building network namespaces: ", built.message()));
  }
  return cluster;
}

absl::Status NetnsCluster::Build() {
  PS_RETURN_IF_ERROR(Ip({"link", "add", bridge_, "type", "bridge"}));
  bridge_created_ = true;
  PS_RETURN_IF_ERROR(Ip({"link", "set", bridge_, "up"}));
  for (const Host& host : hosts_) {
    PS_RETURN_IF_ERROR(Ip({"netns", "add", host.netns}));
    ++namespaces_created_;
    const std::vector<std::string> in_ns = {"-n", host.netns};
    PS_RETURN_IF_ERROR(Ip({"link", "add", host.port, "type", "veth", "peer", "name",
                                 host.device, "netns", host.netns}));
    PS_RETURN_IF_ERROR(Ip({"link", "set", host.port, "master", bridge_, "up"}));
    PS_RETURN_IF_ERROR(
        Ip({"-n", host.netns, "addr", "add", host.address + "/24", "dev", host.device}));
    if (!host.address6.empty()) {
      PS_RETURN_IF_ERROR(Ip({"-n", host.netns, "-6", "addr", "add", host.address6 + "/64", "dev",
                             host.device, "nodad"}));
    }
    PS_RETURN_IF_ERROR(Ip({"-n", host.netns, "link", "set", host.device, "up"}));
    PS_RETURN_IF_ERROR(Ip({"-n", host.netns, "link", "set", "lo", "up"}));
    if (!options_.rate.empty()) {
      // Both directions: what the host sends, and what the bridge sends it.
      PS_RETURN_IF_ERROR(LimitRate(in_ns, host.device));
      PS_RETURN_IF_ERROR(LimitRate({}, host.port));
    }
  }
  return absl::OkStatus();
}

NetnsCluster::~NetnsCluster() {
  children_.clear();  // each kills (SIGKILL) and reaps its process
  for (int i = namespaces_created_ - 1; i >= 0; --i) {
    // The veth pair first, by its bridge end: deleting a namespace deletes
    // the pair too, but in the kernel's own time (a work queue), so its
    // bridge end could still be listed after `netns del` returned.
    // (Fails harmlessly when Build stopped before making the pair.)
    (void)Ip({"link", "del", hosts_[i].port});
    (void)Ip({"netns", "del", hosts_[i].netns});
  }
  if (bridge_created_) (void)Ip({"link", "del", bridge_});
}

absl::Status NetnsCluster::Ip(const std::vector<std::string>& args) const {
  return RunProgram(ip_, args, Deadline()).status();
}

absl::Status NetnsCluster::Tc(const std::vector<std::string>& args) const {
  return RunProgram(tc_, args, Deadline()).status();
}

absl::Status NetnsCluster::LimitRate(const std::vector<std::string>& netns_args,
                                     const std::string& dev) const {
  std::vector<std::string> args = netns_args;
  const std::vector<std::string> qdisc = {"qdisc", "add",   "dev",         dev,
                                          "root",  "tbf",   "rate",        options_.rate,
                                          "burst", options_.burst, "latency", options_.latency};
  args.insert(args.end(), qdisc.begin(), qdisc.end());
  return Tc(args);
}

absl::Status NetnsCluster::ReadQdisc(const std::vector<std::string>& netns_args,
                                     const std::string& dev, uint64_t* bytes,
                                     uint64_t* dropped) const {
  std::vector<std::string> args = netns_args;
  for (const char* arg : {"-s", "qdisc", "show", "dev"}) args.push_back(arg);
  args.push_back(dev);
  PS_ASSIGN_OR_RETURN(std::string shown, RunProgram(tc_, args, Deadline()));
  // " Sent 1514 bytes 1 pkt (dropped 0, overlimits 0 requeues 0)", first
  // for the root qdisc (the tbf; nothing sits under it).
  const std::optional<uint64_t> b = NumberAfter(shown, " Sent ");
  const std::optional<uint64_t> d = NumberAfter(shown, "(dropped ");
  if (!b.has_value() || !d.has_value()) {
    return absl::InternalError(absl::StrCat("cannot read the counters of ", dev, " from `tc -s`: ",
                                            shown.substr(0, 300)));
  }
  *bytes = *b;
  *dropped = *d;
  return absl::OkStatus();
}

absl::StatusOr<NetnsCluster::LinkCounters> NetnsCluster::Counters(int host) const {
  PS_RETURN_IF_ERROR(CheckHost(host));
  if (options_.rate.empty()) {
    return absl::FailedPreconditionError(
        "the links have no rate limit (NetnsOptions.rate), so no tbf counts their bytes");
  }
  LinkCounters counters;
  uint64_t dropped_out = 0, dropped_in = 0;
  PS_RETURN_IF_ERROR(ReadQdisc({"-n", name(host)}, device(host), &counters.sent_bytes, &dropped_out));
  PS_RETURN_IF_ERROR(ReadQdisc({}, bridge_port(host), &counters.received_bytes, &dropped_in));
  counters.dropped = dropped_out + dropped_in;
  return counters;
}

absl::Status NetnsCluster::CheckHost(int host) const {
  if (host < 0 || host >= size()) {
    return absl::InvalidArgumentError(absl::StrCat("no host ", host, " (", size(), " hosts)"));
  }
  return absl::OkStatus();
}

absl::Status NetnsCluster::SetLinkUp(int host, bool up) {
  PS_RETURN_IF_ERROR(CheckHost(host));
  return Ip({"link", "set", bridge_port(host), up ? "up" : "down"});
}

absl::StatusOr<ChildProcess*> NetnsCluster::Spawn(int host, const std::string& path,
                                                  const std::vector<std::string>& args) {
  PS_RETURN_IF_ERROR(CheckHost(host));
  std::vector<std::string> all = {"netns", "exec", name(host), path};
  all.insert(all.end(), args.begin(), args.end());
  auto child = ChildProcess::Spawn(ip_, all);
  if (!child.ok()) return child.status();
  children_.push_back(std::move(*child));
  return children_.back().get();
}

absl::StatusOr<std::string> NetnsCluster::Run(int host, const std::string& path,
                                              const std::vector<std::string>& args) const {
  PS_RETURN_IF_ERROR(CheckHost(host));
  std::vector<std::string> all = {"netns", "exec", name(host), path};
  all.insert(all.end(), args.begin(), args.end());
  return RunProgram(ip_, all, Deadline());
}

absl::Status NetnsCluster::RunIn(int host, const std::function<void()>& fn) const {
  PS_RETURN_IF_ERROR(CheckHost(host));
  absl::Status status;
  std::thread thread([&] {
    const std::string path = absl::StrCat("/var/run/netns/", name(host));
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
      status = absl::InternalError(absl::StrCat("entering ", path, ": ", std::strerror(errno)));
      if (fd >= 0) close(fd);
      return;
    }
    close(fd);
    fn();
  });
  thread.join();
  return status;
}

}  // namespace pserver
