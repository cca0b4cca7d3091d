// Live moves (issue 16 step 2, docs/elastic.md): ScaleCluster (psctl scale)
// moves dense blocks between running servers through MoveBlocks /
// ReceiveBlocks while a trainer pushes deterministic SGD steps (its client
// follows /placement and the redirects, helper cf's part), through 2 -> 3 ->
// 4 -> 2 servers: the final parameters are exact, and the bytes moved per
// change are within 1.5x of the ideal fraction. The old owner's refusal of
// a block it handed over is checked with a client that follows no
// placement. Real etcd, servers in this process over gRPC. No timing: every
// wait is a bounded loop on a condition.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <future>
#include <map>
#include <cstdlib>
#include <fstream>
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
#include "cc/core/checkpoint.h"
#include "cc/core/placement.h"
#include "cc/core/status_macros.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/placement_record.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/rpc/grpc_status.h"
#include "cc/server/move_coordinator.h"
#include "cc/server/peer_channel.h"
#include "cc/server/server.h"
#include "cc/testing/status_matchers.h"
#include "cc/testing/test_certs.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "pserver/v1/service.grpc.pb.h"
#include "tests/live_move_fixture.h"
#include "tests/step_trainer.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
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

// Pushes SGD step after step (all parameters, Gradient(p, step)) from
// `first_step` until stopped; stops at its first error.
class SgdTrainer : public StepTrainer {
 public:
  SgdTrainer(Client& client, int first_step)
      : StepTrainer(
            [&client](int step) {
              std::vector<NamedTensor> grads;
              for (int p = 0; p < kParams; ++p) {
                grads.push_back({Name(p), Tensor::FromValues<float>({Size(p)}, Gradient(p, step))});
              }
              return client.SendGrads(grads);
            },
            first_step) {}
};

class LiveMoveTest : public testing::LiveMoveFixture {
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

  // Initializes the model (SGD, learning rate 1) through `client`.
  static void InitModel(Client& client) {
    v1::ParameterConfig sgd;
    sgd.mutable_optimizer()->mutable_sgd();
    sgd.mutable_learning_rate()->set_learning_rate(1.0);
    for (int p = 0; p < kParams; ++p) {
      ASSERT_OK(client.InitParam(Name(p), Tensor::FromValues<float>({Size(p)}, Expected(p, 0)),
                                 sgd));
    }
    ASSERT_OK(client.FinishInitParams());
  }

  // On a secured cluster: a coordinator presenting a trainer's credentials
  // (`as_trainer`) is refused PERMISSION_DENIED naming the method, with
  // /placement left as it was; the admin's moves 2 -> 3 servers while a
  // trainer pushes, and every value is exact for the trainer's client and
  // for a new one.
  void MoveOnSecuredCluster(const std::function<void(ScaleOptions*)>& as_trainer) {
    StartServers(2, 2);
    ASSERT_EQ(servers_.size(), 2u);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Connect());
    InitModel(*client);
    ASSERT_FALSE(HasFatalFailure());
    auto trainer = std::make_unique<SgdTrainer>(*client, 0);
    ASSERT_TRUE(trainer->Advance(2)) << trainer->Stop();

    ASSERT_OK_AND_ASSIGN(KeyValue before, etcd_client_->Get(etcd_keys::PlacementKey()));
    ScaleOptions refused = Scale(3);
    as_trainer(&refused);
    EXPECT_THAT(ScaleCluster(refused),
                StatusIs(absl::StatusCode::kPermissionDenied,
                         AllOf(HasSubstr("trainer"), HasSubstr("MoveBlocks"),
                               HasSubstr("nothing was changed"))));
    ASSERT_OK_AND_ASSIGN(KeyValue after, etcd_client_->Get(etcd_keys::PlacementKey()));
    EXPECT_EQ(after.value, before.value);
    EXPECT_EQ(after.mod_revision, before.mod_revision);

