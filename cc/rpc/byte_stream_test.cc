#include "cc/rpc/byte_stream.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(10);

TEST(TcpConnectionRefusedTest, AListeningPortIsNotRefused) {
  int port = 0;
  ASSERT_OK_AND_ASSIGN(int fd, ListenTcp("127.0.0.1", &port));
  ASSERT_OK_AND_ASSIGN(bool refused,
                       TcpConnectionRefused(absl::StrCat("127.0.0.1:", port), kTimeout));
  EXPECT_FALSE(refused);
  close(fd);
}

// A port bound but not listening: the kernel refuses connections to it, and
// the test holds it, so no other process can take it meanwhile.
TEST(TcpConnectionRefusedTest, APortNobodyListensOnIsRefused) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  socklen_t length = sizeof address;
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int port = ntohs(address.sin_port);
  ASSERT_OK_AND_ASSIGN(bool refused,
                       TcpConnectionRefused(absl::StrCat("127.0.0.1:", port), kTimeout));
  EXPECT_TRUE(refused);
  close(fd);
}

TEST(TcpConnectionRefusedTest, AnAddressThatIsNotHostPortIsInvalid) {
  for (const std::string target : {"", "127.0.0.1", "127.0.0.1:", "127.0.0.1:0",
                                   "127.0.0.1:65536", "127.0.0.1:x", ":80", "unix:/tmp/s",
                                   "[::1]"}) {
    EXPECT_THAT(TcpConnectionRefused(target, kTimeout),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a TCP address")))
        << "'" << target << "'";
  }
}

}  // namespace
}  // namespace pserver
