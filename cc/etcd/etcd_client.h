// An etcd v3 client over etcd's own gRPC API (the KV, Lease and Watch
// services of etcdserverpb/rpc.proto): keys and values, transactions, leases
// with a background keep-alive, and watches on a key prefix. The pserver
// registry, checkpoint publishing and discovery coordinate through it; nothing
// else in pserver talks to etcd.
//
//   EtcdClientOptions options;
//   options.endpoints = {"127.0.0.1:2379"};
//   options.prefix = "/pserver/demo";                   // every key lives under it
//   PS_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> etcd, EtcdClient::Connect(options));
//
//   PS_ASSIGN_OR_RETURN(int64_t lease, etcd->Grant(absl::Seconds(10)));
//   PS_ASSIGN_OR_RETURN(std::unique_ptr<LeaseKeeper> keeper,
//                       etcd->KeepAlive(lease, [](const absl::Status& lost) { ... }));
//   PS_ASSIGN_OR_RETURN(bool claimed, etcd->PutIfAbsent("/ps/0", "10.0.0.1:7000", lease));
//
//   PS_ASSIGN_OR_RETURN(std::unique_ptr<Watcher> watcher,
//                       etcd->Watch("/ps/", /*start_revision=*/0, [](const WatchEvent& e) {
//                         // e.type, e.kv.key, e.kv.value, e.kv.mod_revision
//                       }));
//
// Every call has a deadline, options.timeout from its start. Within it a call
// that finds etcd unreachable (UNAVAILABLE) tries the next endpoint, and when
// none answers, backs off briefly and tries again, so a call made while etcd
// restarts on the same address succeeds once it is back, without a new
// client. Errors keep gRPC's (= absl's) code and name the operation, the key
// and the endpoint: "etcd put /pserver/demo/ps/0 on 127.0.0.1:2379: ...";
// when no endpoint could be reached, why ("not reachable: connection
// refused", "not reachable: no connection within the deadline ...").
//
// A write retried after a lost reply may be applied twice; Put, Delete and
// PutIfAbsent are written so that a repeat is harmless, and Txn callers should
// make their compares so too.
//
// Thread safety: EtcdClient is safe for concurrent use from multiple threads.
// Watchers and LeaseKeepers may outlive the client that made them; each runs
// its own thread, and its callback must not destroy it.
#ifndef PSERVER_CC_ETCD_ETCD_CLIENT_H_
#define PSERVER_CC_ETCD_ETCD_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace pserver {

namespace etcd_internal {
class Connection;
}  // namespace etcd_internal

// TLS to etcd, with a client certificate for etcd's --client-cert-auth
// (docs/security.md). PEM files, read by EtcdClient::Connect.
struct EtcdTlsOptions {
  std::string ca;    // verifies etcd's certificate (--trusted-ca-file's CA)
  std::string cert;  // this client's certificate; with `key`, or neither
  std::string key;
  bool enabled() const { return !ca.empty() || !cert.empty() || !key.empty(); }
};

struct EtcdClientOptions {
  // etcd client endpoints as "host:port" ("http://" is accepted and dropped,
  // and "https://" with `tls`). Calls go to the first that answers.
  std::vector<std::string> endpoints;
  // Deadline of every call, retries included; also the time Watch and
  // KeepAlive wait to be established.
  absl::Duration timeout = absl::Seconds(5);
  // Prepended to every key (nothing is inserted between the two) and removed
  // from every key returned, so "/pserver/c1" + "/ps/0" is "/pserver/c1/ps/0".
  std::string prefix;
  // Set: every endpoint is spoken to over TLS (etcd's certificate must name
  // the endpoint's host, e.g. an IP SAN 127.0.0.1). Unset: plaintext.
  EtcdTlsOptions tls;
};

// One key as etcd stores it. Revisions are etcd's store revisions.
struct KeyValue {
  std::string key;  // without options.prefix
  std::string value;
  int64_t create_revision = 0;  // revision of the write that created it
  int64_t mod_revision = 0;     // revision of its last write
  int64_t version = 0;          // number of writes since it was created
  int64_t lease = 0;            // 0: no lease
};

// A condition of a transaction on one key. A key that does not exist has
// create_revision, mod_revision, version and lease 0 and fails every value
// comparison.
struct Compare {
  enum class Target { kVersion, kCreateRevision, kModRevision, kValue, kLease };
  enum class Result { kEqual, kNotEqual, kGreater, kLess };

