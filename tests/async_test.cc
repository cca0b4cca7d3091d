// Asynchronous calls: tickets complete, time out, run callbacks and report
// their stages, for dense parameters and tables, over gRPC and in-process.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "cc/client/table.h"
#include "cc/client/ticket.h"
#include "cc/core/tables.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster_test_base.h"

namespace pserver {
namespace {

using ::pserver::testing::IsOk;
using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

class AsyncTest : public ClusterTest {
 protected:
  void SetUp() override { StartCluster(2); }

  static v1::ParameterConfig Sgd() {
    v1::ParameterConfig config;
    config.mutable_optimizer()->mutable_sgd();
    config.mutable_learning_rate()->set_learning_rate(1);
    return config;
  }
};

// Every stage happened, in order (the servers share this machine's clock).
void ExpectStagesInOrder(const TicketTrace& t) {
  EXPECT_NE(t.sent, absl::InfinitePast());
  EXPECT_NE(t.server_received, absl::InfinitePast());
  EXPECT_LE(t.queued, t.sent);
  EXPECT_LE(t.sent, t.server_received);
  EXPECT_LE(t.server_received, t.server_processed);
  EXPECT_LE(t.server_processed, t.reply_received);
  EXPECT_GE(t.requests, 1u);
}

TEST_P(AsyncTest, DensePushPullTicketsCompleteAndTraceTheirStages) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  // 3000 floats: split into 3 blocks over both servers.
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({3000}, std::vector<float>(3000, 1)),
                              Sgd()));
  ASSERT_OK(client->FinishInitParams());

  const std::vector<NamedTensor> grads = {
      {"w", Tensor::FromValues<float>({3000}, std::vector<float>(3000, 0.25f))}};
  Ticket push = client->SendGradsAsync(grads);
  ASSERT_OK(push.Wait(absl::Seconds(20)));
  EXPECT_TRUE(push.done());
  ExpectStagesInOrder(push.trace());
  EXPECT_GE(push.trace().requests, 2u);  // one request per server at least

  std::vector<Tensor> outs(1);
  const std::vector<std::string> names = {"w"};
  Ticket pull = client->GetParamsIntoAsync(names, absl::MakeSpan(outs));
  ASSERT_OK(pull.Wait(absl::Seconds(20)));
  ExpectStagesInOrder(pull.trace());
  EXPECT_EQ(outs[0].values<float>()[2999], 0.75f);

  std::vector<Tensor> updated(1);
  Ticket both = client->PushPullAsync(grads, absl::MakeSpan(updated));
  ASSERT_OK(both.Wait(absl::Seconds(20)));
  ExpectStagesInOrder(both.trace());
  EXPECT_EQ(updated[0].values<float>()[0], 0.5f);
}

TEST_P(AsyncTest, ManyTicketsInFlightAllApply) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  v1::TableConfig config;
  config.set_dim(2);
  config.mutable_optimizer()->mutable_add();
  ASSERT_OK_AND_ASSIGN(Table table, Table::Create(*client, "kv", config));
  const std::vector<uint64_t> keys = {1, 2, 3, 1};
  const std::vector<float> ones(keys.size() * 2, 1.0f);
  const absl::string_view bytes(reinterpret_cast<const char*>(ones.data()),
                                ones.size() * sizeof(float));
  std::vector<Ticket> tickets;
  for (int i = 0; i < 20; ++i) tickets.push_back(table.PushAsync(keys, bytes));
  for (const Ticket& t : tickets) {
    ASSERT_OK(t.Wait(absl::Seconds(20)));
    ExpectStagesInOrder(t.trace());
  }
  std::vector<float> rows(6);
  const std::vector<uint64_t> read = {1, 2, 3};
  ASSERT_OK(table.Pull<float>(read, absl::MakeSpan(rows)));
  EXPECT_EQ(rows, (std::vector<float>{40, 40, 20, 20, 20, 20}));
}

// Holds every pull of its table until released (bounded by a deadline).
class GateHandler : public TableHandler {
 public:
  absl::Status Pull(SparseTable& table, absl::Span<const uint64_t> keys,
                    absl::Span<char> out) override {
    if (!open_.WaitForNotificationWithTimeout(absl::Seconds(30))) {
      return absl::DeadlineExceededError("gate never opened");
    }
    return TableHandler::Pull(table, keys, out);
  }
  void Open() { open_.Notify(); }

