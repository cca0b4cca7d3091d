// Table::PullAsync / PushAsync with several tickets in flight: they are that
// many requests outstanding at once (no thread per call, no executor in
// between), each ticket keeps its own status and values, a failed attempt
// is retried with the same request id (applied once), the client holds at
// most ClientOptions::max_async_in_flight of them, and against a real server
// (over the bulk channel and over gRPC) tickets in flight give exactly the
// results of the same calls made one at a time; on the embedded cluster
// the calls run on the calling thread. No test depends on timing:
// held requests are answered by the test, in the order it chooses.
#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cc/client/cancellation.h"
#include "cc/client/client.h"
#include "cc/client/table.h"
#include "cc/server/in_process_transport.h"
#include "cc/server/local_cluster.h"
#include "cc/server/server.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::IsOk;
using ::pserver::testing::StatusCodeIs;
using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(60);
constexpr uint32_t kDim = 2;

v1::TableConfig SgdTable(uint32_t dim) {
  v1::TableConfig config;
  config.set_dim(dim);
  config.mutable_optimizer()->mutable_sgd()->set_learning_rate(1.0);
  return config;
}

// A transport that holds every table request it is given until the test
// answers it; control calls (CreateTable) are answered OK at once.
class HoldingTransport final : public Transport {
 public:
  struct Held {
    FrameMethod method;
    std::vector<uint64_t> keys;
    uint64_t client_id = 0;
    uint64_t sequence = 0;
    RowsSink rows;
    Done done;
  };

  const std::string& address() const override { return address_; }
  void Call(absl::string_view method, const google::protobuf::Message&,
            google::protobuf::Message*, absl::Time, Done done) override {
    done(method == "CreateTable" ? absl::OkStatus()
                                 : absl::UnimplementedError(std::string(method)));
  }
  void Push(const RequestId&, absl::Span<const GradientView>, absl::Time, Done done,
            TraceRecorder*) override {
    done(absl::UnimplementedError("Push"));
  }
  void Pull(absl::Span<const v1::ParamRef>, BlockSink, absl::Time, Done done,
            TraceRecorder*) override {
    done(absl::UnimplementedError("Pull"));
  }
  void PushPull(const RequestId&, absl::Span<const GradientView>, absl::Span<const v1::ParamRef>,
                BlockSink, absl::Time, Done done, TraceRecorder*) override {
    done(absl::UnimplementedError("PushPull"));
  }
  bool TableRows(FrameMethod method, const TableFrame& frame, RowsSink rows, absl::Time,
                 Done& done, TraceRecorder*) override {
    absl::MutexLock lock(&mu_);
    Held& held = held_.emplace_back();
    held.method = method;
    held.keys.assign(frame.keys.begin(), frame.keys.end());
    held.client_id = frame.client_id;
    held.sequence = frame.sequence;
    held.rows = std::move(rows);
    held.done = std::move(done);
    return true;
  }

  // Requests received so far (answered or not).
  size_t received() {
    absl::MutexLock lock(&mu_);
    return held_.size();
  }
  // Waits (at most kTimeout) until `n` requests were received.
  bool AwaitReceived(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return held_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), kTimeout);
  }
  Held Request(size_t j) {
    absl::MutexLock lock(&mu_);
    Held copy;
    copy.method = held_[j].method;
    copy.keys = held_[j].keys;
    copy.client_id = held_[j].client_id;
    copy.sequence = held_[j].sequence;
    return copy;
  }
  // Answers request j: a pull's rows are each key's value, key + d / 10.
  void Answer(size_t j, absl::Status status) {
    RowsSink rows;
    Done done;
    std::vector<uint64_t> keys;
    {
      absl::MutexLock lock(&mu_);
      rows = std::move(held_[j].rows);
      done = std::move(held_[j].done);
      keys = held_[j].keys;
    }
    if (status.ok() && rows) {
      std::vector<float> values;
      for (uint64_t key : keys) {
        for (uint32_t d = 0; d < kDim; ++d) values.push_back(RowValue(key, d));
      }
      status = rows(0, absl::string_view(reinterpret_cast<const char*>(values.data()),
                                         values.size() * sizeof(float)));
    }
    done(std::move(status));
  }
  static float RowValue(uint64_t key, uint32_t d) { return static_cast<float>(key) + d / 10.0f; }
  // Answers every request not answered yet with CANCELLED (a test that
  // failed midway: the client waits for its async calls when destroyed).
  void AnswerAllLeft() {
    for (size_t j = 0; j < received(); ++j) {
      bool left;
      {
        absl::MutexLock lock(&mu_);
        left = static_cast<bool>(held_[j].done);
      }
      if (left) Answer(j, absl::CancelledError("the test ended"));
    }
  }

 private:
  const std::string address_ = "holding:1";
  absl::Mutex mu_;
  std::vector<Held> held_ ABSL_GUARDED_BY(mu_);
};

