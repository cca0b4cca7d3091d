// LocalCluster: N servers in this process, each on 127.0.0.1 with a port the
// system picks: the embedded default for examples, notebooks and tests.
//
//   PS_ASSIGN_OR_RETURN(auto cluster, LocalCluster::Start(2));
//   ClientOptions options;
//   options.servers = cluster->addresses();
//
// Thread-safe after Start; Shutdown is idempotent and run by the destructor.
#ifndef PSERVER_CC_SERVER_LOCAL_CLUSTER_H_
#define PSERVER_CC_SERVER_LOCAL_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cc/server/server.h"

namespace pserver {

class LocalCluster {
 public:
  // `base` is copied for every server; its index is set to 0..n-1 and its
  // port to 0 (pick a free one).
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(int num_servers,
                                                             ServerOptions base = {});

  std::vector<std::string> addresses() const;
  int size() const { return static_cast<int>(servers_.size()); }
  Server& server(int i) { return *servers_.at(i); }
  // The servers' dispatchers, for an in-process client
  // (cc/server/in_process_transport.h).
  std::vector<Dispatcher*> dispatchers() const;
  // The servers' stores.
  std::vector<ParameterStore*> stores() const;
  // Their tables, likewise.
  std::vector<Tables*> tables() const;

  void Shutdown();

 private:
  std::vector<std::unique_ptr<Server>> servers_;
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_LOCAL_CLUSTER_H_
