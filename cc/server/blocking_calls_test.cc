// Calls that may wait on other servers do not hold gRPC's callback threads
// (cc/server/service.h, BlockingCalls). gRPC runs every callback handler of
// a process on one pool of 2-16 threads (half the cores); a --replicas
// process hosts a primary and standby slots, so while its primary's writes
// waited there for their backups, its slots could not answer their own
// primaries, which were waiting on this process in turn: every first write
// of a ReplicasMoveTest waited for the replicate timeout (forever with
// --replicate_timeout=3600). Here a shipper that holds every write until
// released stands for backups that have not answered: while 24 writes wait
// in it (more than gRPC's callback threads on any machine), another call to
// the same server, and to a second server in the process, is answered.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/core/parameter_store.h"
#include "cc/core/tables.h"
#include "cc/rpc/grpc_status.h"
#include "cc/server/dispatcher.h"
#include "cc/server/service.h"
#include "cc/testing/status_matchers.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "pserver/v1/service.grpc.pb.h"

namespace pserver {
namespace {

// Every deadline: generous for a loaded machine, bounded.
constexpr absl::Duration kWait = absl::Seconds(60);

// Holds every write (applied first) until Release.
class HeldShipper : public WriteShipper {
 public:
  absl::Status Write(absl::string_view, absl::FunctionRef<SharedBytes()>,
                     absl::FunctionRef<absl::Status(absl::FunctionRef<void()>)> apply) override {
    absl::Status applied = apply([] {});
    absl::MutexLock lock(&mu_);
    ++waiting_;
    mu_.Await(absl::Condition(&released_));
    --waiting_;
    return applied;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }
  // Waits until `n` writes wait here; false at `deadline`.
  bool AwaitWaiting(int n, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return waiting_ >= n; };
    return mu_.AwaitWithDeadline(absl::Condition(&enough), deadline);
  }

 private:
  absl::Mutex mu_;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

// A dispatcher and its gRPC face on 127.0.0.1, a port the system picks.
struct TestServer {
  TestServer() {
    grpc::ServerBuilder builder;
    service.RegisterWith(&builder);
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    server = builder.BuildAndStart();
    stub = v1::ParameterServer::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  ~TestServer() { server->Shutdown(); }

  ParameterStore store;
  Tables tables{TablesOptions()};
  Dispatcher dispatcher{&store, &tables, 0};
  ParameterServerService service{&dispatcher};
  int port = 0;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::ParameterServer::Stub> stub;
};

absl::Status InitParam(v1::ParameterServer::Stub& stub, const std::string& name) {
  v1::InitParamRequest request;
  request.mutable_parameter()->set_name(name);
  request.mutable_parameter()->set_element_type(v1::FLOAT32);
  request.mutable_parameter()->add_shape(1);
  request.mutable_parameter()->set_content(std::string(4, '\0'));
  request.mutable_config()->mutable_optimizer()->mutable_sgd();
  v1::InitParamResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  return FromGrpcStatus(stub.InitParam(&context, request, &response));
}

absl::Status GetStats(v1::ParameterServer::Stub& stub) {
  v1::GetStatsResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  return FromGrpcStatus(stub.GetStats(&context, v1::GetStatsRequest(), &response));
}

TEST(BlockingCallsTest, WritesWaitingForBackupsLeaveTheProcessAnsweringOtherCalls) {
  constexpr int kWrites = 24;
  HeldShipper shipper;
  TestServer primary;
  TestServer other;  // another server of the process (a standby slot)
  primary.dispatcher.SetShipper(&shipper);
  std::vector<absl::Status> written(kWrites);
  std::vector<std::thread> writers;
  for (int i = 0; i < kWrites; ++i) {
    writers.emplace_back(
        [&, i] { written[i] = InitParam(*primary.stub, absl::StrCat("w", i)); });
  }
  // Every one of gRPC's callback threads (2 on a 2-core machine) would be
  // held by now without BlockingCalls.
  EXPECT_TRUE(shipper.AwaitWaiting(2, absl::Now() + kWait));
  EXPECT_OK(GetStats(*other.stub)) << "a second server of the process did not answer";
  EXPECT_OK(GetStats(*primary.stub)) << "the primary did not answer a read";
  shipper.Release();
  for (std::thread& writer : writers) writer.join();
  for (int i = 0; i < kWrites; ++i) EXPECT_OK(written[i]) << "w" << i;
  EXPECT_TRUE(shipper.AwaitWaiting(0, absl::Now() + kWait));
}

// Without a shipper a write runs on gRPC's thread as before, and a backup's
// Replicate (which waits for the earlier LSNs) never does.
TEST(BlockingCallsTest, OnlyCallsThatMayWaitOnAnotherServerLeaveGrpcsThreads) {
  TestServer server;
  EXPECT_FALSE(BlockingCalls::MayWait(server.dispatcher, "InitParam", /*writes=*/true));
  EXPECT_FALSE(BlockingCalls::MayWait(server.dispatcher, "SendGrads", /*writes=*/true));
  EXPECT_FALSE(BlockingCalls::MayWait(server.dispatcher, "GetStats", /*writes=*/false));
  EXPECT_TRUE(BlockingCalls::MayWait(server.dispatcher, "Replicate", /*writes=*/false));
  EXPECT_TRUE(BlockingCalls::MayWait(server.dispatcher, "AttachStandby", /*writes=*/false));
  HeldShipper shipper;
  server.dispatcher.SetShipper(&shipper);
  EXPECT_TRUE(BlockingCalls::MayWait(server.dispatcher, "InitParam", /*writes=*/true));
  EXPECT_TRUE(BlockingCalls::MayWait(server.dispatcher, "SendGrads", /*writes=*/true));
  EXPECT_FALSE(BlockingCalls::MayWait(server.dispatcher, "GetParams", /*writes=*/false));
  server.dispatcher.SetShipper(nullptr);
}

}  // namespace
}  // namespace pserver
