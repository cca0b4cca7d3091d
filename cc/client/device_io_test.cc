// DeviceIo's staging pipeline against a LocalCluster, over gRPC and in
// process, with HostMemorySpace standing in for the device (runs
// everywhere); then the CUDA forms, which skip without a device.
#include "cc/client/device_io.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cc/client/client.h"
#include "cc/cuda/buffer.h"
#include "cc/cuda/device.h"
#include "cc/server/in_process_transport.h"
#include "cc/server/local_cluster.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

#define SKIP_WITHOUT_CUDA_DEVICE()                                                     \
  do {                                                                                 \
    absl::StatusOr<int> count_ = cuda::CudaDeviceCount();                              \
    if (!count_.ok()) GTEST_SKIP() << "no CUDA device: " << count_.status().message(); \
  } while (0)

// Forwards to another transport; bulk calls take at least `delay` (a slow
// network) and their start and end times are recorded.
// Orders network calls against the copies of a DeviceIo pipeline, so that a
// test can tell whether copies overlap network calls from the order of
// events alone, never from wall-clock times. A chunk's calls are held until
// `copies_needed(chunk)` copies have started, and copy k does not start
// before the first call of `chunk_before(k)` was issued (-1: none); each hold
// gives up after kMaxHold, so that a pipeline that does not overlap fails the
// test (held_too_long) instead of hanging it. Every copy records whether a
// call was on the network when it started.
class OverlapGate {
 public:
  static constexpr absl::Duration kMaxHold = absl::Seconds(10);

  // `blocks_per_chunk`: a call for block b belongs to chunk b / blocks_per_chunk.
  void Reset(int blocks_per_chunk, std::function<int(int chunk)> copies_needed,
             std::function<int(int copy)> chunk_before) {
    absl::MutexLock lock(&mu_);
    blocks_per_chunk_ = blocks_per_chunk;
    copies_needed_ = std::move(copies_needed);
    chunk_before_ = std::move(chunk_before);
    chunks_issued_.clear();
    copies_started_ = in_flight_ = copies_overlapping_ = held_too_long_ = 0;
  }
  // A call for `block` was issued; returns its chunk.
  int CallIssued(uint32_t block) {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
    const int chunk = static_cast<int>(block) / blocks_per_chunk_;
    chunks_issued_.insert(chunk);
    return chunk;
  }
  // Blocks until the chunk's copies have started; then the call is done.
  void HoldUntilReleased(int chunk) {
    absl::MutexLock lock(&mu_);
    const int needed = copies_needed_ ? copies_needed_(chunk) : 0;
    auto released = [&] { return copies_started_ >= needed; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&released), kMaxHold)) ++held_too_long_;
    --in_flight_;
  }
  // Blocks until the call this copy must overlap was issued.
  void CopyStarting() {
    absl::MutexLock lock(&mu_);
    const int chunk = chunk_before_ ? chunk_before_(copies_started_) : -1;
    auto issued = [&] { return chunk < 0 || chunks_issued_.count(chunk) > 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&issued), kMaxHold)) ++held_too_long_;
    if (in_flight_ > 0) ++copies_overlapping_;
    ++copies_started_;
  }
  int copies_overlapping() const {
    absl::MutexLock lock(&mu_);
    return copies_overlapping_;
  }
  int held_too_long() const {
    absl::MutexLock lock(&mu_);
    return held_too_long_;
  }

 private:
  mutable absl::Mutex mu_;
  int blocks_per_chunk_ ABSL_GUARDED_BY(mu_) = 1;
  std::function<int(int)> copies_needed_ ABSL_GUARDED_BY(mu_);
  std::function<int(int)> chunk_before_ ABSL_GUARDED_BY(mu_);
  std::set<int> chunks_issued_ ABSL_GUARDED_BY(mu_);
  int copies_started_ ABSL_GUARDED_BY(mu_) = 0;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int copies_overlapping_ ABSL_GUARDED_BY(mu_) = 0;
  int held_too_long_ ABSL_GUARDED_BY(mu_) = 0;
};

