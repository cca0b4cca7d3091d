#include "cc/rpc/byte_stream.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <ctime>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pserver {
namespace {

int64_t MonotonicNanos() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
}

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

void NoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// The sockaddr of abstract socket `name`, and its length.
socklen_t AbstractAddress(const std::string& name, sockaddr_un* address) {
  std::memset(address, 0, sizeof(*address));
  address->sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof(address->sun_path) - 1);
  std::memcpy(address->sun_path + 1, name.data(), n);  // sun_path[0] = 0: abstract
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

void SetSendTimeout(int fd, absl::Duration timeout) {
  timeval tv = absl::ToTimeval(std::max(timeout, absl::ZeroDuration()));
  if (timeout > absl::ZeroDuration() && tv.tv_sec == 0 && tv.tv_usec == 0) tv.tv_usec = 1;
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

}  // namespace

void SetSocketBuffers(int fd) {
  const int bytes = kSocketBufferBytes;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

SocketStream::SocketStream(int fd) : fd_(fd), buffer_(kBufferBytes) {}

SocketStream::~SocketStream() { close(fd_); }

namespace {

// Sends `parts` in order: all of them (`wait`), or what the socket takes
// now. The bytes sent.
absl::StatusOr<size_t> SendParts(int fd, absl::Span<const absl::string_view> parts, bool wait) {
  std::vector<iovec> iov;
  iov.reserve(parts.size());
  for (absl::string_view part : parts) {
    if (!part.empty()) iov.push_back({const_cast<char*>(part.data()), part.size()});
  }
  const int flags = MSG_NOSIGNAL | (wait ? 0 : MSG_DONTWAIT);
  size_t total = 0;
  size_t next = 0;
  while (next < iov.size()) {
    msghdr message{};
    message.msg_iov = &iov[next];
    message.msg_iovlen = std::min<size_t>(iov.size() - next, IOV_MAX);
    const ssize_t sent = sendmsg(fd, &message, flags);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (!wait && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      return Errno("bulk channel write");
    }
    total += static_cast<size_t>(sent);
    size_t left = static_cast<size_t>(sent);
    while (next < iov.size() && left >= iov[next].iov_len) left -= iov[next++].iov_len;
    if (left > 0) {
      iov[next].iov_base = static_cast<char*>(iov[next].iov_base) + left;
      iov[next].iov_len -= left;
    }
  }
  return total;
}

}  // namespace

absl::Status SocketStream::Write(absl::Span<const absl::string_view> parts) {
  return SendParts(fd_, parts, /*wait=*/true).status();
}

absl::StatusOr<size_t> SocketStream::WriteSome(absl::Span<const absl::string_view> parts) {
  return SendParts(fd_, parts, /*wait=*/false);
}

absl::Status SocketStream::Read(char* dest, size_t n) {
  const size_t buffered = std::min(n, end_ - begin_);
  std::memcpy(dest, buffer_.data() + begin_, buffered);
  begin_ += buffered;
  dest += buffered;
  n -= buffered;
  while (n > 0) {
    // Large reads go straight to `dest`; small ones through the buffer.
    const bool direct = n >= kBufferBytes / 2;
    char* into = direct ? dest : buffer_.data();
    const ssize_t got = Receive(into, direct ? n : kBufferBytes, /*may_spin=*/!direct);
    if (got < 0) {
      if (errno == EINTR) continue;
      return Errno("bulk channel read");
    }
    if (got == 0) return absl::UnavailableError("bulk channel closed by the peer");
    if (direct) {
      dest += got;
      n -= static_cast<size_t>(got);
      continue;
    }
    const size_t take = std::min(n, static_cast<size_t>(got));
    std::memcpy(dest, buffer_.data(), take);
    dest += take;
    n -= take;
    begin_ = take;
    end_ = static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

void SocketStream::Shutdown() { shutdown(fd_, SHUT_RDWR); }

void SocketStream::SpinBeforeBlocking(ReadSpin spin) {
  if (!spin.cores_idle) spin.cores_idle = RunnableThreadsFitCores;
  spin_ = std::move(spin);
}

bool SocketStream::ShouldSpin() {
  if (spin_.most <= absl::ZeroDuration()) return false;
  if (skip_left_ > 0) {
    --skip_left_;
    ++spin_stats_.backed_off;
    return false;
  }
  if (!spin_.cores_idle()) {
    ++spin_stats_.busy;
    return false;
  }
  return true;
}

ssize_t SocketStream::Receive(char* into, size_t n, bool may_spin) {
  if (may_spin && ShouldSpin()) {
    const int64_t until = MonotonicNanos() + absl::ToInt64Nanoseconds(spin_.most);
    do {
      const ssize_t got = recv(fd_, into, n, MSG_DONTWAIT);
      if (got >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        ++spin_stats_.hits;
        misses_in_row_ = 0;
        back_off_ = 1;
        return got;
      }
    } while (MonotonicNanos() < until);
    ++spin_stats_.misses;
    if (++misses_in_row_ >= 2) {  // a peer that does not answer at once: sleep for a while
      misses_in_row_ = 0;
      skip_left_ = back_off_;
      back_off_ = std::min(back_off_ * 2, 256);
    }
  }
  return recv(fd_, into, n, 0);
}

bool LoadavgFitsCores(absl::string_view text, long cores) {
  // "0.50 0.40 0.30 R/T last": R threads runnable now (the caller among them).
  const std::vector<absl::string_view> fields = absl::StrSplit(text, ' ', absl::SkipEmpty());
  if (fields.size() < 4) return false;
  const size_t slash = fields[3].find('/');
  long runnable = 0;
  if (slash == absl::string_view::npos || !absl::SimpleAtoi(fields[3].substr(0, slash), &runnable)) {
    return false;
  }
  return runnable <= cores;
}

bool RunnableThreadsFitCores() {
  static std::atomic<int64_t> checked_at{std::numeric_limits<int64_t>::min()};
  static std::atomic<bool> fit{false};
  static const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const int64_t now = MonotonicNanos();
  int64_t last = checked_at.load(std::memory_order_relaxed);
  if (now - last < 1'000'000 ||
      !checked_at.compare_exchange_strong(last, now, std::memory_order_relaxed)) {
    return fit.load(std::memory_order_relaxed);  // checked lately, or another thread checks
  }
  bool answer = false;
  const int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char text[128];
    const ssize_t got = read(fd, text, sizeof(text));
    close(fd);
    if (got > 0) answer = LoadavgFitsCores(absl::string_view(text, got), cores);
  }
  fit.store(answer, std::memory_order_relaxed);
  return answer;
}

namespace {

// A connected TCP socket to `host`:`port` (each resolved address in turn),
// connect() bounded by `timeout`. On failure `*refused` says whether every
// address answered ECONNREFUSED (nothing listens there).
absl::StatusOr<int> DialTcp(const std::string& host, int port, absl::Duration timeout,
                            bool* refused) {
  *refused = false;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("bulk channel: cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError(absl::StrCat("bulk channel: no address for ", host));
  bool all_refused = true;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last = Errno("bulk channel socket");
      all_refused = false;
      continue;
    }
    SetSocketBuffers(fd);
    SetSendTimeout(fd, timeout);  // bounds connect()
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      all_refused = all_refused && errno == ECONNREFUSED;
      last = Errno(absl::StrCat("bulk channel connect to ", host, ":", port));
      close(fd);
      continue;
    }
    SetSendTimeout(fd, absl::ZeroDuration());
    freeaddrinfo(found);
    return fd;
  }
  freeaddrinfo(found);
  *refused = all_refused;
  return last;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ByteStream>> ConnectTcp(const std::string& host, int port,
                                                       absl::Duration timeout) {
  bool refused = false;
  absl::StatusOr<int> fd = DialTcp(host, port, timeout, &refused);
  if (!fd.ok()) return fd.status();
  NoDelay(*fd);
  return std::unique_ptr<ByteStream>(new SocketStream(*fd));
}

absl::StatusOr<bool> TcpConnectionRefused(absl::string_view target, absl::Duration timeout) {
  const std::string host = TargetHost(target);
  const size_t colon = target.rfind(':');
  int port = 0;
  if (host.empty() || colon == absl::string_view::npos ||
      !absl::SimpleAtoi(target.substr(colon + 1), &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", target, "' is not a TCP address host:port or [v6]:port"));
  }
  bool refused = false;
  absl::StatusOr<int> fd = DialTcp(host, port, timeout, &refused);
  if (fd.ok()) {
    close(*fd);
    return false;
  }
  return refused;
}

absl::StatusOr<std::unique_ptr<ByteStream>> ConnectAbstractUnix(const std::string& name) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("bulk channel socket");
  SetSocketBuffers(fd);
  sockaddr_un address;
  const socklen_t length = AbstractAddress(name, &address);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), length) != 0) {
    absl::Status status = Errno(absl::StrCat("bulk channel connect to @", name));
    close(fd);
    return status;
  }
  return std::unique_ptr<ByteStream>(new SocketStream(fd));
}

