#include "cc/server/primary_watch.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"

namespace pserver {
namespace {

// "host:port" or "[v6]:port" into host and port; false when malformed.
bool SplitAddress(absl::string_view address, std::string* host, std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon + 1 == address.size()) return false;
  absl::string_view h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  uint32_t number = 0;
  if (h.empty() || !absl::SimpleAtoi(address.substr(colon + 1), &number) || number > 65535) {
    return false;
  }
  *host = std::string(h);
  *port = std::string(address.substr(colon + 1));
  return true;
}

// One non-blocking connect: 1 accepted, 0 refused, -1 anything else.
int DialOnce(const addrinfo& ai, absl::Duration timeout) {
  const int fd = socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai.ai_protocol);
  if (fd < 0) return -1;
  int result = -1;
  int error = 0;
  if (connect(fd, ai.ai_addr, ai.ai_addrlen) == 0) {
    result = 1;
  } else if (errno == ECONNREFUSED) {
    result = 0;
  } else if (errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(timeout));
    int polled = 0;
    do {
      polled = poll(&p, 1, ms);
    } while (polled < 0 && errno == EINTR);
    socklen_t length = sizeof(error);
    if (polled == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0) {
      result = error == 0 ? 1 : (error == ECONNREFUSED ? 0 : -1);
    }
  }
  close(fd);
  return result;
}

}  // namespace

bool DialRefused(const std::string& address, absl::Duration timeout) {
  std::string host;
  std::string port;
  if (!SplitAddress(address, &host, &port)) return false;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    return false;
  }
  bool refused = true;
  for (addrinfo* ai = found; ai != nullptr && refused; ai = ai->ai_next) {
    refused = DialOnce(*ai, timeout) == 0;
  }
  freeaddrinfo(found);
  return refused;
}

PrimaryWatch::PrimaryWatch(std::string address) : address_(std::move(address)) {
  grpc::ChannelArguments arguments;
  // Its own connection (not one shared with other channels), never closed
  // for idleness: its breaking is the signal.
  arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  arguments.SetInt(GRPC_ARG_CLIENT_IDLE_TIMEOUT_MS, INT_MAX);
  channel_ = grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), arguments);
  channel_->GetState(/*try_to_connect=*/true);
}

bool PrimaryWatch::Gone(absl::Duration wait) {
  const grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
  if (state == GRPC_CHANNEL_READY) {
    channel_->WaitForStateChange(state, absl::ToChronoTime(absl::Now() + wait));
    if (channel_->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY) return false;
  } else if (absl::Now() < next_dial_) {
    channel_->WaitForStateChange(state, absl::ToChronoTime(absl::Now() + wait));
    return false;
  }
  next_dial_ = absl::Now() + kDialInterval;
  return DialRefused(address_, kDialTimeout);
}

}  // namespace pserver
