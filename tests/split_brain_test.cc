// Split brain at R=1, end to end with real server processes and etcd: a
// server paused (SIGSTOP) past its lease while a replacement claims its
// index must, once it resumes, acknowledge nothing, publish no checkpoint
// and save none at shutdown; a fresh server then loads the replacement's
// state with every update it acknowledged (docs/replication.md). Every wait
// is bounded in count and time; every process is stopped by its PID.
#include <signal.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/core/tensor.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/shard_config.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/testing/child_process.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "pserver/v1/registry.pb.h"
#include "pserver/v1/service.grpc.pb.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::Duration kWait = absl::Seconds(60);
constexpr char kCluster[] = "split";

std::string TempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name, "-", getpid(), "-",
                                 absl::ToUnixNanos(absl::Now()));
  std::filesystem::create_directories(dir);
  return dir;
}

class SplitBrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(etcd_, testing::EtcdProcess::Start());
    EtcdClientOptions options;
    options.endpoints = {etcd_->endpoint()};
    options.prefix = etcd_keys::ClusterPrefix(kCluster);
    ASSERT_OK_AND_ASSIGN(etcd_client_, EtcdClient::Connect(options));
    dir_ = TempDir("split-brain");
  }

  // A server process on index 0 of a one-server cluster; its address.
  std::unique_ptr<ChildProcess> StartServer(std::string* address) {
    absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Spawn(
        RunfilesPath("cc/server/pserver"),
        {"--host=127.0.0.1", "--port=0", "--etcd=" + etcd_->endpoint(),
         absl::StrCat("--cluster=", kCluster), "--num_servers=1", "--lease_ttl=2",
         "--register_timeout=60", "--checkpoint_dir=" + dir_, "--checkpoint_interval=0.5"});
    EXPECT_OK(child);
    if (!child.ok()) return nullptr;
    absl::StatusOr<std::string> listening = WaitForPserverAddress(**child, 0, absl::Now() + kWait);
    EXPECT_OK(listening) << (*child)->output();
    if (!listening.ok()) return nullptr;
    *address = *listening;
    return *std::move(child);
  }

  v1::ShardConfig ShardConfig() {
    absl::StatusOr<KeyValue> kv = etcd_client_->Get(etcd_keys::ShardKey(0));
    EXPECT_OK(kv);
    if (!kv.ok()) return {};
    absl::StatusOr<v1::ShardConfig> config = ParseShardConfig(0, kv->value);
    EXPECT_OK(config);
    return config.ok() ? *config : v1::ShardConfig();
  }

  std::string InstanceAt0() {
    absl::StatusOr<KeyValue> kv = etcd_client_->Get(etcd_keys::ServerKey(0));
    EXPECT_OK(kv);
    if (!kv.ok()) return "";
    absl::StatusOr<etcd_keys::ServerEntry> entry = etcd_keys::ParseServerValue(kv->value);
    EXPECT_OK(entry);
    return entry.ok() ? entry->instance_id : "";
  }

  v1::CheckpointRecord PublishedCheckpoint() {
    absl::StatusOr<KeyValue> kv = etcd_client_->Get(etcd_keys::CheckpointKey(0));
    EXPECT_OK(kv);
    v1::CheckpointRecord record;
    if (kv.ok()) {
      EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(kv->value, &record).ok())
          << kv->value;
    }
    return record;
  }

  std::unique_ptr<testing::EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> etcd_client_;
  std::string dir_;
};

ClientOptions Direct(const std::string& address) {
  ClientOptions options;
  options.servers = {address};
  options.timeout = kWait;
  options.initial_backoff = absl::Milliseconds(10);
  return options;
}

Tensor Ones() { return Tensor::FromValues<float>({4}, {1, 1, 1, 1}); }
std::vector<float> Filled(float v) { return std::vector<float>(4, v); }

std::unique_ptr<v1::ParameterServer::Stub> Stub(const std::string& address) {
  return v1::ParameterServer::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

// One push straight to `address` over gRPC, no retries.
grpc::Status RawPush(const std::string& address) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::SendGradRequest request;
  Tensor ones = Ones();
  v1::Gradient* grad = request.mutable_gradient();
  grad->set_name("w");
  grad->set_element_type(v1::FLOAT32);
  grad->set_content(std::string(ones.bytes()));
  v1::SendGradResponse response;
  return Stub(address)->SendGrad(&context, request, &response);
}

