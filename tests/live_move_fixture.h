// What the live move tests share (tests/live_move_test.cc,
// tests/live_move_tables_test.cc): a trainer thread that runs deterministic
// steps until stopped, and a fixture with a real etcd, servers in this
// process over gRPC started with --placement_redirects, clients that follow
// /placement, and ScaleTo (ScaleCluster, psctl scale, while the trainer
// runs). No timing: every wait is a bounded loop on a condition.
#ifndef PSERVER_TESTS_LIVE_MOVE_FIXTURE_H_
#define PSERVER_TESTS_LIVE_MOVE_FIXTURE_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/core/status_macros.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/placement_record.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/server/move_coordinator.h"
#include "cc/server/server.h"
#include "cc/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "tests/step_trainer.h"

namespace pserver {
namespace testing {

// The trainer thread the live move tests run (tests/step_trainer.h).
using Trainer = ::pserver::StepTrainer;

class LiveMoveFixture : public ::testing::Test {
 protected:
  static constexpr size_t kBlockBytes = 64;  // 16 float32 a block: hundreds of blocks

  // The counts the tests go through from 2 servers, and the fraction of
  // the model each change must move: |N-M| / max(N, M).
  struct Change {
    uint32_t to;
    double ideal;
  };
  static constexpr Change kChanges[] = {{3, 1.0 / 3}, {4, 1.0 / 4}, {2, 2.0 / 4}};

  // Prints the bytes moved from `from` servers against `model` bytes and
  // expects them within 1.5x of the ideal (and at least ideal / 1.5).
  static void ExpectAboutIdeal(const ScaleResult& result, uint64_t model, uint32_t from,
                               const Change& change, int steps) {
    const double fraction = static_cast<double>(result.bytes_moved) / static_cast<double>(model);
    std::printf("%u -> %u servers: moved %llu of %llu bytes = %.3f, ideal %.3f (%.2fx); %d steps\n",
                from, change.to, static_cast<unsigned long long>(result.bytes_moved),
                static_cast<unsigned long long>(model), fraction, change.ideal,
                fraction / change.ideal, steps);
    EXPECT_LE(fraction, 1.5 * change.ideal);
    EXPECT_GE(fraction, change.ideal / 1.5);
  }

  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(etcd_, EtcdProcess::Start());
    EtcdClientOptions options;
    options.endpoints = {etcd_->endpoint()};
    options.prefix = etcd_keys::ClusterPrefix("job");
    ASSERT_OK_AND_ASSIGN(etcd_client_, EtcdClient::Connect(options));
  }

  // num_servers 0: the count etcd's /ps_desired holds.
  ServerOptions Options(uint32_t num_servers) {
    ServerOptions options;
    options.etcd_endpoints = {etcd_->endpoint()};
    options.cluster = "job";
    options.num_servers = num_servers;
    options.lease_ttl = absl::Seconds(5);
    options.register_timeout = absl::Seconds(120);
    options.placement_redirects = true;
    options.move_batch_bytes = 4096;
    if (!checkpoint_dir_.empty()) {
      options.checkpoint_dir = checkpoint_dir_;
      options.checkpoint_on_shutdown = false;  // a stop is a kill: only Save checkpoints
    }
    auto departed = std::make_shared<absl::Notification>();
    departures_.push_back(departed);
    options.on_departed = [departed] { departed->Notify(); };
    secure_server_(&options);
    return options;
  }

  // Starts `n` servers at once and files them by the index they claimed.
  void StartServers(int n, uint32_t num_servers) {
    std::vector<std::future<absl::StatusOr<std::unique_ptr<Server>>>> started;
    std::vector<std::shared_ptr<absl::Notification>> departures;
    for (int i = 0; i < n; ++i) {
      ServerOptions options = Options(num_servers);
      departures.push_back(departures_.back());
      started.push_back(std::async(std::launch::async, [options] { return Server::Start(options); }));
    }
    for (int i = 0; i < n; ++i) {
      absl::StatusOr<std::unique_ptr<Server>> server = started[i].get();
      ASSERT_OK(server.status());
      departed_of_[(*server)->index()] = departures[i];
      servers_[(*server)->index()] = *std::move(server);
    }
  }

