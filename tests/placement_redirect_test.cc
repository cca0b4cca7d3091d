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
#include "cc/server/move_coordinator.h"
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
  ~Trainer() { Stop().IgnoreError(); }

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

// 2 servers grow to 3 under a running trainer: the coordinator
// (ScaleCluster, psctl scale) writes /placement moving v+1, a third server
// joins and claims index 2, the old owners hand the moving blocks over
// (MoveBlocks) and refuse them from then on, the trainer's client re-routes
// them; then v+2 (3 servers, done). The trainer sees no error, and every
// parameter holds exactly one update per acknowledged step.
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

  ScaleOptions scale;
  scale.etcd_endpoints = {etcd_->endpoint()};
  scale.cluster = "job";
  scale.to = 3;
  scale.timeout = absl::Minutes(2);
  std::future<absl::StatusOr<ScaleResult>> scaled =
      std::async(std::launch::async, [&scale] { return ScaleCluster(scale); });
  ServerOptions third_options = Options();
  third_options.num_servers = 0;  // the count etcd says: 3 once the move began
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> third, Server::Start(third_options));
  EXPECT_EQ(third->index(), 2u);
  ASSERT_OK_AND_ASSIGN(ScaleResult result, scaled.get());
  EXPECT_EQ(result.version, version + 2);
  EXPECT_EQ(result.blocks_moved, 2u);  // the two one-block parameters

  // The old owners refuse what they handed over (a client that follows no
  // placement sees it).
  std::unique_ptr<Client> probe = Direct({servers_[0]->address(), servers_[1]->address()});
  ASSERT_NE(probe, nullptr);
  for (const std::string& name : {moving0, moving1}) {
    std::optional<uint64_t> refused = PlacementMovedVersion(probe->GetParam(name).status());
    ASSERT_TRUE(refused.has_value()) << name;
    EXPECT_GE(*refused, version + 1);
  }
  const int done_at = trainer.steps();
  ASSERT_TRUE(Eventually([&] {
    return client->etcd_placement_version() == version + 2 && trainer.steps() >= done_at + 4;
  })) << trainer.Stop();
  EXPECT_EQ(client->num_servers(), 3);
  ASSERT_OK(trainer.Stop());

  const float steps = static_cast<float>(trainer.steps());
  ASSERT_OK_AND_ASSIGN(std::vector<Tensor> final_values, client->GetParams(names));
  for (size_t k = 0; k < names.size(); ++k) {
    EXPECT_EQ(final_values[k].ToVector<float>(), (std::vector<float>{steps, steps})) << names[k];
  }
  // The moved blocks live on the new server now.
  for (const std::string& name : {moving0, moving1}) {
    v1::ParamRef ref;
    ref.set_name(name);
    v1::Parameter held;
    ASSERT_OK(third->store().Get(ref, &held));
    Tensor value = final_values[name == moving0 ? 0 : 1];
    EXPECT_EQ(held.content(), std::string(value.bytes())) << name;
  }
}

TEST_F(PlacementRedirectTest, NeedsEtcd) {
  ServerOptions options;
  options.placement_redirects = true;
  EXPECT_THAT(Server::Start(options),
              ::pserver::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("--placement_redirects needs --etcd")));
}

// --move_batch_bytes outside [1024, --max_message_bytes / 2]: Start fails
// naming the flag and the range (docs/limits.md). Each try in a cluster of
// its own, so a failed start's registration is in no one's way.
TEST_F(PlacementRedirectTest, StartRefusesAMoveBatchOutsideItsRange) {
  ServerOptions options = Options();
  options.num_servers = 1;
  const uint64_t most = options.max_message_bytes / 2;
  for (uint64_t bad : {uint64_t{0}, uint64_t{1023}, most + 1}) {
    options.cluster = absl::StrCat("batch-", bad);
    options.move_batch_bytes = bad;
    EXPECT_THAT(Server::Start(options),
                ::pserver::testing::StatusIs(
                    absl::StatusCode::kInvalidArgument,
                    HasSubstr(absl::StrCat("--move_batch_bytes must be in [1024, "
                                           "--max_message_bytes / 2 = ",
                                           most, "], got ", bad))));
  }
}

}  // namespace
}  // namespace pserver
