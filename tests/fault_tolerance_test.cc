// Fault tolerance with in-process servers and a real etcd: checkpoints that
// fail their checksums, a crash between writing and publishing a checkpoint,
// etcd restarting under running servers, and exactly-once gradients when a
// reply is lost. The whole-cluster test with server processes killed by
// SIGKILL is recovery_test.cc. Every wait is bounded in count and time.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/client/grpc_transport.h"
#include "cc/core/checkpoint.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/shard_config.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/server/server.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "pserver/v1/service.grpc.pb.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusCodeIs;
using ::pserver::testing::StatusIs;
using ::testing::Contains;
using ::testing::HasSubstr;

v1::ParameterConfig Sgd(double lr) {
  v1::ParameterConfig config;
  config.mutable_optimizer()->mutable_sgd();
  config.mutable_learning_rate()->set_learning_rate(lr);
  return config;
}

std::string NewTempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(base != nullptr ? base : "/tmp", "/", name, "-", getpid(), "-",
                                 absl::ToUnixNanos(absl::Now()));
  std::filesystem::create_directories(dir);
  return dir;
}

// Waits until `done()` holds, checking every 20 ms, for at most `timeout`.
template <typename Pred>
bool WaitFor(Pred done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (int i = 0; i < 100000; ++i) {
    if (done()) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// The trainers the server behind `stub` lists, within 10 s.
grpc::Status ListWorkers(v1::ParameterServer::Stub& stub, v1::ListWorkersResponse* workers) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  return stub.ListWorkers(&context, v1::ListWorkersRequest(), workers);
}

class FaultToleranceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(etcd_, testing::EtcdProcess::Start());
    checkpoint_dir_ = NewTempDir("ckpt");
    EtcdClientOptions options;
    options.endpoints = {etcd_->endpoint()};
    options.prefix = etcd_keys::ClusterPrefix("test");
    ASSERT_OK_AND_ASSIGN(etcd_client_, EtcdClient::Connect(options));
  }

  ServerOptions EtcdServer(uint32_t num_servers = 1) const {
    ServerOptions options;
    options.etcd_endpoints = {etcd_->endpoint()};
    options.cluster = "test";
    options.num_servers = num_servers;
    options.lease_ttl = absl::Seconds(2);
    options.register_timeout = absl::Seconds(20);
    options.checkpoint_dir = checkpoint_dir_;
    return options;
  }

  ClientOptions EtcdClientOpts() const {
    ClientOptions options;
    options.etcd_endpoints = {etcd_->endpoint()};
    options.cluster = "test";
    options.timeout = absl::Seconds(20);
    options.discovery_timeout = absl::Seconds(20);
    options.initial_backoff = absl::Milliseconds(10);
    options.worker_lease_ttl = absl::Seconds(2);
    return options;
  }

  std::unique_ptr<testing::EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> etcd_client_;
  std::string checkpoint_dir_;
};

// Flips one byte in the middle of a file.
void FlipByte(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  ASSERT_GT(size, 0) << path;
  f.seekg(size / 2);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x5a;
  f.seekp(size / 2);
  f.write(&c, 1);
  ASSERT_TRUE(f.good());
}

