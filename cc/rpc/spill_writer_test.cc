#include "cc/rpc/spill_writer.h"

#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>

#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;

// A connected pair: `writer` (a SocketStream) and the raw peer descriptor,
// with small buffers, so that a few hundred KiB fill them.
struct Pair {
  Pair() {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    const int small = 16 << 10;
    setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
    setsockopt(fds[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    writer = std::make_unique<SocketStream>(fds[0]);
    peer = fds[1];
  }
  ~Pair() {
    if (peer >= 0) close(peer);
  }
  std::unique_ptr<SocketStream> writer;
  int peer = -1;
};

std::string Pattern(size_t n, char seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 7 + i / 251);
  return s;
}

std::string ReadAll(int fd, size_t n) {
  std::string got(n, '\0');
  size_t done = 0;
  while (done < n) {
    const ssize_t r = read(fd, got.data() + done, n - done);
    if (r <= 0) break;
    done += static_cast<size_t>(r);
  }
  got.resize(done);
  return got;
}

TEST(SpillWriterTest, AddNeverWaitsForAPeerThatDoesNotReadAndKeepsTheOrder) {
  Pair pair;
  SpillWriter out(pair.writer.get());
  std::string a = Pattern(300 << 10, 1);
  std::string b = Pattern(200 << 10, 2);
  const std::string want = a + b + "end";
  // Nobody reads yet: both Adds return (this thread would hang otherwise),
  // the socket taking part and the rest copied.
  out.Add(a);
  // The caller may change its memory once Add returns.
  a.assign(a.size(), 'x');
  out.Add(b);
  b.assign(b.size(), 'y');
  out.Add("end");
  EXPECT_EQ(out.added(), want.size());
  EXPECT_GT(out.spilled(), 0u);
  EXPECT_LT(out.spilled(), want.size());
  std::string got;
  std::thread reader([&] { got = ReadAll(pair.peer, want.size()); });
  EXPECT_OK(out.Finish());
  reader.join();
  EXPECT_TRUE(got == want) << "received bytes differ from those added";
}

TEST(SpillWriterTest, WhatTheSocketTakesAtOnceIsNotCopied) {
  Pair pair;
  SpillWriter out(pair.writer.get());
  out.Add("a small frame");
  EXPECT_EQ(out.spilled(), 0u);
  EXPECT_OK(out.Finish());
  EXPECT_EQ(ReadAll(pair.peer, 13), "a small frame");
}

TEST(SpillWriterTest, APeerThatLeftFailsFinishAndAddDoesNotBlock) {
  Pair pair;
  SpillWriter out(pair.writer.get());
  close(pair.peer);
  pair.peer = -1;
  const std::string block = Pattern(1 << 20, 3);
  out.Add(block);
  out.Add(block);
  EXPECT_THAT(out.Finish(), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

TEST(SpillWriterTest, APeerReadingMeanwhileGetsEveryByteInOrder) {
  Pair pair;
  std::string want;
  for (int i = 0; i < 64; ++i) want += Pattern(1000 + 997 * i, static_cast<char>(i));
  std::string got;
  std::thread reader([&] { got = ReadAll(pair.peer, want.size()); });
  SpillWriter out(pair.writer.get());
  size_t at = 0;
  for (int i = 0; i < 64; ++i) {
    const size_t n = 1000 + 997 * i;
    out.Add(absl::string_view(want).substr(at, n));
    at += n;
  }
  EXPECT_OK(out.Finish());
  reader.join();
  EXPECT_EQ(out.added(), want.size());
  EXPECT_TRUE(got == want) << "received bytes differ from those added";
}

}  // namespace
}  // namespace pserver
