#include "cc/client/client.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cc/client/call_group.h"
#include "cc/auth/authorizer.h"
#include "cc/client/channel_transport.h"
#include "cc/client/grpc_transport.h"
#include "cc/rpc/grpc_status.h"
#include "cc/core/status_macros.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/leased_key.h"
#include "cc/etcd/placement_record.h"
#include "cc/rpc/grpc_status.h"
#include "google/protobuf/util/json_util.h"
#include "pserver/v1/registry.pb.h"

namespace pserver {
namespace {

// A transport to `address`: gRPC, wrapped in the bulk channel unless
// options.bulk_channel is off. A call to a server that cannot be reached
// fails at once (UNAVAILABLE, with the cause), for RunWithRetries to retry.
// Every call carries the client's token and the instance etcd named, which
// the server checks (docs/security.md).
absl::StatusOr<std::unique_ptr<Transport>> NewTransport(const etcd_keys::ServerEntry& server,
                                                        const ClientOptions& options) {
  PS_ASSIGN_OR_RETURN(
      std::unique_ptr<GrpcTransport> grpc,
      GrpcTransport::Create(server.address, options.channels_per_server,
                            /*wait_for_ready=*/false, options.tls));
  GrpcTransport::CallMetadata metadata;
  if (!options.token.empty()) {
    metadata.emplace_back(kAuthorizationMetadataKey, absl::StrCat(kBearerPrefix, options.token));
  }
  if (!server.instance_id.empty()) metadata.emplace_back(kInstanceMetadataKey, server.instance_id);
  grpc->SetCallMetadata(std::move(metadata));
  if (!options.bulk_channel) return std::unique_ptr<Transport>(std::move(grpc));
  ChannelTransportOptions channel;
  channel.connections = options.channels_per_server;
  channel.bearer_token = options.token;
  channel.tls = options.tls;  // with TLS the channel is TLS too
  channel.read_spin = options.bulk_read_spin;
  channel.unsent_bytes = options.bulk_unsent_bytes;
  return std::unique_ptr<Transport>(std::make_unique<ChannelTransport>(std::move(grpc), channel));
}

// The stand-in for a server a placement names before etcd lists it (a
// server joining): every call fails with UNAVAILABLE, which the caller
// retries until the server registers (SetTransport) or its deadline.
class UnregisteredTransport final : public Transport {
 public:
  explicit UnregisteredTransport(int server)
      : address_(absl::StrCat("/ps/", server, " (not registered)")),
        error_(absl::UnavailableError(
            absl::StrCat("server ", server, " is not registered in etcd (/ps/", server,
                         ") yet"))) {}

  const std::string& address() const override { return address_; }
  void Call(absl::string_view, const google::protobuf::Message&, google::protobuf::Message*,
            absl::Time, Done done) override {
    done(error_);
  }
  void Push(const RequestId&, absl::Span<const GradientView>, absl::Time, Done done,
            TraceRecorder*) override {
    done(error_);
  }
  void Pull(absl::Span<const v1::ParamRef>, BlockSink, absl::Time, Done done,
            TraceRecorder*) override {
    done(error_);
  }
  void PushPull(const RequestId&, absl::Span<const GradientView>, absl::Span<const v1::ParamRef>,
                BlockSink, absl::Time, Done done, TraceRecorder*) override {
    done(error_);
  }

 private:
  const std::string address_;
  const absl::Status error_;
};

// How a client routes by `spec` (see Client::Routing). INVALID_ARGUMENT for
// a spec that is not a placement, or a move from a count outside
// [1, kMaxPlacementServers].
absl::StatusOr<Client::Routing> RoutingOf(const v1::Placement& spec, size_t block_bytes) {
  PS_ASSIGN_OR_RETURN(Placement target, Placement::FromSpec(spec, block_bytes));
  if (!spec.moving()) return Client::Routing{target, target, false};
  if (spec.from_num_servers() < 1 || spec.from_num_servers() > kMaxPlacementServers) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement version ", spec.version(), " is moving from ",
                     spec.from_num_servers(), " servers; the count must be in [1, ",
                     kMaxPlacementServers, "]"));
  }
  v1::Placement from = spec;
  from.set_num_servers(spec.from_num_servers());
  PS_ASSIGN_OR_RETURN(Placement route, Placement::FromSpec(from, block_bytes));
  return Client::Routing{route, target, true};
}

absl::Status CheckOptions(const ClientOptions& options, size_t num_servers) {
  if (num_servers == 0) return absl::InvalidArgumentError("client options name no servers");
  if (num_servers > kMaxPlacementServers) {
    return absl::InvalidArgumentError(absl::StrCat("client options name ", num_servers,
                                                   " servers; at most ", kMaxPlacementServers));
  }
  PS_RETURN_IF_ERROR(CheckTlsOptions(options.tls));
  if (options.block_bytes == 0) return absl::InvalidArgumentError("block_bytes must be > 0");
  if (options.max_request_bytes == 0) {
    return absl::InvalidArgumentError("max_request_bytes must be > 0");
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("timeout must be > 0");
  }
  if (options.channels_per_server < 1) {
    return absl::InvalidArgumentError("channels_per_server must be >= 1");
  }
  if (options.bulk_unsent_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bulk_unsent_bytes must be >= 0, got ", options.bulk_unsent_bytes));
  }
  if (options.max_async_in_flight < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_async_in_flight must be >= 1, got ", options.max_async_in_flight));
  }
  return absl::OkStatus();
}

absl::Status CheckName(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("parameter name is empty");
  return absl::OkStatus();
}

uint64_t RandomNonZero() {
  absl::BitGen gen;
  uint64_t v = 0;
  while (v == 0) v = absl::Uniform<uint64_t>(gen);
  return v;
}

absl::Status Annotate(const absl::Status& status, const std::string& server) {
  return absl::Status(status.code(), absl::StrCat(status.message(), " (server ", server, ")"));
}

std::string Attempts(int attempts) {
  return attempts == 1 ? "1 attempt" : absl::StrCat("last of ", attempts, " attempts");
}

// The error of a call that gave up on `server` after `attempts` rounds:
// when it never reached the server, DEADLINE_EXCEEDED saying why (`cause`:
// "server 127.0.0.1:7000 not reachable: connection refused (last of 7
// attempts)"); otherwise the server's own last error, naming it.
absl::Status GaveUp(const absl::Status& status, const std::string& server, const std::string& cause,
                    int attempts, bool retried_until_deadline) {
  if (!cause.empty()) {
    return absl::DeadlineExceededError(
        absl::StrCat("server ", server, " not reachable: ", cause, " (", Attempts(attempts), ")"));
  }
  if (!retried_until_deadline) return Annotate(status, server);
  return absl::Status(status.code(),
                      absl::StrCat(status.message(), " (server ", server, "; ", Attempts(attempts),
                                   ", retried until the deadline)"));
}

// A registry value a client may use: one written by a server names its
// instance; a bare "host:port" only unless `require_instance_id`.
// FAILED_PRECONDITION naming the key otherwise (a rogue or hand-written
// entry: docs/security.md).
absl::StatusOr<etcd_keys::ServerEntry> FencedEntry(const EtcdClient& etcd, const KeyValue& kv,
                                                   bool require_instance_id) {
  absl::StatusOr<etcd_keys::ServerEntry> entry = etcd_keys::ParseServerValue(kv.value);
  if (entry.ok() && (!entry->instance_id.empty() || !require_instance_id)) return entry;
  return absl::FailedPreconditionError(absl::StrCat(
      "etcd ", etcd.options().prefix, kv.key, " is '", absl::CHexEscape(kv.value),
      "', which names no server instance ('host:port instance=<id>', as a server writes "
      "it): a rogue or hand-written registry entry; refused"));
}