// A transport whose bulk calls finish no sooner than `delay` after they
// start, or, with a gate, once the gate releases them.
class SlowTransport : public Transport {
 public:
  SlowTransport(std::unique_ptr<Transport> inner, absl::Duration delay,
                OverlapGate* gate = nullptr)
      : inner_(std::move(inner)), delay_(delay), gate_(gate) {}
  ~SlowTransport() override {
    absl::MutexLock lock(&mu_);
    for (std::thread& t : held_) t.join();
  }

  const std::string& address() const override { return inner_->address(); }
  void Call(absl::string_view method, const google::protobuf::Message& request,
            google::protobuf::Message* response, absl::Time d, Done done) override {
    inner_->Call(method, request, response, d, std::move(done));
  }
  void Push(const RequestId& id, absl::Span<const GradientView> g, absl::Time d, Done done,
            TraceRecorder* t) override {
    inner_->Push(id, g, d, Slow(std::move(done), g[0].block.index()), t);
  }
  void Pull(absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time d, Done done,
            TraceRecorder* t) override {
    inner_->Pull(refs, std::move(sink), d, Slow(std::move(done), refs[0].block().index()), t);
  }
  void PushPull(const RequestId& id, absl::Span<const GradientView> g,
                absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time d, Done done,
                TraceRecorder* t) override {
    inner_->PushPull(id, g, refs, std::move(sink), d, Slow(std::move(done), g[0].block.index()), t);
  }

 private:
  // `block`: the first block the call carries.
  Done Slow(Done done, uint32_t block) {
    if (gate_ != nullptr) {
      // Held on a thread of its own: the thread that completes the call may
      // be one the pipeline needs for another chunk.
      const int chunk = gate_->CallIssued(block);
      return [this, chunk, done = std::move(done)](absl::Status status) mutable {
        absl::MutexLock lock(&mu_);
        held_.emplace_back([gate = gate_, chunk, done = std::move(done), status]() mutable {
          gate->HoldUntilReleased(chunk);
          done(std::move(status));
        });
      };
    }
    const absl::Time started = absl::Now();
    return [this, started, done = std::move(done)](absl::Status status) {
      absl::SleepFor(delay_ - (absl::Now() - started));
      done(std::move(status));
    };
  }

  std::unique_ptr<Transport> inner_;
  const absl::Duration delay_;
  OverlapGate* const gate_;
  absl::Mutex mu_;
  std::vector<std::thread> held_ ABSL_GUARDED_BY(mu_);
};

enum class Via { kGrpc, kInProcess };

std::vector<float> Ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>((i * 7919) % 1000) / 1000.f;
  return v;
}

std::string BytesOf(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

v1::ParameterConfig Sgd(double lr, double clip_norm = 0) {
  v1::ParameterConfig config;
  config.mutable_optimizer()->mutable_sgd();
  config.mutable_learning_rate()->set_learning_rate(lr);
  if (clip_norm > 0) config.mutable_clipping()->set_clip_norm(clip_norm);
  return config;
}

class DeviceIoTest : public ::testing::TestWithParam<Via> {
 protected:
  // 3 servers, 4 KiB blocks: a parameter of 10000 floats is 10 blocks.
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(cluster_, LocalCluster::Start(3));
    options_.servers = cluster_->addresses();
    options_.block_bytes = 4096;
    options_.timeout = absl::Seconds(20);
    client_ = NewClient();
    ASSERT_NE(client_, nullptr);
  }

  std::unique_ptr<Client> NewClient(absl::Duration network_delay = absl::ZeroDuration(),
                                    OverlapGate* gate = nullptr) {
    absl::StatusOr<std::unique_ptr<Client>> client;
    if (network_delay <= absl::ZeroDuration() && gate == nullptr) {
      client = GetParam() == Via::kGrpc ? Client::Connect(options_)
                                        : Client::Create(options_, InProcessTransports(*cluster_));
    } else {
      std::vector<std::unique_ptr<Transport>> transports = InProcessTransports(*cluster_);
      for (auto& t : transports) {
        t = std::make_unique<SlowTransport>(std::move(t), network_delay, gate);
      }
      client = Client::Create(options_, std::move(transports));
    }
    EXPECT_OK(client);
    return client.ok() ? *std::move(client) : nullptr;
  }

  // Initializes each of `names` to `value`, then finishes initialization.
  void Init(const std::vector<std::string>& names, const std::vector<float>& value,
            const v1::ParameterConfig& config) {
    for (const std::string& name : names) {
      ASSERT_OK(client_->InitParam(name, Tensor::FromValues<float>({int64_t(value.size())}, value),
                                   config));
    }
    ASSERT_OK(client_->FinishInitParams());
  }

  std::vector<float> HostGet(const std::string& name) {
    absl::StatusOr<Tensor> t = client_->GetParam(name);
    EXPECT_OK(t);
    return t.ok() ? t->ToVector<float>() : std::vector<float>{};
  }

  std::unique_ptr<LocalCluster> cluster_;
  ClientOptions options_;
  std::unique_ptr<Client> client_;
};

