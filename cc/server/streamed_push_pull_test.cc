// StreamPushPull on a socket pair, with no thread and no timing where the
// order matters: a block storage that looks, as each gradient is applied,
// at how many reply bytes its peer has been sent so far. Every test runs on
// a plain socket (SpillWriter) and through the bulk channel's AEAD layer
// (AeadStream::StartFrame, both ends an AeadStream).
#include "cc/server/streamed_push_pull.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "cc/core/block_storage.h"
#include "cc/core/parameter_store.h"
#include "cc/core/status_macros.h"
#include "cc/core/tables.h"
#include "cc/security/bulk_aead.h"
#include "cc/server/dispatcher.h"
#include "cc/server/service.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;
using Outcome = StreamedPushPull::Outcome;

constexpr uint32_t kBlocks = 4;

// Host storage that calls `on_apply(block index)` before each apply.
class ObservedStorage final : public BlockStorage {
 public:
  ObservedStorage(std::unique_ptr<BlockStorage> inner, uint32_t index,
                  const std::function<void(uint32_t)>* on_apply)
      : inner_(std::move(inner)), index_(index), on_apply_(on_apply) {}
  bool can_apply() const override { return inner_->can_apply(); }
  absl::Status CheckCanApply(const std::string& what) const override {
    return inner_->CheckCanApply(what);
  }
  absl::Status Apply(absl::string_view grad, ElementType grad_type,
                     std::optional<double> global_norm) override {
    if (*on_apply_) (*on_apply_)(index_);
    return inner_->Apply(grad, grad_type, global_norm);
  }
  absl::Status Read(absl::FunctionRef<void(absl::string_view)> read) const override {
    return inner_->Read(read);
  }
  absl::StatusOr<OptimizerState> ExportState() const override { return inner_->ExportState(); }
  absl::Status ImportState(const OptimizerState& state) override {
    return inner_->ImportState(state);
  }
  size_t value_bytes() const override { return inner_->value_bytes(); }
  size_t state_bytes() const override { return inner_->state_bytes(); }
  std::string location() const override { return inner_->location(); }

 private:
  std::unique_ptr<BlockStorage> inner_;
  const uint32_t index_;
  const std::function<void(uint32_t)>* on_apply_;
};

AeadKeys Keys(uint8_t seed) {
  AeadKeys keys;
  for (size_t i = 0; i < kAeadKeyBytes; ++i) keys.key[i] = static_cast<uint8_t>(seed + 5 * i);
  for (size_t i = 0; i < kAeadNoncePrefixBytes; ++i) keys.nonce_prefix[i] = seed;
  return keys;
}

