#include "cc/etcd/etcd_client.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "cc/core/boot_clock.h"
#include "cc/core/status_macros.h"
#include "cc/rpc/grpc_status.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace pserver {
namespace etcd_internal {

namespace pb = ::etcdserverpb;

// Lets one thread cancel the gRPC call another thread is blocked in, and wake
// it from its back-off sleeps: how Watcher and LeaseKeeper stop promptly.
class Canceller {
 public:
  // Makes `context` the call to cancel; false if Cancel() came first.
  bool Register(grpc::ClientContext* context) {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return false;
    context_ = context;
    return true;
  }
  void Unregister() {
    absl::MutexLock lock(&mu_);
    context_ = nullptr;
  }
  void Cancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  bool cancelled() const {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }
  // Sleeps for `duration` unless cancelled first. Returns false if cancelled.
  bool SleepFor(absl::Duration duration) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&cancelled_), duration);
    return !cancelled_;
  }

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
};

struct Endpoint {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
  std::unique_ptr<pb::Watch::Stub> watch;

  // Notes how an attempt on this endpoint ended. Returns why the endpoint
  // is not reachable (UnreachableCause, kept across attempts and calls, so a
  // vague cause does not hide an earlier telling one), or "" once it answered.
  std::string Note(const grpc::Status& status) {
    const std::string cause = UnreachableCause(status, channel->GetState(/*try_to_connect=*/false));
    absl::MutexLock lock(&mu_);
    unreachable_ = cause.empty() ? "" : LatestCause(unreachable_, cause);
    return unreachable_;
  }

 private:
  absl::Mutex mu_;
  std::string unreachable_ ABSL_GUARDED_BY(mu_);
};

// `message` led by why the endpoint was not reachable, if it was not.
std::string WithCause(const std::string& cause, const std::string& message) {
  return cause.empty() ? message : absl::StrCat("not reachable: ", cause);
}

// One try of a call on one endpoint, with a context whose deadline is set.
using Attempt = std::function<grpc::Status(Endpoint& endpoint, grpc::ClientContext& context)>;

namespace {

grpc::ChannelArguments ChannelArgumentsForEtcd() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  // Each client its own connections, so one client's failures and back-off
  // never leak into another's.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Reconnect to a restarted etcd within a second, not after gRPC's default
  // back-off, which grows to two minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // gRPC also gives each connection attempt at least this long. At 100 ms a
  // busy machine (or an etcd still starting) could not finish the TCP and
  // HTTP/2 handshake in time, and every attempt was cut off ("handshaker
  // shutdown") until the call's deadline. A refused connection still fails at
  // once; this only bounds a handshake in progress.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 2000);
  // Notice a dead peer under a long-lived watch. Only while calls are open:
  // etcd (--grpc-keepalive-min-time 5s) rejects idle pings.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return args;
}

// The whole of a PEM file; NOT_FOUND or INVALID_ARGUMENT naming it.
absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) {
    return absl::NotFoundError(absl::StrCat("etcd TLS ", what, " file '", path,
                                            "' cannot be read"));
  }
  if (text.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd TLS ", what, " file '", path, "' is not PEM"));
  }
  return text.str();
}

// Credentials for etcd over TLS: its CA, and this client's certificate.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> TlsCredentials(
    const EtcdTlsOptions& tls) {
  if (tls.cert.empty() != tls.key.empty()) {
    return absl::InvalidArgumentError(
        "etcd TLS: give both a client certificate and its key, or neither");
  }
  grpc::SslCredentialsOptions ssl;
  if (!tls.ca.empty()) {
    PS_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPem(tls.ca, "CA"));
  }
  if (!tls.cert.empty()) {
    PS_ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPem(tls.cert, "certificate"));
    PS_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPem(tls.key, "key"));
  }
  return grpc::SslCredentials(ssl);
}

// "host:port", or INVALID_ARGUMENT.
absl::StatusOr<std::string> ParseEndpoint(absl::string_view endpoint, bool tls) {
  std::string address(absl::StripAsciiWhitespace(endpoint));
  if (absl::StartsWith(address, "https://")) {
    if (!tls) {
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd endpoint '", endpoint,
          "': TLS needs the client's CA, certificate and key (EtcdClientOptions.tls, "
          "--etcd_tls_ca/--etcd_tls_cert/--etcd_tls_key)"));
    }
    address = address.substr(8);
  }
  if (absl::StartsWith(address, "http://")) address = address.substr(7);
  if (!address.empty() && address.back() == '/') address.pop_back();
  size_t colon = address.rfind(':');
  int port = 0;
  if (address.empty() || colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint '", endpoint, "' is not host:port"));
  }
  return address;
}

// The end of the key range of all keys starting with `prefix` (etcd's
// convention: "\0" means "to the last key").
std::string PrefixRangeEnd(absl::string_view prefix) {
  std::string end(prefix);
  for (int i = static_cast<int>(end.size()) - 1; i >= 0; --i) {
    if (static_cast<unsigned char>(end[i]) < 0xff) {
      ++end[i];
      end.resize(i + 1);
      return end;
    }
  }
  return std::string(1, '\0');
}