    ASSERT_OK_AND_ASSIGN(ScaleResult result, ScaleTo(3, *client, *trainer));
    EXPECT_TRUE(result.moved);
    EXPECT_EQ(result.from, 2u);
    EXPECT_GT(result.blocks_moved, 0u);
    const int steps = trainer->steps();
    ExpectModel(*client, steps);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> fresh, Connect());
    ASSERT_EQ(fresh->num_servers(), 3);
    ExpectModel(*fresh, steps);
  }

  // Waits (bounded) until every server's own accounting (GetStats:
  // bytes of values and optimizer state held) is its share of the model
  // under `count` servers, `probes` one-block parameters of 4 float32
  // included: the old owners dropped what they handed over. Fails naming
  // the bytes each server holds against its share.
  void ExpectServersHoldTheirShare(uint32_t count, const std::vector<std::string>& probes) {
    const Placement placement = Placement::Jump(count, 0, kBlockBytes);
    std::vector<uint64_t> share(count, 0);
    for (int p = 0; p < kParams; ++p) {
      const uint64_t bytes = 4 * Size(p);
      for (uint64_t b = 0; b * kBlockBytes < bytes; ++b) {
        share[placement.ServerOf(Name(p), static_cast<uint32_t>(b))] +=
            std::min<uint64_t>(kBlockBytes, bytes - b * kBlockBytes);
      }
    }
    for (const std::string& probe : probes) share[placement.ServerOf(probe, 0)] += 16;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Connect());
    std::vector<uint64_t> held;
    for (int attempt = 0; attempt < 6000 && held != share; ++attempt) {
      if (attempt > 0) absl::SleepFor(absl::Milliseconds(10));
      ASSERT_OK_AND_ASSIGN(std::vector<v1::ServerStats> stats, client->GetStats());
      ASSERT_EQ(stats.size(), count);
      held.assign(count, 0);
      for (const v1::ServerStats& s : stats) {
        ASSERT_LT(s.index(), count);
        held[s.index()] = s.parameter_bytes() + s.optimizer_state_bytes();
      }
    }
    for (uint32_t i = 0; i < count; ++i) {
      std::printf("%u servers: server %u holds %llu bytes, its share %llu\n", count, i,
                  static_cast<unsigned long long>(held[i]),
                  static_cast<unsigned long long>(share[i]));
    }
    EXPECT_EQ(held, share);
  }

  static std::string WriteTestFile(const std::string& name, const std::string& content) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    const std::string path = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
    std::ofstream(path) << content;
    return path;
  }

  // Each shard's newest checkpoint in checkpoint_dir_ records `count`
  // servers and holds exactly the blocks placement `count` gives it, and
  // together they hold every block of the model once.
  void ExpectCheckpointsOf(uint32_t count) {
    const Placement placement = Placement::Jump(count, 0, kBlockBytes);
    std::map<std::pair<std::string, uint32_t>, int> held;
    for (uint32_t shard = 0; shard < count; ++shard) {
      SCOPED_TRACE(absl::StrCat("shard ", shard, " of ", count));
      ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded,
                           LoadLatestCheckpoint(absl::StrCat(checkpoint_dir_, "/shard-", shard)));
      EXPECT_EQ(loaded.info.placement.num_servers(), count);
      for (const BlockSnapshot& block : loaded.snapshot.blocks) {
        EXPECT_EQ(placement.ServerOf(block.name, block.block.index()), static_cast<int>(shard))
            << block.name << " block " << block.block.index();
        ++held[{block.name, block.block.index()}];
      }
    }
    size_t blocks = 0;
    for (int p = 0; p < kParams; ++p) blocks += (4 * Size(p) + kBlockBytes - 1) / kBlockBytes;
    EXPECT_EQ(held.size(), blocks);
    for (const auto& [key, n] : held) EXPECT_EQ(n, 1) << key.first << " block " << key.second;
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
    auto trainer = std::make_unique<SgdTrainer>(*client, steps);
    ASSERT_TRUE(trainer->Advance(2)) << trainer->Stop();
    ASSERT_OK_AND_ASSIGN(ScaleResult result, ScaleTo(change.to, *client, *trainer));
    steps = trainer->steps();
    EXPECT_TRUE(result.moved);
    EXPECT_EQ(result.from, now);
    EXPECT_EQ(result.to, change.to);
    ASSERT_EQ(servers_.size(), change.to);
    ExpectAboutIdeal(result, model, now, change, steps);
    // The old owners let go of what they handed over (and only that).
    ExpectServersHoldTheirShare(change.to, {leaving, staying});

    if (now == 2) {
      // (After the drop: what was dropped is still redirected, never read.)
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

// A client whose view of /placement lags past a departed server's exit
// (its watch is ignored: it never learns of the move by itself) sends to
// that server's closed port: the refused dial makes it read /placement
// again and follow it, so its SendGrads succeeds, applied exactly once.
TEST_F(LiveMoveTest, AClientThatLagsFollowsTheMoveWhenADepartedServersPortRefusesIt) {
  StartServers(3, 3);
  ASSERT_EQ(servers_.size(), 3u);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Connect());
  InitModel(*client);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> lagging, Connect([](ClientOptions* options) {
                         options->testing_ignore_placement_watch = true;
                       }));
  const uint64_t seen = lagging->etcd_placement_version();
  ASSERT_EQ(lagging->num_servers(), 3);

  // 3 -> 2 with nothing training; server 2 departs and is stopped (its
  // port closed) before the lagging client sends anything.
  ASSERT_OK_AND_ASSIGN(ScaleResult result, ScaleCluster(Scale(2)));
  ASSERT_TRUE(result.moved);
  ASSERT_TRUE(departed_of_[2]->WaitForNotificationWithTimeout(absl::Seconds(60)));
  servers_.erase(2);
  departed_of_.erase(2);
  ASSERT_EQ(lagging->etcd_placement_version(), seen);  // it has not learned of the move

  std::vector<NamedTensor> grads;
  for (int p = 0; p < kParams; ++p) {
    grads.push_back({Name(p), Tensor::FromValues<float>({Size(p)}, Gradient(p, 0))});
  }
  ASSERT_OK(lagging->SendGrads(grads));
  EXPECT_EQ(lagging->etcd_placement_version(), result.version);
  EXPECT_GT(lagging->redirects(), 0u);
  ExpectModel(*client, 1);
  ExpectModel(*lagging, 1);
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
  v1::Placement moving = stable;
  moving.set_version(stable.version() + 1);
  moving.set_num_servers(3);
  moving.set_moving(true);
  moving.set_from_num_servers(2);
  ASSERT_OK(etcd_client_->Put(etcd_keys::PlacementKey(), FormatPlacementRecord(moving)));
  EXPECT_THAT(ScaleCluster(Scale(4)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("a move from 2 to 3 servers is under way"),
                             HasSubstr("psctl scale 3"))));
  ASSERT_OK_AND_ASSIGN(KeyValue after, etcd_client_->Get(etcd_keys::PlacementKey()));
  EXPECT_EQ(after.value, FormatPlacementRecord(moving));
}

