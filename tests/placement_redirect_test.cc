// Live moves: servers started with placement_redirects follow etcd's
// /placement and refuse, with PlacementMoved and nothing applied, every
// dense block they no longer own; blocks they still own are served as
// before. A client that follows /placement (etcd) re-routes the refused
// blocks to their new owners, so a trainer pushing through a move from 2 to
// 3 servers sees no error and every push is applied exactly once. Real
// etcd, servers over gRPC; no timing: waits are bounded loops on conditions.
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/core/placement.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/placement_record.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/server/server.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;

// The first name (one block) on `from` of 2 servers and on `to` of 3.
std::string NameMoving(int from, int to) {
  for (int i = 0; i < 10000; ++i) {
    const std::string name = absl::StrCat("p", i);
    if (Placement::Jump(2, 1).ServerOf(name, 0) == from &&
        Placement::Jump(3, 1).ServerOf(name, 0) == to)
      return name;
  }
  ADD_FAILURE() << "no name from " << from << " to " << to;
  return "";
}

v1::Placement Spec(uint64_t version, uint32_t servers, uint32_t from = 0) {
  v1::Placement spec;
  spec.set_version(version);
  spec.set_kind(v1::Placement::JUMP);
  spec.set_num_servers(servers);
  spec.set_moving(from != 0);
  spec.set_from_num_servers(from);
  return spec;
}

// Polls `done` every 10 ms, at most 6000 times and for 60 s: whether it held.
template <typename Condition>
bool Eventually(Condition done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (int i = 0; i < 6000 && absl::Now() < deadline; ++i) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

class PlacementRedirectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(etcd_, testing::EtcdProcess::Start());
    EtcdClientOptions options;
    options.endpoints = {etcd_->endpoint()};
    options.prefix = etcd_keys::ClusterPrefix("job");
    ASSERT_OK_AND_ASSIGN(etcd_client_, EtcdClient::Connect(options));
  }

  ServerOptions Options() const {
    ServerOptions options;
    options.etcd_endpoints = {etcd_->endpoint()};
    options.cluster = "job";
    options.num_servers = 2;
    options.lease_ttl = absl::Seconds(5);
    options.register_timeout = absl::Seconds(30);
    options.placement_redirects = true;
    return options;
  }

  // Servers 0 and 1 (in index order), started together.
  void StartTwo() {
    auto start = [this] { return Server::Start(Options()); };
    std::future<absl::StatusOr<std::unique_ptr<Server>>> a = std::async(std::launch::async, start);
    std::future<absl::StatusOr<std::unique_ptr<Server>>> b = std::async(std::launch::async, start);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server_a, a.get());
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server_b, b.get());
    if (server_a->index() == 1) std::swap(server_a, server_b);
    servers_.push_back(std::move(server_a));
    servers_.push_back(std::move(server_b));
  }

  // A client that follows /placement through etcd.
  std::unique_ptr<Client> Follower() {
    ClientOptions options;
    options.etcd_endpoints = {etcd_->endpoint()};
    options.cluster = "job";
    options.discovery_timeout = absl::Seconds(30);
    options.timeout = absl::Seconds(60);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    EXPECT_OK(client.status());
    return client.ok() ? *std::move(client) : nullptr;
  }

  // A client of the given servers in index order, without etcd: it follows
  // no placement, so it reports every refusal.
  static std::unique_ptr<Client> Direct(std::vector<std::string> addresses) {
    ClientOptions options;
    options.servers = std::move(addresses);
    options.timeout = absl::Seconds(60);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    EXPECT_OK(client.status());
    return client.ok() ? *std::move(client) : nullptr;
  }

  void PutPlacement(const v1::Placement& spec) {
    ASSERT_OK(etcd_client_->Put(etcd_keys::PlacementKey(), FormatPlacementRecord(spec)));
  }

  std::unique_ptr<testing::EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> etcd_client_;
  std::vector<std::unique_ptr<Server>> servers_;
};

