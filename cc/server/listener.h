// Listener: accepts TCP connections on host:port and hands each to a
// grpc::Server, keeping a reserve of file descriptors free.
//
// gRPC 1.51's own listener gives up for good at the first EMFILE ("Failed
// accept4: Too many open files"): a burst of idle connections then locks
// every later client out even after they are gone. This one never gives up:
// at the descriptor limit it waits and tries again, and it closes at once
// a connection that would leave fewer than `reserve_fds` descriptors free
// (the client retries), so that etcd, checkpoint files and the connections
// already served keep working. A connection is handed to gRPC once its
// client has sent something (the HTTP/2 preface); one silent for
// `handshake_timeout` is closed. Idle connections are then closed by the
// server's idle limit (ServerOptions::max_connection_idle).
//
//   PS_ASSIGN_OR_RETURN(auto listener,
//                       Listener::Bind("127.0.0.1", 0, 32, absl::Seconds(10)));
//   listener->Start(grpc_server.get());   // accepts until Stop
//   listener->Stop();
//
// Thread-safe: Stop may be called from any thread, more than once.
#ifndef PSERVER_CC_SERVER_LISTENER_H_
#define PSERVER_CC_SERVER_LISTENER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace grpc {
class Server;
}

namespace pserver {

class Listener {
 public:
  // Binds and listens. UNAVAILABLE naming host:port when that fails.
  static absl::StatusOr<std::unique_ptr<Listener>> Bind(const std::string& host, int port,
                                                        int reserve_fds,
                                                        absl::Duration handshake_timeout);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  int port() const { return port_; }
  // Connections closed at once for want of descriptors so far, and for
  // saying nothing within handshake_timeout.
  int64_t refused() const { return refused_.load(); }
  int64_t silent_closed() const { return silent_closed_.load(); }

  // Accepts on a thread of its own until Stop; `server` must outlive that.
  void Start(grpc::Server* server);
  // Stops accepting and closes the listening socket. Connections already
  // handed over stay with the server.
  void Stop();

 private:
  Listener(int listen_fd, int wake_fd, int port, int reserve_fds, absl::Duration handshake_timeout);
  void AcceptLoop(grpc::Server* server);
  // Accepts every waiting connection into `pending` (fd, handshake deadline).
  void AcceptAll(std::vector<std::pair<int, absl::Time>>* pending);
  // Sleeps `millis`, or less when Stop is called meanwhile.
  void PauseUnlessStopped(int millis);
  void LogRateLimited(const std::string& message);

  const int listen_fd_;
  const int wake_fd_;  // an eventfd: written by Stop
  const int port_;
  const int reserve_fds_;
  const absl::Duration handshake_timeout_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> refused_{0};
  std::atomic<int64_t> silent_closed_{0};
  int64_t last_log_micros_ = 0;  // AcceptLoop's thread only
  std::thread thread_;
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_LISTENER_H_
