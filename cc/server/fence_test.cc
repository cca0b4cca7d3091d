// The fence with an injected clock and renewal source: no timing involved.
#include "cc/server/fence.h"

#include <optional>

#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

class FenceTest : public ::testing::Test {
 protected:
  Fence& MakeFence() {
    FenceOptions options;
    options.shard = 3;
    options.margin_fraction = 0.25;
    options.now = [this] { return now_; };
    options.renewal = [this] {
      ++renewal_reads_;
      return renewal_;
    };
    options.on_unconfirmed = [this] { ++rechecks_; };
    fence_.emplace(std::move(options));
    return *fence_;
  }

  absl::Duration now_ = absl::Seconds(100);
  std::optional<LeaseRenewal> renewal_;
  int renewal_reads_ = 0;
  int rechecks_ = 0;
  std::optional<Fence> fence_;
};

TEST_F(FenceTest, NoRenewalYetRefusesWritesAndAsksForARecheck) {
  Fence& fence = MakeFence();
  EXPECT_THAT(fence.CheckWrite(), StatusIs(absl::StatusCode::kUnavailable,
                                           AllOf(HasSubstr("lease for /ps/3 not confirmed"),
                                                 HasSubstr("another server may hold shard 3"))));
  EXPECT_EQ(rechecks_, 1);
  EXPECT_FALSE(fence.Confirmed());
  EXPECT_OK(fence.CheckServing()) << "reads go on while unconfirmed";
}

TEST_F(FenceTest, ARenewalConfirmsUntilSentPlusTtlLessTheMargin) {
  Fence& fence = MakeFence();
  renewal_ = LeaseRenewal{absl::Seconds(100), absl::Seconds(4)};  // until 100 + 4 - 1
  EXPECT_OK(fence.CheckWrite());
  now_ = absl::Seconds(102.999);
  EXPECT_OK(fence.CheckWrite());
  EXPECT_EQ(rechecks_, 0);
  // Confirmed without asking the source again: the fast path.
  const int reads = renewal_reads_;
  EXPECT_OK(fence.CheckWrite());
  EXPECT_EQ(renewal_reads_, reads);

  now_ = absl::Seconds(103);  // sent + ttl - margin: no longer
  EXPECT_THAT(fence.CheckWrite(),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr("not confirmed for 3s"), HasSubstr("TTL 4s"),
                             HasSubstr("another server may hold shard 3"))));
  EXPECT_EQ(rechecks_, 1);

  // A later renewal confirms again.
  renewal_ = LeaseRenewal{absl::Seconds(102.5), absl::Seconds(4)};
  EXPECT_OK(fence.CheckWrite());
  EXPECT_TRUE(fence.Confirmed());
}

TEST_F(FenceTest, ALostLeaseConfirmsNothingMore) {
  Fence& fence = MakeFence();
  renewal_ = LeaseRenewal{absl::Seconds(100), absl::Seconds(2)};
  EXPECT_OK(fence.CheckWrite());
  renewal_.reset();  // lost: the source has none
  now_ = absl::Seconds(101.4);
  EXPECT_OK(fence.CheckWrite()) << "what the last renewal proved still holds";
  now_ = absl::Seconds(101.5);
  EXPECT_THAT(fence.CheckWrite(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("not confirmed for 1.5s")));
}

TEST_F(FenceTest, AnOlderRenewalReadLateDoesNotShortenTheBound) {
  Fence& fence = MakeFence();
  renewal_ = LeaseRenewal{absl::Seconds(100), absl::Seconds(4)};
  EXPECT_OK(fence.CheckWrite());
  // A process paused long past the bound: the clock jumps (SIGSTOP, or a
  // suspended machine), and the lease is unconfirmed at once.
  now_ = absl::Seconds(160);
  renewal_ = LeaseRenewal{absl::Seconds(99), absl::Seconds(4)};
  EXPECT_THAT(fence.CheckWrite(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("not confirmed for 1m")));
}

TEST_F(FenceTest, SteppingDownIsForGoodAndRefusesEverything) {
  Fence& fence = MakeFence();
  renewal_ = LeaseRenewal{absl::Seconds(100), absl::Seconds(4)};
  EXPECT_OK(fence.CheckWrite());
  EXPECT_TRUE(fence.StepDown("etcd /shards/3 names epoch 2, held by b"));
  EXPECT_FALSE(fence.StepDown("again")) << "the first reason stays";
  EXPECT_TRUE(fence.stepped_down());
  const auto stepped =
      StatusIs(absl::StatusCode::kUnavailable,
               AllOf(HasSubstr("stepped down from shard 3"), HasSubstr("epoch 2, held by b")));
  EXPECT_THAT(fence.CheckWrite(), stepped) << "even while the lease would confirm it";
  EXPECT_THAT(fence.CheckServing(), stepped);
  EXPECT_FALSE(fence.Confirmed());
  renewal_ = LeaseRenewal{absl::Seconds(100.5), absl::Seconds(4)};
  EXPECT_THAT(fence.CheckWrite(), stepped);
}

}  // namespace
}  // namespace pserver