std::string LeaseName(int64_t lease) { return absl::StrCat("lease ", absl::Hex(lease)); }

std::string Shown(absl::string_view key) { return absl::CHexEscape(key); }

std::string Ago(absl::Duration duration) {
  return absl::FormatDuration(absl::Trunc(duration, absl::Milliseconds(1)));
}

}  // namespace

// What the client, its watchers and its lease keepers share: the options and
// one channel per endpoint. Shared ownership lets watchers and keepers outlive
// the client; the last owner is always a user's thread (a Watcher's or
// LeaseKeeper's destructor after joining, or ~EtcdClient), never a gRPC one.
class Connection {
 public:
  Connection(EtcdClientOptions options, std::vector<std::string> addresses,
             std::shared_ptr<grpc::ChannelCredentials> credentials)
      : options_(std::move(options)) {
    for (std::string& address : addresses) {
      auto endpoint = std::make_unique<Endpoint>();
      endpoint->address = std::move(address);
      endpoint->channel =
          grpc::CreateCustomChannel(endpoint->address, credentials, ChannelArgumentsForEtcd());
      endpoint->kv = pb::KV::NewStub(endpoint->channel);
      endpoint->lease = pb::Lease::NewStub(endpoint->channel);
      endpoint->watch = pb::Watch::NewStub(endpoint->channel);
      endpoints_.push_back(std::move(endpoint));
    }
  }

  const EtcdClientOptions& options() const { return options_; }
  // When a call started now ends: options.timeout from now, or `limit` when
  // that is earlier.
  absl::Time Deadline(absl::Time limit = absl::InfiniteFuture()) const {
    return std::min(absl::Now() + options_.timeout, limit);
  }

  std::string Key(absl::string_view key) const { return absl::StrCat(options_.prefix, key); }
  std::string StripPrefix(const std::string& key) const {
    if (absl::StartsWith(key, options_.prefix)) return key.substr(options_.prefix.size());
    return key;
  }
  KeyValue ToKeyValue(const mvccpb::KeyValue& kv) const {
    KeyValue out;
    out.key = StripPrefix(kv.key());
    out.value = kv.value();
    out.create_revision = kv.create_revision();
    out.mod_revision = kv.mod_revision();
    out.version = kv.version();
    out.lease = kv.lease();
    return out;
  }

  size_t num_endpoints() const { return endpoints_.size(); }
  Endpoint& endpoint(size_t index) { return *endpoints_[index % endpoints_.size()]; }
  size_t preferred() const { return preferred_.load(std::memory_order_relaxed); }

  // Asks every channel that is waiting to reconnect (TRANSIENT_FAILURE) to
  // try again now; one still connecting is left to finish its attempt.
  void ResetBackoff() {
    for (auto& endpoint : endpoints_) {
      if (endpoint->channel->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_TRANSIENT_FAILURE) {
        grpc::experimental::ChannelResetConnectionBackoff(endpoint->channel.get());
      }
    }
  }

  // Waits until `until` or until a channel is connected, on the channels
  // themselves rather than asleep: waiting on a channel is what drives its
  // connection attempt. gRPC 1.51's synchronous calls that fail fast (a
  // channel in TRANSIENT_FAILURE) leave no thread polling a connect in
  // progress, so a client whose first connection was refused (etcd not yet
  // up, or restarting) timed out every later attempt and never reached the
  // etcd that came up. False if `canceller` was cancelled.
  bool AwaitConnection(absl::Time until, Canceller* canceller) {
    constexpr absl::Duration kSlice = absl::Milliseconds(50);  // how soon a cancel is seen
    for (size_t i = 0;; ++i) {
      if (canceller != nullptr && canceller->cancelled()) return false;
      const absl::Time now = absl::Now();
      if (now >= until) return true;
      const std::shared_ptr<grpc::Channel>& channel = endpoints_[i % endpoints_.size()]->channel;
      if (channel->WaitForConnected(absl::ToChronoTime(std::min(until, now + kSlice)))) {
        return canceller == nullptr || !canceller->cancelled();
      }
    }
  }

