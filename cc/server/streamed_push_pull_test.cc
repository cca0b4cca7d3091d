// StreamPushPull on a socket pair, with no thread and no timing where the
// order matters: a block storage that looks, as each gradient is applied,
// at how many reply bytes its peer has been sent so far.
#include "cc/server/streamed_push_pull.h"

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
#include "cc/server/dispatcher.h"
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

// A shard holding "w": kBlocks float32 blocks of `floats` zeros, SGD with
// learning rate 1, and a socket pair: the server writes to `server_end`.
class StreamedPushPullTest : public ::testing::Test {
 protected:
  void SetUp() override { Init(1024); }

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
    if (peer_ >= 0) close(peer_);
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    SetSocketBuffers(fds[0]);
    SetSocketBuffers(fds[1]);
    server_end_ = std::make_unique<SocketStream>(fds[0]);
    peer_ = fds[1];
  }

  void TearDown() override {
    if (peer_ >= 0) close(peer_);
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
    return StreamPushPull(*dispatcher_, request, nullptr, reply, *server_end_, &hold);
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

  bool ReadFully(char* dest, size_t n) {
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
  std::unique_ptr<SocketStream> server_end_;
  int peer_ = -1;
};

std::vector<float> Negated(std::vector<float> v) {
  for (float& x : v) x = -x;
  return v;
}

TEST_F(StreamedPushPullTest, EachPulledBlockIsSentBeforeTheNextIsApplied) {
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
  // and nothing of block i itself.
  EXPECT_GE(queued_at_apply[0], kReplyHeaderBytes);
  EXPECT_LT(queued_at_apply[0], kReplyHeaderBytes + 200);
  for (uint32_t i = 1; i < kBlocks; ++i) {
    EXPECT_GE(queued_at_apply[i], kReplyHeaderBytes + i * content) << "block " << i;
    EXPECT_LT(queued_at_apply[i], kReplyHeaderBytes + i * (content + 200) + 200) << "block " << i;
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

TEST_F(StreamedPushPullTest, BlocksThePushDoesNotTouchGoOutBeforeAnythingIsApplied) {
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
  EXPECT_LT(queued_at_apply[0], kReplyHeaderBytes + 2 * (content + 200) + 200);
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

TEST_F(StreamedPushPullTest, TheReplyKeepsTheOrderOfTheReads) {
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
    EXPECT_LT(queued_at_apply[i], kReplyHeaderBytes + 200) << "block " << i;
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

TEST_F(StreamedPushPullTest, ANaNInTheLastBlockWritesNoByteAndAppliesNothing) {
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
}

TEST_F(StreamedPushPullTest, AReaderGoneMidReplyLeavesThePushAppliedOnceAndItsRetryAnswered) {
  Init(size_t{1} << 18);  // 1 MiB blocks: more than the socket takes unread
  std::vector<std::vector<float>> grads;
  for (uint32_t i = 0; i < kBlocks; ++i) grads.push_back(Gradient(i));
  // The reader leaves after block 0 was applied and sent.
  on_apply_ = [&](uint32_t i) {
    if (i == 1) {
      close(peer_);
      peer_ = -1;
    }
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

TEST_F(StreamedPushPullTest, ASlowReaderGetsEveryBlockWhole) {
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

TEST_F(StreamedPushPullTest, APushThatFailsPastItsChecksLeavesTheReplyShortOfItsLastByte) {
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
  // Everything but the frame's last byte went out while the push was applied.
  char encoded[kReplyHeaderBytes];
  ASSERT_TRUE(ReadFully(encoded, sizeof(encoded)));
  absl::StatusOr<ReplyHeader> header = DecodeReplyHeader(encoded, uint64_t{1} << 30);
  ASSERT_OK(header.status());
  EXPECT_EQ(header->code, absl::StatusCode::kOk);
  EXPECT_EQ(Queued(), header->payload_bytes - 1);
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

TEST_F(StreamedPushPullTest, AFailingReadOrAShippedPushIsLeftToTheOrdinaryPath) {
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

}  // namespace
}  // namespace pserver