TEST_F(FaultToleranceTest, CorruptCheckpointFallsBackToThePreviousGoodOne) {
  ServerOptions options = EtcdServer();
  options.checkpoint_on_shutdown = false;
  std::string first_path, second_path;
  {
    ASSERT_OK_AND_ASSIGN(auto server, Server::Start(options));
    EXPECT_EQ(server->index(), 0u);
    ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(EtcdClientOpts()));
    ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({4}, {1, 2, 3, 4}), Sgd(1)));
    ASSERT_OK(client->FinishInitParams());
    ASSERT_OK(client->SendGrad("w", Tensor::FromValues<float>({4}, {1, 1, 1, 1})));
    ASSERT_OK_AND_ASSIGN(CheckpointInfo first, server->Save());  // w = 0 1 2 3
    ASSERT_OK(client->SendGrad("w", Tensor::FromValues<float>({4}, {1, 1, 1, 1})));
    ASSERT_OK_AND_ASSIGN(CheckpointInfo second, server->Save());  // w = -1 0 1 2
    EXPECT_GT(second.sequence, first.sequence);
    first_path = first.path;
    second_path = second.path;
    // Published in etcd only once durable: it names the newest.
    ASSERT_OK_AND_ASSIGN(KeyValue published, etcd_client_->Get(etcd_keys::CheckpointKey(0)));
    EXPECT_THAT(published.value, HasSubstr(second.path));
    server->Shutdown();  // gives index 0 back
  }
  ASSERT_NO_FATAL_FAILURE(FlipByte(second_path + "/data-00000.bin"));

  ASSERT_OK_AND_ASSIGN(auto restarted, Server::Start(options));
  EXPECT_EQ(restarted->index(), 0u);
  const std::string messages = absl::StrJoin(restarted->load_messages(), "\n");
  EXPECT_THAT(messages, HasSubstr("checkpoint file checksum validation failed"));
  EXPECT_THAT(messages, HasSubstr(second_path + "/data-00000.bin"));
  ASSERT_TRUE(restarted->loaded_checkpoint().has_value()) << messages;
  EXPECT_EQ(restarted->loaded_checkpoint()->path, first_path);

  ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(EtcdClientOpts()));
  ASSERT_OK_AND_ASSIGN(Tensor w, client->GetParam("w"));
  EXPECT_EQ(w.ToVector<float>(), (std::vector<float>{0, 1, 2, 3}));
  // Still training: gradients apply on top of the restored state.
  ASSERT_OK(client->SendGrad("w", Tensor::FromValues<float>({4}, {1, 1, 1, 1})));
  ASSERT_OK_AND_ASSIGN(w, client->GetParam("w"));
  EXPECT_EQ(w.ToVector<float>(), (std::vector<float>{-1, 0, 1, 2}));
}

TEST_F(FaultToleranceTest, CrashBetweenWritingAndPublishingLeavesThePreviousOneUsable) {
  ServerOptions options = EtcdServer();
  options.checkpoint_on_shutdown = false;
  std::string published_path;
  {
    ASSERT_OK_AND_ASSIGN(auto server, Server::Start(options));
    ASSERT_OK(server->store().Init(
        [] {
          v1::Parameter p;
          p.set_name("w");
          p.set_element_type(v1::FLOAT32);
          p.add_shape(2);
          Tensor t = Tensor::FromValues<float>({2}, {5, 6});
          p.set_content(std::string(t.bytes()));
          return p;
        }(),
        Sgd(1)));
    server->store().FinishInit();
    ASSERT_OK_AND_ASSIGN(CheckpointInfo published, server->Save());
    published_path = published.path;
    // The crash: a newer checkpoint written (durable, renamed) but never
    // published, and a save that died halfway, before its rename.
    StoreSnapshot newer = server->store().Snapshot();
    ASSERT_OK(
        SaveCheckpoint(newer, checkpoint_dir_ + "/shard-0", 0, published.sequence + 1).status());
    std::filesystem::create_directories(checkpoint_dir_ +
                                        "/shard-0/.tmp-ckpt-00000000000000000099-0123456789abcdef");
    std::ofstream(checkpoint_dir_ +
                  "/shard-0/.tmp-ckpt-00000000000000000099-0123456789abcdef/data-00000.bin")
        << "half a file";
  }  // the destructor stops the server (no final save)

  ASSERT_OK_AND_ASSIGN(auto restarted, Server::Start(options));
  ASSERT_TRUE(restarted->loaded_checkpoint().has_value())
      << absl::StrJoin(restarted->load_messages(), "\n");
  EXPECT_EQ(restarted->loaded_checkpoint()->path, published_path)
      << "etcd's checkpoint is the one to load";
  ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(EtcdClientOpts()));
  ASSERT_OK_AND_ASSIGN(Tensor w, client->GetParam("w"));
  EXPECT_EQ(w.ToVector<float>(), (std::vector<float>{5, 6}));
  // The next save numbers past both and cleans up the crashed one.
  ASSERT_OK_AND_ASSIGN(CheckpointInfo next, restarted->Save());
  EXPECT_GT(next.sequence, restarted->loaded_checkpoint()->sequence + 1);
  EXPECT_FALSE(std::filesystem::exists(checkpoint_dir_ +
                                       "/shard-0/.tmp-ckpt-00000000000000000099-0123456789abcdef"));
  ASSERT_OK_AND_ASSIGN(KeyValue record, etcd_client_->Get(etcd_keys::CheckpointKey(0)));
  EXPECT_THAT(record.value, HasSubstr(next.path));
}