 private:
  absl::Notification open_;
};

TEST_P(AsyncTest, WaitTimesOutWhileTheCallRunsAndCallbacksRunOnce) {
  auto gate = std::make_shared<GateHandler>();
  for (Tables* tables : cluster_->tables()) tables->SetHandler("gated", gate);
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  v1::TableConfig config;
  config.set_dim(1);
  ASSERT_OK_AND_ASSIGN(Table table, Table::Create(*client, "gated", config));

  const std::vector<uint64_t> keys = {7};
  std::vector<float> row(1, -1);
  std::atomic<int> callbacks{0};
  absl::Notification called;
  absl::Status seen = absl::UnknownError("callback not run");
  Ticket ticket =
      table.PullAsync(keys, absl::Span<char>(reinterpret_cast<char*>(row.data()), sizeof(float)));
  ticket.OnDone([&](const absl::Status& status) {
    seen = status;
    callbacks.fetch_add(1);
    called.Notify();
  });
  EXPECT_THAT(ticket.Wait(absl::Milliseconds(50)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("still running")));
  EXPECT_FALSE(ticket.done());
  EXPECT_EQ(callbacks.load(), 0);

  gate->Open();
  ASSERT_OK(ticket.Wait(absl::Seconds(20)));
  ASSERT_TRUE(called.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_OK(seen);
  EXPECT_EQ(row[0], 0.0f);
  // A callback added after completion runs at once, here.
  bool late = false;
  ticket.OnDone([&](const absl::Status& status) { late = status.ok(); });
  EXPECT_TRUE(late);
  EXPECT_EQ(callbacks.load(), 1);
}

TEST_P(AsyncTest, FailedCallsReportTheirErrorThroughTheTicket) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->FinishInitParams());
  const std::vector<NamedTensor> grads = {{"nope", Tensor::FromValues<float>({1}, {1.0f})}};
  Ticket ticket = client->SendGradsAsync(grads);
  EXPECT_THAT(ticket.Wait(absl::Seconds(20)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
  EXPECT_TRUE(ticket.done());
  EXPECT_NE(ticket.trace().reply_received, absl::InfinitePast());

  CallOptions past;
  past.deadline = absl::Now() - absl::Seconds(1);
  Ticket late = client->SendGradsAsync(grads, past);
  EXPECT_THAT(late.Wait(absl::Seconds(20)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("deadline")));
  EXPECT_EQ(late.trace().sent, absl::InfinitePast());  // never sent
}

TEST_P(AsyncTest, KvWorkerClockWaitsForItsAsyncAdds) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  v1::TableConfig config;
  config.set_dim(1);
  config.set_element_type(v1::FLOAT64);
  config.mutable_optimizer()->mutable_add();
  config.mutable_consistency()->set_model(v1::Consistency::BSP);
  ASSERT_OK_AND_ASSIGN(Table table, Table::Create(*client, "bsp", config));
  ASSERT_OK_AND_ASSIGN(auto worker, KvWorker::Join(table, "solo"));
  const std::vector<uint64_t> keys = {3, 4};
  const std::vector<double> ones = {1, 1};
  const absl::string_view bytes(reinterpret_cast<const char*>(ones.data()),
                                ones.size() * sizeof(double));
  for (int i = 0; i < 10; ++i) worker->AddAsync(keys, bytes);
  ASSERT_OK(worker->Clock());  // after all 10 adds; BSP releases them at clock 1
  std::vector<double> got(2);
  Ticket get = worker->GetAsync(
      keys, absl::Span<char>(reinterpret_cast<char*>(got.data()), got.size() * sizeof(double)));
  ASSERT_OK(get.Wait(absl::Seconds(20)));
  EXPECT_EQ(got, (std::vector<double>{10, 10}));
  ASSERT_OK(worker->Leave());
  EXPECT_THAT(worker->GetAsync(keys, absl::Span<char>()).Wait(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("has left")));
}

INSTANTIATE_TEST_SUITE_P(Transports, AsyncTest, ::testing::Values(Via::kGrpc, Via::kInProcess),
                         ViaName);

}  // namespace
}  // namespace pserver
