// The server end of the bulk channel, spoken to with raw frames: the token,
// malformed and oversized frames, the connection limit, OpenChannel with the
// channel off. No test depends on timing.
#include "cc/server/bulk_listener.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cc/client/grpc_transport.h"
#include "cc/core/status_macros.h"
#include "cc/rpc/byte_stream.h"
#include "cc/rpc/frame.h"
#include "cc/rpc/table_frame.h"
#include "cc/rpc/wire.h"
#include "cc/server/server.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::IsOk;
using ::pserver::testing::StatusCodeIs;
using ::pserver::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<Server> StartServer(ServerOptions options = {}) {
  auto server = Server::Start(options);
  EXPECT_THAT(server.status(), IsOk());
  return server.ok() ? *std::move(server) : nullptr;
}

uint64_t Rejected(Server& server) {
  v1::ServerStats stats;
  server.store().FillStats(&stats);
  return stats.requests_rejected();
}

std::unique_ptr<ByteStream> ConnectTo(Server& server) {
  auto stream = ConnectTcp("127.0.0.1", static_cast<int>(server.bulk_listener()->Offer().tcp_port()),
                           absl::Seconds(30));
  EXPECT_THAT(stream.status(), IsOk());
  return stream.ok() ? *std::move(stream) : nullptr;
}

absl::Status WriteRequest(ByteStream& stream, FrameMethod method, uint64_t id,
                          absl::string_view payload) {
  char header[kFrameHeaderBytes];
  EncodeRequestHeader({method, id, 0, payload.size()}, header);
  return stream.Write({absl::string_view(header, sizeof(header)), payload});
}

// The next reply's status (and payload); the stream's error when none comes.
absl::Status ReadReply(ByteStream& stream, uint64_t* id = nullptr, std::string* payload = nullptr) {
  char encoded[kReplyHeaderBytes];
  if (absl::Status s = stream.Read(encoded, sizeof(encoded)); !s.ok()) return s;
  absl::StatusOr<ReplyHeader> header = DecodeReplyHeader(encoded, kDefaultMaxMessageBytes);
  if (!header.ok()) return header.status();
  std::string message(header->message_bytes, '\0');
  std::string data(header->payload_bytes, '\0');
  if (absl::Status s = stream.Read(message.data(), message.size()); !s.ok()) return s;
  if (absl::Status s = stream.Read(data.data(), data.size()); !s.ok()) return s;
  if (id != nullptr) *id = header->call_id;
  if (payload != nullptr) *payload = std::move(data);
  return absl::Status(header->code, message);
}

// Reads until the server closes the connection (bounded: it must).
absl::Status ReadToEnd(ByteStream& stream) {
  char byte;
  for (int i = 0; i < (1 << 20); ++i) {
    absl::Status s = stream.Read(&byte, 1);
    if (!s.ok()) return s;
  }
  return absl::InternalError("the server kept the connection open");
}

std::unique_ptr<ByteStream> Greeted(Server& server) {
  std::unique_ptr<ByteStream> stream = ConnectTo(server);
  if (stream == nullptr) return nullptr;
  EXPECT_THAT(WriteRequest(*stream, FrameMethod::kHello, 1, server.bulk_listener()->Offer().token()),
              IsOk());
  EXPECT_THAT(ReadReply(*stream), IsOk());
  return stream;
}

TEST(BulkListenerTest, ServesAPullAfterTheToken) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  ASSERT_NE(server->bulk_listener(), nullptr);
  auto stream = Greeted(*server);
  ASSERT_NE(stream, nullptr);
  v1::GetParamsRequest request;
  request.add_params()->set_name("missing");
  ASSERT_THAT(WriteRequest(*stream, FrameMethod::kGetParams, 7, request.SerializeAsString()),
              IsOk());
  uint64_t id = 0;
  EXPECT_THAT(ReadReply(*stream, &id), StatusCodeIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(id, 7u);
  // The connection stays open for the next call.
  ASSERT_THAT(WriteRequest(*stream, FrameMethod::kGetParams, 8, ""), IsOk());
  EXPECT_THAT(ReadReply(*stream, &id), IsOk());
  EXPECT_EQ(id, 8u);
}

TEST(BulkListenerTest, ARequestLargerThanTheRequestBudgetIsRefusedAndTheConnectionKept) {
  ServerOptions options;
  options.max_bulk_request_bytes_in_flight = 1024;
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto stream = Greeted(*server);
  ASSERT_NE(stream, nullptr);
  // 4 KiB of payload never reaches the dispatcher: read, dropped, answered.
  v1::GetParamsRequest big;
  big.add_params()->set_name(std::string(4096, 'n'));
  ASSERT_THAT(WriteRequest(*stream, FrameMethod::kGetParams, 3, big.SerializeAsString()), IsOk());
  uint64_t id = 0;
  EXPECT_THAT(ReadReply(*stream, &id),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("--max_bulk_request_bytes_in_flight=1024")));
  EXPECT_EQ(id, 3u);
  EXPECT_EQ(server->bulk_listener()->malformed_frames(), 0u);
  // The connection is still in step: a small request is served, and every
  // byte held for it is given back.
  v1::GetParamsRequest small;
  small.add_params()->set_name("missing");
  ASSERT_THAT(WriteRequest(*stream, FrameMethod::kGetParams, 4, small.SerializeAsString()), IsOk());
  EXPECT_THAT(ReadReply(*stream, &id), StatusCodeIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(id, 4u);
  EXPECT_EQ(server->bulk_listener()->request_bytes_held(), 0u);
}

