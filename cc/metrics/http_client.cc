#include "cc/metrics/http_client.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cc/metrics/poll_deadline.h"

namespace pserver {
namespace metrics {
namespace {

absl::StatusOr<int> Connect(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), absl::StrCat(port).c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool connected = fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0;
  const int error = errno;
  freeaddrinfo(found);
  if (!connected) {
    if (fd >= 0) close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot connect to ", host, ":", port, ": ", strerror(error)));
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::string> HttpExchange(const std::string& host, int port,
                                         absl::string_view request, absl::Time deadline) {
  absl::StatusOr<int> fd = Connect(host, port);
  if (!fd.ok()) return fd.status();
  absl::Status status;
  while (!request.empty()) {
    const ssize_t n = send(*fd, request.data(), request.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the server may answer (e.g. 431) and close before reading it all
    request.remove_prefix(static_cast<size_t>(n));
  }
  std::string reply;
  char buffer[4096];
  while (true) {
    pollfd p = {*fd, POLLIN, 0};
    const int ready = poll(&p, 1, PollMillisUntil(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      status = absl::DeadlineExceededError(absl::StrCat("no complete reply from ", host, ":", port,
                                                        " in time; got '", reply, "'"));
      break;
    }
    const ssize_t n = recv(*fd, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // ECONNRESET after a reply is still the end of it
    reply.append(buffer, static_cast<size_t>(n));
  }
  close(*fd);
  if (!status.ok()) return status;
  return reply;
}

absl::StatusOr<std::string> HttpGet(const std::string& host, int port, const std::string& path,
                                    absl::Time deadline) {
  absl::StatusOr<std::string> reply = HttpExchange(
      host, port, absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: ", host, "\r\n\r\n"), deadline);
  if (!reply.ok()) return reply.status();
  const size_t head_end = reply->find("\r\n\r\n");
  if (!absl::StartsWith(*reply, "HTTP/1.1 200 ") || head_end == std::string::npos) {
    return absl::UnavailableError(absl::StrCat("GET ", path, " from ", host, ":", port,
                                               " answered '", reply->substr(0, reply->find('\r')),
                                               "'"));
  }
  return reply->substr(head_end + 4);
}

}  // namespace metrics
}  // namespace pserver
