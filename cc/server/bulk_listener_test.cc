// The server end of the bulk channel, spoken to with raw frames: the token,
// malformed and oversized frames, the connection limit, OpenChannel with the
// channel off. No test depends on timing.
#include "cc/server/bulk_listener.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "cc/client/grpc_transport.h"
#include "cc/rpc/byte_stream.h"
#include "cc/rpc/frame.h"
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

}  // namespace
}  // namespace pserver
