// The dispatcher's write path under a fence, with an injected clock: a write
// is checked before it is applied and again before it is acknowledged, so a
// server whose lease stops being confirmed while it applies a push does not
// acknowledge it, nor a retry of it; reads go on until it steps down.
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cc/core/gradient_view.h"
#include "cc/core/parameter_store.h"
#include "cc/core/tables.h"
#include "cc/server/dispatcher.h"
#include "cc/server/fence.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

std::string Floats(std::vector<float> values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

class DispatcherFenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::Parameter w;
    w.set_name("w");
    w.set_element_type(v1::FLOAT32);
    w.add_shape(2);
    w.set_content(Floats({0, 0}));
    v1::ParameterConfig sgd;
    sgd.mutable_optimizer()->mutable_sgd();
    sgd.mutable_learning_rate()->set_learning_rate(1.0);
    ASSERT_OK(store_.Init(w, sgd));
    store_.FinishInit();

    FenceOptions options;
    options.shard = 0;
    // Each clock read is the next of `ticks_` (the last one repeats): the
    // test says what the fence sees before and after applying.
    options.now = [this] {
      const absl::Duration t = ticks_[std::min(next_tick_, ticks_.size() - 1)];
      ++next_tick_;
      return t;
    };
    options.renewal = [this] { return renewal_; };
    fence_ = std::make_unique<Fence>(std::move(options));
    dispatcher_.SetFence(fence_.get());
  }

  absl::Status Push(uint64_t sequence) {
    v1::Gradient grad;
    grad.set_name("w");
    grad.set_element_type(v1::FLOAT32);
    grad.set_content(Floats({1, 1}));
    const GradientView view = GradientView::Of(grad);
    return dispatcher_.Push(RequestId{7, sequence}, absl::MakeConstSpan(&view, 1));
  }

  std::vector<float> W() {
    v1::ParamRef ref;
    ref.set_name("w");
    v1::Parameter out;
    EXPECT_OK(store_.Get(ref, &out));
    std::vector<float> values(2);
    if (out.content().size() == 8) std::memcpy(values.data(), out.content().data(), 8);
    return values;
  }

  absl::Status SendGrad() {
    v1::SendGradRequest request;
    request.mutable_gradient()->set_name("w");
    request.mutable_gradient()->set_element_type(v1::FLOAT32);
    request.mutable_gradient()->set_content(Floats({1, 1}));
    v1::SendGradResponse response;
    absl::Status result = absl::InternalError("not answered");
    dispatcher_.Call("SendGrad", request, &response, {}, [&](absl::Status s) { result = s; });
    return result;
  }

  ParameterStore store_;
  Tables tables_{TablesOptions()};
  Dispatcher dispatcher_{&store_, &tables_, 0};
  std::unique_ptr<Fence> fence_;
  std::vector<absl::Duration> ticks_ = {absl::Seconds(10)};
  size_t next_tick_ = 0;
  std::optional<LeaseRenewal> renewal_ = LeaseRenewal{absl::Seconds(10), absl::Seconds(4)};
};

TEST_F(DispatcherFenceTest, ConfirmedWritesAreAcknowledged) {
  ASSERT_OK(Push(1));
  ASSERT_OK(SendGrad());
  EXPECT_EQ(W(), (std::vector<float>{-2, -2}));
}

TEST_F(DispatcherFenceTest, AWriteIsRefusedBeforeItIsAppliedWhenUnconfirmed) {
  ticks_ = {absl::Seconds(13)};  // 10 + 4 - 1: past the bound
  EXPECT_THAT(Push(1), StatusIs(absl::StatusCode::kUnavailable,
                                HasSubstr("another server may hold shard 0")));
  EXPECT_THAT(SendGrad(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("not confirmed")));
  EXPECT_EQ(W(), (std::vector<float>{0, 0})) << "nothing applied";
  v1::GetParamRequest read;
  read.mutable_param()->set_name("w");
  v1::GetParamResponse response;
  absl::Status result;
  dispatcher_.Call("GetParam", read, &response, {}, [&](absl::Status s) { result = s; });
  EXPECT_OK(result) << "reads go on while unconfirmed";
}

TEST_F(DispatcherFenceTest, APushAppliedAsTheLeaseRanOutIsNotAcknowledgedNorItsRetry) {
  // Confirmed when checked before applying, not when checked after.
  ticks_ = {absl::Seconds(12), absl::Seconds(13)};
  EXPECT_THAT(Push(1), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("not confirmed")));
  EXPECT_EQ(W(), (std::vector<float>{-1, -1})) << "applied, but not acknowledged";
  // Its retry (same id) is refused while unconfirmed.
  EXPECT_THAT(Push(1), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("not confirmed")));
  EXPECT_EQ(W(), (std::vector<float>{-1, -1}));
  // Confirmed again (a renewal was granted): the retry is recognized as
  // applied and acknowledged, not applied twice.
  renewal_ = LeaseRenewal{absl::Seconds(12.5), absl::Seconds(4)};
  EXPECT_OK(Push(1));
  EXPECT_EQ(W(), (std::vector<float>{-1, -1}));
  EXPECT_EQ(dispatcher_.duplicates_ignored(), 1u);
}

TEST_F(DispatcherFenceTest, AControlWriteIsCheckedAgainBeforeItsAnswer) {
  ticks_ = {absl::Seconds(12), absl::Seconds(13)};
  EXPECT_THAT(SendGrad(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("not confirmed")));
}

TEST_F(DispatcherFenceTest, ASteppedDownServerServesNothingButStats) {
  fence_->StepDown("etcd /shards/0 is at epoch 2");
  EXPECT_THAT(Push(1), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("stepped down")));
  v1::GetParamRequest read;
  read.mutable_param()->set_name("w");
  v1::GetParamResponse response;
  absl::Status result;
  dispatcher_.Call("GetParam", read, &response, {}, [&](absl::Status s) { result = s; });
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("epoch 2")));
  v1::GetStatsRequest stats;
  v1::GetStatsResponse stats_response;
  dispatcher_.Call("GetStats", stats, &stats_response, {}, [&](absl::Status s) { result = s; });
  EXPECT_OK(result);
}

}  // namespace
}  // namespace pserver