  // Runs `attempt` on the endpoints in turn, from the one that answered last,
  // until one answers with anything but UNAVAILABLE or `deadline` passes;
  // after a round in which none answered it backs off briefly (etcd may be
  // restarting). Returns the answer, its message prefixed with "etcd <op>
  // <what> on <endpoint>: ". `answered_by` (optional) receives the endpoint.
  absl::Status Call(absl::string_view op, absl::string_view what, absl::Time deadline,
                    const Attempt& attempt, Canceller* canceller = nullptr,
                    std::string* answered_by = nullptr) {
    const size_t n = endpoints_.size();
    size_t index = preferred();
    absl::Duration backoff = absl::Milliseconds(50);
    grpc::Status last(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline passed before a try");
    size_t last_index = index;
    std::string last_cause;  // why endpoints_[last_index] was not reached
    const absl::Time start = absl::Now();
    while (true) {
      for (size_t tried = 0; tried < n; ++tried, index = (index + 1) % n) {
        if (absl::Now() >= deadline) break;
        Endpoint& endpoint = *endpoints_[index];
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(deadline));
        if (canceller != nullptr && !canceller->Register(&context)) {
          return Error(absl::StatusCode::kCancelled, op, what, endpoint.address, "cancelled");
        }
        grpc::Status status = attempt(endpoint, context);
        if (canceller != nullptr) canceller->Unregister();
        last_cause = endpoint.Note(status);
        last = std::move(status);
        last_index = index;
        if (last.error_code() != grpc::StatusCode::UNAVAILABLE) break;
      }
      if (last.error_code() != grpc::StatusCode::UNAVAILABLE) break;
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      const absl::Duration pause = std::min(backoff, left);
      ResetBackoff();
      if (!AwaitConnection(absl::Now() + pause, canceller)) {
        return Error(absl::StatusCode::kCancelled, op, what, endpoints_[last_index]->address,
                     "cancelled");
      }
      backoff = std::min(backoff * 2, absl::Milliseconds(500));
    }
    const std::string& address = endpoints_[last_index]->address;
    if (answered_by != nullptr) *answered_by = address;
    if (last.ok()) {
      preferred_.store(last_index, std::memory_order_relaxed);
      return absl::OkStatus();
    }
    std::string message = WithCause(last_cause, last.error_message());
    if (last.error_code() == grpc::StatusCode::UNAVAILABLE) {
      std::vector<std::string> all;
      for (const auto& endpoint : endpoints_) all.push_back(endpoint->address);
      absl::StrAppend(&message, " (no endpoint answered for ", Ago(absl::Now() - start), "; tried ",
                      absl::StrJoin(all, ", "), ")");
    }
    return Error(static_cast<absl::StatusCode>(last.error_code()), op, what, address, message);
  }

  static absl::Status Error(absl::StatusCode code, absl::string_view op, absl::string_view what,
                            absl::string_view address, absl::string_view message) {
    return absl::Status(code, absl::StrCat("etcd ", op, what.empty() ? "" : " ", what, " on ",
                                           address, ": ", message));
  }

 private:
  const EtcdClientOptions options_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  std::atomic<size_t> preferred_{0};
};

namespace {

// One renewal: a LeaseKeepAlive stream with one request and one response.
absl::StatusOr<absl::Duration> KeepAliveOnceUntil(Connection& connection, int64_t lease,
                                                  absl::Time deadline, Canceller* canceller) {
  int64_t ttl = 0;
  absl::Status status = connection.Call(
      "keep-alive", LeaseName(lease), deadline,
      [&](Endpoint& endpoint, grpc::ClientContext& context) {
        auto stream = endpoint.lease->LeaseKeepAlive(&context);
        pb::LeaseKeepAliveRequest request;
        request.set_id(lease);
        pb::LeaseKeepAliveResponse response;
        bool answered = false;
        if (stream->Write(request) && stream->WritesDone()) answered = stream->Read(&response);
        grpc::Status status = stream->Finish();
        if (!status.ok()) return status;
        if (!answered) {
          return grpc::Status(grpc::StatusCode::UNAVAILABLE, "keep-alive stream closed early");
        }
        ttl = response.ttl();
        if (ttl <= 0) {
          return grpc::Status(grpc::StatusCode::NOT_FOUND,
                              "lease not found (it expired or was revoked)");
        }
        return grpc::Status::OK;
      },
      canceller);
  if (!status.ok()) return status;
  return absl::Seconds(ttl);
}

}  // namespace
}  // namespace etcd_internal

using etcd_internal::Ago;
using etcd_internal::Attempt;
using etcd_internal::Canceller;
using etcd_internal::Connection;
using etcd_internal::Endpoint;
using etcd_internal::Shown;
namespace pb = ::etcdserverpb;

// --- Compare and TxnOp helpers --------------------------------------------

Compare Compare::KeyMissing(absl::string_view key) {
  Compare c;
  c.key = std::string(key);
  c.target = Target::kCreateRevision;
  c.result = Result::kEqual;
  c.number = 0;
  return c;
}

Compare Compare::KeyExists(absl::string_view key) {
  Compare c = KeyMissing(key);
  c.result = Result::kGreater;
  return c;
}

Compare Compare::ValueEquals(absl::string_view key, absl::string_view value) {
  Compare c;
  c.key = std::string(key);
  c.target = Target::kValue;
  c.result = Result::kEqual;
  c.value = std::string(value);
  return c;
}

Compare Compare::ModRevisionEquals(absl::string_view key, int64_t revision) {
  Compare c;
  c.key = std::string(key);
  c.target = Target::kModRevision;
  c.result = Result::kEqual;
  c.number = revision;
  return c;
}

Compare Compare::LeaseEquals(absl::string_view key, int64_t lease) {
  Compare c;
  c.key = std::string(key);
  c.target = Target::kLease;
  c.result = Result::kEqual;
  c.number = lease;
  return c;
}

TxnOp TxnOp::Put(absl::string_view key, absl::string_view value, int64_t lease) {
  TxnOp op;
  op.type = Type::kPut;
  op.key = std::string(key);
  op.value = std::string(value);
  op.lease = lease;
  return op;
}

TxnOp TxnOp::Delete(absl::string_view key) {
  TxnOp op;
  op.type = Type::kDelete;
  op.key = std::string(key);
  return op;
}

