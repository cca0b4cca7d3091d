// Sparse table calls over the bulk channel (frame.h kTablePull, kTablePush)
// and over gRPC answer alike: values, duplicate keys, the error model (the
// same code and message for the same bad input), exactly-once pushes when
// replies are lost, and a consistent read by a worker, which stays a gRPC
// control call. Parameterized: true runs every test over the channel, false
// over gRPC. No test depends on timing.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "cc/client/channel_transport.h"
#include "cc/client/client.h"
#include "cc/client/grpc_transport.h"
#include "cc/client/table.h"
#include "cc/core/table_keys.h"
#include "cc/server/server.h"
#include "cc/server/service.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::IsOk;
using ::pserver::testing::StatusCodeIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(60);

v1::TableConfig SgdTable(uint32_t dim) {
  v1::TableConfig config;
  config.set_dim(dim);
  config.mutable_optimizer()->mutable_sgd()->set_learning_rate(1.0);
  return config;
}

// One control call on `t`, waited for.
absl::Status CallOver(Transport& t, absl::string_view method,
                      const google::protobuf::Message& request,
                      google::protobuf::Message* response) {
  absl::Notification done;
  absl::Status status;
  t.Call(method, request, response, absl::Now() + kTimeout, [&](absl::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

class TableChannelTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { Start(ServerOptions()); }

  void Start(ServerOptions options) {
    auto server = Server::Start(options);
    ASSERT_THAT(server.status(), IsOk());
    server_ = *std::move(server);
    client_ = Connect(GetParam());
    ASSERT_NE(client_, nullptr);
    ASSERT_THAT(client_->FinishInitParams(), IsOk());
  }

  std::unique_ptr<Client> Connect(bool bulk_channel) {
    ClientOptions options;
    options.servers = {server_->address()};
    options.bulk_channel = bulk_channel;
    options.initial_backoff = absl::Milliseconds(1);
    auto client = Client::Connect(options);
    EXPECT_THAT(client.status(), IsOk());
    return client.ok() ? *std::move(client) : nullptr;
  }

  // The transport a test sends raw requests over: the channel, or gRPC.
  std::unique_ptr<Transport> RawTransport() {
    auto grpc = GrpcTransport::Create(server_->address());
    EXPECT_THAT(grpc.status(), IsOk());
    if (!GetParam()) return *std::move(grpc);
    return std::make_unique<ChannelTransport>(*std::move(grpc));
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_P(TableChannelTest, PullAndPushAnswerAsTheTableDoes) {
  auto table = Table::Create(*client_, "emb", SgdTable(2));
  ASSERT_THAT(table.status(), IsOk());
  const std::vector<uint64_t> keys = {5, 9, 5, 1ull << 40};
  // Key 5 twice: its gradients are summed.
  ASSERT_THAT(table->Push<float>(keys, std::vector<float>{0.5, 1, 0.25, 0, 2, 2, 1, 1}), IsOk());
  std::vector<float> rows(keys.size() * 2);
  ASSERT_THAT(table->Pull<float>(keys, absl::MakeSpan(rows)), IsOk());
  EXPECT_THAT(rows, ElementsAre(-2.5, -3, -0.25, 0, -2.5, -3, -1, -1));
  // An unknown key reads the initializer's value and creates no row.
  std::vector<float> fresh(2);
  ASSERT_THAT(table->Pull<float>(std::vector<uint64_t>{77}, absl::MakeSpan(fresh)), IsOk());
  EXPECT_THAT(fresh, ElementsAre(0, 0));
  auto stats = table->Stats();
  ASSERT_THAT(stats.status(), IsOk());
  EXPECT_EQ((*stats)[0].rows(), 3u);
  EXPECT_EQ((*stats)[0].keys_pushed(), 4u);
  EXPECT_EQ((*stats)[0].keys_pulled(), 5u);

  // The other path reads the same rows.
  std::unique_ptr<Client> other = Connect(!GetParam());
  ASSERT_NE(other, nullptr);
  auto same = Table::Create(*other, "emb", SgdTable(2));
  ASSERT_THAT(same.status(), IsOk());
  std::vector<float> again(rows.size());
  ASSERT_THAT(same->Pull<float>(keys, absl::MakeSpan(again)), IsOk());
  EXPECT_EQ(again, rows);
}

TEST_P(TableChannelTest, TableCallsTravelOverTheChannelWhenItIsOpen) {
  std::unique_ptr<Transport> transport = RawTransport();
  auto create = v1::CreateTableRequest();
  create.set_name("emb");
  *create.mutable_config() = SgdTable(1);
  v1::CreateTableResponse created;
  ASSERT_THAT(CallOver(*transport, "CreateTable", create, &created), IsOk());
  v1::TablePushRequest push;
  push.set_table("emb");
  const std::vector<uint64_t> keys = {3};
  push.set_keys(EncodeKeys(keys));
  const float grad = 2;
  push.set_values(&grad, sizeof(grad));
  v1::TablePushResponse pushed;
  ASSERT_THAT(CallOver(*transport, "TablePush", push, &pushed), IsOk());
  v1::TablePullRequest pull;
  pull.set_table("emb");
  pull.set_keys(EncodeKeys(keys));
  v1::TablePullResponse pulled;
  ASSERT_THAT(CallOver(*transport, "TablePull", pull, &pulled), IsOk());
  ASSERT_EQ(pulled.values().size(), sizeof(float));
  float value;
  std::memcpy(&value, pulled.values().data(), sizeof(value));
  EXPECT_EQ(value, -2);
  EXPECT_GT(pulled.trace().processed_unix_nanos(), 0);
  if (GetParam()) {
    EXPECT_EQ(static_cast<ChannelTransport&>(*transport).route(), "unix");
  }
}

TEST_P(TableChannelTest, BadInputGetsTheSameErrorOnBothPathsAndChangesNothing) {
  std::unique_ptr<Transport> transport = RawTransport();
  std::unique_ptr<Transport> grpc = *GrpcTransport::Create(server_->address());
  auto table = Table::Create(*client_, "emb", SgdTable(2));
  ASSERT_THAT(table.status(), IsOk());

  // Each bad request: the same status over the transport under test and
  // over gRPC's control call.
  auto same_error = [&](absl::string_view method, const google::protobuf::Message& request,
                        google::protobuf::Message* response, absl::StatusCode code,
                        absl::string_view says) {
    absl::Status status = CallOver(*transport, method, request, response);
    EXPECT_THAT(status, StatusCodeIs(code)) << method;
    EXPECT_THAT(status.message(), HasSubstr(says));
    EXPECT_EQ(status, CallOver(*grpc, method, request, response)) << method;
  };
  v1::TablePullRequest pull;
  v1::TablePullResponse pulled;
  pull.set_table("missing");
  pull.set_keys(EncodeKeys(std::vector<uint64_t>{1}));
  same_error("TablePull", pull, &pulled, absl::StatusCode::kNotFound, "no table 'missing'");
  pull.set_table("emb");
  pull.set_keys("1234567");  // not whole uint64 keys
  same_error("TablePull", pull, &pulled, absl::StatusCode::kInvalidArgument, "7");

  v1::TablePushRequest push;
  v1::TablePushResponse pushed;
  push.set_table("emb");
  push.set_keys(EncodeKeys(std::vector<uint64_t>{1, 2}));
  const std::vector<float> bad = {1, 1, std::numeric_limits<float>::infinity(), 1};
  push.set_values(bad.data(), bad.size() * sizeof(float));
  same_error("TablePush", push, &pushed, absl::StatusCode::kInvalidArgument, "non-finite");
  push.set_values(bad.data(), 3 * sizeof(float));  // 3 values for 2 rows of 2
  same_error("TablePush", push, &pushed, absl::StatusCode::kInvalidArgument, "bytes");
  push.set_keys("123");
  same_error("TablePush", push, &pushed, absl::StatusCode::kInvalidArgument, "3");

  // Nothing was applied.
  auto stats = table->Stats();
  ASSERT_THAT(stats.status(), IsOk());
  EXPECT_EQ((*stats)[0].rows(), 0u);
}

TEST_P(TableChannelTest, ALostReplyIsRetriedAndThePushAppliedOnce) {
  ServerOptions options;
  options.drop_reply_after_apply_every_n = 2;  // every 2nd applied push "loses" its reply
  server_.reset();
  Start(options);
  auto table = Table::Create(*client_, "emb", SgdTable(1));
  ASSERT_THAT(table.status(), IsOk());
  const std::vector<uint64_t> keys = {42};
  for (int i = 0; i < 4; ++i) {
    ASSERT_THAT(table->Push<float>(keys, std::vector<float>{1}), IsOk());
  }
  std::vector<float> row(1);
  ASSERT_THAT(table->Pull<float>(keys, absl::MakeSpan(row)), IsOk());
  EXPECT_EQ(row[0], -4);  // 0 - 4 * 1
  EXPECT_GE(server_->dispatcher().duplicates_ignored(), 1u);
  EXPECT_EQ(server_->dispatcher().duplicates_ignored(), server_->dispatcher().replies_dropped());
}

TEST_P(TableChannelTest, AReadByAWorkerStaysAControlCall) {
  v1::TableConfig config = SgdTable(1);
  config.mutable_consistency()->set_model(v1::Consistency::SSP);
  config.mutable_consistency()->set_staleness(0);
  auto table = Table::Create(*client_, "kv", config);
  ASSERT_THAT(table.status(), IsOk());
  auto worker = KvWorker::Join(*table, "w0");
  ASSERT_THAT(worker.status(), IsOk());
  const std::vector<uint64_t> keys = {1};
  ASSERT_THAT((*worker)->Add(keys, absl::string_view("\0\0\0\x40", 4)), IsOk());  // 2.0f
  std::vector<char> row(sizeof(float));
  ASSERT_THAT((*worker)->Get(keys, absl::MakeSpan(row)), IsOk());
  float value;
  std::memcpy(&value, row.data(), sizeof(value));
  EXPECT_EQ(value, -2);

  // Sent as a bulk frame, such a read is refused, not left to wait.
  v1::TablePullRequest request;
  request.set_table("kv");
  request.set_keys(EncodeKeys(keys));
  request.set_worker("w0");
  const std::string bytes = request.SerializeAsString();
  grpc::Slice slice(bytes);
  grpc::ByteBuffer buffer(&slice, 1), reply;
  ReplyHold hold;
  absl::Status status =
      FindBulkMethod("TablePull")(server_->dispatcher(), buffer, &reply, &hold);
  EXPECT_THAT(status, StatusCodeIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(status.message(), HasSubstr("control call"));
}

TEST_P(TableChannelTest, MalformedBulkBytesAreRefusedByName) {
  for (const char* method : {"TablePull", "TablePush"}) {
    const std::string garbage(64, '\xff');
    grpc::Slice slice(garbage);
    grpc::ByteBuffer buffer(&slice, 1), reply;
    ReplyHold hold;
    absl::Status status = FindBulkMethod(method)(server_->dispatcher(), buffer, &reply, &hold);
    EXPECT_THAT(status, StatusCodeIs(absl::StatusCode::kInvalidArgument)) << method;
    EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("malformed ", method, "Request")));
  }
}

// A transport in front of another that counts the table calls it passes on
// as table frames and as control calls; with `old_server`, it hides the
// server's table frames in OpenChannel's answer (a server before them).
class TableCallCounter final : public Transport {
 public:
  TableCallCounter(std::unique_ptr<Transport> inner, bool old_server)
      : inner_(std::move(inner)), old_server_(old_server) {}
  const std::string& address() const override { return inner_->address(); }
  void Call(absl::string_view method, const google::protobuf::Message& request,
            google::protobuf::Message* response, absl::Time deadline, Done done) override {
    if (method == "TablePull" || method == "TablePush") ++control_calls;
    if (method == "OpenChannel" && old_server_) {
      auto* offer = static_cast<v1::OpenChannelResponse*>(response);
      inner_->Call(method, request, response, deadline,
                   [offer, done = std::move(done)](absl::Status s) {
                     offer->clear_table_frames();
                     done(std::move(s));
                   });
      return;
    }
    inner_->Call(method, request, response, deadline, std::move(done));
  }
  void Push(const RequestId& id, absl::Span<const GradientView> grads, absl::Time deadline,
            Done done, TraceRecorder* trace) override {
    inner_->Push(id, grads, deadline, std::move(done), trace);
  }
  void Pull(absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time deadline, Done done,
            TraceRecorder* trace) override {
    inner_->Pull(refs, std::move(sink), deadline, std::move(done), trace);
  }
  void PushPull(const RequestId& id, absl::Span<const GradientView> grads,
                absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time deadline, Done done,
                TraceRecorder* trace) override {
    inner_->PushPull(id, grads, refs, std::move(sink), deadline, std::move(done), trace);
  }
  bool TableRows(FrameMethod method, const TableFrame& frame, RowsSink rows, absl::Time deadline,
                 Done& done, TraceRecorder* trace) override {
    const bool sent = inner_->TableRows(method, frame, std::move(rows), deadline, done, trace);
    if (sent) ++table_frames;
    return sent;
  }

  std::atomic<int> control_calls{0};
  std::atomic<int> table_frames{0};

 private:
  const std::unique_ptr<Transport> inner_;
  const bool old_server_;
};

// Against a server that speaks table frames a Table sends them; against an
// older one (its OpenChannel answer without table_frames) the control
// calls, over the channel or gRPC: the same rows either way.
TEST(TableFramesTest, TablesUseTableFramesWhereTheServerSpeaksThemAndFallBackOtherwise) {
  auto server = Server::Start(ServerOptions());
  ASSERT_THAT(server.status(), IsOk());
  for (bool old_server : {false, true}) {
    ClientOptions options;
    options.servers = {(*server)->address()};
    auto client = Client::Connect(options);
    ASSERT_THAT(client.status(), IsOk());
    auto grpc = GrpcTransport::Create((*server)->address());
    ASSERT_THAT(grpc.status(), IsOk());
    auto counter = std::make_unique<TableCallCounter>(
        std::make_unique<ChannelTransport>(
            std::make_unique<TableCallCounter>(*std::move(grpc), old_server)),
        /*old_server=*/false);
    TableCallCounter* counts = counter.get();
    ASSERT_THAT((*client)->SetTransport(0, std::move(counter)), IsOk());
    const std::string name = old_server ? "old" : "new";
    auto table = Table::Create(**client, name, SgdTable(2));
    ASSERT_THAT(table.status(), IsOk());
    const std::vector<uint64_t> keys = {5, 9, 5};
    ASSERT_THAT(table->Push<float>(keys, std::vector<float>{1, 2, 10, 20, 100, 200}), IsOk());
    std::vector<float> rows(4);
    ASSERT_THAT(table->Pull<float>(std::vector<uint64_t>{9, 5}, absl::MakeSpan(rows)), IsOk());
    EXPECT_THAT(rows, ElementsAre(-10, -20, -101, -202)) << name;
    EXPECT_EQ(counts->table_frames.load(), old_server ? 0 : 2) << name;
    EXPECT_EQ(counts->control_calls.load(), old_server ? 2 : 0) << name;
  }
}

// A table on two servers, keys in any order with duplicates within and
// across servers, rows of 256 bytes (each server's rows arrive in several
// 64 KiB pieces): pulls over the channel, whose rows are put each in its
// place as they arrive, return exactly what the same pulls over gRPC do,
// and pushes over either path are applied once each.
TEST(TableTwoServersTest, SplitPullsAndPushesOverTheChannelMatchGrpc) {
  std::vector<std::unique_ptr<Server>> servers;
  ClientOptions options;
  for (int s = 0; s < 2; ++s) {
    auto server = Server::Start(ServerOptions());
    ASSERT_THAT(server.status(), IsOk());
    options.servers.push_back((*server)->address());
    servers.push_back(*std::move(server));
  }
  std::unique_ptr<Client> clients[2];  // [0]: gRPC only, [1]: the channel
  for (int c = 0; c < 2; ++c) {
    options.bulk_channel = c == 1;
    auto client = Client::Connect(options);
    ASSERT_THAT(client.status(), IsOk());
    clients[c] = *std::move(client);
  }
  constexpr uint32_t kDim = 64;
  v1::TableConfig config = SgdTable(kDim);
  config.mutable_initializer()->mutable_uniform()->set_low(-1);
  config.mutable_initializer()->mutable_uniform()->set_high(1);
  auto grpc = Table::Create(*clients[0], "split", config);
  auto channel = Table::Create(*clients[1], "split", config);
  ASSERT_THAT(grpc.status(), IsOk());
  ASSERT_THAT(channel.status(), IsOk());
  // 3000 keys from 1500 distinct ones, descending then repeated: both
  // servers get some (checked below), each key twice.
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 1500; ++k) keys.push_back((1500 - k) * 7919);
  for (uint64_t k = 0; k < 1500; ++k) keys.push_back(keys[(k * 37) % 1500]);
  int on_server[2] = {0, 0};
  for (uint64_t key : keys) {
    auto server = grpc->ServerOf(key);
    ASSERT_THAT(server.status(), IsOk());
    ++on_server[*server];
  }
  EXPECT_GT(on_server[0], 500);
  EXPECT_GT(on_server[1], 500);
  std::vector<float> grads(keys.size() * kDim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i % 97) / 64;
  for (int step = 0; step < 2; ++step) {
    std::vector<float> over_grpc(keys.size() * kDim), over_channel(keys.size() * kDim, -7);
    ASSERT_THAT(grpc->Pull<float>(keys, absl::MakeSpan(over_grpc)), IsOk());
    ASSERT_THAT(channel->Pull<float>(keys, absl::MakeSpan(over_channel)), IsOk());
    ASSERT_EQ(over_channel, over_grpc) << "step " << step;
    // Duplicates read the same row.
    for (size_t k = 0; k < 1500; ++k) {
      const size_t first = (k * 37) % 1500;
      ASSERT_TRUE(std::equal(over_grpc.begin() + (1500 + k) * kDim,
                             over_grpc.begin() + (1501 + k) * kDim,
                             over_grpc.begin() + first * kDim));
    }
    // One push over each path (SGD, rate 1): each key's two gradients are
    // summed and applied once per push.
    ASSERT_THAT(channel->Push<float>(keys, grads), IsOk());
    ASSERT_THAT(grpc->Push<float>(keys, grads), IsOk());
    std::vector<float> after(keys.size() * kDim);
    ASSERT_THAT(channel->Pull<float>(keys, absl::MakeSpan(after)), IsOk());
    std::vector<size_t> second(1500);  // where key k's second occurrence is
    for (size_t m = 0; m < 1500; ++m) second[(m * 37) % 1500] = 1500 + m;
    int wrong = 0;
    for (size_t k = 0; k < 1500; ++k) {
      for (uint32_t d = 0; d < kDim; ++d) {
        const float sum = grads[k * kDim + d] + grads[second[k] * kDim + d];
        const float expected = over_grpc[k * kDim + d] - sum - sum;
        if (std::abs(after[k * kDim + d] - expected) > 1e-4f) ++wrong;
        if (after[second[k] * kDim + d] != after[k * kDim + d]) ++wrong;
      }
    }
    EXPECT_EQ(wrong, 0) << "step " << step;
  }
}

// Pushes that would create rows past --max_table_row_bytes (all tables of a
// server together) are refused over either path, naming the table and the
// flag; nothing of a refused batch is applied (rows it names that exist
// included), and the server serves the rest.
TEST_P(TableChannelTest, RowsPastTheRowBudgetAreRefusedAndNothingOfTheBatchIsApplied) {
  constexpr uint64_t kRowBytes = 41;  // dim 2 float32, SGD: SparseTable::row_budget_bytes
  ServerOptions options;
  options.max_table_row_bytes = 100 * kRowBytes;
  server_.reset();
  Start(options);
  auto table = Table::Create(*client_, "emb", SgdTable(2));
  ASSERT_THAT(table.status(), IsOk());
  const std::vector<float> ones(32, 1);
  int accepted = 0;
  for (int batch = 0; batch < 100; ++batch) {  // 16 new keys a push
    std::vector<uint64_t> keys(16);
    for (int k = 0; k < 16; ++k) keys[k] = static_cast<uint64_t>(batch) * 16 + k;
    absl::Status status = table->Push<float>(keys, ones);
    if (status.ok()) {
      ++accepted;
      continue;
    }
    ASSERT_THAT(status, StatusCodeIs(absl::StatusCode::kResourceExhausted)) << batch;
    ASSERT_THAT(status.message(), HasSubstr("table 'emb'"));
    ASSERT_THAT(status.message(), HasSubstr("--max_table_row_bytes=4100"));
  }
  EXPECT_EQ(accepted, 6);  // 96 rows; a 7th push of 16 would pass 100
  // Key 0 is held, 5000 is not: the push is refused whole, key 0 unchanged.
  EXPECT_THAT(table->Push<float>(std::vector<uint64_t>{0, 5000, 5001, 5002, 5003, 5004},
                                 std::vector<float>(12, 1)),
              StatusCodeIs(absl::StatusCode::kResourceExhausted));
  std::vector<float> rows(4);
  ASSERT_THAT(table->Pull<float>(std::vector<uint64_t>{0, 5000}, absl::MakeSpan(rows)), IsOk());
  EXPECT_THAT(rows, ElementsAre(-1, -1, 0, 0));
  // The last room is taken by a push that fits, held keys included.
  ASSERT_THAT(table->Push<float>(std::vector<uint64_t>{0, 5000, 5001, 5002, 5003},
                                 std::vector<float>(10, 1)),
              IsOk());
  auto stats = table->Stats();
  ASSERT_THAT(stats.status(), IsOk());
  EXPECT_EQ((*stats)[0].rows(), 100u);
  // Another table shares the budget.
  auto other = Table::Create(*client_, "other", SgdTable(2));
  ASSERT_THAT(other.status(), IsOk());
  absl::Status refused = other->Push<float>(std::vector<uint64_t>{1}, std::vector<float>{1, 1});
  EXPECT_THAT(refused, StatusCodeIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(refused.message(), HasSubstr("table 'other'"));
  // Held rows are still updated and read.
  ASSERT_THAT(table->Push<float>(std::vector<uint64_t>{0}, std::vector<float>{1, 1}), IsOk());
  ASSERT_THAT(table->Pull<float>(std::vector<uint64_t>{0, 5000}, absl::MakeSpan(rows)), IsOk());
  EXPECT_THAT(rows, ElementsAre(-3, -3, -1, -1));
}

INSTANTIATE_TEST_SUITE_P(ChannelAndGrpc, TableChannelTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Channel" : "Grpc";
                         });

}  // namespace
}  // namespace pserver