class TableAsyncHeldTest : public ::testing::Test {
 protected:
  void SetUp() override { Make(ClientOptions()); }
  void TearDown() override {
    if (transport_ != nullptr) transport_->AnswerAllLeft();
    table_.reset();
    client_.reset();
  }

  void Make(ClientOptions options) {
    if (transport_ != nullptr) transport_->AnswerAllLeft();
    table_.reset();
    client_.reset();
    options.async_threads = 1;  // tickets in flight must not need a thread each
    options.initial_backoff = absl::Milliseconds(1);
    options.max_backoff = absl::Milliseconds(1);
    auto transport = std::make_unique<HoldingTransport>();
    transport_ = transport.get();
    std::vector<std::unique_ptr<Transport>> transports;
    transports.push_back(std::move(transport));
    auto client = Client::Create(options, std::move(transports));
    ASSERT_THAT(client.status(), IsOk());
    client_ = *std::move(client);
    auto table = Table::Create(*client_, "emb", SgdTable(kDim));
    ASSERT_THAT(table.status(), IsOk());
    table_.emplace(*std::move(table));
  }

  static absl::Span<char> Bytes(std::vector<float>& v) {
    return absl::Span<char>(reinterpret_cast<char*>(v.data()), v.size() * sizeof(float));
  }
  static absl::string_view Bytes(const std::vector<float>& v) {
    return absl::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  }

  HoldingTransport* transport_ = nullptr;
  std::unique_ptr<Client> client_;
  std::optional<Table> table_;
};

// Eight pulls from one thread, with one executor thread: eight requests
// outstanding before any is answered; answered in reverse order, each
// ticket gets its own rows, in its keys' order (duplicates included).
TEST_F(TableAsyncHeldTest, TicketsInFlightAreRequestsOutstandingAtOnce) {
  constexpr int kTickets = 8;
  std::vector<std::vector<uint64_t>> keys(kTickets);
  std::vector<std::vector<float>> outs(kTickets);
  std::vector<Ticket> tickets;
  for (int t = 0; t < kTickets; ++t) {
    keys[t] = {uint64_t(100 * t + 7), uint64_t(100 * t + 3), uint64_t(100 * t + 7)};
    outs[t].assign(keys[t].size() * kDim, -1);
    tickets.push_back(table_->PullAsync(keys[t], Bytes(outs[t])));
  }
  ASSERT_EQ(transport_->received(), static_cast<size_t>(kTickets));
  EXPECT_EQ(client_->async_in_flight(), kTickets);
  for (const Ticket& t : tickets) EXPECT_FALSE(t.done());
  for (int j = kTickets - 1; j >= 0; --j) {
    EXPECT_EQ(transport_->Request(j).keys, keys[j]);
    transport_->Answer(j, absl::OkStatus());
    ASSERT_THAT(tickets[j].Wait(kTimeout), IsOk()) << j;
    for (size_t k = 0; k < keys[j].size(); ++k) {
      for (uint32_t d = 0; d < kDim; ++d) {
        EXPECT_EQ(outs[j][k * kDim + d], HoldingTransport::RowValue(keys[j][k], d)) << j;
      }
    }
  }
  EXPECT_EQ(client_->async_in_flight(), 0);
}

// Of three pushes in flight, the one its server refuses fails, alone, with
// the server's error naming the server; the others succeed.
TEST_F(TableAsyncHeldTest, AFailingTicketAmongSeveralFailsAlone) {
  const std::vector<uint64_t> keys = {1, 2};
  const std::vector<float> grads(keys.size() * kDim, 1);
  std::vector<Ticket> tickets;
  for (int t = 0; t < 3; ++t) tickets.push_back(table_->PushAsync(keys, Bytes(grads)));
  ASSERT_EQ(transport_->received(), 3u);
  transport_->Answer(1, absl::InvalidArgumentError("bad gradient"));
  transport_->Answer(0, absl::OkStatus());
  transport_->Answer(2, absl::OkStatus());
  EXPECT_THAT(tickets[0].Wait(kTimeout), IsOk());
  EXPECT_THAT(tickets[1].Wait(kTimeout),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("bad gradient"), HasSubstr("holding:1"))));
  EXPECT_THAT(tickets[2].Wait(kTimeout), IsOk());
  // Only the three pushes were sent: an error that is not retried is not
  // sent again.
  EXPECT_EQ(transport_->received(), 3u);
  // Each request had its own id.
  EXPECT_NE(transport_->Request(0).sequence, transport_->Request(1).sequence);
  EXPECT_NE(transport_->Request(1).sequence, transport_->Request(2).sequence);
}

