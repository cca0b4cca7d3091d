#include "cc/etcd/leased_key.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/core/status_macros.h"

namespace pserver {

absl::StatusOr<std::unique_ptr<LeasedKey>> LeasedKey::Grant(EtcdClient* etcd,
                                                            LeasedKeyOptions options) {
  if (etcd == nullptr) return absl::InvalidArgumentError("LeasedKey needs an etcd client");
  if (options.retry_interval <= absl::ZeroDuration() ||
      options.max_retry_interval < options.retry_interval) {
    return absl::InvalidArgumentError(
        absl::StrCat("LeasedKey retry intervals must be positive and max >= first, not ",
                     absl::FormatDuration(options.retry_interval), " and ",
                     absl::FormatDuration(options.max_retry_interval)));
  }
  std::unique_ptr<LeasedKey> held(new LeasedKey(etcd, std::move(options)));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<LeaseKeeper> keeper, held->NewLease());
  absl::MutexLock lock(&held->mu_);
  held->lease_ = keeper->lease();
  held->keeper_ = std::move(keeper);
  return held;
}

LeasedKey::LeasedKey(EtcdClient* etcd, LeasedKeyOptions options)
    : etcd_(etcd), options_(std::move(options)) {}

LeasedKey::~LeasedKey() { Release(); }

absl::StatusOr<std::unique_ptr<LeaseKeeper>> LeasedKey::NewLease() {
  PS_ASSIGN_OR_RETURN(int64_t lease, etcd_->Grant(options_.ttl));
  absl::StatusOr<std::unique_ptr<LeaseKeeper>> keeper =
      etcd_->KeepAlive(lease, [this](const absl::Status&) {
        leases_lost_.fetch_add(1);
        absl::MutexLock lock(&mu_);
        lost_ = true;
      });
  if (!keeper.ok()) etcd_->Revoke(lease).IgnoreError();
  return keeper;
}

absl::StatusOr<bool> LeasedKey::Claim(absl::string_view key, ClaimGuard guard) {
  int64_t lease = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!key_.empty() && key_ != key) {
      return absl::FailedPreconditionError(
          absl::StrCat("this lease holds ", key_, " already; it cannot claim ", key));
    }
    lease = lease_;
  }
  if (lease == 0) return absl::FailedPreconditionError("the lease was released");
  bool claimed = true;
  const bool exclusive = options_.ownership == LeasedKeyOptions::Ownership::kExclusive;
  if (guard.compares.empty() && guard.ops.empty()) {
    if (exclusive) {
      PS_ASSIGN_OR_RETURN(claimed, etcd_->PutIfAbsent(key, options_.value, lease));
    } else {
      PS_RETURN_IF_ERROR(etcd_->Put(key, options_.value, lease));
    }
  } else {
    std::vector<Compare> compares = std::move(guard.compares);
    if (exclusive) compares.push_back(Compare::KeyMissing(key));
    std::vector<TxnOp> ops = std::move(guard.ops);
    ops.push_back(TxnOp::Put(key, options_.value, lease));
    PS_ASSIGN_OR_RETURN(TxnResult result, etcd_->Txn(compares, ops, {TxnOp::Get(key)}));
    claimed = result.succeeded;
    if (!claimed && !result.results.empty() && result.results[0].kvs.size() == 1) {
      // Ours already: a retry of this claim whose first reply was lost.
      const KeyValue& held = result.results[0].kvs[0];
      claimed = held.value == options_.value && held.lease == lease;
    }
  }
  if (!claimed) return false;
  {
    absl::MutexLock lock(&mu_);
    key_ = std::string(key);
    reclaim_compares_ = std::move(guard.reclaim_compares);
    current_reclaim_compares_ = std::move(guard.current_reclaim_compares);
  }
  registrations_.fetch_add(1);
  return true;
}