// Waits until etcd lists every one of /ps_desired servers; their entries in
// index order, and the store revision of the listing.
absl::StatusOr<std::vector<etcd_keys::ServerEntry>> DiscoverServers(EtcdClient& etcd,
                                                                    absl::Duration timeout,
                                                                    bool require_instance_id,
                                                                    int64_t* revision) {
  const absl::Time deadline = absl::Now() + timeout;
  const std::string where =
      absl::StrCat("etcd ", etcd.options().prefix, etcd_keys::ServersPrefix());
  const std::string desired_key = etcd_keys::DesiredKey();
  // What the last read that succeeded found missing ("" before one did).
  std::string missing_what;
  while (true) {
    absl::Status error;  // why this round could not read etcd
    // Each etcd call ends by the discovery deadline too, not only by etcd's
    // own (longer) timeout.
    absl::StatusOr<KeyValue> desired_kv = etcd.Get(desired_key, deadline);
    uint32_t desired = 0;
    if (desired_kv.ok() && absl::SimpleAtoi(desired_kv->value, &desired) && desired > 0) {
      absl::StatusOr<std::vector<KeyValue>> kvs =
          etcd.GetPrefix(etcd_keys::ServersPrefix(), revision, deadline);
      if (kvs.ok()) {
        // Servers beyond the desired count (joining or leaving in a live
        // move) are kept too, up to the placement's limit.
        std::vector<etcd_keys::ServerEntry> addresses(desired);
        for (const KeyValue& kv : *kvs) {
          absl::StatusOr<uint32_t> i = etcd_keys::ParseServerKey(kv.key);
          if (!i.ok() || *i >= kMaxPlacementServers) continue;
          absl::StatusOr<etcd_keys::ServerEntry> entry =
              FencedEntry(etcd, kv, require_instance_id);
          if (*i >= desired) {
            if (!entry.ok()) continue;  // not needed to connect: ignored
            if (*i >= addresses.size()) addresses.resize(*i + 1);
          }
          PS_RETURN_IF_ERROR(entry.status());
          addresses[*i] = *std::move(entry);
        }
        std::vector<uint32_t> missing;
        for (uint32_t i = 0; i < desired; ++i) {
          if (addresses[i].address.empty()) missing.push_back(i);
        }
        if (missing.empty()) return addresses;
        missing_what = absl::StrCat(missing.size(), " of ", desired, " servers missing (index ",
                                    absl::StrJoin(missing, ", "), ")");
      } else {
        error = kvs.status();
      }
    } else if (desired_kv.ok()) {
      missing_what = absl::StrCat(desired_key, " is '", absl::CHexEscape(desired_kv->value),
                                  "', not a server count");
    } else if (absl::IsNotFound(desired_kv.status())) {
      missing_what = absl::StrCat(desired_key, " is not set");
    } else {
      error = desired_kv.status();
    }
    if (absl::Now() >= deadline) {
      // etcd's error names the endpoint and why it was not reached.
      std::string why = error.ok() ? missing_what : std::string(error.message());
      if (!error.ok() && !missing_what.empty())
        absl::StrAppend(&why, "; last read: ", missing_what);
      return absl::DeadlineExceededError(absl::StrCat("waited ", absl::FormatDuration(timeout),
                                                      " for the servers in ", where, ": ", why));
    }
    absl::SleepFor(std::min(absl::Milliseconds(100), deadline - absl::Now()));
  }
}

// A gradient's name and values, borrowed.
struct NamedTensorView {
  const std::string& name;
  const Tensor& tensor;
};

}  // namespace

// A parameter being read back, block by block, into `dest`. Blocks of one
// parameter may arrive concurrently: they write disjoint bytes and flags, and
// the layout and buffer are settled before more than one block is in flight.
struct Client::Assembly {
  std::string name;
  std::optional<Layout> layout;
  Tensor* dest = nullptr;
  std::vector<uint8_t> received;
  // The layout was guessed from the gradient (a push-pull of a parameter
  // this client had not seen): learned from the reply where it compresses.
  bool guessed = false;

  // Makes `dest` fit the layout, keeping its buffer when it already does.
  void Prepare() {
    const Layout& l = *layout;
    if (dest->type() != l.type || dest->shape() != l.shape) {
      *dest = *Tensor::Zeros(l.type, l.shape);  // the layout was validated
    }
    received.assign(l.blocks, 0);
  }
};

// One unit of work for one server: a gradient block to push, a block to read
// back into assemblies[slot], or both (push-pull).
struct Client::Item {
  std::optional<GradientView> grad;
  std::optional<v1::ParamRef> ref;
  size_t slot = 0;
  size_t bytes = 0;  // payload, for packing requests
};

// What one request to one server carries.
struct Client::Exchange {
  int server;
  std::vector<GradientView> grads;
  std::vector<v1::ParamRef> refs;
  std::vector<size_t> slots;
  std::vector<size_t> items;  // the indexes of the items it carries
};

std::vector<Client::Batch> Client::PackBatches(absl::Span<const int> servers,
                                               absl::Span<const size_t> bytes, size_t max_bytes,
                                               int num_servers) {
  std::vector<Batch> batches;
  int slots = num_servers;
  for (int s : servers) slots = std::max(slots, s + 1);
  std::vector<int> open(slots, -1);
  std::vector<size_t> open_bytes(slots, 0);
  for (size_t i = 0; i < servers.size(); ++i) {
    const int s = servers[i];
    if (open[s] < 0 || open_bytes[s] + bytes[i] > max_bytes) {
      open[s] = static_cast<int>(batches.size());
      batches.push_back(Batch{s, {}});
      open_bytes[s] = 0;
    }
    batches[open[s]].items.push_back(i);
    open_bytes[s] += bytes[i];
  }
  return batches;
}

GradientView Client::BlockGradient(absl::string_view name, ElementType type, const BlockSpec& b,
                                   std::optional<double> norm, absl::string_view content) {
  GradientView v;
  v.name = name;
  v.type = type;
  v.block.set_index(b.index);
  v.block.set_count(b.count);
  v.block.set_offset(b.offset);
  v.global_norm = norm;
  v.content = content;
  return v;
}

v1::ParamRef Client::BlockRef(const std::string& name, uint32_t index, uint32_t count) {
  v1::ParamRef ref;
  ref.set_name(name);
  ref.mutable_block()->set_index(index);
  ref.mutable_block()->set_count(count);
  return ref;
}

v1::ParamRef Client::PullRef(const std::string& name, const Layout& layout, uint32_t index,
                             uint32_t count) {
  v1::ParamRef ref = BlockRef(name, index, count);
  const ElementType wire = WireValueType(layout.compression);
  if (layout.type == v1::FLOAT32 && wire != v1::FLOAT32) ref.set_wire_type(wire);
  return ref;
}

absl::StatusOr<Client::Layout> Client::LayoutOf(const v1::Parameter& header,
                                                const std::string& what) {
  PS_RETURN_IF_ERROR(ValidateStorableType(header.element_type(), what));
  Shape shape(header.shape().begin(), header.shape().end());
  PS_ASSIGN_OR_RETURN(int64_t total, NumElements(shape));
  return Layout{header.element_type(),        std::move(shape),
                static_cast<uint64_t>(total), std::max<uint32_t>(1, header.block().count()),
                header.clips_by_norm(),       header.non_finite(),
                header.wire_compression()};
}

absl::Status Client::RunOnEveryServer(size_t n, const StartCall& start, absl::Time deadline) {
  return RunWithRetries(
      n, [](size_t i) { return static_cast<int>(i); }, start, deadline);
}

Client::Client(const ClientOptions& options, std::vector<std::unique_ptr<Transport>> transports)
    : options_(options),
      routing_{Placement(static_cast<int>(transports.size()), options.block_bytes),
               Placement(static_cast<int>(transports.size()), options.block_bytes), false},
      client_id_(RandomNonZero()),
      sequences_(new std::atomic<uint64_t>[kMaxPlacementServers]) {
  for (size_t i = 0; i < kMaxPlacementServers; ++i) sequences_[i].store(0);
  absl::MutexLock lock(&transports_mu_);
  for (auto& t : transports) transports_.push_back(std::move(t));
}

Client::Routing Client::routing() const {
  absl::ReaderMutexLock lock(&transports_mu_);
  return routing_;
}

void Client::CoverServersLocked(int count) {
  while (static_cast<int>(transports_.size()) < count) {
    transports_.push_back(
        std::make_shared<UnregisteredTransport>(static_cast<int>(transports_.size())));
  }
}

absl::Status Client::UpdatePlacement(const v1::Placement& spec) {
  PS_ASSIGN_OR_RETURN(Routing next, RoutingOf(spec, options_.block_bytes));
  placement_followed_.store(true);
  absl::MutexLock lock(&transports_mu_);
  if (spec.version() <= routing_.target.version()) return absl::OkStatus();  // not newer
  CoverServersLocked(next.num_servers());
  routing_ = next;
  placement_version_.store(spec.version());  // under the lock: WaitForPlacement waits on it
  return absl::OkStatus();
}

absl::Status Client::SetTransport(int server, std::unique_ptr<Transport> transport) {
  return ReplaceTransport(server, std::move(transport), nullptr);
}

absl::Status Client::ReplaceTransport(int server, std::unique_ptr<Transport> transport,
                                      const etcd_keys::ServerEntry* entry) {
  if (server < 0 || server >= static_cast<int>(kMaxPlacementServers)) {
    return absl::InvalidArgumentError(absl::StrCat("server index ", server, " is outside [0, ",
                                                   kMaxPlacementServers, ")"));
  }
  if (transport == nullptr) return absl::InvalidArgumentError("a transport is null");
  std::shared_ptr<Transport> old;  // let go of outside the lock
  std::optional<etcd_keys::ServerEntry> was;
  {
    absl::MutexLock lock(&transports_mu_);
    CoverServersLocked(server + 1);
    old = std::move(transports_[server]);
    transports_[server] = std::move(transport);
    if (entry != nullptr) {
      auto [it, fresh] = entries_.try_emplace(server, *entry);
      if (!fresh) was = std::exchange(it->second, *entry);
    }
    address_changes_.fetch_add(1);  // under the lock: WaitToRetry waits on it
  }
  // Another server process holds the index now (a standby took the shard
  // over, or the server restarted): an attempt still waiting on the old one
  // (a silent host answers nothing until its attempt timeout) ends now and
  // is retried there, with the same request id.
  if (was.has_value() &&
      (was->address != entry->address || was->instance_id != entry->instance_id)) {
    servers_replaced_.fetch_add(1);
    old->Abandon(absl::UnavailableError(absl::StrCat(
        "server ", server, " at ", was->address,
        was->instance_id.empty() ? "" : absl::StrCat(" (instance ", was->instance_id, ")"),
        " was replaced: etcd names ", entry->address,
        entry->instance_id.empty() ? "" : absl::StrCat(" (instance ", entry->instance_id, ")"),
        "; retry there")));
  }
  return absl::OkStatus();
}