TEST(BulkListenerTest, AWrongTokenIsRefusedAndTheConnectionClosed) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto stream = ConnectTo(*server);
  ASSERT_NE(stream, nullptr);
  ASSERT_THAT(WriteRequest(*stream, FrameMethod::kHello, 1, std::string(kChannelTokenBytes, 'x')),
              IsOk());
  EXPECT_THAT(ReadReply(*stream), StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("token")));
  EXPECT_THAT(ReadToEnd(*stream), StatusCodeIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(server->bulk_listener()->malformed_frames(), 1u);
}

TEST(BulkListenerTest, ACallBeforeTheTokenIsRefused) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto stream = ConnectTo(*server);
  ASSERT_NE(stream, nullptr);
  ASSERT_THAT(WriteRequest(*stream, FrameMethod::kGetParams, 1, ""), IsOk());
  EXPECT_THAT(ReadReply(*stream), StatusCodeIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(ReadToEnd(*stream), StatusCodeIs(absl::StatusCode::kUnavailable));
}

TEST(BulkListenerTest, MalformedFramesCloseTheConnectionAndAreCounted) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  const uint64_t rejected_before = Rejected(*server);
  {
    auto stream = Greeted(*server);
    ASSERT_NE(stream, nullptr);
    ASSERT_THAT(stream->Write({std::string(kFrameHeaderBytes, 'z')}), IsOk());
    EXPECT_THAT(ReadReply(*stream), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("magic")));
    EXPECT_THAT(ReadToEnd(*stream), StatusCodeIs(absl::StatusCode::kUnavailable));
  }
  {
    // A payload that is not a SendGradsRequest: answered, counted, the
    // connection kept.
    auto stream = Greeted(*server);
    ASSERT_NE(stream, nullptr);
    ASSERT_THAT(WriteRequest(*stream, FrameMethod::kSendGrads, 3, std::string(64, '\xff')), IsOk());
    EXPECT_THAT(ReadReply(*stream), StatusCodeIs(absl::StatusCode::kInvalidArgument));
  }
  EXPECT_GE(server->bulk_listener()->malformed_frames(), 1u);
  EXPECT_GE(Rejected(*server), rejected_before + 2);
}

TEST(BulkListenerTest, AnOversizedFrameIsRefusedBeforeItIsRead) {
  ServerOptions options;
  options.max_message_bytes = 4096;
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto stream = Greeted(*server);
  ASSERT_NE(stream, nullptr);
  char header[kFrameHeaderBytes];
  EncodeRequestHeader({FrameMethod::kSendGrads, 1, 0, uint64_t{1} << 40}, header);
  ASSERT_THAT(stream->Write({absl::string_view(header, sizeof(header))}), IsOk());
  EXPECT_THAT(ReadReply(*stream),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("max_message_bytes")));
  EXPECT_THAT(ReadToEnd(*stream), StatusCodeIs(absl::StatusCode::kUnavailable));
}

TEST(BulkListenerTest, ConnectionsBeyondTheLimitAreRefused) {
  ServerOptions options;
  options.max_bulk_connections = 1;
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto first = Greeted(*server);
  ASSERT_NE(first, nullptr);
  auto second = ConnectTo(*server);
  ASSERT_NE(second, nullptr);
  EXPECT_THAT(ReadReply(*second),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("max_bulk_connections")));
  EXPECT_EQ(server->bulk_listener()->refused_connections(), 1u);
  // Once the first is gone, a new one is served (the limit is on
  // connections at once). Bounded: the server reaps it on the next accept.
  first.reset();
  absl::Status greeted = absl::UnknownError("not tried");
  for (int attempt = 0; attempt < 1000 && !greeted.ok(); ++attempt) {
    auto third = ConnectTo(*server);
    ASSERT_NE(third, nullptr);
    ASSERT_THAT(WriteRequest(*third, FrameMethod::kHello, 1, server->bulk_listener()->Offer().token()),
                IsOk());
    greeted = ReadReply(*third);
  }
  EXPECT_THAT(greeted, IsOk());
}