TEST_F(FaultToleranceTest, ServersReRegisterAfterEtcdRestartsAndKeepServing) {
  ASSERT_OK_AND_ASSIGN(auto a, Server::Start(EtcdServer(2)));
  ASSERT_OK_AND_ASSIGN(auto b, Server::Start(EtcdServer(2)));
  EXPECT_NE(a->index(), b->index());
  ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(EtcdClientOpts()));
  ASSERT_EQ(client->num_servers(), 2);
  ASSERT_OK(client->InitParam("a", Tensor::FromValues<float>({2}, {0, 0}), Sgd(1)));
  ASSERT_OK(client->InitParam("b", Tensor::FromValues<float>({2}, {0, 0}), Sgd(1)));
  ASSERT_OK(client->FinishInitParams());

  // The trainer is registered, and a server lists it.
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(a->address(), grpc::InsecureChannelCredentials()));
  {
    v1::ListWorkersResponse workers;
    ASSERT_TRUE(ListWorkers(*stub, &workers).ok());
    ASSERT_EQ(workers.workers_size(), 1);
    EXPECT_EQ(workers.workers(0).id(), client->worker_id());
    EXPECT_EQ(workers.workers(0).pid(), getpid());
  }

  ASSERT_OK(etcd_->Kill());
  // Down for longer than the leases: both servers and the trainer notice
  // they lost theirs.
  ASSERT_TRUE(WaitFor(
      [&] {
        return a->leases_lost() >= 1 && b->leases_lost() >= 1 && client->worker_leases_lost() >= 1;
      },
      absl::Seconds(20)));
  // Reads go on without etcd; writes are refused: a server whose lease is
  // not confirmed may have lost its index to another (docs/replication.md).
  ASSERT_OK_AND_ASSIGN(Tensor read, client->GetParam("a"));
  EXPECT_EQ(read.ToVector<float>(), (std::vector<float>{0, 0}));
  for (Server* s : {a.get(), b.get()}) {
    auto direct = v1::ParameterServer::NewStub(
        grpc::CreateChannel(s->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::SendGradRequest push;
    push.mutable_gradient()->set_name("a");
    v1::SendGradResponse pushed;
    const grpc::Status refused = direct->SendGrad(&context, push, &pushed);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
    EXPECT_THAT(refused.error_message(),
                HasSubstr(absl::StrCat("lease for /ps/", s->index(), " not confirmed")));
    EXPECT_FALSE(s->stepped_down()) << "etcd unreachable proves nothing: it waits";
  }
  ASSERT_OK(etcd_->Restart());
  // Once the leases are renewed again, writes are acknowledged.
  ASSERT_OK(client->SendGrad("a", Tensor::FromValues<float>({2}, {1, 1})));
  ASSERT_TRUE(WaitFor([&] { return a->registrations() >= 2 && b->registrations() >= 2; },
                      absl::Seconds(20)))
      << a->registrations() << " " << b->registrations();
  for (Server* s : {a.get(), b.get()}) {
    ASSERT_OK_AND_ASSIGN(KeyValue kv, etcd_client_->Get(etcd_keys::ServerKey(s->index())));
    EXPECT_EQ(kv.value, etcd_keys::FormatServerValue({s->address(), s->instance_id()}));
    EXPECT_EQ(kv.lease, s->lease()) << "registered under its new lease";
  }
  // The trainer registered again too.
  ASSERT_TRUE(WaitFor([&] { return client->worker_registrations() >= 2; }, absl::Seconds(20)));
  {
    v1::ListWorkersResponse workers;
    ASSERT_TRUE(ListWorkers(*stub, &workers).ok());
    ASSERT_EQ(workers.workers_size(), 1);
    EXPECT_EQ(workers.workers(0).id(), client->worker_id());
  }
  ASSERT_OK(client->SendGrad("b", Tensor::FromValues<float>({2}, {1, 1})));
  ASSERT_OK_AND_ASSIGN(std::vector<Tensor> got, client->GetParams({"a", "b"}));
  EXPECT_EQ(got[0].ToVector<float>(), (std::vector<float>{-1, -1}));
  EXPECT_EQ(got[1].ToVector<float>(), (std::vector<float>{-1, -1}));
  // A new client discovers both.
  ASSERT_OK_AND_ASSIGN(auto late, Client::Connect(EtcdClientOpts()));
  EXPECT_EQ(late->addresses(), client->addresses());
}

// A checkpoint is published only while etcd /shards/<i> holds the server's
// epoch: once another claim moved it on (here written by hand while this
// server's lease still lives, which no etcd-side fence could catch), the
// publish transaction fails, the files it wrote are deleted and the server
// steps down.
TEST_F(FaultToleranceTest, ACheckpointIsPublishedOnlyUnderTheServersEpoch) {
  ASSERT_OK_AND_ASSIGN(auto server, Server::Start(EtcdServer()));
  EXPECT_EQ(server->epoch(), 1u);
  ASSERT_OK_AND_ASSIGN(KeyValue shard, etcd_client_->Get(etcd_keys::ShardKey(0)));
  ASSERT_OK_AND_ASSIGN(v1::ShardConfig config, ParseShardConfig(0, shard.value));
  EXPECT_EQ(config.epoch(), 1u);
  EXPECT_EQ(config.holder(), server->instance_id());
  ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(EtcdClientOpts()));
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({2}, {0, 0}), Sgd(1)));
  ASSERT_OK(client->FinishInitParams());
  ASSERT_OK(client->SendGrad("w", Tensor::FromValues<float>({2}, {1, 1})));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo first, server->Save());
  EXPECT_EQ(first.epoch, 1u);
  ASSERT_OK_AND_ASSIGN(KeyValue published, etcd_client_->Get(etcd_keys::CheckpointKey(0)));
  EXPECT_THAT(published.value, HasSubstr("\"epoch\":\"1\""));

  v1::ShardConfig other;
  other.set_epoch(2);
  other.set_holder("b0b0b0b0b0b0b0b0");
  ASSERT_OK(etcd_client_->Put(etcd_keys::ShardKey(0), FormatShardConfig(other)));
  absl::StatusOr<CheckpointInfo> refused = server->Save();
  EXPECT_THAT(refused.status(), StatusIs(absl::StatusCode::kUnavailable,
                                         HasSubstr("no longer holds this server's epoch 1")));
  EXPECT_TRUE(server->stepped_down());
  ASSERT_OK_AND_ASSIGN(KeyValue after, etcd_client_->Get(etcd_keys::CheckpointKey(0)));
  EXPECT_EQ(after.value, published.value) << "nothing published";
  ASSERT_OK_AND_ASSIGN(std::vector<CheckpointEntry> on_disk,
                       ListCheckpoints(checkpoint_dir_ + "/shard-0"));
  ASSERT_EQ(on_disk.size(), 1u) << "the refused checkpoint's files were deleted";
  EXPECT_EQ(on_disk[0].path, first.path);
  // Stepped down: nothing more is acknowledged, nor saved at shutdown.
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::SaveResponse saved;
  const grpc::Status save = stub->Save(&context, v1::SaveRequest(), &saved);
  EXPECT_EQ(save.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(save.error_message(), HasSubstr("stepped down from shard 0"));
  client.reset();
  server->Shutdown();
  EXPECT_THAT(server->final_save_status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no final checkpoint")));
  ASSERT_OK_AND_ASSIGN(on_disk, ListCheckpoints(checkpoint_dir_ + "/shard-0"));
  EXPECT_EQ(on_disk.size(), 1u);
}

// etcd lost its data (a fresh etcd): a server claims the shard above the
// epochs its checkpoints on disk record, so its new checkpoints sort above
// the old ones for loading and pruning.
// A server's own change of backups (a standby listed, a backup dropped)
// writes /shards/<i> one epoch up a moment before the server's own copy of
// it follows; a checkpoint published in between was refused and the server
// stepped down as if another had claimed its shard (the standby then took
// the shard over: one failure of replication_partition_test under load).
// Here that moment is held open: etcd names this server as holder one
// epoch up while the server still holds the old value. The checkpoint is
// published (against etcd's value) and the server serves on; a holder
// that is another server still makes it step down (above).
TEST_F(FaultToleranceTest, ACheckpointIsPublishedWhileItsOwnChangeOfBackupsMovedTheEpoch) {
  ASSERT_OK_AND_ASSIGN(auto server, Server::Start(EtcdServer()));
  ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(EtcdClientOpts()));
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({2}, {0, 0}), Sgd(1)));
  ASSERT_OK(client->FinishInitParams());
  ASSERT_OK_AND_ASSIGN(KeyValue shard, etcd_client_->Get(etcd_keys::ShardKey(0)));
  ASSERT_OK_AND_ASSIGN(v1::ShardConfig config, ParseShardConfig(0, shard.value));
  ASSERT_EQ(config.holder(), server->instance_id());
  config.set_epoch(config.epoch() + 1);
  config.add_replicas("a1a1a1a1a1a1a1a1");
  ASSERT_OK(etcd_client_->Put(etcd_keys::ShardKey(0), FormatShardConfig(config)));

  ASSERT_OK(client->SendGrad("w", Tensor::FromValues<float>({2}, {1, 1})));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo saved, server->Save());
  EXPECT_FALSE(server->stepped_down());
  ASSERT_OK_AND_ASSIGN(KeyValue published, etcd_client_->Get(etcd_keys::CheckpointKey(0)));
  EXPECT_THAT(published.value, HasSubstr(saved.path));
  ASSERT_OK(client->SendGrad("w", Tensor::FromValues<float>({2}, {1, 1})));
  ASSERT_OK_AND_ASSIGN(Tensor w, client->GetParam("w"));
  EXPECT_EQ(w.ToVector<float>(), (std::vector<float>{-2, -2}));
  client.reset();
  server->Shutdown();
}