TxnOp TxnOp::DeletePrefix(absl::string_view prefix) {
  TxnOp op = Delete(prefix);
  op.type = Type::kDeletePrefix;
  return op;
}

TxnOp TxnOp::Get(absl::string_view key) {
  TxnOp op;
  op.type = Type::kGet;
  op.key = std::string(key);
  return op;
}

TxnOp TxnOp::GetPrefix(absl::string_view prefix) {
  TxnOp op = Get(prefix);
  op.type = Type::kGetPrefix;
  return op;
}

namespace {

// Sets key and range_end of a request over every key starting with `prefix`
// (the whole key space when it is empty).
template <typename Request>
void SetPrefixRange(const std::string& prefix, Request* request) {
  request->set_key(prefix.empty() ? std::string(1, '\0') : prefix);
  request->set_range_end(etcd_internal::PrefixRangeEnd(prefix));
}

absl::Status CheckKey(absl::string_view op, const std::string& full_key) {
  if (full_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("etcd ", op, ": the key is empty"));
  }
  return absl::OkStatus();
}

absl::Status FillCompare(const Connection& connection, const Compare& compare, pb::Compare* out) {
  out->set_key(connection.Key(compare.key));
  switch (compare.result) {
    case Compare::Result::kEqual:
      out->set_result(pb::Compare::EQUAL);
      break;
    case Compare::Result::kNotEqual:
      out->set_result(pb::Compare::NOT_EQUAL);
      break;
    case Compare::Result::kGreater:
      out->set_result(pb::Compare::GREATER);
      break;
    case Compare::Result::kLess:
      out->set_result(pb::Compare::LESS);
      break;
  }
  switch (compare.target) {
    case Compare::Target::kVersion:
      out->set_target(pb::Compare::VERSION);
      out->set_version(compare.number);
      break;
    case Compare::Target::kCreateRevision:
      out->set_target(pb::Compare::CREATE);
      out->set_create_revision(compare.number);
      break;
    case Compare::Target::kModRevision:
      out->set_target(pb::Compare::MOD);
      out->set_mod_revision(compare.number);
      break;
    case Compare::Target::kValue:
      out->set_target(pb::Compare::VALUE);
      out->set_value(compare.value);
      break;
    case Compare::Target::kLease:
      out->set_target(pb::Compare::LEASE);
      out->set_lease(compare.number);
      break;
  }
  return CheckKey("txn compare", out->key());
}

absl::Status FillOp(const Connection& connection, const TxnOp& op, pb::RequestOp* out) {
  const std::string key = connection.Key(op.key);
  switch (op.type) {
    case TxnOp::Type::kPut: {
      pb::PutRequest* put = out->mutable_request_put();
      put->set_key(key);
      put->set_value(op.value);
      put->set_lease(op.lease);
      return CheckKey("txn put", key);
    }
    case TxnOp::Type::kDelete:
      out->mutable_request_delete_range()->set_key(key);
      return CheckKey("txn delete", key);
    case TxnOp::Type::kDeletePrefix:
      SetPrefixRange(key, out->mutable_request_delete_range());
      return absl::OkStatus();
    case TxnOp::Type::kGet:
      out->mutable_request_range()->set_key(key);
      return CheckKey("txn get", key);
    case TxnOp::Type::kGetPrefix: {
      pb::RangeRequest* range = out->mutable_request_range();
      SetPrefixRange(key, range);
      range->set_sort_order(pb::RangeRequest::ASCEND);
      range->set_sort_target(pb::RangeRequest::KEY);
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError("etcd txn: unknown operation type");
}

}  // namespace

// --- EtcdClient ---------------------------------------------------------------

EtcdClient::EtcdClient(std::shared_ptr<Connection> connection)
    : connection_(std::move(connection)) {}

EtcdClient::~EtcdClient() = default;

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(EtcdClientOptions options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("etcd: no endpoints given");
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("etcd: the timeout must be positive, not ",
                                                   absl::FormatDuration(options.timeout)));
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options.tls.enabled()) {
    PS_ASSIGN_OR_RETURN(credentials, etcd_internal::TlsCredentials(options.tls));
  }
  std::vector<std::string> addresses;
  for (const std::string& endpoint : options.endpoints) {
    absl::StatusOr<std::string> address =
        etcd_internal::ParseEndpoint(endpoint, options.tls.enabled());
    if (!address.ok()) return address.status();
    addresses.push_back(*std::move(address));
  }
  return std::unique_ptr<EtcdClient>(
      new EtcdClient(std::make_shared<Connection>(std::move(options), std::move(addresses),
                                                  std::move(credentials))));
}

const EtcdClientOptions& EtcdClient::options() const { return connection_->options(); }

absl::Status EtcdClient::Put(absl::string_view key, absl::string_view value, int64_t lease) {
  pb::PutRequest request;
  request.set_key(connection_->Key(key));
  request.set_value(std::string(value));
  request.set_lease(lease);
  absl::Status valid = CheckKey("put", request.key());
  if (!valid.ok()) return valid;
  pb::PutResponse response;
  return connection_->Call("put", Shown(request.key()), connection_->Deadline(),
                           [&](Endpoint& endpoint, grpc::ClientContext& context) {
                             return endpoint.kv->Put(&context, request, &response);
                           });
}