grpc::Status RawSave(const std::string& address) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  v1::SaveResponse response;
  return Stub(address)->Save(&context, v1::SaveRequest(), &response);
}

TEST_F(SplitBrainTest, AServerPausedPastItsLeaseStepsDownAndTheReplacementsUpdatesSurvive) {
  // A holds index 0 at epoch 1; the trainer's pushes are acknowledged and saved.
  std::string address_a;
  std::unique_ptr<ChildProcess> a = StartServer(&address_a);
  ASSERT_NE(a, nullptr);
  const std::string instance_a = InstanceAt0();
  EXPECT_EQ(ShardConfig().epoch(), 1u);
  EXPECT_EQ(ShardConfig().holder(), instance_a);

  ClientOptions trainer_options;
  trainer_options.etcd_endpoints = {etcd_->endpoint()};
  trainer_options.cluster = kCluster;
  trainer_options.timeout = kWait;
  trainer_options.discovery_timeout = kWait;
  trainer_options.initial_backoff = absl::Milliseconds(10);
  trainer_options.attempt_timeout = absl::Seconds(2);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> trainer, Client::Connect(trainer_options));
  v1::ParameterConfig sgd;
  sgd.mutable_optimizer()->mutable_sgd();
  sgd.mutable_learning_rate()->set_learning_rate(1.0);
  ASSERT_OK(trainer->InitParam("w", Tensor::FromValues<float>({4}, {0, 0, 0, 0}), sgd));
  ASSERT_OK(trainer->FinishInitParams());
  for (int i = 0; i < 3; ++i) ASSERT_OK(trainer->SendGrad("w", Ones()));  // w = -3
  ASSERT_TRUE(RawSave(address_a).ok());

  // A is paused past its lease: its key goes.
  ASSERT_EQ(kill(a->pid(), SIGSTOP), 0) << std::strerror(errno);
  bool gone = false;
  for (int i = 0; i < 3000 && !gone; ++i) {
    gone = absl::IsNotFound(etcd_client_->Get(etcd_keys::ServerKey(0)).status());
    if (!gone) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(gone) << "A's /ps/0 outlived its lease";

  // B claims index 0 at epoch 2, loads A's checkpoint, and acknowledges pushes.
  std::string address_b;
  std::unique_ptr<ChildProcess> b = StartServer(&address_b);
  ASSERT_NE(b, nullptr);
  const std::string instance_b = InstanceAt0();
  ASSERT_NE(instance_b, instance_a);
  EXPECT_EQ(ShardConfig().epoch(), 2u);
  EXPECT_EQ(ShardConfig().holder(), instance_b);
  for (int i = 0; i < 2; ++i) ASSERT_OK(trainer->SendGrad("w", Ones()));  // w = -5
  ASSERT_OK_AND_ASSIGN(Tensor on_b, trainer->GetParam("w"));
  EXPECT_EQ(on_b.ToVector<float>(), Filled(-5));
  ASSERT_TRUE(RawSave(address_b).ok());
  EXPECT_EQ(PublishedCheckpoint().epoch(), 2u);

  // A resumes. No push to it is acknowledged, ever; it steps down.
  ASSERT_EQ(kill(a->pid(), SIGCONT), 0) << std::strerror(errno);
  grpc::Status refused;
  for (int i = 0; i < 600; ++i) {
    refused = RawPush(address_a);
    ASSERT_FALSE(refused.ok()) << "the paused server acknowledged a push";
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
    if (refused.error_message().find("stepped down") != std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_THAT(refused.error_message(), HasSubstr("stepped down from shard 0"));
  EXPECT_THAT(refused.error_message(), HasSubstr("epoch 2"));

  // A client dialing A by its address is refused with the fencing message.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> direct, Client::Connect(Direct(address_a)));
  CallOptions soon;
  soon.deadline = absl::Now() + absl::Seconds(3);
  absl::Status pushed = direct->SendGrad("w", Ones(), soon);
  EXPECT_THAT(pushed,
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("stepped down from shard 0")));
  // Its Save is refused, and the published checkpoint stays B's.
  const grpc::Status save = RawSave(address_a);
  EXPECT_EQ(save.error_code(), grpc::StatusCode::UNAVAILABLE) << save.error_message();
  EXPECT_THAT(save.error_message(), HasSubstr("stepped down"));
  EXPECT_EQ(PublishedCheckpoint().epoch(), 2u);
  EXPECT_EQ(PublishedCheckpoint().server_address(), address_b);

  // A stops: no final checkpoint, exit 1, the step-down on its stderr.
  direct.reset();
  ASSERT_EQ(kill(a->pid(), SIGTERM), 0);
  ASSERT_OK_AND_ASSIGN(int a_status, a->WaitForExit(absl::Now() + kWait));
  EXPECT_TRUE(WIFEXITED(a_status) && WEXITSTATUS(a_status) == 1) << DescribeWaitStatus(a_status);
  std::printf("the paused server's log:\n%s\n", a->err().c_str());
  EXPECT_THAT(a->err(), HasSubstr("stepping down: etcd /shards/0 is at epoch 2"));
  EXPECT_THAT(a->err(), HasSubstr("no final checkpoint"));
  EXPECT_THAT(a->err(), Not(HasSubstr("saved checkpoint")));
  EXPECT_EQ(PublishedCheckpoint().epoch(), 2u);
  EXPECT_EQ(PublishedCheckpoint().server_address(), address_b);

  // B stops cleanly, saving its last checkpoint.
  trainer.reset();
  ASSERT_EQ(kill(b->pid(), SIGTERM), 0);
  ASSERT_OK_AND_ASSIGN(int b_status, b->WaitForExit(absl::Now() + kWait));
  EXPECT_TRUE(WIFEXITED(b_status) && WEXITSTATUS(b_status) == 0)
      << DescribeWaitStatus(b_status) << b->err();

  // A fresh server loads B's state: every update B acknowledged is there.
  std::string address_c;
  std::unique_ptr<ChildProcess> c = StartServer(&address_c);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(ShardConfig().epoch(), 3u);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> reader, Client::Connect(Direct(address_c)));
  ASSERT_OK_AND_ASSIGN(Tensor on_c, reader->GetParam("w"));
  EXPECT_EQ(on_c.ToVector<float>(), Filled(-5));
  reader.reset();
  ASSERT_EQ(kill(c->pid(), SIGTERM), 0);
  ASSERT_OK_AND_ASSIGN(int c_status, c->WaitForExit(absl::Now() + kWait));
  EXPECT_TRUE(WIFEXITED(c_status) && WEXITSTATUS(c_status) == 0) << DescribeWaitStatus(c_status);
}

