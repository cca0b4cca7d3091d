#include "cc/server/local_cluster.h"

#include "absl/strings/str_cat.h"
#include "cc/server/dispatcher.h"

namespace pserver {

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(int num_servers,
                                                                  ServerOptions base) {
  if (num_servers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a local cluster needs at least 1 server, got ", num_servers));
  }
  auto cluster = std::make_unique<LocalCluster>();
  for (int i = 0; i < num_servers; ++i) {
    ServerOptions options = base;
    options.index = static_cast<uint32_t>(i);
    options.num_servers = static_cast<uint32_t>(num_servers);  // recorded in checkpoints
    options.port = 0;
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
    if (!server.ok()) return server.status();  // the destructor stops the others
    cluster->servers_.push_back(*std::move(server));
  }
  return cluster;
}

std::vector<std::string> LocalCluster::addresses() const {
  std::vector<std::string> out;
  out.reserve(servers_.size());
  for (const auto& server : servers_) out.push_back(server->address());
  return out;
}

std::vector<Dispatcher*> LocalCluster::dispatchers() const {
  std::vector<Dispatcher*> out;
  out.reserve(servers_.size());
  for (const auto& server : servers_) out.push_back(&server->dispatcher());
  return out;
}

std::vector<ParameterStore*> LocalCluster::stores() const {
  std::vector<ParameterStore*> out;
  out.reserve(servers_.size());
  for (const auto& server : servers_) out.push_back(&server->store());
  return out;
}

std::vector<Tables*> LocalCluster::tables() const {
  std::vector<Tables*> out;
  out.reserve(servers_.size());
  for (const auto& server : servers_) out.push_back(&server->tables());
  return out;
}

void LocalCluster::Shutdown() {
  for (auto& server : servers_) server->Shutdown();
}

}  // namespace pserver
