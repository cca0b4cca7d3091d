// A standby joins while writes go on (PrimaryReplication::Attach,
// docs/replication.md "Attach"): the primary answers the copy, the writes
// made afterwards are acknowledged without waiting for the joining standby
// and queued for it; once it holds them all it is listed in /shards/<i>, and
// from then on writes wait for it. A real etcd; the backup is a gRPC server
// of the test's own whose Replicate answers only when the test lets it, so
// nothing depends on timing: a write that waited for the joining standby
// would never finish (the test's bounded wait would fail).
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/core/parameter_store.h"
#include "cc/core/tables.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/shard_config.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/server/dispatcher.h"
#include "cc/server/replication.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "pserver/v1/service.grpc.pb.h"

namespace pserver {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(60);

std::string Bytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

std::string Grad(float value) {
  v1::SendGradRequest grad;
  grad.mutable_gradient()->set_name("w");
  grad.mutable_gradient()->set_element_type(v1::FLOAT32);
  grad.mutable_gradient()->set_content(Bytes({value, value, value}));
  return grad.SerializeAsString();
}

// A backup that records every Replicate and answers once released.
class HeldBackup final : public v1::ParameterServer::Service {
 public:
  grpc::Status Replicate(grpc::ServerContext*, const v1::ReplicateRequest* request,
                         v1::ReplicateResponse*) override {
    release_.WaitForNotificationWithTimeout(absl::Minutes(5));
    absl::MutexLock lock(&mu_);
    lsns_.push_back(request->lsn());
    return grpc::Status::OK;
  }
  void Release() {  // once; later calls do nothing
    absl::MutexLock lock(&release_mu_);
    if (!release_.HasBeenNotified()) release_.Notify();
  }
  std::vector<uint64_t> lsns() const {
    absl::MutexLock lock(&mu_);
    return lsns_;
  }

 private:
  absl::Mutex release_mu_;
  absl::Notification release_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> lsns_ ABSL_GUARDED_BY(mu_);
};

class StandbyJoinTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(etcd_process_, testing::EtcdProcess::Start());
    EtcdClientOptions options;
    options.endpoints = {etcd_process_->endpoint()};
    options.prefix = etcd_keys::ClusterPrefix("join");
    ASSERT_OK_AND_ASSIGN(etcd_, EtcdClient::Connect(options));
    // This test is shard 0's holder, instance 00000000000000a1.
    ASSERT_OK_AND_ASSIGN(ShardClaim claim, NextShardClaim(0, nullptr, "00000000000000a1", "127.0.0.1:1"));
    ASSERT_OK_AND_ASSIGN(TxnResult written, etcd_->Txn({claim.unchanged}, {claim.put}));
    ASSERT_TRUE(written.succeeded);
    config_.Set(claim.config.epoch(), claim.value);
    v1::InitParamRequest init;
    init.mutable_parameter()->set_name("w");
    init.mutable_parameter()->set_element_type(v1::FLOAT32);
    init.mutable_parameter()->add_shape(3);
    init.mutable_parameter()->set_content(Bytes({0, 0, 0}));
    init.mutable_config()->mutable_optimizer()->mutable_sgd();
    ASSERT_OK(dispatcher_.ApplyWrite("InitParam", init.SerializeAsString()));
    ASSERT_OK(dispatcher_.ApplyWrite("FinishInitParams",
                                     v1::FinishInitParamsRequest().SerializeAsString()));
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&backup_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    backup_.Release();  // no Replicate stays blocked
    primary_.reset();
    if (server_ != nullptr) server_->Shutdown();
  }

  void StartPrimary(uint64_t max_joining_bytes = uint64_t{256} << 20) {
    PrimaryReplicationOptions options;
    options.shard = 0;
    options.instance_id = "00000000000000a1";
    options.etcd = etcd_.get();
    options.config = &config_;
    options.dispatcher = &dispatcher_;
    options.max_joining_bytes = max_joining_bytes;
    options.join_timeout = kWait;
    // The test's backup is a plain gRPC service: writes go as Replicate
    // calls (the bulk channel is replica_channel_test's).
    options.channel.enabled = false;
    options.log = [this](const std::string& line) {
      absl::MutexLock lock(&log_mu_);
      log_.push_back(line);
    };
    primary_ = std::make_unique<PrimaryReplication>(std::move(options), /*last_lsn=*/0);
  }

  // `count` writes in a thread of their own; true once all were
  // acknowledged OK within kWait.
  bool WritesFinish(int count, float value) {
    auto done = std::make_shared<absl::Notification>();
    auto ok = std::make_shared<bool>(true);
    std::thread writer([this, count, value, done, ok] {
      for (int i = 0; i < count; ++i) {
        const std::string grad = Grad(value);
        absl::Status status = primary_->Write(
            "SendGrad", [&] { return SharedBytes::Own(grad); },
            [&](absl::FunctionRef<void()>) { return dispatcher_.ApplyWrite("SendGrad", grad); });
        *ok = *ok && status.ok();
      }
      done->Notify();
    });
    const bool finished = done->WaitForNotificationWithTimeout(kWait);
    if (finished) {
      writer.join();
    } else {
      backup_.Release();  // let it end, then fail
      writer.join();
    }
    return finished && *ok;
  }

  v1::ShardConfig Config() {
    absl::StatusOr<KeyValue> kv = etcd_->Get(etcd_keys::ShardKey(0));
    EXPECT_OK(kv.status());
    if (!kv.ok()) return {};
    absl::StatusOr<v1::ShardConfig> config = ParseShardConfig(0, kv->value);
    EXPECT_OK(config.status());
    return config.ok() ? *config : v1::ShardConfig();
  }

  absl::StatusOr<v1::AttachStandbyResponse> Attach() {
    v1::AttachStandbyRequest request;
    request.set_shard(0);
    request.set_instance_id("00000000000000b1");
    request.set_address("127.0.0.1:" + std::to_string(port_));
    return primary_->Attach(request);
  }

  bool Logged(const std::string& words) {
    absl::MutexLock lock(&log_mu_);
    for (const std::string& line : log_) {
      if (absl::StrContains(line, words)) return true;
    }
    return false;
  }

  std::unique_ptr<testing::EtcdProcess> etcd_process_;
  std::unique_ptr<EtcdClient> etcd_;
  ShardConfigCell config_;
  ParameterStore store_;
  Tables tables_;
  Dispatcher dispatcher_{&store_, &tables_, /*index=*/0};
  HeldBackup backup_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<PrimaryReplication> primary_;
  absl::Mutex log_mu_;
  std::vector<std::string> log_ ABSL_GUARDED_BY(log_mu_);
};

