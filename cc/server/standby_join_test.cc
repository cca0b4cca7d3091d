// A standby joins while writes go on (PrimaryReplication::Attach,
// docs/replication.md "Attach"): the primary answers the copy, the writes
// made afterwards are acknowledged without waiting for the joining standby
// and queued for it; once it holds them all it is listed in /shards/<i>, and
// from then on writes wait for it. A real etcd; the backup is a gRPC server
// of the test's own whose Replicate answers only when the test lets it, so
// nothing depends on timing: a write that waited for the joining standby
// would never finish (the test's bounded wait would fail).
#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
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
#include "cc/server/server.h"
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

  // `catch_up_bytes`, `predecessor_term`, `last_lsn`, `max_standbys`: as
  // PrimaryReplicationOptions and its constructor take them.
  void StartPrimary(uint64_t max_joining_bytes = uint64_t{256} << 20,
                    uint64_t catch_up_bytes = 0, uint64_t predecessor_term = 0,
                    uint64_t last_lsn = 0, size_t max_standbys = 2,
                    absl::Duration first_write_wait = absl::Milliseconds(20)) {
    PrimaryReplicationOptions options;
    options.join_first_write_wait = first_write_wait;
    options.catch_up_bytes = catch_up_bytes;
    options.predecessor_term = predecessor_term;
    options.max_standbys = max_standbys;
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
    primary_ = std::make_unique<PrimaryReplication>(std::move(options), last_lsn);
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

  absl::Status CheckJoin(const std::string& instance_id = "00000000000000b1") {
    v1::AttachStandbyRequest request;
    request.set_shard(0);
    request.set_instance_id(instance_id);
    request.set_check_join(true);
    return primary_->Attach(request).status();
  }

  // Waits (bounded) until CheckJoin answers other than OK; that answer.
  absl::Status LetGo() {
    absl::Status answer;
    for (int i = 0; i < 3000; ++i) {
      answer = CheckJoin();
      if (!answer.ok()) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return answer;
  }

  // /shards/0 one epoch up, same holder: the primary's configuration cell
  // no longer matches it, so listing a standby fails (the test's way of
  // having a joiner let go at a moment it knows). Returns the new value.
  std::string MoveShardConfigOn() {
    v1::ShardConfig moved = Config();
    moved.set_epoch(moved.epoch() + 1);
    const std::string value = FormatShardConfig(moved);
    EXPECT_OK(etcd_->Put(etcd_keys::ShardKey(0), value));
    return value;
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
  // The catch-up waits for write 1 however slow this machine is (with the
  // default 20 ms it may hold writes first, and write 1 then waits for the
  // held backup while holding every write: no queue to pass its bound).
  StartPrimary(/*max_joining_bytes=*/100, 0, 0, 0, 2, /*first_write_wait=*/kWait);
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
  // The standby's next check is told why.
  EXPECT_THAT(CheckJoin(), testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                             HasSubstr("passed 100 bytes")));
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
  // A joiner that caught up meanwhile is listed (on a loaded machine b1,
  // even b2, may be by now): joining or listed, the two count.
  EXPECT_THAT(primary_->Attach(again).status(),
              testing::StatusIs(
                  absl::StatusCode::kFailedPrecondition,
                  ::testing::AnyOf(
                      HasSubstr("has 0 backups and 2 joining, the most --max_standbys=2"),
                      HasSubstr("has 1 backups and 1 joining, the most --max_standbys=2"),
                      HasSubstr("has 2 backups and 0 joining, the most --max_standbys=2"))));
}

TEST_F(StandbyJoinTest, ALetGoStandbyIsToldWhyAtItsNextCheckAndMayAttachAgain) {
  StartPrimary();
  EXPECT_THAT(CheckJoin(), testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                             HasSubstr("neither joining shard 0 nor a backup")));
  const std::string moved = MoveShardConfigOn();
  ASSERT_OK(Attach().status());
  // Listing it fails (etcd moved on): it is let go, and its check says why
  // (before that, the check answers OK: it is joining).
  EXPECT_THAT(LetGo(), testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                         HasSubstr("changed while the standby joined")));
  EXPECT_THAT(LetGo(), testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                         HasSubstr("let standby 00000000000000b1 go")));
  EXPECT_TRUE(primary_->backups().empty());
  // Another standby's check is not answered with this one's reason.
  EXPECT_THAT(CheckJoin("00000000000000b2"),
              testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                HasSubstr("neither joining")));
  // It attaches again (its let-go record gives way) and, etcd matching the
  // primary's configuration again, is listed: its check answers OK.
  config_.Set(Config().epoch(), moved);
  ASSERT_OK(Attach().status());
  bool listed = false;
  for (int i = 0; i < 3000 && !listed; ++i) {
    listed = primary_->backups().size() == 1;
    if (!listed) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(listed);
  EXPECT_OK(CheckJoin());
  EXPECT_THAT(Config().replicas(), ElementsAre("00000000000000b1"));
}

