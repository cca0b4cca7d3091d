// LeasedKey against a real etcd (cc/etcd/testing/etcd_process.h) on free
// 127.0.0.1 ports. A lost lease is made by revoking it from another client;
// every wait is on a condition with a deadline.
#include "cc/etcd/leased_key.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cc/core/boot_clock.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::EtcdProcess;
using ::pserver::testing::StatusCodeIs;
using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;
using Ownership = LeasedKeyOptions::Ownership;

// Polls `condition` until it holds or `timeout` passes; true if it held.
template <typename Condition>
bool WaitFor(Condition condition, absl::Duration timeout = absl::Seconds(20)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (condition()) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// The messages a LeasedKey logs.
class Log {
 public:
  std::function<void(const std::string&)> Sink() {
    return [this](const std::string& line) {
      absl::MutexLock lock(&mu_);
      lines_.push_back(line);
    };
  }
  bool Has(const std::string& text) const {
    absl::MutexLock lock(&mu_);
    for (const std::string& line : lines_) {
      if (line.find(text) != std::string::npos) return true;
    }
    return false;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

class LeasedKeyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(etcd_, EtcdProcess::Start());
    EtcdClientOptions options;
    options.endpoints = {etcd_->endpoint()};
    options.prefix = "/test";
    ASSERT_OK_AND_ASSIGN(client_, EtcdClient::Connect(options));
    ASSERT_OK_AND_ASSIGN(other_, EtcdClient::Connect(options));
  }

  void TearDown() override {
    client_.reset();
    other_.reset();
    if (etcd_ != nullptr) {
      EXPECT_OK(etcd_->Stop());
    }
  }

  LeasedKeyOptions Options(const std::string& value, Ownership ownership) {
    LeasedKeyOptions options;
    options.value = value;
    options.ttl = absl::Seconds(5);
    options.ownership = ownership;
    options.retry_interval = absl::Milliseconds(20);
    options.max_retry_interval = absl::Milliseconds(200);
    options.log = log_.Sink();
    return options;
  }

  std::unique_ptr<EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> client_;
  std::unique_ptr<EtcdClient> other_;  // plays another holder
  Log log_;
};

TEST_F(LeasedKeyTest, ClaimPutsTheKeyUnderTheLeaseAndReleaseDeletesIt) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LeasedKey> held,
                       LeasedKey::Grant(client_.get(), Options("v", Ownership::kShared)));
  EXPECT_EQ(held->registrations(), 0);
  EXPECT_EQ(held->key(), "");
  ASSERT_OK_AND_ASSIGN(bool claimed, held->Claim("/k"));
  EXPECT_TRUE(claimed);
  EXPECT_EQ(held->registrations(), 1);
  EXPECT_EQ(held->key(), "/k");
  ASSERT_OK_AND_ASSIGN(KeyValue kv, other_->Get("/k"));
  EXPECT_EQ(kv.value, "v");
  EXPECT_EQ(kv.lease, held->lease());
  EXPECT_THAT(held->Claim("/other"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("/k already")));

  held->Release();
  EXPECT_EQ(held->lease(), 0);
  EXPECT_THAT(other_->Get("/k"), StatusCodeIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(held->Claim("/k"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("released")));
  held->Release();  // idempotent
}

TEST_F(LeasedKeyTest, SharedOverwritesExclusiveDoesNot) {
  ASSERT_OK(other_->Put("/k", "someone"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LeasedKey> exclusive,
                       LeasedKey::Grant(client_.get(), Options("mine", Ownership::kExclusive)));
  ASSERT_OK_AND_ASSIGN(bool claimed, exclusive->Claim("/k"));
  EXPECT_FALSE(claimed);
  EXPECT_EQ(exclusive->registrations(), 0);
  EXPECT_EQ(exclusive->key(), "");

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LeasedKey> shared,
                       LeasedKey::Grant(client_.get(), Options("mine", Ownership::kShared)));
  ASSERT_OK_AND_ASSIGN(claimed, shared->Claim("/k"));
  EXPECT_TRUE(claimed);
  ASSERT_OK_AND_ASSIGN(KeyValue kv, other_->Get("/k"));
  EXPECT_EQ(kv.value, "mine");
  EXPECT_EQ(kv.lease, shared->lease());
}