// Issue 16, moves with checkpoints: after 2 -> 3 and 3 -> 2 servers with a
// trainer running, each server's checkpoints hold only the blocks it owns
// under the new placement and record the new count; every server stopped
// (no final checkpoint: as a kill) and as many started again on the
// directory load exactly the trained values. While a move is under way a
// Save is refused.
TEST_F(LiveMoveTest, CheckpointsAfterAMoveHoldTheMovedStateForARestartOfEverything) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  checkpoint_dir_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/moved-ckpt");
  StartServers(2, 2);
  ASSERT_EQ(servers_.size(), 2u);
  std::unique_ptr<Client> client;
  ASSERT_OK_AND_ASSIGN(client, Connect());
  InitModel(*client);
  int steps = 0;
  {
    // A checkpoint of the 2 servers before any move: the older generation.
    SgdTrainer trainer(*client, steps);
    ASSERT_TRUE(trainer.Advance(3)) << trainer.Stop();
    ASSERT_OK(trainer.Stop());
    steps = trainer.steps();
    ASSERT_OK(client->SaveCheckpoint());
    ExpectCheckpointsOf(2);
  }
  for (uint32_t to : {3u, 2u}) {
    SCOPED_TRACE(absl::StrCat("to ", to, " servers"));
    auto trainer = std::make_unique<SgdTrainer>(*client, steps);
    ASSERT_TRUE(trainer->Advance(2)) << trainer->Stop();
    ASSERT_OK_AND_ASSIGN(ScaleResult result, ScaleTo(to, *client, *trainer));
    EXPECT_TRUE(result.moved);
    steps = trainer->steps();
    ASSERT_EQ(servers_.size(), to);
    ASSERT_OK(client->SaveCheckpoint());
    ExpectCheckpointsOf(to);

    // Every server stopped without a final checkpoint, then as many started.
    client.reset();
    servers_.clear();
    departed_of_.clear();
    StartServers(static_cast<int>(to), to);
    ASSERT_EQ(servers_.size(), to);
    ASSERT_OK_AND_ASSIGN(client, Connect());
    ASSERT_EQ(client->num_servers(), static_cast<int>(to));
    ExpectModel(*client, steps);
  }

  // While a move is under way (written by hand here) no server saves.
  ASSERT_OK_AND_ASSIGN(KeyValue before, etcd_client_->Get(etcd_keys::PlacementKey()));
  ASSERT_OK_AND_ASSIGN(v1::Placement stable, ParsePlacementRecord(before.value));
  v1::Placement moving = stable;
  moving.set_version(stable.version() + 1);
  moving.set_num_servers(3);
  moving.set_moving(true);
  moving.set_from_num_servers(2);
  ASSERT_OK(etcd_client_->Put(etcd_keys::PlacementKey(), FormatPlacementRecord(moving)));
  for (const auto& [index, server] : servers_) {
    std::unique_ptr<v1::ParameterServer::Stub> stub = v1::ParameterServer::NewStub(
        grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
    absl::Status saved;
    for (int i = 0; i < 6000; ++i) {
      grpc::ClientContext context;
      v1::SaveRequest request;
      v1::SaveResponse response;
      saved = FromGrpcStatus(stub->Save(&context, request, &response));
      if (!saved.ok()) break;
      absl::SleepFor(absl::Milliseconds(10));  // until the server saw the move
    }
    EXPECT_THAT(saved, StatusIs(absl::StatusCode::kUnavailable,
                                HasSubstr("a live move from 2 to 3 servers is under way")))
        << "server " << index;
  }
}

