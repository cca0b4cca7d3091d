#include "cc/etcd/testing/fake_endpoints.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace pserver::testing {

ClosedPort::ClosedPort() {
  fd_ = socket(AF_INET, SOCK_STREAM, 0);
  if (fd_ < 0) return;
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return;
  }
  port_ = ntohs(address.sin_port);
}

ClosedPort::~ClosedPort() {
  if (fd_ >= 0) close(fd_);
}

std::string ClosedPort::address() const { return absl::StrCat("127.0.0.1:", port_); }

SilentListener::SilentListener() {
  if (port_ != 0 && listen(fd_, 64) != 0) port_ = 0;
}

GarbageServer::GarbageServer(std::string reply) : reply_(std::move(reply)) {
  if (port_ == 0 || listen(fd_, 64) != 0) {
    port_ = 0;
    return;
  }
  thread_ = std::thread([this] { Serve(); });
}

GarbageServer::~GarbageServer() {
  stopping_.store(true);
  if (thread_.joinable()) thread_.join();
}

void GarbageServer::Serve() {
  // Polls in short slices so that the destructor is noticed promptly.
  while (!stopping_.load()) {
    pollfd p = {fd_, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    const int conn = accept(fd_, nullptr, nullptr);
    if (conn < 0) continue;
    connections_.fetch_add(1);
    // Read what the client sent first (its HTTP/2 preface), so that closing
    // with unread data does not turn the reply into a reset.
    pollfd c = {conn, POLLIN, 0};
    char buffer[4096];
    if (poll(&c, 1, 200) > 0) (void)!read(conn, buffer, sizeof(buffer));
    (void)!write(conn, reply_.data(), reply_.size());
    shutdown(conn, SHUT_WR);
    if (poll(&c, 1, 200) > 0) (void)!read(conn, buffer, sizeof(buffer));
    close(conn);
  }
}

}  // namespace pserver::testing
