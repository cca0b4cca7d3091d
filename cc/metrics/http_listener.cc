#include "cc/metrics/http_listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/metrics/poll_deadline.h"
#include "absl/strings/str_split.h"
#include "cc/rpc/byte_stream.h"

namespace pserver {
namespace metrics {
namespace {

std::string Reply(absl::string_view status, absl::string_view body,
                  absl::string_view extra_headers = "") {
  return absl::StrCat("HTTP/1.1 ", status, "\r\n", extra_headers,
                      "Content-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
}

// Sends all of `bytes` (the socket's SO_SNDTIMEO bounds each wait); false
// when the peer is gone or too slow.
bool SendAll(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// The reply to a complete request head (request line and headers).
std::string Answer(absl::string_view head, const MetricsHttpListener::Page& page) {
  const absl::string_view line = head.substr(0, head.find("\r\n"));
  const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.")) {
    return Reply("400 Bad Request", "not an HTTP/1.x request line\n");
  }
  if (parts[0] != "GET") {
    return Reply("405 Method Not Allowed", "only GET /metrics is served\n", "Allow: GET\r\n");
  }
  const absl::string_view path = parts[1].substr(0, parts[1].find('?'));
  if (path != "/metrics") return Reply("404 Not Found", "only GET /metrics is served\n");
  return Reply("200 OK", page(), "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n");
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpListener>> MetricsHttpListener::Start(
    const MetricsHttpOptions& options, Page page) {
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics max_connections must be >= 1, got ", options.max_connections));
  }
  if (options.max_request_bytes < 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics max_request_bytes must be >= 64, got ", options.max_request_bytes));
  }
  if (options.io_timeout < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat("metrics io_timeout must be at least 1ms, got ",
                                                   absl::FormatDuration(options.io_timeout)));
  }
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics port must be in [0, 65535], got ", options.port));
  }
  int port = options.port;
  absl::StatusOr<int> listen_fd = ListenTcp(options.host, &port);
  if (!listen_fd.ok()) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", options.host, ":",
                                               options.port, ": ", listen_fd.status().message()));
  }
  fcntl(*listen_fd, F_SETFL, fcntl(*listen_fd, F_GETFL) | O_NONBLOCK);
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    close(*listen_fd);
    return absl::InternalError(absl::StrCat("metrics: eventfd: ", strerror(errno)));
  }
  std::unique_ptr<MetricsHttpListener> listener(
      new MetricsHttpListener(options, std::move(page), *listen_fd, wake_fd, port));
  listener->accept_thread_ = std::thread([raw = listener.get()] { raw->AcceptLoop(); });
  return listener;
}

MetricsHttpListener::MetricsHttpListener(const MetricsHttpOptions& options, Page page,
                                         int listen_fd, int wake_fd, int port)
    : options_(options), page_(std::move(page)), listen_fd_(listen_fd), wake_fd_(wake_fd),
      port_(port) {}

MetricsHttpListener::~MetricsHttpListener() {
  Stop();
  close(wake_fd_);
}

void MetricsHttpListener::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR) return;
    if (fds[1].revents != 0) return;
    if (fds[0].revents == 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      // EMFILE and the like: wait a little (or for Stop) rather than spin.
      if (errno != EAGAIN && errno != EINTR) poll(&fds[1], 1, 100);
      continue;
    }
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      close(fd);
      return;
    }
    if (Reap() >= options_.max_connections) {
      refused_connections_.fetch_add(1, std::memory_order_relaxed);
      const std::string busy = Reply("503 Service Unavailable", "too many metrics connections\n");
      send(fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      close(fd);
      continue;
    }
    Connection& connection = connections_.emplace_back();
    connection.fd = fd;
    connection.thread = std::thread([this, &connection] { Serve(&connection); });
  }
}

int MetricsHttpListener::Reap() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (it->done.load(std::memory_order_acquire)) {
      it->thread.join();
      close(it->fd);  // closed only here: Stop may still shut it down until then
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
  return static_cast<int>(connections_.size());
}

void MetricsHttpListener::Serve(Connection* connection) {
  const int fd = connection->fd;
  const absl::Time deadline = absl::Now() + options_.io_timeout;
  std::string request;
  std::string reply;
  char buffer[2048];
  while (reply.empty()) {
    const size_t end = request.find("\r\n\r\n");
    if (end != std::string::npos && end + 4 <= options_.max_request_bytes) {
      reply = Answer(absl::string_view(request).substr(0, end), page_);
      break;
    }
    if (request.size() > options_.max_request_bytes) {
      too_large_.fetch_add(1, std::memory_order_relaxed);
      reply = Reply("431 Request Header Fields Too Large",
                    absl::StrCat("a request may have at most ", options_.max_request_bytes,
                                 " bytes of line and headers\n"));
      break;
    }
    pollfd p = {fd, POLLIN, 0};
    const int ready = poll(&p, 1, PollMillisUntil(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      timed_out_.fetch_add(1, std::memory_order_relaxed);
      reply = Reply("408 Request Timeout", "the request took too long\n");
      break;
    }
    const ssize_t n = ready < 0 ? -1 : recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;  // gone (or Stop shut the socket down)
    request.append(buffer, static_cast<size_t>(n));
  }
  if (!reply.empty()) {
    // The reply too must be taken within io_timeout (each wait of send).
    const int64_t micros = absl::ToInt64Microseconds(options_.io_timeout);
    timeval timeout{static_cast<time_t>(micros / 1000000), static_cast<suseconds_t>(micros % 1000000)};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    SendAll(fd, reply);
    shutdown(fd, SHUT_WR);
  }
  connection->done.store(true, std::memory_order_release);
}

void MetricsHttpListener::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  if (accept_thread_.joinable()) accept_thread_.join();
  close(listen_fd_);  // new connections are refused from now on
  listen_fd_ = -1;
  std::list<Connection> connections;
  {
    absl::MutexLock lock(&mu_);
    for (Connection& c : connections_) shutdown(c.fd, SHUT_RDWR);
    connections.swap(connections_);
  }
  for (Connection& c : connections) {
    c.thread.join();
    close(c.fd);
  }
}

}  // namespace metrics
}  // namespace pserver