TEST_F(FaultToleranceTest, AClaimAfterEtcdLostItsDataGoesAboveTheEpochsOnDisk) {
  ASSERT_OK_AND_ASSIGN(auto server, Server::Start(EtcdServer()));
  ASSERT_EQ(server->epoch(), 1u);
  ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(EtcdClientOpts()));
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({2}, {0, 0}), Sgd(1)));
  ASSERT_OK(client->FinishInitParams());
  ASSERT_OK(client->SendGrad("w", Tensor::FromValues<float>({2}, {1, 1})));
  ASSERT_OK(server->Save().status());
  client.reset();
  server.reset();  // saves a last checkpoint at epoch 1

  ASSERT_OK(etcd_client_->DeletePrefix("/"));  // every key of the cluster gone
  ASSERT_OK_AND_ASSIGN(server, Server::Start(EtcdServer()));
  EXPECT_EQ(server->epoch(), 2u) << "above epoch 1 on disk, not 1 again";
  ASSERT_TRUE(server->loaded_checkpoint().has_value());
  EXPECT_EQ(server->loaded_checkpoint()->epoch, 1u);
  for (int i = 0; i < 3; ++i) ASSERT_OK(server->Save().status());
  ASSERT_OK_AND_ASSIGN(std::vector<CheckpointEntry> kept,
                       ListCheckpointsInLoadOrder(checkpoint_dir_ + "/shard-0"));
  ASSERT_EQ(kept.size(), 3u);
  for (const CheckpointEntry& entry : kept) EXPECT_EQ(entry.epoch, 2u) << entry.path;
  ASSERT_OK_AND_ASSIGN(auto reader, Client::Connect(EtcdClientOpts()));
  ASSERT_OK_AND_ASSIGN(Tensor w, reader->GetParam("w"));
  EXPECT_EQ(w.ToVector<float>(), (std::vector<float>{-1, -1}));
}