// A push whose first attempt fails UNAVAILABLE is sent again with the same
// client id and sequence (the server applies it once), and its ticket
// succeeds; a pull likewise, with its rows. (One executor thread: the
// retries go one after the other, the push's first.)
TEST_F(TableAsyncHeldTest, AFailedAttemptIsRetriedWithTheSameRequestId) {
  const std::vector<uint64_t> keys = {4, 5, 4};
  const std::vector<float> grads(keys.size() * kDim, 1);
  Ticket push = table_->PushAsync(keys, Bytes(grads));
  std::vector<float> out(keys.size() * kDim, -1);
  Ticket pull = table_->PullAsync(keys, Bytes(out));
  ASSERT_EQ(transport_->received(), 2u);
  transport_->Answer(0, absl::UnavailableError("server busy; retry"));
  transport_->Answer(1, absl::UnavailableError("server busy; retry"));
  ASSERT_TRUE(transport_->AwaitReceived(3));
  const HoldingTransport::Held retry = transport_->Request(2);
  EXPECT_EQ(retry.method, FrameMethod::kTableRowsPush);
  EXPECT_EQ(retry.sequence, transport_->Request(0).sequence);
  EXPECT_EQ(retry.client_id, transport_->Request(0).client_id);
  EXPECT_EQ(retry.keys, keys);
  EXPECT_FALSE(push.done());
  transport_->Answer(2, absl::OkStatus());
  EXPECT_THAT(push.Wait(kTimeout), IsOk());
  ASSERT_TRUE(transport_->AwaitReceived(4));
  EXPECT_EQ(transport_->Request(3).method, FrameMethod::kTableRowsPull);
  transport_->Answer(3, absl::OkStatus());
  EXPECT_THAT(pull.Wait(kTimeout), IsOk());
  EXPECT_EQ(out[0], HoldingTransport::RowValue(4, 0));
  EXPECT_EQ(out[3], HoldingTransport::RowValue(5, 1));
  EXPECT_EQ(out[4], HoldingTransport::RowValue(4, 0));
  EXPECT_EQ(transport_->received(), 4u);
}

// With max_async_in_flight = 2 and two calls held, a third waits for a
// slot until its deadline and fails DEADLINE_EXCEEDED naming the option,
// having sent nothing; once one ends, the next is sent.
TEST_F(TableAsyncHeldTest, TicketsInFlightAreBoundedByMaxAsyncInFlight) {
  ClientOptions options;
  options.max_async_in_flight = 2;
  Make(options);
  const std::vector<uint64_t> keys = {1};
  std::vector<std::vector<float>> outs(4, std::vector<float>(kDim));
  Ticket first = table_->PullAsync(keys, Bytes(outs[0]));
  Ticket second = table_->PullAsync(keys, Bytes(outs[1]));
  ASSERT_EQ(transport_->received(), 2u);
  CallOptions soon;
  soon.deadline = absl::Now() + absl::Milliseconds(20);
  Ticket third = table_->PullAsync(keys, Bytes(outs[2]), soon);
  EXPECT_THAT(third.Wait(kTimeout), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                             HasSubstr("max_async_in_flight")));
  EXPECT_EQ(transport_->received(), 2u);
  EXPECT_EQ(client_->async_in_flight(), 2);
  // The executor's path (a ticket of a KvWorker, a cancellable call) is
  // bounded by the same slots.
  Cancellation cancel;
  CallOptions cancellable = soon;
  cancellable.cancel = &cancel;
  Ticket fourth = table_->PullAsync(keys, Bytes(outs[3]), cancellable);
  EXPECT_THAT(fourth.Wait(kTimeout), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                              HasSubstr("max_async_in_flight")));
  transport_->Answer(0, absl::OkStatus());
  ASSERT_THAT(first.Wait(kTimeout), IsOk());
  Ticket next = table_->PullAsync(keys, Bytes(outs[2]));
  EXPECT_EQ(transport_->received(), 3u);
  transport_->Answer(1, absl::OkStatus());
  transport_->Answer(2, absl::OkStatus());
  EXPECT_THAT(second.Wait(kTimeout), IsOk());
  EXPECT_THAT(next.Wait(kTimeout), IsOk());
}