absl::StatusOr<int> ListenTcp(const std::string& host, int* port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(*port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("bulk channel: cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  absl::Status status;
  if (fd >= 0) SetSocketBuffers(fd);  // accepted TCP sockets inherit them
  if (fd < 0) {
    status = Errno("bulk channel socket");
  } else if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
             bind(fd, found->ai_addr, found->ai_addrlen) != 0 || listen(fd, 128) != 0) {
    status = Errno(absl::StrCat("bulk channel: cannot listen on ", host, ":", *port));
  }
  freeaddrinfo(found);
  if (!status.ok()) {
    if (fd >= 0) close(fd);
    return status;
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  *port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return fd;
}

absl::StatusOr<int> ListenAbstractUnix(const std::string& name) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("bulk channel socket");
  sockaddr_un address;
  const socklen_t length = AbstractAddress(name, &address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0 || listen(fd, 128) != 0) {
    absl::Status status = Errno(absl::StrCat("bulk channel: cannot listen on @", name));
    close(fd);
    return status;
  }
  return fd;
}

std::string TargetHost(absl::string_view target) {
  if (absl::StartsWith(target, "unix:")) return "";
  if (absl::StartsWith(target, "[")) {
    const size_t close = target.find(']');
    return close == absl::string_view::npos ? "" : std::string(target.substr(1, close - 1));
  }
  const size_t colon = target.rfind(':');
  return colon == absl::string_view::npos ? "" : std::string(target.substr(0, colon));
}

}  // namespace pserver