bool Client::WaitForPlacement(uint64_t version, absl::Time deadline, Cancellation* cancel) {
  auto seen = [this, version] { return placement_version_.load() >= version; };
  if (seen()) return true;
  placement_waits_.fetch_add(1);
  if (cancel == nullptr) {
    absl::MutexLock lock(&transports_mu_);
    return transports_mu_.AwaitWithDeadline(absl::Condition(&seen), deadline);
  }
  // Cancellable: in slices, as WaitToRetry.
  while (!seen()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    if (cancel->WaitFor(std::min(left, kMovedCheckInterval))) return false;
  }
  return true;
}

Client::~Client() {
  {
    // Async calls in flight end by their deadlines; their transports'
    // callbacks use this client until then.
    absl::MutexLock lock(&async_mu_);
    async_mu_.Await(absl::Condition(
        +[](int* n) { return *n == 0; }, &async_in_flight_));
  }
  executor_.reset();  // runs the async calls still queued, while all else is up
  watcher_.reset();   // no more address changes
  // The trainer leaves at once rather than when its lease runs out.
  worker_registration_.reset();
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  PS_RETURN_IF_ERROR(CheckRequestPayloadSizes(options.block_bytes, options.max_request_bytes));
  std::unique_ptr<EtcdClient> etcd;
  std::vector<etcd_keys::ServerEntry> servers;
  std::optional<v1::Placement> placement;  // etcd's; none: derived from N
  for (const std::string& address : options.servers) servers.push_back({address, ""});
  int64_t revision = 0;
  if (!options.etcd_endpoints.empty()) {
    EtcdClientOptions etcd_options;
    etcd_options.endpoints = options.etcd_endpoints;
    etcd_options.prefix = etcd_keys::ClusterPrefix(options.cluster);
    etcd_options.tls = options.etcd_tls;
    PS_ASSIGN_OR_RETURN(etcd, EtcdClient::Connect(etcd_options));
    PS_ASSIGN_OR_RETURN(servers, DiscoverServers(*etcd, options.discovery_timeout,
                                                        options.require_instance_id, &revision));
    PS_ASSIGN_OR_RETURN(placement, ReadPlacementFor(*etcd, servers,
                                                    absl::Now() + options.discovery_timeout));
  }
  PS_RETURN_IF_ERROR(CheckOptions(options, servers.size()));
  std::vector<std::unique_ptr<Transport>> transports;
  // A call to a server that cannot be reached fails at once, with the cause,
  // and RunWithRetries tries again (on the new address when the server moved)
  // until the call's deadline: a server that comes up meanwhile is reached,
  // and one that never does is reported with why.
  for (size_t i = 0; i < servers.size(); ++i) {
    if (etcd != nullptr && servers[i].address.empty()) {  // beyond the desired count, unregistered
      transports.push_back(std::make_unique<UnregisteredTransport>(static_cast<int>(i)));
      continue;
    }
    absl::StatusOr<std::unique_ptr<Transport>> transport = NewTransport(servers[i], options);
    if (!transport.ok()) {
      return absl::Status(transport.status().code(),
                          absl::StrCat("server ", i, ": ", transport.status().message(),
                                       etcd != nullptr ? " (registered in etcd)" : ""));
    }
    transports.push_back(*std::move(transport));
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Create(options, std::move(transports)));
  if (placement.has_value()) PS_RETURN_IF_ERROR(client->UpdatePlacement(*placement));
  if (etcd != nullptr) {
    {
      absl::MutexLock lock(&client->transports_mu_);
      for (size_t i = 0; i < servers.size(); ++i) {
        if (!servers[i].address.empty()) client->entries_[static_cast<int>(i)] = servers[i];
      }
    }
    client->placement_followed_.store(true);
    PS_RETURN_IF_ERROR(client->WatchPlacement(etcd.get(), revision));
    client->etcd_ = std::move(etcd);
    PS_RETURN_IF_ERROR(client->StartDiscovery(client->etcd_.get(), revision));
  }
  return client;
}

absl::StatusOr<std::optional<v1::Placement>> Client::ReadPlacementFor(
    EtcdClient& etcd, const std::vector<etcd_keys::ServerEntry>& servers, absl::Time deadline) {
  PS_ASSIGN_OR_RETURN(std::optional<v1::Placement> placement, ReadPlacement(etcd, deadline));
  if (!placement.has_value()) return placement;
  const std::string key = absl::StrCat("etcd ", etcd.options().prefix, etcd_keys::PlacementKey());
  absl::StatusOr<Routing> routing = RoutingOf(*placement, 1);
  if (!routing.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": ", routing.status().message()));
  }
  size_t listed = 0;
  bool all = true;
  for (size_t i = 0; i < servers.size(); ++i) {
    if (servers[i].address.empty()) continue;
    ++listed;
  }
  for (int i = 0; i < routing->num_servers(); ++i) {
    if (static_cast<size_t>(i) >= servers.size() || servers[i].address.empty()) all = false;
  }
  if (!all) {
    return absl::FailedPreconditionError(absl::StrCat(
        key, " is for ", placement->num_servers(), " servers (",
        placement->moving() ? absl::StrCat("moving from ", placement->from_num_servers(), ", ")
                            : "",
        "version ", placement->version(), "), etcd lists ", listed,
        ": servers of another count have not all registered yet"));
  }
  return placement;
}

std::optional<absl::Status> Client::DepartedServer(int server) {
  if (etcd_ == nullptr) return std::nullopt;
  absl::StatusOr<std::optional<v1::Placement>> read =
      ReadPlacement(*etcd_, absl::Now() + options_.discovery_timeout);
  if (!read.ok() || !read->has_value() || !UpdatePlacement(**read).ok()) return std::nullopt;
  const Routing now = routing();
  if (server < now.num_servers()) return std::nullopt;
  return absl::FailedPreconditionError(absl::StrCat(
      kPlacementMovedPrefix, now.target.version(), ": server ", server,
      " left the cluster (etcd /placement counts ", now.num_servers(),
      " servers) and its port refused the connection; nothing of the request was delivered; "
      "re-route"));
}

absl::Status Client::WatchPlacement(EtcdClient* etcd, int64_t revision) {
  auto on_change = [this](const WatchEvent& event) {
    if (options_.testing_ignore_placement_watch) return;
    if (event.type != WatchEvent::Type::kPut || event.kv.key != etcd_keys::PlacementKey()) return;
    // A malformed value, or an older version (a replay): the one held stays.
    absl::StatusOr<v1::Placement> placement = ParsePlacementRecord(event.kv.value);
    if (placement.ok()) UpdatePlacement(*placement).IgnoreError();
  };
  PS_ASSIGN_OR_RETURN(placement_watcher_,
                      etcd->Watch(etcd_keys::PlacementKey(), revision + 1, std::move(on_change)));
  return absl::OkStatus();
}

absl::Status Client::StartDiscovery(EtcdClient* etcd, int64_t revision) {
  auto on_change = [this, etcd](const WatchEvent& event) {
    // A deleted key (a server gone) changes nothing: calls keep retrying the
    // old address until a new server claims the index.
    if (event.type != WatchEvent::Type::kPut) return;
    // Any index a placement may name: servers join beyond the count
    // connected with (live moves).
    absl::StatusOr<uint32_t> i = etcd_keys::ParseServerKey(event.kv.key);
    if (!i.ok() || *i >= kMaxPlacementServers) return;
    // A value that is not a server's entry: the old one stays.
    absl::StatusOr<etcd_keys::ServerEntry> entry = FencedEntry(*etcd, event.kv, options_.require_instance_id);
    if (!entry.ok()) return;
    OnServerChanged(static_cast<int>(*i), *entry);
  };
  PS_ASSIGN_OR_RETURN(watcher_,
                      etcd->Watch(etcd_keys::ServersPrefix(), revision + 1, std::move(on_change)));
  if (!options_.register_worker) return absl::OkStatus();
  worker_id_ = options_.worker_id.empty()
                   ? absl::StrCat(absl::Hex(RandomNonZero(), absl::kZeroPad16))
                   : options_.worker_id;
  v1::WorkerInfo info;
  info.set_id(worker_id_);
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0) info.set_host(host);
  info.set_pid(getpid());
  info.set_start_time_micros(absl::ToUnixMicros(absl::Now()));
  std::string worker_json;
  if (!google::protobuf::util::MessageToJsonString(info, &worker_json).ok()) worker_json = "{}";
  return RegisterWorker(std::move(worker_json));
}