INSTANTIATE_TEST_SUITE_P(Transports, DeviceIoTest, ::testing::Values(Via::kGrpc, Via::kInProcess),
                         [](const ::testing::TestParamInfo<Via>& info) {
                           return info.param == Via::kGrpc ? "Grpc" : "InProcess";
                         });

constexpr size_t kN = 10000;  // 10 blocks of 1024 floats (the last 784)

TEST_P(DeviceIoTest, PushThenPullMatchesTheHostClientBitForBit) {
  const std::vector<float> w0 = Ramp(kN, 1.f), g = Ramp(kN, -0.37f);
  Init({"host", "dev"}, w0, Sgd(0.1));
  HostMemorySpace space({});
  DeviceIo io(client_.get(), &space, DeviceIoOptions{/*chunk_bytes=*/3 * 4096, /*depth=*/2});

  ASSERT_OK(client_->SendGrad("host", Tensor::FromValues<float>({int64_t(kN)}, g)));
  ASSERT_OK(io.SendGrad("dev", v1::FLOAT32, {int64_t(kN)}, g.data()));
  EXPECT_EQ(io.last_stats().chunks, 4);  // blocks 3 + 3 + 3 + 1
  EXPECT_EQ(io.last_stats().bytes_to_host, kN * 4);
  EXPECT_FALSE(io.last_stats().staged_whole);

  std::vector<float> out(kN, -1.f);
  ASSERT_OK(io.GetParam("dev", out.data(), out.size() * 4, v1::FLOAT32));
  EXPECT_EQ(io.last_stats().bytes_to_device, kN * 4);
  const std::vector<float> host = HostGet("host");
  EXPECT_EQ(BytesOf(out), BytesOf(host));
  EXPECT_EQ(BytesOf(HostGet("dev")), BytesOf(host));
  EXPECT_NE(BytesOf(host), BytesOf(w0));  // the update happened
}

TEST_P(DeviceIoTest, PullCopiesEveryChunkOnceInOrder) {
  const std::vector<float> w0 = Ramp(kN, 2.f);
  Init({"w"}, w0, Sgd(0.1));
  HostMemorySpace space({});
  DeviceIo io(client_.get(), &space, DeviceIoOptions{/*chunk_bytes=*/2 * 4096, /*depth=*/2});
  std::vector<float> out(kN, 0.f);
  ASSERT_OK(io.GetParam("w", out.data(), out.size() * 4));
  EXPECT_EQ(BytesOf(out), BytesOf(w0));

  const std::vector<HostMemorySpace::Copy> copies = space.copies();
  ASSERT_EQ(copies.size(), 5u);  // 5 chunks of 2 blocks
  const char* next = reinterpret_cast<const char*>(out.data());
  for (size_t i = 0; i < copies.size(); ++i) {
    EXPECT_FALSE(copies[i].to_host);
    EXPECT_EQ(copies[i].space_ptr, next) << "copy " << i;
    EXPECT_EQ(copies[i].lane, static_cast<int>(i % 2));
    next += copies[i].bytes;
  }
  EXPECT_EQ(next, reinterpret_cast<const char*>(out.data() + kN));
  // Two slots of one chunk each, kept for the next call.
  EXPECT_EQ(space.staging_bytes_allocated(), 2u * 2 * 4096);
  ASSERT_OK(io.GetParam("w", out.data(), out.size() * 4));
  EXPECT_EQ(space.staging_bytes_allocated(), 2u * 2 * 4096);
}

