// A key held in etcd under a lease that is kept alive: how a pserver server
// holds its index (/ps/<i>) and a trainer its registration (/workers/<id>).
// LeasedKey grants the lease and keeps it alive; Claim puts the key under
// it; KeepRegistered then watches for the lease to be lost (etcd restarted,
// or unreachable for longer than the TTL) and registers again under a new
// lease, with a bounded backoff, until Release or destruction.
//
//   LeasedKeyOptions options;
//   options.value = "10.0.0.1:7000";
//   options.ttl = absl::Seconds(5);
//   options.ownership = LeasedKeyOptions::Ownership::kExclusive;
//   PS_ASSIGN_OR_RETURN(std::unique_ptr<LeasedKey> held, LeasedKey::Grant(etcd, options));
//   PS_ASSIGN_OR_RETURN(bool claimed, held->Claim(etcd_keys::ServerKey(0)));
//   if (claimed) held->KeepRegistered();
//   ...
//   held->Release();  // deletes the key at once (revokes the lease)
//
// Thread safety: LeasedKey is safe for concurrent use from multiple threads.
// The EtcdClient must outlive it.
#ifndef PSERVER_CC_ETCD_LEASED_KEY_H_
#define PSERVER_CC_ETCD_LEASED_KEY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cc/etcd/etcd_client.h"

namespace pserver {

struct LeasedKeyOptions {
  // Who may hold the key.
  enum class Ownership {
    // Whoever claims it: Claim overwrites (a trainer restarted with the same
    // id takes its registration over).
    kShared,
    // One holder: Claim puts the key only if it is absent (false otherwise).
    // Re-registering after a lost lease retakes it also when it still holds
    // `value` (our own old registration, restored by a restarted etcd), and
    // fails with FAILED_PRECONDITION "<key> is held by another" otherwise.
    kExclusive,
  };

  std::string value;  // what the key holds
  absl::Duration ttl = absl::Seconds(5);
  Ownership ownership = Ownership::kShared;
  // The pause after a failed re-registration; it doubles after each
  // further failure, up to max_retry_interval.
  absl::Duration retry_interval = absl::Milliseconds(100);
  absl::Duration max_retry_interval = absl::Seconds(1);
  // Optional: told about re-registrations and (at most every 2 s) failed ones.
  std::function<void(const std::string& message)> log;
};

// What else a claim checks and writes, in the same etcd transaction as the
// key: how a server bumps its shard's epoch as it claims /ps/<i>
// (cc/etcd/shard_config.h), and keeps a re-registration from retaking an
// index that another server has held since.
struct ClaimGuard {
  std::vector<Compare> compares;  // must all hold for the claim
  std::vector<TxnOp> ops;         // written with the key
  // Must all hold for every re-registration after a lost lease (e.g. the
  // shard's configuration still names this holder); otherwise it fails
  // with FAILED_PRECONDITION and is retried, as when the key is taken.
  std::vector<Compare> reclaim_compares;
  // When set, called at every re-registration for the compares to use
  // instead of reclaim_compares: for a condition that the holder itself
  // changes while it holds the key (a primary rewrites /shards/<i> as
  // standbys attach and are dropped; a fixed compare would keep it from
  // ever re-registering after that).
  std::function<std::vector<Compare>()> current_reclaim_compares;
  bool empty() const {
    return compares.empty() && ops.empty() && reclaim_compares.empty() &&
           !current_reclaim_compares;
  }
};

class LeasedKey {
 public:
  // Grants a lease of options.ttl and keeps it alive; no key is held yet.
  // (etcd rounds the ttl up to whole seconds, at least 1.) INVALID_ARGUMENT
  // for a null etcd or a retry interval that is not positive; etcd's error
  // otherwise (a lease granted before the error is revoked).
  static absl::StatusOr<std::unique_ptr<LeasedKey>> Grant(EtcdClient* etcd,
                                                          LeasedKeyOptions options);

  LeasedKey(const LeasedKey&) = delete;
  LeasedKey& operator=(const LeasedKey&) = delete;
  // Release().
  ~LeasedKey();

  // Puts `key` = options.value under the lease, as options.ownership says,
  // in one transaction with `guard`'s compares and writes. True when the key
  // is now held (registrations() counts it); false when kExclusive and
  // someone holds it, or a compare of the guard failed. Once a key is held,
  // it is the one re-registered (under guard.reclaim_compares); claiming
  // another is FAILED_PRECONDITION.
  absl::StatusOr<bool> Claim(absl::string_view key, ClaimGuard guard = {});

  // Starts a background thread that registers the key again under a new
  // lease whenever the lease is lost. Call once, after a successful Claim.
  void KeepRegistered();
  // Stops that thread (promptly: it waits on a condition, not a sleep, though
  // an etcd call in progress runs to its own deadline); the
  // lease is still kept alive. Idempotent.
  void StopReregistering();
  // StopReregistering, stops the keep-alive and revokes the lease, deleting
  // the key at once. Idempotent.
  void Release();

  // The key held ("" before a successful Claim) and the current lease (0
  // after Release).
  std::string key() const;
  int64_t lease() const;
  // The last renewal etcd granted of the lease the key is held under;
  // nullopt before a successful Claim, once that lease is lost (until a
  // re-registration) and after Release. While the lease lives the key is
  // held, so until renewal.sent + renewal.ttl nobody else can hold it.
  std::optional<LeaseRenewal> LastRenewal() const;

  // Successful claims: 1 after the first, one more per re-registration.
  int registrations() const { return registrations_.load(); }
  // Leases lost (each noticed by the keep-alive).
  int leases_lost() const { return leases_lost_.load(); }

 private:
  LeasedKey(EtcdClient* etcd, LeasedKeyOptions options);

  // A new lease, kept alive; lost_ is set when it is lost.
  absl::StatusOr<std::unique_ptr<LeaseKeeper>> NewLease();
  // Puts key_ under `lease` for a re-registration (kExclusive: retaking our
  // own value).
  absl::Status Reclaim(const std::string& key, int64_t lease);
  // Grants a new lease, puts the key under it and revokes the old one.
  absl::Status Reregister();
  void ReregisterLoop();

  EtcdClient* const etcd_;
  const LeasedKeyOptions options_;

  mutable absl::Mutex mu_;
  std::unique_ptr<LeaseKeeper> keeper_ ABSL_GUARDED_BY(mu_);
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  std::string key_ ABSL_GUARDED_BY(mu_);
  std::vector<Compare> reclaim_compares_ ABSL_GUARDED_BY(mu_);
  std::function<std::vector<Compare>()> current_reclaim_compares_ ABSL_GUARDED_BY(mu_);
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int> registrations_{0};
  std::atomic<int> leases_lost_{0};

  absl::Mutex thread_mu_;  // serializes starting and joining thread_
  std::thread thread_ ABSL_GUARDED_BY(thread_mu_);
};

}  // namespace pserver

#endif  // PSERVER_CC_ETCD_LEASED_KEY_H_
