// ChannelTransport against a real server (both routes: Unix socket and TCP)
// and against a fake channel server that answers as told: the same answers
// as gRPC, exactly once across a dropped connection and with concurrent
// callers on one connection, waiters reading their own replies (and groups
// of several calls leaving them to the reader), deadlines
// and cancellation (also mid-reply), a malformed reply or one for a call not
// made, table pulls whose rows go straight into the caller's memory (and
// what happens to them on a deadline or a cancellation mid-rows), pulled
// blocks read straight into the caller's memory (a Client's tensors too;
// rogue blocks refused, a deadline or a cancellation mid-block), and the
// fallback to gRPC; Abandon (a call in flight to a silent server ends with
// the reason, over the channel and over gRPC); the unsent-byte limit on TCP
// sockets (getsockopt). No test depends on timing.
#include "cc/client/channel_transport.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cc/client/call_group.h"
#include "cc/client/cancellation.h"
#include "cc/client/client.h"
#include "cc/client/grpc_transport.h"
#include "cc/rpc/byte_stream.h"
#include "cc/rpc/frame.h"
#include "cc/rpc/table_frame.h"
#include "cc/rpc/wire.h"
#include "cc/server/bulk_listener.h"
#include "cc/server/server.h"
#include "cc/testing/sockets.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::IsOk;
using ::pserver::testing::StatusCodeIs;
using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(60);

// What a pull returned: each block's name and bytes.
struct Pulled {
  absl::Status status;
  std::vector<std::pair<std::string, std::string>> blocks;
};

Pulled PullOver(Transport& t, const std::vector<v1::ParamRef>& refs) {
  Pulled out;
  absl::Notification done;
  t.Pull(
      refs,
      [&](const v1::Parameter& header, const Segments& content) {
        std::string bytes;
        for (absl::string_view s : content) bytes.append(s.data(), s.size());
        out.blocks.emplace_back(header.name(), std::move(bytes));
        return absl::OkStatus();
      },
      absl::Now() + kTimeout,
      [&](absl::Status s) {
        out.status = std::move(s);
        done.Notify();
      });
  done.WaitForNotification();
  return out;
}

GradientView ViewOf(const std::vector<float>& grad) {
  GradientView view;
  view.name = "w";
  view.type = v1::FLOAT32;
  view.content = absl::string_view(reinterpret_cast<const char*>(grad.data()),
                                   grad.size() * sizeof(float));
  return view;
}