TEST_F(PlacementRedirectTest, ServersRefuseBlocksTheyNoLongerOwnAndServeTheRest) {
  StartTwo();
  ASSERT_EQ(servers_.size(), 2u);
  // Without etcd the client follows no placement: it reports the refusals.
  std::unique_ptr<Client> client = Direct({servers_[0]->address(), servers_[1]->address()});
  ASSERT_NE(client, nullptr);
  ASSERT_OK_AND_ASSIGN(KeyValue kv, etcd_client_->Get(etcd_keys::PlacementKey()));
  ASSERT_OK_AND_ASSIGN(v1::Placement held, ParsePlacementRecord(kv.value));
  const uint64_t version = held.version();
  ASSERT_GE(version, 1u);

  const std::string moving = NameMoving(0, 2);
  const std::string staying = NameMoving(1, 1);
  v1::ParameterConfig sgd;
  sgd.mutable_optimizer()->mutable_sgd();
  sgd.mutable_learning_rate()->set_learning_rate(1.0);
  for (const std::string& name : {moving, staying}) {
    ASSERT_OK(client->InitParam(name, Tensor::FromValues<float>({2}, {0, 0}), sgd));
  }
  ASSERT_OK(client->FinishInitParams());
  for (const std::string& name : {moving, staying}) {
    ASSERT_OK(client->SendGrad(name, Tensor::FromValues<float>({2}, {-1, -2})));
  }

  // /placement v+1 for three servers: `moving` is server 2's now.
  v1::Placement next;
  next.set_kind(v1::Placement::JUMP);
  next.set_num_servers(3);
  next.set_version(version + 1);
  ASSERT_OK(etcd_client_->Put(etcd_keys::PlacementKey(), FormatPlacementRecord(next)));

  // Until the server's watch delivers it, the push is applied; count those.
  int applied = 1;
  absl::Status refused;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (int i = 0; i < 6000 && absl::Now() < deadline; ++i) {
    refused = client->SendGrad(moving, Tensor::FromValues<float>({2}, {-1, -2}));
    if (!refused.ok()) break;
    ++applied;
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(PlacementMovedVersion(refused), std::optional<uint64_t>(version + 1)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("is on server 2 under it, not on this server 0"));
  EXPECT_THAT(refused.message(), HasSubstr("this client follows no /placement"));
  EXPECT_EQ(PlacementMovedVersion(client->GetParam(moving).status()),
            std::optional<uint64_t>(version + 1));

  // The block that stays is served, pushes and reads alike.
  ASSERT_OK(client->SendGrad(staying, Tensor::FromValues<float>({2}, {-1, -2})));
  ASSERT_OK_AND_ASSIGN(Tensor w, client->GetParam(staying));
  EXPECT_EQ(w.ToVector<float>(), (std::vector<float>{2, 4}));

  // Nothing of the refused push was applied: back on the old placement the
  // block holds exactly the acknowledged pushes.
  v1::Placement back = next;
  back.set_num_servers(2);
  back.set_version(version + 2);
  ASSERT_OK(etcd_client_->Put(etcd_keys::PlacementKey(), FormatPlacementRecord(back)));
  absl::StatusOr<Tensor> read = absl::UnknownError("not read");
  for (int i = 0; i < 6000 && absl::Now() < deadline; ++i) {
    read = client->GetParam(moving);
    if (read.ok()) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_OK(read.status());
  EXPECT_EQ(read->ToVector<float>(),
            (std::vector<float>{static_cast<float>(applied), static_cast<float>(2 * applied)}));
}

// A trainer that pushes one gradient of -1 (SGD, learning rate 1: +1 a
// step) to every parameter per step, alternating SendGrads and PushPull
// (whose outputs it checks), until stopped; it stops at its first error. It
// can be paused between steps.
class Trainer {
 public:
  Trainer(Client& client, std::vector<std::string> names)
      : client_(client), names_(std::move(names)), thread_([this] { Run(); }) {}
  ~Trainer() { Stop(); }

  // Steps acknowledged so far.
  int steps() const {
    absl::MutexLock lock(&mu_);
    return steps_;
  }
  // Waits until the trainer is between steps; false after 60 s.
  bool Pause() {
    absl::MutexLock lock(&mu_);
    pause_ = true;
    return mu_.AwaitWithTimeout(absl::Condition(&paused_), absl::Seconds(60));
  }
  void Resume() {
    absl::MutexLock lock(&mu_);
    pause_ = false;
  }
  // Stops the trainer; its error, if any.
  absl::Status Stop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
    absl::MutexLock lock(&mu_);
    return error_;
  }

 private:
  void Run() {
    std::vector<NamedTensor> step;
    for (const std::string& name : names_) {
      step.push_back({name, Tensor::FromValues<float>({2}, {-1, -1})});
    }
    std::vector<Tensor> outs(names_.size());
    for (int i = 0;; ++i) {
      int done = 0;
      {
        absl::MutexLock lock(&mu_);
        paused_ = pause_;
        // Paused: until resumed or stopped (at most 120 s).
        const bool resumed = mu_.AwaitWithTimeout(
            absl::Condition(+[](Trainer* t) { return !t->pause_ || t->stop_; }, this),
            absl::Seconds(120));
        paused_ = false;
        if (stop_ || !resumed) return;
        done = steps_;
      }
      absl::Status status = i % 2 == 0 ? client_.SendGrads(step)
                                        : client_.PushPull(step, absl::MakeSpan(outs));
      if (status.ok() && i % 2 == 1) {
        const float expected = static_cast<float>(done + 1);
        for (size_t k = 0; k < outs.size(); ++k) {
          if (outs[k].ToVector<float>() != std::vector<float>{expected, expected}) {
            status = absl::DataLossError(absl::StrCat("PushPull read ", names_[k], " as ",
                                                      outs[k].ToVector<float>()[0], ", not ",
                                                      expected));
          }
        }
      }
      absl::MutexLock lock(&mu_);
      if (!status.ok()) {
        error_ = status;
        return;
      }
      ++steps_;
    }
  }

  Client& client_;
  const std::vector<std::string> names_;
  mutable absl::Mutex mu_;
  int steps_ ABSL_GUARDED_BY(mu_) = 0;
  bool pause_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: started once everything else is
};

// 2 servers grow to 3 under a running trainer: a third server starts and
// registers, the blocks that move are handed over (here by the test: their
// exact values initialized on the new server while the trainer is paused
// between steps), /placement says moving v+1, the old owners refuse the
// moved blocks, and the trainer's client re-routes them; then v+2 (3
// servers, done). The trainer sees no error, and every parameter holds
// exactly one update per acknowledged step.
TEST_F(PlacementRedirectTest, ATrainerPushingThroughAMoveFromTwoToThreeServersSeesNoError) {
  StartTwo();
  ASSERT_EQ(servers_.size(), 2u);
  std::unique_ptr<Client> client = Follower();
  ASSERT_NE(client, nullptr);
  const uint64_t version = client->placement().version();
  ASSERT_GE(version, 1u);
  const std::string moving0 = NameMoving(0, 2);
  const std::string moving1 = NameMoving(1, 2);
  const std::vector<std::string> names = {moving0, moving1, NameMoving(0, 0), NameMoving(1, 1)};
  v1::ParameterConfig sgd;
  sgd.mutable_optimizer()->mutable_sgd();
  sgd.mutable_learning_rate()->set_learning_rate(1.0);
  for (const std::string& name : names) {
    ASSERT_OK(client->InitParam(name, Tensor::FromValues<float>({2}, {0, 0}), sgd));
  }
  ASSERT_OK(client->FinishInitParams());

  Trainer trainer(*client, names);
  ASSERT_TRUE(Eventually([&] { return trainer.steps() >= 3; }));

  // A third server joins as index 2 (registered by the test: the servers'
  // own join is the coordinator's part, issue 16 step 2).
  ServerOptions third_options;
  third_options.index = 2;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> third, Server::Start(third_options));
  ASSERT_OK(etcd_client_->Put(etcd_keys::ServerKey(2),
                              etcd_keys::FormatServerValue({third->address(),
                                                            third->instance_id(), ""})));
  ASSERT_TRUE(Eventually([&] {
    const std::vector<std::string> addresses = client->addresses();
    return addresses.size() == 3 && addresses[2] == third->address();
  }));
  EXPECT_EQ(client->num_servers(), 2);  // nothing routed there yet

  // The hand-over: between two steps, the moving blocks' exact values go
  // to the new owner; then the old owners refuse them.
  ASSERT_TRUE(trainer.Pause()) << trainer.Stop();
  ASSERT_OK_AND_ASSIGN(std::vector<Tensor> values, client->GetParams({moving0, moving1}));
  std::unique_ptr<Client> to_third = Direct({third->address()});
  ASSERT_NE(to_third, nullptr);
  ASSERT_OK(to_third->InitParam(moving0, values[0], sgd));
  ASSERT_OK(to_third->InitParam(moving1, values[1], sgd));
  ASSERT_OK(to_third->FinishInitParams());
  PutPlacement(Spec(version + 1, 3, /*from=*/2));
  std::unique_ptr<Client> probe =
      Direct({servers_[0]->address(), servers_[1]->address()});
  ASSERT_NE(probe, nullptr);
  for (const std::string& name : {moving0, moving1}) {
    ASSERT_TRUE(Eventually([&] {
      return PlacementMovedVersion(probe->GetParam(name).status()) == version + 1;
    })) << name;
  }
  const int paused_at = trainer.steps();
  trainer.Resume();

  // The trainer's pushes to the old owners are refused and re-routed.
  ASSERT_TRUE(Eventually([&] {
    return client->redirects() >= 2 && trainer.steps() >= paused_at + 4;
  })) << trainer.Stop();
  EXPECT_EQ(client->etcd_placement_version(), version + 1);
  EXPECT_EQ(client->num_servers(), 3);

  // The move is done: 3 servers for everything, no more redirects (the
  // trainer paused meanwhile, so that no step in flight was routed before).
  ASSERT_TRUE(trainer.Pause()) << trainer.Stop();
  PutPlacement(Spec(version + 2, 3));
  ASSERT_TRUE(Eventually([&] { return client->etcd_placement_version() == version + 2; }));
  const int done_at = trainer.steps();
  const uint64_t redirects = client->redirects();
  trainer.Resume();
  ASSERT_TRUE(Eventually([&] { return trainer.steps() >= done_at + 4; })) << trainer.Stop();
  ASSERT_OK(trainer.Stop());
  EXPECT_EQ(client->redirects(), redirects);

  const float steps = static_cast<float>(trainer.steps());
  ASSERT_OK_AND_ASSIGN(std::vector<Tensor> final_values, client->GetParams(names));
  for (size_t k = 0; k < names.size(); ++k) {
    EXPECT_EQ(final_values[k].ToVector<float>(), (std::vector<float>{steps, steps})) << names[k];
  }
  // The old owners hold the moved blocks as they handed them over.
  for (int i = 0; i < 2; ++i) {
    v1::ParamRef ref;
    ref.set_name(names[i]);
    v1::Parameter held;
    ASSERT_OK(servers_[i]->store().Get(ref, &held));
    EXPECT_EQ(held.content(), std::string(values[i].bytes())) << names[i];
    EXPECT_EQ(values[i].ToVector<float>(),
              (std::vector<float>{static_cast<float>(paused_at), static_cast<float>(paused_at)}));
  }
}

TEST_F(PlacementRedirectTest, NeedsEtcd) {
  ServerOptions options;
  options.placement_redirects = true;
  EXPECT_THAT(Server::Start(options),
              ::pserver::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("--placement_redirects needs --etcd")));
}

}  // namespace
}  // namespace pserver
