// MetricsHttpListener: a small HTTP/1.1 server that answers GET /metrics
// (Prometheus's scrape) with a page rendered per request, and nothing else.
//
//   MetricsHttpOptions options;              // 127.0.0.1, a free port
//   PS_ASSIGN_OR_RETURN(auto http, MetricsHttpListener::Start(
//       options, [&] { return registry.Render(); }));
//   // curl http://127.0.0.1:<http->port()>/metrics
//   http->Stop();                            // also done by the destructor
//
// One request per connection (the reply says Connection: close). What an
// outsider can hold is bounded (docs/limits.md): connections served at once
// (max_connections; one more is answered 503 and closed), the request's
// size (max_request_bytes: 431 and closed) and the time to send it and to
// take the reply (io_timeout: 408, or the connection is closed). Other
// methods get 405, other paths 404.
//
// Thread-safe: Stop may be called from any thread, more than once; the page
// function is called from connection threads, several at once.
#ifndef PSERVER_CC_METRICS_HTTP_LISTENER_H_
#define PSERVER_CC_METRICS_HTTP_LISTENER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pserver {
namespace metrics {

struct MetricsHttpOptions {
  // Never a public address unless asked (pserver --metrics_host).
  std::string host = "127.0.0.1";
  int port = 0;  // 0: a free port
  // Connections served at once; one more is answered 503 and closed.
  int max_connections = 8;
  // Bytes of a request's line and headers; more: 431 and closed.
  size_t max_request_bytes = 8192;
  // The time a client may take to send its request, and to read the reply.
  absl::Duration io_timeout = absl::Seconds(10);
};

class MetricsHttpListener {
 public:
  using Page = std::function<std::string()>;

  // INVALID_ARGUMENT for a limit < 1; UNAVAILABLE naming host:port when it
  // cannot listen there.
  static absl::StatusOr<std::unique_ptr<MetricsHttpListener>> Start(
      const MetricsHttpOptions& options, Page page);
  ~MetricsHttpListener();
  MetricsHttpListener(const MetricsHttpListener&) = delete;
  MetricsHttpListener& operator=(const MetricsHttpListener&) = delete;

  int port() const { return port_; }
  // Closes the listening socket and every connection, and waits for their
  // threads.
  void Stop();

  // What was refused so far: connections over max_connections, requests
  // over max_request_bytes, requests not sent within io_timeout.
  uint64_t refused_connections() const { return refused_connections_.load(); }
  uint64_t too_large() const { return too_large_.load(); }
  uint64_t timed_out() const { return timed_out_.load(); }

 private:
  struct Connection {
    int fd = -1;
    std::atomic<bool> done{false};
    std::thread thread;
  };

  MetricsHttpListener(const MetricsHttpOptions& options, Page page, int listen_fd, int wake_fd,
                      int port);
  void AcceptLoop();
  void Serve(Connection* connection);
  // Joins the threads of finished connections; returns how many are left.
  int Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const MetricsHttpOptions options_;
  const Page page_;
  int listen_fd_;  // closed by Stop
  const int wake_fd_;  // an eventfd written by Stop
  const int port_;
  std::atomic<uint64_t> refused_connections_{0};
  std::atomic<uint64_t> too_large_{0};
  std::atomic<uint64_t> timed_out_{0};
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<Connection> connections_ ABSL_GUARDED_BY(mu_);
  std::thread accept_thread_;
};

}  // namespace metrics
}  // namespace pserver

#endif  // PSERVER_CC_METRICS_HTTP_LISTENER_H_
