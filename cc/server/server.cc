#include "cc/server/server.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cc/server/service.h"
#include "grpcpp/grpcpp.h"

namespace pserver {

Server::Server(const ServerOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port must be in [0, 65535], got ", options.port));
  }
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_threads must be >= 0, got ", options.num_threads));
  }
  if (options.host.empty()) return absl::InvalidArgumentError("host is empty");
  const int threads =
      options.num_threads > 0
          ? options.num_threads
          : std::max(4, 2 * static_cast<int>(std::thread::hardware_concurrency()));

  std::unique_ptr<Server> server(new Server(options));
  server->service_ = std::make_unique<ParameterServerService>(&server->store_, options.index);

  const bool ipv6 = options.host.find(':') != std::string::npos;
  const std::string listen = ipv6 ? absl::StrCat("[", options.host, "]:", options.port)
                                  : absl::StrCat(options.host, ":", options.port);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, threads);
  server->grpc_server_ = builder.BuildAndStart();
  if (server->grpc_server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", listen, " (address in use or not local?)"));
  }
  server->address_ = ipv6 ? absl::StrCat("[", options.host, "]:", server->port_)
                          : absl::StrCat(options.host, ":", server->port_);
  return server;
}

void Server::Shutdown(absl::Duration grace) {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  if (grpc_server_ != nullptr) {
    grpc_server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
    grpc_server_->Wait();
  }
}

Server::~Server() { Shutdown(); }

}  // namespace pserver