// A shard holding "w": kBlocks float32 blocks of `floats` zeros, SGD with
// learning rate 1, and a socket pair: the server writes to its end, plain
// or (the parameter) sealed by the AEAD layer, and the peer reads `peer_`.
class StreamedPushPullTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (Sealed() && !BulkAeadAvailable()) GTEST_SKIP() << "no AES-NI: no AEAD layer here";
    Init(1024);
  }

  static bool Sealed() { return GetParam(); }
  // Bytes the AEAD layer adds to a frame of `payload` bytes (none on a plain
  // socket): a record for the reply header, one per kSealRecordBytes after.
  static size_t Overhead(size_t payload) {
    if (!Sealed()) return 0;
    const size_t records = 1 + (payload + kSealRecordBytes - 1) / kSealRecordBytes;
    return records * (kAeadHeaderBytes + kAeadTagBytes);
  }

  void Init(size_t floats) {
    floats_ = floats;
    StoreOptions options;
    options.storage_factory = [this](const BlockStorageSpec& spec, std::string values)
        -> absl::StatusOr<std::unique_ptr<BlockStorage>> {
      PS_ASSIGN_OR_RETURN(std::unique_ptr<BlockStorage> host,
                          MakeHostBlockStorage(spec, std::move(values)));
      return std::make_unique<ObservedStorage>(std::move(host), spec.ref.index(), &on_apply_);
    };
    dispatcher_.reset();  // before the store it uses
    store_ = std::make_unique<ParameterStore>(options);
    dispatcher_ = std::make_unique<Dispatcher>(store_.get(), &tables_, 0);
    v1::ParameterConfig sgd;
    sgd.mutable_optimizer()->mutable_sgd();
    sgd.mutable_learning_rate()->set_learning_rate(1.0);
    for (uint32_t i = 0; i < kBlocks; ++i) {
      v1::Parameter block;
      block.set_name("w");
      block.set_element_type(v1::FLOAT32);
      block.add_shape(static_cast<int64_t>(kBlocks * floats_));
      *block.mutable_block() = Ref(i).block();
      block.set_content(std::string(floats_ * sizeof(float), '\0'));
      ASSERT_OK(store_->Init(std::move(block), sgd));
    }
    store_->FinishInit();
    Reconnect();
  }

  void Reconnect() {
    CloseServer();
    ClosePeer();
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    SetSocketBuffers(fds[0]);
    SetSocketBuffers(fds[1]);
    peer_ = fds[1];
    if (Sealed()) {
      // The AEAD layer runs on non-blocking sockets; it does not own them.
      for (int fd : fds) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
      server_fd_ = fds[0];
      server_aead_ = std::make_unique<AeadStream>(fds[0], Keys(1), Keys(2));
      peer_aead_ = std::make_unique<AeadStream>(fds[1], Keys(2), Keys(1));
    } else {
      server_end_ = std::make_unique<SocketStream>(fds[0]);
    }
  }

  void CloseServer() {
    server_end_.reset();
    server_aead_.reset();
    if (server_fd_ >= 0) close(server_fd_);
    server_fd_ = -1;
  }

  void ClosePeer() {
    peer_aead_.reset();
    if (peer_ >= 0) close(peer_);
    peer_ = -1;
  }

  void TearDown() override {
    CloseServer();
    ClosePeer();
  }

  // The server's end of the connection.
  ByteStream& ServerStream() {
    if (Sealed()) return *server_aead_;
    return *server_end_;
  }

  v1::ParamRef Ref(uint32_t i) const {
    v1::ParamRef ref;
    ref.set_name("w");
    ref.mutable_block()->set_index(i);
    ref.mutable_block()->set_count(kBlocks);
    ref.mutable_block()->set_offset(i * floats_);
    return ref;
  }

  // The gradient of block i: value j is i + 1 + j / 1024.
  std::vector<float> Gradient(uint32_t i) const {
    std::vector<float> values(floats_);
    for (size_t j = 0; j < values.size(); ++j) values[j] = static_cast<float>(i + 1) + j / 1024.0f;
    return values;
  }

  // A PushPullRequest of `grads` (block i: grads[i]) reading `reads`, as
  // request id (7, sequence).
  grpc::ByteBuffer Request(const std::vector<std::vector<float>>& grads,
                           const std::vector<uint32_t>& reads, uint64_t sequence) {
    std::vector<GradientView> views;
    for (uint32_t i = 0; i < grads.size(); ++i) {
      GradientView view;
      view.name = "w";
      view.type = v1::FLOAT32;
      view.block = Ref(i).block();
      view.content = absl::string_view(reinterpret_cast<const char*>(grads[i].data()),
                                       grads[i].size() * sizeof(float));
      views.push_back(view);
    }
    std::vector<v1::ParamRef> refs;
    for (uint32_t i : reads) refs.push_back(Ref(i));
    PayloadLease* lease = PayloadLease::Create([] {});
    grpc::ByteBuffer encoded = EncodePushRequest(views, refs, lease, /*client_id=*/7, sequence);
    // Into one buffer of its own, as the bulk channel reads a frame.
    std::vector<grpc::Slice> slices;
    EXPECT_TRUE(encoded.Dump(&slices).ok());
    std::string bytes;
    for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    slices.clear();
    encoded.Clear();
    lease->Release();
    grpc::Slice one(bytes.data(), bytes.size());
    return grpc::ByteBuffer(&one, 1);
  }

  StreamedPushPull Serve(const grpc::ByteBuffer& request) {
    ReplyHeader reply;
    reply.call_id = 5;
    ReplyHold hold;
    if (!Sealed()) return StreamPushPull(*dispatcher_, request, nullptr, reply, *server_end_, &hold);
    return StreamPushPull(
        *dispatcher_, request, nullptr, reply,
        [this](uint64_t head_bytes, uint64_t frame_bytes) {
          return server_aead_->StartFrame(head_bytes, frame_bytes);
        },
        &hold);
  }

  // What the server sends while `write` runs, as it is on the wire (sealed
  // or not): read by a thread of its own until the server's end is closed
  // for writing after `write` (or nothing came for 30 s).
  std::string Wire(const std::function<void()>& write) {
    std::string out;
    std::thread reader([&] {
      std::vector<char> buffer(64 << 10);
      while (true) {
        pollfd ready{peer_, POLLIN, 0};
        if (poll(&ready, 1, 30000) <= 0) break;
        const ssize_t got = read(peer_, buffer.data(), buffer.size());
        if (got > 0) {
          out.append(buffer.data(), static_cast<size_t>(got));
        } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
          break;
        }
      }
    });
    write();
    shutdown(Sealed() ? server_fd_ : server_end_->fd(), SHUT_WR);
    reader.join();
    return out;
  }

  size_t Queued() const {
    int n = 0;
    EXPECT_EQ(ioctl(peer_, FIONREAD, &n), 0);
    return static_cast<size_t>(n);
  }

  // Reads one reply frame from the peer: its header and decoded payload.
  void ReadReply(ReplyHeader* header, ParamsResponse* response) {
    char encoded[kReplyHeaderBytes];
    ASSERT_TRUE(ReadFully(encoded, sizeof(encoded)));
    absl::StatusOr<ReplyHeader> decoded = DecodeReplyHeader(encoded, uint64_t{1} << 30);
    ASSERT_OK(decoded.status());
    *header = *decoded;
    std::string rest(decoded->message_bytes + decoded->payload_bytes, '\0');
    ASSERT_TRUE(ReadFully(rest.data(), rest.size()));
    grpc::Slice slice(rest.data() + decoded->message_bytes, decoded->payload_bytes);
    ASSERT_OK(DecodeParamsResponse(grpc::ByteBuffer(&slice, 1), response));
  }

  // Reads `n` bytes the server sent (opened, when sealed).
  bool ReadFully(char* dest, size_t n) {
    if (Sealed()) return peer_aead_->Read(dest, n).ok();
    for (size_t done = 0; done < n;) {
      const ssize_t got = read(peer_, dest + done, n - done);
      if (got <= 0) return false;
      done += static_cast<size_t>(got);
    }
    return true;
  }

  std::vector<float> Values(uint32_t i) {
    v1::Parameter param;
    EXPECT_OK(store_->Get(Ref(i), &param));
    std::vector<float> out(param.content().size() / sizeof(float));
    std::memcpy(out.data(), param.content().data(), param.content().size());
    return out;
  }

  std::vector<float> Content(const ParamsResponse& response, size_t j) {
    std::string bytes;
    for (absl::string_view part : response.contents[j]) bytes.append(part.data(), part.size());
    std::vector<float> out(bytes.size() / sizeof(float));
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }

  size_t floats_ = 0;
  std::function<void(uint32_t)> on_apply_;
  Tables tables_;
  std::unique_ptr<ParameterStore> store_;
  std::unique_ptr<Dispatcher> dispatcher_;
  std::unique_ptr<SocketStream> server_end_;  // plain
  int server_fd_ = -1;                        // sealed: the socket and its two ends
  std::unique_ptr<AeadStream> server_aead_;
  std::unique_ptr<AeadStream> peer_aead_;
  int peer_ = -1;
};