TEST(BulkListenerTest, RejectsAZeroConnectionLimit) {
  ServerOptions options;
  options.max_bulk_connections = 0;
  EXPECT_THAT(Server::Start(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_bulk_connections")));
}

TEST(BulkListenerTest, RejectsAReadSpinOutsideZeroToOneMillisecond) {
  for (absl::Duration spin : {absl::Microseconds(-1), absl::Microseconds(1001)}) {
    ServerOptions options;
    options.bulk_read_spin = spin;
    EXPECT_THAT(Server::Start(options).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bulk_read_spin_micros")));
  }
}

TEST(BulkListenerTest, OpenChannelOffersTheListenerOrSaysItIsOff) {
  for (bool on : {true, false}) {
    ServerOptions options;
    options.bulk_channel = on;
    auto server = StartServer(options);
    ASSERT_NE(server, nullptr);
    EXPECT_EQ(server->bulk_listener() != nullptr, on);
    auto grpc = GrpcTransport::Create(server->address());
    ASSERT_THAT(grpc.status(), IsOk());
    v1::OpenChannelResponse offer;
    absl::Notification done;
    absl::Status status;
    (*grpc)->Call("OpenChannel", v1::OpenChannelRequest(), &offer, absl::Now() + absl::Seconds(30),
                  [&](absl::Status s) {
                    status = s;
                    done.Notify();
                  });
    done.WaitForNotification();
    if (on) {
      EXPECT_THAT(status, IsOk());
      EXPECT_EQ(offer.tcp_port(), server->bulk_listener()->Offer().tcp_port());
      EXPECT_EQ(offer.token().size(), kChannelTokenBytes);
      EXPECT_FALSE(offer.unix_socket().empty());
    } else {
      EXPECT_THAT(status, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("bulk_channel")));
    }
  }
}


// --- table frames (cc/rpc/table_frame.h) ---

constexpr uint32_t kDim = 2;

// A server with an SGD table "emb" of dim 2 (learning rate 1, zero rows).
std::unique_ptr<Server> ServerWithTable(ServerOptions options = {}) {
  auto server = StartServer(options);
  if (server == nullptr) return nullptr;
  v1::CreateTableRequest create;
  create.set_name("emb");
  create.mutable_config()->set_dim(kDim);
  create.mutable_config()->mutable_optimizer()->mutable_sgd()->set_learning_rate(1);
  EXPECT_THAT(server->tables().Create(create), IsOk());
  return server;
}

std::string TableFramePayload(const TableFrame& frame) {
  std::string head;
  return absl::StrJoin(EncodeTableFrame(frame, &head), "");
}

std::string Floats(std::vector<float> values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

// A push of `grads` (kDim floats a key) to "emb" with request id (7, seq).
std::string PushPayload(const std::vector<uint64_t>& keys, const std::string& grads,
                        uint64_t sequence) {
  TableFrame frame;
  frame.table = "emb";
  frame.keys = keys;
  frame.values = grads;
  frame.client_id = 7;
  frame.sequence = sequence;
  return TableFramePayload(frame);
}

// Pulls `keys` of "emb" over `stream` as a table frame: the rows as floats.
absl::StatusOr<std::vector<float>> PullRows(ByteStream& stream, const std::vector<uint64_t>& keys,
                                            uint8_t wire_type = 0, uint32_t* content_type = nullptr) {
  TableFrame frame;
  frame.table = "emb";
  frame.keys = keys;
  frame.value_type = wire_type;
  if (absl::Status s = WriteRequest(stream, FrameMethod::kTableRowsPull, 50,
                                    TableFramePayload(frame));
      !s.ok()) {
    return s;
  }
  std::string payload;
  if (absl::Status s = ReadReply(stream, nullptr, &payload); !s.ok()) return s;
  absl::StatusOr<TablePullReply> reply = DecodeTablePullReply(payload);
  if (!reply.ok()) return reply.status();
  if (content_type != nullptr) *content_type = reply->content_type;
  std::vector<float> rows(reply->values.size() / sizeof(float));
  std::memcpy(rows.data(), reply->values.data(), rows.size() * sizeof(float));
  return rows;
}

TEST(BulkListenerTest, OpenChannelSaysItSpeaksTableFrames) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->bulk_listener()->Offer().table_frames(), kTableFrameVersion);
}

TEST(BulkListenerTest, TableFramesPushAndPullRowsExactlyOnce) {
  auto server = ServerWithTable();
  ASSERT_NE(server, nullptr);
  auto stream = Greeted(*server);
  ASSERT_NE(stream, nullptr);
  // Duplicate keys are summed; SGD with rate 1 from zero rows: row = -grad.
  const std::vector<uint64_t> keys = {5, 9, 5};
  const std::string grads = Floats({1, 2, 10, 20, 100, 200});
  for (int attempt = 0; attempt < 2; ++attempt) {  // the retry is not applied again
    ASSERT_THAT(WriteRequest(*stream, FrameMethod::kTableRowsPush, 10 + attempt,
                             PushPayload(keys, grads, /*sequence=*/1)),
                IsOk());
    std::string payload = "unset";
    EXPECT_THAT(ReadReply(*stream, nullptr, &payload), IsOk());
    EXPECT_EQ(payload, "");
  }
  auto rows = PullRows(*stream, {9, 5, 4});
  ASSERT_THAT(rows.status(), IsOk());
  EXPECT_THAT(*rows, ElementsAre(-10, -20, -101, -202, 0, 0));
  EXPECT_EQ(server->dispatcher().duplicates_ignored(), 1u);
  // Half precision on request: the reply says so and carries 2-byte values.
  uint32_t content_type = 0;
  auto half = PullRows(*stream, {9}, v1::FLOAT16, &content_type);
  ASSERT_THAT(half.status(), IsOk());
  EXPECT_EQ(content_type, static_cast<uint32_t>(v1::FLOAT16));
  EXPECT_EQ(half->size(), 1u);  // 2 float16 values = the bytes of one float
}

// Bad table frames are refused naming what is wrong, counted, change
// nothing, and leave the connection in step.
TEST(BulkListenerTest, BadTableFramesAreRefusedAndChangeNothing) {
  auto server = ServerWithTable();
  ASSERT_NE(server, nullptr);
  auto stream = Greeted(*server);
  ASSERT_NE(stream, nullptr);
  const uint64_t rejected_before = Rejected(*server);
  const std::vector<uint64_t> keys = {1, 2};
  const std::string good = PushPayload(keys, Floats({1, 1, 1, 1}), 1);
  std::string overlong = good + "x";
  std::string more_keys = good;
  const uint64_t three = 3;
  std::memcpy(more_keys.data() + 16, &three, sizeof(three));
  struct Case {
    FrameMethod method;
    std::string payload;
    absl::StatusCode code;
    std::string says;
  };
  TableFrame with_worker;
  with_worker.table = "emb";
  with_worker.worker = "w1";
  with_worker.keys = keys;
  TableFrame unknown_table;
  unknown_table.table = "nope";
  unknown_table.keys = keys;
  const std::vector<Case> cases = {
      {FrameMethod::kTableRowsPush, good.substr(0, 20), absl::StatusCode::kInvalidArgument,
       "shorter than its 56-byte header"},
      {FrameMethod::kTableRowsPush, good.substr(0, good.size() - 1),
       absl::StatusCode::kInvalidArgument, "does not match its header"},
      {FrameMethod::kTableRowsPush, overlong, absl::StatusCode::kInvalidArgument,
       "does not match its header"},
      {FrameMethod::kTableRowsPush, more_keys, absl::StatusCode::kInvalidArgument,
       "does not match its header"},
      {FrameMethod::kTableRowsPull, good, absl::StatusCode::kInvalidArgument,
       "a pull carries neither"},
      // Values for one row where two keys need two.
      {FrameMethod::kTableRowsPush, PushPayload(keys, Floats({1, 1}), 2),
       absl::StatusCode::kInvalidArgument, "bytes"},
      // The finite check.
      {FrameMethod::kTableRowsPush, PushPayload(keys, Floats({1, 1, 1, NAN}), 3),
       absl::StatusCode::kInvalidArgument, "finite"},
      {FrameMethod::kTableRowsPull, TableFramePayload(with_worker),
       absl::StatusCode::kInvalidArgument, "TablePull control call"},
      {FrameMethod::kTableRowsPull, TableFramePayload(unknown_table),
       absl::StatusCode::kNotFound, "no table 'nope'"},
  };
  uint64_t id = 100;
  for (const Case& c : cases) {
    ASSERT_THAT(WriteRequest(*stream, c.method, ++id, c.payload), IsOk());
    uint64_t answered = 0;
    EXPECT_THAT(ReadReply(*stream, &answered), StatusIs(c.code, HasSubstr(c.says))) << c.says;
    EXPECT_EQ(answered, id);
  }
  // Nothing was applied: the rows are still zero and no row was created.
  auto rows = PullRows(*stream, keys);
  ASSERT_THAT(rows.status(), IsOk());
  EXPECT_THAT(*rows, ElementsAre(0, 0, 0, 0));
  v1::TableStatsResponse stats;
  server->tables().Stats(&stats);
  ASSERT_EQ(stats.tables_size(), 1);
  EXPECT_EQ(stats.tables(0).rows(), 0u);
  EXPECT_GE(Rejected(*server), rejected_before + 5);  // the frames that did not decode
  EXPECT_EQ(server->bulk_listener()->request_bytes_held(), 0u);
}

TEST(BulkListenerTest, ATablePullLargerThanTheReplyBudgetIsRefusedBeforeItIsBuilt) {
  ServerOptions options;
  options.max_reply_bytes_in_flight = 1024;
  auto server = ServerWithTable(options);
  ASSERT_NE(server, nullptr);
  auto stream = Greeted(*server);
  ASSERT_NE(stream, nullptr);
  std::vector<uint64_t> keys(1000);  // 8000 bytes of rows
  EXPECT_THAT(PullRows(*stream, keys).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("max_reply_bytes_in_flight")));
  EXPECT_EQ(server->dispatcher().reply_budget().held(), 0u);
  // A pull that fits is served on the same connection.
  EXPECT_THAT(PullRows(*stream, {1, 2}).status(), IsOk());
}