  // `adjust` (may be null) changes the options before connecting.
  absl::StatusOr<std::unique_ptr<Client>> Connect(
      const std::function<void(ClientOptions*)>& adjust = nullptr) {
    ClientOptions options;
    options.etcd_endpoints = {etcd_->endpoint()};
    options.cluster = "job";
    options.block_bytes = kBlockBytes;
    options.discovery_timeout = absl::Seconds(60);
    options.timeout = absl::Seconds(60);
    secure_client_(&options);
    if (adjust) adjust(&options);
    return Client::Connect(options);
  }

  ScaleOptions Scale(uint32_t to) {
    ScaleOptions options;
    options.etcd_endpoints = {etcd_->endpoint()};
    options.cluster = "job";
    options.to = to;
    options.timeout = absl::Minutes(3);
    options.progress = [](const std::string& line) { std::printf("scale: %s\n", line.c_str()); };
    secure_scale_(&options);
    return options;
  }

  // Scales from the servers running to `to` while `trainer` (of `client`)
  // runs, starting the new servers (they claim their index once the move
  // began) or stopping the departing ones once they said so and the
  // trainer's client routes by the new count. Returns the coordinator's
  // result; the trainer is stopped.
  absl::StatusOr<ScaleResult> ScaleTo(uint32_t to, Client& client, Trainer& trainer) {
    std::future<absl::StatusOr<ScaleResult>> scaled =
        std::async(std::launch::async, [this, to] { return ScaleCluster(Scale(to)); });
    const int running = static_cast<int>(servers_.size());
    if (static_cast<int>(to) > running) StartServers(static_cast<int>(to) - running, 0);
    absl::StatusOr<ScaleResult> result = scaled.get();
    if (!result.ok()) return result;
    // A few steps on the new placement, then the trainer stops: a departing
    // server is stopped only once nothing routes to it.
    bool routed = false;
    for (int i = 0; i < 6000 && !routed; ++i) {
      routed = client.etcd_placement_version() >= result->version;
      if (!routed) absl::SleepFor(absl::Milliseconds(10));
    }
    if (!routed || !trainer.Advance(2)) {
      return absl::InternalError(absl::StrCat("the trainer did not go on after the move: ",
                                              trainer.Stop().ToString()));
    }
    PS_RETURN_IF_ERROR(trainer.Stop());
    for (int i = static_cast<int>(to); i < running; ++i) {
      // Each departs on its own once it sees the stable placement.
      if (!departed_of_[i]->WaitForNotificationWithTimeout(absl::Seconds(60))) {
        return absl::DeadlineExceededError(absl::StrCat("server ", i, " did not depart"));
      }
      servers_.erase(i);  // drains and deregisters
      departed_of_.erase(i);
    }
    return result;
  }

  // Writes /placement moving from `stable` (etcd's) to `to` servers, as a
  // coordinator would; returns what it wrote.
  absl::StatusOr<v1::Placement> PutMoving(const v1::Placement& stable, uint32_t to) {
    v1::Placement moving = stable;
    moving.set_version(stable.version() + 1);
    moving.set_num_servers(to);
    moving.set_moving(true);
    moving.set_from_num_servers(stable.num_servers());
    PS_RETURN_IF_ERROR(etcd_client_->Put(etcd_keys::PlacementKey(), FormatPlacementRecord(moving)));
    return moving;
  }

  // A secured cluster (docs/security.md): what the servers, the clients
  // and the coordinator present; set before the servers start.
  std::function<void(ServerOptions*)> secure_server_ = [](ServerOptions*) {};
  std::function<void(ClientOptions*)> secure_client_ = [](ClientOptions*) {};
  std::function<void(ScaleOptions*)> secure_scale_ = [](ScaleOptions*) {};
  std::string checkpoint_dir_;  // set before StartServers: servers checkpoint there
  std::unique_ptr<EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> etcd_client_;
  std::vector<std::shared_ptr<absl::Notification>> departures_;
  std::map<uint32_t, std::shared_ptr<absl::Notification>> departed_of_;
  std::map<uint32_t, std::unique_ptr<Server>> servers_;
};

}  // namespace testing
}  // namespace pserver

#endif  // PSERVER_TESTS_LIVE_MOVE_FIXTURE_H_
