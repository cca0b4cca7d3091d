#include "cc/rpc/byte_stream.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>

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

// A connected pair: `reader` (a SocketStream) and the raw peer descriptor.
struct Pair {
  Pair() {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    reader = std::make_unique<SocketStream>(fds[0]);
    peer = fds[1];
  }
  ~Pair() {
    if (peer >= 0) close(peer);
  }
  void Send(absl::string_view bytes) const {
    ASSERT_EQ(write(peer, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  std::unique_ptr<SocketStream> reader;
  int peer = -1;
};

ReadSpin Spin(absl::Duration most, bool cores_idle) {
  return ReadSpin{most, [cores_idle] { return cores_idle; }};
}

// With nothing to read, a read ends after SO_RCVTIMEO (1 ms) instead of
// blocking: a miss, whatever the machine's load.
void SetReadTimeout(int fd) {
  timeval tv{0, 1000};
  ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
}

TEST(ReadSpinTest, BytesThereWhileSpinningAreReadAndTheEndIsSeen) {
  Pair pair;
  pair.reader->SpinBeforeBlocking(Spin(absl::Milliseconds(1), true));
  pair.Send("header and a small payload");
  char got[26];
  ASSERT_OK(pair.reader->Read(got, sizeof(got)));
  EXPECT_EQ(absl::string_view(got, sizeof(got)), "header and a small payload");
  EXPECT_EQ(pair.reader->spin_stats().hits, 1u);
  EXPECT_EQ(pair.reader->spin_stats().misses, 0u);
  close(pair.peer);
  pair.peer = -1;
  EXPECT_THAT(pair.reader->Read(got, 1), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

TEST(ReadSpinTest, NoSpinWhileNoCoreIsFree) {
  Pair pair;
  pair.reader->SpinBeforeBlocking(Spin(absl::Milliseconds(1), false));
  pair.Send("x");
  char got;
  ASSERT_OK(pair.reader->Read(&got, 1));
  EXPECT_EQ(pair.reader->spin_stats().hits, 0u);
  EXPECT_EQ(pair.reader->spin_stats().busy, 1u);
}

TEST(ReadSpinTest, ZeroNeverSpins) {
  Pair pair;
  pair.reader->SpinBeforeBlocking(Spin(absl::ZeroDuration(), true));
  pair.Send("x");
  char got;
  ASSERT_OK(pair.reader->Read(&got, 1));
  const SocketStream::SpinStats& stats = pair.reader->spin_stats();
  EXPECT_EQ(stats.hits + stats.misses + stats.busy + stats.backed_off, 0u);
}

TEST(ReadSpinTest, MissesInARowStopSpinningForLongerEachTime) {
  Pair pair;
  SetReadTimeout(pair.reader->fd());
  pair.reader->SpinBeforeBlocking(Spin(absl::Microseconds(1), true));
  char got;
  // Nothing is ever sent: every read spins (or not) and then times out.
  // Misses 1, 2; skip 1; misses 3, 4; skip 2; misses 5, 6; skip 4.
  for (int i = 0; i < 13; ++i) {
    EXPECT_THAT(pair.reader->Read(&got, 1), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  }
  EXPECT_EQ(pair.reader->spin_stats().misses, 6u);
  EXPECT_EQ(pair.reader->spin_stats().backed_off, 7u);
  // A hit ends the back-off: the next two misses skip one read again.
  pair.Send("x");
  ASSERT_OK(pair.reader->Read(&got, 1));
  EXPECT_EQ(pair.reader->spin_stats().hits, 1u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_THAT(pair.reader->Read(&got, 1), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  }
  EXPECT_EQ(pair.reader->spin_stats().misses, 8u);
  EXPECT_EQ(pair.reader->spin_stats().backed_off, 8u);
}

TEST(ReadSpinTest, ALargeReadNeverSpins) {
  Pair pair;
  pair.reader->SpinBeforeBlocking(Spin(absl::Milliseconds(1), true));
  std::string big(256 << 10, 'b');
  std::thread writer([&] { pair.Send(big); });
  std::string got(big.size(), '\0');
  ASSERT_OK(pair.reader->Read(got.data(), got.size()));
  writer.join();
  EXPECT_EQ(got, big);
  EXPECT_EQ(pair.reader->spin_stats().hits + pair.reader->spin_stats().misses, 0u);
}

TEST(ReadSpinTest, ACoreIsFreeWhileRunnableThreadsDoNotExceedTheCores) {
  EXPECT_TRUE(LoadavgFitsCores("0.50 0.40 0.30 2/301 4242\n", 2));
  EXPECT_TRUE(LoadavgFitsCores("9.00 8.00 7.00 1/301 4242\n", 2));  // the average is history
  EXPECT_FALSE(LoadavgFitsCores("0.50 0.40 0.30 3/301 4242\n", 2));
  EXPECT_TRUE(LoadavgFitsCores("0.50 0.40 0.30 3/301 4242\n", 16));
  EXPECT_FALSE(LoadavgFitsCores("", 2));
  EXPECT_FALSE(LoadavgFitsCores("0.50 0.40 0.30 x/301 4242", 2));
}

}  // namespace
}  // namespace pserver
