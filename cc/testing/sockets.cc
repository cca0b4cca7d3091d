#include "cc/testing/sockets.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "absl/strings/numbers.h"

namespace pserver {

std::vector<int> TcpSocketsConnectedTo(int port) {
  std::vector<int> fds;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", error)) {
    int fd = -1;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &fd)) continue;
    sockaddr_storage peer{};
    socklen_t size = sizeof(peer);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &size) != 0) continue;
    int peer_port = -1;
    if (peer.ss_family == AF_INET) {
      peer_port = ntohs(reinterpret_cast<const sockaddr_in&>(peer).sin_port);
    } else if (peer.ss_family == AF_INET6) {
      peer_port = ntohs(reinterpret_cast<const sockaddr_in6&>(peer).sin6_port);
    }
    if (peer_port == port) fds.push_back(fd);
  }
  return fds;
}

int UnsentBytesLimitOf(int fd) {
  int bytes = 0;
  socklen_t size = sizeof(bytes);
  if (getsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &bytes, &size) != 0) return -1;
  return bytes;
}

}  // namespace pserver