absl::Status Client::RegisterWorker(std::string worker_json) {
  LeasedKeyOptions lease_options;
  lease_options.value = std::move(worker_json);
  lease_options.ttl = options_.worker_lease_ttl;
  // A trainer restarted with the same worker_id takes its key over.
  lease_options.ownership = LeasedKeyOptions::Ownership::kShared;
  // etcd was unreachable for longer than the lease: register again (the
  // registration is only a heartbeat; training does not depend on it).
  lease_options.retry_interval = absl::Milliseconds(200);
  PS_ASSIGN_OR_RETURN(std::unique_ptr<LeasedKey> registration,
                      LeasedKey::Grant(etcd_.get(), std::move(lease_options)));
  PS_RETURN_IF_ERROR(registration->Claim(etcd_keys::WorkerKey(worker_id_)).status());
  registration->KeepRegistered();
  worker_registration_ = std::move(registration);
  return absl::OkStatus();
}

int Client::worker_registrations() const {
  return worker_registration_ == nullptr ? 0 : worker_registration_->registrations();
}

int Client::worker_leases_lost() const {
  return worker_registration_ == nullptr ? 0 : worker_registration_->leases_lost();
}

void Client::OnServerChanged(int server, const etcd_keys::ServerEntry& address) {
  // A new transport even for the same address: a server restarted on the
  // same port is then reached at once, not when the old channel's reconnect
  // backoff ends.
  absl::StatusOr<std::unique_ptr<Transport>> transport = NewTransport(address, options_);
  if (!transport.ok()) return;
  // server < kMaxPlacementServers
  ReplaceTransport(server, *std::move(transport), &address).IgnoreError();
}

std::shared_ptr<Transport> Client::TransportFor(int server) const {
  absl::MutexLock lock(&transports_mu_);
  // Every index a routing snapshot names is covered; any other is answered
  // as a server not registered.
  if (server < 0 || static_cast<size_t>(server) >= transports_.size()) {
    return std::make_shared<UnregisteredTransport>(server);
  }
  return transports_[server];
}

std::vector<std::string> Client::addresses() const {
  absl::MutexLock lock(&transports_mu_);
  std::vector<std::string> out;
  for (const auto& t : transports_) out.push_back(t->address());
  return out;
}

absl::Status Client::RunWithRetries(size_t n, const std::function<int(size_t)>& server_of,
                                    const StartCall& start, absl::Time deadline,
                                    TraceRecorder* trace, const DescribeRequest& describe,
                                    std::vector<absl::Status>* moved, const FirstAttempt* first) {
  Cancellation* const cancel = Cancellation::Current();
  if (cancel != nullptr) PS_RETURN_IF_ERROR(cancel->Check());
  if (first == nullptr && n > 0 && absl::Now() >= deadline) {
    return absl::DeadlineExceededError("the call's deadline passed before it was sent");
  }
  const absl::Duration attempt_timeout = AttemptTimeout();
  std::vector<size_t> pending(n);
  for (size_t i = 0; i < n; ++i) pending[i] = i;
  absl::Duration backoff = options_.initial_backoff;
  std::optional<absl::BitGen> jitter;  // seeded only when a retry needs it
  int attempts = 0;
  // Per server address: why its last failed attempt never reached it
  // (UnreachableCause; empty: it answered).
  absl::flat_hash_map<std::string, std::string> unreachable;
  // Per request: some attempt may have reached its server (it failed
  // without an unreachable cause). Only one that never did may be sent
  // elsewhere after its server departed: it applied nothing.
  std::vector<bool> reached(n, false);
  while (true) {
    ++attempts;
    // A server that moved after this round was sent is retried at once.
    const uint64_t changes = address_changes_.load();
    const absl::Time attempt_deadline = attempt_timeout > absl::ZeroDuration()
                                            ? std::min(deadline, absl::Now() + attempt_timeout)
                                            : deadline;
    std::vector<std::shared_ptr<Transport>> used;  // alive until every call is done
    std::vector<absl::Status> results;
    if (first != nullptr && attempts == 1) {  // made already (StartFirstAttempt)
      used = first->used;
      results = first->results;
    } else {
      CallGroup group;
      for (size_t i : pending) {
        used.push_back(TransportFor(server_of(i)));
        if (trace != nullptr) trace->Sent();
        Transport::Done done = group.Add(used.back()->address());
        if (trace_ != nullptr) {
          done = trace_->Request(
              server_of(i), used.back()->address(), attempts,
              [&](trace::Args& args) {
                if (describe) describe(i, args);
              },
              std::move(done));
        }
        start(i, *used.back(), attempt_deadline, std::move(done));
      }
      results = group.WaitAll();
    }
    if (cancel != nullptr) PS_RETURN_IF_ERROR(cancel->Check());
    std::vector<size_t> retry;
    // Per server whose dial was refused this round: DepartedServer's answer
    // (one /placement read a server a round).
    absl::flat_hash_map<int, std::optional<absl::Status>> departed;
    absl::Status retry_error;  // the first to retry, and its server
    std::string retry_address;
    for (size_t k = 0; k < pending.size(); ++k) {
      const absl::Status& status = results[k];
      if (status.ok()) continue;
      const bool retryable = absl::IsUnavailable(status) ||
                             (absl::IsDeadlineExceeded(status) && attempt_deadline < deadline);
      const std::string& address = used[k]->address();
      if (moved != nullptr && PlacementMovedVersion(status).has_value()) {
        (*moved)[pending[k]] = Annotate(status, address);  // for the caller to re-route
        continue;
      }
      std::string& cause = unreachable[address];
      const std::string latest = UnreachableCauseOf(status);
      if (latest.empty()) reached[pending[k]] = true;
      if (moved != nullptr && !reached[pending[k]] &&
          absl::StartsWith(latest, "connection refused")) {
        const int server = server_of(pending[k]);
        auto [it, fresh] = departed.try_emplace(server);
        if (fresh) it->second = DepartedServer(server);
        if (const std::optional<absl::Status>& left = it->second) {
          (*moved)[pending[k]] = Annotate(*left, address);  // for the caller to re-route
          continue;
        }
      }
      cause = latest.empty() ? "" : LatestCause(cause, latest);
      if (!retryable) return GaveUp(status, address, cause, attempts, false);
      if (retry.empty()) {
        retry_error = status;
        retry_address = address;
      }
      retry.push_back(pending[k]);
    }
    if (retry.empty()) return absl::OkStatus();
    if (!jitter.has_value()) jitter.emplace();
    const absl::Duration sleep = backoff * absl::Uniform(*jitter, 0.5, 1.5);
    if (absl::Now() + sleep >= deadline) {
      return GaveUp(retry_error, retry_address, unreachable[retry_address], attempts, true);
    }
    if (WaitToRetry(sleep, changes, cancel)) return cancel->Check();
    // A server moved (a standby took its shard over): the next wait starts
    // short again, and the retry goes to the new address at once.
    backoff = address_changes_.load() != changes ? options_.initial_backoff
                                                 : std::min(backoff * 2, options_.max_backoff);
    retries_.fetch_add(retry.size());
    pending = std::move(retry);
  }
}

absl::Duration Client::AttemptTimeout() const {
  if (options_.attempt_timeout <= absl::ZeroDuration() && !options_.etcd_endpoints.empty()) {
    return absl::Seconds(10);
  }
  return options_.attempt_timeout;
}

bool Client::StartFirstAttempt(size_t n, const std::function<int(size_t)>& server_of,
                               const StartCall& start, absl::Time deadline, TraceRecorder* trace,
                               std::function<void(FirstAttempt)> then,
                               const std::function<bool(const Transport&)>& may_block) {
  const absl::Duration attempt_timeout = AttemptTimeout();
  const absl::Time attempt_deadline = attempt_timeout > absl::ZeroDuration()
                                          ? std::min(deadline, absl::Now() + attempt_timeout)
                                          : deadline;
  struct State {
    FirstAttempt attempt;
    std::atomic<size_t> left;
    std::function<void(FirstAttempt)> then;
  };
  std::vector<std::shared_ptr<Transport>> used;
  for (size_t i = 0; i < n; ++i) {
    used.push_back(TransportFor(server_of(i)));
    if (may_block && may_block(*used.back())) return false;
  }
  auto state = std::make_shared<State>();
  state->attempt.used = std::move(used);
  state->attempt.results.resize(n);
  state->left.store(n + 1);  // + 1: this thread's, until every call started
  state->then = std::move(then);
  auto one_done = [state] {
    if (state->left.fetch_sub(1) == 1) {
      std::function<void(FirstAttempt)> then = std::move(state->then);
      then(std::move(state->attempt));
    }
  };
  for (size_t i = 0; i < n; ++i) {
    if (trace != nullptr) trace->Sent();
    start(i, *state->attempt.used[i], attempt_deadline,
          [state, i, one_done](absl::Status status) {
            state->attempt.results[i] = std::move(status);
            one_done();
          });
  }
  one_done();
  return true;
}

absl::Status Client::AcquireAsync(absl::Time deadline) {
  absl::MutexLock lock(&async_mu_);
  const int limit = options_.max_async_in_flight;
  auto free = [this, limit]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(async_mu_) {
    return async_in_flight_ < limit;
  };
  if (!async_mu_.AwaitWithDeadline(absl::Condition(&free), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(
        limit, " async calls in flight, the most ClientOptions::max_async_in_flight allows; "
               "none ended before the call's deadline"));
  }
  ++async_in_flight_;
  return absl::OkStatus();
}