std::vector<float> Negated(std::vector<float> v) {
  for (float& x : v) x = -x;
  return v;
}

TEST_P(StreamedPushPullTest, EachPulledBlockIsSentBeforeTheNextIsApplied) {
  std::vector<std::vector<float>> grads;
  for (uint32_t i = 0; i < kBlocks; ++i) grads.push_back(Gradient(i));
  std::vector<size_t> queued_at_apply(kBlocks, 0);
  on_apply_ = [&](uint32_t i) { queued_at_apply[i] = Queued(); };
  const StreamedPushPull result = Serve(Request(grads, {0, 1, 2, 3}, /*sequence=*/1));
  on_apply_ = nullptr;
  ASSERT_EQ(result.outcome, Outcome::kWritten);
  ASSERT_OK(result.status);
  const size_t content = floats_ * sizeof(float);
  // Block 0 applied with only the reply header sent (its headers are small:
  // < 200 bytes a block); block i applied once blocks 0..i-1 were all sent,
  // and nothing of block i itself (sealed: what the records add, too).
  const size_t overhead = Overhead(kBlocks * (content + 200));
  EXPECT_GE(queued_at_apply[0], kReplyHeaderBytes);
  EXPECT_LT(queued_at_apply[0], kReplyHeaderBytes + 200 + overhead);
  for (uint32_t i = 1; i < kBlocks; ++i) {
    EXPECT_GE(queued_at_apply[i], kReplyHeaderBytes + i * content) << "block " << i;
    EXPECT_LT(queued_at_apply[i], kReplyHeaderBytes + i * (content + 200) + 200 + overhead)
        << "block " << i;
  }
  ReplyHeader header;
  ParamsResponse response;
  ReadReply(&header, &response);
  EXPECT_EQ(header.call_id, 5u);
  EXPECT_EQ(header.code, absl::StatusCode::kOk);
  ASSERT_EQ(response.headers.size(), kBlocks);
  for (uint32_t i = 0; i < kBlocks; ++i) {
    EXPECT_EQ(response.headers[i].block().index(), i);
    // The value after this push (SGD, rate 1, from zeros), as stored.
    EXPECT_TRUE(Content(response, i) == Negated(grads[i])) << "block " << i;
    EXPECT_TRUE(Values(i) == Negated(grads[i])) << "block " << i;
  }
}