// Without any write to refuse, a server whose lease ran out re-reads
// /shards/<i> on its own and steps down when another holder is there.
TEST_F(FaultToleranceTest, AnIdleServerWhoseShardMovedOnStepsDownByItself) {
  ASSERT_OK_AND_ASSIGN(auto server, Server::Start(EtcdServer()));
  v1::ShardConfig other;
  other.set_epoch(server->epoch() + 1);
  other.set_holder("c0c0c0c0c0c0c0c0");
  ASSERT_OK(etcd_client_->Put(etcd_keys::ShardKey(0), FormatShardConfig(other)));
  ASSERT_OK(etcd_client_->Revoke(server->lease()));  // as if it had expired
  ASSERT_TRUE(WaitFor([&] { return server->stepped_down(); }, absl::Seconds(30)));
  EXPECT_THAT(server->final_save_status(), StatusCodeIs(absl::StatusCode::kOk));
  server->Shutdown();
  EXPECT_THAT(server->final_save_status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("epoch 2")));
}

TEST_F(FaultToleranceTest, ClientFollowsAServerRestartedOnTheSamePort) {
  ServerOptions options = EtcdServer();
  auto server = Server::Start(options);
  ASSERT_OK(server.status());
  ClientOptions client_options = EtcdClientOpts();
  client_options.attempt_timeout = absl::Seconds(1);
  ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(client_options));
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({2}, {0, 0}), Sgd(1)));
  ASSERT_OK(client->FinishInitParams());
  ASSERT_OK(client->SendGrad("w", Tensor::FromValues<float>({2}, {1, 1})));
  const int port = (*server)->port();
  (*server)->Shutdown();  // saves a last checkpoint and gives index 0 back
  server->reset();

  options.port = port;
  ASSERT_OK_AND_ASSIGN(auto restarted, Server::Start(options));
  ASSERT_TRUE(restarted->loaded_checkpoint().has_value());
  ASSERT_TRUE(WaitFor([&] { return client->address_changes() >= 1; }, absl::Seconds(10)));
  // The same client carries on, with the state the checkpoint kept.
  ASSERT_OK(client->SendGrad("w", Tensor::FromValues<float>({2}, {1, 1})));
  ASSERT_OK_AND_ASSIGN(Tensor w, client->GetParam("w"));
  EXPECT_EQ(w.ToVector<float>(), (std::vector<float>{-2, -2}));
}

