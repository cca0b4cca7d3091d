#include "cc/metrics/http_listener.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cc/metrics/http_client.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver::metrics {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;

absl::Time Deadline() { return absl::Now() + absl::Seconds(60); }

// A connected socket that has sent `bytes` (maybe nothing) and keeps quiet.
int OpenQuiet(int port, absl::string_view bytes = "") {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  if (!bytes.empty()) {
    EXPECT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), bytes.size());
  }
  return fd;
}

TEST(MetricsHttpListenerTest, ServesThePageRenderedPerRequest) {
  std::atomic<int> renders{0};
  ASSERT_OK_AND_ASSIGN(auto http, MetricsHttpListener::Start({}, [&] {
                         return absl::StrCat("pages_total ", ++renders, "\n");
                       }));
  ASSERT_GT(http->port(), 0);
  ASSERT_OK_AND_ASSIGN(std::string reply,
                       HttpExchange("127.0.0.1", http->port(),
                                    "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", Deadline()));
  EXPECT_THAT(reply, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(reply, HasSubstr("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  EXPECT_THAT(reply, HasSubstr("Content-Length: 14\r\n"));
  EXPECT_TRUE(absl::EndsWith(reply, "\r\n\r\npages_total 1\n")) << reply;
  ASSERT_OK_AND_ASSIGN(std::string page,
                       HttpGet("127.0.0.1", http->port(), "/metrics?x=1", Deadline()));
  EXPECT_EQ(page, "pages_total 2\n");
}

TEST(MetricsHttpListenerTest, AnswersOnlyGetMetrics) {
  ASSERT_OK_AND_ASSIGN(auto http, MetricsHttpListener::Start({}, [] { return "x 1\n"; }));
  EXPECT_THAT(HttpGet("127.0.0.1", http->port(), "/", Deadline()),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("404 Not Found")));
  ASSERT_OK_AND_ASSIGN(std::string post,
                       HttpExchange("127.0.0.1", http->port(),
                                    "POST /metrics HTTP/1.1\r\n\r\n", Deadline()));
  EXPECT_THAT(post, StartsWith("HTTP/1.1 405 Method Not Allowed\r\n"));
  EXPECT_THAT(post, HasSubstr("Allow: GET\r\n"));
  ASSERT_OK_AND_ASSIGN(std::string garbage,
                       HttpExchange("127.0.0.1", http->port(), "hello\r\n\r\n", Deadline()));
  EXPECT_THAT(garbage, StartsWith("HTTP/1.1 400 Bad Request\r\n"));
}

TEST(MetricsHttpListenerTest, RefusesARequestLargerThanTheLimit) {
  MetricsHttpOptions options;
  options.max_request_bytes = 256;
  ASSERT_OK_AND_ASSIGN(auto http, MetricsHttpListener::Start(options, [] { return "x 1\n"; }));
  const std::string big =
      absl::StrCat("GET /metrics HTTP/1.1\r\nX-Pad: ", std::string(300, 'a'), "\r\n\r\n");
  ASSERT_OK_AND_ASSIGN(std::string reply,
                       HttpExchange("127.0.0.1", http->port(), big, Deadline()));
  EXPECT_THAT(reply, StartsWith("HTTP/1.1 431 "));
  EXPECT_EQ(http->too_large(), 1u);
  // A request within the limit is still served.
  EXPECT_OK(HttpGet("127.0.0.1", http->port(), "/metrics", Deadline()));
}

TEST(MetricsHttpListenerTest, ClosesARequestNotSentInTime) {
  MetricsHttpOptions options;
  options.io_timeout = absl::Milliseconds(100);
  ASSERT_OK_AND_ASSIGN(auto http, MetricsHttpListener::Start(options, [] { return "x 1\n"; }));
  // Half a request, then silence: answered 408 once io_timeout passes.
  ASSERT_OK_AND_ASSIGN(std::string reply,
                       HttpExchange("127.0.0.1", http->port(), "GET /metr", Deadline()));
  EXPECT_THAT(reply, StartsWith("HTTP/1.1 408 "));
  EXPECT_EQ(http->timed_out(), 1u);
}

TEST(MetricsHttpListenerTest, RefusesConnectionsOverTheLimitUntilOneCloses) {
  MetricsHttpOptions options;
  options.max_connections = 1;
  options.io_timeout = absl::Seconds(600);  // the held connection outlives the test
  ASSERT_OK_AND_ASSIGN(auto http, MetricsHttpListener::Start(options, [] { return "x 1\n"; }));
  const int held = OpenQuiet(http->port(), "GET /met");
  // Accepted in order: the second connection finds the first one held.
  ASSERT_OK_AND_ASSIGN(std::string busy,
                       HttpExchange("127.0.0.1", http->port(),
                                    "GET /metrics HTTP/1.1\r\n\r\n", Deadline()));
  EXPECT_THAT(busy, StartsWith("HTTP/1.1 503 "));
  EXPECT_EQ(http->refused_connections(), 1u);
  // The held one finishes its request and is served; then there is room again.
  const std::string rest = "rics HTTP/1.1\r\n\r\n";
  ASSERT_EQ(send(held, rest.data(), rest.size(), MSG_NOSIGNAL), rest.size());
  char buffer[256];
  std::string reply;
  for (ssize_t n; (n = recv(held, buffer, sizeof(buffer), 0)) > 0;) reply.append(buffer, n);
  close(held);
  EXPECT_THAT(reply, StartsWith("HTTP/1.1 200 OK\r\n"));
  // The served connection is reaped at the next accept: bounded retries.
  absl::StatusOr<std::string> page;
  for (int i = 0; i < 1000 && absl::Now() < Deadline(); ++i) {
    page = HttpGet("127.0.0.1", http->port(), "/metrics", Deadline());
    if (page.ok()) break;
  }
  ASSERT_OK(page);
  EXPECT_EQ(*page, "x 1\n");
}

TEST(MetricsHttpListenerTest, StopClosesConnectionsHeldOpen) {
  MetricsHttpOptions options;
  options.io_timeout = absl::Seconds(600);
  ASSERT_OK_AND_ASSIGN(auto http, MetricsHttpListener::Start(options, [] { return "x 1\n"; }));
  const int held = OpenQuiet(http->port());
  // Served (so its thread exists) before Stop: wait until a request gets through.
  ASSERT_OK(HttpGet("127.0.0.1", http->port(), "/metrics", Deadline()));
  http->Stop();  // returns although `held` never sends a byte
  char byte;
  EXPECT_LE(recv(held, &byte, 1, 0), 0);
  close(held);
  EXPECT_THAT(HttpGet("127.0.0.1", http->port(), "/metrics", Deadline()),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot connect")));
}

TEST(MetricsHttpListenerTest, RefusesBadOptions) {
  MetricsHttpOptions options;
  options.max_connections = 0;
  EXPECT_THAT(MetricsHttpListener::Start(options, [] { return ""; }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_connections")));
  options = {};
  options.max_request_bytes = 10;
  EXPECT_THAT(MetricsHttpListener::Start(options, [] { return ""; }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_request_bytes")));
  options = {};
  options.io_timeout = absl::ZeroDuration();
  EXPECT_THAT(MetricsHttpListener::Start(options, [] { return ""; }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("io_timeout")));
  options = {};
  options.host = "203.0.113.1";  // not an address of this host
  EXPECT_THAT(MetricsHttpListener::Start(options, [] { return ""; }),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("203.0.113.1")));
}

}  // namespace
}  // namespace pserver::metrics
