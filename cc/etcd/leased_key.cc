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

absl::StatusOr<bool> LeasedKey::Claim(absl::string_view key) {
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
  if (options_.ownership == LeasedKeyOptions::Ownership::kExclusive) {
    PS_ASSIGN_OR_RETURN(claimed, etcd_->PutIfAbsent(key, options_.value, lease));
  } else {
    PS_RETURN_IF_ERROR(etcd_->Put(key, options_.value, lease));
  }
  if (!claimed) return false;
  {
    absl::MutexLock lock(&mu_);
    key_ = std::string(key);
  }
  registrations_.fetch_add(1);
  return true;
}

absl::Status LeasedKey::Reclaim(const std::string& key, int64_t lease) {
  if (options_.ownership == LeasedKeyOptions::Ownership::kShared) {
    return etcd_->Put(key, options_.value, lease);
  }
  PS_ASSIGN_OR_RETURN(bool claimed, etcd_->PutIfAbsent(key, options_.value, lease));
  if (claimed) return absl::OkStatus();
  // Still held: by our own old lease (etcd restarted and restored it), or
  // by someone else.
  PS_ASSIGN_OR_RETURN(TxnResult retaken,
                      etcd_->Txn({Compare::ValueEquals(key, options_.value)},
                                 {TxnOp::Put(key, options_.value, lease)}));
  if (!retaken.succeeded) {
    return absl::FailedPreconditionError(absl::StrCat(key, " is held by another"));
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

int64_t LeasedKey::lease() const {
  absl::MutexLock lock(&mu_);
  return lease_;
}

}  // namespace pserver