TEST_F(FaultToleranceTest, DiscoveryNamesTheMissingServers) {
  ASSERT_OK_AND_ASSIGN(auto a, Server::Start(EtcdServer(3)));
  ClientOptions options = EtcdClientOpts();
  options.discovery_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  EXPECT_THAT(client.status(), testing::StatusIs(absl::StatusCode::kDeadlineExceeded,
                                                 HasSubstr("2 of 3 servers missing")));
}

// ---- exactly-once ---------------------------------------------------------------

TEST(ExactlyOnceTest, DroppedRepliesAreRetriedAndAppliedOnce) {
  ServerOptions options;
  options.drop_reply_after_apply_every_n = 3;
  ASSERT_OK_AND_ASSIGN(auto server, Server::Start(options));
  ClientOptions client_options;
  client_options.servers = {server->address()};
  client_options.timeout = absl::Seconds(20);
  client_options.initial_backoff = absl::Milliseconds(1);
  ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(client_options));
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<double>({3}, {0, 0, 0}), Sgd(1)));
  ASSERT_OK(client->FinishInitParams());

  constexpr int kPushes = 30;
  for (int i = 0; i < kPushes; ++i) {
    ASSERT_OK(client->SendGrad("w", Tensor::FromValues<double>({3}, {1, 2, 3})));
  }
  Tensor out;
  for (int i = 0; i < kPushes; ++i) {
    ASSERT_OK(client->PushPull({NamedTensor{"w", Tensor::FromValues<double>({3}, {1, 2, 3})}},
                               absl::MakeSpan(&out, 1)));
    // The pull half sees exactly i + 1 more pushes.
    EXPECT_EQ(out.ToVector<double>()[0], -(kPushes + i + 1.0));
  }
  ASSERT_OK_AND_ASSIGN(Tensor w, client->GetParam("w"));
  EXPECT_EQ(w.ToVector<double>(), (std::vector<double>{-60, -120, -180}));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ServerStats> stats, client->GetStats());
  EXPECT_EQ(stats[0].gradients_applied(), 2u * kPushes);
  EXPECT_EQ(stats[0].replies_dropped(), 2u * kPushes / 3);
  EXPECT_EQ(stats[0].duplicates_ignored(), 2u * kPushes / 3);
  EXPECT_GE(client->retries(), 2u * kPushes / 3);
}

