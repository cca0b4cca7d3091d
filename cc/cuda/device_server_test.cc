// Servers with ServerOptions.device = "cuda:0" end to end: a client pushes
// and pulls through gRPC, the servers keep the dense blocks on the GPU, and
// agree with servers in host memory; a device server's checkpoint loads into
// a host server. Without a GPU, Start refuses the device naming the reason
// (checked everywhere) and the rest skips, saying why.
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cc/client/client.h"
#include "cc/core/tensor.h"
#include "cc/cuda/device.h"
#include "cc/cuda/test_util.h"
#include "cc/server/local_cluster.h"
#include "cc/server/server.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kElements = 30011;

std::unique_ptr<Client> Connect(const std::vector<std::string>& servers) {
  ClientOptions options;
  options.servers = servers;
  options.block_bytes = 16 << 10;  // "w" is split over both servers
  options.timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

void InitModel(Client* client) {
  std::vector<float> w(kElements);
  for (int64_t i = 0; i < kElements; ++i) w[i] = std::sin(0.001f * static_cast<float>(i));
  v1::ParameterConfig adam;
  adam.mutable_optimizer()->mutable_adam()->set_weight_decay(0.001);
  adam.mutable_learning_rate()->set_learning_rate(0.01);
  v1::ParameterConfig add;
  add.mutable_optimizer()->mutable_add();
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({kElements}, w), adam));
  ASSERT_OK(client->InitParam("steps", Tensor::FromValues<int64_t>({1}, {0}), add));
  ASSERT_OK(client->FinishInitParams());
}

void Train(Client* client, int steps) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int step = 0; step < steps; ++step) {
    std::vector<float> g(kElements);
    for (float& v : g) v = normal(rng);
    std::vector<NamedTensor> grads = {{"w", Tensor::FromValues<float>({kElements}, g)},
                                      {"steps", Tensor::FromValues<int64_t>({1}, {1})}};
    ASSERT_OK(client->SendGrads(grads));
  }
}

void ExpectClose(const Tensor& want, const Tensor& got) {
  ASSERT_EQ(want.num_elements(), got.num_elements());
  absl::Span<const float> a = want.values<float>(), b = got.values<float>();
  int bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!(std::fabs(a[i] - b[i]) <= 1e-5 * std::fabs(a[i]) + 1e-7) && bad++ < 5) {
      ADD_FAILURE() << "w[" << i << "]: host " << a[i] << ", device " << b[i];
    }
  }
}

TEST(DeviceServerTest, StartRefusesAMissingDeviceNamingTheReason) {
  absl::StatusOr<int> count = cuda::CudaDeviceCount();
  ServerOptions options;
  options.device = "cuda:0";
  if (count.ok()) {
    options.device = "cuda:1000";
    EXPECT_THAT(Server::Start(options).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cuda:1000")));
    return;
  }
  EXPECT_THAT(Server::Start(options).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no CUDA device")));
  EXPECT_THAT(LocalCluster::Start(2, options).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no CUDA device")));
}

TEST(DeviceServerTest, ServesPushesAndPullsFromTheDevice) {
  PS_SKIP_WITHOUT_CUDA_DEVICE();
  ServerOptions on_device;
  on_device.device = "cuda:0";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LocalCluster> device, LocalCluster::Start(2, on_device));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LocalCluster> host, LocalCluster::Start(2));
  std::unique_ptr<Client> device_client = Connect(device->addresses());
  std::unique_ptr<Client> host_client = Connect(host->addresses());
  ASSERT_NE(device_client, nullptr);
  ASSERT_NE(host_client, nullptr);
  ASSERT_NO_FATAL_FAILURE(InitModel(device_client.get()));
  ASSERT_NO_FATAL_FAILURE(InitModel(host_client.get()));
  // "w" spans both servers; "steps" (int64, one block) stays in host memory on
  // whichever server holds it.
  uint64_t device_blocks = 0, blocks = 0;
  for (int i = 0; i < device->size(); ++i) {
    const ParameterStore::Stats stats = device->server(i).store().GetStats();
    EXPECT_GT(stats.device_blocks, 0u) << "server " << i;
    device_blocks += stats.device_blocks;
    blocks += stats.blocks;
  }
  EXPECT_EQ(device_blocks + 1, blocks);

  // Before any push the device serves exactly what was initialized.
  ASSERT_OK_AND_ASSIGN(Tensor w0_device, device_client->GetParam("w"));
  ASSERT_OK_AND_ASSIGN(Tensor w0_host, host_client->GetParam("w"));
  EXPECT_EQ(w0_device.bytes(), w0_host.bytes());

  ASSERT_NO_FATAL_FAILURE(Train(device_client.get(), 30));
  ASSERT_NO_FATAL_FAILURE(Train(host_client.get(), 30));
  ASSERT_OK_AND_ASSIGN(Tensor w_device, device_client->GetParam("w"));
  ASSERT_OK_AND_ASSIGN(Tensor w_host, host_client->GetParam("w"));
  ExpectClose(w_host, w_device);
  ASSERT_OK_AND_ASSIGN(Tensor steps, device_client->GetParam("steps"));
  EXPECT_EQ(steps.values<int64_t>()[0], 30);

  // PushPull: one more step, the updated values back in the same round trip.
  std::vector<float> g(kElements, 0.5f);
  Tensor out_device, out_host;
  ASSERT_OK(device_client->PushPull("w", Tensor::FromValues<float>({kElements}, g), &out_device));
  ASSERT_OK(host_client->PushPull("w", Tensor::FromValues<float>({kElements}, g), &out_host));
  ExpectClose(out_host, out_device);
}

TEST(DeviceServerTest, ADeviceServersCheckpointLoadsIntoAHostServer) {
  PS_SKIP_WITHOUT_CUDA_DEVICE();
  const std::string dir = cuda::testing::FreshTestDir("device_server_test_d2h");
  ServerOptions on_device;
  on_device.device = "cuda:0";
  on_device.checkpoint_dir = dir;
  on_device.checkpoint_on_shutdown = false;
  Tensor trained;
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server, Server::Start(on_device));
    std::unique_ptr<Client> client = Connect({server->address()});
    ASSERT_NE(client, nullptr);
    ASSERT_NO_FATAL_FAILURE(InitModel(client.get()));
    ASSERT_NO_FATAL_FAILURE(Train(client.get(), 10));
    ASSERT_OK_AND_ASSIGN(trained, client->GetParam("w"));
    ASSERT_OK(server->Save().status());
  }
  ServerOptions on_host = on_device;
  on_host.device = "cpu";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server, Server::Start(on_host));
  ASSERT_TRUE(server->loaded_checkpoint().has_value());
  EXPECT_EQ(server->store().GetStats().device_blocks, 0u);
  std::unique_ptr<Client> client = Connect({server->address()});
  ASSERT_OK_AND_ASSIGN(Tensor restored, client->GetParam("w"));
  EXPECT_EQ(restored.bytes(), trained.bytes());  // bit for bit

  // And back onto a device server, which continues from there.
  ASSERT_OK(server->Save().status());
  server.reset();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> again, Server::Start(on_device));
  EXPECT_GT(again->store().GetStats().device_blocks, 0u);
  std::unique_ptr<Client> client2 = Connect({again->address()});
  ASSERT_OK_AND_ASSIGN(Tensor back, client2->GetParam("w"));
  EXPECT_EQ(back.bytes(), trained.bytes());
}

}  // namespace
}  // namespace pserver