  std::string key;
  Target target = Target::kCreateRevision;
  Result result = Result::kEqual;
  int64_t number = 0;  // for every target but kValue
  std::string value;   // for kValue

  // The key does not exist (its create_revision is 0).
  static Compare KeyMissing(absl::string_view key);
  // The key exists (its create_revision is greater than 0).
  static Compare KeyExists(absl::string_view key);
  static Compare ValueEquals(absl::string_view key, absl::string_view value);
  // The key's last write was at `revision` (0: the key does not exist).
  static Compare ModRevisionEquals(absl::string_view key, int64_t revision);
  static Compare LeaseEquals(absl::string_view key, int64_t lease);
};

// One operation of a transaction branch.
struct TxnOp {
  enum class Type { kPut, kDelete, kDeletePrefix, kGet, kGetPrefix };

  Type type = Type::kGet;
  std::string key;  // the key, or the prefix for k*Prefix
  std::string value;
  int64_t lease = 0;

  static TxnOp Put(absl::string_view key, absl::string_view value, int64_t lease = 0);
  static TxnOp Delete(absl::string_view key);
  static TxnOp DeletePrefix(absl::string_view prefix);
  static TxnOp Get(absl::string_view key);
  static TxnOp GetPrefix(absl::string_view prefix);
};

struct TxnResult {
  // Whether every compare held (then_ops ran) or not (else_ops ran).
  bool succeeded = false;
  // Store revision after the transaction.
  int64_t revision = 0;
  // One per operation of the branch that ran, in order.
  struct OpResult {
    std::vector<KeyValue> kvs;  // kGet, kGetPrefix: the keys read, sorted
    int64_t deleted = 0;        // kDelete, kDeletePrefix: how many were deleted
  };
  std::vector<OpResult> results;
};

// A change to a watched key.
struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  // After a put, the key as written; after a delete, its key and, as
  // mod_revision, the revision of the delete (the value is empty).
  KeyValue kv;
};

using WatchCallback = std::function<void(const WatchEvent& event)>;
// Called once, on the watcher's thread, when an established watch ends for
// good (not when it is cancelled by destroying the Watcher).
using WatchEndedCallback = std::function<void(const absl::Status& status)>;
// Called once, on the keeper's thread, when a kept-alive lease is lost.
using LeaseLostCallback = std::function<void(const absl::Status& status)>;

class Watcher;
class LeaseKeeper;

// A renewal of a lease that etcd granted: when its request was sent, on
// BootClockNow() (cc/core/boot_clock.h), and the TTL etcd answered. etcd
// counts the TTL from when it received the request, so the lease lives at
// least until sent + ttl.
struct LeaseRenewal {
  absl::Duration sent;
  absl::Duration ttl;
};

class EtcdClient {
 public:
  // Checks the options and sets up one gRPC channel per endpoint. Does not
  // wait for etcd: the first call does (INVALID_ARGUMENT on bad options only).
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(EtcdClientOptions options);

  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;
  ~EtcdClient();

  const EtcdClientOptions& options() const;

  // --- Keys ---------------------------------------------------------------

  // Sets key to value, attached to `lease` when it is not 0 (the key is then
  // deleted when the lease ends).
  absl::Status Put(absl::string_view key, absl::string_view value, int64_t lease = 0);

  // The key, or NOT_FOUND when it does not exist. Ends by `deadline` when
  // that is earlier than options.timeout from now.
  absl::StatusOr<KeyValue> Get(absl::string_view key, absl::Time deadline = absl::InfiniteFuture());

  // Every key that starts with `prefix`, sorted by key. When `revision` is not
  // null it receives the store revision the read saw, from which a Watch can
  // continue (revision + 1) without missing or repeating a change. Ends by
  // `deadline` when that is earlier than options.timeout from now.
  absl::StatusOr<std::vector<KeyValue>> GetPrefix(absl::string_view prefix,
                                                  int64_t* revision = nullptr,
                                                  absl::Time deadline = absl::InfiniteFuture());

  // Deletes the key; a key that does not exist is not an error.
  absl::Status Delete(absl::string_view key);

  // Deletes every key that starts with `prefix`.
  absl::Status DeletePrefix(absl::string_view prefix);

  // The current store revision.
  absl::StatusOr<int64_t> Revision();

  // Discards the history of changes before `revision` (the keys themselves
  // stay): reads and watches at older revisions then fail with OUT_OF_RANGE.
  absl::Status Compact(int64_t revision);

  // --- Transactions -------------------------------------------------------