// --- large pushes, scanned for NaN while they arrive (wire.h PushFiniteScan) ---

constexpr size_t kBlockFloats = size_t{1} << 18;  // 1 MiB blocks
constexpr uint32_t kBlocks = 4;

// A server holding "w": kBlocks float32 blocks of zeros, SGD, learning rate 1.
std::unique_ptr<Server> ServerWithBlocks(ServerOptions options = {}) {
  auto server = StartServer(options);
  if (server == nullptr) return nullptr;
  v1::ParameterConfig sgd;
  sgd.mutable_optimizer()->mutable_sgd();
  sgd.mutable_learning_rate()->set_learning_rate(1.0);
  for (uint32_t i = 0; i < kBlocks; ++i) {
    v1::Parameter block;
    block.set_name("w");
    block.set_element_type(v1::FLOAT32);
    block.add_shape(static_cast<int64_t>(kBlocks * kBlockFloats));
    block.mutable_block()->set_index(i);
    block.mutable_block()->set_count(kBlocks);
    block.mutable_block()->set_offset(i * kBlockFloats);
    block.set_content(std::string(kBlockFloats * sizeof(float), '\0'));
    EXPECT_THAT(server->store().Init(std::move(block), sgd), IsOk());
  }
  server->store().FinishInit();
  return server;
}