absl::Status LeasedKey::Reclaim(const std::string& key, int64_t lease) {
  std::vector<Compare> guard;
  std::function<std::vector<Compare>()> current;
  {
    absl::MutexLock lock(&mu_);
    guard = reclaim_compares_;
    current = current_reclaim_compares_;
  }
  if (current) guard = current();  // outside mu_: it may take the holder's own locks
  if (options_.ownership == LeasedKeyOptions::Ownership::kShared && guard.empty()) {
    return etcd_->Put(key, options_.value, lease);
  }
  // Absent, or still held by our own old lease (etcd restarted and restored
  // it); with the guard's compares too.
  std::vector<Compare> absent = guard;
  if (options_.ownership == LeasedKeyOptions::Ownership::kExclusive) {
    absent.push_back(Compare::KeyMissing(key));
  }
  PS_ASSIGN_OR_RETURN(TxnResult put, etcd_->Txn(absent, {TxnOp::Put(key, options_.value, lease)}));
  if (put.succeeded) return absl::OkStatus();
  std::vector<Compare> ours = guard;
  ours.push_back(Compare::ValueEquals(key, options_.value));
  PS_ASSIGN_OR_RETURN(TxnResult retaken,
                      etcd_->Txn(ours, {TxnOp::Put(key, options_.value, lease)}));
  if (!retaken.succeeded) {
    return absl::FailedPreconditionError(
        guard.empty() ? absl::StrCat(key, " is held by another")
                      : absl::StrCat(key,
                                     " is held by another, or the claim's conditions no "
                                     "longer hold"));
  }
  return absl::OkStatus();
}

absl::Status LeasedKey::Reregister() {
  std::string key;
  {
    absl::MutexLock lock(&mu_);
    key = key_;
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<LeaseKeeper> keeper, NewLease());
  const int64_t lease = keeper->lease();
  absl::Status claimed = Reclaim(key, lease);
  if (!claimed.ok()) {
    keeper.reset();
    etcd_->Revoke(lease).IgnoreError();
    return claimed;
  }
  int64_t old_lease = 0;
  {
    absl::MutexLock lock(&mu_);
    std::swap(keeper_, keeper);
    old_lease = lease_;
    lease_ = lease;
    lost_ = !keeper_->status().ok();
  }
  keeper.reset();  // the old keeper, outside the lock: its thread may be in the callback
  // The key is under the new lease now; the old one (if etcd still has it)
  // holds nothing of ours.
  if (old_lease != 0) etcd_->Revoke(old_lease).IgnoreError();
  registrations_.fetch_add(1);
  if (options_.log) options_.log(absl::StrCat("re-registered at ", key, " (lease ", lease, ")"));
  return absl::OkStatus();
}

void LeasedKey::KeepRegistered() {
  absl::MutexLock lock(&thread_mu_);
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { ReregisterLoop(); });
}

void LeasedKey::ReregisterLoop() {
  absl::Duration pause = options_.retry_interval;
  absl::Time last_error_log = absl::InfinitePast();
  auto lost_or_stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return lost_ || stopping_;
  };
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&lost_or_stopping));
      if (stopping_) return;
    }
    absl::Status status = Reregister();
    if (status.ok()) {
      pause = options_.retry_interval;
      continue;
    }
    if (options_.log && absl::Now() - last_error_log > absl::Seconds(2)) {
      options_.log(absl::StrCat("lease lost; re-registering failed (will retry): ",
                                status.ToString()));
      last_error_log = absl::Now();
    }
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), pause)) return;
    }
    pause = std::min(pause * 2, options_.max_retry_interval);
  }
}

void LeasedKey::StopReregistering() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  absl::MutexLock lock(&thread_mu_);
  if (thread_.joinable()) thread_.join();
}

void LeasedKey::Release() {
  StopReregistering();
  std::unique_ptr<LeaseKeeper> keeper;
  int64_t lease = 0;
  {
    absl::MutexLock lock(&mu_);
    keeper = std::move(keeper_);
    lease = lease_;
    lease_ = 0;
  }
  keeper.reset();
  if (lease != 0) etcd_->Revoke(lease).IgnoreError();
}

std::string LeasedKey::key() const {
  absl::MutexLock lock(&mu_);
  return key_;
}

std::optional<LeaseRenewal> LeasedKey::LastRenewal() const {
  absl::MutexLock lock(&mu_);
  if (key_.empty() || lost_ || lease_ == 0 || keeper_ == nullptr) return std::nullopt;
  if (!keeper_->status().ok()) return std::nullopt;
  return keeper_->last_renewal();
}

int64_t LeasedKey::lease() const {
  absl::MutexLock lock(&mu_);
  return lease_;
}

}  // namespace pserver