  // Atomically: if every compare holds, runs then_ops, else else_ops.
  absl::StatusOr<TxnResult> Txn(const std::vector<Compare>& compares,
                                const std::vector<TxnOp>& then_ops,
                                const std::vector<TxnOp>& else_ops = {});

  // Creates key = value (under `lease` when not 0) if the key does not exist.
  // Returns true if this call created it; also true when the key already holds
  // exactly this value under this same non-zero lease, i.e. the caller owns it
  // already (as after a retry whose first reply was lost). False when someone
  // else holds the key. Of several racing callers exactly one gets true.
  absl::StatusOr<bool> PutIfAbsent(absl::string_view key, absl::string_view value,
                                   int64_t lease = 0);

  // --- Leases -------------------------------------------------------------

  // Grants a lease of `ttl` (rounded up to whole seconds; etcd may raise it to
  // its minimum, about 2 s by default). Returns the lease id.
  absl::StatusOr<int64_t> Grant(absl::Duration ttl);

  // Renews the lease once. Returns its TTL, counted again from now; NOT_FOUND
  // when the lease expired or was revoked.
  absl::StatusOr<absl::Duration> KeepAliveOnce(int64_t lease);

  // Renews the lease once now (NOT_FOUND if it is gone), then every third of
  // its TTL on a background thread until the returned keeper is destroyed
  // (which does not revoke the lease). If the lease is lost (revoked, expired,
  // or etcd unreachable until it must have expired), the keeper stops, its
  // status() says why, and `on_lost` (optional) is called once.
  absl::StatusOr<std::unique_ptr<LeaseKeeper>> KeepAlive(int64_t lease,
                                                         LeaseLostCallback on_lost = nullptr);

  // Ends the lease now and deletes its keys. NOT_FOUND if it does not exist.
  absl::Status Revoke(int64_t lease);

  // --- Watches ------------------------------------------------------------

  // Watches every key that starts with `prefix` and calls `callback` with each
  // change, in revision order, on the watcher's thread. start_revision 0
  // means changes after the watch is set up; otherwise changes from that
  // revision on (older ones included). Returns once etcd has confirmed the
  // watch (so any later write is seen), or an error after options.timeout.
  // When the stream breaks the watcher reconnects (to the next endpoint if
  // there are several) and resumes after the last revision it saw, so no
  // change is delivered twice or skipped. The watch ends for good only when
  // etcd ends it: OUT_OF_RANGE when the revision it needs was compacted away
  // (start_revision, or the one to resume from; etcd may report this only
  // after confirming the watch), FAILED_PRECONDITION when etcd cancels it.
  // Watcher::status() then says why, and `on_ended` (optional) is called.
  absl::StatusOr<std::unique_ptr<Watcher>> Watch(absl::string_view prefix, int64_t start_revision,
                                                 WatchCallback callback,
                                                 WatchEndedCallback on_ended = nullptr);

 private:
  explicit EtcdClient(std::shared_ptr<etcd_internal::Connection> connection);

  std::shared_ptr<etcd_internal::Connection> connection_;
};

// Keeps one lease alive from a background thread; see EtcdClient::KeepAlive.
// Destroying it stops the renewals (and waits for the thread). Its accessors
// are safe to call from any thread.
class LeaseKeeper {
 public:
  class Impl;

  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;
  ~LeaseKeeper();

  int64_t lease() const;
  // The TTL etcd reported at the last renewal.
  absl::Duration ttl() const;
  // The last renewal etcd granted (KeepAlive's first included).
  LeaseRenewal last_renewal() const;
  // OK while the lease is kept alive; once lost, why: NOT_FOUND (revoked or
  // expired) or UNAVAILABLE/DEADLINE_EXCEEDED (etcd unreachable until it must
  // have expired).
  absl::Status status() const;

 private:
  friend class EtcdClient;
  explicit LeaseKeeper(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

// A watch on a key prefix; see EtcdClient::Watch. Destroying it cancels the
// watch and waits for a callback in progress to return. Its accessors are safe
// to call from any thread.
class Watcher {
 public:
  class Impl;

  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;
  ~Watcher();

  // OK while the watch runs (reconnecting included); the error that ended it
  // otherwise.
  absl::Status status() const;
  // The revision of the last change delivered (set before its callback
  // runs), or the store revision the watch started at when there was none yet.
  int64_t last_revision() const;

 private:
  friend class EtcdClient;
  explicit Watcher(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace pserver

#endif  // PSERVER_CC_ETCD_ETCD_CLIENT_H_
