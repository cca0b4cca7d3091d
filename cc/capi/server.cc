// The C ABI: a server, and a local cluster of servers in this process with
// its in-process clients.
#include <algorithm>

#include "absl/time/time.h"
#include "cc/capi/internal.h"
#include "cc/server/in_process_transport.h"
#include "cc/core/status_macros.h"

using pserver_capi::NewHandle;
using pserver_capi::Null;
using pserver_capi::Run;

namespace {

absl::Status SaveAll(pserver::LocalCluster& cluster) {
  for (int i = 0; i < cluster.size(); ++i) {
    PS_RETURN_IF_ERROR(cluster.server(i).Save().status());
  }
  return absl::OkStatus();
}

}  // namespace

extern "C" {

// ------------------------------------------------------------------ server

pserver_server_options_t* pserver_server_options_new(void) {
  return NewHandle<pserver_server_options_t>();
}

void pserver_server_options_delete(pserver_server_options_t* options) { delete options; }

void pserver_server_options_set_host(pserver_server_options_t* options, const char* host) {
  try {
    if (options != nullptr) options->rep.host = host == nullptr ? "" : host;
  } catch (...) {
  }
}

void pserver_server_options_set_advertise_host(pserver_server_options_t* options,
                                               const char* host) {
  try {
    if (options != nullptr) options->rep.advertise_host = host == nullptr ? "" : host;
  } catch (...) {
  }
}

void pserver_server_options_set_port(pserver_server_options_t* options, int32_t port) {
  if (options != nullptr) options->rep.port = port;
}

void pserver_server_options_set_index(pserver_server_options_t* options, uint32_t index) {
  if (options != nullptr) options->rep.index = index;
}

void pserver_server_options_set_num_threads(pserver_server_options_t* options,
                                            int32_t num_threads) {
  if (options != nullptr) options->rep.num_threads = num_threads;
}

void pserver_server_options_set_checkpoint_dir(pserver_server_options_t* options, const char* dir) {
  try {
    if (options != nullptr) options->rep.checkpoint_dir = dir == nullptr ? "" : dir;
  } catch (...) {
  }
}

void pserver_server_options_set_tls(pserver_server_options_t* options, const char* cert,
                                    const char* key, const char* ca, int32_t reload_seconds,
                                    pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (options == nullptr) return Null("options");
    if (reload_seconds < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("reload_seconds must be >= 0, got ", reload_seconds));
    }
    if (reload_seconds > 0) options->rep.tls.reload_interval = absl::Seconds(reload_seconds);
    return pserver_capi::SetTls(cert, key, ca, &options->rep.tls);
  });
}

void pserver_server_options_set_tls_bulk_aead(pserver_server_options_t* options, int32_t on) {
  if (options != nullptr) options->rep.tls.bulk_aead = on != 0;
}

void pserver_server_options_set_auth(pserver_server_options_t* options, const char* job,
                                     const char* tokens_file, const char* cert_rule) {
  try {
    if (options == nullptr) return;
    options->rep.job = job == nullptr ? "" : job;
    options->rep.auth_tokens_file = tokens_file == nullptr ? "" : tokens_file;
    options->rep.auth_cert_rule = cert_rule == nullptr ? "" : cert_rule;
  } catch (...) {
  }
}

void pserver_server_options_set_etcd(pserver_server_options_t* options, const char* endpoints,
                                     const char* cluster, uint32_t num_servers,
                                     pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (options == nullptr) return Null("options");
    PS_RETURN_IF_ERROR(pserver_capi::SetEtcd(endpoints, cluster, &options->rep.etcd_endpoints,
                                             &options->rep.cluster));
    options->rep.num_servers = num_servers;
    return absl::OkStatus();
  });
}

void pserver_server_options_set_etcd_tls(pserver_server_options_t* options, const char* ca,
                                         const char* cert, const char* key) {
  try {
    if (options != nullptr) options->rep.etcd_tls = pserver_capi::EtcdTlsOf(ca, cert, key);
  } catch (...) {
  }
}

void pserver_server_save_checkpoint(pserver_server_t* server, pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (server == nullptr) return Null("server");
    return server->rep->Save().status();
  });
}

