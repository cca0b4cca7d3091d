// Server: one parameter server process's gRPC endpoint over a ParameterStore.
//
//   ServerOptions options;                  // 127.0.0.1, a free port
//   PS_ASSIGN_OR_RETURN(auto server, Server::Start(options));
//   std::cout << server->address();         // "127.0.0.1:40123"
//   server->Shutdown();                     // also done by the destructor
//
// Thread-safe: Shutdown may be called from any thread, more than once.
#ifndef PSERVER_CC_SERVER_SERVER_H_
#define PSERVER_CC_SERVER_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cc/core/parameter_store.h"

namespace grpc {
class Server;
}

namespace pserver {

class ParameterServerService;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;             // 0: the system picks a free port
  uint32_t index = 0;       // this server's shard index, reported in stats
  int num_threads = 0;      // request threads; 0: two per core, at least 4
};

class Server {
 public:
  // INVALID_ARGUMENT for a bad port or thread count; UNAVAILABLE when the
  // address cannot be bound (the message names it).
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);

  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  const std::string& address() const { return address_; }  // host:port
  int port() const { return port_; }
  uint32_t index() const { return options_.index; }
  ParameterStore& store() { return store_; }

  // Stops accepting calls, lets calls in flight finish for up to `grace`,
  // then cancels the rest. Idempotent.
  void Shutdown(absl::Duration grace = absl::Seconds(5));

 private:
  explicit Server(const ServerOptions& options);

  const ServerOptions options_;
  ParameterStore store_;
  std::unique_ptr<ParameterServerService> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::string address_;
  int port_ = 0;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_SERVER_H_