TEST_P(StreamedPushPullTest, BlocksThePushDoesNotTouchGoOutBeforeAnythingIsApplied) {
  // Pushes blocks 0 and 1, reads 2, 3, 0, 1: blocks 2 and 3 go out once the
  // push passed its checks, before block 0 is applied.
  const std::vector<std::vector<float>> grads = {Gradient(0), Gradient(1)};
  std::vector<size_t> queued_at_apply(2, 0);
  on_apply_ = [&](uint32_t i) { queued_at_apply[i] = Queued(); };
  const StreamedPushPull result = Serve(Request(grads, {2, 3, 0, 1}, /*sequence=*/1));
  on_apply_ = nullptr;
  ASSERT_EQ(result.outcome, Outcome::kWritten);
  ASSERT_OK(result.status);
  const size_t content = floats_ * sizeof(float);
  EXPECT_GE(queued_at_apply[0], kReplyHeaderBytes + 2 * content);
  EXPECT_LT(queued_at_apply[0],
            kReplyHeaderBytes + 2 * (content + 200) + 200 + Overhead(4 * (content + 200)));
  EXPECT_GE(queued_at_apply[1], kReplyHeaderBytes + 3 * content);
  ReplyHeader header;
  ParamsResponse response;
  ReadReply(&header, &response);
  ASSERT_EQ(response.headers.size(), 4u);
  const uint32_t order[] = {2, 3, 0, 1};
  for (size_t j = 0; j < 4; ++j) {
    EXPECT_EQ(response.headers[j].block().index(), order[j]);
    const std::vector<float> want =
        order[j] < 2 ? Negated(grads[order[j]]) : std::vector<float>(floats_, 0.0f);
    EXPECT_TRUE(Content(response, j) == want) << "read " << j;
  }
}