// The gradient of block i: value j is i + j / 1024.
std::vector<float> BlockGradient(uint32_t i) {
  std::vector<float> values(kBlockFloats);
  for (size_t j = 0; j < values.size(); ++j) values[j] = static_cast<float>(i) + j / 1024.0f;
  return values;
}

// A SendGradsRequest of `grads` (one per block) as request id (9, sequence);
// with `pull`, a PushPullRequest reading every block.
std::string BlocksPushPayload(const std::vector<std::vector<float>>& grads, uint64_t sequence,
                              bool pull = false) {
  std::vector<GradientView> views;
  for (uint32_t i = 0; i < grads.size(); ++i) {
    GradientView view;
    view.name = "w";
    view.type = v1::FLOAT32;
    view.block.set_index(i);
    view.block.set_count(kBlocks);
    view.block.set_offset(i * kBlockFloats);
    view.content = absl::string_view(reinterpret_cast<const char*>(grads[i].data()),
                                     grads[i].size() * sizeof(float));
    views.push_back(view);
  }
  std::vector<v1::ParamRef> refs;
  for (uint32_t i = 0; pull && i < kBlocks; ++i) {
    v1::ParamRef& ref = refs.emplace_back();
    ref.set_name("w");
    ref.mutable_block()->set_index(i);
    ref.mutable_block()->set_count(kBlocks);
    ref.mutable_block()->set_offset(i * kBlockFloats);
  }
  PayloadLease* lease = PayloadLease::Create([] {});
  grpc::ByteBuffer buffer = EncodePushRequest(views, refs, lease, /*client_id=*/9, sequence);
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& slice : slices) {
    out.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  buffer.Clear();
  slices.clear();
  lease->Release();
  return out;
}

// Every value of "w", block by block.
std::vector<float> Values(Server& server) {
  std::vector<float> out;
  for (uint32_t i = 0; i < kBlocks; ++i) {
    v1::ParamRef ref;
    ref.set_name("w");
    ref.mutable_block()->set_index(i);
    ref.mutable_block()->set_count(kBlocks);
    ref.mutable_block()->set_offset(i * kBlockFloats);
    v1::Parameter param;
    EXPECT_THAT(server.store().Get(ref, &param), IsOk());
    const size_t at = out.size();
    out.resize(at + param.content().size() / sizeof(float));
    std::memcpy(out.data() + at, param.content().data(), param.content().size());
  }
  return out;
}

// Writes a request frame whose payload goes out in pieces of `piece` bytes
// (each its own write, so the server's reads end at many places).
absl::Status WriteInPieces(ByteStream& stream, FrameMethod method, uint64_t id,
                           absl::string_view payload, size_t piece) {
  char header[kFrameHeaderBytes];
  EncodeRequestHeader({method, id, 0, payload.size()}, header);
  PS_RETURN_IF_ERROR(stream.Write({absl::string_view(header, sizeof(header))}));
  for (size_t at = 0; at < payload.size(); at += piece) {
    PS_RETURN_IF_ERROR(stream.Write({payload.substr(at, piece)}));
  }
  return absl::OkStatus();
}

// Waits (bounded, generous for a loaded machine) for the server to see
// every connection end and let go of their request bytes.
void ExpectConnectionsEndAndBytesFreed(Server& server) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (int i = 0; i < 60000 && absl::Now() < deadline &&
                  (server.bulk_listener()->connections() > 0 ||
                   server.bulk_listener()->request_bytes_held() > 0);
       ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(server.bulk_listener()->connections(), 0);
  EXPECT_EQ(server.bulk_listener()->request_bytes_held(), 0u);
}