// The AttachStandby RPC of the test's PrimaryReplication, as a server's
// dispatcher would answer it; counts the attaches (checks left out).
class AttachService final : public v1::ParameterServer::Service {
 public:
  explicit AttachService(PrimaryReplication* primary) : primary_(primary) {}
  grpc::Status AttachStandby(grpc::ServerContext*, const v1::AttachStandbyRequest* request,
                             v1::AttachStandbyResponse* response) override {
    if (!request->check_join()) {
      absl::MutexLock lock(&mu_);
      ++attaches_;
    }
    absl::StatusOr<v1::AttachStandbyResponse> answer = primary_->Attach(*request);
    if (!answer.ok()) {
      return grpc::Status(static_cast<grpc::StatusCode>(answer.status().code()),
                          std::string(answer.status().message()));
    }
    *response = *std::move(answer);
    return grpc::Status::OK;
  }
  int attaches() const {
    absl::MutexLock lock(&mu_);
    return attaches_;
  }

 private:
  PrimaryReplication* const primary_;
  mutable absl::Mutex mu_;
  int attaches_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST_F(StandbyJoinTest, AStandbyServerLetGoWhileJoiningStartsOverAtOnce) {
  StartPrimary();
  AttachService service(primary_.get());
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> attach_server = builder.BuildAndStart();
  ASSERT_NE(attach_server, nullptr);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  ASSERT_OK(etcd_->Put(etcd_keys::ServerKey(0),
                       etcd_keys::FormatServerValue({address, "00000000000000a1"})));
  // Every join fails at its listing (etcd moved on): the primary lets the
  // standby go each time.
  MoveShardConfigOn();
  // A real standby server. Before it was told, it waited for its own
  // deadline (the join timeout, 2 minutes, and one more) before copying
  // again; the test's bounded wait is shorter than that.
  ServerOptions options;
  options.host = "127.0.0.1";
  options.etcd_endpoints = {etcd_process_->endpoint()};
  options.cluster = "join";
  options.num_servers = 1;
  options.standby = true;
  options.stop = std::make_shared<absl::Notification>();
  absl::StatusOr<std::unique_ptr<Server>> standby = absl::UnknownError("not started");
  std::thread starting([&] { standby = Server::Start(options); });
  bool started_over = false;
  for (int i = 0; i < 3000 && !started_over; ++i) {
    started_over = service.attaches() >= 3;
    if (!started_over) absl::SleepFor(absl::Milliseconds(20));
  }
  options.stop->Notify();
  starting.join();
  attach_server->Shutdown();
  ASSERT_TRUE(started_over) << service.attaches() << " attaches";
  EXPECT_TRUE(Logged("did not catch up on shard 0"));
  EXPECT_FALSE(standby.ok());  // stopped while still a standby
  EXPECT_EQ(Config().replicas_size(), 0);
}

TEST_F(StandbyJoinTest, AStandbyOfThisLineageCatchesUpFromItsLsnAndAnyOtherIsSentACopy) {
  // This primary serves from epoch 2 (its term) and was promoted at LSN 10
  // from a backup of the term-1 primary; it keeps its writes.
  const std::string moved = MoveShardConfigOn();
  config_.Set(Config().epoch(), moved);
  ASSERT_EQ(config_.epoch(), 2u);
  StartPrimary(uint64_t{256} << 20, /*catch_up_bytes=*/1 << 20, /*predecessor_term=*/1,
               /*last_lsn=*/10, /*max_standbys=*/8);
  // No standby attached: the writes are numbered (11-13) and kept all the same.
  ASSERT_TRUE(WritesFinish(3, 1.0f));
  EXPECT_EQ(primary_->last_lsn(), 13u);
  auto attach = [&](const std::string& id, uint64_t have_epoch, uint64_t have_lsn) {
    v1::AttachStandbyRequest request;
    request.set_shard(0);
    request.set_instance_id(id);
    request.set_address("127.0.0.1:" + std::to_string(port_));
    request.set_have_epoch(have_epoch);
    request.set_have_lsn(have_lsn);
    return primary_->Attach(request);
  };
  // This term's state at 11: the writes after it only, no files.
  ASSERT_OK_AND_ASSIGN(v1::AttachStandbyResponse ours, attach("00000000000000c1", 2, 11));
  EXPECT_TRUE(ours.catch_up());
  EXPECT_EQ(ours.files_size(), 0);
  EXPECT_EQ(ours.last_lsn(), 11u);
  EXPECT_EQ(ours.epoch(), 2u);
  // The predecessor's state at exactly the LSN this primary started from.
  ASSERT_OK_AND_ASSIGN(v1::AttachStandbyResponse predecessors, attach("00000000000000c2", 1, 10));
  EXPECT_TRUE(predecessors.catch_up());
  EXPECT_EQ(predecessors.last_lsn(), 10u);
  // Anything else is sent the whole shard: the predecessor's state at
  // another LSN, an LSN this primary never reached, another term.
  for (const auto& [id, epoch, lsn] : std::vector<std::tuple<std::string, uint64_t, uint64_t>>{
           {"00000000000000c3", 1, 9}, {"00000000000000c4", 2, 14}, {"00000000000000c5", 3, 11}}) {
    ASSERT_OK_AND_ASSIGN(v1::AttachStandbyResponse copy, attach(id, epoch, lsn));
    EXPECT_FALSE(copy.catch_up()) << id;
    EXPECT_GT(copy.files_size(), 0) << id;
    EXPECT_EQ(copy.last_lsn(), 13u) << id;
  }
  EXPECT_TRUE(Logged("standby 00000000000000c5 holds shard 0 up to LSN 11 of term 3 but is sent "
                     "a full copy: its state is not of this primary's lineage"));
  EXPECT_EQ(primary_->rejoined_without_copy(), 2u);
  // Each catches up and is listed; then a write reaches all five.
  backup_.Release();
  bool listed = false;
  for (int i = 0; i < 3000 && !listed; ++i) {
    listed = primary_->backups().size() == 5;
    if (!listed) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(listed) << primary_->backups().size() << " listed";
  // Delivered: 12-13 to c1 and 11-13 to c2; nothing to the copies.
  std::vector<uint64_t> delivered = backup_.lsns();
  std::sort(delivered.begin(), delivered.end());
  EXPECT_THAT(delivered, ElementsAre(11, 12, 12, 13, 13));
  ASSERT_TRUE(WritesFinish(1, 1.0f));
  EXPECT_EQ(backup_.lsns().size(), 10u);  // LSN 14 to each of the five
}

// With --catch_up_bytes, writes are kept only while a standby may be away:
// none while no standby was ever listed (nobody holds this lineage's
// state), none once every listed backup acknowledged them; once the backup
// is dropped (its server gone), the writes since are kept and it could
// rejoin from its own LSN.
TEST_F(StandbyJoinTest, AcknowledgedWritesAreKeptOnlyWhileABackupIsAway) {
  StartPrimary(uint64_t{256} << 20, /*catch_up_bytes=*/1 << 20);
  const uint64_t term = config_.epoch();
  ASSERT_TRUE(WritesFinish(2, 1.0f));  // LSNs 1-2, no standby yet
  EXPECT_EQ(primary_->kept_write_bytes(), 0u);
  ASSERT_OK(Attach().status());
  backup_.Release();
  bool listed = false;
  for (int i = 0; i < 3000 && !listed; ++i) {
    listed = primary_->backups().size() == 1;
    if (!listed) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(listed);
  ASSERT_TRUE(WritesFinish(3, 1.0f));  // LSNs 3-5, acknowledged by the backup
  EXPECT_EQ(primary_->kept_write_bytes(), 0u);
  EXPECT_THAT(backup_.lsns(), ElementsAre(3, 4, 5));
  // The backup's server goes: the next write drops it; from then on the
  // writes are kept.
  server_->Shutdown();
  server_.reset();
  ASSERT_TRUE(WritesFinish(3, 1.0f));  // LSNs 6-8
  EXPECT_TRUE(primary_->backups().empty());
  EXPECT_EQ(primary_->dropped(), 1u);
  EXPECT_GT(primary_->kept_write_bytes(), 0u);
  v1::AttachStandbyRequest request;
  request.set_shard(0);
  request.set_instance_id("00000000000000b1");
  request.set_address("127.0.0.1:" + std::to_string(port_));
  request.set_have_epoch(term);
  request.set_have_lsn(5);
  ASSERT_OK_AND_ASSIGN(v1::AttachStandbyResponse rejoin, primary_->Attach(request));
  EXPECT_TRUE(rejoin.catch_up());
  EXPECT_EQ(rejoin.last_lsn(), 5u);
}

TEST_F(StandbyJoinTest, WithoutKeptWritesAStandbyHoldingStateIsSentACopy) {
  StartPrimary();  // catch_up_bytes 0
  ASSERT_TRUE(WritesFinish(2, 1.0f));  // not numbered: no standby, none kept
  v1::AttachStandbyRequest request;
  request.set_shard(0);
  request.set_instance_id("00000000000000b1");
  request.set_address("127.0.0.1:" + std::to_string(port_));
  request.set_have_epoch(config_.epoch());
  request.set_have_lsn(0);
  ASSERT_OK_AND_ASSIGN(v1::AttachStandbyResponse copy, primary_->Attach(request));
  EXPECT_FALSE(copy.catch_up());
  EXPECT_GT(copy.files_size(), 0);
  EXPECT_TRUE(Logged("but is sent a full copy: this primary keeps no writes (--catch_up_bytes=0)"));
}

}  // namespace
}  // namespace pserver