TEST_P(DeviceIoTest, PushPullExactAndInPlace) {
  const std::vector<float> w0 = Ramp(kN, 1.f), g = Ramp(kN, 0.5f);
  Init({"host", "dev"}, w0, Sgd(1.0));
  HostMemorySpace space({});
  DeviceIo io(client_.get(), &space, DeviceIoOptions{/*chunk_bytes=*/4096, /*depth=*/3});
  Tensor host_out;
  ASSERT_OK(client_->PushPull("host", Tensor::FromValues<float>({int64_t(kN)}, g), &host_out));
  std::vector<float> buf = g;  // the gradient, overwritten by the parameter
  ASSERT_OK(io.PushPull("dev", v1::FLOAT32, {int64_t(kN)}, buf.data(), buf.data()));
  EXPECT_EQ(BytesOf(buf), host_out.bytes());
  EXPECT_EQ(io.last_stats().chunks, 10);
  EXPECT_EQ(io.last_stats().bytes_to_host, kN * 4);
  EXPECT_EQ(io.last_stats().bytes_to_device, kN * 4);
}

TEST_P(DeviceIoTest, SingleBlockParameterIsOneChunk) {
  Init({"s"}, {1.f, 2.f, 3.f}, Sgd(1.0));
  HostMemorySpace space({});
  DeviceIo io(client_.get(), &space);
  const std::vector<float> g = {0.5f, 0.25f, -1.f};
  ASSERT_OK(io.SendGrad("s", v1::FLOAT32, {3}, g.data()));
  std::vector<float> out(3);
  ASSERT_OK(io.GetParam("s", out.data(), 12));
  EXPECT_EQ(out, (std::vector<float>{0.5f, 1.75f, 4.f}));
  EXPECT_EQ(io.last_stats().chunks, 1);
}

TEST_P(DeviceIoTest, ClipByNormStagesTheWholeGradientAndClipsAsTheHost) {
  const std::vector<float> w0 = Ramp(kN, 1.f), g = Ramp(kN, 3.f);
  Init({"host", "dev"}, w0, Sgd(0.1, /*clip_norm=*/1.0));
  HostMemorySpace space({});
  DeviceIo io(client_.get(), &space, DeviceIoOptions{/*chunk_bytes=*/4 * 4096, /*depth=*/2});
  ASSERT_OK(client_->SendGrad("host", Tensor::FromValues<float>({int64_t(kN)}, g)));
  ASSERT_OK(io.SendGrad("dev", v1::FLOAT32, {int64_t(kN)}, g.data()));
  EXPECT_TRUE(io.last_stats().staged_whole);
  EXPECT_EQ(io.last_stats().bytes_to_host, kN * 4);
  EXPECT_EQ(BytesOf(HostGet("dev")), BytesOf(HostGet("host")));
}

TEST_P(DeviceIoTest, AClientThatHasNotSeenTheParameterLearnsItsLayout) {
  const std::vector<float> w0 = Ramp(kN, 1.f);
  Init({"w"}, w0, Sgd(0.1));
  std::unique_ptr<Client> fresh = NewClient();
  HostMemorySpace space({});
  DeviceIo io(fresh.get(), &space);
  std::vector<float> out(kN);
  ASSERT_OK(io.GetParam("w", out.data(), kN * 4));
  EXPECT_EQ(BytesOf(out), BytesOf(w0));

  std::unique_ptr<Client> fresh2 = NewClient();
  DeviceIo io2(fresh2.get(), &space);
  const std::vector<float> g(kN, 1.f);
  ASSERT_OK(io2.SendGrad("w", v1::FLOAT32, {int64_t(kN)}, g.data()));
  EXPECT_FLOAT_EQ(HostGet("w")[5], w0[5] - 0.1f);
}

uint64_t SkippedOnAllServers(Client& client) {
  absl::StatusOr<std::vector<v1::ServerStats>> stats = client.GetStats();
  EXPECT_OK(stats);
  uint64_t skipped = 0;
  if (stats.ok()) {
    for (const v1::ServerStats& s : *stats) skipped += s.non_finite_skipped();
  }
  return skipped;
}