TEST_F(LeasedKeyTest, ReregistersUnderANewLeaseWhenTheLeaseIsLost) {
  for (Ownership ownership : {Ownership::kShared, Ownership::kExclusive}) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<LeasedKey> held,
                         LeasedKey::Grant(client_.get(), Options("v", ownership)));
    ASSERT_OK_AND_ASSIGN(bool claimed, held->Claim("/k"));
    ASSERT_TRUE(claimed);
    held->KeepRegistered();
    const int64_t first = held->lease();
    ASSERT_OK(other_->Revoke(first));  // deletes /k too
    ASSERT_TRUE(WaitFor([&] { return held->registrations() >= 2; }));
    EXPECT_EQ(held->leases_lost(), 1);
    EXPECT_NE(held->lease(), first);
    ASSERT_OK_AND_ASSIGN(KeyValue kv, other_->Get("/k"));
    EXPECT_EQ(kv.value, "v");
    EXPECT_EQ(kv.lease, held->lease());
    EXPECT_TRUE(log_.Has("re-registered at /k"));
    held->Release();
    EXPECT_THAT(other_->Get("/k"), StatusCodeIs(absl::StatusCode::kNotFound));
  }
}

TEST_F(LeasedKeyTest, ExclusiveRetakesItsOwnValueButNotAnotherHolders) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LeasedKey> held,
                       LeasedKey::Grant(client_.get(), Options("10.0.0.1:7000",
                                                               Ownership::kExclusive)));
  ASSERT_OK_AND_ASSIGN(bool claimed, held->Claim("/index/0"));
  ASSERT_TRUE(claimed);
  // Someone else holds /ps/0 (with no lease, so revoking ours leaves it).
  ASSERT_OK(other_->Put("/index/0", "10.0.0.2:7000"));
  held->KeepRegistered();
  ASSERT_OK(other_->Revoke(held->lease()));
  ASSERT_TRUE(WaitFor([&] { return log_.Has("/index/0 is held by another"); }));
  EXPECT_EQ(held->registrations(), 1);
  ASSERT_OK_AND_ASSIGN(KeyValue kv, other_->Get("/index/0"));
  EXPECT_EQ(kv.value, "10.0.0.2:7000");

  // Our own address (as a restarted etcd restores it): retaken.
  ASSERT_OK(other_->Put("/index/0", "10.0.0.1:7000"));
  ASSERT_TRUE(WaitFor([&] { return held->registrations() >= 2; }));
  ASSERT_OK_AND_ASSIGN(kv, other_->Get("/index/0"));
  EXPECT_EQ(kv.value, "10.0.0.1:7000");
  EXPECT_EQ(kv.lease, held->lease());
}

// A claim with a guard writes the guard's ops in the same transaction, and
// fails (false) when a guard compare fails; a re-registration retakes the
// key only while the reclaim compares hold.
TEST_F(LeasedKeyTest, GuardedClaimsAndReclaims) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LeasedKey> loser,
                       LeasedKey::Grant(client_.get(), Options("a", Ownership::kExclusive)));
  ClaimGuard stale;
  stale.compares.push_back(Compare::ModRevisionEquals("/epoch", 12345));  // not what etcd has
  stale.ops.push_back(TxnOp::Put("/epoch", "1"));
  ASSERT_OK_AND_ASSIGN(bool claimed, loser->Claim("/ps/0", stale));
  EXPECT_FALSE(claimed);
  EXPECT_THAT(other_->Get("/ps/0"), StatusCodeIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(other_->Get("/epoch"), StatusCodeIs(absl::StatusCode::kNotFound));
  EXPECT_FALSE(loser->LastRenewal().has_value()) << "no key held";

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LeasedKey> held,
                       LeasedKey::Grant(client_.get(), Options("b", Ownership::kExclusive)));
  ClaimGuard guard;
  guard.compares.push_back(Compare::KeyMissing("/epoch"));
  guard.ops.push_back(TxnOp::Put("/epoch", "1"));
  guard.reclaim_compares.push_back(Compare::ValueEquals("/epoch", "1"));
  const absl::Duration before = BootClockNow();
  ASSERT_OK_AND_ASSIGN(claimed, held->Claim("/ps/0", guard));
  ASSERT_TRUE(claimed);
  ASSERT_OK_AND_ASSIGN(KeyValue epoch, other_->Get("/epoch"));
  EXPECT_EQ(epoch.value, "1");
  ASSERT_OK_AND_ASSIGN(KeyValue kv, other_->Get("/ps/0"));
  EXPECT_EQ(kv.lease, held->lease());
  // The last renewal etcd granted: sent before now, with etcd's TTL.
  std::optional<LeaseRenewal> renewal = held->LastRenewal();
  ASSERT_TRUE(renewal.has_value());
  EXPECT_LE(renewal->sent, BootClockNow());
  EXPECT_GE(renewal->sent, before - absl::Seconds(60));
  EXPECT_GE(renewal->ttl, absl::Seconds(5));

  // The shard moved on while the lease was lost: no re-registration.
  held->KeepRegistered();
  ASSERT_OK(other_->Put("/epoch", "2"));
  ASSERT_OK(other_->Revoke(held->lease()));
  ASSERT_TRUE(WaitFor([&] { return log_.Has("the claim's conditions no longer hold"); }));
  EXPECT_EQ(held->registrations(), 1);
  EXPECT_FALSE(held->LastRenewal().has_value()) << "the lease is lost";
  EXPECT_THAT(other_->Get("/ps/0"), StatusCodeIs(absl::StatusCode::kNotFound));
  // Back to what it claimed: retaken.
  ASSERT_OK(other_->Put("/epoch", "1"));
  ASSERT_TRUE(WaitFor([&] { return held->registrations() >= 2; }));
  ASSERT_OK_AND_ASSIGN(kv, other_->Get("/ps/0"));
  EXPECT_EQ(kv.lease, held->lease());
  EXPECT_TRUE(held->LastRenewal().has_value());
}