TEST_F(StandbyJoinTest, WritesGoOnWhileAStandbyJoinsAndWaitForItOnceListed) {
  StartPrimary();
  ASSERT_TRUE(WritesFinish(2, 1.0f));  // before any standby: not numbered
  ASSERT_OK_AND_ASSIGN(v1::AttachStandbyResponse copy, Attach());
  EXPECT_EQ(copy.last_lsn(), 0u);
  EXPECT_GT(copy.files_size(), 0);
  // The standby holds the copy but answers no write yet: five writes are
  // acknowledged all the same, and it is not listed.
  ASSERT_TRUE(WritesFinish(5, 2.0f)) << "a write waited for a joining standby";
  EXPECT_EQ(Config().replicas_size(), 0);
  EXPECT_TRUE(primary_->backups().empty());
  // Let it answer: it receives the five writes in LSN order, then is listed.
  backup_.Release();
  bool listed = false;
  for (int i = 0; i < 3000 && !listed; ++i) {
    listed = primary_->backups().size() == 1;
    if (!listed) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(listed) << "the standby was never listed";
  EXPECT_THAT(Config().replicas(), ElementsAre("00000000000000b1"));
  EXPECT_THAT(backup_.lsns(), ElementsAre(1, 2, 3, 4, 5));
  EXPECT_EQ(primary_->joined(), 1u);
  EXPECT_EQ(primary_->caught_up_writes(), 5u);
  EXPECT_TRUE(Logged("caught up on 5 writes made during its copy"));
  // A backup now: the next write is its before the write returns.
  ASSERT_TRUE(WritesFinish(1, 3.0f));
  EXPECT_THAT(backup_.lsns(), ElementsAre(1, 2, 3, 4, 5, 6));
}

TEST_F(StandbyJoinTest, AStandbyWhoseQueuePassesItsBoundIsLetGoUnlisted) {
  StartPrimary(/*max_joining_bytes=*/100);
  ASSERT_OK(Attach().status());
  // Each write queues about 35 bytes (its request and method name): ten
  // pass 100 however many the standby's thread took out meanwhile (it
  // holds one, blocked).
  ASSERT_TRUE(WritesFinish(10, 1.0f));
  backup_.Release();
  bool let_go = false;
  for (int i = 0; i < 3000 && !let_go; ++i) {
    let_go = Logged("did not catch up");
    if (!let_go) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(let_go);
  EXPECT_TRUE(Logged("passed 100 bytes"));
  EXPECT_EQ(Config().replicas_size(), 0);
  EXPECT_TRUE(primary_->backups().empty());
  EXPECT_EQ(primary_->joined(), 0u);
  // Writes go on without it; another standby may join.
  ASSERT_TRUE(WritesFinish(2, 1.0f));
  EXPECT_OK(Attach().status());
}

TEST_F(StandbyJoinTest, ATooManyStandbysAttachIsRefusedCountingJoiningOnes) {
  StartPrimary();
  ASSERT_OK(Attach().status());
  v1::AttachStandbyRequest again;
  again.set_shard(0);
  again.set_instance_id("00000000000000b1");
  again.set_address("127.0.0.1:" + std::to_string(port_));
  EXPECT_THAT(primary_->Attach(again).status(),
              testing::StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("joining")));
  again.set_instance_id("00000000000000b2");
  ASSERT_OK(primary_->Attach(again).status());
  again.set_instance_id("00000000000000b3");
  EXPECT_THAT(primary_->Attach(again).status(),
              testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                HasSubstr("2 joining, the most --max_standbys=2")));
}

}  // namespace
}  // namespace pserver
