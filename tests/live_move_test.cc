// Live moves (issue 16 step 2, docs/elastic.md): ScaleCluster (psctl scale)
// moves dense blocks between running servers through MoveBlocks /
// ReceiveBlocks while a trainer pushes deterministic SGD steps (its client
// follows /placement and the redirects, helper cf's part), through 2 -> 3 ->
// 4 -> 2 servers: the final parameters are exact, and the bytes moved per
// change are within 1.5x of the ideal fraction. The old owner's refusal of
// a block it handed over is checked with a client that follows no
// placement. Real etcd, servers in this process over gRPC. No timing: every
// wait is a bounded loop on a condition.
#include <cmath>
#include <cstdint>
#include <future>
#include <map>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/core/placement.h"
#include "cc/core/status_macros.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/placement_record.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/rpc/grpc_status.h"
#include "cc/server/move_coordinator.h"
#include "cc/server/server.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/live_move_fixture.h"
#include "pserver/v1/service.grpc.pb.h"

namespace pserver {
namespace {

using ::pserver::testing::LiveMoveFixture;
using ::pserver::testing::StatusIs;
using ::pserver::testing::Trainer;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int kParams = 24;

std::string Name(int p) { return absl::StrCat("layer", p, "/w"); }
int64_t Size(int p) { return 100 + 27 * p; }

// The model as SGD (learning rate 1) leaves it after `steps` steps: every
// value and gradient a multiple of 1/4 below 2^10, so float32 is exact.
std::vector<float> Expected(int p, int steps) {
  std::vector<float> w(Size(p));
  for (int64_t e = 0; e < Size(p); ++e) w[e] = static_cast<float>((e + p) % 8);
  for (int s = 0; s < steps; ++s) {
    for (int64_t e = 0; e < Size(p); ++e) w[e] -= 0.25f * static_cast<float>((e + s + p) % 4);
  }
  return w;
}

std::vector<float> Gradient(int p, int step) {
  std::vector<float> g(Size(p));
  for (int64_t e = 0; e < Size(p); ++e) g[e] = 0.25f * static_cast<float>((e + step + p) % 4);
  return g;
}

// One SGD step of every parameter.
absl::Status SgdStep(Client& client, int step) {
  std::vector<NamedTensor> grads;
  for (int p = 0; p < kParams; ++p) {
    grads.push_back({Name(p), Tensor::FromValues<float>({Size(p)}, Gradient(p, step))});
  }
  return client.SendGrads(grads);
}

class LiveMoveTest : public LiveMoveFixture {
 protected:
  void ExpectModel(Client& client, int steps) {
    for (int p = 0; p < kParams; ++p) {
      ASSERT_OK_AND_ASSIGN(Tensor w, client.GetParam(Name(p)));
      ASSERT_EQ(w.ToVector<float>(), Expected(p, steps)) << Name(p) << " after " << steps;
    }
  }

  static uint64_t ModelBytes() {
    uint64_t bytes = 2 * 4 * 4;  // the two probes
    for (int p = 0; p < kParams; ++p) bytes += 4 * Size(p);
    return bytes;
  }

};

TEST_F(LiveMoveTest, SgdStaysExactThroughTwoThreeFourTwoServersMovingAboutTheIdealBytes) {
  StartServers(2, 2);
  ASSERT_EQ(servers_.size(), 2u);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Connect());
  v1::ParameterConfig sgd;
  sgd.mutable_optimizer()->mutable_sgd();
  sgd.mutable_learning_rate()->set_learning_rate(1.0);
  for (int p = 0; p < kParams; ++p) {
    ASSERT_OK(client->InitParam(Name(p), Tensor::FromValues<float>({Size(p)}, Expected(p, 0)),
                                sgd));
  }
  // One-block probes, pushed only by a client that follows no placement:
  // one that leaves its server when 2 servers become 3, one that stays.
  const Placement two = Placement::Jump(2, 0, kBlockBytes);
  const Placement three = Placement::Jump(3, 0, kBlockBytes);
  std::string leaving, staying;
  for (int k = 0; k < 1000 && (leaving.empty() || staying.empty()); ++k) {
    const std::string name = absl::StrCat("probe", k);
    std::string& probe = two.ServerOf(name, 0) != three.ServerOf(name, 0) ? leaving : staying;
    if (probe.empty()) probe = name;
  }
  ASSERT_FALSE(leaving.empty());
  ASSERT_FALSE(staying.empty());
  for (const std::string& probe : {leaving, staying}) {
    ASSERT_OK(client->InitParam(probe, Tensor::FromValues<float>({4}, {1, 2, 3, 4}), sgd));
  }
  ASSERT_OK(client->FinishInitParams());
  ClientOptions direct;
  direct.servers = {servers_.at(0)->address(), servers_.at(1)->address()};
  direct.block_bytes = kBlockBytes;
  direct.timeout = absl::Seconds(60);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> old_client, Client::Connect(direct));

  const uint64_t model = ModelBytes();