TEST(TableAsyncOptionsTest, MaxAsyncInFlightBelowOneIsRefused) {
  ClientOptions options;
  options.max_async_in_flight = 0;
  std::vector<std::unique_ptr<Transport>> transports;
  transports.push_back(std::make_unique<HoldingTransport>());
  EXPECT_THAT(Client::Create(options, std::move(transports)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_async_in_flight")));
}

// Keys the servers of `table` counted as pushed, all together.
uint64_t KeysPushed(const Table& table) {
  auto stats = table.Stats();
  EXPECT_THAT(stats.status(), IsOk());
  uint64_t pushed = 0;
  if (stats.ok()) {
    for (const v1::TableStats& s : *stats) pushed += s.keys_pushed();
  }
  return pushed;
}

uint64_t KeysListed(const std::vector<std::vector<uint64_t>>& calls) {
  uint64_t listed = 0;
  for (const auto& keys : calls) listed += keys.size();
  return listed;
}

// Against two real servers, over the bulk channel and over gRPC: pushes and
// pulls made as tickets all in flight together give exactly the rows the
// same calls made one at a time give (keys in any order, duplicates within
// and across calls; gradients that sum exactly in float).
class TableAsyncServerTest : public ::testing::TestWithParam<bool> {};

TEST_P(TableAsyncServerTest, TicketsInFlightGiveTheResultsOfTheSameCallsOneAtATime) {
  std::vector<std::unique_ptr<Server>> servers;
  ClientOptions options;
  for (int s = 0; s < 2; ++s) {
    auto server = Server::Start(ServerOptions());
    ASSERT_THAT(server.status(), IsOk());
    options.servers.push_back((*server)->address());
    servers.push_back(*std::move(server));
  }
  options.bulk_channel = GetParam();
  auto client = Client::Connect(options);
  ASSERT_THAT(client.status(), IsOk());
  constexpr uint32_t kRow = 4;
  auto one_at_a_time = Table::Create(**client, "sync", SgdTable(kRow));
  auto in_flight = Table::Create(**client, "async", SgdTable(kRow));
  ASSERT_THAT(one_at_a_time.status(), IsOk());
  ASSERT_THAT(in_flight.status(), IsOk());
  constexpr int kCalls = 12;
  std::mt19937_64 rng(13);
  std::vector<std::vector<uint64_t>> keys(kCalls);
  std::vector<std::vector<float>> grads(kCalls);
  for (int c = 0; c < kCalls; ++c) {
    const size_t n = 50 + 40 * c;
    for (size_t k = 0; k < n; ++k) keys[c].push_back(rng() % 300);  // many duplicates
    for (size_t i = 0; i < n * kRow; ++i) grads[c].push_back(static_cast<float>(rng() % 9) - 4);
  }
  auto bytes = [](const std::vector<float>& v) {
    return absl::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  };
  for (int c = 0; c < kCalls; ++c) {
    ASSERT_THAT(one_at_a_time->Push<float>(keys[c], grads[c]), IsOk());
  }
  std::vector<Ticket> pushes;
  for (int c = 0; c < kCalls; ++c) pushes.push_back(in_flight->PushAsync(keys[c], bytes(grads[c])));
  for (int c = 0; c < kCalls; ++c) ASSERT_THAT(pushes[c].Wait(kTimeout), IsOk()) << c;
  std::vector<std::vector<float>> expected(kCalls), got(kCalls);
  std::vector<Ticket> pulls;
  for (int c = 0; c < kCalls; ++c) {
    expected[c].assign(keys[c].size() * kRow, 0);
    got[c].assign(keys[c].size() * kRow, -1000);
    ASSERT_THAT(one_at_a_time->Pull<float>(keys[c], absl::MakeSpan(expected[c])), IsOk());
    pulls.push_back(in_flight->PullAsync(
        keys[c], absl::Span<char>(reinterpret_cast<char*>(got[c].data()),
                                  got[c].size() * sizeof(float))));
  }
  for (int c = 0; c < kCalls; ++c) {
    ASSERT_THAT(pulls[c].Wait(kTimeout), IsOk()) << c;
    EXPECT_EQ(got[c], expected[c]) << "call " << c;
  }
  // Every push was applied once: the rows moved (exactly the sum of their
  // gradients, checked above against the one-at-a-time table).
  EXPECT_EQ(KeysPushed(*in_flight), KeysListed(keys));
  EXPECT_EQ((*client)->async_in_flight(), 0);
}

INSTANTIATE_TEST_SUITE_P(ChannelAndGrpc, TableAsyncServerTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Channel" : "Grpc";
                         });

// The embedded cluster (in-process transports): a table call's ticket is
// done when PullAsync / PushAsync returns, run on the calling thread. The
// client's only executor thread is held busy all along, so a call queued on
// the executor (as they were: one executor thread per ticket, several
// tickets' pushes convoying on the same shards) would not be done; the
// many calls all complete, with exactly the rows and updates of the same
// calls made one at a time, over two servers.
TEST(TableAsyncInProcessTest, TicketsAreDoneOnTheCallingThreadWithoutTheExecutor) {
  auto cluster = LocalCluster::Start(2);
  ASSERT_THAT(cluster.status(), IsOk());
  // Declared before the client: calls still queued on its executor when it
  // is destroyed (a failure) run while they are alive.
  constexpr int kCalls = 64;
  constexpr uint32_t kRow = 4;
  std::mt19937_64 rng(17);
  std::vector<std::vector<uint64_t>> keys(kCalls);
  std::vector<std::vector<float>> grads(kCalls), expected(kCalls), got(kCalls);
  for (int c = 0; c < kCalls; ++c) {
    const size_t n = 1 + 37 * c;
    for (size_t k = 0; k < n; ++k) keys[c].push_back(rng() % 500);  // many duplicates
    for (size_t i = 0; i < n * kRow; ++i) grads[c].push_back(static_cast<float>(rng() % 9) - 4);
    expected[c].assign(n * kRow, 0);
    got[c].assign(n * kRow, -1000);
  }
  ClientOptions options;
  options.async_threads = 1;
  auto client = Client::Create(options, InProcessTransports(**cluster));
  ASSERT_THAT(client.status(), IsOk());
  // The executor's only thread is held until the end of the checks (or of
  // the test, should one fail first).
  auto release = std::make_shared<absl::Notification>();
  struct Releaser {
    std::shared_ptr<absl::Notification> n;
    ~Releaser() {
      if (!n->HasBeenNotified()) n->Notify();
    }
  } releaser{release};
  Ticket busy = (*client)->RunAsync([release](const CallOptions&) {
    release->WaitForNotification();
    return absl::OkStatus();
  });
  auto one_at_a_time = Table::Create(**client, "sync", SgdTable(kRow));
  auto in_flight = Table::Create(**client, "async", SgdTable(kRow));
  ASSERT_THAT(one_at_a_time.status(), IsOk());
  ASSERT_THAT(in_flight.status(), IsOk());
  auto bytes = [](const std::vector<float>& v) {
    return absl::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  };
  std::vector<Ticket> tickets;
  int done_at_once = 0;
  for (int c = 0; c < kCalls; ++c) {
    ASSERT_THAT(one_at_a_time->Push<float>(keys[c], grads[c]), IsOk());
    tickets.push_back(in_flight->PushAsync(keys[c], bytes(grads[c])));
    done_at_once += tickets.back().done();
    ASSERT_THAT(one_at_a_time->Pull<float>(keys[c], absl::MakeSpan(expected[c])), IsOk());
    tickets.push_back(in_flight->PullAsync(
        keys[c], absl::Span<char>(reinterpret_cast<char*>(got[c].data()),
                                  got[c].size() * sizeof(float))));
    done_at_once += tickets.back().done();
  }
  EXPECT_EQ(done_at_once, 2 * kCalls) << "tickets waited for the executor";
  EXPECT_FALSE(busy.done());
  release->Notify();
  ASSERT_THAT(busy.Wait(kTimeout), IsOk());
  for (size_t t = 0; t < tickets.size(); ++t) ASSERT_THAT(tickets[t].Wait(kTimeout), IsOk()) << t;
  for (int c = 0; c < kCalls; ++c) EXPECT_EQ(got[c], expected[c]) << "call " << c;
  EXPECT_EQ(KeysPushed(*in_flight), KeysListed(keys));  // each push applied once
  EXPECT_EQ((*client)->async_in_flight(), 0);
}

}  // namespace
}  // namespace pserver