TEST(BulkListenerTest, APushArrivingInManyPiecesIsAppliedOnceAndEqualsTheWholeOne) {
  std::vector<std::vector<float>> grads;
  for (uint32_t i = 0; i < kBlocks; ++i) grads.push_back(BlockGradient(i));
  const std::string payload = BlocksPushPayload(grads, /*sequence=*/1);
  ASSERT_GT(payload.size(), size_t{4} << 20);
  std::vector<std::vector<float>> results;
  for (size_t piece : {payload.size(), size_t{4093}, size_t{300000}}) {
    SCOPED_TRACE(absl::StrCat("pieces of ", piece));
    auto server = ServerWithBlocks();
    ASSERT_NE(server, nullptr);
    auto stream = Greeted(*server);
    ASSERT_NE(stream, nullptr);
    for (int attempt = 0; attempt < 2; ++attempt) {  // the retry is not applied again
      ASSERT_THAT(WriteInPieces(*stream, FrameMethod::kSendGrads, 20 + attempt, payload, piece),
                  IsOk());
      uint64_t id = 0;
      EXPECT_THAT(ReadReply(*stream, &id), IsOk());
      EXPECT_EQ(id, 20u + attempt);
    }
    EXPECT_EQ(server->dispatcher().duplicates_ignored(), 1u);
    results.push_back(Values(*server));
  }
  // SGD with rate 1 from zeros: w = -gradient, whatever pieces it came in.
  ASSERT_EQ(results[0].size(), kBlocks * kBlockFloats);
  for (uint32_t i = 0; i < kBlocks; ++i) {
    for (size_t j : {size_t{0}, size_t{1}, kBlockFloats - 1}) {
      EXPECT_EQ(results[0][i * kBlockFloats + j], -grads[i][j]);
    }
  }
  EXPECT_TRUE(results[1] == results[0]);
  EXPECT_TRUE(results[2] == results[0]);
}

TEST(BulkListenerTest, ANaNInTheLastBlockOfALargePushChangesNothing) {
  auto server = ServerWithBlocks();
  ASSERT_NE(server, nullptr);
  auto stream = Greeted(*server);
  ASSERT_NE(stream, nullptr);
  std::vector<std::vector<float>> grads;
  for (uint32_t i = 0; i < kBlocks; ++i) grads.push_back(BlockGradient(i));
  grads.back().back() = std::nanf("");
  for (FrameMethod method : {FrameMethod::kSendGrads, FrameMethod::kPushPull}) {
    // A PushPull reads every block: its reply (streamed while the push is
    // applied) must not have begun.
    ASSERT_THAT(WriteInPieces(*stream, method, 30,
                              BlocksPushPayload(grads, /*sequence=*/2,
                                                /*pull=*/method == FrameMethod::kPushPull),
                              size_t{65536}),
                IsOk());
    EXPECT_THAT(ReadReply(*stream), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("is NaN")));
  }
  const std::vector<float> values = Values(*server);
  EXPECT_TRUE(std::all_of(values.begin(), values.end(), [](float v) { return v == 0; }))
      << "an earlier block was applied";
  v1::ServerStats stats;
  server->store().FillStats(&stats);
  EXPECT_EQ(stats.gradients_applied(), 0u);
  EXPECT_EQ(stats.non_finite_refused(), 2u);
  // The connection is in step: the same push without the NaN is applied.
  grads.back().back() = 1;
  ASSERT_THAT(WriteRequest(*stream, FrameMethod::kSendGrads, 31,
                           BlocksPushPayload(grads, /*sequence=*/3)),
              IsOk());
  EXPECT_THAT(ReadReply(*stream), IsOk());
  EXPECT_EQ(Values(*server).back(), -1.0f);
}

TEST(BulkListenerTest, AClientGoneMidPushChangesNothingAndFreesItsBytes) {
  auto server = ServerWithBlocks();
  ASSERT_NE(server, nullptr);
  std::vector<std::vector<float>> grads;
  for (uint32_t i = 0; i < kBlocks; ++i) grads.push_back(BlockGradient(i));
  const std::string payload = BlocksPushPayload(grads, /*sequence=*/4);
  {
    auto stream = Greeted(*server);
    ASSERT_NE(stream, nullptr);
    // The header promises the whole payload; three of four blocks arrive.
    char header[kFrameHeaderBytes];
    EncodeRequestHeader({FrameMethod::kSendGrads, 40, 0, payload.size()}, header);
    ASSERT_THAT(stream->Write({absl::string_view(header, sizeof(header)),
                               absl::string_view(payload).substr(0, payload.size() * 3 / 4)}),
                IsOk());
    stream->Shutdown();
  }
  ExpectConnectionsEndAndBytesFreed(*server);
  const std::vector<float> values = Values(*server);
  EXPECT_TRUE(std::all_of(values.begin(), values.end(), [](float v) { return v == 0; }));
  // The same request, sent whole on a new connection, is applied (its id was not used up).
  auto stream = Greeted(*server);
  ASSERT_NE(stream, nullptr);
  ASSERT_THAT(WriteRequest(*stream, FrameMethod::kSendGrads, 41, payload), IsOk());
  EXPECT_THAT(ReadReply(*stream), IsOk());
  EXPECT_EQ(Values(*server)[1], -grads[0][1]);
  EXPECT_EQ(server->dispatcher().duplicates_ignored(), 0u);
}