absl::Status PushOver(Transport& t, RequestId id, const std::vector<float>& grad,
                      absl::Time deadline = absl::Now() + kTimeout) {
  const GradientView view = ViewOf(grad);
  absl::Notification done;
  absl::Status status;
  t.Push(id, absl::MakeConstSpan(&view, 1), deadline, [&](absl::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

// As Client waits: in a CallGroup, whose waiting thread reads the reply
// itself (the other helpers wait on the connection's reader thread).
absl::Status PushInGroup(Transport& t, RequestId id, const std::vector<float>& grad,
                         absl::Time deadline = absl::Now() + kTimeout) {
  const GradientView view = ViewOf(grad);
  CallGroup group;
  t.Push(id, absl::MakeConstSpan(&view, 1), deadline, group.Add("s"));
  return group.Wait();
}

ChannelTransportOptions OneConnection() {
  ChannelTransportOptions one;
  one.connections = 1;
  return one;
}

std::vector<v1::ParamRef> Refs(const std::string& name) {
  std::vector<v1::ParamRef> refs(1);
  refs[0].set_name(name);
  return refs;
}

std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

class ChannelTransportTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { Start(ServerOptions()); }

  // `big_floats` > 0: also "big", that many floats i % 977, in 64 KiB
  // blocks (kBigBlockBytes; a client reading it must use that block size).
  void Start(ServerOptions options, size_t big_floats = 0) {
    options.bulk_unix_socket = GetParam();
    auto server = Server::Start(options);
    ASSERT_THAT(server.status(), IsOk());
    server_ = *std::move(server);
    ClientOptions client_options;
    client_options.servers = {server_->address()};
    client_options.bulk_channel = false;
    if (big_floats > 0) client_options.block_bytes = kBigBlockBytes;
    auto client = Client::Connect(client_options);
    ASSERT_THAT(client.status(), IsOk());
    v1::ParameterConfig sgd;
    sgd.mutable_optimizer()->mutable_sgd();
    sgd.mutable_learning_rate()->set_learning_rate(1.0);
    ASSERT_THAT((*client)->InitParam("w", Tensor::FromValues<float>({4}, {1, 2, 3, 4}), sgd),
                IsOk());
    if (big_floats > 0) {
      std::vector<float> big(big_floats);
      for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 977);
      const Tensor value = Tensor::FromValues<float>({static_cast<int64_t>(big_floats)}, big);
      ASSERT_THAT((*client)->InitParam("big", value, sgd), IsOk());
    }
    ASSERT_THAT((*client)->FinishInitParams(), IsOk());
    grpc_ = MakeGrpc();
    channel_ = std::make_unique<ChannelTransport>(MakeGrpc());
  }

  std::unique_ptr<Transport> MakeGrpc() {
    auto grpc = GrpcTransport::Create(server_->address());
    EXPECT_THAT(grpc.status(), IsOk());
    return *std::move(grpc);
  }

  static constexpr size_t kBigBlockBytes = 64 << 10;

  uint64_t Duplicates() {
    return server_->dispatcher().duplicates_ignored();
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<Transport> grpc_;
  std::unique_ptr<ChannelTransport> channel_;
};

TEST_P(ChannelTransportTest, BulkMethodsAnswerAsGrpcDoes) {
  ASSERT_THAT(PushOver(*channel_, {7, 1}, {1, 1, 1, 1}), IsOk());
  EXPECT_EQ(channel_->route(), GetParam() ? "unix" : "tcp");
  Pulled over_channel = PullOver(*channel_, Refs("w"));
  Pulled over_grpc = PullOver(*grpc_, Refs("w"));
  ASSERT_THAT(over_channel.status, IsOk());
  ASSERT_THAT(over_grpc.status, IsOk());
  EXPECT_EQ(over_channel.blocks, over_grpc.blocks);
  ASSERT_EQ(over_channel.blocks.size(), 1u);
  EXPECT_EQ(Floats(over_channel.blocks[0].second), (std::vector<float>{0, 1, 2, 3}));

  // Push+pull: applied, then read, in one round trip.
  const std::vector<float> grad = {1, 1, 1, 1};
  GradientView view;
  view.name = "w";
  view.type = v1::FLOAT32;
  view.content = absl::string_view(reinterpret_cast<const char*>(grad.data()), 16);
  const std::vector<v1::ParamRef> refs = Refs("w");
  Pulled both;
  absl::Notification done;
  channel_->PushPull(
      {7, 2}, absl::MakeConstSpan(&view, 1), refs,
      [&](const v1::Parameter& header, const Segments& content) {
        std::string bytes;
        for (absl::string_view s : content) bytes.append(s.data(), s.size());
        both.blocks.emplace_back(header.name(), bytes);
        return absl::OkStatus();
      },
      absl::Now() + kTimeout,
      [&](absl::Status s) {
        both.status = s;
        done.Notify();
      });
  done.WaitForNotification();
  ASSERT_THAT(both.status, IsOk());
  EXPECT_EQ(both.blocks, PullOver(*grpc_, Refs("w")).blocks);
  EXPECT_EQ(Floats(both.blocks[0].second), (std::vector<float>{-1, 0, 1, 2}));

  // Errors carry the same code and message.
  Pulled missing_channel = PullOver(*channel_, Refs("missing"));
  Pulled missing_grpc = PullOver(*grpc_, Refs("missing"));
  EXPECT_THAT(missing_channel.status, StatusCodeIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(missing_channel.status, missing_grpc.status);
  EXPECT_EQ(channel_->connections_opened(), 2);  // one per slot, kept
}

// Every TCP connection of the channel limits its unsent bytes
// (ChannelTransportOptions::unsent_bytes, 128 KiB unless set); 0 leaves the
// kernel's default (unset reads as 0); over a Unix socket no TCP socket is
// made. The server here is on loopback, where the limit is set only with
// unsent_bytes_on_loopback (LoopbackConnectionsLeaveTheKernelsDefault).
TEST_P(ChannelTransportTest, TcpConnectionsLimitTheirUnsentBytes) {
  const int port = static_cast<int>(server_->bulk_listener()->Offer().tcp_port());
  ASSERT_GT(port, 0);
  uint64_t client = 11;
  for (const int limit : {-1, 64 << 10, 0}) {  // -1: the default options
    ChannelTransportOptions options;
    options.unsent_bytes_on_loopback = true;
    if (limit >= 0) options.unsent_bytes = limit;
    ChannelTransport channel(MakeGrpc(), options);
    ++client;
    for (uint64_t i = 1; i <= 4; ++i) {  // calls go round both connections
      ASSERT_THAT(PushOver(channel, {client, i}, {1, 1, 1, 1}), IsOk());
    }
    // This process's only bulk connections are this channel's (the
    // fixture's client stays on gRPC; the channels before are gone).
    const std::vector<int> fds = TcpSocketsConnectedTo(port);
    if (GetParam()) {
      EXPECT_EQ(channel.route(), "unix");
      EXPECT_THAT(fds, ::testing::IsEmpty());
    } else {
      ASSERT_EQ(fds.size(), 2u);  // ChannelTransportOptions::connections
      for (const int fd : fds) {
        EXPECT_EQ(UnsentBytesLimitOf(fd), limit < 0 ? 128 << 10 : limit) << "limit " << limit;
      }
    }
  }
}

// On a loopback connection the limit is left to the kernel unless asked
// for: nothing to pace, only more wake-ups.
TEST_P(ChannelTransportTest, LoopbackConnectionsLeaveTheKernelsDefault) {
  const int port = static_cast<int>(server_->bulk_listener()->Offer().tcp_port());
  ASSERT_GT(port, 0);
  ChannelTransport channel(MakeGrpc(), ChannelTransportOptions{});
  for (uint64_t i = 1; i <= 4; ++i) ASSERT_THAT(PushOver(channel, {31, i}, {1, 1, 1, 1}), IsOk());
  const std::vector<int> fds = TcpSocketsConnectedTo(port);
  if (GetParam()) {
    EXPECT_THAT(fds, ::testing::IsEmpty());
  } else {
    ASSERT_EQ(fds.size(), 2u);
    for (const int fd : fds) EXPECT_EQ(UnsentBytesLimitOf(fd), 0);
  }
}

// ClientOptions::bulk_unsent_bytes: a negative one is refused naming it; on
// loopback (this test's server) the Client's bulk TCP sockets keep the
// kernel's default whatever it says (none over a Unix socket).
TEST_P(ChannelTransportTest, ClientOptionsSetTheUnsentBytesOfTheBulkTcpSockets) {
  const int port = static_cast<int>(server_->bulk_listener()->Offer().tcp_port());
  ASSERT_GT(port, 0);
  ClientOptions options;
  options.servers = {server_->address()};
  options.bulk_unsent_bytes = 96 << 10;  // not the default
  auto client = Client::Connect(options);
  ASSERT_THAT(client.status(), IsOk());
  for (int i = 0; i < 4; ++i) {  // calls go round both connections
    ASSERT_THAT((*client)->SendGrad("w", Tensor::FromValues<float>({4}, {1, 1, 1, 1})), IsOk());
  }
  const std::vector<int> fds = TcpSocketsConnectedTo(port);
  if (GetParam()) {
    EXPECT_THAT(fds, ::testing::IsEmpty());  // the Unix socket carries them
  } else {
    ASSERT_EQ(fds.size(), 2u);  // channels_per_server
    for (const int fd : fds) EXPECT_EQ(UnsentBytesLimitOf(fd), 0);
  }
  ClientOptions negative;
  negative.servers = {server_->address()};
  negative.bulk_unsent_bytes = -1;
  EXPECT_THAT(Client::Connect(negative).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bulk_unsent_bytes")));
}

TEST_P(ChannelTransportTest, ARetriedPushIsAppliedOnceAcrossADroppedConnection) {
  ASSERT_THAT(PushOver(*channel_, {9, 1}, {1, 1, 1, 1}), IsOk());
  ASSERT_THAT(PushOver(*channel_, {9, 2}, {1, 1, 1, 1}), IsOk());
  const int opened = channel_->connections_opened();
  server_->bulk_listener()->DropConnections();
  // The same request again, as Client retries an UNAVAILABLE: a call that
  // meets the dropped connection fails UNAVAILABLE; a later one reconnects.
  absl::Status status = absl::UnknownError("not sent");
  for (int attempt = 0; attempt < 100 && !status.ok(); ++attempt) {
    status = PushOver(*channel_, {9, 2}, {1, 1, 1, 1});
    if (!status.ok()) EXPECT_THAT(status, StatusCodeIs(absl::StatusCode::kUnavailable));
  }
  ASSERT_THAT(status, IsOk());
  EXPECT_GT(channel_->connections_opened(), opened);
  EXPECT_EQ(Duplicates(), 1u);
  EXPECT_EQ(Floats(PullOver(*grpc_, Refs("w")).blocks[0].second),
            (std::vector<float>{-1, 0, 1, 2}));
}

TEST_P(ChannelTransportTest, ConcurrentCallersOnOneConnectionAreEachAnsweredOnce) {
  ChannelTransport channel(MakeGrpc(), OneConnection());
  constexpr int kThreads = 4;
  constexpr int kPushes = 50;
  std::vector<std::thread> callers;
  std::vector<absl::Status> failures(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    callers.emplace_back([&, t] {
      for (int i = 0; i < kPushes && failures[t].ok(); ++i) {
        // Waiters that read their own reply, and callers the reader thread
        // answers, interleaved on the one connection; pulls between them.
        const RequestId id{static_cast<uint64_t>(100 + t), static_cast<uint64_t>(i + 1)};
        failures[t] = (t + i) % 2 == 0 ? PushInGroup(channel, id, {1, 1, 1, 1})
                                       : PushOver(channel, id, {1, 1, 1, 1});
        if (failures[t].ok() && i % 10 == 0) failures[t] = PullOver(channel, Refs("w")).status;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (const absl::Status& status : failures) EXPECT_THAT(status, IsOk());
  EXPECT_EQ(channel.connections_opened(), 1);
  EXPECT_EQ(Duplicates(), 0u);
  const float n = kThreads * kPushes;
  EXPECT_EQ(Floats(PullOver(*grpc_, Refs("w")).blocks[0].second),
            (std::vector<float>{1 - n, 2 - n, 3 - n, 4 - n}));
}

TEST_P(ChannelTransportTest, ALoneWaiterReadsItsOwnReply) {
  ChannelTransport channel(MakeGrpc(), OneConnection());
  for (uint64_t i = 1; i <= 3; ++i) ASSERT_THAT(PushInGroup(channel, {7, i}, {1, 1, 1, 1}), IsOk());
  // A lone caller waiting in a CallGroup reads its own reply (no hand-off).
  EXPECT_EQ(channel.replies_read_by_waiters(), 3u);
  // A call with no waiter is the reader thread's.
  ASSERT_THAT(PushOver(channel, {7, 4}, {1, 1, 1, 1}), IsOk());
  EXPECT_EQ(channel.replies_read_by_waiters(), 3u);
}

TEST_P(ChannelTransportTest, AGroupOfSeveralCallsLeavesTheirRepliesToTheReader) {
  ChannelTransport channel(MakeGrpc(), OneConnection());
  const std::vector<float> grad = {1, 1, 1, 1};
  const GradientView view = ViewOf(grad);
  CallGroup group;
  for (uint64_t i = 1; i <= 3; ++i) {
    channel.Push({8, i}, absl::MakeConstSpan(&view, 1), absl::Now() + kTimeout, group.Add("s"));
  }
  EXPECT_THAT(group.Wait(), IsOk());
  EXPECT_EQ(channel.replies_read_by_waiters(), 0u);
  EXPECT_EQ(Floats(PullOver(*grpc_, Refs("w")).blocks[0].second),
            (std::vector<float>{-2, -1, 0, 1}));
}

TEST_P(ChannelTransportTest, ClientRetriesLostRepliesOverTheChannelExactlyOnce) {
  ServerOptions options;
  options.drop_reply_after_apply_every_n = 2;  // every 2nd applied push "loses" its reply
  server_.reset();
  Start(options);
  ClientOptions client_options;
  client_options.servers = {server_->address()};
  client_options.initial_backoff = absl::Milliseconds(1);
  auto client = Client::Connect(client_options);
  ASSERT_THAT(client.status(), IsOk());
  for (int i = 0; i < 4; ++i) {
    ASSERT_THAT((*client)->SendGrad("w", Tensor::FromValues<float>({4}, {1, 1, 1, 1})), IsOk());
  }
  auto value = (*client)->GetParam("w");
  ASSERT_THAT(value.status(), IsOk());
  EXPECT_EQ(Floats(std::string(value->bytes())), (std::vector<float>{-3, -2, -1, 0}));
  EXPECT_EQ(server_->dispatcher().replies_dropped(), Duplicates());
  EXPECT_GE(Duplicates(), 1u);
}

// Pulls `refs` (blocks of float parameter, `out` its whole content) over
// `t`, each block's content offered where its offset puts it in `out` (read
// there straight from the stream when the transport can); a block that did
// not arrive there is copied there. `in_group`: waited for in a CallGroup.
struct PulledInto {
  absl::Status status;
  int placed = 0;      // blocks handed to the sink
  int in_place = 0;    // of which already in `out`
  uint64_t bytes = 0;  // their content
};
PulledInto PullInto(Transport& t, const std::vector<v1::ParamRef>& refs, absl::Span<char> out,
                    absl::Time deadline, bool in_group = true,
                    const std::vector<GradientView>* grads = nullptr) {
  PulledInto pulled;
  auto dest = [out](const v1::Parameter& header, uint64_t size) -> char* {
    const uint64_t at = header.block().offset() * sizeof(float);
    return at <= out.size() && size <= out.size() - at ? out.data() + at : nullptr;
  };
  Transport::BlockSink sink(
      [&pulled, dest](const v1::Parameter& header, const Segments& content) {
        char* to = dest(header, SegmentsSize(content));
        if (to == nullptr) return absl::DataLossError("the block does not fit");
        ++pulled.placed;
        pulled.bytes += SegmentsSize(content);
        if (content.size() == 1 && content[0].data() == to) {
          ++pulled.in_place;
        } else {
          CopySegments(content, to);
        }
        return absl::OkStatus();
      },
      dest);
  CallGroup group;
  absl::Notification done;
  Transport::Done on_done = in_group ? group.Add("s") : Transport::Done([&](absl::Status s) {
    pulled.status = std::move(s);
    done.Notify();
  });
  if (grads == nullptr) {
    t.Pull(refs, std::move(sink), deadline, std::move(on_done));
  } else {
    t.PushPull({5, 1}, *grads, refs, std::move(sink), deadline, std::move(on_done));
  }
  if (in_group) {
    pulled.status = group.Wait();
  } else {
    done.WaitForNotification();
  }
  return pulled;
}

std::vector<v1::ParamRef> BlockRefs(const std::string& name, std::vector<uint32_t> blocks,
                                    uint32_t count) {
  std::vector<v1::ParamRef> refs;
  for (uint32_t b : blocks) refs.push_back(Client::BlockRef(name, b, count));
  return refs;
}

TEST_P(ChannelTransportTest, PulledBlocksGoStraightIntoTheCallersMemory) {
  // "big": 300000 floats in 64 KiB blocks (19 of them).
  constexpr size_t kFloats = 300000;
  constexpr size_t kBlockBytes = kBigBlockBytes;
  server_.reset();
  Start(ServerOptions(), kFloats);
  const uint32_t count = (kFloats * 4 + kBlockBytes - 1) / kBlockBytes;

  // Every block, then some (a partial pull), over the channel into memory:
  // the same bytes as gRPC's, each read in place.
  for (const std::vector<uint32_t>& blocks :
       {std::vector<uint32_t>{}, std::vector<uint32_t>{3, 5, count - 1}}) {
    std::vector<uint32_t> which = blocks;
    if (which.empty()) {
      for (uint32_t b = 0; b < count; ++b) which.push_back(b);
    }
    SCOPED_TRACE(absl::StrCat(which.size(), " blocks"));
    std::vector<float> out(kFloats, -1), want(kFloats, -1);
    const uint64_t before = channel_->pulled_bytes_in_place();
    const PulledInto pulled = PullInto(*channel_, BlockRefs("big", which, count),
                                       absl::MakeSpan(reinterpret_cast<char*>(out.data()),
                                                      out.size() * 4),
                                       absl::Now() + kTimeout);
    ASSERT_THAT(pulled.status, IsOk());
    ASSERT_THAT(PullInto(*grpc_, BlockRefs("big", which, count),
                         absl::MakeSpan(reinterpret_cast<char*>(want.data()), want.size() * 4),
                         absl::Now() + kTimeout)
                    .status,
                IsOk());
    EXPECT_TRUE(out == want);
    EXPECT_EQ(pulled.placed, static_cast<int>(which.size()));
    EXPECT_EQ(pulled.in_place, static_cast<int>(which.size()));
    EXPECT_EQ(channel_->pulled_bytes_in_place() - before, pulled.bytes);
    if (which.size() == count) {
      EXPECT_EQ(pulled.bytes, kFloats * 4);
    }
  }
  EXPECT_EQ(channel_->pulled_bytes_buffered(), 0u);
}

TEST_P(ChannelTransportTest, ClientPullsAndPushPullsReadStraightIntoTheTensors) {
  // A Client over the channel (64 KiB blocks): its pulls and push+pulls
  // answer as a gRPC client's do, their blocks read into the output tensors
  // as they arrive once the layout is known.
  constexpr size_t kFloats = 100000;
  server_.reset();
  Start(ServerOptions(), kFloats);
  ClientOptions options;
  options.servers = {server_->address()};
  options.block_bytes = kBigBlockBytes;
  options.bulk_channel = false;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> grpc_client, Client::Connect(options));
  auto owned = std::make_unique<ChannelTransport>(MakeGrpc());
  ChannelTransport* channel = owned.get();
  std::vector<std::unique_ptr<Transport>> transports;
  transports.push_back(std::move(owned));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client,
                       Client::Create(options, std::move(transports)));

  const std::vector<std::string> names = {"big", "w"};
  std::vector<Tensor> outs(2), want(2);
  ASSERT_THAT(client->GetParamsInto(names, absl::MakeSpan(outs)), IsOk());  // learns the layouts
  const uint64_t before = channel->pulled_bytes_in_place();
  ASSERT_THAT(client->GetParamsInto(names, absl::MakeSpan(outs)), IsOk());
  EXPECT_EQ(channel->pulled_bytes_in_place() - before, (kFloats + 4) * sizeof(float));
  ASSERT_THAT(grpc_client->GetParamsInto(names, absl::MakeSpan(want)), IsOk());
  EXPECT_EQ(outs[0].bytes(), want[0].bytes());
  EXPECT_EQ(outs[1].ToVector<float>(), (std::vector<float>{1, 2, 3, 4}));

  const uint64_t before_push = channel->pulled_bytes_in_place();
  Tensor out;
  ASSERT_THAT(client->PushPull("big", Tensor::FromValues<float>({kFloats}, std::vector<float>(kFloats, 1)),
                               &out),
              IsOk());
  EXPECT_EQ(channel->pulled_bytes_in_place() - before_push, kFloats * sizeof(float));
  ASSERT_OK_AND_ASSIGN(Tensor after, grpc_client->GetParam("big"));
  EXPECT_EQ(out.bytes(), after.bytes());
}

TEST_P(ChannelTransportTest, FallsBackToGrpcWhenTheServerHasItOff) {
  ServerOptions options;
  options.bulk_channel = false;
  server_.reset();
  Start(options);
  ASSERT_THAT(PushOver(*channel_, {5, 1}, {1, 1, 1, 1}), IsOk());
  EXPECT_EQ(channel_->route(), "grpc");
  EXPECT_EQ(channel_->connections_opened(), 0);
  Pulled pulled = PullOver(*channel_, Refs("w"));
  ASSERT_THAT(pulled.status, IsOk());
  EXPECT_EQ(Floats(pulled.blocks[0].second), (std::vector<float>{0, 1, 2, 3}));
}

INSTANTIATE_TEST_SUITE_P(UnixAndTcp, ChannelTransportTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Unix" : "Tcp";
                         });

// ---- against a fake channel server ----

// Offers a fake listener through OpenChannel; its gRPC bulk methods fail.
class FakeGrpc final : public Transport {
 public:
  explicit FakeGrpc(v1::OpenChannelResponse offer) : offer_(std::move(offer)) {}
  const std::string& address() const override { return address_; }
  void Call(absl::string_view method, const google::protobuf::Message&,
            google::protobuf::Message* response, absl::Time, Done done) override {
    if (method != "OpenChannel") return done(absl::UnimplementedError("fake"));
    response->CopyFrom(offer_);
    done(absl::OkStatus());
  }
  void Push(const RequestId&, absl::Span<const GradientView>, absl::Time, Done done,
            TraceRecorder*) override {
    done(absl::UnimplementedError("fake gRPC push"));
  }
  void Pull(absl::Span<const v1::ParamRef>, BlockSink, absl::Time, Done done,
            TraceRecorder*) override {
    done(absl::UnimplementedError("fake gRPC pull"));
  }
  void PushPull(const RequestId&, absl::Span<const GradientView>, absl::Span<const v1::ParamRef>,
                BlockSink, absl::Time, Done done, TraceRecorder*) override {
    done(absl::UnimplementedError("fake gRPC push+pull"));
  }

 private:
  const std::string address_ = "127.0.0.1:1";
  const v1::OpenChannelResponse offer_;
};

// A listener on 127.0.0.1 and the offer (its port, a token) that names it;
// returns the listening socket.
int ListenAndOffer(v1::OpenChannelResponse* offer) {
  int port = 0;
  auto fd = ListenTcp("127.0.0.1", &port);
  EXPECT_THAT(fd.status(), IsOk());
  offer->set_tcp_port(port);
  offer->set_token(std::string(kChannelTokenBytes, 't'));
  return fd.ok() ? *fd : -1;
}

// Accepts one connection, greets it, then reads requests and answers each
// with `reply` (nothing when empty) until the client closes it; given
// several replies, the n-th request gets the n-th (the last: every later one).
class FakeChannelServer {
 public:
  explicit FakeChannelServer(std::string reply = "")
      : FakeChannelServer(std::vector<std::string>{std::move(reply)}) {}
  explicit FakeChannelServer(std::vector<std::string> replies) : replies_(std::move(replies)) {
    listen_fd_ = ListenAndOffer(&offer_);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeChannelServer() {
    shutdown(listen_fd_, SHUT_RDWR);
    thread_.join();
    close(listen_fd_);
  }
  const v1::OpenChannelResponse& offer() const { return offer_; }
  // Waits until the client closed (dropped) the connection.
  void WaitForClose() { closed_.WaitForNotification(); }
  // Waits until the first reply has been written.
  void WaitForReply() { replied_.WaitForNotification(); }

 private:
  void Serve() {
    const int fd = accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) return;
    SocketStream stream(fd);
    char header[kFrameHeaderBytes];
    std::string token(kChannelTokenBytes, '\0');
    if (stream.Read(header, sizeof(header)).ok() && stream.Read(token.data(), token.size()).ok()) {
      WriteReplyFrame(stream, ReplyHeader{}, absl::OkStatus()).IgnoreError();
      for (size_t n = 0; stream.Read(header, sizeof(header)).ok(); ++n) {
        auto request = DecodeRequestHeader(header, kDefaultMaxMessageBytes);
        if (!request.ok()) break;
        std::string payload(request->payload_bytes, '\0');
        if (!stream.Read(payload.data(), payload.size()).ok()) break;
        const std::string& reply = replies_[std::min(n, replies_.size() - 1)];
        if (!reply.empty()) stream.Write({reply}).IgnoreError();
        if (!replied_.HasBeenNotified()) replied_.Notify();
      }
    }
    closed_.Notify();
  }

  const std::vector<std::string> replies_;
  int listen_fd_ = -1;
  v1::OpenChannelResponse offer_;
  std::thread thread_;
  absl::Notification closed_;
  absl::Notification replied_;
};

TEST(ChannelTransportFakeTest, ADeadlineFailsTheCallAndDropsTheConnection) {
  FakeChannelServer fake;
  ChannelTransport channel(std::make_unique<FakeGrpc>(fake.offer()));
  EXPECT_THAT(PushOver(channel, {1, 1}, {1}, absl::Now() + absl::Milliseconds(200)),
              StatusCodeIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(channel.route(), "tcp");
  fake.WaitForClose();
}

TEST(ChannelTransportFakeTest, CancellingFailsTheCallAndDropsTheConnection) {
  FakeChannelServer fake;
  ChannelTransport channel(std::make_unique<FakeGrpc>(fake.offer()));
  Cancellation cancel;
  absl::Notification sent, done;
  absl::Status status;
  std::thread caller([&] {
    Cancellation::Scope scope(&cancel);
    const std::vector<float> grad = {1};
    GradientView view;
    view.name = "w";
    view.type = v1::FLOAT32;
    view.content = absl::string_view(reinterpret_cast<const char*>(grad.data()), 4);
    channel.Push({1, 1}, absl::MakeConstSpan(&view, 1), absl::InfiniteFuture(),
                 [&](absl::Status s) {
                   status = s;
                   done.Notify();
                 });
    sent.Notify();
  });
  sent.WaitForNotification();
  cancel.Cancel();
  done.WaitForNotification();
  caller.join();
  EXPECT_THAT(status, StatusCodeIs(absl::StatusCode::kCancelled));
  fake.WaitForClose();
}

// Abandon (the client's etcd watch found another server at this index): a
// push whose waiter reads its own reply from a server that never answers
// ends at once with the reason, the connection dropped; a later call is not
// sent over the channel (it goes to the gRPC transport, which fails it too).
TEST(ChannelTransportFakeTest, AbandoningFailsACallInFlightWithTheReason) {
  FakeChannelServer fake;  // reads requests, answers none
  ChannelTransport channel(std::make_unique<FakeGrpc>(fake.offer()));
  absl::Status status;
  std::thread caller([&] {
    // Far longer than an abandon takes: without one, DEADLINE_EXCEEDED.
    status = PushInGroup(channel, {1, 1}, {1}, absl::Now() + absl::Seconds(20));
  });
  fake.WaitForReply();  // the request reached the server
  channel.Abandon(absl::UnavailableError("server 0 was replaced"));
  caller.join();
  EXPECT_THAT(status, StatusCodeIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(status.message(), HasSubstr("server 0 was replaced"));
  fake.WaitForClose();
  EXPECT_THAT(PushOver(channel, {1, 2}, {1}), StatusCodeIs(absl::StatusCode::kUnimplemented));
}

// Accepts connections, reads their hello and never answers: a server paused
// (SIGSTOP) mid-handshake, whose kernel still accepts connections.
class MuteChannelServer {
 public:
  MuteChannelServer() {
    listen_fd_ = ListenAndOffer(&offer_);
    thread_ = std::thread([this] { Serve(); });
  }
  ~MuteChannelServer() {
    shutdown(listen_fd_, SHUT_RDWR);
    CloseAll();
    thread_.join();
    close(listen_fd_);
    absl::MutexLock lock(&mu_);
    for (int fd : fds_) close(fd);
  }
  const v1::OpenChannelResponse& offer() const { return offer_; }
  // Waits until a client's hello (header and token) has arrived.
  void WaitForHello() { hello_.WaitForNotification(); }
  // Shuts every connection down: what ends a client stuck in its hello.
  void CloseAll() {
    absl::MutexLock lock(&mu_);
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);
  }

 private:
  void Serve() {
    for (;;) {
      const int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      {
        absl::MutexLock lock(&mu_);
        fds_.push_back(fd);
      }
      std::string hello(kFrameHeaderBytes + kChannelTokenBytes, '\0');
      if (recv(fd, hello.data(), hello.size(), MSG_WAITALL) == static_cast<ssize_t>(hello.size()) &&
          !hello_.HasBeenNotified()) {
        hello_.Notify();
      }
    }
  }

  int listen_fd_ = -1;
  v1::OpenChannelResponse offer_;
  std::thread thread_;
  absl::Notification hello_;
  absl::Mutex mu_;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
};

// A push (its deadline an hour away) on a thread of its own.
struct PushInThread {
  explicit PushInThread(Transport& channel)
      : thread([this, &channel] {
          status = PushOver(channel, {1, 1}, {1}, absl::Now() + absl::Hours(1));
          done.Notify();
        }) {}
  absl::Status status;
  absl::Notification done;
  std::thread thread;  // last: starts once the others are made
};

// A server that accepts the bulk connection and never answers the hello:
// opening the channel ends at connect_timeout (the call's deadline is an
// hour away), and the call goes to gRPC.
TEST(ChannelTransportFakeTest, AHelloNeverAnsweredEndsAtTheConnectTimeout) {
  MuteChannelServer mute;
  ChannelTransportOptions options;
  options.connect_timeout = absl::Milliseconds(100);
  ChannelTransport channel(std::make_unique<FakeGrpc>(mute.offer()), options);
  PushInThread push(channel);
  // Bounded (far above 100 ms) only so that the test fails, rather than
  // hangs, without the connect timeout.
  const bool ended = push.done.WaitForNotificationWithTimeout(absl::Seconds(15));
  if (!ended) mute.CloseAll();
  push.thread.join();
  ASSERT_TRUE(ended) << "the hello to a silent server did not end at connect_timeout";
  EXPECT_THAT(push.status, StatusCodeIs(absl::StatusCode::kUnimplemented));  // the fake gRPC's
  EXPECT_EQ(channel.route(), "grpc");
  EXPECT_EQ(channel.connections_opened(), 0);
}

// Abandon (the client's etcd watch found another server at this index)
// while a connection to a silent server is being opened: the hello ends at
// once, Abandon does not wait for it, and the call is not sent over the
// channel (it goes to gRPC).
TEST(ChannelTransportFakeTest, AbandoningEndsAHelloInProgress) {
  MuteChannelServer mute;
  ChannelTransportOptions options;
  options.connect_timeout = absl::Hours(1);
  ChannelTransport channel(std::make_unique<FakeGrpc>(mute.offer()), options);
  PushInThread push(channel);
  absl::Notification abandoned;
  mute.WaitForHello();
  std::thread watch([&] {
    channel.Abandon(absl::UnavailableError("server 0 was replaced"));
    abandoned.Notify();
  });
  // Bounded only so that the test fails, rather than hangs, without the fix.
  const absl::Time until = absl::Now() + absl::Seconds(15);
  const bool ended = push.done.WaitForNotificationWithDeadline(until) &&
                     abandoned.WaitForNotificationWithDeadline(until);
  if (!ended) mute.CloseAll();
  push.thread.join();
  watch.join();
  ASSERT_TRUE(ended) << "Abandon did not end the hello to a silent server";
  EXPECT_THAT(push.status, StatusCodeIs(absl::StatusCode::kUnimplemented));  // the fake gRPC's
  EXPECT_EQ(channel.connections_opened(), 0);
}

// The same on gRPC: a server that takes the call and never answers; the
// call ends with the reason, not CANCELLED, and so does every later call,
// at once.
TEST(GrpcTransportAbandonTest, AbandoningFailsACallInFlightAndLaterCallsWithTheReason) {
  grpc::AsyncGenericService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterAsyncGenericService(&service);
  std::unique_ptr<grpc::ServerCompletionQueue> queue = builder.AddCompletionQueue();
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  grpc::GenericServerContext context;
  grpc::GenericServerAsyncReaderWriter stream(&context);
  int arrived_tag = 1;
  service.RequestCall(&context, &stream, queue.get(), queue.get(), &arrived_tag);

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GrpcTransport> transport,
                       GrpcTransport::Create(absl::StrCat("127.0.0.1:", port)));
  v1::GetStatsRequest request;
  v1::GetStatsResponse response;
  absl::Notification done;
  absl::Status status;
  // Far longer than an abandon takes: without one, DEADLINE_EXCEEDED.
  transport->Call("GetStats", request, &response, absl::Now() + absl::Seconds(20),
                  [&](absl::Status s) {
                    status = std::move(s);
                    done.Notify();
                  });
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(queue->Next(&tag, &ok));  // the call reached the server, which never answers
  ASSERT_EQ(tag, &arrived_tag);
  ASSERT_TRUE(ok);
  transport->Abandon(absl::UnavailableError("server 0 was replaced"));
  done.WaitForNotification();
  EXPECT_THAT(status, StatusCodeIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(status.message(), HasSubstr("server 0 was replaced"));
  const absl::Status later = PushOver(*transport, {1, 1}, {1});
  EXPECT_THAT(later, StatusCodeIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(later.message(), HasSubstr("server 0 was replaced"));

  server->Shutdown(absl::ToChronoTime(absl::Now()));
  queue->Shutdown();
  while (queue->Next(&tag, &ok)) {
  }
}

// A reply header for call `id` promising `payload_bytes`, then `sent` of them.
std::string PartialReply(uint64_t id, uint64_t payload_bytes, size_t sent) {
  ReplyHeader header;
  header.call_id = id;
  header.payload_bytes = payload_bytes;
  std::string out(kReplyHeaderBytes, '\0');
  EncodeReplyHeader(header, out.data());
  return out + std::string(sent, 'p');
}

TEST(ChannelTransportFakeTest, CancellingMidReplyFailsTheCallAndDropsTheConnection) {
  // The first 10 of the reply's 1000 bytes have been sent when the call is
  // cancelled: the rest is never waited for.
  FakeChannelServer fake(PartialReply(1, 1000, 10));
  ChannelTransport channel(std::make_unique<FakeGrpc>(fake.offer()), OneConnection());
  Cancellation cancel;
  absl::Status status;
  std::thread caller([&] {
    Cancellation::Scope scope(&cancel);
    status = PushOver(channel, {1, 1}, {1}, absl::InfiniteFuture());
  });
  fake.WaitForReply();
  cancel.Cancel();
  caller.join();
  EXPECT_THAT(status, StatusCodeIs(absl::StatusCode::kCancelled));
  fake.WaitForClose();
}

using PushFn = absl::Status (*)(Transport&, RequestId, const std::vector<float>&, absl::Time);

// Both ways a reply is read: by the connection's reader thread (a callback)
// and by a caller waiting in a CallGroup.
const std::pair<const char*, PushFn> kReaders[] = {{"the reader thread", &PushOver},
                                                   {"a waiter", &PushInGroup}};

// Pushes twice over a fake server on one connection; the first push is
// answered OK, the second with `second`. The second's status, once the
// client has closed the connection.
absl::Status SecondPush(PushFn push, std::string second, absl::Time deadline) {
  FakeChannelServer fake({PartialReply(1, 0, 0), std::move(second)});
  ChannelTransport channel(std::make_unique<FakeGrpc>(fake.offer()), OneConnection());
  EXPECT_THAT(push(channel, {1, 1}, {1}, absl::Now() + kTimeout), IsOk());
  absl::Status status = push(channel, {1, 2}, {1}, deadline);
  fake.WaitForClose();
  return status;
}

TEST(ChannelTransportFakeTest, ADeadlineMidReplyFailsTheCallAndDropsTheConnection) {
  for (const auto& [reader, push] : kReaders) {
    SCOPED_TRACE(reader);
    EXPECT_THAT(SecondPush(push, PartialReply(2, 1000, 10), absl::Now() + absl::Milliseconds(200)),
                StatusCodeIs(absl::StatusCode::kDeadlineExceeded));
  }
}

TEST(ChannelTransportFakeTest, AReplyForACallNotMadeIsUnavailable) {
  for (const auto& [reader, push] : kReaders) {
    SCOPED_TRACE(reader);
    EXPECT_THAT(SecondPush(push, PartialReply(999, 0, 0), absl::Now() + kTimeout),
                testing::StatusIs(absl::StatusCode::kUnavailable, HasSubstr("a call not made")));
  }
}

// ---- table pulls whose rows land in the caller's memory ----

// A fake server's complete answer to table pull `id`: the pull reply's
// header and `rows`.
std::string PullRowsReply(uint64_t id, const std::string& rows) {
  std::string pull(kTablePullReplyHeaderBytes, '\0');
  EncodeTablePullReplyHeader(/*content_type=*/0, rows.size(), pull.data());
  return PartialReply(id, pull.size() + rows.size(), 0) + pull + rows;
}

// The offer of `fake`, speaking table frames.
v1::OpenChannelResponse TableFramesOffer(const FakeChannelServer& fake) {
  v1::OpenChannelResponse offer = fake.offer();
  offer.set_table_frames(kTableFrameVersion);
  return offer;
}

// What a table pull's rows sink got.
struct RowsSeen {
  absl::Status status;
  std::string rows;
  const char* at = nullptr;  // where they were
};

// A rows sink that records what it got in `*seen`.
Transport::RowsSink SinkInto(RowsSeen* seen) {
  return [seen](uint32_t, absl::string_view values) {
    seen->rows = std::string(values);
    seen->at = values.data();
    return absl::OkStatus();
  };
}

// Sends `frame` as a table pull and waits for it in a CallGroup (the
// waiter reads the reply), or, when a cancellation is current, through the
// connection's reader thread.
RowsSeen PullFrame(ChannelTransport& channel, const TableFrame& frame, absl::Time deadline) {
  RowsSeen seen;
  CallGroup group;
  Transport::Done done = group.Add("fake");
  if (!channel.TableRows(FrameMethod::kTableRowsPull, frame, SinkInto(&seen), deadline, done,
                         nullptr)) {
    seen.status = absl::InternalError("not sent as a table frame");
    return seen;
  }
  seen.status = group.Wait();
  return seen;
}

// Pulls two keys of table "t" as a table frame offering `into` for the
// rows.
RowsSeen PullRows(ChannelTransport& channel, absl::Span<char> into, absl::Time deadline) {
  const std::vector<uint64_t> keys = {1, 2};
  TableFrame frame;
  frame.table = "t";
  frame.keys = keys;
  frame.rows_into = into;
  return PullFrame(channel, frame, deadline);
}

// Pulls keys 0 .. rows_at.size() - 1 of table "t" as a table frame whose
// rows go scattered into `out` (key j's row at rows_at[j]), waiting in a
// CallGroup.
RowsSeen PullScattered(ChannelTransport& channel, absl::Span<char> out,
                       const std::vector<size_t>& rows_at, size_t row_bytes,
                       absl::Time deadline) {
  std::vector<uint64_t> keys(rows_at.size());
  for (size_t j = 0; j < keys.size(); ++j) keys[j] = j;
  TableFrame frame;
  frame.table = "t";
  frame.keys = keys;
  frame.rows_into = out;
  frame.rows_at = rows_at;
  frame.row_bytes = row_bytes;
  return PullFrame(channel, frame, deadline);
}

// Pulls out.size() / 4 rows of 4 bytes into `out`: two keys in order
// (out of 8 bytes), or, `scattered`, each key's row at the place the keys'
// reverse order gives it.
RowsSeen PullLaidOut(ChannelTransport& channel, absl::Span<char> out, bool scattered,
                     absl::Time deadline) {
  if (!scattered) return PullRows(channel, out, deadline);
  std::vector<size_t> rows_at(out.size() / 4);
  for (size_t j = 0; j < rows_at.size(); ++j) rows_at[j] = rows_at.size() - 1 - j;
  return PullScattered(channel, out, rows_at, 4, deadline);
}

TEST(ChannelTransportFakeTest, PulledRowsThatFitGoStraightIntoTheCallersMemory) {
  FakeChannelServer fake(PullRowsReply(1, "rowbytes"));
  ChannelTransport channel(std::make_unique<FakeGrpc>(TableFramesOffer(fake)), OneConnection());
  std::string out(8, '-');
  const RowsSeen seen = PullRows(channel, absl::MakeSpan(out), absl::Now() + kTimeout);
  ASSERT_THAT(seen.status, IsOk());
  EXPECT_EQ(out, "rowbytes");
  EXPECT_EQ(seen.rows, "rowbytes");
  EXPECT_EQ(seen.at, out.data());  // no buffer between the stream and `out`
}

TEST(ChannelTransportFakeTest, PulledRowsThatDoNotFitGoToABufferAndLeaveTheMemoryAlone) {
  // 6 bytes of rows where 8 were offered: the sink gets them from a buffer
  // of the transport's (and the table says they do not fit).
  for (bool scattered : {false, true}) {
    SCOPED_TRACE(scattered ? "scattered" : "in order");
    FakeChannelServer fake(PullRowsReply(1, "rowbyt"));
    ChannelTransport channel(std::make_unique<FakeGrpc>(TableFramesOffer(fake)),
                             OneConnection());
    std::string out(8, '-');
    const RowsSeen seen =
        PullLaidOut(channel, absl::MakeSpan(out), scattered, absl::Now() + kTimeout);
    ASSERT_THAT(seen.status, IsOk());
    EXPECT_EQ(seen.rows, "rowbyt");
    EXPECT_NE(seen.at, out.data());
    EXPECT_EQ(out, "--------");
  }
}

TEST(ChannelTransportFakeTest, ADeadlineMidRowsFailsThePullOnceTheRowsAreLetGo) {
  // The reply's header and 10 of its 1000 bytes of rows have come when the
  // deadline passes: the call fails and the connection drops (which ends
  // the read into `out`) before the caller is told.
  for (bool scattered : {false, true}) {
    SCOPED_TRACE(scattered ? "scattered" : "in order");
    FakeChannelServer fake(PartialReply(1, kTablePullReplyHeaderBytes + 1000,
                                        kTablePullReplyHeaderBytes + 10));
    ChannelTransport channel(std::make_unique<FakeGrpc>(TableFramesOffer(fake)),
                             OneConnection());
    std::string out(1000, '-');
    const RowsSeen seen = PullLaidOut(channel, absl::MakeSpan(out), scattered,
                                      absl::Now() + absl::Milliseconds(200));
    EXPECT_THAT(seen.status, StatusCodeIs(absl::StatusCode::kDeadlineExceeded));
    EXPECT_TRUE(seen.rows.empty());
    fake.WaitForClose();
  }
}

TEST(ChannelTransportFakeTest, CancellingMidRowsFailsThePullOnceTheRowsAreLetGo) {
  FakeChannelServer fake(PartialReply(1, kTablePullReplyHeaderBytes + 1000,
                                      kTablePullReplyHeaderBytes + 10));
  ChannelTransport channel(std::make_unique<FakeGrpc>(TableFramesOffer(fake)), OneConnection());
  std::string out(1000, '-');
  Cancellation cancel;
  RowsSeen seen;
  std::thread caller([&] {
    Cancellation::Scope scope(&cancel);  // the reader thread reads the reply
    seen = PullRows(channel, absl::MakeSpan(out), absl::InfiniteFuture());
  });
  fake.WaitForReply();
  cancel.Cancel();
  caller.join();
  EXPECT_THAT(seen.status, StatusCodeIs(absl::StatusCode::kCancelled));
  EXPECT_TRUE(seen.rows.empty());
  fake.WaitForClose();
}

// A table call split over two servers (one channel each), as Table sends
// it: both frames go out, then the group's waiter reads each reply itself,
// one after the other (table replies are small), with no hand-off to the
// connections' reader threads.
struct TwoServerPull {
  std::string out = std::string(16, '-');  // server a's rows, then server b's
  RowsSeen seen[2];
  absl::Status status;
};

// `deadline_b`: server b's call's (a's has kTimeout).
TwoServerPull PullFromTwo(ChannelTransport& a, ChannelTransport& b, absl::Time deadline_b) {
  const std::vector<uint64_t> keys = {1, 2};
  TwoServerPull pull;
  CallGroup group;
  ChannelTransport* channels[2] = {&a, &b};
  for (int i = 0; i < 2; ++i) {
    TableFrame frame;
    frame.table = "t";
    frame.keys = keys;
    frame.rows_into = absl::MakeSpan(pull.out).subspan(8 * i, 8);
    Transport::RowsSink rows = SinkInto(&pull.seen[i]);
    Transport::Done done = group.Add(i == 0 ? "a" : "b");
    const absl::Time deadline = i == 0 ? absl::Now() + kTimeout : deadline_b;
    if (!channels[i]->TableRows(FrameMethod::kTableRowsPull, frame, std::move(rows), deadline,
                                done, nullptr)) {
      pull.status = absl::InternalError("not sent as a table frame");
      done(pull.status);
    }
  }
  if (pull.status.ok()) pull.status = group.Wait();
  return pull;
}

TEST(ChannelTransportFakeTest, AGroupOfTableCallsToTwoServersIsReadByItsWaiter) {
  FakeChannelServer fake_a(PullRowsReply(1, "rows-ofa"));
  FakeChannelServer fake_b(PullRowsReply(1, "rows-ofb"));
  ChannelTransport a(std::make_unique<FakeGrpc>(TableFramesOffer(fake_a)), OneConnection());
  ChannelTransport b(std::make_unique<FakeGrpc>(TableFramesOffer(fake_b)), OneConnection());
  const TwoServerPull pull = PullFromTwo(a, b, absl::Now() + kTimeout);
  ASSERT_THAT(pull.status, IsOk());
  EXPECT_EQ(pull.out, "rows-ofarows-ofb");  // straight into the caller's memory
  EXPECT_EQ(pull.seen[0].at, pull.out.data());
  EXPECT_EQ(pull.seen[1].at, pull.out.data() + 8);
  // Each reply read by the waiting caller, none by a reader thread.
  EXPECT_EQ(a.replies_read_by_waiters(), 1u);
  EXPECT_EQ(b.replies_read_by_waiters(), 1u);
}

TEST(ChannelTransportFakeTest, AServerStallingMidRowsFailsTheGroupOnceItsRowsAreLetGo) {
  // Server a answers; server b sends its reply's header and 3 of its 8
  // bytes of rows, then nothing: b's deadline fails the group, b's
  // connection drops (ending the read into its rows) before the caller is
  // told, and b's rows never reach the table.
  FakeChannelServer fake_a(PullRowsReply(1, "rows-ofa"));
  FakeChannelServer fake_b(
      PartialReply(1, kTablePullReplyHeaderBytes + 8, kTablePullReplyHeaderBytes + 3));
  ChannelTransport a(std::make_unique<FakeGrpc>(TableFramesOffer(fake_a)), OneConnection());
  ChannelTransport b(std::make_unique<FakeGrpc>(TableFramesOffer(fake_b)), OneConnection());
  const TwoServerPull pull = PullFromTwo(a, b, absl::Now() + absl::Milliseconds(300));
  EXPECT_THAT(pull.status, StatusCodeIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(std::string(pull.status.message()), HasSubstr("(server b)"));
  EXPECT_EQ(pull.seen[0].rows, "rows-ofa");
  EXPECT_TRUE(pull.seen[1].rows.empty());
  fake_b.WaitForClose();
}

TEST(ChannelTransportFakeTest, ScatteredRowsGoEachToItsPlaceAsTheyArrive) {
  // Three rows of 40000 bytes (more than one 64 KiB piece in all), the
  // reply's in key order, each put at its key's place in `out`.
  constexpr size_t kRow = 40000;
  const std::string a(kRow, 'a'), b(kRow, 'b'), c(kRow, 'c');
  FakeChannelServer fake(PullRowsReply(1, a + b + c));
  ChannelTransport channel(std::make_unique<FakeGrpc>(TableFramesOffer(fake)), OneConnection());
  std::string out(3 * kRow, '-');
  const RowsSeen seen =
      PullScattered(channel, absl::MakeSpan(out), {2, 0, 1}, kRow, absl::Now() + kTimeout);
  ASSERT_THAT(seen.status, IsOk());
  EXPECT_TRUE(out == b + c + a);
  EXPECT_EQ(seen.at, out.data());  // placed: the sink is told so by the address
  EXPECT_EQ(channel.replies_read_by_waiters(), 1u);
}

// ---- pulled blocks read into the caller's memory, against a fake server ----

// A reply to call `id` carrying `blocks` (header, content) as a
// GetParamsResponse; `payload_bytes` (when set) is what its header claims.
std::string ParamsReply(uint64_t id, const std::vector<std::pair<v1::Parameter, std::string>>& blocks,
                        std::optional<uint64_t> payload_bytes = std::nullopt) {
  std::string payload;
  for (const auto& [header, content] : blocks) {
    AppendParamsBlockPrefix(&payload, header, content.size());
    payload += content;
  }
  return PartialReply(id, payload_bytes.value_or(payload.size()), 0) + payload;
}

v1::Parameter WHeader(uint32_t floats, const std::string& name = "w") {
  v1::Parameter header;
  header.set_name(name);
  header.set_element_type(v1::FLOAT32);
  header.add_shape(floats);
  header.mutable_block()->set_count(1);
  return header;
}

std::string FloatBytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

// A Client's push+pull of "w" (4 floats) over a fake server answering
// `reply`, into a view of 4 floats between guard bytes: its status, the
// memory (guards included) after, and the bytes read in place.
struct ClientPushPull {
  absl::Status status;
  std::string memory;
  uint64_t in_place = 0;
};
constexpr size_t kGuardBytes = 32;
ClientPushPull PushPullThroughClient(const std::string& reply) {
  ClientPushPull result;
  FakeChannelServer fake(reply);
  auto owned = std::make_unique<ChannelTransport>(std::make_unique<FakeGrpc>(fake.offer()),
                                                  OneConnection());
  ChannelTransport* channel = owned.get();
  std::vector<std::unique_ptr<Transport>> transports;
  transports.push_back(std::move(owned));
  auto client = Client::Create(ClientOptions(), std::move(transports));
  EXPECT_THAT(client.status(), IsOk());
  if (!client.ok()) return result;
  std::string memory(2 * kGuardBytes + 16, '#');
  auto out = Tensor::MutableView(v1::FLOAT32, {4}, memory.data() + kGuardBytes, 16);
  EXPECT_THAT(out.status(), IsOk());
  CallOptions call;
  call.deadline = absl::Now() + kTimeout;
  result.status =
      (*client)->PushPull("w", Tensor::FromValues<float>({4}, {1, 1, 1, 1}), &*out, call);
  result.memory = memory;
  result.in_place = channel->pulled_bytes_in_place();
  return result;
}

std::string Guarded(const std::string& inside) {
  return std::string(kGuardBytes, '#') + inside + std::string(kGuardBytes, '#');
}

TEST(ChannelTransportFakeTest, AClientsPushPullReadsItsBlockStraightIntoTheTensor) {
  const std::string values = FloatBytes({5, 6, 7, 8});
  const ClientPushPull got = PushPullThroughClient(ParamsReply(1, {{WHeader(4), values}}));
  ASSERT_THAT(got.status, IsOk());
  EXPECT_EQ(got.memory, Guarded(values));
  EXPECT_EQ(got.in_place, 16u);
}

TEST(ChannelTransportFakeTest, ARogueBlockFailsTheCallAndWritesNothingOutsideTheTensor) {
  const std::string four = FloatBytes({5, 6, 7, 8});
  const std::string five = FloatBytes({5, 6, 7, 8, 9});
  v1::Parameter offset = WHeader(4);
  offset.mutable_block()->set_offset(2);
  const struct {
    const char* what;
    std::string reply;
    const char* message;
  } cases[] = {
      {"a block of another parameter", ParamsReply(1, {{WHeader(4, "x"), four}}), "does not fit"},
      {"more bytes than the tensor holds", ParamsReply(1, {{WHeader(4), five}}), "does not fit"},
      {"a block past the tensor's end", ParamsReply(1, {{offset, four}}), "does not fit"},
      {"a block of another type", ParamsReply(1, {{[] {
                                                     v1::Parameter h = WHeader(4);
                                                     h.set_element_type(v1::INT32);
                                                     return h;
                                                   }(),
                                                   four}}),
       "does not fit"},
      {"a content length past the reply", [&] {
         std::string payload;
         AppendParamsBlockPrefix(&payload, WHeader(4), 1000);  // 1000 bytes claimed
         payload += four;
         return PartialReply(1, payload.size(), 0) + payload;
       }(),
       "malformed"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const ClientPushPull got = PushPullThroughClient(c.reply);
    EXPECT_THAT(got.status, StatusCodeIs(absl::StatusCode::kDataLoss));
    EXPECT_THAT(std::string(got.status.message()), HasSubstr(c.message));
    EXPECT_EQ(got.memory.substr(0, kGuardBytes), std::string(kGuardBytes, '#'));
    EXPECT_EQ(got.memory.substr(kGuardBytes + 16), std::string(kGuardBytes, '#'));
    EXPECT_EQ(got.in_place, 0u);
  }
}

// A reply to pull `id` of "w" (`floats` floats) that sends its header, the
// block's prefix and `sent` bytes of its content, then stalls.
std::string StalledParamsReply(uint64_t id, uint32_t floats, size_t sent) {
  std::string payload;
  AppendParamsBlockPrefix(&payload, WHeader(floats), floats * sizeof(float));
  const uint64_t payload_bytes = payload.size() + floats * sizeof(float);
  return PartialReply(id, payload_bytes, 0) + payload + std::string(sent, 'p');
}

// A pull of 4000 bytes into `out` from a server that stalled after 10 ended
// with `code` before anything was placed, and `out` stays as it was at the
// return once the server has seen the connection close.
void ExpectEndedWithTheMemoryLetGo(const PulledInto& pulled, absl::StatusCode code,
                                   const std::string& out, FakeChannelServer& fake) {
  EXPECT_THAT(pulled.status, StatusCodeIs(code));
  EXPECT_EQ(pulled.placed, 0);
  const std::string at_return = out;
  EXPECT_EQ(at_return.substr(10), std::string(3990, '-'));
  fake.WaitForClose();
  EXPECT_EQ(out, at_return);
}

TEST(ChannelTransportFakeTest, ADeadlineMidBlockFailsThePullOnceTheMemoryIsLetGo) {
  // The reply's header and 10 of the block's 4000 bytes have come when the
  // deadline passes: the call fails and the connection drops (ending the
  // read into `out`) before the caller is told; nothing is written after.
  for (bool in_group : {true, false}) {
    SCOPED_TRACE(in_group ? "a waiter reads" : "the reader thread reads");
    FakeChannelServer fake(StalledParamsReply(1, 1000, 10));
    ChannelTransport channel(std::make_unique<FakeGrpc>(fake.offer()), OneConnection());
    std::string out(4000, '-');
    const PulledInto pulled = PullInto(channel, Refs("w"), absl::MakeSpan(out),
                                       absl::Now() + absl::Milliseconds(200), in_group);
    ExpectEndedWithTheMemoryLetGo(pulled, absl::StatusCode::kDeadlineExceeded, out, fake);
  }
}

TEST(ChannelTransportFakeTest, CancellingMidBlockFailsThePullOnceTheMemoryIsLetGo) {
  FakeChannelServer fake(StalledParamsReply(1, 1000, 10));
  ChannelTransport channel(std::make_unique<FakeGrpc>(fake.offer()), OneConnection());
  std::string out(4000, '-');
  Cancellation cancel;
  PulledInto pulled;
  std::thread caller([&] {
    Cancellation::Scope scope(&cancel);  // the reader thread reads the reply
    pulled = PullInto(channel, Refs("w"), absl::MakeSpan(out), absl::InfiniteFuture(),
                      /*in_group=*/false);
  });
  fake.WaitForReply();
  cancel.Cancel();
  caller.join();
  ExpectEndedWithTheMemoryLetGo(pulled, absl::StatusCode::kCancelled, out, fake);
}

TEST(ChannelTransportFakeTest, AMalformedReplyIsUnavailable) {
  FakeChannelServer fake(std::string(kReplyHeaderBytes, 'x'));
  ChannelTransport channel(std::make_unique<FakeGrpc>(fake.offer()));
  EXPECT_THAT(PushOver(channel, {1, 1}, {1}), StatusCodeIs(absl::StatusCode::kUnavailable));
  fake.WaitForClose();
}

TEST(ChannelTransportFakeTest, AChannelThatCannotBeReachedFallsBackToGrpc) {
  FakeChannelServer fake;
  v1::OpenChannelResponse wrong = fake.offer();
  wrong.set_tcp_port(1);  // nothing listens there
  ChannelTransport channel(std::make_unique<FakeGrpc>(wrong));
  EXPECT_THAT(PushOver(channel, {1, 1}, {1}),
              testing::StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("fake gRPC push")));
  EXPECT_EQ(channel.route(), "grpc");
}

}  // namespace
}  // namespace pserver
