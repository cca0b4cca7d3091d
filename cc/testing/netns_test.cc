#include "cc/testing/netns.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cc/core/status_macros.h"
#include "cc/testing/run_program.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::pserver::testing::StatusCodeIs;
using ::pserver::testing::StatusIs;

#define SKIP_WITHOUT_NETNS()                                                    \
  if (absl::Status supported = NetnsSupported(); !supported.ok()) {             \
    GTEST_SKIP() << "network namespaces unavailable: " << supported.message(); \
  }

constexpr char kProbe[] = "hello across the bridge";

// Bounds connect, accept and read on `fd` (the kernel's timeouts otherwise).
void BoundWaits(int fd) {
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
}

sockaddr_in Address(const std::string& ip, uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, ip.c_str(), &addr.sin_addr);
  return addr;
}

// A socket address for a numeric IPv4 or IPv6 address.
sockaddr_storage NumericAddress(const std::string& ip, uint16_t port, socklen_t* length) {
  sockaddr_storage storage{};
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  *length = 0;
  if (getaddrinfo(ip.c_str(), absl::StrCat(port).c_str(), &hints, &found) == 0) {
    std::memcpy(&storage, found->ai_addr, found->ai_addrlen);
    *length = found->ai_addrlen;
    freeaddrinfo(found);
  }
  return storage;
}

// A listening socket on ip (any port) inside host; its port in *port.
int ListenIn(const NetnsCluster& cluster, int host, const std::string& ip, uint16_t* port) {
  int listener = -1;
  *port = 0;
  absl::Status in = cluster.RunIn(host, [&] {
    socklen_t length = 0;
    sockaddr_storage addr = NumericAddress(ip, 0, &length);
    listener = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    BoundWaits(listener);
    if (bind(listener, reinterpret_cast<sockaddr*>(&addr), length) == 0 &&
        listen(listener, 4) == 0 &&
        getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &length) == 0) {
      *port = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    }
  });
  return in.ok() ? listener : -1;
}

// Connects from host to ip:port, waiting at most `wait`; the error if not.
absl::Status ConnectFrom(const NetnsCluster& cluster, int host, const std::string& ip,
                         uint16_t port, int wait_seconds) {
  absl::Status status = absl::InternalError("not run");
  PS_RETURN_IF_ERROR(cluster.RunIn(host, [&] {
    socklen_t length = 0;
    const sockaddr_storage addr = NumericAddress(ip, port, &length);
    const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    timeval timeout{wait_seconds, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    status = connect(fd, reinterpret_cast<const sockaddr*>(&addr), length) == 0
                 ? absl::OkStatus()
                 : absl::UnavailableError(std::strerror(errno));
    close(fd);
  }));
  return status;
}

TEST(NetnsClusterTest, RejectsABadHostCount) {
  NetnsOptions options;
  options.hosts = 0;
  EXPECT_THAT(NetnsCluster::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("hosts is 0")));
  options.hosts = 65;
  EXPECT_THAT(NetnsCluster::Create(options), StatusCodeIs(absl::StatusCode::kInvalidArgument));
}