TEST_P(StreamedPushPullTest, TheReplyKeepsTheOrderOfTheReads) {
  // Read 3 first: it waits for the last gradient, and the reads after it
  // with it.
  std::vector<std::vector<float>> grads;
  for (uint32_t i = 0; i < kBlocks; ++i) grads.push_back(Gradient(i));
  std::vector<size_t> queued_at_apply(kBlocks, 0);
  on_apply_ = [&](uint32_t i) { queued_at_apply[i] = Queued(); };
  const StreamedPushPull result = Serve(Request(grads, {3, 0, 1}, /*sequence=*/1));
  on_apply_ = nullptr;
  ASSERT_EQ(result.outcome, Outcome::kWritten);
  ASSERT_OK(result.status);
  for (uint32_t i = 0; i < kBlocks; ++i) {
    EXPECT_LT(queued_at_apply[i], kReplyHeaderBytes + 200 + Overhead(4 * (floats_ * 4 + 200)))
        << "block " << i;
  }
  ReplyHeader header;
  ParamsResponse response;
  ReadReply(&header, &response);
  ASSERT_EQ(response.headers.size(), 3u);
  const uint32_t order[] = {3, 0, 1};
  for (size_t j = 0; j < 3; ++j) {
    EXPECT_EQ(response.headers[j].block().index(), order[j]);
    EXPECT_TRUE(Content(response, j) == Negated(grads[order[j]]));
  }
}

