// How a client reports a wrong or dead address: bad syntax is refused at
// Connect; a closed port, an unknown host, a server that is not a pserver and
// an unreachable etcd each fail by the call's (or discovery's) deadline with
// the cause. Durations are only generous upper bounds on calls that the old
// code let run for their whole (much longer) deadline.
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/client/grpc_transport.h"
#include "cc/etcd/testing/fake_endpoints.h"
#include "cc/server/server.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::ClosedPort;
using ::pserver::testing::GarbageServer;
using ::pserver::testing::SilentListener;
using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;

// A client of one server at `address` whose calls end within `timeout`.
std::unique_ptr<Client> ClientOf(const std::string& address,
                                 absl::Duration timeout = absl::Seconds(3)) {
  ClientOptions options;
  options.servers = {address};
  options.timeout = timeout;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

TEST(ServerAddressTest, RejectsMalformedAddressesAtConnect) {
  for (const std::string bad :
       {"not an address", "127.0.0.1", "127.0.0.1:", ":7000", "127.0.0.1:0", "127.0.0.1:70000",
        "127.0.0.1:http", "127.0.0.1:-1", "::1:7000", "[::1]", "[::1:7000", "[nonsense]:7000",
        "host_name!:7000", "http://127.0.0.1:7000", "unix:", "a..b:7000"}) {
    ClientOptions options;
    options.servers = {"127.0.0.1:7000", bad};
    EXPECT_THAT(Client::Connect(options),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("server 1"), HasSubstr(absl::StrCat("'", bad, "'")))))
        << bad;
  }
}

TEST(ServerAddressTest, AcceptsHostPortBracketedV6AndUnixSockets) {
  for (const std::string good : {"127.0.0.1:7000", "localhost:1", "pserver-0.example.invalid:65535",
                                 "[::1]:7000", "[2001:db8::1]:80", "unix:/tmp/pserver.sock"}) {
    EXPECT_TRUE(ValidateServerAddress(good).ok()) << good << ": " << ValidateServerAddress(good);
    ClientOptions options;
    options.servers = {good};
    EXPECT_TRUE(Client::Connect(options).ok()) << good;
  }
}

TEST(UnreachableServerTest, ClosedPortSaysConnectionRefused) {
  ClosedPort closed;
  ASSERT_GT(closed.port(), 0);
  std::unique_ptr<Client> client = ClientOf(closed.address());
  ASSERT_NE(client, nullptr);
  const absl::Time start = absl::Now();
  EXPECT_THAT(client->GetStats(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr(closed.address()), HasSubstr("not reachable"),
                             HasSubstr("connection refused"), HasSubstr("attempts"))));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));  // ends by its 3 s deadline
}

TEST(UnreachableServerTest, UnknownHostSaysNotResolved) {
  // .invalid never resolves (RFC 6761).
  const std::string address = "no-such-pserver.invalid:7000";
  std::unique_ptr<Client> client = ClientOf(address);
  ASSERT_NE(client, nullptr);
  EXPECT_THAT(client->FinishInitParams(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr(address), HasSubstr("not resolved"))));
}

TEST(UnreachableServerTest, HttpServerSaysNotAPserver) {
  GarbageServer http("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  ASSERT_GT(http.port(), 0);
  std::unique_ptr<Client> client = ClientOf(http.address());
  ASSERT_NE(client, nullptr);
  EXPECT_THAT(client->GetStats(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr(http.address()), HasSubstr("not a gRPC (pserver) server"))));
  EXPECT_GT(http.connections(), 0);
}

TEST(UnreachableServerTest, GarbageAnswerSaysNotAPserver) {
  GarbageServer garbage("SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n");
  ASSERT_GT(garbage.port(), 0);
  std::unique_ptr<Client> client = ClientOf(garbage.address());
  ASSERT_NE(client, nullptr);
  EXPECT_THAT(client->GetStats(), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                           AllOf(HasSubstr(garbage.address()),
                                                 HasSubstr("not a gRPC (pserver) server"))));
}

