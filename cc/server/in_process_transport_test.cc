// The in-process transport and the gRPC service are one dispatcher: a
// server answers the same over either. Also Client::GetLayout (a header-only
// read) and Client::SaveCheckpoint over both.
#include "cc/server/in_process_transport.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "cc/client/client.h"
#include "cc/client/grpc_transport.h"
#include "cc/server/local_cluster.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::IsOk;
using ::pserver::testing::StatusCodeIs;
using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Runs one control call to completion.
absl::Status CallAndWait(Transport& t, absl::string_view method,
                         const google::protobuf::Message& request,
                         google::protobuf::Message* response) {
  absl::Notification finished;
  absl::Status result;
  t.Call(method, request, response, absl::Now() + absl::Seconds(30), [&](absl::Status s) {
    result = std::move(s);
    finished.Notify();
  });
  finished.WaitForNotification();
  return result;
}

class BothTransportsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    if (const char* tmp = std::getenv("TEST_TMPDIR")) {
      options.checkpoint_dir = std::string(tmp) + "/in_process_transport_test";
    }
    auto cluster = LocalCluster::Start(1, options);
    ASSERT_THAT(cluster.status(), IsOk());
    cluster_ = *std::move(cluster);
    auto grpc = GrpcTransport::Create(cluster_->addresses()[0]);
    ASSERT_THAT(grpc.status(), IsOk());
    grpc_ = *std::move(grpc);
    in_process_ = std::make_unique<InProcessTransport>(cluster_->dispatchers()[0]);
  }

  std::unique_ptr<Client> ClientOver(bool in_process) {
    ClientOptions options;
    options.servers = cluster_->addresses();
    auto client = in_process ? Client::Create(options, InProcessTransports(*cluster_))
                             : Client::Connect(options);
    EXPECT_THAT(client.status(), IsOk());
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<Transport> grpc_;
  std::unique_ptr<Transport> in_process_;
};

TEST_F(BothTransportsTest, GetStatsIsTheSame) {
  v1::GetStatsResponse over_grpc, in_process;
  ASSERT_THAT(CallAndWait(*grpc_, "GetStats", v1::GetStatsRequest(), &over_grpc), IsOk());
  ASSERT_THAT(CallAndWait(*in_process_, "GetStats", v1::GetStatsRequest(), &in_process), IsOk());
  // Uptime grows between the calls; every other field is the same, and the
  // in-process answer has uptime too.
  EXPECT_GT(in_process.stats().uptime_seconds(), 0);
  over_grpc.mutable_stats()->clear_uptime_seconds();
  in_process.mutable_stats()->clear_uptime_seconds();
  EXPECT_EQ(over_grpc.SerializeAsString(), in_process.SerializeAsString())
      << over_grpc.DebugString() << "\nvs\n"
      << in_process.DebugString();
}

TEST_F(BothTransportsTest, ErrorsAreTheSame) {
  for (Transport* t : {grpc_.get(), in_process_.get()}) {
    SCOPED_TRACE(t->address());
    v1::GetParamRequest before_init;
    before_init.mutable_param()->set_name("w");
    v1::GetParamResponse response;
    EXPECT_THAT(CallAndWait(*t, "GetParam", before_init, &response),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("pserver not fully initialized")));
    v1::GetParamInfoRequest bad_name;
    v1::GetParamInfoResponse info;
    bad_name.set_name("");
    EXPECT_THAT(CallAndWait(*t, "GetParamInfo", bad_name, &info),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("pserver not fully initialized")));
    v1::GetStatsResponse stats;
    EXPECT_THAT(CallAndWait(*t, "NoSuchMethod", v1::GetStatsRequest(), &stats),
                StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("NoSuchMethod")));
  }
  // The wrong message type for a method is refused before it is sent (in
  // process) or by the server (gRPC: it parses as the method's own type,
  // here an empty GetStatsRequest, and succeeds): in process only.
  v1::GetStatsResponse stats;
  EXPECT_THAT(
      CallAndWait(*in_process_, "GetStats", v1::SaveRequest(), &stats),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pserver.v1.GetStatsRequest")));
}

TEST_F(BothTransportsTest, GetLayoutReadsNoValues) {
  std::unique_ptr<Client> writer = ClientOver(/*in_process=*/true);
  ASSERT_NE(writer, nullptr);
  ASSERT_THAT(writer->InitParam("w", Tensor::FromValues<float>({2, 3}, {1, 2, 3, 4, 5, 6})),
              IsOk());
  ASSERT_THAT(writer->FinishInitParams(), IsOk());
  for (bool in_process : {false, true}) {
    SCOPED_TRACE(in_process ? "in process" : "gRPC");
    std::unique_ptr<Client> client = ClientOver(in_process);  // has not seen "w"
    ASSERT_NE(client, nullptr);
    absl::StatusOr<ParamLayout> layout = client->GetLayout("w");
    ASSERT_THAT(layout.status(), IsOk());
    EXPECT_EQ(layout->type, v1::FLOAT32);
    EXPECT_THAT(layout->shape, ElementsAre(2, 3));
    EXPECT_THAT(client->GetLayout("nope").status(), StatusCodeIs(absl::StatusCode::kNotFound));
    EXPECT_THAT(client->GetLayout("").status(), StatusCodeIs(absl::StatusCode::kInvalidArgument));
  }
}

TEST_F(BothTransportsTest, SaveCheckpointOnEveryServer) {
  if (std::getenv("TEST_TMPDIR") == nullptr) GTEST_SKIP() << "needs TEST_TMPDIR";
  for (bool in_process : {false, true}) {
    SCOPED_TRACE(in_process ? "in process" : "gRPC");
    std::unique_ptr<Client> client = ClientOver(in_process);
    ASSERT_NE(client, nullptr);
    ASSERT_THAT(client->SaveCheckpoint(), IsOk());
    absl::StatusOr<std::vector<v1::ServerStats>> stats = client->GetStats();
    ASSERT_THAT(stats.status(), IsOk());
    EXPECT_GT((*stats)[0].checkpoint_sequence(), 0u);
  }
}

TEST(SaveCheckpointTest, ServerWithoutDirectoryIsNamed) {
  auto cluster = LocalCluster::Start(2);
  ASSERT_THAT(cluster.status(), IsOk());
  ClientOptions options;
  auto client = Client::Create(options, InProcessTransports(**cluster));
  ASSERT_THAT(client.status(), IsOk());
  EXPECT_THAT((*client)->SaveCheckpoint(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("in-process:0"), HasSubstr("checkpoint directory"))));
}

}  // namespace
}  // namespace pserver