TEST_P(StreamedPushPullTest, ANaNInTheLastBlockWritesNoByteAndAppliesNothing) {
  std::vector<std::vector<float>> grads;
  for (uint32_t i = 0; i < kBlocks; ++i) grads.push_back(Gradient(i));
  grads.back().back() = std::nanf("");
  bool applied = false;
  on_apply_ = [&](uint32_t) { applied = true; };
  const StreamedPushPull result = Serve(Request(grads, {0, 1, 2, 3}, /*sequence=*/1));
  on_apply_ = nullptr;
  EXPECT_EQ(result.outcome, Outcome::kAnswered);
  EXPECT_THAT(result.status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is NaN")));
  EXPECT_FALSE(applied);
  EXPECT_EQ(Queued(), 0u);
  for (uint32_t i = 0; i < kBlocks; ++i) {
    const std::vector<float> values = Values(i);
    EXPECT_TRUE(std::all_of(values.begin(), values.end(), [](float v) { return v == 0; }));
  }
  // The listener answers it on the same stream, which goes on (sealed: no
  // record was begun): the answer, then a good push+pull's reply, arrive whole.
  ReplyHeader answer;
  answer.call_id = 5;
  ASSERT_OK(WriteReplyFrame(ServerStream(), answer, result.status));
  char encoded[kReplyHeaderBytes];
  ASSERT_TRUE(ReadFully(encoded, sizeof(encoded)));
  absl::StatusOr<ReplyHeader> refused = DecodeReplyHeader(encoded, uint64_t{1} << 30);
  ASSERT_OK(refused.status());
  EXPECT_EQ(refused->code, absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused->payload_bytes, 0u);
  std::string message(refused->message_bytes, '\0');
  ASSERT_TRUE(ReadFully(message.data(), message.size()));
  EXPECT_THAT(message, HasSubstr("is NaN"));
  grads.back().back() = 0;
  const StreamedPushPull good = Serve(Request(grads, {0, 1, 2, 3}, /*sequence=*/2));
  EXPECT_EQ(good.outcome, Outcome::kWritten);
  EXPECT_OK(good.status);
  ReplyHeader header;
  ParamsResponse response;
  ReadReply(&header, &response);
  EXPECT_EQ(header.code, absl::StatusCode::kOk);
  ASSERT_EQ(response.headers.size(), kBlocks);
  for (uint32_t i = 0; i < kBlocks; ++i) {
    EXPECT_TRUE(Content(response, i) == Negated(grads[i])) << "block " << i;
  }
}

TEST_P(StreamedPushPullTest, TheStreamedReplyIsOnTheWireByteForByteTheUnstreamedOne) {
  // 512 KiB blocks: records of kSealRecordBytes that blocks and their
  // headers straddle, and more than the socket holds unread.
  Init(size_t{1} << 17);
  std::vector<std::vector<float>> grads;
  for (uint32_t i = 0; i < kBlocks; ++i) grads.push_back(Gradient(i));
  const grpc::ByteBuffer request = Request(grads, {2, 0, 3, 1}, /*sequence=*/1);
  StreamedPushPull result;
  const std::string streamed = Wire([&] { result = Serve(request); });
  ASSERT_EQ(result.outcome, Outcome::kWritten);
  ASSERT_OK(result.status);
  // The same push on the same values, served as the listener serves a frame
  // it does not stream, on a new connection (sealed: the same keys and
  // record counters, so the same records seal to the same bytes).
  Init(floats_);
  ReplyHeader reply;
  reply.call_id = 5;
  grpc::ByteBuffer response;
  ReplyHold hold;
  const std::string unstreamed = Wire([&] {
    ASSERT_OK(FindBulkMethod("PushPull")(*dispatcher_, request, &response, &hold));
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(response.Dump(&slices).ok());
    std::vector<absl::string_view> parts;
    for (const grpc::Slice& slice : slices) {
      parts.emplace_back(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    ASSERT_OK(WriteReplyFrame(ServerStream(), reply, absl::OkStatus(), parts));
  });
  // All but the reply header (it carries the time it was processed), and
  // its record (sealed: the record's length is the same, its tag is not).
  const size_t header_bytes =
      Sealed() ? kAeadHeaderBytes + kReplyHeaderBytes + kAeadTagBytes : kReplyHeaderBytes;
  ASSERT_EQ(streamed.size(), unstreamed.size());
  ASSERT_GT(streamed.size(), kBlocks * floats_ * sizeof(float));
  EXPECT_TRUE(streamed.substr(header_bytes) == unstreamed.substr(header_bytes));
  if (Sealed()) {
    EXPECT_EQ(streamed.substr(0, kAeadHeaderBytes), unstreamed.substr(0, kAeadHeaderBytes));
  }
}

TEST_P(StreamedPushPullTest, AReaderGoneMidReplyLeavesThePushAppliedOnceAndItsRetryAnswered) {
  Init(size_t{1} << 18);  // 1 MiB blocks: more than the socket takes unread
  std::vector<std::vector<float>> grads;
  for (uint32_t i = 0; i < kBlocks; ++i) grads.push_back(Gradient(i));
  // The reader leaves after block 0 was applied and sent.
  on_apply_ = [&](uint32_t i) {
    if (i == 1) ClosePeer();
  };
  const StreamedPushPull gone = Serve(Request(grads, {0, 1, 2, 3}, /*sequence=*/1));
  on_apply_ = nullptr;
  EXPECT_EQ(gone.outcome, Outcome::kWritten);
  EXPECT_THAT(gone.status, StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  for (uint32_t i = 0; i < kBlocks; ++i) EXPECT_TRUE(Values(i) == Negated(grads[i]));
  // The client's retry (same id, a new connection) is answered with the
  // values and not applied again.
  Reconnect();
  std::thread reader;
  ReplyHeader header;
  ParamsResponse response;
  reader = std::thread([&] { ReadReply(&header, &response); });
  const StreamedPushPull retry = Serve(Request(grads, {0, 1, 2, 3}, /*sequence=*/1));
  reader.join();
  EXPECT_EQ(retry.outcome, Outcome::kWritten);
  EXPECT_OK(retry.status);
  EXPECT_EQ(dispatcher_->duplicates_ignored(), 1u);
  ASSERT_EQ(response.headers.size(), kBlocks);
  for (uint32_t i = 0; i < kBlocks; ++i) {
    EXPECT_TRUE(Content(response, i) == Negated(grads[i])) << "block " << i;
    EXPECT_TRUE(Values(i) == Negated(grads[i])) << "block " << i;
  }
}

TEST_P(StreamedPushPullTest, ASlowReaderGetsEveryBlockWhole) {
  Init(size_t{1} << 18);
  std::vector<std::vector<float>> grads;
  for (uint32_t i = 0; i < kBlocks; ++i) grads.push_back(Gradient(i));
  // Nobody reads while the push is applied: what the socket does not take
  // is copied, and written once the blocks' locks are let go.
  ReplyHeader header;
  ParamsResponse response;
  absl::Notification applied;
  on_apply_ = [&](uint32_t i) {
    if (i == kBlocks - 1) applied.Notify();
  };
  std::thread reader([&] {
    applied.WaitForNotification();
    ReadReply(&header, &response);
  });
  const StreamedPushPull result = Serve(Request(grads, {0, 1, 2, 3}, /*sequence=*/1));
  reader.join();
  on_apply_ = nullptr;
  EXPECT_EQ(result.outcome, Outcome::kWritten);
  EXPECT_OK(result.status);
  ASSERT_EQ(response.headers.size(), kBlocks);
  for (uint32_t i = 0; i < kBlocks; ++i) {
    EXPECT_TRUE(Content(response, i) == Negated(grads[i])) << "block " << i;
  }
}

TEST_P(StreamedPushPullTest, APushThatFailsPastItsChecksLeavesTheReplyShortOfItsLastByte) {
  // The push is applied, but its answer is lost (as when a fence closes
  // after the apply): the client must not get a whole reply.
  DispatcherHooks hooks;
  hooks.drop_reply_after_apply_every_n = 1;
  dispatcher_ = std::make_unique<Dispatcher>(store_.get(), &tables_, 0, hooks);
  std::vector<std::vector<float>> grads;
  for (uint32_t i = 0; i < kBlocks; ++i) grads.push_back(Gradient(i));
  const StreamedPushPull result = Serve(Request(grads, {0, 1, 2, 3}, /*sequence=*/1));
  EXPECT_EQ(result.outcome, Outcome::kWritten);
  EXPECT_THAT(result.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("fault injection")));
  // Everything but the frame's last byte went out while the push was applied
  // (sealed: and the tag of its record).
  const size_t queued = Queued();
  char encoded[kReplyHeaderBytes];
  ASSERT_TRUE(ReadFully(encoded, sizeof(encoded)));
  absl::StatusOr<ReplyHeader> header = DecodeReplyHeader(encoded, uint64_t{1} << 30);
  ASSERT_OK(header.status());
  EXPECT_EQ(header->code, absl::StatusCode::kOk);
  if (Sealed()) {
    EXPECT_EQ(queued, Overhead(0) + kReplyHeaderBytes + kAeadHeaderBytes + header->payload_bytes - 1);
    // The listener drops the connection: nothing of that record reaches the
    // reader.
    ServerStream().Shutdown();
    std::string payload(header->payload_bytes, '\0');
    EXPECT_FALSE(ReadFully(payload.data(), payload.size()));
    EXPECT_TRUE(std::all_of(payload.begin(), payload.end(), [](char c) { return c == 0; }));
  } else {
    EXPECT_EQ(queued, kReplyHeaderBytes + header->payload_bytes - 1);
  }
  for (uint32_t i = 0; i < kBlocks; ++i) EXPECT_TRUE(Values(i) == Negated(grads[i]));
}

// Where it does not apply, nothing is done: a read that would fail (served
// as before: the push applied, then the read's error), a push shipped to
// backups first.
class PassThroughShipper : public WriteShipper {
 public:
  absl::Status Write(absl::string_view, absl::FunctionRef<SharedBytes()>,
                     absl::FunctionRef<absl::Status(absl::FunctionRef<void()> ship)> apply) override {
    return apply([] {});
  }
};

TEST_P(StreamedPushPullTest, AFailingReadOrAShippedPushIsLeftToTheOrdinaryPath) {
  std::vector<std::vector<float>> grads = {Gradient(0)};
  grpc::ByteBuffer unknown = Request(grads, {0}, /*sequence=*/1);
  {
    // A read of a block this shard does not hold.
    v1::ParamRef missing;
    missing.set_name("nothing");
    std::vector<GradientView> none;
    PayloadLease* lease = PayloadLease::Create([] {});
    const std::vector<v1::ParamRef> refs = {missing};
    grpc::ByteBuffer encoded = EncodePushRequest(none, refs, lease, 7, 2);
    EXPECT_EQ(Serve(encoded).outcome, Outcome::kNotStreamed);
    encoded.Clear();
    lease->Release();
  }
  PassThroughShipper shipper;
  dispatcher_->SetShipper(&shipper);
  EXPECT_EQ(Serve(unknown).outcome, Outcome::kNotStreamed);
  dispatcher_->SetShipper(nullptr);
  EXPECT_EQ(Queued(), 0u);
  const std::vector<float> values = Values(0);
  EXPECT_TRUE(std::all_of(values.begin(), values.end(), [](float v) { return v == 0; }));
}

INSTANTIATE_TEST_SUITE_P(PlainAndSealed, StreamedPushPullTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Sealed" : "Plain";
                         });

}  // namespace
}  // namespace pserver