absl::StatusOr<KeyValue> EtcdClient::Get(absl::string_view key, absl::Time deadline) {
  pb::RangeRequest request;
  request.set_key(connection_->Key(key));
  absl::Status valid = CheckKey("get", request.key());
  if (!valid.ok()) return valid;
  pb::RangeResponse response;
  std::string address;
  absl::Status status = connection_->Call(
      "get", Shown(request.key()), connection_->Deadline(deadline),
      [&](Endpoint& endpoint, grpc::ClientContext& context) {
        return endpoint.kv->Range(&context, request, &response);
      },
      nullptr, &address);
  if (!status.ok()) return status;
  if (response.kvs_size() == 0) {
    return Connection::Error(absl::StatusCode::kNotFound, "get", Shown(request.key()), address,
                             "key not found");
  }
  return connection_->ToKeyValue(response.kvs(0));
}

absl::StatusOr<std::vector<KeyValue>> EtcdClient::GetPrefix(absl::string_view prefix,
                                                            int64_t* revision,
                                                            absl::Time deadline) {
  pb::RangeRequest request;
  SetPrefixRange(connection_->Key(prefix), &request);
  request.set_sort_order(pb::RangeRequest::ASCEND);
  request.set_sort_target(pb::RangeRequest::KEY);
  pb::RangeResponse response;
  absl::Status status = connection_->Call("get prefix", Shown(connection_->Key(prefix)),
                                          connection_->Deadline(deadline),
                                          [&](Endpoint& endpoint, grpc::ClientContext& context) {
                                            return endpoint.kv->Range(&context, request, &response);
                                          });
  if (!status.ok()) return status;
  std::vector<KeyValue> kvs;
  kvs.reserve(response.kvs_size());
  for (const mvccpb::KeyValue& kv : response.kvs()) kvs.push_back(connection_->ToKeyValue(kv));
  if (revision != nullptr) *revision = response.header().revision();
  return kvs;
}

absl::Status EtcdClient::Delete(absl::string_view key) {
  pb::DeleteRangeRequest request;
  request.set_key(connection_->Key(key));
  absl::Status valid = CheckKey("delete", request.key());
  if (!valid.ok()) return valid;
  pb::DeleteRangeResponse response;
  return connection_->Call("delete", Shown(request.key()), connection_->Deadline(),
                           [&](Endpoint& endpoint, grpc::ClientContext& context) {
                             return endpoint.kv->DeleteRange(&context, request, &response);
                           });
}

absl::Status EtcdClient::DeletePrefix(absl::string_view prefix) {
  pb::DeleteRangeRequest request;
  SetPrefixRange(connection_->Key(prefix), &request);
  pb::DeleteRangeResponse response;
  return connection_->Call("delete prefix", Shown(connection_->Key(prefix)),
                           connection_->Deadline(),
                           [&](Endpoint& endpoint, grpc::ClientContext& context) {
                             return endpoint.kv->DeleteRange(&context, request, &response);
                           });
}

absl::StatusOr<int64_t> EtcdClient::Revision() {
  // A linearizable count of one key: the cheapest read that carries the
  // store's current revision.
  pb::RangeRequest request;
  request.set_key(connection_->Key("/"));
  request.set_count_only(true);
  pb::RangeResponse response;
  absl::Status status = connection_->Call("revision", "", connection_->Deadline(),
                                          [&](Endpoint& endpoint, grpc::ClientContext& context) {
                                            return endpoint.kv->Range(&context, request, &response);
                                          });
  if (!status.ok()) return status;
  return response.header().revision();
}

absl::Status EtcdClient::Compact(int64_t revision) {
  pb::CompactionRequest request;
  request.set_revision(revision);
  pb::CompactionResponse response;
  return connection_->Call("compact", absl::StrCat("to revision ", revision),
                           connection_->Deadline(),
                           [&](Endpoint& endpoint, grpc::ClientContext& context) {
                             return endpoint.kv->Compact(&context, request, &response);
                           });
}

absl::StatusOr<TxnResult> EtcdClient::Txn(const std::vector<Compare>& compares,
                                          const std::vector<TxnOp>& then_ops,
                                          const std::vector<TxnOp>& else_ops) {
  pb::TxnRequest request;
  for (const Compare& compare : compares) {
    absl::Status valid = FillCompare(*connection_, compare, request.add_compare());
    if (!valid.ok()) return valid;
  }
  for (const TxnOp& op : then_ops) {
    absl::Status valid = FillOp(*connection_, op, request.add_success());
    if (!valid.ok()) return valid;
  }
  for (const TxnOp& op : else_ops) {
    absl::Status valid = FillOp(*connection_, op, request.add_failure());
    if (!valid.ok()) return valid;
  }
  // Name the transaction by its first key: enough to find it in a log.
  std::string what;
  if (!compares.empty()) {
    what = Shown(connection_->Key(compares[0].key));
  } else if (!then_ops.empty()) {
    what = Shown(connection_->Key(then_ops[0].key));
  }
  pb::TxnResponse response;
  absl::Status status = connection_->Call("txn", what, connection_->Deadline(),
                                          [&](Endpoint& endpoint, grpc::ClientContext& context) {
                                            return endpoint.kv->Txn(&context, request, &response);
                                          });
  if (!status.ok()) return status;
  TxnResult result;
  result.succeeded = response.succeeded();
  result.revision = response.header().revision();
  for (const pb::ResponseOp& op : response.responses()) {
    TxnResult::OpResult& out = result.results.emplace_back();
    if (op.has_response_range()) {
      for (const mvccpb::KeyValue& kv : op.response_range().kvs()) {
        out.kvs.push_back(connection_->ToKeyValue(kv));
      }
    } else if (op.has_response_delete_range()) {
      out.deleted = op.response_delete_range().deleted();
    }
  }
  return result;
}