  uint32_t now = 2;
  int steps = 0;
  for (const Change& change : kChanges) {
    SCOPED_TRACE(absl::StrCat(now, " -> ", change.to, " servers"));
    Trainer trainer([&](int step) { return SgdStep(*client, step); }, steps);
    ASSERT_TRUE(trainer.Advance(2)) << trainer.Stop();
    ASSERT_OK_AND_ASSIGN(ScaleResult result, ScaleTo(change.to, *client, trainer));
    steps = trainer.steps();
    EXPECT_TRUE(result.moved);
    EXPECT_EQ(result.from, now);
    EXPECT_EQ(result.to, change.to);
    ASSERT_EQ(servers_.size(), change.to);
    ExpectAboutIdeal(result, model, now, change, steps);

    if (now == 2) {
      // The old owner refuses what it handed over, and applies nothing of
      // it; what stays is served as before.
      const Tensor grad = Tensor::FromValues<float>({4}, {1, 1, 1, 1});
      absl::Status refused = old_client->SendGrad(leaving, grad);
      // Named by the move's version, or the stable one once the server saw it.
      std::optional<uint64_t> version = PlacementMovedVersion(refused);
      ASSERT_TRUE(version.has_value()) << refused;
      EXPECT_GE(*version, result.version - 1);
      EXPECT_THAT(refused.message(), HasSubstr(absl::StrCat("is on server ",
                                                            three.ServerOf(leaving, 0))));
      EXPECT_TRUE(PlacementMovedVersion(old_client->GetParam(leaving).status()).has_value());
      ASSERT_OK(old_client->SendGrad(staying, grad));
      ASSERT_OK_AND_ASSIGN(Tensor kept, old_client->GetParam(staying));
      EXPECT_EQ(kept.ToVector<float>(), (std::vector<float>{0, 1, 2, 3}));
      old_client.reset();
    }
    // Exact for the trainer's client and for one of the new count.
    ExpectModel(*client, steps);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> fresh, Connect());
    ASSERT_EQ(fresh->num_servers(), static_cast<int>(change.to));
    EXPECT_EQ(fresh->placement().version(), result.version);
    ExpectModel(*fresh, steps);
    // The refused push applied nothing; the probes moved with their values.
    ASSERT_OK_AND_ASSIGN(Tensor probe, fresh->GetParam(leaving));
    EXPECT_EQ(probe.ToVector<float>(), (std::vector<float>{1, 2, 3, 4}));
    ASSERT_OK_AND_ASSIGN(probe, fresh->GetParam(staying));
    EXPECT_EQ(probe.ToVector<float>(), (std::vector<float>{0, 1, 2, 3}));
    now = change.to;
  }

  // Run again at the count reached: nothing moves.
  ASSERT_OK_AND_ASSIGN(ScaleResult again, ScaleCluster(Scale(2)));
  EXPECT_FALSE(again.moved);
  EXPECT_EQ(again.bytes_moved, 0u);
}

TEST_F(LiveMoveTest, BadMovesAreRefusedNamingWhatIsWrong) {
  EXPECT_THAT(ScaleCluster(Scale(0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got 0")));
  EXPECT_THAT(ScaleCluster(Scale(3)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("/placement is missing")));
  StartServers(2, 2);
  ASSERT_OK_AND_ASSIGN(KeyValue before, etcd_client_->Get(etcd_keys::PlacementKey()));
  ASSERT_OK_AND_ASSIGN(v1::Placement stable, ParsePlacementRecord(before.value));

  // The servers refuse a move etcd does not hold, and copies that are not theirs.
  Server& server0 = *servers_.at(0);
  std::unique_ptr<v1::ParameterServer::Stub> stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(server0.address(), grpc::InsecureChannelCredentials()));
  auto move = [&](uint64_t version) {
    grpc::ClientContext context;
    v1::MoveBlocksRequest request;
    request.set_version(version);
    v1::MoveBlocksResponse response;
    return FromGrpcStatus(stub->MoveBlocks(&context, request, &response));
  };
  EXPECT_THAT(move(stable.version()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("(not moving)")));
  EXPECT_THAT(move(stable.version() + 5),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("not yet")));
  {
    grpc::ClientContext context;
    v1::ReceiveBlocksRequest request;
    request.set_version(stable.version());
    v1::SnapshotFile* file = request.add_files();
    file->set_name("../manifest");
    v1::ReceiveBlocksResponse response;
    EXPECT_THAT(FromGrpcStatus(stub->ReceiveBlocks(&context, request, &response)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a plain file name")));
  }

  // A move to 3 under way: a move to 4 is refused, and etcd keeps the first.
  ASSERT_OK_AND_ASSIGN(const v1::Placement moving, PutMoving(stable, 3));
  EXPECT_THAT(ScaleCluster(Scale(4)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("a move from 2 to 3 servers is under way"),
                             HasSubstr("psctl scale 3"))));
  ASSERT_OK_AND_ASSIGN(KeyValue after, etcd_client_->Get(etcd_keys::PlacementKey()));
  EXPECT_EQ(after.value, FormatPlacementRecord(moving));
}

// A server whose moves would lose or misplace state refuses MoveBlocks,
// naming why: with replication (the blocks would not reach its backups) and
// with checkpoints (they would keep what it handed over).
TEST_F(LiveMoveTest, ServersWithReplicationOrCheckpointsRefuseMoves) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string checkpoints = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/move-ckpt");
  const std::vector<std::pair<std::function<void(ServerOptions*)>, std::string>> cases = {
      {[](ServerOptions* o) { o->accept_standbys = true; },
       "live moves do not work with replication yet"},
      {[&](ServerOptions* o) { o->checkpoint_dir = checkpoints; },
       "live moves do not work with --checkpoint_dir yet"},
  };
  for (const auto& [set, refusal] : cases) {
    ServerOptions options = Options(1);
    set(&options);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server, Server::Start(options));
    std::unique_ptr<v1::ParameterServer::Stub> stub = v1::ParameterServer::NewStub(
        grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    v1::MoveBlocksRequest request;
    request.set_version(1);
    v1::MoveBlocksResponse response;
    EXPECT_THAT(FromGrpcStatus(stub->MoveBlocks(&context, request, &response)),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(refusal)));
  }
}

}  // namespace
}  // namespace pserver