TEST(UnreachableServerTest, SilentListenerSaysNoAnswer) {
  SilentListener silent;
  ASSERT_GT(silent.port(), 0);
  std::unique_ptr<Client> client = ClientOf(silent.address(), absl::Seconds(1));
  ASSERT_NE(client, nullptr);
  const absl::Time start = absl::Now();
  EXPECT_THAT(client->GetStats(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr(silent.address()), HasSubstr("no connection"))));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
}

TEST(UnreachableServerTest, ServerStartedAfterTheClientIsReached) {
  auto reserved = std::make_unique<ClosedPort>();
  const int port = reserved->port();
  ASSERT_GT(port, 0);
  std::unique_ptr<Client> client = ClientOf(reserved->address(), absl::Seconds(60));
  ASSERT_NE(client, nullptr);
  absl::Status status;
  absl::Notification done;
  std::thread call([&] {
    status = client->FinishInitParams();
    done.Notify();
  });
  // The call is retrying against the closed port...
  const absl::Time wait_until = absl::Now() + absl::Seconds(30);
  while (client->retries() < 2 && !done.HasBeenNotified() && absl::Now() < wait_until) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_GE(client->retries(), 2u);
  // ... when the server comes up on it.
  reserved.reset();
  ServerOptions options;
  options.port = port;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  call.join();
  EXPECT_TRUE(status.ok()) << status;
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ServerStats> stats, client->GetStats());
  EXPECT_EQ(stats.size(), 1u);
}

// ---- discovery through etcd ----------------------------------------------------

absl::Status ConnectThroughEtcd(const std::string& etcd, absl::Duration discovery_timeout) {
  ClientOptions options;
  options.etcd_endpoints = {etcd};
  options.discovery_timeout = discovery_timeout;
  return Client::Connect(options).status();
}

TEST(DiscoveryTimeoutTest, ClosedEtcdPortEndsByTheTimeout) {
  ClosedPort closed;
  ASSERT_GT(closed.port(), 0);
  const absl::Time start = absl::Now();
  const absl::Status status = ConnectThroughEtcd(closed.address(), absl::Seconds(1));
  const absl::Duration took = absl::Now() - start;
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kDeadlineExceeded,
                               AllOf(HasSubstr("etcd"), HasSubstr(closed.address()),
                                     HasSubstr("connection refused"))));
  EXPECT_LT(took, absl::Seconds(3));  // the old code took 5 s
}

TEST(DiscoveryTimeoutTest, SilentEtcdEndsByTheTimeout) {
  SilentListener silent;
  ASSERT_GT(silent.port(), 0);
  const absl::Time start = absl::Now();
  const absl::Status status = ConnectThroughEtcd(silent.address(), absl::Seconds(1));
  const absl::Duration took = absl::Now() - start;
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kDeadlineExceeded,
                               AllOf(HasSubstr("etcd"), HasSubstr(silent.address()),
                                     HasSubstr("no connection"))));
  EXPECT_LT(took, absl::Seconds(3));  // the old code took 5 s
}

TEST(DiscoveryTimeoutTest, LongerTimeoutIsNotRoundedUpToEtcdsOwn) {
  ClosedPort closed;
  ASSERT_GT(closed.port(), 0);
  const absl::Time start = absl::Now();
  const absl::Status status = ConnectThroughEtcd(closed.address(), absl::Seconds(6));
  const absl::Duration took = absl::Now() - start;
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr(closed.address())));
  EXPECT_LT(took, absl::Seconds(9));  // the old code took 10 s
}

TEST(DiscoveryTimeoutTest, BadEtcdEndpointIsInvalidArgument) {
  EXPECT_THAT(ConnectThroughEtcd("no port here", absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no port here")));
}

}  // namespace
}  // namespace pserver