absl::StatusOr<bool> EtcdClient::PutIfAbsent(absl::string_view key, absl::string_view value,
                                             int64_t lease) {
  absl::StatusOr<TxnResult> result =
      Txn({Compare::KeyMissing(key)}, {TxnOp::Put(key, value, lease)}, {TxnOp::Get(key)});
  if (!result.ok()) return result.status();
  if (result->succeeded) return true;
  // Someone holds the key. If it is this caller (same value, same lease), an
  // earlier try of this same call may have written it before its reply was
  // lost: the claim is ours all the same.
  if (lease != 0 && !result->results.empty() && !result->results[0].kvs.empty()) {
    const KeyValue& held = result->results[0].kvs[0];
    return held.lease == lease && held.value == value;
  }
  return false;
}

absl::StatusOr<int64_t> EtcdClient::Grant(absl::Duration ttl) {
  const int64_t seconds =
      std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1))));
  pb::LeaseGrantRequest request;
  request.set_ttl(seconds);
  pb::LeaseGrantResponse response;
  std::string address;
  absl::Status status = connection_->Call(
      "grant", absl::StrCat("lease of ", seconds, "s"), connection_->Deadline(),
      [&](Endpoint& endpoint, grpc::ClientContext& context) {
        return endpoint.lease->LeaseGrant(&context, request, &response);
      },
      nullptr, &address);
  if (!status.ok()) return status;
  if (!response.error().empty()) {
    return Connection::Error(absl::StatusCode::kUnknown, "grant",
                             absl::StrCat("lease of ", seconds, "s"), address, response.error());
  }
  return response.id();
}

absl::StatusOr<absl::Duration> EtcdClient::KeepAliveOnce(int64_t lease) {
  return etcd_internal::KeepAliveOnceUntil(*connection_, lease, connection_->Deadline(), nullptr);
}

absl::Status EtcdClient::Revoke(int64_t lease) {
  pb::LeaseRevokeRequest request;
  request.set_id(lease);
  pb::LeaseRevokeResponse response;
  return connection_->Call("revoke", etcd_internal::LeaseName(lease), connection_->Deadline(),
                           [&](Endpoint& endpoint, grpc::ClientContext& context) {
                             return endpoint.lease->LeaseRevoke(&context, request, &response);
                           });
}

// --- LeaseKeeper --------------------------------------------------------------

class LeaseKeeper::Impl {
 public:
  Impl(std::shared_ptr<Connection> connection, int64_t lease, absl::Duration ttl,
       absl::Time renewed_at, absl::Duration sent_boot, LeaseLostCallback on_lost)
      : connection_(std::move(connection)),
        lease_(lease),
        on_lost_(std::move(on_lost)),
        renewed_at_(renewed_at),
        ttl_(ttl),
        last_renewal_{sent_boot, ttl} {}

  ~Impl() {
    canceller_.Cancel();
    if (thread_.joinable()) thread_.join();
  }

  void Start() {
    thread_ = std::thread([this] { Run(); });
  }

  int64_t lease() const { return lease_; }
  absl::Duration ttl() const {
    absl::MutexLock lock(&mu_);
    return ttl_;
  }
  absl::Status status() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  LeaseRenewal last_renewal() const {
    absl::MutexLock lock(&mu_);
    return last_renewal_;
  }

 private:
  // Renews at a third of the TTL; after a failed renewal, tries again soon
  // until the lease must have expired on the server (TTL after the last
  // renewal that was sent and answered).
  void Run() {
    absl::Time renewed_at;
    absl::Duration ttl;
    {
      absl::MutexLock lock(&mu_);
      renewed_at = renewed_at_;
      ttl = ttl_;
    }
    absl::Time next = renewed_at + ttl / 3;
    absl::Status last_error;
    while (true) {
      if (!canceller_.SleepFor(next - absl::Now())) return;
      const absl::Time sent = absl::Now();
      const absl::Duration sent_boot = BootClockNow();
      const absl::Time expires = renewed_at + ttl;
      if (sent >= expires) {
        Lose(absl::Status(last_error.ok() ? absl::StatusCode::kDeadlineExceeded : last_error.code(),
                          absl::StrCat("etcd keep-alive ", etcd_internal::LeaseName(lease_),
                                       ": not renewed for ", Ago(sent - renewed_at),
                                       ", so it has expired; last error: ", last_error.message())));
        return;
      }
      absl::StatusOr<absl::Duration> renewed = etcd_internal::KeepAliveOnceUntil(
          *connection_, lease_, std::min(sent + connection_->options().timeout, expires),
          &canceller_);
      if (canceller_.cancelled()) return;
      if (renewed.ok()) {
        renewed_at = sent;
        ttl = *renewed;
        {
          absl::MutexLock lock(&mu_);
          renewed_at_ = renewed_at;
          ttl_ = ttl;
          last_renewal_ = LeaseRenewal{sent_boot, ttl};
        }
        next = sent + ttl / 3;
        continue;
      }
      if (renewed.status().code() == absl::StatusCode::kNotFound) {
        Lose(renewed.status());
        return;
      }
      last_error = renewed.status();
      next = absl::Now() + absl::Milliseconds(100);
    }
  }