void Client::ReleaseAsync() {
  absl::MutexLock lock(&async_mu_);
  --async_in_flight_;
}

int Client::async_in_flight() const {
  absl::MutexLock lock(&async_mu_);
  return async_in_flight_;
}

void Client::Schedule(std::function<void()> closure) {
  absl::call_once(executor_once_,
                  [this] { executor_ = std::make_unique<Executor>(options_.async_threads); });
  executor_->Schedule(std::move(closure));
}

bool Client::WaitToRetry(absl::Duration sleep, uint64_t changes, Cancellation* cancel) const {
  const absl::Time until = absl::Now() + sleep;
  auto moved = [this, changes] { return address_changes_.load() != changes; };
  if (cancel == nullptr) {
    absl::MutexLock lock(&transports_mu_);
    transports_mu_.AwaitWithDeadline(absl::Condition(&moved), until);
    return false;
  }
  // Cancellable: in slices, so that an address change ends the wait too.
  while (!moved()) {
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    if (cancel->WaitFor(std::min(left, kMovedCheckInterval))) return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(
    const ClientOptions& options, std::vector<std::unique_ptr<Transport>> transports) {
  PS_RETURN_IF_ERROR(CheckOptions(options, transports.size()));
  for (const auto& transport : transports) {
    if (transport == nullptr) return absl::InvalidArgumentError("a transport is null");
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<trace::Recorder> recorder,
                      trace::OpenFromPathOrEnvironment(options.trace_file, "PSERVER_TRACE",
                                                       "pserver client", options.trace_max_events));
  const int servers = static_cast<int>(transports.size());
  std::unique_ptr<Client> client(new Client(options, std::move(transports)));
  if (recorder != nullptr) client->trace_ = std::make_unique<ClientTrace>(std::move(recorder), servers);
  return client;
}

std::optional<ParamLayout> Client::KnownLayout(const std::string& name) const {
  std::optional<Layout> layout = FindLayout(name);
  if (!layout.has_value()) return std::nullopt;
  return ParamLayout{layout->type, layout->shape};
}

std::optional<Client::Layout> Client::FindLayout(const std::string& name) const {
  absl::ReaderMutexLock lock(&layouts_mu_);
  auto it = layouts_.find(name);
  if (it == layouts_.end()) return std::nullopt;
  return it->second;
}

void Client::RememberLayout(const std::string& name, Layout layout) {
  absl::MutexLock lock(&layouts_mu_);
  layouts_.insert_or_assign(name, std::move(layout));
}

// ---- init and control ---------------------------------------------------------------

std::vector<Client::GradRef> Client::RefsOf(absl::Span<const NamedTensor> grads) {
  std::vector<GradRef> refs;
  refs.reserve(grads.size());
  for (const NamedTensor& g : grads) refs.push_back(GradRef{&g.name, &g.tensor});
  return refs;
}

absl::Status Client::InitParam(const std::string& name, const Tensor& value,
                               const v1::ParameterConfig& config, const CallOptions& call) {
  const Cancellation::Scope cancel_scope(call.cancel);
  const InitRef ref{&name, &value, &config};
  return DoInitParams(absl::MakeConstSpan(&ref, 1), Deadline(call));
}

absl::Status Client::InitParams(absl::Span<const ParamInit> params, const CallOptions& call) {
  const Cancellation::Scope cancel_scope(call.cancel);
  std::vector<InitRef> refs;
  refs.reserve(params.size());
  for (const ParamInit& p : params) refs.push_back(InitRef{&p.name, &p.value, &p.config});
  return DoInitParams(refs, Deadline(call));
}

absl::Status Client::DoInitParams(absl::Span<const InitRef> params, absl::Time deadline) {
  const ClientTrace::Call span(trace_.get(), "InitParams");
  std::vector<v1::InitParamRequest> requests;
  std::vector<int> servers;
  std::vector<Layout> layouts;
  const Placement placement = this->placement();
  for (const InitRef& ref : params) {
    const std::string& name = *ref.name;
    const Tensor& value = *ref.value;
    const v1::ParameterConfig& config = *ref.config;
    PS_RETURN_IF_ERROR(CheckName(name));
    PS_RETURN_IF_ERROR(ValidateStorableType(value.type(), absl::StrCat("parameter '", name, "'")));
    PS_ASSIGN_OR_RETURN(int64_t total, NumElements(value.shape()));
    if (total == 0) {  // the servers refuse zero-size parameters with the same words
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", name, "': shape ", ShapeString(value.shape()),
                       " has no elements (a parameter needs at least one element)"));
    }
    if (total != value.num_elements()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", name, "': shape ", ShapeString(value.shape()), " needs ",
                       total, " values, the tensor holds ", value.num_elements()));
    }
    const size_t esize = ElementSize(value.type());
    std::vector<BlockSpec> blocks = placement.Blocks(name, total, esize);
    for (const BlockSpec& b : blocks) {
      v1::InitParamRequest& request = requests.emplace_back();
      v1::Parameter* param = request.mutable_parameter();
      param->set_name(name);
      param->set_element_type(value.type());
      param->mutable_shape()->Assign(value.shape().begin(), value.shape().end());
      param->set_content(value.bytes().data() + b.offset * esize, b.elements * esize);
      param->mutable_block()->set_index(b.index);
      param->mutable_block()->set_count(b.count);
      param->mutable_block()->set_offset(b.offset);
      *request.mutable_config() = config;
      servers.push_back(b.server);
    }
    layouts.push_back(Layout{value.type(), value.shape(), static_cast<uint64_t>(total),
                             static_cast<uint32_t>(blocks.size()),
                             config.clipping().clip_norm() > 0, config.non_finite(),
                             config.wire_compression()});
  }
  std::vector<v1::InitParamResponse> responses(requests.size());
  PS_RETURN_IF_ERROR(RunWithRetries(
      requests.size(), [&](size_t i) { return servers[i]; },
      [&](size_t i, Transport& t, absl::Time deadline, Transport::Done done) {
        t.Call("InitParam", requests[i], &responses[i], deadline, std::move(done));
      },
      deadline));
  for (size_t i = 0; i < params.size(); ++i) RememberLayout(*params[i].name, layouts[i]);
  return absl::OkStatus();
}

absl::Status Client::FinishInitParams(const CallOptions& call) {
  return CallEveryServer<v1::FinishInitParamsResponse>("FinishInitParams",
                                                       v1::FinishInitParamsRequest(), call)
      .status();
}

absl::StatusOr<std::vector<v1::ServerStats>> Client::GetStats(const CallOptions& call) {
  return GetStats(v1::GetStatsRequest(), call);
}

absl::StatusOr<std::vector<v1::ServerStats>> Client::GetStats(const v1::GetStatsRequest& request,
                                                              const CallOptions& call) {
  PS_ASSIGN_OR_RETURN(std::vector<v1::GetStatsResponse> responses,
                      CallEveryServer<v1::GetStatsResponse>("GetStats", request, call));
  std::vector<v1::ServerStats> out;
  out.reserve(responses.size());
  for (auto& response : responses) out.push_back(std::move(*response.mutable_stats()));
  return out;
}

absl::StatusOr<std::vector<v1::ParamListing>> Client::ListParams(const CallOptions& call) {
  const Cancellation::Scope cancel_scope(call.cancel);
  const absl::Time deadline = Deadline(call);
  const size_t n = num_servers();
  std::vector<std::string> tokens(n);
  std::vector<bool> more(n, true);
  std::map<std::string, v1::ParamListing> merged;
  // Every round reads one page from each server with more; each page's
  // token is after the one before, so the rounds end.
  while (std::find(more.begin(), more.end(), true) != more.end()) {
    std::vector<v1::ListParamsResponse> pages(n);
    PS_RETURN_IF_ERROR(RunOnEveryServer(
        n, [&](size_t i, Transport& t, absl::Time call_deadline, Transport::Done done) {
          pages[i].Clear();
          if (!more[i]) return done(absl::OkStatus());
          v1::ListParamsRequest request;
          request.set_page_token(tokens[i]);
          t.Call("ListParams", request, &pages[i], call_deadline, std::move(done));
        },
        deadline));
    for (size_t i = 0; i < n; ++i) {
      if (!more[i]) continue;
      for (v1::ParamListing& p : *pages[i].mutable_params()) {
        auto [it, added] = merged.try_emplace(p.name(), p);
        if (!added) it->second.set_blocks_held(it->second.blocks_held() + p.blocks_held());
      }
      const std::string& next = pages[i].next_page_token();
      if (!next.empty() && next <= tokens[i]) {
        return absl::DataLossError(absl::StrCat("server ", i, " answered ListParams page token '",
                                                absl::CHexEscape(next), "' after '",
                                                absl::CHexEscape(tokens[i]), "': not in order"));
      }
      more[i] = !next.empty();
      tokens[i] = next;
    }
  }
  std::vector<v1::ParamListing> out;
  out.reserve(merged.size());
  for (auto& [name, p] : merged) out.push_back(std::move(p));
  return out;
}