pserver_server_t* pserver_server_new(const pserver_server_options_t* options,
                                     pserver_status_t* status) {
  pserver_server_t* out = nullptr;
  Run(status, [&]() -> absl::Status {
    const pserver::ServerOptions defaults;
    PS_ASSIGN_OR_RETURN(std::unique_ptr<pserver::Server> server,
                        pserver::Server::Start(options == nullptr ? defaults : options->rep));
    out = new pserver_server_t{std::move(server)};
    return absl::OkStatus();
  });
  return out;
}

void pserver_server_delete(pserver_server_t* server) {
  delete server;  // NULL is fine; destructors do not throw
}

const char* pserver_server_address(const pserver_server_t* server) {
  return server == nullptr ? "" : server->rep->address().c_str();
}

int32_t pserver_server_port(const pserver_server_t* server) {
  return server == nullptr ? 0 : server->rep->port();
}

void pserver_server_stop(pserver_server_t* server, int64_t grace_ms) {
  try {
    if (server != nullptr)
      server->rep->Shutdown(absl::Milliseconds(std::max<int64_t>(0, grace_ms)));
  } catch (...) {
  }
}

// ----------------------------------------------------------- local cluster

pserver_local_cluster_t* pserver_local_cluster_new(int32_t num_servers, pserver_status_t* status) {
  return pserver_local_cluster_new_with_options(num_servers, nullptr, status);
}

void pserver_local_cluster_save_checkpoint(pserver_local_cluster_t* cluster,
                                           pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (cluster == nullptr) return Null("cluster");
    if (cluster->state->stopped.load()) {
      return absl::FailedPreconditionError("pserver: the local cluster was stopped");
    }
    return SaveAll(*cluster->state->cluster);
  });
}

pserver_local_cluster_t* pserver_local_cluster_new_with_options(
    int32_t num_servers, const pserver_server_options_t* base, pserver_status_t* status) {
  pserver_local_cluster_t* out = nullptr;
  Run(status, [&]() -> absl::Status {
    const pserver::ServerOptions defaults;
    PS_ASSIGN_OR_RETURN(
        std::unique_ptr<pserver::LocalCluster> cluster,
        pserver::LocalCluster::Start(num_servers, base == nullptr ? defaults : base->rep));
    auto state = std::make_shared<pserver_capi::ClusterState>();
    state->addresses = cluster->addresses();
    state->cluster = std::move(cluster);
    out = new pserver_local_cluster_t{std::move(state)};
    return absl::OkStatus();
  });
  return out;
}

void pserver_local_cluster_delete(pserver_local_cluster_t* cluster) {
  try {
    if (cluster == nullptr) return;
    pserver_local_cluster_stop(cluster);
    delete cluster;
  } catch (...) {
  }
}

int32_t pserver_local_cluster_size(const pserver_local_cluster_t* cluster) {
  return cluster == nullptr ? 0 : static_cast<int32_t>(cluster->state->addresses.size());
}

const char* pserver_local_cluster_address(const pserver_local_cluster_t* cluster, int32_t i) {
  if (cluster == nullptr || i < 0 || static_cast<size_t>(i) >= cluster->state->addresses.size()) {
    return nullptr;
  }
  return cluster->state->addresses[i].c_str();
}

pserver_client_t* pserver_local_cluster_client(pserver_local_cluster_t* cluster,
                                               const pserver_client_options_t* options,
                                               pserver_status_t* status) {
  pserver_client_t* out = nullptr;
  Run(status, [&]() -> absl::Status {
    if (cluster == nullptr) return Null("cluster");
    if (cluster->state->stopped.load()) {
      return absl::FailedPreconditionError("pserver: the local cluster was stopped");
    }
    pserver::ClientOptions client_options;
    if (options != nullptr) client_options = options->rep;
    client_options.servers = cluster->state->addresses;  // names only: calls stay in process
    PS_ASSIGN_OR_RETURN(
        std::unique_ptr<pserver::Client> client,
        pserver::Client::Create(client_options,
                                pserver::InProcessTransports(*cluster->state->cluster)));
    auto handle = std::make_unique<pserver_client_t>();
    handle->cluster = cluster->state;
    handle->rep = std::move(client);
    out = handle.release();
    return absl::OkStatus();
  });
  return out;
}

void pserver_local_cluster_stop(pserver_local_cluster_t* cluster) {
  try {
    if (cluster == nullptr) return;
    if (!cluster->state->stopped.exchange(true)) cluster->state->cluster->Shutdown();
  } catch (...) {
  }
}

}  // extern "C"