  void Lose(absl::Status status) {
    {
      absl::MutexLock lock(&mu_);
      status_ = status;
    }
    if (on_lost_) on_lost_(status);
  }

  const std::shared_ptr<Connection> connection_;
  const int64_t lease_;
  const LeaseLostCallback on_lost_;
  Canceller canceller_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  absl::Time renewed_at_ ABSL_GUARDED_BY(mu_);
  absl::Duration ttl_ ABSL_GUARDED_BY(mu_);
  LeaseRenewal last_renewal_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

LeaseKeeper::LeaseKeeper(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LeaseKeeper::~LeaseKeeper() = default;
int64_t LeaseKeeper::lease() const { return impl_->lease(); }
absl::Duration LeaseKeeper::ttl() const { return impl_->ttl(); }
LeaseRenewal LeaseKeeper::last_renewal() const { return impl_->last_renewal(); }
absl::Status LeaseKeeper::status() const { return impl_->status(); }

absl::StatusOr<std::unique_ptr<LeaseKeeper>> EtcdClient::KeepAlive(int64_t lease,
                                                                   LeaseLostCallback on_lost) {
  const absl::Time sent = absl::Now();
  const absl::Duration sent_boot = BootClockNow();
  absl::StatusOr<absl::Duration> ttl = KeepAliveOnce(lease);
  if (!ttl.ok()) return ttl.status();
  auto impl = std::make_unique<LeaseKeeper::Impl>(connection_, lease, *ttl, sent, sent_boot,
                                                  std::move(on_lost));
  impl->Start();
  return std::unique_ptr<LeaseKeeper>(new LeaseKeeper(std::move(impl)));
}

// --- Watcher ------------------------------------------------------------------

class Watcher::Impl {
 public:
  Impl(std::shared_ptr<Connection> connection, absl::string_view prefix, int64_t start_revision,
       WatchCallback callback, WatchEndedCallback on_ended)
      : connection_(std::move(connection)),
        prefix_(connection_->Key(prefix)),
        callback_(std::move(callback)),
        on_ended_(std::move(on_ended)),
        next_revision_(start_revision),
        last_revision_(start_revision > 0 ? start_revision - 1 : 0) {}

  ~Impl() {
    canceller_.Cancel();
    if (thread_.joinable()) thread_.join();
  }

  void Start() {
    thread_ = std::thread([this] { Run(); });
  }

  // Waits until etcd confirmed the watch or it failed for good, at most until
  // `deadline`.
  absl::Status WaitCreated(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto settled = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return created_ || !status_.ok(); };
    mu_.AwaitWithDeadline(absl::Condition(&settled), deadline);
    if (!status_.ok() || created_) return status_;
    const absl::Duration waited = connection_->options().timeout;
    if (last_error_.ok()) {
      return absl::DeadlineExceededError(
          absl::StrCat("etcd watch ", Shown(prefix_), ": not set up within ", Ago(waited)));
    }
    return absl::Status(
        last_error_.code(),
        absl::StrCat(last_error_.message(), " (watch not set up within ", Ago(waited), ")"));
  }

  absl::Status status() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  int64_t last_revision() const {
    absl::MutexLock lock(&mu_);
    return last_revision_;
  }

 private:
  using Stream = grpc::ClientReaderWriter<pb::WatchRequest, pb::WatchResponse>;

  // One stream at a time; when it breaks, a new one on the next endpoint,
  // resuming at next_revision_, after a pause that doubles up to a second.
  void Run() {
    const size_t n = connection_->num_endpoints();
    size_t index = connection_->preferred();
    absl::Duration backoff = absl::Milliseconds(100);
    while (true) {
      Endpoint& endpoint = connection_->endpoint(index);
      grpc::ClientContext context;
      if (!canceller_.Register(&context)) return;
      std::unique_ptr<Stream> stream = endpoint.watch->Watch(&context);
      absl::Status ended;  // set when etcd ended the watch for good
      bool created = false;
      bool open = false;
      if (stream->Write(CreateRequest())) {
        open = true;
        pb::WatchResponse response;
        while (stream->Read(&response)) {
          ended = Handle(endpoint, response, &created);
          if (!ended.ok()) break;
        }
        open = !ended.ok();
      }
      if (open) context.TryCancel();  // we stopped reading first
      grpc::Status status = stream->Finish();
      canceller_.Unregister();
      if (!ended.ok()) {
        bool was_created;
        {
          absl::MutexLock lock(&mu_);
          status_ = ended;
          was_created = created_;
        }
        // Before the watch was confirmed, Watch() itself returns the error.
        if (was_created && on_ended_) on_ended_(ended);
        return;
      }
      if (canceller_.cancelled()) return;
      if (created) backoff = absl::Milliseconds(100);
      {
        absl::MutexLock lock(&mu_);
        last_error_ = etcd_internal::Connection::Error(
            status.ok() ? absl::StatusCode::kUnavailable
                        : static_cast<absl::StatusCode>(status.error_code()),
            "watch", Shown(prefix_), endpoint.address,
            status.ok() ? "stream ended"
                        : etcd_internal::WithCause(endpoint.Note(status), status.error_message()));
      }
      if (status.error_code() == grpc::StatusCode::UNAVAILABLE || !created) {
        index = (index + 1) % n;
      }
      if (!canceller_.SleepFor(backoff)) return;
      backoff = std::min(backoff * 2, absl::Seconds(1));
      connection_->ResetBackoff();
    }
  }

  pb::WatchRequest CreateRequest() {
    pb::WatchRequest request;
    pb::WatchCreateRequest* create = request.mutable_create_request();
    SetPrefixRange(prefix_, create);
    // Progress notifications move next_revision_ on while nothing under the
    // prefix changes, so a resumed watch does not ask for a compacted one.
    create->set_progress_notify(true);
    absl::MutexLock lock(&mu_);
    create->set_start_revision(next_revision_);
    return request;
  }

  // Handles one response. Returns an error when etcd ended the watch.
  absl::Status Handle(const Endpoint& endpoint, const pb::WatchResponse& response, bool* created) {
    if (response.compact_revision() != 0) {
      absl::MutexLock lock(&mu_);
      return Connection::Error(
          absl::StatusCode::kOutOfRange, "watch", Shown(prefix_), endpoint.address,
          absl::StrCat("revision ", next_revision_, " was compacted (the oldest kept is ",
                       response.compact_revision(), "); changes in between are lost"));
    }
    if (response.canceled()) {
      return Connection::Error(absl::StatusCode::kFailedPrecondition, "watch", Shown(prefix_),
                               endpoint.address,
                               absl::StrCat("cancelled by etcd: ", response.cancel_reason()));
    }
    const int64_t header_revision = response.header().revision();
    if (response.created()) {
      *created = true;
      absl::MutexLock lock(&mu_);
      if (next_revision_ == 0) {  // "from now": now is the header's revision
        next_revision_ = header_revision + 1;
        last_revision_ = header_revision;
      }
      created_ = true;
    }
    if (response.events_size() == 0) {
      if (!response.created()) {
        // A progress notification: every change up to the header's revision
        // has been sent.
        absl::MutexLock lock(&mu_);
        next_revision_ = std::max(next_revision_, header_revision + 1);
        last_revision_ = std::max(last_revision_, header_revision);
      }
      return absl::OkStatus();
    }
    for (const mvccpb::Event& event : response.events()) {
      WatchEvent out;
      out.type = event.type() == mvccpb::Event::DELETE ? WatchEvent::Type::kDelete
                                                       : WatchEvent::Type::kPut;
      out.kv = connection_->ToKeyValue(event.kv());
      {
        absl::MutexLock lock(&mu_);
        last_revision_ = std::max(last_revision_, event.kv().mod_revision());
      }
      callback_(out);
    }
    // A response holds every event of each revision it covers.
    absl::MutexLock lock(&mu_);
    next_revision_ = std::max(next_revision_, last_revision_ + 1);
    return absl::OkStatus();
  }

  const std::shared_ptr<Connection> connection_;
  const std::string prefix_;  // with options.prefix
  const WatchCallback callback_;
  const WatchEndedCallback on_ended_;
  Canceller canceller_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool created_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);      // why the watch ended
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);  // why the last stream broke
  int64_t next_revision_ ABSL_GUARDED_BY(mu_);    // where to (re)start; 0: now
  int64_t last_revision_ ABSL_GUARDED_BY(mu_);
};

Watcher::Watcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Watcher::~Watcher() = default;
absl::Status Watcher::status() const { return impl_->status(); }
int64_t Watcher::last_revision() const { return impl_->last_revision(); }

absl::StatusOr<std::unique_ptr<Watcher>> EtcdClient::Watch(absl::string_view prefix,
                                                           int64_t start_revision,
                                                           WatchCallback callback,
                                                           WatchEndedCallback on_ended) {
  if (!callback) return absl::InvalidArgumentError("etcd watch: no callback");
  if (start_revision < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd watch: negative start revision ", start_revision));
  }
  auto impl = std::make_unique<Watcher::Impl>(connection_, prefix, start_revision,
                                              std::move(callback), std::move(on_ended));
  impl->Start();
  absl::Status status = impl->WaitCreated(connection_->Deadline());
  if (!status.ok()) return status;  // ~Impl cancels and joins
  return std::unique_ptr<Watcher>(new Watcher(std::move(impl)));
}

}  // namespace pserver
