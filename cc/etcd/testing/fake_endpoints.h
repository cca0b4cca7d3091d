// Endpoints on 127.0.0.1 that are not what a gRPC client expects, for tests of
// how clients report a wrong or dead address:
//
//   ClosedPort closed;       // connecting is refused (bound, never listening)
//   SilentListener silent;   // accepts connections, never says a word
//   GarbageServer http("HTTP/1.1 400 Bad Request\r\n\r\n");  // answers, not gRPC
//   options.servers = {closed.address()};
//
// Each holds its socket until destroyed, so no other process can take the
// port meanwhile. Thread safety: not thread-safe; use each from one thread.
#ifndef PSERVER_CC_ETCD_TESTING_FAKE_ENDPOINTS_H_
#define PSERVER_CC_ETCD_TESTING_FAKE_ENDPOINTS_H_

#include <atomic>
#include <string>
#include <thread>

namespace pserver::testing {

// A socket bound to a free port that never listens: connections are refused.
class ClosedPort {
 public:
  ClosedPort();
  ClosedPort(const ClosedPort&) = delete;
  ClosedPort& operator=(const ClosedPort&) = delete;
  ~ClosedPort();

  int port() const { return port_; }  // 0 if no socket could be made
  std::string address() const;        // "127.0.0.1:<port>"

 protected:
  int fd_ = -1;
  int port_ = 0;
};

// Listens but never accepts: the kernel completes TCP handshakes (up to the
// backlog), and nothing is ever read or written.
class SilentListener : public ClosedPort {
 public:
  SilentListener();
};

// Accepts connections and answers each with `reply`, then closes it.
class GarbageServer : public ClosedPort {
 public:
  explicit GarbageServer(std::string reply);
  ~GarbageServer();

  int connections() const { return connections_.load(); }

 private:
  void Serve();

  const std::string reply_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

}  // namespace pserver::testing

#endif  // PSERVER_CC_ETCD_TESTING_FAKE_ENDPOINTS_H_
