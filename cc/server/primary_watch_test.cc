// DialRefused and PrimaryWatch against a listening socket on 127.0.0.1 that
// the test opens and closes (no timing: every wait is a bounded loop).
#include "cc/server/primary_watch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

// A listening socket on 127.0.0.1, port chosen by the kernel; -1 on failure.
int Listen(int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

TEST(DialRefused, OnlyARefusedDialCounts) {
  int port = 0;
  const int fd = Listen(&port);
  ASSERT_GE(fd, 0);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  EXPECT_FALSE(DialRefused(address, absl::Seconds(10)));  // something listens
  close(fd);
  EXPECT_TRUE(DialRefused(address, absl::Seconds(10)));   // nothing does
}

TEST(DialRefused, AnAddressThatDoesNotParseIsNotEvidence) {
  for (const char* address : {"", "127.0.0.1", "127.0.0.1:", "127.0.0.1:x", "127.0.0.1:70000",
                              ":80", "[]:80"}) {
    EXPECT_FALSE(DialRefused(address, absl::Seconds(1))) << address;
  }
}

TEST(PrimaryWatch, AListeningPrimaryIsNotGoneAClosedOneIs) {
  int port = 0;
  const int fd = Listen(&port);
  ASSERT_GE(fd, 0);
  PrimaryWatch watch(absl::StrCat("127.0.0.1:", port));
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(watch.Gone(absl::Milliseconds(10)));
  close(fd);
  bool gone = false;
  for (int i = 0; i < 1000 && !gone; ++i) gone = watch.Gone(absl::Milliseconds(20));
  EXPECT_TRUE(gone);
}

}  // namespace
}  // namespace pserver