absl::StatusOr<std::vector<Client::HealthStatus>> Client::CheckHealth(const CallOptions& call) {
  PS_ASSIGN_OR_RETURN(std::vector<grpc::health::v1::HealthCheckResponse> responses,
                      CallEveryServer<grpc::health::v1::HealthCheckResponse>(
                          kHealthCheckMethod, grpc::health::v1::HealthCheckRequest(), call));
  std::vector<HealthStatus> out;
  out.reserve(responses.size());
  for (const auto& response : responses) out.push_back(response.status());
  return out;
}

absl::Status Client::SaveCheckpoint(const CallOptions& call) {
  return CallEveryServer<v1::SaveResponse>("Save", v1::SaveRequest(), call).status();
}

absl::StatusOr<ParamLayout> Client::GetLayout(const std::string& name, const CallOptions& call) {
  const Cancellation::Scope cancel_scope(call.cancel);
  PS_ASSIGN_OR_RETURN(Layout layout, FindOrLearnLayout(name, Deadline(call), call.trace));
  return ParamLayout{layout.type, layout.shape, layout.compression};
}

// ---- the bulk path ------------------------------------------------------------------

absl::Status Client::PlaceBlock(Assembly& a, const v1::Parameter& header, const Segments& content,
                                const std::string& from) {
  const std::string what = absl::StrCat("parameter '", a.name, "' from server ", from);
  if (!a.layout.has_value()) {
    // The first block of a parameter this client has not seen: learn its layout.
    PS_ASSIGN_OR_RETURN(Layout layout, LayoutOf(header, what));
    RememberLayout(a.name, layout);
    a.layout = std::move(layout);
    a.Prepare();
  } else if (a.guessed && header.has_wire_compression()) {
    PS_ASSIGN_OR_RETURN(Layout layout, LayoutOf(header, what));
    RememberLayout(a.name, std::move(layout));
    a.guessed = false;
  }
  const Layout& layout = *a.layout;
  const size_t esize = ElementSize(layout.type);
  const bool widen = header.content_type() != v1::ELEMENT_TYPE_UNSPECIFIED &&
                     header.content_type() != layout.type;
  const size_t size = widen ? SegmentsSize(content) / ElementSize(header.content_type()) * esize
                            : SegmentsSize(content);
  const uint32_t index = header.block().index();
  if (header.name() != a.name || header.element_type() != layout.type ||
      std::max<uint32_t>(1, header.block().count()) != layout.blocks || index >= layout.blocks ||
      header.block().offset() > layout.elements ||
      size > (layout.elements - header.block().offset()) * esize ||
      (widen && layout.type != v1::FLOAT32)) {
    return absl::DataLossError(
        absl::StrCat(what, ": block ", index, " does not fit the parameter's layout"));
  }
  char* dest = a.dest->mutable_data() + header.block().offset() * esize;
  if (content.size() == 1 && content[0].data() == dest && !widen) {
    // Read there straight from the wire (PlaceFor).
  } else if (widen) {
    PS_RETURN_IF_ERROR(WidenPulledBlock(header.content_type(), content,
                                        layout.elements - header.block().offset(),
                                        reinterpret_cast<float*>(dest),
                                        absl::StrCat(what, ": block ", index)));
  } else {
    CopySegments(content, dest);
  }
  a.received[index] = 1;
  return absl::OkStatus();
}

char* Client::PlaceFor(const Assembly& a, const v1::ParamRef& ref, const v1::Parameter& header,
                       uint64_t bytes) {
  if (!a.layout.has_value() || a.dest == nullptr) return nullptr;
  const Layout& layout = *a.layout;
  const uint64_t esize = ElementSize(layout.type);
  const uint32_t index = header.block().index();
  const uint64_t offset = header.block().offset();
  // PlaceBlock's checks, and that the block is the one asked for, whole
  // elements, in the stored type (a FLOAT16/BFLOAT16 content is widened).
  if (header.name() != a.name || ref.name() != a.name || index != ref.block().index() ||
      header.element_type() != layout.type ||
      (header.content_type() != v1::ELEMENT_TYPE_UNSPECIFIED &&
       header.content_type() != layout.type) ||
      std::max<uint32_t>(1, header.block().count()) != layout.blocks || index >= layout.blocks ||
      esize == 0 || bytes == 0 || bytes % esize != 0 || offset > layout.elements ||
      bytes / esize > layout.elements - offset ||
      a.dest->type() != layout.type ||
      static_cast<uint64_t>(a.dest->num_elements()) != layout.elements) {
    return nullptr;
  }
  return a.dest->mutable_data() + offset * esize;
}

// A request's blocks in its trace span: its push request id, how many
// gradient and read blocks it carries, and their names (the first few).
void Client::DescribeExchange(const Exchange& x, const RequestId& id, trace::Args& args) {
  constexpr size_t kMaxNames = 8;
  if (id.sequence != 0) args.AddHex("client_id", id.client).Add("sequence", id.sequence);
  args.Add("grads", x.grads.size()).Add("reads", x.refs.size());
  std::string names;
  size_t named = 0;
  auto name = [&](absl::string_view param, uint32_t block) {
    if (named++ < kMaxNames) absl::StrAppend(&names, names.empty() ? "" : " ", param, "#", block);
  };
  for (const GradientView& grad : x.grads) name(grad.name, grad.block.index());
  for (const v1::ParamRef& ref : x.refs) name(ref.name(), ref.block().index());
  if (named > kMaxNames) absl::StrAppend(&names, " +", named - kMaxNames, " more");
  args.Add("blocks", names);
}

namespace {

// The dense block an item pushes or reads: its parameter and block index.
std::pair<absl::string_view, uint32_t> BlockOf(const GradientView* grad, const v1::ParamRef* ref) {
  if (grad != nullptr) return {grad->name, grad->block.index()};
  return {ref->name(), ref->block().index()};
}

}  // namespace

absl::Status Client::Run(const std::vector<Item>& items, std::vector<Assembly>& assemblies,
                         absl::Time deadline, TraceRecorder* trace) {
  if (items.empty()) return absl::OkStatus();
  std::vector<size_t> pending(items.size());
  for (size_t i = 0; i < items.size(); ++i) pending[i] = i;
  // Items refused by an old owner go by the target placement from then on.
  std::vector<bool> by_target(items.size(), false);
  Routing routing = this->routing();
  for (int round = 1;; ++round) {
    std::vector<int> servers;
    servers.reserve(pending.size());
    for (size_t k : pending) {
      const Item& item = items[k];
      const auto [name, block] = BlockOf(item.grad.has_value() ? &*item.grad : nullptr,
                                         item.ref.has_value() ? &*item.ref : nullptr);
      servers.push_back((by_target[k] ? routing.target : routing.route).ServerOf(name, block));
    }
    std::vector<Refusal> refused;
    PS_RETURN_IF_ERROR(RunRound(items, pending, servers, assemblies, deadline, trace, &refused));
    if (refused.empty()) return absl::OkStatus();
    // Every refused request applied nothing: its items go again, to their
    // owners under the newest placement named, as new requests.
    std::vector<const absl::Status*> refusals;
    bool rerouted = false;  // some item goes elsewhere than it went
    std::vector<size_t> next;
    for (const Refusal& r : refused) {
      refusals.push_back(&r.status);
      for (size_t k : r.items) {
        rerouted = rerouted || !by_target[k];
        by_target[k] = true;
        next.push_back(k);
      }
    }
    PS_RETURN_IF_ERROR(
        FollowRefusals(refusals, rerouted, round, next.size(), "blocks", deadline, &routing));
    std::sort(next.begin(), next.end());  // the items' order
    pending = std::move(next);
  }
}

absl::Status Client::FollowRefusals(absl::Span<const absl::Status* const> refusals, bool rerouted,
                                    int round, size_t items, absl::string_view what,
                                    absl::Time deadline, Routing* routing) {
  uint64_t newest = 0;
  const absl::Status* first = refusals.front();
  for (const absl::Status* refusal : refusals) {
    const uint64_t version = PlacementMovedVersion(*refusal).value_or(0);
    if (version > newest) {
      newest = version;
      first = refusal;
    }
  }
  const uint64_t held = routing->target.version();
  if (newest > held) {
    // Not seen yet: wait for it (a client that follows no placement
    // would wait in vain).
    if (!placement_followed_.load()) {
      return absl::Status(first->code(),
                          absl::StrCat(first->message(),
                                       "; this client follows no /placement (connect it with "
                                       "etcd_endpoints to follow moves)"));
    }
    Cancellation* const cancel = Cancellation::Current();
    if (!WaitForPlacement(newest, deadline, cancel)) {
      if (cancel != nullptr) PS_RETURN_IF_ERROR(cancel->Check());
      return absl::DeadlineExceededError(absl::StrCat(
          first->message(), "; waited until the call's deadline for /placement version ", newest,
          ", this client has seen version ", placement_version_.load()));
    }
    rerouted = true;
  }
  if (!rerouted || round >= kMaxRedirectRounds) {
    // The servers refuse what this client already routes by their
    // placement (or the placement keeps changing): reported as it is.
    return absl::Status(
        first->code(),
        absl::StrCat(first->message(), "; not followed: this client routes by version ",
                     placement_version_.load(), " and sent these ", what, " ", round,
                     round == 1 ? " time" : " times"));
  }
  redirects_.fetch_add(items);
  *routing = this->routing();
  return absl::OkStatus();
}