// A guard the holder itself moves on (current_reclaim_compares) is read at
// each re-registration: after the holder rewrote /epoch, a lost lease is
// retaken under the new value; after someone else did, it is not.
TEST_F(LeasedKeyTest, AReclaimGuardIsReadAtEachReregistration) {
  absl::Mutex mu;
  std::string ours = "1";  // /epoch as the holder last wrote it
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LeasedKey> held,
                       LeasedKey::Grant(client_.get(), Options("b", Ownership::kExclusive)));
  ClaimGuard guard;
  guard.ops.push_back(TxnOp::Put("/epoch", "1"));
  guard.current_reclaim_compares = [&] {
    absl::MutexLock lock(&mu);
    return std::vector<Compare>{Compare::ValueEquals("/epoch", ours)};
  };
  ASSERT_OK_AND_ASSIGN(bool claimed, held->Claim("/ps/0", guard));
  ASSERT_TRUE(claimed);
  held->KeepRegistered();

  ASSERT_OK(other_->Put("/epoch", "2"));
  {
    absl::MutexLock lock(&mu);
    ours = "2";
  }
  ASSERT_OK(other_->Revoke(held->lease()));
  ASSERT_TRUE(WaitFor([&] { return held->registrations() >= 2; }));
  ASSERT_OK_AND_ASSIGN(KeyValue kv, other_->Get("/ps/0"));
  EXPECT_EQ(kv.lease, held->lease());

  ASSERT_OK(other_->Put("/epoch", "3"));  // not the holder's doing
  ASSERT_OK(other_->Revoke(held->lease()));
  ASSERT_TRUE(WaitFor([&] { return log_.Has("the claim's conditions no longer hold"); }));
  EXPECT_EQ(held->registrations(), 2);
  EXPECT_THAT(other_->Get("/ps/0"), StatusCodeIs(absl::StatusCode::kNotFound));
  held->Release();  // before `ours` goes
}

TEST_F(LeasedKeyTest, StopsPromptlyWhileRetrying) {
  LeasedKeyOptions options = Options("v", Ownership::kExclusive);
  // A Release that waited out this pause would run into the test's timeout.
  options.retry_interval = absl::Hours(1);
  options.max_retry_interval = absl::Hours(1);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LeasedKey> held,
                       LeasedKey::Grant(client_.get(), std::move(options)));
  ASSERT_OK_AND_ASSIGN(bool claimed, held->Claim("/k"));
  ASSERT_TRUE(claimed);
  ASSERT_OK(other_->Put("/k", "theirs"));
  held->KeepRegistered();
  ASSERT_OK(other_->Revoke(held->lease()));
  ASSERT_TRUE(WaitFor([&] { return log_.Has("held by another"); }));
  // Now pausing before the next try; stopping does not wait for it.
  held->Release();
  EXPECT_EQ(held->registrations(), 1);
  EXPECT_EQ(held->lease(), 0);
}

TEST(LeasedKeyOptionsTest, RefusesBadArguments) {
  EXPECT_THAT(LeasedKey::Grant(nullptr, LeasedKeyOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("etcd client")));
  EtcdClientOptions etcd_options;
  etcd_options.endpoints = {"127.0.0.1:1"};  // never called: the options are checked first
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> etcd, EtcdClient::Connect(etcd_options));
  LeasedKeyOptions options;
  options.retry_interval = absl::ZeroDuration();
  EXPECT_THAT(LeasedKey::Grant(etcd.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("retry intervals")));
  options.retry_interval = absl::Seconds(2);
  options.max_retry_interval = absl::Seconds(1);
  EXPECT_THAT(LeasedKey::Grant(etcd.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("retry intervals")));
}

}  // namespace
}  // namespace pserver