// Mutual TLS with roles from certificates (cn:<role>.<job>): the servers
// hand blocks to each other presenting their own certificate (an admin's),
// the coordinator presents an admin's; a trainer's certificate may train
// but not move (MoveBlocks, ReceiveBlocks: PERMISSION_DENIED naming them).
TEST_F(LiveMoveTest, MovesOnAClusterWithMutualTlsAndCertificateRoles) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<TestCerts> certs, TestCerts::Create());
  ASSERT_OK_AND_ASSIGN(TestCa * ca, certs->AddCa("ca"));
  CertRequest server_request;
  server_request.common_name = "admin.job-a";
  server_request.ip_addresses = {"127.0.0.1"};
  ASSERT_OK_AND_ASSIGN(CertFiles server, ca->Issue("server", server_request));
  CertRequest trainer_request;
  trainer_request.common_name = "trainer.job-a";
  ASSERT_OK_AND_ASSIGN(CertFiles trainer, ca->Issue("trainer", trainer_request));
  const TlsOptions admin_tls{.cert = server.cert, .key = server.key, .ca = ca->cert_path()};
  const TlsOptions trainer_tls{.cert = trainer.cert, .key = trainer.key, .ca = ca->cert_path()};
  secure_server_ = [&](ServerOptions* o) {
    o->tls = admin_tls;
    o->job = "job-a";
    o->auth_cert_rule = "cn:<role>.<job>";
  };
  secure_client_ = [&](ClientOptions* o) { o->tls = trainer_tls; };
  secure_scale_ = [&](ScaleOptions* o) { o->tls = admin_tls; };
  MoveOnSecuredCluster([&](ScaleOptions* o) { o->tls = trainer_tls; });
  ASSERT_FALSE(HasFatalFailure());

  // A trainer's certificate may not hand blocks to a server either.
  std::unique_ptr<v1::ParameterServer::Stub> stub = v1::ParameterServer::NewStub(
      PeerChannel(servers_.at(2)->address(), PeerCredentials{.tls = trainer_tls}));
  grpc::ClientContext context;
  v1::ReceiveBlocksResponse response;
  const absl::Status receive =
      FromGrpcStatus(stub->ReceiveBlocks(&context, v1::ReceiveBlocksRequest(), &response));
  EXPECT_THAT(receive, StatusIs(absl::StatusCode::kPermissionDenied,
                                AllOf(HasSubstr("trainer"), HasSubstr("ReceiveBlocks"))));
  // Plaintext: refused before anything is written, naming the TLS cause.
  ScaleOptions plaintext = Scale(2);
  plaintext.tls = {};
  absl::Status refused = ScaleCluster(plaintext).status();
  EXPECT_FALSE(refused.ok());
  EXPECT_THAT(refused.message(), HasSubstr("nothing was changed"));
}

// Roles from bearer tokens: the servers present --peer_token_file (an
// admin's) to each other, the coordinator an admin's token; a trainer's
// token is refused PERMISSION_DENIED naming MoveBlocks. A server with
// tokens and moves but no --peer_token_file is refused at start.
TEST_F(LiveMoveTest, MovesOnAClusterWithTokenRoles) {
  const std::string admin = "admin-token-0123456789abcdef";
  const std::string trainer = "trainer-token-0123456789abcdef";
  const std::string tokens = WriteTestFile(
      "move-tokens", absl::StrCat("admin job-a ", admin, "\ntrainer job-a ", trainer, "\n"));
  const std::string admin_file = WriteTestFile("move-admin-token", admin);
  {
    ServerOptions options = Options(2);
    options.job = "job-a";
    options.auth_tokens_file = tokens;
    EXPECT_THAT(Server::Start(options),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("--placement_redirects"),
                               HasSubstr("need --peer_token_file"))));
  }
  secure_server_ = [&](ServerOptions* o) {
    o->job = "job-a";
    o->auth_tokens_file = tokens;
    o->peer_token_file = admin_file;
  };
  secure_client_ = [&](ClientOptions* o) { o->token = trainer; };
  secure_scale_ = [&](ScaleOptions* o) { o->token = admin; };
  MoveOnSecuredCluster([&](ScaleOptions* o) { o->token = trainer; });
}

}  // namespace
}  // namespace pserver
