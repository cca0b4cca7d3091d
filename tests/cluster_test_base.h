// A test fixture over an in-process cluster of gRPC servers whose tests run
// twice: with clients over gRPC and with in-process clients.
#ifndef PSERVER_TESTS_CLUSTER_TEST_BASE_H_
#define PSERVER_TESTS_CLUSTER_TEST_BASE_H_

#include <memory>
#include <string>

#include "cc/client/client.h"
#include "cc/server/in_process_transport.h"
#include "cc/server/local_cluster.h"
#include "cc/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace pserver {

// How the clients reach the cluster: every test runs over both.
enum class Via { kGrpc, kInProcess };

inline std::string ViaName(const ::testing::TestParamInfo<Via>& info) {
  return info.param == Via::kGrpc ? "Grpc" : "InProcess";
}

class ClusterTest : public ::testing::TestWithParam<Via> {
 protected:
  // Starts `servers` servers; the client options use small blocks, so that
  // modest tensors split over servers.
  void StartCluster(int servers, ServerOptions base = {}) {
    ASSERT_OK_AND_ASSIGN(cluster_, LocalCluster::Start(servers, std::move(base)));
    options_.servers = cluster_->addresses();
    options_.block_bytes = 4096;
    options_.timeout = absl::Seconds(20);
  }

  absl::StatusOr<std::unique_ptr<Client>> Connect() {
    if (GetParam() == Via::kGrpc) return Client::Connect(options_);
    return Client::Create(options_, InProcessTransports(*cluster_));
  }

  std::unique_ptr<Client> NewClient() {
    auto client = Connect();
    EXPECT_OK(client);
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::unique_ptr<LocalCluster> cluster_;
  ClientOptions options_;
};

}  // namespace pserver

#endif  // PSERVER_TESTS_CLUSTER_TEST_BASE_H_
