#include "cc/server/listener.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/log/log.h"
#include "grpcpp/server_posix.h"

namespace pserver {
namespace {

// How long to wait before accepting again when the process is out of
// descriptors or memory.
constexpr int kRetryMillis = 100;

int BoundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return 0;
}

// A listening socket on the first address of `host` that binds; -1 if none.
int ListenOn(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* addresses = nullptr;
  if (getaddrinfo(host.c_str(), absl::StrCat(port).c_str(), &hints, &addresses) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = addresses; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(addresses);
  return fd;
}

// The lowest free descriptor is the one accept returns, so a descriptor
// number at or above this leaves fewer than `reserve` free.
int64_t FirstReservedFd(int reserve) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return INT64_MAX;
  }
  return static_cast<int64_t>(limit.rlim_cur) - reserve;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Listener>> Listener::Bind(const std::string& host, int port,
                                                         int reserve_fds,
                                                         absl::Duration handshake_timeout) {
  const int listen_fd = ListenOn(host, port);
  const int port_bound = listen_fd >= 0 ? BoundPort(listen_fd) : 0;
  if (port_bound == 0) {
    if (listen_fd >= 0) close(listen_fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", host, ":", port, " (address in use or not local?)"));
  }
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    const int e = errno;
    close(listen_fd);
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(e)));
  }
  return std::unique_ptr<Listener>(
      new Listener(listen_fd, wake_fd, port_bound, reserve_fds, handshake_timeout));
}

Listener::Listener(int listen_fd, int wake_fd, int port, int reserve_fds,
                   absl::Duration handshake_timeout)
    : listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      port_(port),
      reserve_fds_(reserve_fds),
      handshake_timeout_(handshake_timeout) {}

Listener::~Listener() {
  Stop();
  close(wake_fd_);
}

void Listener::Start(grpc::Server* server) {
  thread_ = std::thread([this, server] { AcceptLoop(server); });
}

void Listener::Stop() {
  if (stopping_.exchange(true)) return;
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) < 0) {
    // The counter cannot overflow from one write; nothing else can fail here.
  }
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
}

void Listener::PauseUnlessStopped(int millis) {
  pollfd wake = {wake_fd_, POLLIN, 0};
  poll(&wake, 1, millis);
}

void Listener::LogRateLimited(const std::string& message) {
  const int64_t now = absl::ToUnixMicros(absl::Now());
  if (now - last_log_micros_ < 10'000'000) return;
  last_log_micros_ = now;
  log::Default().Log(log::Level::kWarning, "", message);
}

void Listener::AcceptLoop(grpc::Server* server) {
  // Accepted connections that have not sent a byte yet, with their deadlines.
  std::vector<std::pair<int, absl::Time>> pending;
  std::vector<pollfd> fds;
  while (!stopping_.load()) {
    absl::Time next_deadline = absl::InfiniteFuture();
    fds.assign({{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}});
    for (const auto& [fd, deadline] : pending) {
      fds.push_back({fd, POLLIN, 0});
      next_deadline = std::min(next_deadline, deadline);
    }
    const int timeout_ms =
        next_deadline == absl::InfiniteFuture()
            ? -1
            : static_cast<int>(std::clamp<int64_t>(
                  absl::ToInt64Milliseconds(next_deadline - absl::Now()) + 1, 0, 60'000));
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      LogRateLimited(absl::StrCat("poll: ", std::strerror(errno)));
      PauseUnlessStopped(kRetryMillis);
      continue;
    }
    if (fds[1].revents != 0) break;
    // Hand over the connections that spoke (the bytes wait in the socket
    // for gRPC); close those that stayed silent past their deadline.
    const absl::Time now = absl::Now();
    std::vector<std::pair<int, absl::Time>> still_pending;
    for (size_t i = 0; i < pending.size(); ++i) {
      const int fd = pending[i].first;
      if (fds[i + 2].revents != 0) {
        grpc::AddInsecureChannelFromFd(server, fd);
      } else if (now >= pending[i].second) {
        close(fd);
        silent_closed_.fetch_add(1);
      } else {
        still_pending.push_back(pending[i]);
      }
    }
    pending.swap(still_pending);
    if (fds[0].revents != 0) AcceptAll(&pending);
  }
  for (const auto& entry : pending) close(entry.first);
}

void Listener::AcceptAll(std::vector<std::pair<int, absl::Time>>* pending) {
  while (!stopping_.load()) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // EMFILE, ENFILE, ENOBUFS, ENOMEM: the connection waits in the
      // backlog until descriptors are free again.
      LogRateLimited(
          absl::StrCat("accepting a connection failed (", std::strerror(errno), "); retrying"));
      PauseUnlessStopped(kRetryMillis);
      return;
    }
    if (fd >= FirstReservedFd(reserve_fds_)) {
      close(fd);
      refused_.fetch_add(1);
      LogRateLimited(absl::StrCat("closed a new connection: fewer than ", reserve_fds_,
                                  " file descriptors would be left (raise ulimit -n)"));
      continue;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    pending->emplace_back(fd, absl::Now() + handshake_timeout_);
  }
}

}  // namespace pserver