// Sends one push with a given request id straight through a transport.
absl::Status PushWithId(Transport& transport, RequestId id, const std::string& name,
                        const Tensor& grad) {
  GradientView view;
  view.name = name;
  view.type = grad.type();
  view.content = grad.bytes();
  absl::Notification done;
  absl::Status result;
  transport.Push(id, absl::MakeConstSpan(&view, 1), absl::Now() + absl::Seconds(10),
                 [&](absl::Status s) {
                   result = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  return result;
}

TEST(ExactlyOnceTest, AppliedSequencesSurviveACheckpoint) {
  ServerOptions options;
  options.checkpoint_dir = NewTempDir("exactly-once");
  options.checkpoint_on_shutdown = true;
  const Tensor grad = Tensor::FromValues<float>({2}, {1, 1});
  const RequestId first{0xfeed, 1};
  const RequestId concurrent_later{0xfeed, 3};
  {
    ASSERT_OK_AND_ASSIGN(auto server, Server::Start(options));
    ClientOptions client_options;
    client_options.servers = {server->address()};
    ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(client_options));
    ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({2}, {0, 0}), Sgd(1)));
    ASSERT_OK(client->FinishInitParams());
    ASSERT_OK_AND_ASSIGN(auto transport, GrpcTransport::Create(server->address()));
    ASSERT_OK(PushWithId(*transport, first, "w", grad));
    ASSERT_OK(PushWithId(*transport, first, "w", grad));             // a retry: not applied again
    ASSERT_OK(PushWithId(*transport, concurrent_later, "w", grad));  // 2 still in flight
    server->Shutdown();                                              // saves a last checkpoint
  }
  ASSERT_OK_AND_ASSIGN(auto server, Server::Start(options));
  ASSERT_TRUE(server->loaded_checkpoint().has_value());
  ASSERT_OK_AND_ASSIGN(auto transport, GrpcTransport::Create(server->address()));
  ASSERT_OK(PushWithId(*transport, first, "w", grad));                 // repeat
  ASSERT_OK(PushWithId(*transport, concurrent_later, "w", grad));      // repeat
  ASSERT_OK(PushWithId(*transport, RequestId{0xfeed, 2}, "w", grad));  // new
  ClientOptions client_options;
  client_options.servers = {server->address()};
  ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(client_options));
  ASSERT_OK_AND_ASSIGN(Tensor w, client->GetParam("w"));
  EXPECT_EQ(w.ToVector<float>(), (std::vector<float>{-3, -3}));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ServerStats> stats, client->GetStats());
  EXPECT_EQ(stats[0].duplicates_ignored(), 2u);
}

TEST(ExactlyOnceTest, SaveRpcWithoutCheckpointDirIsFailedPrecondition) {
  ASSERT_OK_AND_ASSIGN(auto server, Server::Start(ServerOptions{}));
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::SaveResponse response;
  EXPECT_EQ(stub->Save(&context, v1::SaveRequest(), &response).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

}  // namespace
}  // namespace pserver