TEST_P(DeviceIoTest, NonFiniteGradientInOneChunkOrStagedWholeIsAllOrNothing) {
  const std::vector<float> w0 = Ramp(kN, 1.f);
  v1::ParameterConfig skip = Sgd(0.1);
  skip.set_non_finite(v1::ParameterConfig::SKIP);
  for (const char* name : {"r", "c", "s"}) {
    const v1::ParameterConfig config = name[0] == 'c'   ? Sgd(0.1, /*clip_norm=*/1.0)
                                       : name[0] == 's' ? skip
                                                        : Sgd(0.1);
    ASSERT_OK(client_->InitParam(name, Tensor::FromValues<float>({int64_t(kN)}, w0), config));
  }
  ASSERT_OK(client_->FinishInitParams());
  HostMemorySpace space({});
  // One chunk of all 10 blocks (over the 3 servers), and 10 chunks of one.
  DeviceIo one(client_.get(), &space, DeviceIoOptions{/*chunk_bytes=*/kN * 4, /*depth=*/2});
  DeviceIo pipelined(client_.get(), &space, DeviceIoOptions{/*chunk_bytes=*/4096, /*depth=*/2});
  std::vector<float> g(kN, 0.5f);
  g[kN - 1] = std::nanf("");  // the last element of block 9

  const auto refused = StatusIs(
      absl::StatusCode::kInvalidArgument,
      AllOf(HasSubstr("block 9 of 10: element 783 of the block (element 9999 of the parameter) "
                      "is NaN"),
            HasSubstr("nothing of the request was applied")));
  EXPECT_THAT(one.SendGrad("r", v1::FLOAT32, {int64_t(kN)}, g.data()), refused);
  EXPECT_EQ(BytesOf(HostGet("r")), BytesOf(w0));
  std::vector<float> out(kN);
  EXPECT_THAT(one.PushPull("r", v1::FLOAT32, {int64_t(kN)}, g.data(), out.data()), refused);
  EXPECT_EQ(BytesOf(HostGet("r")), BytesOf(w0));
  // Clip-by-norm stages the gradient whole, so even 10 chunks are checked first.
  EXPECT_THAT(pipelined.SendGrad("c", v1::FLOAT32, {int64_t(kN)}, g.data()), refused);
  EXPECT_TRUE(pipelined.last_stats().staged_whole);
  EXPECT_EQ(BytesOf(HostGet("c")), BytesOf(w0));

  // SKIP: every block of the gradient is skipped, on every server.
  ASSERT_OK(one.SendGrad("s", v1::FLOAT32, {int64_t(kN)}, g.data()));
  EXPECT_EQ(BytesOf(HostGet("s")), BytesOf(w0));
  EXPECT_EQ(SkippedOnAllServers(*client_), 10u);
  EXPECT_EQ(client_->non_finite_skipped(), 1u);
}