// Every value of a GetParamsResponse's blocks, in order.
std::vector<float> PulledValues(const std::string& payload) {
  grpc::Slice slice(payload.data(), payload.size());
  ParamsResponse response;
  EXPECT_THAT(DecodeParamsResponse(grpc::ByteBuffer(&slice, 1), &response), IsOk());
  std::string bytes;
  for (const Segments& content : response.contents) {
    for (absl::string_view part : content) bytes.append(part.data(), part.size());
  }
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

TEST(BulkListenerTest, APushPullReplyIsTheValuesAfterThePushOnTcpAndUnix) {
  std::vector<std::vector<float>> grads;
  for (uint32_t i = 0; i < kBlocks; ++i) grads.push_back(BlockGradient(i));
  const std::string payload = BlocksPushPayload(grads, /*sequence=*/5, /*pull=*/true);
  for (bool unix_socket : {false, true}) {
    SCOPED_TRACE(unix_socket ? "unix" : "tcp");
    auto server = ServerWithBlocks();
    ASSERT_NE(server, nullptr);
    std::unique_ptr<ByteStream> stream;
    if (unix_socket) {
      auto connected = ConnectAbstractUnix(server->bulk_listener()->Offer().unix_socket());
      ASSERT_THAT(connected.status(), IsOk());
      stream = *std::move(connected);
      ASSERT_THAT(WriteRequest(*stream, FrameMethod::kHello, 1,
                               server->bulk_listener()->Offer().token()),
                  IsOk());
      ASSERT_THAT(ReadReply(*stream), IsOk());
    } else {
      stream = Greeted(*server);
    }
    ASSERT_NE(stream, nullptr);
    std::vector<float> pulled[2];
    for (int attempt = 0; attempt < 2; ++attempt) {  // the retry is not applied again
      ASSERT_THAT(WriteRequest(*stream, FrameMethod::kPushPull, 50 + attempt, payload), IsOk());
      uint64_t id = 0;
      std::string reply;
      ASSERT_THAT(ReadReply(*stream, &id, &reply), IsOk());
      EXPECT_EQ(id, 50u + attempt);
      pulled[attempt] = PulledValues(reply);
    }
    EXPECT_EQ(server->dispatcher().duplicates_ignored(), 1u);
    const std::vector<float> values = Values(*server);
    EXPECT_TRUE(pulled[0] == values);
    EXPECT_TRUE(pulled[1] == values);
    EXPECT_EQ(values[kBlockFloats + 3], -grads[1][3]);
  }
}

TEST(BulkListenerTest, AClientGoneMidPushPullReplyLeavesItAppliedOnceAndFreesItsBytes) {
  auto server = ServerWithBlocks();
  ASSERT_NE(server, nullptr);
  std::vector<std::vector<float>> grads;
  for (uint32_t i = 0; i < kBlocks; ++i) grads.push_back(BlockGradient(i));
  const std::string payload = BlocksPushPayload(grads, /*sequence=*/6, /*pull=*/true);
  {
    auto stream = Greeted(*server);
    ASSERT_NE(stream, nullptr);
    ASSERT_THAT(WriteRequest(*stream, FrameMethod::kPushPull, 60, payload), IsOk());
    // The reply has begun (its header says OK: the push passed its
    // checks); the client leaves without reading the blocks.
    char header[kReplyHeaderBytes];
    ASSERT_THAT(stream->Read(header, sizeof(header)), IsOk());
    absl::StatusOr<ReplyHeader> decoded = DecodeReplyHeader(header, kDefaultMaxMessageBytes);
    ASSERT_THAT(decoded.status(), IsOk());
    EXPECT_EQ(decoded->code, absl::StatusCode::kOk);
    EXPECT_GT(decoded->payload_bytes, kBlocks * kBlockFloats * sizeof(float));
    stream->Shutdown();
  }
  ExpectConnectionsEndAndBytesFreed(*server);
  const std::vector<float> values = Values(*server);
  EXPECT_EQ(values[1], -grads[0][1]);
  EXPECT_EQ(values.back(), -grads.back().back());
  // The client's retry on a new connection: answered with the values, not
  // applied again.
  auto stream = Greeted(*server);
  ASSERT_NE(stream, nullptr);
  ASSERT_THAT(WriteRequest(*stream, FrameMethod::kPushPull, 61, payload), IsOk());
  std::string reply;
  ASSERT_THAT(ReadReply(*stream, nullptr, &reply), IsOk());
  EXPECT_TRUE(PulledValues(reply) == values);
  EXPECT_TRUE(Values(*server) == values);
  EXPECT_EQ(server->dispatcher().duplicates_ignored(), 1u);
}

// --- frames that stall mid-payload (--bulk_frame_receive_timeout_seconds) ---

// A greeted connection that sends a push frame's header (request id
// `call_id`, the whole `payload` promised) and three quarters of the
// payload, then stalls: the server holds payload.size() bytes of its
// request budget while it waits for the rest.
std::unique_ptr<ByteStream> StalledPush(Server& server, uint64_t call_id,
                                        const std::string& payload) {
  auto stream = Greeted(server);
  if (stream == nullptr) return nullptr;
  char header[kFrameHeaderBytes];
  EncodeRequestHeader({FrameMethod::kSendGrads, call_id, 0, payload.size()}, header);
  EXPECT_THAT(stream->Write({absl::string_view(header, sizeof(header)),
                             absl::string_view(payload).substr(0, payload.size() * 3 / 4)}),
              IsOk());
  return stream;
}

// Waits (bounded in count and time, within the test's own timeout) until
// `done` holds; whether it does.
template <typename Done>
bool Eventually(Done done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(40);
  for (int i = 0; i < 40000 && absl::Now() < deadline; ++i) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return done();
}

TEST(BulkListenerTest, FramesStalledMidPayloadAreDroppedByTheirDeadlineAndTheirBytesGivenBack) {
  std::vector<std::vector<float>> grads;
  for (uint32_t i = 0; i < kBlocks; ++i) grads.push_back(BlockGradient(i));
  const std::string stalled_payload = BlocksPushPayload(grads, /*sequence=*/7);
  const std::string payload = BlocksPushPayload(grads, /*sequence=*/8);
  ServerOptions options;
  // Two stalled frames hold the whole budget.
  options.max_bulk_request_bytes_in_flight = 2 * stalled_payload.size();
  options.bulk_frame_receive_timeout = absl::Seconds(1);
  auto server = ServerWithBlocks(options);
  ASSERT_NE(server, nullptr);
  const uint64_t rejected_before = Rejected(*server);
  auto first = StalledPush(*server, 70, stalled_payload);
  auto second = StalledPush(*server, 71, stalled_payload);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  // Each stalled connection is closed by the server once its deadline
  // passes, and what it held is given back.
  ASSERT_TRUE(Eventually([&] { return server->bulk_listener()->frames_timed_out() == 2; }))
      << server->bulk_listener()->frames_timed_out();
  EXPECT_THAT(ReadToEnd(*first), StatusCodeIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(ReadToEnd(*second), StatusCodeIs(absl::StatusCode::kUnavailable));
  ASSERT_TRUE(Eventually([&] { return server->bulk_listener()->request_bytes_held() == 0; }));
  EXPECT_GE(Rejected(*server), rejected_before + 2);
  // Nothing of the stalled pushes was applied.
  const std::vector<float> before = Values(*server);
  EXPECT_TRUE(std::all_of(before.begin(), before.end(), [](float v) { return v == 0; }));
  // A whole push is served now. (Should this machine be so loaded that it
  // is not read within its own deadline, the client retries on a new
  // connection, as a real one does: same request id, applied once.)
  absl::Status pushed = absl::UnknownError("not sent");
  for (int attempt = 0; attempt < 20 && !pushed.ok(); ++attempt) {
    auto stream = Greeted(*server);
    ASSERT_NE(stream, nullptr);
    pushed = WriteRequest(*stream, FrameMethod::kSendGrads, 80 + attempt, payload);
    if (pushed.ok()) pushed = ReadReply(*stream);
    ASSERT_NE(pushed.code(), absl::StatusCode::kInvalidArgument) << pushed;
  }
  EXPECT_THAT(pushed, IsOk());
  const std::vector<float> values = Values(*server);
  EXPECT_EQ(values[1], -grads[0][1]);  // applied once
  EXPECT_EQ(values.back(), -grads.back().back());
}

TEST(BulkListenerTest, WithoutAFrameDeadlineStalledFramesKeepTheirBytes) {
  std::vector<std::vector<float>> grads;
  for (uint32_t i = 0; i < kBlocks; ++i) grads.push_back(BlockGradient(i));
  const std::string payload = BlocksPushPayload(grads, /*sequence=*/9);
  ServerOptions options;
  options.max_bulk_request_bytes_in_flight = 2 * payload.size();
  options.bulk_frame_receive_timeout = absl::ZeroDuration();  // off
  auto server = ServerWithBlocks(options);
  ASSERT_NE(server, nullptr);
  auto first = StalledPush(*server, 90, payload);
  auto second = StalledPush(*server, 91, payload);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  ASSERT_TRUE(Eventually(
      [&] { return server->bulk_listener()->request_bytes_held() == 2 * payload.size(); }));
  // The budget is spent: a whole push is refused, naming the flag.
  auto stream = Greeted(*server);
  ASSERT_NE(stream, nullptr);
  ASSERT_THAT(WriteRequest(*stream, FrameMethod::kSendGrads, 92, payload), IsOk());
  EXPECT_THAT(ReadReply(*stream), StatusIs(absl::StatusCode::kUnavailable,
                                           HasSubstr("--max_bulk_request_bytes_in_flight")));
  EXPECT_EQ(server->bulk_listener()->request_bytes_held(), 2 * payload.size());
  EXPECT_EQ(server->bulk_listener()->frames_timed_out(), 0u);
  // Only the clients' going frees it.
  first->Shutdown();
  second->Shutdown();
  stream->Shutdown();
  ExpectConnectionsEndAndBytesFreed(*server);
}

TEST(BulkListenerTest, ANegativeFrameDeadlineIsRefusedNamingTheFlag) {
  ServerOptions options;
  options.bulk_frame_receive_timeout = absl::Seconds(-1);
  EXPECT_THAT(Server::Start(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--bulk_frame_receive_timeout_seconds")));
}

}  // namespace
}  // namespace pserver