TEST(NetnsClusterTest, TwoHostsConnectOverTheBridge) {
  SKIP_WITHOUT_NETNS();
  NetnsOptions options;
  options.rate = "100mbit";
  ASSERT_OK_AND_ASSIGN(auto cluster, NetnsCluster::Create(options));
  int listener = -1;
  uint16_t port = 0;
  ASSERT_OK(cluster->RunIn(0, [&] {
    listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    BoundWaits(listener);
    sockaddr_in addr = Address(cluster->address(0), 0);
    socklen_t len = sizeof(addr);
    if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        listen(listener, 1) == 0 &&
        getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(addr.sin_port);
    }
  }));
  ASSERT_GE(listener, 0);
  ASSERT_NE(port, 0) << "cannot listen on " << cluster->address(0) << " in host 0";
  int sent = -1;
  std::string error;
  ASSERT_OK(cluster->RunIn(1, [&] {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    BoundWaits(fd);
    const sockaddr_in addr = Address(cluster->address(0), port);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
      sent = static_cast<int>(write(fd, kProbe, sizeof(kProbe)));
    } else {
      error = std::strerror(errno);
    }
    close(fd);
  }));
  ASSERT_EQ(sent, static_cast<int>(sizeof(kProbe))) << "connect from host 1: " << error;
  const int conn = accept(listener, nullptr, nullptr);
  ASSERT_GE(conn, 0) << std::strerror(errno);
  BoundWaits(conn);
  char buffer[sizeof(kProbe)] = {};
  size_t got = 0;
  for (int reads = 0; reads < 100 && got < sizeof(buffer); ++reads) {
    const ssize_t n = read(conn, buffer + got, sizeof(buffer) - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(conn);
  close(listener);
  EXPECT_EQ(std::string(buffer, got), std::string(kProbe, sizeof(kProbe)));
}

TEST(NetnsClusterTest, LimitsEveryLinkBothWays) {
  SKIP_WITHOUT_NETNS();
  NetnsOptions options;
  options.hosts = 2;
  options.rate = "1gbit";
  ASSERT_OK_AND_ASSIGN(auto cluster, NetnsCluster::Create(options));
  ASSERT_OK_AND_ASSIGN(const std::string tc, FindProgram("tc"));
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  for (int host = 0; host < cluster->size(); ++host) {
    ASSERT_OK_AND_ASSIGN(std::string inside,
                         RunProgram(tc, {"-n", cluster->name(host), "qdisc", "show", "dev",
                                         cluster->device(host)},
                                    deadline));
    EXPECT_THAT(inside, HasSubstr("qdisc tbf"));
    EXPECT_THAT(inside, HasSubstr("rate 1Gbit"));
    ASSERT_OK_AND_ASSIGN(std::string port,
                         RunProgram(tc, {"qdisc", "show", "dev", cluster->bridge_port(host)},
                                    deadline));
    EXPECT_THAT(port, HasSubstr("qdisc tbf"));
    EXPECT_THAT(port, HasSubstr("rate 1Gbit"));
  }
}

TEST(NetnsClusterTest, CountsTheBytesEachLinkCarriesEachWay) {
  SKIP_WITHOUT_NETNS();
  NetnsOptions options;
  options.rate = "1gbit";
  ASSERT_OK_AND_ASSIGN(auto cluster, NetnsCluster::Create(options));
  ASSERT_OK_AND_ASSIGN(const NetnsCluster::LinkCounters before0, cluster->Counters(0));
  ASSERT_OK_AND_ASSIGN(const NetnsCluster::LinkCounters before1, cluster->Counters(1));
  uint16_t port = 0;
  const int listener = ListenIn(*cluster, 0, cluster->address(0), &port);
  ASSERT_GE(listener, 0);
  ASSERT_NE(port, 0);
  // Host 1 sends 1 MiB to host 0, which reads all of it meanwhile.
  constexpr size_t kBytes = 1 << 20;
  size_t got = 0;
  std::thread reader([&] {
    const int conn = accept(listener, nullptr, nullptr);  // bounded by BoundWaits
    if (conn < 0) return;
    BoundWaits(conn);
    std::string buffer(kBytes, '\0');
    for (int reads = 0; reads < 100000 && got < kBytes; ++reads) {
      const ssize_t n = read(conn, buffer.data() + got, kBytes - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    close(conn);
  });
  const std::string payload(kBytes, 'x');
  size_t sent = 0;
  const absl::Status in = cluster->RunIn(1, [&] {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    BoundWaits(fd);
    const sockaddr_in addr = Address(cluster->address(0), port);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
      for (int writes = 0; writes < 100000 && sent < kBytes; ++writes) {
        const ssize_t n = write(fd, payload.data() + sent, kBytes - sent);
        if (n <= 0) break;
        sent += static_cast<size_t>(n);
      }
    }
    close(fd);
  });
  reader.join();
  close(listener);
  ASSERT_OK(in);
  ASSERT_EQ(sent, kBytes);
  ASSERT_EQ(got, kBytes);
  ASSERT_OK_AND_ASSIGN(const NetnsCluster::LinkCounters after0, cluster->Counters(0));
  ASSERT_OK_AND_ASSIGN(const NetnsCluster::LinkCounters after1, cluster->Counters(1));
  // The payload, with its headers, left host 1 and reached host 0; what
  // went back was acknowledgements, far fewer bytes.
  EXPECT_GE(after1.sent_bytes - before1.sent_bytes, kBytes);
  EXPECT_GE(after0.received_bytes - before0.received_bytes, kBytes);
  EXPECT_LT(after0.sent_bytes - before0.sent_bytes, kBytes / 4);
  EXPECT_LT(after1.received_bytes - before1.received_bytes, kBytes / 4);
  EXPECT_EQ(after0.dropped, 0u);
  EXPECT_EQ(after1.dropped, 0u);
  EXPECT_THAT(cluster->Counters(2), StatusCodeIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(auto unlimited, NetnsCluster::Create(NetnsOptions()));
  EXPECT_THAT(unlimited->Counters(0),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no rate limit")));
}

TEST(NetnsClusterTest, RunsProgramsInsideItsNamespace) {
  SKIP_WITHOUT_NETNS();
  ASSERT_OK_AND_ASSIGN(auto cluster, NetnsCluster::Create(NetnsOptions()));
  ASSERT_OK_AND_ASSIGN(const std::string ip, FindProgram("ip"));
  ASSERT_OK_AND_ASSIGN(std::string addresses, cluster->Run(1, ip, {"-o", "-4", "addr", "show"}));
  EXPECT_THAT(addresses, HasSubstr(cluster->address(1) + "/24"));
  EXPECT_THAT(addresses, Not(HasSubstr(cluster->address(0) + "/24")));
  ASSERT_OK_AND_ASSIGN(ChildProcess * child,
                       cluster->Spawn(0, ip, {"-o", "-4", "addr", "show"}));
  ASSERT_OK_AND_ASSIGN(int status, child->WaitForExit(absl::Now() + absl::Seconds(20)));
  EXPECT_EQ(status, 0) << child->output();
  EXPECT_THAT(child->out(), HasSubstr(cluster->address(0) + "/24"));
  EXPECT_THAT(cluster->Run(5, ip, {"addr"}), StatusCodeIs(absl::StatusCode::kInvalidArgument));
}

TEST(NetnsClusterTest, ALinkTakenDownCutsTheHostOffUntilItIsUp) {
  SKIP_WITHOUT_NETNS();
  ASSERT_OK_AND_ASSIGN(auto cluster, NetnsCluster::Create(NetnsOptions()));
  uint16_t port = 0;
  const int listener = ListenIn(*cluster, 0, cluster->address(0), &port);
  ASSERT_GE(listener, 0);
  ASSERT_NE(port, 0);
  EXPECT_OK(ConnectFrom(*cluster, 1, cluster->address(0), port, 10));
  ASSERT_OK(cluster->SetLinkUp(0, false));
  // Nothing answers: the connect gives up after its bound (1 s).
  EXPECT_THAT(ConnectFrom(*cluster, 1, cluster->address(0), port, 1),
              StatusCodeIs(absl::StatusCode::kUnavailable));
  ASSERT_OK_AND_ASSIGN(const std::string ip, FindProgram("ip"));
  ASSERT_OK_AND_ASSIGN(std::string inside,
                       cluster->Run(0, ip, {"-o", "link", "show", cluster->device(0)}));
  EXPECT_THAT(inside, HasSubstr("NO-CARRIER"));
  ASSERT_OK(cluster->SetLinkUp(0, true));
  EXPECT_OK(ConnectFrom(*cluster, 1, cluster->address(0), port, 10));
  close(listener);
  EXPECT_THAT(cluster->SetLinkUp(7, true), StatusCodeIs(absl::StatusCode::kInvalidArgument));
}

TEST(NetnsClusterTest, HostsGetIpv6AddressesWhenAsked) {
  SKIP_WITHOUT_NETNS();
  NetnsOptions options;
  options.ipv6_prefix = "fd00:213::";
  ASSERT_OK_AND_ASSIGN(auto cluster, NetnsCluster::Create(options));
  EXPECT_EQ(cluster->address6(0), "fd00:213::1");
  EXPECT_EQ(cluster->address6(1), "fd00:213::2");
  uint16_t port = 0;
  const int listener = ListenIn(*cluster, 1, cluster->address6(1), &port);
  ASSERT_GE(listener, 0);
  ASSERT_NE(port, 0) << "cannot listen on " << cluster->address6(1);
  EXPECT_OK(ConnectFrom(*cluster, 0, cluster->address6(1), port, 10));
  close(listener);
  ASSERT_OK_AND_ASSIGN(auto ipv4_only, NetnsCluster::Create(NetnsOptions()));
  EXPECT_EQ(ipv4_only->address6(0), "");
}

TEST(NetnsClusterTest, TeardownLeavesNothing) {
  SKIP_WITHOUT_NETNS();
  ASSERT_OK_AND_ASSIGN(const std::string ip, FindProgram("ip"));
  ASSERT_OK_AND_ASSIGN(const std::string sleep, FindProgram("sleep"));
  std::string prefix;
  pid_t pid = -1;
  {
    NetnsOptions options;
    options.hosts = 3;
    options.rate = "10mbit";
    ASSERT_OK_AND_ASSIGN(auto cluster, NetnsCluster::Create(options));
    prefix = cluster->prefix();
    ASSERT_OK_AND_ASSIGN(ChildProcess * child, cluster->Spawn(2, sleep, {"600"}));
    pid = child->pid();
    ASSERT_EQ(kill(pid, 0), 0);
  }
  // Reaped by the destructor: the PID names no process (of ours) any more.
  EXPECT_EQ(kill(pid, 0), -1);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  ASSERT_OK_AND_ASSIGN(std::string namespaces, RunProgram(ip, {"netns", "list"}, deadline));
  EXPECT_THAT(namespaces, Not(HasSubstr(prefix)));
  ASSERT_OK_AND_ASSIGN(std::string links, RunProgram(ip, {"-o", "link", "show"}, deadline));
  EXPECT_THAT(links, Not(HasSubstr(prefix)));
}

TEST(NetnsClusterTest, ClustersInOneProcessGetTheirOwnNames) {
  SKIP_WITHOUT_NETNS();
  NetnsOptions options;
  options.hosts = 1;
  ASSERT_OK_AND_ASSIGN(auto a, NetnsCluster::Create(options));
  ASSERT_OK_AND_ASSIGN(auto b, NetnsCluster::Create(options));
  EXPECT_NE(a->prefix(), b->prefix());
  EXPECT_NE(a->name(0), b->name(0));
  EXPECT_THAT(a->name(0), ::testing::StartsWith(a->prefix()));
  EXPECT_THAT(a->bridge(), ::testing::StartsWith(a->prefix()));
}

}  // namespace
}  // namespace pserver