TEST_P(DeviceIoTest, PipelinedPushChecksEachChunkBeforeSendingIt) {
  // What device_io.h documents: chunks sent before the bad one stay applied.
  const std::vector<float> w0(kN, 1.f);
  Init({"r"}, w0, Sgd(1.0));
  HostMemorySpace space({});
  DeviceIo pipelined(client_.get(), &space, DeviceIoOptions{/*chunk_bytes=*/4096, /*depth=*/2});
  std::vector<float> g(kN, 0.5f);
  g[kN - 1] = std::nanf("");
  EXPECT_THAT(pipelined.SendGrad("r", v1::FLOAT32, {int64_t(kN)}, g.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block 9 of 10")));
  const std::vector<float> got = HostGet("r");
  ASSERT_EQ(got.size(), kN);
  EXPECT_EQ(got[0], 0.5f);        // block 0: sent before block 9 was checked
  EXPECT_EQ(got[9 * 1024], 1.f);  // block 9: never sent
  EXPECT_EQ(pipelined.last_stats().chunks, 9);
}

TEST_P(DeviceIoTest, CopiesOverlapTheNetwork) {
  // 12 blocks: 4 chunks of 3, one block on each server. Whether a copy
  // overlaps the network is read from the order of events (OverlapGate),
  // not from clocks, so a busy machine cannot change the answer.
  constexpr size_t kN12 = 12 * 1024;
  static constexpr int kChunks = 4;
  const std::vector<float> w0 = Ramp(kN12, 1.f), g = Ramp(kN12, 0.5f);
  Init({"w"}, w0, Sgd(0.1));
  OverlapGate gate;
  std::unique_ptr<Client> client = NewClient(absl::ZeroDuration(), &gate);
  HostMemorySpace::Options space_options;
  space_options.on_copy_start = [&gate] { gate.CopyStarting(); };
  HostMemorySpace space(space_options);
  DeviceIo io(client.get(), &space, DeviceIoOptions{/*chunk_bytes=*/3 * 4096, /*depth=*/2});
  // Learn the layout first, so that the calls below are only the pipeline.
  std::vector<float> out(kN12);
  ASSERT_OK(io.GetParam("w", out.data(), kN12 * 4));

  for (int mode = 0; mode < 2; ++mode) {
    const size_t before = space.copies().size();
    // A push copies chunk c+1 while chunk c is on the network: copy k
    // starts once chunk k-1 is sent, and chunk c's calls finish once copy
    // c+1 has started (the last once all have). A pull copies chunk c while
    // chunk c+1 is on the network: copy k starts once chunk k+1 is sent (the
    // last at once), and chunk c's calls finish once copy c-1 has started.
    if (mode == 0) {
      gate.Reset(
          3, [](int chunk) { return std::min(chunk + 2, kChunks); },
          [](int copy) { return copy - 1; });
      ASSERT_OK(io.SendGrad("w", v1::FLOAT32, {int64_t(kN12)}, g.data()));
    } else {
      gate.Reset(
          3, [](int chunk) { return chunk; },
          [](int copy) { return copy + 1 < kChunks ? copy + 1 : -1; });
      ASSERT_OK(io.GetParam("w", out.data(), kN12 * 4));
    }
    const DeviceIoStats& stats = io.last_stats();
    EXPECT_EQ(stats.chunks, kChunks);
    EXPECT_EQ(space.copies().size() - before, size_t{kChunks});
    // Every copy but the first (push) or last (pull) is waited for while
    // another chunk is on the network.
    EXPECT_GE(stats.copy_waits_overlapped, mode == 0 ? 3 : 2) << "mode " << mode;
    EXPECT_GE(stats.max_network_in_flight, 1);
    // And they did overlap: 3 of the 4 copies began while a call was on the
    // network, and no call had to be let go for want of the copy it waited
    // for (a pipeline that copies only between calls would hold each call
    // its full kMaxHold).
    EXPECT_EQ(gate.copies_overlapping(), 3) << "mode " << mode;
    EXPECT_EQ(gate.held_too_long(), 0) << "mode " << mode;
  }
  // The push was applied once: w = w0 - 0.1 * g, and the pull read it.
  for (size_t i = 0; i < kN12; i += 1000) EXPECT_FLOAT_EQ(out[i], w0[i] - 0.1f * g[i]) << i;
}

TEST_P(DeviceIoTest, SizeTypeAndShapeMismatchesAreRefusedBeforeAnythingIsSent) {
  const std::vector<float> w0 = Ramp(kN, 1.f);
  Init({"w"}, w0, Sgd(0.1));
  HostMemorySpace space({});
  DeviceIo io(client_.get(), &space);
  std::vector<float> buf(kN + 1, 1.f);
  EXPECT_THAT(io.GetParam("w", buf.data(), (kN + 1) * 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("needs 40000 bytes, the device buffer has 40004")));
  EXPECT_THAT(io.GetParam("w", buf.data(), kN * 4, v1::FLOAT64),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("has element type float32, the device buffer is float64")));
  EXPECT_THAT(io.SendGrad("w", v1::FLOAT32, {int64_t(kN + 1)}, buf.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("10000 expected")));
  EXPECT_THAT(io.SendGrad("w", v1::FLOAT64, {int64_t(kN / 2)}, buf.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("float64 received")));
  EXPECT_THAT(io.SendGrad("w", v1::FLOAT32, {0}, buf.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is empty")));
  EXPECT_THAT(io.GetParam("nope", buf.data(), 4),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_THAT(io.GetParam("", buf.data(), 4),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_TRUE(space.copies().empty());
  EXPECT_EQ(BytesOf(HostGet("w")), BytesOf(w0));
}

TEST_P(DeviceIoTest, PointersOutsideTheSpaceAreRefused) {
  const std::vector<float> w0 = Ramp(kN, 1.f);
  Init({"w"}, w0, Sgd(0.1));
  std::vector<float> buf(kN, 1.f);
  HostMemorySpace::Options options;
  options.refuse_begin = buf.data() + 100;
  options.refuse_end = buf.data() + 101;
  HostMemorySpace space(options);
  DeviceIo io(client_.get(), &space);
  EXPECT_THAT(io.SendGrad("w", v1::FLOAT32, {int64_t(kN)}, buf.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not memory of host")));
  EXPECT_THAT(io.GetParam("w", buf.data(), kN * 4),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(io.SendGrad("w", v1::FLOAT32, {int64_t(kN)}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("null pointer")));
  EXPECT_EQ(BytesOf(HostGet("w")), BytesOf(w0));
}

TEST_P(DeviceIoTest, ACopyFailureEndsTheCallWithItsError) {
  const std::vector<float> w0 = Ramp(kN, 1.f), g = Ramp(kN, 1.f);
  Init({"w"}, w0, Sgd(0.1));
  for (int fail : {0, 2, 4}) {
    HostMemorySpace::Options options;
    options.fail_copy = fail;
    HostMemorySpace space(options);
    DeviceIo io(client_.get(), &space, DeviceIoOptions{/*chunk_bytes=*/2 * 4096, /*depth=*/2});
    std::vector<float> out(kN);
    EXPECT_THAT(io.GetParam("w", out.data(), kN * 4),
                StatusIs(absl::StatusCode::kInternal, HasSubstr("injected copy failure")))
        << fail;
    HostMemorySpace space2(options);
    DeviceIo io2(client_.get(), &space2, DeviceIoOptions{/*chunk_bytes=*/2 * 4096, /*depth=*/2});
    EXPECT_THAT(io2.SendGrad("w", v1::FLOAT32, {int64_t(kN)}, g.data()),
                StatusIs(absl::StatusCode::kInternal, HasSubstr("injected copy failure")))
        << fail;
    // The chunks before the failure were sent; none after it.
    EXPECT_EQ(io2.last_stats().chunks, fail) << fail;
  }
}

TEST_P(DeviceIoTest, DeadlinesAreHonoured) {
  const std::vector<float> w0 = Ramp(kN, 1.f), g = Ramp(kN, 1.f);
  Init({"w"}, w0, Sgd(0.1));
  HostMemorySpace space({});
  DeviceIo io(client_.get(), &space, DeviceIoOptions{/*chunk_bytes=*/4096, /*depth=*/2});
  std::vector<float> out(kN);
  ASSERT_OK(io.GetParam("w", out.data(), kN * 4));  // layout known
  CallOptions past;
  past.deadline = absl::Now() - absl::Seconds(1);
  EXPECT_THAT(io.SendGrad("w", v1::FLOAT32, {int64_t(kN)}, g.data(), past),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("after 0 of 10 chunks")));
  EXPECT_THAT(io.GetParam("w", out.data(), kN * 4, v1::FLOAT32, past),
              StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
  EXPECT_EQ(BytesOf(HostGet("w")), BytesOf(w0));

  // A deadline that passes while the chunks are on a slow network.
  std::unique_ptr<Client> slow = NewClient(absl::Milliseconds(60));
  DeviceIo slow_io(slow.get(), &space, DeviceIoOptions{/*chunk_bytes=*/4096, /*depth=*/2});
  ASSERT_OK(slow_io.GetParam("w", out.data(), kN * 4));
  CallOptions soon;
  soon.deadline = absl::Now() + absl::Milliseconds(150);
  const absl::Time start = absl::Now();
  EXPECT_THAT(slow_io.GetParam("w", out.data(), kN * 4, v1::FLOAT32, soon),
              StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_LT(slow_io.last_stats().chunks, 10);
}

// ---- CUDA ----------------------------------------------------------------------------

TEST(CudaDeviceIoTest, WithoutADeviceEveryCallSaysSo) {
  absl::StatusOr<int> count = cuda::CudaDeviceCount();
  if (count.ok()) GTEST_SKIP() << "a CUDA device is present: the no-device path is not reachable";
  ASSERT_OK_AND_ASSIGN(auto cluster, LocalCluster::Start(1));
  ClientOptions options;
  options.servers = cluster->addresses();
  ASSERT_OK_AND_ASSIGN(auto client, Client::Create(options, InProcessTransports(*cluster)));
  const std::string reason(count.status().message());
  float x[4] = {};
  EXPECT_THAT(DeviceIo::ForCuda(client.get(), 0).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no CUDA device: " + reason)));
  EXPECT_THAT(SendGradFromDevice(*client, "w", v1::FLOAT32, {4}, x, 0),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no CUDA device")));
  EXPECT_THAT(GetParamToDevice(*client, "w", x, sizeof x, 0),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no CUDA device")));
  EXPECT_THAT(PushPullDevice(*client, "w", v1::FLOAT32, {4}, x, x, 0),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no CUDA device")));
}

class CudaRoundTripTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(cluster_, LocalCluster::Start(2));
    options_.servers = cluster_->addresses();
    options_.block_bytes = 1 << 20;
    ASSERT_OK_AND_ASSIGN(client_, Client::Connect(options_));
  }
  std::unique_ptr<LocalCluster> cluster_;
  ClientOptions options_;
  std::unique_ptr<Client> client_;
};

TEST_F(CudaRoundTripTest, DeviceToServerToDeviceIsExact) {
  SKIP_WITHOUT_CUDA_DEVICE();
  // 3 floats (one block), and 40 MiB (40 blocks, 10 chunks).
  const std::vector<size_t> sizes = {size_t{3}, size_t{10} << 20};
  for (size_t n : sizes) {
    ASSERT_OK(client_->InitParam(absl::StrCat("w", n),
                                 Tensor::FromValues<float>({int64_t(n)}, Ramp(n, 1.f)), Sgd(1.0)));
  }
  ASSERT_OK(client_->FinishInitParams());
  for (size_t n : sizes) {
    const std::string name = absl::StrCat("w", n);
    const std::vector<float> w0 = Ramp(n, 1.f), g = Ramp(n, -0.25f);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer d, cuda::DeviceBuffer::Allocate(0, n * 4));
    ASSERT_OK_AND_ASSIGN(auto io, DeviceIo::ForCuda(client_.get(), 0));
    ASSERT_OK(io->GetParam(name, d.data(), n * 4));
    std::vector<float> back(n);
    ASSERT_OK(cuda::CopyToHost(back.data(), d, 0, n * 4));
    EXPECT_EQ(BytesOf(back), BytesOf(w0)) << n;

    ASSERT_OK(cuda::CopyToDevice(d, 0, g.data(), n * 4));
    ASSERT_OK(io->SendGrad(name, v1::FLOAT32, {int64_t(n)}, d.data()));
    std::vector<float> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = w0[i] - g[i];
    ASSERT_OK_AND_ASSIGN(Tensor host, client_->GetParam(name));
    EXPECT_EQ(host.bytes(), BytesOf(want)) << n;

    ASSERT_OK(io->PushPull(name, v1::FLOAT32, {int64_t(n)}, d.data(), d.data()));
    for (size_t i = 0; i < n; ++i) want[i] = want[i] - g[i];
    ASSERT_OK(cuda::CopyToHost(back.data(), d, 0, n * 4));
    EXPECT_EQ(BytesOf(back), BytesOf(want)) << n;
  }
}

TEST_F(CudaRoundTripTest, HostPointersAreRefused) {
  SKIP_WITHOUT_CUDA_DEVICE();
  ASSERT_OK(client_->InitParam("w", Tensor::FromValues<float>({4}, {1, 2, 3, 4}), Sgd(1.0)));
  ASSERT_OK(client_->FinishInitParams());
  float host[4] = {};
  EXPECT_THAT(GetParamToDevice(*client_, "w", host, sizeof host, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is not device memory of cuda:0: it is host memory")));
}

}  // namespace
}  // namespace pserver