absl::Status Client::RunRound(const std::vector<Item>& items, absl::Span<const size_t> pending,
                              absl::Span<const int> servers, std::vector<Assembly>& assemblies,
                              absl::Time deadline, TraceRecorder* trace,
                              std::vector<Refusal>* refused) {
  std::vector<size_t> bytes;
  bytes.reserve(pending.size());
  for (size_t k : pending) bytes.push_back(items[k].bytes);
  std::vector<Exchange> exchanges;
  for (const Batch& batch :
       PackBatches(servers, bytes, options_.max_request_bytes, num_servers())) {
    Exchange& x = exchanges.emplace_back();
    x.server = batch.server;
    for (size_t j : batch.items) {
      const Item& item = items[pending[j]];
      x.items.push_back(pending[j]);
      if (item.grad.has_value()) x.grads.push_back(*item.grad);
      if (item.ref.has_value()) {
        x.refs.push_back(*item.ref);
        x.slots.push_back(item.slot);
      }
    }
  }
  // Every push gets its server's next sequence number once; a retry resends
  // it unchanged, so the server applies it at most once. A refused push is
  // sent again by Run under a new number (it applied nothing).
  std::vector<RequestId> ids(exchanges.size());
  for (size_t i = 0; i < exchanges.size(); ++i) {
    if (exchanges[i].grads.empty()) continue;
    ids[i].client = client_id_;
    ids[i].sequence = NextSequence(exchanges[i].server);
  }
  std::vector<absl::Status> moved(exchanges.size());
  PS_RETURN_IF_ERROR(RunWithRetries(
      exchanges.size(), [&](size_t i) { return exchanges[i].server; },
      [&](size_t i, Transport& t, absl::Time deadline, Transport::Done done) {
        Exchange& x = exchanges[i];
        if (x.refs.empty()) {
          t.Push(ids[i], x.grads, deadline, std::move(done), trace);
          return;
        }
        // Blocks come back in request order; the sink runs them one at a
        // time. A retry starts over (blocks are placed idempotently).
        auto next = std::make_shared<size_t>(0);
        Transport::BlockPlace place = [this, &x, &assemblies, &t, next](
                                          const v1::Parameter& header, const Segments& content) {
          if (*next >= x.slots.size()) {
            return absl::DataLossError(
                absl::StrCat("server ", t.address(), " returned more blocks than asked"));
          }
          return PlaceBlock(assemblies[x.slots[(*next)++]], header, content, t.address());
        };
        // Where the next block's content goes, for a transport that reads
        // it there straight from the wire (the bulk channel).
        Transport::BlockWhere where = [&x, &assemblies, next](const v1::Parameter& header,
                                                              uint64_t bytes) -> char* {
          if (*next >= x.slots.size()) return nullptr;
          return PlaceFor(assemblies[x.slots[*next]], x.refs[*next], header, bytes);
        };
        Transport::BlockSink sink(std::move(place), std::move(where));
        if (x.grads.empty()) {
          t.Pull(x.refs, std::move(sink), deadline, std::move(done), trace);
        } else {
          t.PushPull(ids[i], x.grads, x.refs, std::move(sink), deadline, std::move(done), trace);
        }
      },
      deadline, trace, [&](size_t i, trace::Args& args) { DescribeExchange(exchanges[i], ids[i], args); },
      &moved));
  for (size_t i = 0; i < exchanges.size(); ++i) {
    if (!moved[i].ok()) refused->push_back(Refusal{std::move(moved[i]), std::move(exchanges[i].items)});
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Client::GetParam(const std::string& name, const CallOptions& call) {
  PS_ASSIGN_OR_RETURN(std::vector<Tensor> tensors, GetParams({name}, call));
  return std::move(tensors[0]);
}

absl::StatusOr<std::vector<Tensor>> Client::GetParams(absl::Span<const std::string> names,
                                                      const CallOptions& call) {
  std::vector<Tensor> out(names.size());
  PS_RETURN_IF_ERROR(GetParamsInto(names, absl::MakeSpan(out), call));
  return out;
}

absl::Status Client::GetParamsInto(absl::Span<const std::string> names, absl::Span<Tensor> outs,
                                   const CallOptions& call) {
  const ClientTrace::Call span(trace_.get(), "GetParams");
  const Cancellation::Scope cancel_scope(call.cancel);
  const absl::Time deadline = Deadline(call);  // one for both rounds
  if (outs.size() != names.size()) {
    return absl::InvalidArgumentError(absl::StrCat("GetParamsInto: ", names.size(), " names but ",
                                                   outs.size(), " output tensors"));
  }
  std::vector<Assembly> parts(names.size());
  std::vector<Item> first;  // block 0 of parameters whose layout is unknown
  for (size_t i = 0; i < names.size(); ++i) {
    PS_RETURN_IF_ERROR(CheckName(names[i]));
    parts[i].name = names[i];
    parts[i].dest = &outs[i];
    parts[i].layout = FindLayout(names[i]);
    if (parts[i].layout.has_value()) {
      parts[i].Prepare();
    } else {
      v1::ParamRef ref;
      ref.set_name(names[i]);
      first.push_back(Item{std::nullopt, std::move(ref), i, 0});
    }
  }
  PS_RETURN_IF_ERROR(Run(first, parts, deadline, call.trace));

  std::vector<Item> rest;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Layout& layout = *parts[i].layout;
    const size_t block_bytes = layout.elements * ElementSize(layout.type) / layout.blocks;
    for (uint32_t b = 0; b < layout.blocks; ++b) {
      if (parts[i].received[b]) continue;
      rest.push_back(Item{std::nullopt, PullRef(names[i], layout, b, layout.blocks), i,
                          block_bytes});
    }
  }
  PS_RETURN_IF_ERROR(Run(rest, parts, deadline, call.trace));
  return CheckComplete(parts);
}

absl::Status Client::CheckComplete(const std::vector<Assembly>& assemblies) {
  for (const Assembly& a : assemblies) {
    const auto got = std::count(a.received.begin(), a.received.end(), 1);
    if (got != static_cast<long>(a.received.size())) {
      return absl::DataLossError(absl::StrCat("parameter '", a.name, "': received ", got, " of ",
                                              a.received.size(), " blocks"));
    }
  }
  return absl::OkStatus();
}

absl::Status Client::CheckGradient(const GradRef& ref) const {
  const NamedTensorView grad{*ref.name, *ref.tensor};
  PS_RETURN_IF_ERROR(CheckName(grad.name));
  const std::string what = absl::StrCat("gradient for parameter '", grad.name, "'");
  PS_RETURN_IF_ERROR(ValidateStorableType(grad.tensor.type(), what));
  if (grad.tensor.num_elements() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  }
  std::optional<Layout> layout = FindLayout(grad.name);
  if (!layout.has_value()) return absl::OkStatus();  // the server checks it
  if (grad.tensor.type() != layout->type) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": element type ", ElementTypeName(grad.tensor.type()), " received, ",
                     ElementTypeName(layout->type), " expected"));
  }
  if (static_cast<uint64_t>(grad.tensor.num_elements()) != layout->elements) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", grad.tensor.num_elements(), " values received, ", layout->elements,
                     " expected (shape ", ShapeString(layout->shape), ")"));
  }
  const uint32_t blocks = placement().BlockCount(layout->elements, ElementSize(layout->type));
  if (blocks != layout->blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter '", grad.name, "' is stored as ", layout->blocks,
                     " blocks; this client's block_bytes gives ", blocks,
                     ": every client of a cluster must use the same block size"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Client::Layout> Client::FindOrLearnLayout(const std::string& name,
                                                         absl::Time deadline,
                                                         TraceRecorder* trace) {
  PS_RETURN_IF_ERROR(CheckName(name));
  if (std::optional<Layout> layout = FindLayout(name)) return *layout;
  // The header of block 0 (from the home server) carries the layout; no
  // value is read.
  const int home = placement().HomeServer(name);
  v1::GetParamInfoRequest request;
  request.set_name(name);
  v1::GetParamInfoResponse response;
  std::string address;
  PS_RETURN_IF_ERROR(RunWithRetries(
      1, [home](size_t) { return home; },
      [&](size_t, Transport& t, absl::Time attempt_deadline, Transport::Done done) {
        response.Clear();
        address = t.address();
        t.Call("GetParamInfo", request, &response, attempt_deadline, std::move(done));
      },
      deadline, trace));
  std::optional<Layout> learned;
  if (response.has_parameter()) {
    PS_ASSIGN_OR_RETURN(learned,
                        LayoutOf(response.parameter(),
                                 absl::StrCat("parameter '", name, "' from server ", address)));
  }
  if (!learned.has_value()) {
    return absl::DataLossError(absl::StrCat("parameter '", name, "': no block came back"));
  }
  RememberLayout(name, *learned);
  return *learned;
}

absl::StatusOr<bool> Client::NonFiniteVerdict(const std::string& name, const Layout& layout,
                                              uint64_t first, const std::optional<NonFinite>& bad,
                                              std::optional<double> norm) const {
  const bool norm_bad = norm.has_value() && !std::isfinite(*norm);
  if (!bad.has_value() && !norm_bad) return false;
  if (layout.non_finite == v1::ParameterConfig::SKIP) return true;
  const std::vector<BlockSpec> blocks =
      placement().Blocks(name, layout.elements, ElementSize(layout.type));
  // The block the server would name: the one holding the first bad element.
  const uint64_t at = bad.has_value() ? first + bad->index : 0;
  const BlockSpec* where = &blocks.front();
  for (const BlockSpec& b : blocks) {
    if (b.offset <= at && at - b.offset < b.elements) where = &b;
  }
  v1::BlockRef block;
  block.set_index(where->index);
  block.set_count(where->count);
  block.set_offset(where->offset);
  if (!bad.has_value()) return NonFiniteNormError(name, block, *norm);
  return NonFiniteGradientError(name, block, NonFinite{at - where->offset, bad->kind});
}

absl::StatusOr<std::vector<GradientView>> Client::GradientBlocks(const GradRef& ref,
                                                                 std::deque<std::string>* encoded,
                                                                 absl::Time deadline,
                                                                 TraceRecorder* trace) {
  const NamedTensorView grad{*ref.name, *ref.tensor};
  const size_t esize = ElementSize(grad.tensor.type());
  const std::vector<BlockSpec> blocks =
      placement().Blocks(grad.name, grad.tensor.num_elements(), esize);
  // Clip-by-norm on the servers must see the whole gradient's norm.
  std::optional<double> norm;
  // Skipped (a full pass over the gradient) when the parameter is known not
  // to clip by norm.
  const std::optional<Layout> layout = FindLayout(grad.name);
  const bool clips = !layout.has_value() || layout->clips_by_norm;
  if (blocks.size() > 1 && clips && IsFloatingPoint(grad.tensor.type())) {
    norm = L2Norm(grad.tensor.type(), grad.tensor.bytes());
  }
  // A NaN or infinity anywhere: refused here, before any server sees a part
  // of the batch, or every block marked to be skipped by every server.
  bool skip = false;
  const std::optional<NonFinite> bad = FindNonFinite(grad.tensor.type(), grad.tensor.bytes());
  if (bad.has_value() || (norm.has_value() && !std::isfinite(*norm))) {
    PS_ASSIGN_OR_RETURN(Layout known, FindOrLearnLayout(grad.name, deadline, trace));
    PS_RETURN_IF_ERROR(CheckGradient(ref));  // against the layout just learned
    PS_ASSIGN_OR_RETURN(skip, NonFiniteVerdict(grad.name, known, 0, bad, norm));
    if (skip) non_finite_skipped_.fetch_add(1);
  }
  std::vector<GradientView> views;
  views.reserve(blocks.size());
  for (const BlockSpec& b : blocks) {
    views.push_back(BlockGradient(
        grad.name, grad.tensor.type(), b, norm,
        absl::string_view(grad.tensor.bytes()).substr(b.offset * esize, b.elements * esize)));
    views.back().skip_as_non_finite = skip;
  }
  if (!skip && layout.has_value() && layout->type == v1::FLOAT32 &&
      grad.tensor.type() == v1::FLOAT32 && Compresses(layout->compression)) {
    compressor_.Compress(grad.name, layout->compression, layout->elements,
                         absl::MakeSpan(views), &norm, encoded);
    for (GradientView& view : views) view.global_norm = norm;
  }
  return views;
}

absl::Status Client::SendGrad(const std::string& name, const Tensor& grad,
                              const CallOptions& call) {
  const Cancellation::Scope cancel_scope(call.cancel);
  const GradRef ref{&name, &grad};
  return DoSendGrads(absl::MakeConstSpan(&ref, 1), Deadline(call), call.trace);
}

absl::Status Client::SendGrads(absl::Span<const NamedTensor> grads, const CallOptions& call) {
  const Cancellation::Scope cancel_scope(call.cancel);
  return DoSendGrads(RefsOf(grads), Deadline(call), call.trace);
}

absl::Status Client::DoSendGrads(absl::Span<const GradRef> grads, absl::Time deadline,
                                 TraceRecorder* trace) {
  const ClientTrace::Call span(trace_.get(), "SendGrads");
  for (const GradRef& grad : grads) PS_RETURN_IF_ERROR(CheckGradient(grad));
  std::vector<Item> items;
  std::deque<std::string> encoded;  // compressed blocks, sent from here
  for (const GradRef& grad : grads) {
    PS_ASSIGN_OR_RETURN(std::vector<GradientView> views,
                        GradientBlocks(grad, &encoded, deadline, trace));
    for (const GradientView& view : views) {
      items.push_back(Item{view, std::nullopt, 0, view.content.size()});
    }
  }
  std::vector<Assembly> none;
  return Run(items, none, deadline, trace);
}

absl::Status Client::PushPull(absl::Span<const NamedTensor> grads, absl::Span<Tensor> outs,
                              const CallOptions& call) {
  const Cancellation::Scope cancel_scope(call.cancel);
  return DoPushPull(RefsOf(grads), outs, Deadline(call), call.trace);
}

absl::Status Client::PushPull(const std::string& name, const Tensor& grad, Tensor* out,
                              const CallOptions& call) {
  const Cancellation::Scope cancel_scope(call.cancel);
  const GradRef ref{&name, &grad};
  return DoPushPull(absl::MakeConstSpan(&ref, 1), absl::MakeSpan(out, 1), Deadline(call),
                    call.trace);
}

absl::Status Client::DoPushPull(absl::Span<const GradRef> grads, absl::Span<Tensor> outs,
                                absl::Time deadline, TraceRecorder* trace) {
  const ClientTrace::Call span(trace_.get(), "PushPull");
  if (outs.size() != grads.size()) {
    return absl::InvalidArgumentError(absl::StrCat("PushPull: ", grads.size(), " gradients but ",
                                                   outs.size(), " output tensors"));
  }
  std::vector<Assembly> parts(grads.size());
  std::vector<Item> items;
  std::deque<std::string> encoded;  // compressed blocks, sent from here
  for (size_t i = 0; i < grads.size(); ++i) {
    PS_RETURN_IF_ERROR(CheckGradient(grads[i]));
    PS_ASSIGN_OR_RETURN(std::vector<GradientView> views,
                        GradientBlocks(grads[i], &encoded, deadline, trace));
    const NamedTensorView grad{*grads[i].name, *grads[i].tensor};
    // The parameter has the gradient's type and shape (or what we know of it).
    Assembly& a = parts[i];
    a.name = grad.name;
    a.dest = &outs[i];
    a.layout = FindLayout(grad.name);
    if (!a.layout.has_value()) {
      a.layout = Layout{grad.tensor.type(),
                        grad.tensor.shape(),
                        static_cast<uint64_t>(grad.tensor.num_elements()),
                        static_cast<uint32_t>(views.size()),
                        /*clips_by_norm=*/true,
                        v1::ParameterConfig::REJECT};
      a.guessed = true;
    }
    a.Prepare();
    for (size_t b = 0; b < views.size(); ++b) {
      items.push_back(Item{views[b],
                           PullRef(grad.name, *a.layout, static_cast<uint32_t>(b),
                                   static_cast<uint32_t>(views.size())),
                           i, 2 * views[b].content.size()});
    }
  }
  PS_RETURN_IF_ERROR(Run(items, parts, deadline, trace));
  return CheckComplete(parts);
}

absl::Status Client::FlushTrace() {
  return trace_ == nullptr ? absl::OkStatus() : trace_->recorder().Flush();
}

Ticket Client::RunAsync(std::function<absl::Status(const CallOptions&)> call_fn,
                        const CallOptions& call) {
  Ticket ticket;
  CallOptions options = call;
  options.deadline = Deadline(call);  // counted from now, not from when a thread is free
  options.trace = &ticket.recorder();
  if (absl::Status slot = AcquireAsync(options.deadline); !slot.ok()) {
    ticket.Finish(std::move(slot));
    return ticket;
  }
  Schedule([this, ticket, options, call_fn = std::move(call_fn)] {
    absl::Status status;
    {
      const ClientTrace::Call span(trace_.get(), nullptr, ticket.trace().queued);
      const Cancellation::Scope cancel_scope(options.cancel);
      status = call_fn(options);
    }
    ticket.recorder().Replied();
    ReleaseAsync();
    ticket.Finish(std::move(status));
  });
  return ticket;
}

Ticket Client::SendGradsAsync(absl::Span<const NamedTensor> grads, const CallOptions& call) {
  return RunAsync([this, grads](const CallOptions& c) { return SendGrads(grads, c); }, call);
}

Ticket Client::GetParamsIntoAsync(absl::Span<const std::string> names, absl::Span<Tensor> outs,
                                  const CallOptions& call) {
  return RunAsync(
      [this, names, outs](const CallOptions& c) { return GetParamsInto(names, outs, c); }, call);
}

Ticket Client::PushPullAsync(absl::Span<const NamedTensor> grads, absl::Span<Tensor> outs,
                             const CallOptions& call) {
  return RunAsync([this, grads, outs](const CallOptions& c) { return PushPull(grads, outs, c); },
                  call);
}

}  // namespace pserver