// etcd's contents are not trusted: a server does not claim an index over a
// /shards/<i> it cannot read, and says why.
TEST_F(SplitBrainTest, AMalformedShardConfigIsRefusedWithAClearError) {
  ASSERT_OK(etcd_client_->Put(etcd_keys::ShardKey(0), "{\"epoch\": \"oops\"}"));
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<ChildProcess> server,
      ChildProcess::Spawn(RunfilesPath("cc/server/pserver"),
                          {"--host=127.0.0.1", "--port=0", "--etcd=" + etcd_->endpoint(),
                           absl::StrCat("--cluster=", kCluster), "--num_servers=1", "--lease_ttl=2",
                           "--register_timeout=20"}));
  ASSERT_OK_AND_ASSIGN(int status, server->WaitForExit(absl::Now() + kWait));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << DescribeWaitStatus(status);
  EXPECT_THAT(server->err(), HasSubstr("etcd /shards/0 does not hold a shard configuration"));
  EXPECT_THAT(server->err(), HasSubstr("does not claim index 0"));
  // Nothing was claimed or changed.
  EXPECT_TRUE(absl::IsNotFound(etcd_client_->Get(etcd_keys::ServerKey(0)).status()));
  ASSERT_OK_AND_ASSIGN(KeyValue kv, etcd_client_->Get(etcd_keys::ShardKey(0)));
  EXPECT_EQ(kv.value, "{\"epoch\": \"oops\"}");
}

}  // namespace
}  // namespace pserver
