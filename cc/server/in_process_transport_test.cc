// The in-process transport and the gRPC service are one dispatcher: a
// server answers the same over either. Also Client::GetLayout (a header-only
// read) and Client::SaveCheckpoint over both, and the table frames in
// process (the dispatcher's PullTableRows / PushTableRows on the caller's
// memory) answering as the TablePull / TablePush control calls do.
#include "cc/server/in_process_transport.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "cc/client/client.h"
#include "cc/client/grpc_transport.h"
#include "cc/client/table.h"
#include "cc/core/table_keys.h"
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

// Sends a table frame in process; the call completes before TableRows
// returns.
absl::Status SendFrame(Transport& t, FrameMethod method, const TableFrame& frame,
                       Transport::RowsSink rows = nullptr) {
  absl::Status result = absl::UnknownError("done did not run");
  Transport::Done done = [&](absl::Status s) { result = std::move(s); };
  EXPECT_TRUE(t.TableRows(method, frame, std::move(rows), absl::Now() + absl::Seconds(30), done,
                          nullptr));
  EXPECT_FALSE(done) << "TableRows carried the call, so it takes `done`";
  return result;
}

TEST_F(BothTransportsTest, TableFramesInProcessAnswerAsTheControlCalls) {
  std::unique_ptr<Client> client = ClientOver(/*in_process=*/true);
  ASSERT_NE(client, nullptr);
  v1::TableConfig config;
  config.set_dim(2);
  config.mutable_optimizer()->mutable_sgd()->set_learning_rate(1.0);  // rows start at 0
  ASSERT_THAT(Table::Create(*client, "emb", config).status(), IsOk());

  // A push with a repeated key: summed, applied once per id.
  const std::vector<uint64_t> pushed = {7, 3, 7};
  const std::vector<float> grads = {1, 10, 2, 20, 3, 30};
  TableFrame push;
  push.table = "emb";
  push.keys = pushed;
  push.values = absl::string_view(reinterpret_cast<const char*>(grads.data()),
                                  grads.size() * sizeof(float));
  push.client_id = 0x42;
  push.sequence = 1;
  ASSERT_THAT(SendFrame(*in_process_, FrameMethod::kTableRowsPush, push), IsOk());
  ASSERT_THAT(SendFrame(*in_process_, FrameMethod::kTableRowsPush, push), IsOk());  // a retry

  // Read back in process as a frame and over gRPC as the TablePull control
  // call: the same rows, the push applied once.
  const std::vector<uint64_t> pulled = {3, 7, 9};
  TableFrame pull;
  pull.table = "emb";
  pull.keys = pulled;
  std::string framed_rows;
  ASSERT_THAT(SendFrame(*in_process_, FrameMethod::kTableRowsPull, pull,
                        [&](uint32_t content_type, absl::string_view rows) {
                          EXPECT_EQ(content_type, 0u);
                          framed_rows.assign(rows.data(), rows.size());
                          return absl::OkStatus();
                        }),
              IsOk());
  v1::TablePullRequest request;
  request.set_table("emb");
  request.set_keys(EncodeKeys(pulled));
  v1::TablePullResponse response;
  ASSERT_THAT(CallAndWait(*grpc_, "TablePull", request, &response), IsOk());
  EXPECT_EQ(framed_rows, response.values());
  std::vector<float> rows(pulled.size() * 2);
  ASSERT_EQ(framed_rows.size(), rows.size() * sizeof(float));
  std::memcpy(rows.data(), framed_rows.data(), framed_rows.size());
  EXPECT_THAT(rows, ElementsAre(-2, -20, -4, -40, 0, 0));

  // What the control calls refuse, the frames refuse, changing nothing.
  TableFrame unknown = pull;
  unknown.table = "nope";
  EXPECT_THAT(SendFrame(*in_process_, FrameMethod::kTableRowsPull, unknown,
                        [](uint32_t, absl::string_view) { return absl::OkStatus(); }),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
  const std::vector<float> bad = {1, std::nanf(""), 2, 2, 3, 3};
  TableFrame not_finite = push;
  not_finite.sequence = 2;
  not_finite.values = absl::string_view(reinterpret_cast<const char*>(bad.data()),
                                        bad.size() * sizeof(float));
  EXPECT_THAT(SendFrame(*in_process_, FrameMethod::kTableRowsPush, not_finite),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("non-finite")));
  v1::TablePullResponse after;
  ASSERT_THAT(CallAndWait(*grpc_, "TablePull", request, &after), IsOk());
  EXPECT_EQ(after.values(), response.values());

  // A read by a worker may wait for other workers: not carried as a frame.
  TableFrame by_worker = pull;
  by_worker.worker = "w0";
  Transport::Done done = [](absl::Status) {};
  EXPECT_FALSE(in_process_->TableRows(FrameMethod::kTableRowsPull, by_worker,
                                      [](uint32_t, absl::string_view) { return absl::OkStatus(); },
                                      absl::Now() + absl::Seconds(30), done, nullptr));
  EXPECT_TRUE(done) << "not carried: `done` stays the caller's";

  // The retried push was counted as a duplicate, as a TablePush's is.
  v1::GetStatsResponse stats;
  ASSERT_THAT(CallAndWait(*in_process_, "GetStats", v1::GetStatsRequest(), &stats), IsOk());
  EXPECT_EQ(stats.stats().duplicates_ignored(), 1u);
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
