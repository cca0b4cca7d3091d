#include "cc/server/server.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "cc/auth/authorizer.h"
#include "cc/core/memory_budget.h"
#include "cc/core/placement.h"
#include "cc/core/reshard.h"
#include "cc/core/status_macros.h"
#include "cc/cuda/device.h"
#include "cc/cuda/device_storage.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/leased_key.h"
#include "cc/etcd/placement_record.h"
#include "cc/server/placement_gate.h"
#include "cc/etcd/shard_config.h"
#include "cc/rpc/grpc_status.h"
#include "cc/server/advertised_address.h"
#include "cc/server/bulk_listener.h"
#include "cc/server/checkpoint_schedule.h"
#include "cc/server/dispatcher.h"
#include "cc/server/fence.h"
#include "cc/server/standby_slots.h"
#include "cc/server/listener.h"
#include "cc/server/replication.h"
#include "cc/server/service.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/compression.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"

namespace pserver {
namespace {

using etcd_keys::CheckpointKey;

v1::CheckpointRecord RecordOf(const CheckpointInfo& info, const std::string& address) {
  v1::CheckpointRecord record;
  record.set_path(info.path);
  record.set_shard(info.shard);
  record.set_sequence(info.sequence);
  record.set_manifest_crc32c(info.manifest_crc32c);
  record.set_time_micros(absl::ToUnixMicros(info.time));
  record.set_server_address(address);
  record.set_cluster(info.cluster);
  record.set_epoch(info.epoch);
  return record;
}

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message) {
  std::string json;
  auto status = google::protobuf::util::MessageToJsonString(message, &json);
  if (!status.ok()) return absl::InternalError(std::string(status.message()));
  return json;
}

// A shard's own checkpoint of another placement: servers reshard only from
// the newest generation (Server::ReshardAtStart), so an older one is not
// loaded in place of a newer one that failed.
absl::Status PlacementMismatch(const CheckpointInfo& info, const v1::Placement& now) {
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint ", info.path, " was written by ", info.num_servers, " servers (placement ",
      v1::Placement::Kind_Name(info.placement.kind()), "), this cluster has ",
      now.num_servers(), " (", v1::Placement::Kind_Name(now.kind()),
      "): a server reshards only from the newest checkpoints of another placement"));
}

absl::Status FromJson(const std::string& json, google::protobuf::Message* message) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  auto status = google::protobuf::util::JsonStringToMessage(json, message, options);
  if (!status.ok()) return absl::InvalidArgumentError(std::string(status.message()));
  return absl::OkStatus();
}

absl::Status CheckTransportLimits(const ServerOptions& options) {
  if (options.max_message_bytes < 1024 || options.max_message_bytes > (size_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_message_bytes must be in [1024, 2^31-1], got ", options.max_message_bytes));
  }
  if (options.max_standby_copy_bytes < 1024 ||
      options.max_standby_copy_bytes > (size_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_standby_copy_bytes must be in [1024, 2^31-1], got ",
                     options.max_standby_copy_bytes));
  }
  if (options.max_standbys < 1 || options.max_standbys > kMaxShardReplicas) {
    return absl::InvalidArgumentError(absl::StrCat("max_standbys must be in [1, ",
                                                   kMaxShardReplicas, "], got ",
                                                   options.max_standbys));
  }
  if (options.max_joining_bytes < 1024 || options.max_joining_bytes > (uint64_t{1} << 40)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_joining_bytes must be in [1024, 2^40], got ", options.max_joining_bytes));
  }
  if (options.catch_up_bytes != 0 &&
      (options.catch_up_bytes < 1024 || options.catch_up_bytes > (uint64_t{1} << 40))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "catch_up_bytes must be 0 or in [1024, 2^40], got ", options.catch_up_bytes));
  }
  if (options.join_timeout < absl::Seconds(1) || options.join_timeout > absl::Hours(1)) {
    return absl::InvalidArgumentError(absl::StrCat("join_timeout must be in [1s, 1h], got ",
                                                   absl::FormatDuration(options.join_timeout)));
  }
  if (options.replicate_timeout < absl::Seconds(1) ||
      options.replicate_timeout > absl::Hours(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicate_timeout must be in [1s, 1h], got ",
                     absl::FormatDuration(options.replicate_timeout)));
  }
  if (options.max_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_threads must be >= 0, got ", options.max_threads));
  }
  if (options.reserve_fds < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("reserve_fds must be >= 0, got ", options.reserve_fds));
  }
  if (options.max_bulk_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_bulk_connections must be >= 1, got ", options.max_bulk_connections));
  }
  if (options.bulk_frame_receive_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bulk_frame_receive_timeout (--bulk_frame_receive_timeout_seconds) must be "
                     ">= 0 (0: none), got ",
                     absl::FormatDuration(options.bulk_frame_receive_timeout)));
  }
  if (options.bulk_read_spin < absl::ZeroDuration() ||
      options.bulk_read_spin > absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bulk_read_spin_micros must be between 0 and 1000, got ",
                     absl::ToInt64Microseconds(options.bulk_read_spin)));
  }
  if (options.max_concurrent_streams < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_concurrent_streams must be >= 1, got ", options.max_concurrent_streams));
  }
  const std::pair<const char*, absl::Duration> durations[] = {
      {"max_connection_idle", options.max_connection_idle},
      {"handshake_timeout", options.handshake_timeout},
      {"keepalive_time", options.keepalive_time},
      {"keepalive_timeout", options.keepalive_timeout}};
  for (const auto& [name, duration] : durations) {
    if (duration < absl::Milliseconds(1)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " must be at least 1ms, got ", absl::FormatDuration(duration)));
    }
  }
  return absl::OkStatus();
}

// gRPC takes durations as int milliseconds; InfiniteDuration is INT_MAX (never).
int ArgMillis(absl::Duration duration) {
  return static_cast<int>(
      std::min<int64_t>(absl::ToInt64Milliseconds(duration), std::numeric_limits<int>::max()));
}

// What one peer may hold of this server: message and decompressed sizes,
// threads, streams per connection, idle connections (docs/limits.md; the
// Listener closes half-open ones).
void SetTransportLimits(const ServerOptions& options, int max_threads,
                        grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  if (!options.allow_compressed_requests) {
    // Only "identity": gzip and deflate requests are refused before they are inflated.
    builder->AddChannelArgument(GRPC_COMPRESSION_CHANNEL_ENABLED_ALGORITHMS_BITSET,
                                1 << GRPC_COMPRESS_NONE);
  }
  grpc::ResourceQuota quota("pserver");
  quota.SetMaxThreads(max_threads);
  builder->SetResourceQuota(quota);
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                              ArgMillis(options.max_connection_idle));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, ArgMillis(options.keepalive_time));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ArgMillis(options.keepalive_timeout));
  // Clients ping while calls are in flight, at most every kClientKeepaliveTime;
  // idle connections need no pings (they are closed after max_connection_idle).
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                              ArgMillis(kMinClientPingInterval));
}

absl::Status StoppedWhileStarting() { return absl::CancelledError("stopped while starting"); }

// Whether `config` (/shards/<i> as read) names server `instance` (at
// `epoch`) as holder: at its epoch, or at a later one that its own change
// wrote (a standby listed, a backup dropped: etcd moves first, the
// server's ShardConfigCell just after), which another server could not have.
bool StillHolds(const v1::ShardConfig& config, const std::string& instance, uint64_t epoch) {
  return config.holder() == instance && config.epoch() >= epoch;
}

// Mutual TLS on gRPC's own listener; `port` is set once the server starts
// (0 if it could not listen). A client that connects and says nothing is
// dropped after handshake_timeout, as pserver's Listener does.
void AddTlsListeningPort(const ServerOptions& options, const std::string& address, int* port,
                         grpc::ServerBuilder* builder) {
  builder->AddListeningPort(address, MakeServerCredentials(options.tls), port);
  builder->AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                              ArgMillis(options.handshake_timeout));
}

}  // namespace

Server::Server(const ServerOptions& options, std::optional<int> device)
    : options_(options),
      store_(MakeStoreOptions(device)),
      tables_(MakeTablesOptions(options)),
      instance_id_(etcd_keys::NewInstanceId()),
      index_(options.index),
      num_servers_(options.num_servers) {
  if (options_.process_slots != nullptr) options_.process_slots->Add(instance_id_);
}

TablesOptions Server::MakeTablesOptions(const ServerOptions& options) {
  TablesOptions tables_options;
  tables_options.max_collective_bytes = options.max_collective_bytes;
  tables_options.max_workers_per_table = options.max_workers_per_table;
  tables_options.max_held_add_bytes = options.max_held_add_bytes;
  tables_options.max_tables = static_cast<size_t>(options.max_tables);
  tables_options.max_row_bytes = options.max_table_row_bytes;
  return tables_options;
}

StoreOptions Server::MakeStoreOptions(std::optional<int> device) {
  StoreOptions store_options;
  store_options.max_bytes = options_.max_param_bytes;
  if (device.has_value()) {
    cuda::DeviceStorageOptions device_options;
    device_options.device = *device;
    // Called at the first block the device cannot hold, long after construction.
    device_options.log = [this](const std::string& line) { Log(line); };
    store_options.storage_factory = cuda::DeviceStorageFactory(std::move(device_options));
  }
  return store_options;
}

ServerOptions Server::WithMemoryBudgets(ServerOptions options) {
  // Half of the physical memory each: together they stay within it.
  const uint64_t physical = PhysicalMemoryBytes();
  const uint64_t half = physical == 0 ? MemoryBudget::kUnlimited : physical / 2;
  if (options.max_param_bytes == 0) options.max_param_bytes = half;
  if (options.max_table_row_bytes == 0) options.max_table_row_bytes = half;
  return options;
}

void Server::LogMemoryBudgets() const {
  const MemoryBudget& params = store_.budget();
  const MemoryBudget& rows = tables_.row_budget();
  Log(absl::StrCat("memory budgets: parameters ", params.limit(), " bytes (--max_param_bytes), ",
                   params.used(), " held; table rows ", rows.limit(),
                   " bytes (--max_table_row_bytes), ", rows.used(), " held"));
  if (params.used() > params.limit() || rows.used() > rows.limit()) {
    Log("the state loaded is past a memory budget: it is kept whole, and InitParam or pushes "
        "that create rows are refused until enough is freed",
        log::Level::kWarning);
  }
}

void Server::Log(const std::string& message, log::Level level) const {
  const bool unregistered = etcd_ != nullptr && registrations() == 0;
  log::Default().Log(level, unregistered ? "(no index yet)" : absl::StrCat(index_), message);
}

bool Server::StopRequested() const {
  return options_.stop != nullptr && options_.stop->HasBeenNotified();
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port must be in [0, 65535], got ", options.port));
  }
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_threads must be >= 0, got ", options.num_threads));
  }
  if (options.host.empty()) return absl::InvalidArgumentError("host is empty");
  // Refused before binding: a server others cannot find is no use.
  PS_ASSIGN_OR_RETURN(const std::string advertised_host,
                      AdvertisedHost(options.host, options.advertise_host));
  // /metrics on every address is published at the advertised host.
  std::string metrics_host;
  if (options.metrics_http.has_value()) {
    const std::string& listen = options.metrics_http->host;
    absl::StatusOr<std::string> host =
        AdvertisedHost(listen, IsUnspecifiedHost(listen) ? advertised_host : listen);
    if (!host.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metrics_host '", listen, "': ", host.status().message()));
    }
    metrics_host = *std::move(host);
  }
  if (options.device != "cpu" &&
      !(absl::StartsWith(options.device, "cuda:") && options.device.size() > 5 &&
        options.device.find_first_not_of("0123456789", 5) == std::string::npos)) {
    return absl::InvalidArgumentError(
        absl::StrCat("device must be cpu or cuda:<N>, got '", options.device, "'"));
  }
  std::optional<int> device;
  std::string device_description;
  if (options.device != "cpu") {
    // Fails here, naming the runtime's reason, when the device is missing.
    PS_ASSIGN_OR_RETURN(cuda::DeviceChoice choice, cuda::ChooseDevice(options.device));
    device = choice.ordinal;
    absl::StatusOr<cuda::DeviceInfo> info = cuda::GetDeviceInfo(choice.ordinal);
    device_description = info.ok() ? info->ToString() : choice.name;
  }
  if (options.max_reply_bytes_in_flight == 0) {
    return absl::InvalidArgumentError("max_reply_bytes_in_flight must be > 0");
  }
  if (options.max_collective_bytes == 0) {
    return absl::InvalidArgumentError("max_collective_bytes must be > 0");
  }
  if (options.max_held_add_bytes == 0) {
    return absl::InvalidArgumentError("max_held_add_bytes must be > 0");
  }
  if (options.max_tables == 0) {
    return absl::InvalidArgumentError("max_tables (--max_tables) must be >= 1");
  }
  if (options.max_workers_per_table == 0) {
    return absl::InvalidArgumentError("max_workers_per_table must be >= 1");
  }
  if (options.max_exactly_once_clients == 0) {
    return absl::InvalidArgumentError("max_exactly_once_clients must be >= 1");
  }
  if (options.checkpoint_keep < 1)
    return absl::InvalidArgumentError("checkpoint_keep must be >= 1");
  PS_RETURN_IF_ERROR(CheckCheckpointFileMode(options.checkpoint_file_mode));
  if (options.checkpoint_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("checkpoint_interval must be >= 0");
  }
  if (!options.etcd_endpoints.empty() && options.lease_ttl < absl::Seconds(1)) {
    return absl::InvalidArgumentError("lease_ttl must be at least 1s");
  }
  PS_RETURN_IF_ERROR(CheckTransportLimits(options));
  if ((options.standby || options.accept_standbys) && options.etcd_endpoints.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.standby ? "a standby (--standby)" : "--accept_standbys", " needs etcd (--etcd)"));
  }
  PeerCredentials peer;
  peer.tls = options.tls;
  if (!options.peer_token_file.empty()) {
    PS_ASSIGN_OR_RETURN(peer.token, ReadPeerToken(options.peer_token_file));
  }
  if ((options.standby || options.accept_standbys || options.placement_redirects) &&
      !options.auth_tokens_file.empty() && options.auth_cert_rule.empty() && peer.token.empty()) {
    return absl::InvalidArgumentError(
        "--standby, --accept_standbys and --placement_redirects with --auth_tokens_file need "
        "--peer_token_file: the token (of an admin of this job) this server presents to the "
        "other servers when it replicates or hands blocks over (or set --auth_cert_rule, so "
        "its TLS certificate names its role)");
  }
  PS_RETURN_IF_ERROR(CheckTlsOptions(options.tls));
  // With TLS the bulk channel is TLS too (TCP only).
  const bool bulk_channel = options.bulk_channel;
  const int threads = options.num_threads > 0
                          ? options.num_threads
                          : std::max(4, 2 * static_cast<int>(std::thread::hardware_concurrency()));

  std::unique_ptr<Server> server(new Server(WithMemoryBudgets(options), device));
  Server* const raw = server.get();
  server->peer_ = std::move(peer);
  DispatcherHooks hooks;
  hooks.drop_reply_after_apply_every_n = options.drop_reply_after_apply_every_n;
  hooks.max_reply_bytes_in_flight = options.max_reply_bytes_in_flight;
  if (!options.checkpoint_dir.empty()) {
    hooks.save = [raw]() -> absl::StatusOr<v1::CheckpointRecord> {
      PS_ASSIGN_OR_RETURN(CheckpointInfo info, raw->Save());
      return RecordOf(info, raw->address());
    };
  }
  if (!options.etcd_endpoints.empty()) {
    hooks.list_workers = [raw] { return raw->ListWorkers(); };
  }
  if (bulk_channel) {
    hooks.open_channel = [raw] { return raw->bulk_listener_->Offer(); };
    hooks.bulk_aead_connections = [raw]() -> uint64_t {
      return raw->bulk_listener_ == nullptr ? 0 : raw->bulk_listener_->aead_connections();
    };
  }
  if (options.accept_standbys || options.standby) {
    // Set once serving (AttachStandby needs it): a standby's once it took over.
    hooks.attach_standby = [raw](const v1::AttachStandbyRequest& request)
        -> absl::StatusOr<v1::AttachStandbyResponse> {
      if (raw->primary_replication_ == nullptr) {
        return absl::UnavailableError("this server does not hold a shard yet; retry");
      }
      if (raw->placement_gate_ != nullptr) {
        PS_RETURN_IF_ERROR(
            CheckStandbyMayAttach(*raw->placement_gate_, !raw->tables_.Names().empty()));
      }
      return raw->primary_replication_->Attach(request);
    };
    hooks.degraded = [raw] { return raw->Degraded(); };
  }
  if (options.placement_redirects) {
    // Set once serving (StartPlacementGate).
    auto mover = [raw]() -> absl::StatusOr<BlockMover*> {
      if (!raw->block_mover_set_.load(std::memory_order_acquire)) {
        return absl::UnavailableError("this server is still starting; retry");
      }
      return raw->block_mover_.get();
    };
    hooks.move_blocks = [mover](const v1::MoveBlocksRequest& request,
                                v1::MoveBlocksResponse* response,
                                std::function<void(absl::Status)> done) {
      absl::StatusOr<BlockMover*> m = mover();
      if (!m.ok()) return done(m.status());
      (*m)->MoveAsync(request, response, std::move(done));
    };
    hooks.receive_blocks = [mover](const v1::ReceiveBlocksRequest& request)
        -> absl::StatusOr<v1::ReceiveBlocksResponse> {
      PS_ASSIGN_OR_RETURN(BlockMover * m, mover());
      return m->Receive(request);
    };
  }
  if (options.standby) {
    hooks.replicate = [raw](const v1::ReplicateRequest& request) {
      return raw->backup_replication_->Replicate(request);
    };
  }
  server->dispatcher_ = std::make_unique<Dispatcher>(&server->store_, &server->tables_,
                                                     options.index, std::move(hooks));
  server->dispatcher_->applied().set_max_clients(options.max_exactly_once_clients);
  if (!options.trace_file.empty()) {
    trace::RecorderOptions trace;
    trace.path = options.trace_file;
    trace.max_events = options.trace_max_events;
    // With etcd the index is claimed later: the file's pid tells servers apart.
    trace.process_name = options.etcd_endpoints.empty()
                             ? absl::StrCat("pserver server ", options.index)
                             : "pserver server";
    PS_ASSIGN_OR_RETURN(server->trace_, trace::Recorder::Open(trace));
    server->dispatcher_->SetTrace(server->trace_.get());
  }
  if (options.standby) {
    server->backup_replication_ = std::make_unique<BackupReplication>(
        server->dispatcher_.get(),
        [raw](absl::string_view method, absl::string_view request) {
          return ApplyMoveWriteOnBackup(method, request, raw->store_, raw->tables_,
                                        raw->move_marks_);
        });
  }
  AuthOptions auth;
  auth.job = options.job;
  auth.tokens_file = options.auth_tokens_file;
  auth.cert_rule = options.auth_cert_rule;
  PS_ASSIGN_OR_RETURN(server->auth_, Authorizer::Create(auth));
  ServiceSecurity security;
  security.auth = server->auth_.get();
  security.instance_id = server->instance_id_;
  server->service_ =
      std::make_unique<ParameterServerService>(server->dispatcher_.get(), std::move(security));
  // Claiming an index and loading a checkpoint happen while gRPC already
  // listens (the address goes into etcd); calls meanwhile get UNAVAILABLE.
  const bool staged = !options.etcd_endpoints.empty() || !options.checkpoint_dir.empty();
  if (staged) server->dispatcher_->SetServing(false);

  // pserver's own listener: gRPC's stops for good at the first EMFILE. It
  // hands over plaintext connections only: TLS uses gRPC's (below).
  if (!options.tls.enabled()) {
    PS_ASSIGN_OR_RETURN(server->listener_, Listener::Bind(options.host, options.port,
                                                          options.reserve_fds,
                                                          options.handshake_timeout));
    server->port_ = server->listener_->port();
  }
  if (bulk_channel) {
    BulkListenerOptions bulk;
    bulk.host = options.host;
    bulk.unix_socket = options.bulk_unix_socket && !options.tls.enabled();
    bulk.tls = options.tls;
    bulk.max_connections = options.max_bulk_connections;
    bulk.max_request_bytes_in_flight = options.max_bulk_request_bytes_in_flight;
    bulk.frame_receive_timeout = options.bulk_frame_receive_timeout;
    bulk.read_spin = options.bulk_read_spin;
    bulk.max_frame_bytes = options.max_message_bytes;
    bulk.auth = server->auth_.get();
    if (options.standby) {  // its primary's writes come over the channel too
      bulk.replicate = [raw](uint32_t shard, BackupLog::Write write) {
        return raw->backup_replication_->Deliver(shard, std::move(write));
      };
    }
    PS_ASSIGN_OR_RETURN(server->bulk_listener_,
                        BulkListener::Start(server->dispatcher_.get(), bulk));
  }
  grpc::ServerBuilder builder;
  server->service_->RegisterWith(&builder);
  SetTransportLimits(options, options.max_threads > 0 ? options.max_threads : kDefaultMaxThreads,
                     &builder);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kInitialStreamWindowBytes);
  builder.SetMaxSendMessageSize(-1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, threads);
  if (options.tls.enabled()) {
    AddTlsListeningPort(options, JoinHostPort(options.host, options.port), &server->port_, &builder);
  }
  grpc::EnableDefaultHealthCheckService(true);  // grpc.health.v1.Health
  server->grpc_server_ = builder.BuildAndStart();
  if (server->grpc_server_ == nullptr) return absl::InternalError("cannot start the gRPC server");
  server->UpdateHealth();  // NOT_SERVING until registered and loaded
  if (server->listener_ != nullptr) {
    server->listener_->Start(server->grpc_server_.get());
  } else if (server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", JoinHostPort(options.host, options.port)));
  }
  server->address_ = JoinHostPort(advertised_host, server->port_);
  if (options.metrics_http.has_value()) {
    PS_RETURN_IF_ERROR(server->StartMetrics());
    server->metrics_address_ = JoinHostPort(metrics_host, server->metrics_port());
    server->dispatcher_->SetMetricsAddress(server->metrics_address_);
  }
  if (!options.etcd_endpoints.empty()) PS_RETURN_IF_ERROR(server->Register());
  if (server->StopRequested()) return StoppedWhileStarting();
  if (!options.checkpoint_dir.empty()) {
    if (options.standby) {
      // Its state is the copy it took over, not a checkpoint on disk.
      PS_RETURN_IF_ERROR(
          CheckWritableDirectory(server->ShardDir(), options.checkpoint_file_mode));
      server->SetNextSequence(0);
    } else {
      PS_RETURN_IF_ERROR(server->LoadShard());
    }
  }
  if (server->StopRequested()) return StoppedWhileStarting();
  if (device.has_value()) {
    server->Log(absl::StrCat("dense shards live on ", device_description,
                             "; blocks the device cannot update, sparse and KV tables in host "
                             "memory"));
  }
  server->LogMemoryBudgets();
  server->loaded_ok_ = true;
  if (server->loaded_.has_value()) {
    server->checkpoint_metrics_.last_success_unix_nanos = absl::ToUnixNanos(server->loaded_->time);
  }
  server->dispatcher_->SetIndex(server->index_);
  if (server->registration_ != nullptr) {
    FenceOptions fence;
    fence.shard = server->index_;
    fence.renewal = [raw] { return raw->registration_->LastRenewal(); };
    fence.on_unconfirmed = [raw] { raw->RecheckFenceSoon(); };
    server->fence_ = std::make_unique<Fence>(std::move(fence));
    server->dispatcher_->SetFence(server->fence_.get());
    server->fence_thread_ = std::thread([raw] { raw->FenceLoop(); });
  }
  if (options.placement_redirects) PS_RETURN_IF_ERROR(server->StartPlacementGate());
  if (options.accept_standbys && server->registration_ != nullptr) {
    PrimaryReplicationOptions replication;
    replication.shard = server->index_;
    replication.instance_id = server->instance_id_;
    replication.etcd = server->etcd_.get();
    replication.config = &server->config_;
    replication.dispatcher = server->dispatcher_.get();
    replication.write_options = server->WriteOptions();  // cluster, count, placement
    replication.max_standbys = options.max_standbys;
    replication.max_joining_bytes = options.max_joining_bytes;
    replication.join_timeout = options.join_timeout;
    replication.replicate_timeout = options.replicate_timeout;
    replication.catch_up_bytes = options.catch_up_bytes;
    // A promoted standby's state up to its last LSN is its old primary's.
    if (server->backup_replication_ != nullptr) {
      replication.predecessor_term = server->backup_replication_->term();
    }
    replication.peer = server->peer_;
    // The bulk channel's hello carries neither this server's certificate
    // nor its peer token: on a secured cluster writes go over gRPC
    // Replicate, which carries both (docs/replication.md).
    replication.channel.enabled = !server->peer_.tls.enabled() && server->peer_.token.empty();
    replication.channel.bearer_token = server->peer_.token;
    replication.step_down = [raw](const std::string& why) { raw->StepDown(why); };
    replication.log = [raw](const std::string& line) { raw->Log(line); };
    server->primary_replication_ = std::make_unique<PrimaryReplication>(
        std::move(replication), server->backup_replication_ == nullptr
                                    ? 0
                                    : server->backup_replication_->applied_lsn());
    server->dispatcher_->SetShipper(server->primary_replication_.get());
    server->primary_replication_set_ = true;
  }
  server->loaded_ok_ = true;  // after the fence: a save may need it
  server->dispatcher_->SetServing(true);
  server->UpdateHealth();
  if (!options.checkpoint_dir.empty() && options.checkpoint_interval > absl::ZeroDuration()) {
    server->checkpoint_thread_ = std::thread([raw] { raw->CheckpointLoop(); });
  }
  if (server->registration_ != nullptr) server->registration_->KeepRegistered();
  server->sweep_thread_ = std::thread([raw] { raw->SweepLoop(); });
  return server;
}

// ---- registry ----------------------------------------------------------------------

absl::Status Server::Register() {
  EtcdClientOptions etcd_options;
  etcd_options.endpoints = options_.etcd_endpoints;
  etcd_options.prefix = etcd_keys::ClusterPrefix(options_.cluster);
  etcd_options.tls = options_.etcd_tls;
  PS_ASSIGN_OR_RETURN(etcd_, EtcdClient::Connect(etcd_options));
  const absl::Time deadline = absl::Now() + options_.register_timeout;
  // etcd may still be starting: retry every call until the deadline.
  auto until_deadline = [&](auto call) {
    while (true) {
      auto result = call();
      if (!result.ok() && StopRequested()) return decltype(result)(StoppedWhileStarting());
      if (result.ok() || absl::Now() >= deadline ||
          !(absl::IsUnavailable(result.status()) || absl::IsDeadlineExceeded(result.status()))) {
        return result;
      }
      PauseUnlessStopped(absl::Milliseconds(100));
    }
  };

  const std::string desired_key = etcd_keys::DesiredKey();
  if (options_.num_servers > 0) {
    PS_RETURN_IF_ERROR(until_deadline([&] {
                         return etcd_->PutIfAbsent(desired_key,
                                                   absl::StrCat(options_.num_servers));
                       }).status());
  }
  absl::StatusOr<KeyValue> desired_kv = until_deadline([&] { return etcd_->Get(desired_key); });
  if (absl::IsNotFound(desired_kv.status())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "etcd ", etcd_options.prefix, desired_key, " is not set; start with --num_servers"));
  }
  PS_RETURN_IF_ERROR(desired_kv.status());
  uint32_t desired = 0;
  if (!absl::SimpleAtoi(desired_kv->value, &desired) || desired == 0) {
    return absl::FailedPreconditionError(absl::StrCat("etcd ", etcd_options.prefix, desired_key,
                                                      " holds '", desired_kv->value,
                                                      "', not a server count"));
  }
  // Reported at once: waiting would mean waiting for an index that never
  // frees up (fewer desired) or serving a cluster of another size. A
  // standby claims no index: it backs up a shard of the count etcd has
  // (a --replicas slot started again after a live move changed it).
  if (options_.num_servers > 0 && desired != options_.num_servers && !options_.standby) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--num_servers=", options_.num_servers, " disagrees with etcd ", etcd_options.prefix,
        desired_key, " = ", desired, "; start with --num_servers=", desired,
        " (or without it), or change the desired count first (psctl desired)"));
  }
  num_servers_ = desired;
  // The placement for this count: written by the first server to get here,
  // read back by the others. A malformed value fails start and stays.
  absl::StatusOr<v1::Placement> placement =
      until_deadline([&] { return EnsurePlacement(*etcd_, desired); });
  PS_RETURN_IF_ERROR(placement.status());
  placement_version_ = placement->version();
  if (placement->moving() && placement->num_servers() > desired) {
    // A move to more servers under way, /ps_desired not raised yet: this
    // server may take one of the new indexes.
    desired = placement->num_servers();
    num_servers_ = desired;
  }

  LeasedKeyOptions lease_options;
  lease_options.value = etcd_keys::FormatServerValue({address_, instance_id_, metrics_address_});
  lease_options.ttl = options_.lease_ttl;
  lease_options.ownership = LeasedKeyOptions::Ownership::kExclusive;
  lease_options.log = [this](const std::string& message) { Log(message); };
  PS_ASSIGN_OR_RETURN(registration_, until_deadline([&] {
                        return LeasedKey::Grant(etcd_.get(), lease_options);
                      }));
  if (options_.standby) return RunStandby(desired, deadline, until_deadline);
  // The lowest free index; when all are taken (a killed server's lease has
  // not expired yet), look again until one frees up.
  bool waiting_logged = false;
  while (true) {
    absl::StatusOr<std::vector<KeyValue>> taken =
        until_deadline([&] { return etcd_->GetPrefix(etcd_keys::ServersPrefix()); });
    PS_RETURN_IF_ERROR(taken.status());
    std::vector<bool> used(desired, false);
    for (const KeyValue& kv : *taken) {
      absl::StatusOr<uint32_t> i = etcd_keys::ParseServerKey(kv.key);
      if (i.ok() && *i < desired) used[*i] = true;
    }
    for (uint32_t i = 0; i < desired; ++i) {
      if (used[i]) continue;
      const std::string key = etcd_keys::ServerKey(i);
      // The claim bumps the shard's epoch in the same transaction, guarded
      // by the configuration read here (a race with another claim fails it;
      // the next round reads again).
      absl::StatusOr<KeyValue> current =
          until_deadline([&] { return etcd_->Get(etcd_keys::ShardKey(i)); });
      if (!current.ok() && !absl::IsNotFound(current.status())) return current.status();
      absl::StatusOr<ShardClaim> next = NextShardClaim(
          i, current.ok() ? &*current : nullptr, instance_id_, address_, EpochOnDisk(i));
      if (next.ok() && current.ok()) {
        absl::StatusOr<v1::ShardConfig> old = ParseShardConfig(i, current->value);
        if (old.ok() && old->replicas_size() > 0) {
          // Its backup holds the newer state and takes it over (a claim
          // here would load a checkpoint and lose what the backup has).
          if (!waiting_logged) {
            Log(absl::StrCat("index ", i, " is free but etcd ", etcd_keys::ShardKey(i),
                             " lists backup ", old->replicas(0),
                             ", which takes it over; not claiming it"));
          }
          continue;
        }
      }
      if (!next.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat(next.status().message(), "; this server does not claim index ", i,
                         " over it: if no server holds shard ", i, ", delete the key (etcdctl del ",
                         etcd_options.prefix, etcd_keys::ShardKey(i), ")"));
      }
      ClaimGuard guard;
      guard.compares.push_back(next->unchanged);
      guard.ops.push_back(next->put);
      // A re-registration after a lost lease retakes the index only if no
      // one has claimed the shard since.
      guard.current_reclaim_compares = ReclaimGuard(i);
      absl::StatusOr<bool> claimed =
          until_deadline([&] { return registration_->Claim(key, guard); });
      PS_RETURN_IF_ERROR(claimed.status());
      if (*claimed) {
        index_ = i;
        config_.Set(next->config.epoch(), next->value);
        Log(absl::StrCat("claimed index ", i, " of ", desired, " at ", etcd_options.prefix, key,
                         " (lease ", registration_->lease(), ", epoch ", epoch(), ")"));
        return absl::OkStatus();
      }
    }
    if (StopRequested()) return StoppedWhileStarting();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "all ", desired, " server indices in etcd ", etcd_options.prefix,
          etcd_keys::ServersPrefix(), " stayed taken for ",
          absl::FormatDuration(options_.register_timeout)));
    }
    if (!waiting_logged) {
      Log(absl::StrCat("all ", desired, " indices are taken; waiting for one to free up"));
      waiting_logged = true;
    }
    // A move to more servers may have begun meanwhile (psctl scale): then
    // the new indexes are free to claim.
    if (absl::StatusOr<std::optional<v1::Placement>> now = ReadPlacement(*etcd_);
        now.ok() && now->has_value() && (*now)->moving() && (*now)->num_servers() > desired) {
      desired = (*now)->num_servers();
      num_servers_ = desired;
      placement_version_ = (*now)->version();
      Log(absl::StrCat("placement version ", placement_version_, " moves to ", desired,
                       " servers: looking for a free index again"));
    }
    PauseUnlessStopped(absl::Milliseconds(50));
  }
}

// ---- standby (docs/replication.md) ---------------------------------------------------

template <typename Retry>
absl::Status Server::RunStandby(uint32_t desired, absl::Time deadline, Retry& retry) {
  LeasedKeyOptions standby_options;
  standby_options.value = etcd_keys::FormatServerValue({address_, instance_id_});
  standby_options.ttl = options_.lease_ttl;
  standby_options.ownership = LeasedKeyOptions::Ownership::kExclusive;
  for (int round = 0;; ++round) {
    if (round > 0) {
      // A fresh copy replaces the state: the old one's writes stop first.
      backup_replication_->Detach();
      move_marks_.Clear();  // of the state the fresh copy replaces
      if (options_.process_slots != nullptr) options_.process_slots->Detached(instance_id_);
      if (standby_key_ != nullptr) standby_key_->Release();
      standby_key_.reset();
      deadline = absl::Now() + options_.register_timeout;
    }
    PS_RETURN_IF_ERROR(AttachToAShard(desired, deadline, retry, standby_options));
    PS_ASSIGN_OR_RETURN(bool took_over, FollowPrimary());
    if (took_over) return absl::OkStatus();
  }
}

template <typename Retry>
absl::Status Server::AttachToAShard(uint32_t desired, absl::Time deadline, Retry& retry,
                                    const LeasedKeyOptions& standby_options) {
  bool waiting_logged = false;
  // The last failure logged per shard: a refusal repeated every round (a
  // primary moving blocks refuses standbys until the move ends) once.
  std::map<uint32_t, std::string> logged_failures;
  // A shard whose primary serves, the fewest backups first: hold
  // /standby/<i>/<instance>, copy it.
  while (true) {
    if (StopRequested()) return StoppedWhileStarting();
    // The slots of one process (--replicas) choose and attach one at a
    // time, and never to a shard the process holds or backs up already.
    std::optional<absl::MutexLock> one_slot_at_a_time;
    if (options_.process_slots != nullptr) {
      one_slot_at_a_time.emplace(&options_.process_slots->attach_mu());
    }
    // (backups, not the preferred shard, shard): the fewest backups first.
    std::vector<std::tuple<int, bool, uint32_t>> candidates;
    // A slot (--replicas) looks at the shards of the placement now (live
    // moves change the count; a departed shard is not backed up) and counts
    // live backups (/standby/<i>/: joining ones included, dead ones not).
    const bool slot = options_.process_slots != nullptr;
    const uint32_t count = slot ? ShardCount(desired) : desired;
    std::vector<std::string> primaries(count);
    for (uint32_t i = 0; i < count; ++i) {
      absl::StatusOr<KeyValue> primary = etcd_->Get(etcd_keys::ServerKey(i));
      absl::StatusOr<KeyValue> shard = etcd_->Get(etcd_keys::ShardKey(i));
      if (!primary.ok() || !shard.ok()) continue;
      absl::StatusOr<v1::ShardConfig> config = ParseShardConfig(i, shard->value);
      if (!config.ok() || config->replicas_size() >= kMaxShardReplicas) continue;
      if (slot &&
          options_.process_slots->Ours(i, config->holder(), config->replicas(), instance_id_)) {
        continue;
      }
      const int backups = slot ? LiveBackups(i) : config->replicas_size();
      if (backups < 0) continue;
      primaries[i] = primary->value;
      candidates.emplace_back(backups, options_.standby_prefer_shard != i, i);
    }
    std::sort(candidates.begin(), candidates.end());
    for (const auto& [backups, other, i] : candidates) {
      if (standby_key_ == nullptr) {
        PS_ASSIGN_OR_RETURN(standby_key_,
                            retry([&] { return LeasedKey::Grant(etcd_.get(), standby_options); }));
      }
      absl::StatusOr<bool> held = standby_key_->Claim(etcd_keys::StandbyKey(i, instance_id_));
      if (!held.ok() || !*held) continue;
      absl::Status copied = AttachTo(i, primaries[i]);
      if (copied.ok()) {
        standby_key_->KeepRegistered();
        return absl::OkStatus();
      }
      if (std::string& logged = logged_failures[i]; logged != copied.ToString()) {
        logged = copied.ToString();
        Log(absl::StrCat("attaching to shard ", i, " failed: ", logged), log::Level::kWarning);
      }
      standby_key_->Release();  // this one draws a new lease
      standby_key_.reset();
      if (!absl::IsUnavailable(copied) && !absl::IsFailedPrecondition(copied) &&
          !absl::IsDeadlineExceeded(copied)) {
        return copied;
      }
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no shard of ", desired, " had a serving primary that took another standby for ",
          absl::FormatDuration(options_.register_timeout), ": this standby attached to none"));
    }
    if (!waiting_logged) {
      Log(absl::StrCat("standby: no shard of ", desired,
                       " has a primary that takes another standby; waiting"));
      waiting_logged = true;
    }
    one_slot_at_a_time.reset();
    PauseUnlessStopped(absl::Milliseconds(50));
  }
}

absl::StatusOr<bool> Server::FollowPrimary() {
  // Serve the primary's writes until it is gone, then take over: when
  // /ps/<i> disappears (its lease expired, or it shut down), or at once when
  // the primary's address refuses connections (its process died on a live
  // host: no need to wait for the lease). False when /shards/<i> no longer
  // lists this standby: copy a shard anew.
  const std::string key = etcd_keys::ServerKey(index_);
  const std::string shard_key = etcd_keys::ShardKey(index_);
  // /ps/<i> is read when a watch on it fires (and every second besides, in
  // case the watch broke, and to see /shards/<i> drop this standby); the
  // primary's channel is looked at every 20 ms, which costs no system call
  // while it is connected.
  absl::Mutex watch_mu;
  bool changed = true;
  absl::StatusOr<std::unique_ptr<Watcher>> watcher =
      etcd_->Watch(key, 0, [&watch_mu, &changed](const WatchEvent&) {
        absl::MutexLock lock(&watch_mu);
        changed = true;
      });
  if (!watcher.ok()) {
    Log(absl::StrCat("standby: cannot watch ", key, " (", watcher.status().ToString(),
                     "); reading it every 20 ms instead"),
        log::Level::kWarning);
  }
  // A fresh standby is listed only once it caught up on the writes made
  // during its copy (PrimaryReplication::Attach): until then not being
  // listed is expected. It asks the primary every kJoinCheckPeriod whether
  // its join goes on (one let go learns why at once), and gives up on its
  // own after the primary's join timeout and a minute more.
  constexpr absl::Duration kJoinCheckPeriod = absl::Milliseconds(250);
  const absl::Duration join_timeout = options_.join_timeout + absl::Minutes(1);
  const absl::Time join_deadline = absl::Now() + join_timeout;
  std::unique_ptr<v1::ParameterServer::Stub> join_stub =
      v1::ParameterServer::NewStub(PeerChannel(copied_from_address_, peer_));
  absl::Time next_join_check = absl::Now() + kJoinCheckPeriod;
  bool listed_once = false;
  int position = 0;  // among the shard's backups, once listed
  // Not listed as holder or backup: dropped, or another backup took over
  // (or, never listed, let go while joining).
  auto unlisted = [&]() -> bool {
    absl::StatusOr<KeyValue> shard = etcd_->Get(shard_key);
    if (!shard.ok()) return false;
    absl::StatusOr<v1::ShardConfig> config = ParseShardConfig(index_, shard->value);
    if (!config.ok()) return false;
    bool listed = config->holder() == instance_id_;
    for (int r = 0; r < config->replicas_size(); ++r) {
      if (config->replicas(r) != instance_id_) continue;
      listed = true;
      position = r;
    }
    if (listed) {
      listed_once = true;
      return false;
    }
    if (!listed_once) {
      // Its primary gone (another holds the shard) before it was listed:
      // nothing it holds is promised; copy the new holder's state.
      if (config->holder() != copied_from_instance_) {
        Log(absl::StrCat("standby: etcd ", shard_key, " at epoch ", config->epoch(),
                         " names holder ", config->holder(), ", not the primary this standby "
                         "was joining; copying a shard anew"));
        return true;
      }
      if (absl::Now() < join_deadline) return false;
      Log(absl::StrCat("standby: etcd ", shard_key, " did not list this standby within ",
                       absl::FormatDuration(join_timeout), " of its copy; copying a shard anew"));
      return true;
    }
    Log(absl::StrCat("standby: etcd ", shard_key, " at epoch ", config->epoch(), " (holder ",
                     config->holder(), ") no longer lists this standby; copying a shard anew"));
    return true;
  };
  // A takeover attempt: true when it took over; false to go on watching.
  // A standby still joining (never listed) cannot take over: it copies the
  // shard again from whoever serves it next.
  bool recopy = false;
  // A standby slot (--replicas) leaves its shard (ABORTED: the slot starts
  // a fresh standby) when the shard departed in a live move, rather than
  // take it over, or, once listed, to back up a shard that lacks a backup
  // (docs/replication.md, "Replicas in the serving processes").
  const bool slot = options_.process_slots != nullptr;
  absl::Time over_since = absl::InfiniteFuture();
  auto slot_leaves = [&](bool rebalance) -> absl::Status {
    if (!slot) return absl::OkStatus();
    std::string why = Departed(index_);
    if (!why.empty()) {
      // Out of /shards/<i> too: a server claiming index i in a later move
      // to more servers would otherwise wait for this backup to take over.
      LeaveShardConfig();
    } else if (rebalance && listed_once) {
      why = ReasonToRebalance(position, &over_since);
    }
    if (why.empty()) return absl::OkStatus();
    Log(absl::StrCat("standby slot: leaving shard ", index_, ": ", why));
    // Its primary drops it at its next write, at once.
    backup_replication_->Leave(why);
    return absl::AbortedError(absl::StrCat("the standby of shard ", index_, " left it: ", why));
  };
  auto take_over = [&]() -> absl::StatusOr<bool> {
    PS_RETURN_IF_ERROR(slot_leaves(/*rebalance=*/false));
    absl::StatusOr<bool> took_over = TakeOver(index_);
    if (absl::IsFailedPrecondition(took_over.status())) {
      Log(std::string(took_over.status().message()));
      recopy = !listed_once;
      return false;
    }
    return took_over;
  };
  PrimaryProbe probe(peer_);
  absl::Time next_read = absl::InfinitePast();
  absl::StatusOr<KeyValue> primary = absl::UnavailableError("not read yet");
  for (;;) {
    if (StopRequested()) return StoppedWhileStarting();
    bool read = !watcher.ok() || absl::Now() >= next_read;
    {
      absl::MutexLock lock(&watch_mu);
      read = read || changed;
      changed = false;
    }
    if (read) {
      if (unlisted()) return false;
      PS_RETURN_IF_ERROR(slot_leaves(/*rebalance=*/true));
      primary = etcd_->Get(key);
      next_read = absl::Now() + absl::Seconds(1);
    }
    if (!listed_once && absl::Now() >= next_join_check) {
      if (absl::Status joining = CheckJoin(*join_stub); absl::IsFailedPrecondition(joining)) {
        Log(absl::StrCat("standby: ", joining.message(), "; copying a shard anew"),
            log::Level::kWarning);
        return false;
      }
      next_join_check = absl::Now() + kJoinCheckPeriod;
    }
    if (absl::IsNotFound(primary.status())) {
      PS_ASSIGN_OR_RETURN(bool took_over, take_over());
      if (took_over) return true;
      if (recopy) return false;
      next_read = absl::InfinitePast();
    } else if (listed_once && primary.ok() && probe.Refuses(*primary)) {
      // A departed shard's primary exits after its linger: not a failure.
      PS_RETURN_IF_ERROR(slot_leaves(/*rebalance=*/false));
      // (A standby still joining holds no promise: it does not act on a
      // refusal; it copies again once the shard is served by another.)
      // Its /ps/<i> as read (same revision) goes, then the usual takeover.
      // Should the primary be alive after all, it is fenced: this standby
      // refuses its writes from the new epoch on, and it cannot drop it.
      Log(absl::StrCat("standby: the primary of shard ", index_, " at ", probe.address(),
                       " refuses connections (its process is gone): taking over now, "
                       "without waiting for its lease"));
      absl::StatusOr<TxnResult> removed = etcd_->Txn(
          {Compare::ModRevisionEquals(key, primary->mod_revision)}, {TxnOp::Delete(key)}, {});
      if (removed.ok()) {
        PS_ASSIGN_OR_RETURN(bool took_over, take_over());
        if (took_over) return true;
      }
      next_read = absl::InfinitePast();
    }
    PauseUnlessStopped(absl::Milliseconds(20));
  }
}

absl::Status Server::AttachTo(uint32_t shard, const std::string& primary) {
  PS_ASSIGN_OR_RETURN(etcd_keys::ServerEntry entry, etcd_keys::ParseServerValue(primary));
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(static_cast<int>(options_.max_standby_copy_bytes));
  auto stub = v1::ParameterServer::NewStub(PeerChannel(entry.address, peer_, arguments));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(2)));
  AddPeerMetadata(peer_, &context);
  context.AddMetadata(std::string(kInstanceMetadataKey), entry.instance_id);
  v1::AttachStandbyRequest request;
  request.set_shard(shard);
  request.set_instance_id(instance_id_);
  request.set_address(address_);
  // The state this standby holds from an earlier attach (dropped, or let
  // go): the primary may send only the writes after it.
  const std::optional<BackupReplication::Held> held = backup_replication_->held();
  if (held.has_value() && held->shard == shard) {
    request.set_have_epoch(held->term);
    request.set_have_lsn(held->lsn);
  }
  v1::AttachStandbyResponse response;
  if (absl::Status copied = FromGrpcStatus(stub->AttachStandby(&context, request, &response));
      !copied.ok()) {
    if (absl::IsResourceExhausted(copied)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the copy of shard ", shard, " from its primary ", entry.address,
          " is larger than --max_standby_copy_bytes=", options_.max_standby_copy_bytes,
          " (", copied.message(), "); nothing loaded"));
    }
    return copied;
  }
  if (response.catch_up()) {
    if (!held.has_value() || held->shard != shard || response.last_lsn() != held->lsn) {
      backup_replication_->Forget();  // the next attach copies
      return absl::FailedPreconditionError(absl::StrCat(
          "the primary of shard ", shard, " at ", entry.address, " answered a catch-up from LSN ",
          response.last_lsn(), ", not the state this standby holds; attaching again with a copy"));
    }
    backup_replication_->Attached(shard, response.epoch(), response.last_lsn());
    copied_from_instance_ = entry.instance_id;
    copied_from_address_ = entry.address;
    if (options_.process_slots != nullptr) options_.process_slots->Attached(instance_id_, shard);
    index_ = shard;
    Log(absl::StrCat("standby: rejoined shard ", shard, " from its own LSN ", held->lsn, " (term ",
                     held->term, "): its primary ", entry.address, " (instance ",
                     entry.instance_id, ") sends only the writes after it, no copy; epoch ",
                     response.epoch()));
    return absl::OkStatus();
  }
  // A copy replaces the state held (a failed load leaves it unknown).
  backup_replication_->Forget();
  PS_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadSnapshotFiles(response.files()));
  if (loaded.info.shard != shard) {
    return absl::DataLossError(absl::StrCat("the copy of shard ", shard, " from ", entry.address,
                                            " is of shard ", loaded.info.shard));
  }
  PS_RETURN_IF_ERROR(Restore(loaded, /*replace=*/true));
  backup_replication_->Attached(shard, response.epoch(), response.last_lsn());
  copied_from_instance_ = entry.instance_id;
  copied_from_address_ = entry.address;
  if (options_.process_slots != nullptr) options_.process_slots->Attached(instance_id_, shard);
  index_ = shard;  // named in the log from now on
  Log(absl::StrCat("standby: copied shard ", shard, " from its primary ", entry.address,
                   " (instance ", entry.instance_id, ") at LSN ", response.last_lsn(),
                   ", epoch ", response.epoch(), "; applying its writes, serving no client "
                   "until it is gone"));
  return absl::OkStatus();
}

absl::Status Server::CheckJoin(v1::ParameterServer::Stub& stub) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  AddPeerMetadata(peer_, &context);
  context.AddMetadata(std::string(kInstanceMetadataKey), copied_from_instance_);
  v1::AttachStandbyRequest request;
  request.set_shard(index_);
  request.set_instance_id(instance_id_);
  request.set_address(address_);
  request.set_check_join(true);
  v1::AttachStandbyResponse response;
  return FromGrpcStatus(stub.AttachStandby(&context, request, &response));
}

uint32_t Server::ShardCount(uint32_t fallback) const {
  absl::StatusOr<std::optional<v1::Placement>> placement =
      ReadPlacement(*etcd_, absl::Now() + absl::Seconds(5));
  if (!placement.ok() || !placement->has_value()) return fallback;
  const v1::Placement& now = **placement;
  return now.moving() ? std::max(now.num_servers(), now.from_num_servers()) : now.num_servers();
}

std::string Server::Departed(uint32_t shard) const {
  absl::StatusOr<std::optional<v1::Placement>> placement =
      ReadPlacement(*etcd_, absl::Now() + absl::Seconds(5));
  if (!placement.ok() || !placement->has_value()) return "";
  const v1::Placement& now = **placement;
  if (now.moving() || now.num_servers() > shard) return "";
  return absl::StrCat("placement version ", now.version(), " has ", now.num_servers(),
                      " servers: shard ", shard, " departed in a live move (its blocks were "
                      "handed over), nothing to take over");
}

void Server::LeaveShardConfig() {
  const std::string key = etcd_keys::ShardKey(index_);
  absl::StatusOr<KeyValue> current = etcd_->Get(key);
  if (!current.ok()) return;
  absl::StatusOr<v1::ShardConfig> config = ParseShardConfig(index_, current->value);
  if (!config.ok()) return;
  // Not listed (still joining): nothing to do.
  absl::StatusOr<ShardClaim> next =
      NextWithoutReplica(index_, *current, config->holder(), instance_id_);
  if (!next.ok()) return;
  absl::StatusOr<TxnResult> written = etcd_->Txn({next->unchanged}, {next->put}, {});
  if (written.ok() && written->succeeded) {
    Log(absl::StrCat("left etcd ", key, " (epoch ", next->config.epoch(), ")"));
  }
}

int Server::LiveBackups(uint32_t shard) const {
  absl::StatusOr<std::vector<KeyValue>> standbys =
      etcd_->GetPrefix(etcd_keys::StandbyPrefix(shard));
  return standbys.ok() ? static_cast<int>(standbys->size()) : -1;
}

std::string Server::ReasonToRebalance(int position, absl::Time* over_since) {
  const int wanted = options_.process_slots->backups_wanted();
  const int mine = LiveBackups(index_);
  std::optional<uint32_t> to;
  if (mine > wanted) {
    std::vector<ShardBackups> shards;
    const uint32_t count = ShardCount(num_servers_);
    for (uint32_t i = 0; i < count; ++i) {
      if (i == index_) continue;
      ShardBackups view;
      view.shard = i;
      view.live = LiveBackups(i);
      absl::StatusOr<KeyValue> primary = etcd_->Get(etcd_keys::ServerKey(i));
      absl::StatusOr<KeyValue> shard = etcd_->Get(etcd_keys::ShardKey(i));
      if (view.live < 0 || !primary.ok() || !shard.ok()) continue;
      absl::StatusOr<v1::ShardConfig> config = ParseShardConfig(i, shard->value);
      view.eligible = config.ok() && !options_.process_slots->Ours(i, config->holder(),
                                                                   config->replicas(),
                                                                   instance_id_);
      shards.push_back(view);
    }
    to = ShardToRebalanceTo(index_, mine, wanted, shards);
  }
  if (!to.has_value()) {
    *over_since = absl::InfiniteFuture();
    return "";
  }
  const absl::Time now = absl::Now();
  if (*over_since == absl::InfiniteFuture()) *over_since = now;
  // The first listed backup leaves at once; the next only if the shard is
  // still over after its stagger (the first may not back `to` up: its
  // process holds it).
  if (now - *over_since < kLeaveStagger * position) return "";
  return absl::StrCat("shard ", index_, " has ", mine, " live backups, more than the ", wanted,
                      " wanted, and shard ", *to, " has fewer: backing that one up instead");
}

absl::StatusOr<bool> Server::TakeOver(uint32_t shard) {
  const std::string key = etcd_keys::ShardKey(shard);
  PS_ASSIGN_OR_RETURN(KeyValue current, etcd_->Get(key));
  // The other backups leave the set: one of them may hold a write the old
  // primary shipped to it and not here (never acknowledged), which this
  // server's log would number differently. They copy this state anew.
  absl::StatusOr<ShardClaim> next = NextTakeover(shard, current, instance_id_, address_,
                                                 /*drop_other_backups=*/true);
  if (!next.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("standby of shard ", shard, " cannot take over: ", next.status().message(),
                     " (its primary dropped it, or another backup took over)"));
  }
  // The old primary's writes are refused from now on (it is stale).
  backup_replication_->SetEpoch(next->config.epoch());
  ClaimGuard guard;
  guard.compares.push_back(next->unchanged);
  guard.ops.push_back(next->put);
  guard.current_reclaim_compares = ReclaimGuard(shard);
  PS_ASSIGN_OR_RETURN(bool claimed, registration_->Claim(etcd_keys::ServerKey(shard), guard));
  if (!claimed) return false;
  config_.Set(next->config.epoch(), next->value);
  standby_key_->Release();
  Log(absl::StrCat("took over shard ", shard, " at epoch ", next->config.epoch(), ", LSN ",
                   backup_replication_->applied_lsn(), " (its primary's /ps/", shard,
                   " is gone); serving"));
  return true;
}

std::function<std::vector<Compare>()> Server::ReclaimGuard(uint32_t shard) {
  // /shards/<i> as this server last wrote it (config_, which a standby's
  // attach and a backup's drop change): compared with a fixed value, a
  // primary that lost its lease after either could never re-register.
  return [this, key = etcd_keys::ShardKey(shard)] {
    return std::vector<Compare>{Compare::ValueEquals(key, config_.value())};
  };
}

void Server::PauseUnlessStopped(absl::Duration pause) const {
  if (options_.stop == nullptr) {
    absl::SleepFor(pause);
  } else {
    options_.stop->WaitForNotificationWithTimeout(pause);
  }
}

int Server::registrations() const {
  return registration_ == nullptr ? 0 : registration_->registrations();
}

int Server::leases_lost() const {
  return registration_ == nullptr ? 0 : registration_->leases_lost();
}

bool Server::stepped_down() const { return fence_ != nullptr && fence_->stepped_down(); }

int64_t Server::lease() const { return registration_ == nullptr ? 0 : registration_->lease(); }

absl::StatusOr<std::vector<v1::WorkerInfo>> Server::ListWorkers() {
  PS_ASSIGN_OR_RETURN(std::vector<KeyValue> kvs, etcd_->GetPrefix(etcd_keys::WorkersPrefix()));
  std::vector<v1::WorkerInfo> workers;
  for (const KeyValue& kv : kvs) {
    v1::WorkerInfo info;
    if (!FromJson(kv.value, &info).ok()) info.Clear();
    if (info.id().empty()) {
      absl::StatusOr<etcd_keys::ParsedKey> key = etcd_keys::Parse(kv.key);
      if (key.ok()) info.set_id(key->worker_id);
    }
    workers.push_back(std::move(info));
  }
  return workers;
}

// ---- fencing (docs/replication.md) ----------------------------------------------------

uint64_t Server::EpochOnDisk(uint32_t shard) const {
  if (options_.checkpoint_dir.empty()) return 0;
  absl::StatusOr<std::vector<CheckpointEntry>> held =
      ListCheckpointsInLoadOrder(ShardDir(shard));
  return held.ok() && !held->empty() ? held->back().epoch : 0;
}

void Server::RecheckFenceSoon() {
  absl::MutexLock lock(&loop_mu_);
  fence_recheck_ = true;
}

void Server::FenceLoop() {
  // Also without a refused write, an unconfirmed server asks etcd every
  // half TTL, so that one whose shard moved on steps down and says so.
  const absl::Duration period = std::max(options_.lease_ttl / 2, absl::Milliseconds(100));
  auto woken = [this]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_mu_) { return stopping_ || fence_recheck_; };
  while (true) {
    {
      absl::MutexLock lock(&loop_mu_);
      loop_mu_.AwaitWithTimeout(absl::Condition(&woken), period);
      if (stopping_) return;
      fence_recheck_ = false;
    }
    if (fence_->stepped_down()) return;
    if (!fence_->Confirmed()) CheckShardEpoch();
    // At most one etcd read per 100 ms however many writes are refused.
    absl::MutexLock lock(&loop_mu_);
    if (loop_mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(100))) return;
  }
}

void Server::CheckShardEpoch() {
  const std::string key = etcd_keys::ShardKey(index_);
  absl::StatusOr<KeyValue> kv = etcd_->Get(key, absl::Now() + options_.lease_ttl);
  if (absl::IsNotFound(kv.status())) {
    StepDown(absl::StrCat("etcd ", key, " no longer exists (this server held epoch ", epoch(), ")"));
    return;
  }
  if (!kv.ok()) {
    // etcd unreachable: nothing is known; writes stay refused until a
    // renewal is granted.
    return;
  }
  absl::StatusOr<v1::ShardConfig> config = ParseShardConfig(index_, kv->value);
  if (!config.ok()) {
    StepDown(std::string(config.status().message()));
    return;
  }
  if (StillHolds(*config, instance_id_, epoch())) return;
  StepDown(absl::StrCat(
      "etcd ", key, " is at epoch ", config->epoch(), ", held by instance ", config->holder(),
      config->holder_address().empty() ? std::string()
                                       : absl::StrCat(" at ", config->holder_address()),
      "; this server (instance ", instance_id_, ") held epoch ", epoch(),
      " and its lease was not renewed in time"));
}

void Server::StepDown(const std::string& reason) {
  if (!fence_->StepDown(reason)) return;
  Log(absl::StrCat("stepping down: ", reason,
                   "; refusing every call but GetStats, publishing no checkpoint and saving "
                   "none at shutdown; ",
                   RejoinsAfterSteppingDown(options_)
                       ? "pserver replaces it with a fresh standby, which copies a shard again"
                       : "stop this process (a restarted server claims a free index)"),
      log::Level::kWarning);
  // Stops trying to retake /ps/<i> and gives the lease up.
  if (registration_ != nullptr) registration_->Release();
}

// ---- checkpoints ---------------------------------------------------------------------

std::string Server::ShardDir() const { return ShardDir(index_); }

std::string Server::ShardDir(uint32_t shard) const {
  return absl::StrCat(options_.checkpoint_dir, "/shard-", shard);
}

absl::Status Server::CheckBelongsHere(const CheckpointInfo& info) const {
  if (info.shard != index_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", info.path, " belongs to shard ", info.shard, ", not to shard ", index_));
  }
  if (!info.cluster.empty() && info.cluster != options_.cluster) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", info.path, " belongs to cluster '", info.cluster,
                     "', this server is in cluster '", options_.cluster,
                     "' (give this job its own --checkpoint_dir, or its old --cluster)"));
  }
  if (!MapsLike(info.placement, CurrentPlacement())) {
    return PlacementMismatch(info, CurrentPlacement());
  }
  return absl::OkStatus();
}

v1::Placement Server::CurrentPlacement() const {
  v1::Placement placement;
  placement.set_kind(v1::Placement::JUMP);
  placement.set_num_servers(num_servers_);
  placement.set_version(placement_version_);
  // After a live move: the stable placement it ended with.
  if (placement_gate_ != nullptr) {
    const v1::Placement now = placement_gate_->spec();
    if (!now.moving() && now.version() > placement_version_) {
      placement.set_num_servers(now.num_servers());
      placement.set_version(now.version());
    }
  }
  return placement;
}

CheckpointWriteOptions Server::WriteOptions() const {
  CheckpointWriteOptions write_options;
  write_options.file_mode = options_.checkpoint_file_mode;
  write_options.cluster = options_.cluster;
  write_options.epoch = epoch();
  write_options.placement = CurrentPlacement();
  write_options.num_servers = write_options.placement.num_servers();
  return write_options;
}

absl::Status Server::CheckNoShardBeyondTheCount() const {
  if (num_servers_ == 0) return absl::OkStatus();
  absl::StatusOr<std::map<uint32_t, std::vector<CheckpointEntry>>> shards =
      ListShardCheckpoints(options_.checkpoint_dir);
  if (!shards.ok()) return absl::OkStatus();  // nothing there yet
  for (const auto& [shard, held] : *shards) {
    if (shard < num_servers_) continue;
    // A damaged manifest is the loader's business (it falls back).
    absl::StatusOr<std::unique_ptr<CheckpointReader>> newest =
        CheckpointReader::Open(held.back().path);
    if (!newest.ok() || !MapsLike((*newest)->info().placement, CurrentPlacement())) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint directory ", options_.checkpoint_dir, " holds checkpoints of shard ", shard,
        " (", held.back().path, "), written by a cluster of at least ", shard + 1,
        " servers that did not record its count; this cluster has ", num_servers_,
        ": start as many servers as wrote them, with --num_servers, to record it"));
  }
  return absl::OkStatus();
}

std::vector<std::string> Server::NewestOfAnotherPlacement() const {
  absl::StatusOr<std::vector<CheckpointEntry>> held = ListCheckpoints(ShardDir());
  if (!held.ok()) return {};
  for (auto it = held->rbegin(); it != held->rend(); ++it) {
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(it->path);
    if (reader.ok() && !MapsLike((*reader)->info().placement, CurrentPlacement())) {
      return {it->path};
    }
  }
  return {};
}

absl::StatusOr<std::optional<LoadedCheckpoint>> Server::ReshardAtStart() {
  PS_ASSIGN_OR_RETURN(
      std::optional<v1::Placement> from,
      PlacementToReshardFrom(options_.checkpoint_dir, index_, CurrentPlacement()));
  if (!from.has_value()) return std::nullopt;
  ReshardOptions reshard;
  reshard.from_placement = *from;
  reshard.file_mode = options_.checkpoint_file_mode;
  // Without a known count (no etcd, no --num_servers) the count stays: the
  // manifests', or when they record none, as many as there are shards.
  reshard.num_servers = num_servers_ != 0 ? num_servers_ : from->num_servers();
  if (reshard.num_servers == 0) {
    PS_ASSIGN_OR_RETURN(auto shards, ListShardCheckpoints(options_.checkpoint_dir));
    if (!shards.empty()) reshard.num_servers = shards.rbegin()->first + 1;
  }
  absl::StatusOr<ReshardedShard> resharded =
      ReshardShard(options_.checkpoint_dir, index_, reshard);
  if (!resharded.ok()) {
    return absl::Status(resharded.status().code(),
                        absl::StrCat("resharding the checkpoints in ", options_.checkpoint_dir,
                                     " (placement ", from->ShortDebugString(), ") for shard ",
                                     index_, " of ", reshard.num_servers, ": ",
                                     resharded.status().message()));
  }
  if (!resharded->result.cluster.empty() && resharded->result.cluster != options_.cluster) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoints in ", options_.checkpoint_dir, " belong to cluster '",
        resharded->result.cluster, "', this server is in cluster '", options_.cluster,
        "' (give this job its own --checkpoint_dir, or its old --cluster)"));
  }
  for (const std::string& note : resharded->result.notes) {
    load_messages_.push_back(absl::StrCat("reshard: ", note));
  }
  // Written at once as this shard's checkpoint of the new placement, so a
  // restart loads it rather than resharding again.
  CheckpointWriteOptions write_options = WriteOptions();
  write_options.num_servers = reshard.num_servers;
  write_options.placement.set_num_servers(reshard.num_servers);
  LoadedCheckpoint loaded;
  PS_ASSIGN_OR_RETURN(loaded.info, SaveCheckpoint(resharded->snapshot, ShardDir(), index_,
                                                  resharded->result.sequence, write_options));
  load_messages_.push_back(absl::StrCat(
      "resharded ", resharded->result.from_servers, " servers' checkpoints (",
      absl::StrJoin(resharded->result.inputs, ", "), ") for shard ", index_, " of ",
      reshard.num_servers, ": ", resharded->result.blocks, " blocks, ",
      resharded->result.table_rows, " table rows, ", resharded->result.bytes, " bytes, saved as ",
      loaded.info.path));
  loaded.snapshot = std::move(resharded->snapshot);
  return loaded;
}

std::optional<LoadedCheckpoint> Server::LoadPublished(uint64_t* published_sequence) {
  const std::string dir = ShardDir();
  absl::StatusOr<KeyValue> kv = etcd_->Get(CheckpointKey(index_));
  if (absl::IsNotFound(kv.status())) return std::nullopt;
  if (!kv.ok()) {
    load_messages_.push_back(absl::StrCat("cannot read ", CheckpointKey(index_),
                                          " from etcd: ", kv.status().ToString(),
                                          "; using the newest good checkpoint in ", dir));
    return std::nullopt;
  }
  v1::CheckpointRecord record;
  auto ignored = [&](absl::string_view why) {
    load_messages_.push_back(absl::StrCat("ignored etcd ", CheckpointKey(index_), " (",
                                          record.path().empty() ? "no path" : record.path(), "): ",
                                          why, "; using the newest good checkpoint in ", dir));
    return std::nullopt;
  };
  if (absl::Status parsed = FromJson(kv->value, &record); !parsed.ok()) {
    return ignored(absl::StrCat("not a CheckpointRecord: ", parsed.message()));
  }
  if (record.path().empty()) return ignored("it names no checkpoint");
  if (record.shard() != index_) {
    return ignored(absl::StrCat("it is for shard ", record.shard(), ", not ", index_));
  }
  if (!record.cluster().empty() && record.cluster() != options_.cluster) {
    return ignored(
        absl::StrCat("it is for cluster '", record.cluster(), "', not '", options_.cluster, "'"));
  }
  // Only a checkpoint directory right inside our own shard directory, with
  // every link resolved: etcd may name any path.
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path own = fs::weakly_canonical(dir, ec);
  const fs::path named = ec ? fs::path() : fs::weakly_canonical(record.path(), ec);
  struct stat st;
  if (ec || named.parent_path() != own ||
      named.filename() != CheckpointDirName(record.sequence()) ||
      ::lstat(record.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return ignored(absl::StrCat("it is not the directory ", CheckpointDirName(record.sequence()),
                                " of this server's own ", dir));
  }
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(record.path());
  if (!loaded.ok()) {
    *published_sequence = record.sequence();
    return ignored(absl::StrCat("it failed: ", loaded.status().message()));
  }
  if (record.epoch() != 0 && loaded->info.epoch != record.epoch()) {
    return ignored(absl::StrCat("its manifest has epoch ", loaded->info.epoch, ", the record says ",
                                record.epoch()));
  }
  if (loaded->info.manifest_crc32c != record.manifest_crc32c() ||
      loaded->info.sequence != record.sequence()) {
    return ignored(absl::StrFormat(
        "its manifest has sequence %d and crc32c 0x%08x, the record says %d and 0x%08x",
        loaded->info.sequence, loaded->info.manifest_crc32c, record.sequence(),
        record.manifest_crc32c()));
  }
  if (absl::Status mine = CheckBelongsHere(loaded->info); !mine.ok()) {
    return ignored(mine.message());
  }
  *published_sequence = record.sequence();
  return *std::move(loaded);
}

absl::Status Server::LoadShard() {
  const std::string dir = ShardDir();
  // An unusable directory is found now, not at the first save.
  PS_RETURN_IF_ERROR(CheckWritableDirectory(dir, options_.checkpoint_file_mode));
  if (options_.placement_redirects && etcd_ != nullptr) {
    absl::StatusOr<std::optional<v1::Placement>> placement = ReadPlacement(*etcd_);
    if (placement.ok() && placement->has_value() && JoinsMove(**placement, index_)) {
      // Its blocks come from their old owners; what shard-<index> holds is
      // of an older generation.
      Log(absl::StrCat("index ", index_, " joins the move of placement version ",
                       (*placement)->version(), ": starting empty, not from ", dir));
      SetNextSequence(NewestSequenceOfAnyShard(options_.checkpoint_dir));
      return absl::OkStatus();
    }
  }
  uint64_t published_sequence = 0;
  absl::StatusOr<std::optional<LoadedCheckpoint>> resharded = ReshardAtStart();
  if (!resharded.ok()) {
    for (const std::string& m : load_messages_) Log(m);
    return resharded.status();
  }
  std::optional<LoadedCheckpoint> loaded = *std::move(resharded);
  if (!loaded.has_value()) PS_RETURN_IF_ERROR(CheckNoShardBeyondTheCount());
  if (!loaded.has_value() && etcd_ != nullptr) loaded = LoadPublished(&published_sequence);
  if (!loaded.has_value()) {
    absl::StatusOr<LoadedCheckpoint> latest = LoadLatestCheckpoint(dir);
    if (latest.ok()) {
      for (const SkippedCheckpoint& skipped : latest->skipped) {
        load_messages_.push_back(
            absl::StrCat("skipped ", skipped.path, ": ", skipped.status.message()));
      }
      loaded = *std::move(latest);
    } else if (absl::IsNotFound(latest.status())) {
      load_messages_.push_back(absl::StrCat("no checkpoint in ", dir, ": starting empty"));
    } else {
      for (const std::string& m : load_messages_) Log(m);
      return latest.status();
    }
  }
  if (loaded.has_value()) {
    // Our own directory holding another shard's, cluster's or cluster
    // size's checkpoint: refuse rather than serve what is not ours.
    if (absl::Status mine = CheckBelongsHere(loaded->info); !mine.ok()) {
      for (const std::string& m : load_messages_) Log(m);
      return mine;
    }
    PS_RETURN_IF_ERROR(Restore(*loaded));
    load_messages_.push_back(absl::StrCat("loaded checkpoint ", loaded->info.path, " (sequence ",
                                          loaded->info.sequence, ")"));
    loaded_ = loaded->info;
    dispatcher_->SetCheckpointSequence(loaded->info.sequence);
  }
  for (const std::string& m : load_messages_) Log(m);
  SetNextSequence(std::max<uint64_t>(published_sequence, loaded_ ? loaded_->sequence : 0));
  return absl::OkStatus();
}

void Server::SetNextSequence(uint64_t at_least) {
  // New checkpoints get numbers above every one there is.
  uint64_t next = at_least + 1;
  absl::StatusOr<std::vector<CheckpointEntry>> listed = ListCheckpoints(ShardDir());
  if (listed.ok() && !listed->empty()) next = std::max(next, listed->back().sequence + 1);
  absl::MutexLock lock(&save_mu_);
  next_sequence_ = next;
}

absl::Status Server::Restore(LoadedCheckpoint& loaded, bool replace) {
  auto ext = loaded.snapshot.extensions.find(AppliedSequences::kExtensionName);
  if (ext != loaded.snapshot.extensions.end()) {
    PS_RETURN_IF_ERROR(dispatcher_->applied().Restore(ext->second));
  }
  PS_RETURN_IF_ERROR(tables_.RestoreFrom(loaded.snapshot.extensions, replace));
  return store_.Restore(std::move(loaded.snapshot), replace);
}

void Server::AfterLiveMove(StoreSnapshot* snapshot) {
  const uint64_t version = placement_gate_->version();
  if (version == placement_version_) return;  // no move since this server started
  const size_t dropped = KeepOwnedBlocks(*placement_gate_, snapshot);
  if (version != sequence_placement_version_) {
    // The first checkpoint of the new placement: above every shard's, so
    // that a restart takes this generation, not the one before the move.
    next_sequence_ =
        std::max(next_sequence_, NewestSequenceOfAnyShard(options_.checkpoint_dir) + 1);
    sequence_placement_version_ = version;
    Log(absl::StrCat("placement version ", version, ": checkpoints from sequence ",
                     next_sequence_, " on hold this server's blocks and table keys only (", dropped,
                     " handed over left out)"));
  }
}

absl::StatusOr<CheckpointInfo> Server::Save() {
  if (options_.checkpoint_dir.empty()) {
    return absl::FailedPreconditionError("this server has no checkpoint directory");
  }
  if (!loaded_ok_) return absl::FailedPreconditionError("the server has not started serving");
  if (fence_ != nullptr) {
    // Unconfirmed: ask etcd first, so that a server that lost its shard
    // writes nothing into a directory its successor may share.
    if (!fence_->Confirmed()) CheckShardEpoch();
    PS_RETURN_IF_ERROR(fence_->CheckServing());
  }
  if (placement_gate_ != nullptr) {
    if (departed_.load()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "server ", index_, " departed in a live move: its blocks live on the other servers, "
          "a checkpoint of it would be loaded as a shard of the cluster"));
    }
    PS_RETURN_IF_ERROR(CheckNoMoveUnderWay(*placement_gate_));
  }
  absl::MutexLock save_lock(&save_mu_);
  CheckpointTimer timer(&checkpoint_metrics_);  // a failure unless it succeeds
  // After a live move: only the table keys this server owns now (its
  // dense blocks are chosen below, AfterLiveMove).
  Tables::KeyKeep owned_keys;
  if (placement_gate_ != nullptr && placement_gate_->version() != placement_version_) {
    owned_keys = OwnedKeys(*placement_gate_);
  }
  PS_ASSIGN_OR_RETURN(StoreSnapshot snapshot, dispatcher_->Snapshot(owned_keys));
  if (placement_gate_ != nullptr) {
    // A move that began while the snapshot was taken: it may hold blocks
    // being handed over.
    PS_RETURN_IF_ERROR(CheckNoMoveUnderWay(*placement_gate_));
    AfterLiveMove(&snapshot);
  }
  const uint64_t sequence = next_sequence_++;
  PS_ASSIGN_OR_RETURN(CheckpointInfo info,
                      SaveCheckpoint(snapshot, ShardDir(), index_, sequence, WriteOptions()));
  // Published only now that it is durable; pruned only after that.
  // Published only while /shards/<i> still holds this server's epoch.
  if (etcd_ != nullptr) {
    PS_ASSIGN_OR_RETURN(std::string json, ToJson(RecordOf(info, address_)));
    const std::string key = etcd_keys::ShardKey(index_);
    auto publish = [&](const std::string& expected) {
      return etcd_->Txn({Compare::ValueEquals(key, expected)},
                        {TxnOp::Put(CheckpointKey(index_), json)});
    };
    absl::StatusOr<TxnResult> published = publish(config_.value());
    // This server's own change of backups (a standby listed, a backup
    // dropped) writes /shards/<i> a moment before config_ follows: a
    // publish read between the two is refused though no other server
    // claimed the shard. While etcd still names this server as holder
    // (StillHolds), the publish is made against what etcd holds (a few
    // times at most).
    for (int attempt = 0; attempt < 3 && published.ok() && !published->succeeded; ++attempt) {
      absl::StatusOr<KeyValue> current = etcd_->Get(key);
      if (!current.ok()) break;
      absl::StatusOr<v1::ShardConfig> config = ParseShardConfig(index_, current->value);
      if (!config.ok() || !StillHolds(*config, instance_id_, epoch())) break;
      published = publish(current->value);
    }
    if (!published.ok()) {
      return absl::Status(
          published.status().code(),
          absl::StrCat("checkpoint ", info.path,
                       " is durable but publishing it failed: ", published.status().message()));
    }
    if (!published->succeeded) {
      std::error_code ec;
      std::filesystem::remove_all(info.path, ec);
      const std::string why =
          absl::StrCat("publishing checkpoint ", info.path, " was refused: etcd ",
                       etcd_keys::ShardKey(index_), " no longer holds this server's epoch ", epoch(),
                       " (another server claimed shard ", index_, ")");
      Log(absl::StrCat(why, "; deleted it",
                       ec ? absl::StrCat(" (failed: ", ec.message(), ")") : std::string()));
      StepDown(why);
      return fence_->CheckServing();
    }
  }
  absl::StatusOr<std::vector<std::string>> pruned =
      PruneCheckpoints(ShardDir(), options_.checkpoint_keep, NewestOfAnotherPlacement());
  if (!pruned.ok()) Log(absl::StrCat("pruning old checkpoints: ", pruned.status().ToString()));
  dispatcher_->SetCheckpointSequence(sequence);
  timer.Succeeded();
  return info;
}

void Server::CheckpointLoop() {
  absl::Time started = absl::Now();
  while (true) {
    const absl::Time next = NextPeriodicSave(started, options_.checkpoint_interval, absl::Now());
    {
      absl::MutexLock lock(&loop_mu_);
      if (loop_mu_.AwaitWithDeadline(absl::Condition(&stopping_), next)) return;
    }
    started = absl::Now();
    absl::StatusOr<CheckpointInfo> saved = Save();
    if (stepped_down()) return;  // said so once, when it stepped down
    if (!saved.ok()) {
      Log(absl::StrCat("periodic checkpoint failed: ", saved.status().ToString()),
          log::Level::kWarning);
    }
    const absl::Time finished = absl::Now();
    if (SaveOverran(started, finished, options_.checkpoint_interval)) {
      Log(absl::StrCat("checkpoint took ", absl::FormatDuration(finished - started),
                       ", longer than --checkpoint_interval=",
                       absl::FormatDuration(options_.checkpoint_interval),
                       ": the next one starts at once"));
    }
  }
}

void Server::SweepLoop() {
  while (true) {
    {
      absl::MutexLock lock(&loop_mu_);
      if (loop_mu_.AwaitWithTimeout(absl::Condition(&stopping_), kSweepInterval)) return;
    }
    tables_.EvictExpired();
    UpdateHealth();  // a lost etcd lease shows within kSweepInterval
  }
}

void Server::Shutdown(absl::Duration grace) {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  draining_ = true;
  UpdateHealth();  // NOT_SERVING while draining
  {
    absl::MutexLock loop_lock(&loop_mu_);
    stopping_ = true;
  }
  if (checkpoint_thread_.joinable()) checkpoint_thread_.join();
  if (fence_thread_.joinable()) fence_thread_.join();
  if (registration_ != nullptr) registration_->StopReregistering();
  if (sweep_thread_.joinable()) sweep_thread_.join();
  UpdateHealth();  // after the sweep's last update, which may have raced the one above
  // Calls waiting on clocks or collectives would hold the shutdown for the
  // whole grace: they fail with UNAVAILABLE now, which clients retry.
  tables_.Shutdown();
  if (listener_ != nullptr) listener_->Stop();
  // Waits for the frames being served: the last checkpoint has their pushes.
  if (bulk_listener_ != nullptr) bulk_listener_->Stop();
  if (grpc_server_ != nullptr) {
    grpc_server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
    grpc_server_->Wait();
  }
  // Every call has finished: the last checkpoint has every applied push.
  if (fence_ != nullptr && fence_->stepped_down() && !options_.checkpoint_dir.empty() &&
      options_.checkpoint_on_shutdown) {
    // Its state is not the shard's any more: saving it could only lose the
    // successor's updates.
    final_save_status_ = absl::FailedPreconditionError(
        absl::StrCat(fence_->step_down_message(), ": no final checkpoint"));
    Log(absl::StrCat("stepped down: no final checkpoint (", fence_->step_down_message(), ")"));
  } else if (departed_.load() && !options_.checkpoint_dir.empty() &&
             options_.checkpoint_on_shutdown) {
    // Its blocks live on the other servers now; a checkpoint of it would be
    // loaded as a shard of the cluster.
    Log("departed in a live move: no final checkpoint");
  } else if (loaded_ok_ && !options_.checkpoint_dir.empty() && options_.checkpoint_on_shutdown) {
    absl::StatusOr<CheckpointInfo> saved = Save();
    Log(saved.ok() ? absl::StrCat("saved checkpoint ", saved->path)
                   : absl::StrCat("final checkpoint failed: ", saved.status().ToString()),
        saved.ok() ? log::Level::kInfo : log::Level::kError);
    final_save_status_ = saved.status();
  }
  // Frees the index at once for a replacement.
  if (registration_ != nullptr) registration_->Release();
  if (metrics_http_ != nullptr) metrics_http_->Stop();
  if (trace_ != nullptr) {
    const absl::Status written = trace_->Flush();
    Log(written.ok() ? absl::StrCat("wrote trace ", trace_->path(), " (", trace_->recorded() - trace_->dropped(), " events, ", trace_->dropped(), " dropped)")
                     : written.ToString(),
        written.ok() ? log::Level::kInfo : log::Level::kError);
  }
}

// ---- health and metrics -------------------------------------------------------------

EtcdSessionState Server::EtcdState() const {
  EtcdSessionState state;
  // registration_ is set while starting, before loaded_ok_: read it only after.
  if (!loaded_ok_ || registration_ == nullptr) return state;
  state.registrations = static_cast<uint64_t>(registration_->registrations());
  state.leases_lost = static_cast<uint64_t>(registration_->leases_lost());
  // Each lost lease is followed by one re-registration once etcd answers.
  state.registered = registration_->lease() != 0 && state.registrations > state.leases_lost;
  return state;
}

ReplicationState Server::Replication() const {
  ReplicationState state;
  state.standby = options_.standby;
  if (backup_replication_ != nullptr) state.applied_lsn = backup_replication_->applied_lsn();
  if (primary_replication_set_) {
    state.primary = true;
    state.backups = primary_replication_->backups().size();
    state.last_lsn = primary_replication_->last_lsn();
    state.dropped = primary_replication_->dropped();
    state.joined = primary_replication_->joined();
    state.caught_up = primary_replication_->caught_up_writes();
    state.sent_over_channel = primary_replication_->sent_over_channel();
    state.sent_over_grpc = primary_replication_->sent_over_grpc();
  }
  return state;
}

std::string Server::Degraded() const {
  if (!primary_replication_set_ || primary_replication_->dropped() == 0 ||
      !primary_replication_->backups().empty()) {
    return "";
  }
  return absl::StrCat("shard ", index_, " has no backup");
}

bool Server::Healthy() const {
  if (draining_ || !dispatcher_->CheckServing().ok()) return false;
  return options_.etcd_endpoints.empty() || EtcdState().registered;
}

void Server::UpdateHealth() {
  if (grpc_server_ == nullptr) return;
  grpc::HealthCheckServiceInterface* health = grpc_server_->GetHealthCheckService();
  if (health == nullptr) return;
  const bool healthy = Healthy();
  health->SetServingStatus("pserver.v1.ParameterServer", healthy);
  health->SetServingStatus(healthy);  // every service named so far, and ""
}

absl::Status Server::StartMetrics() {
  ServerMetricsSources sources;
  sources.dispatcher = dispatcher_.get();
  sources.tables = &tables_;
  sources.cluster = options_.cluster;
  sources.healthy = [this] { return Healthy(); };
  if (!options_.checkpoint_dir.empty()) sources.checkpoints = &checkpoint_metrics_;
  if (options_.accept_standbys || options_.standby) {
    sources.replication = [this] { return Replication(); };
  }
  if (!options_.etcd_endpoints.empty()) {
    sources.etcd = [this] { return EtcdState(); };
    sources.shard = [this] {
      ShardState shard;
      shard.epoch = epoch();
      if (Fence* fence = dispatcher_->fence(); fence != nullptr) {
        shard.fenced = true;
        shard.confirmed = fence->Confirmed();
        shard.stepped_down = fence->stepped_down();
      }
      return shard;
    };
  }
  AddServerCollectors(std::move(sources), &metrics_registry_);
  PS_ASSIGN_OR_RETURN(metrics_http_, metrics::MetricsHttpListener::Start(
                                         *options_.metrics_http, [this] {
                                           return metrics_registry_.Render();
                                         }));
  return absl::OkStatus();
}

absl::Status Server::final_save_status() const {
  absl::MutexLock lock(&shutdown_mu_);
  return final_save_status_;
}

absl::Status Server::StartPlacementGate() {
  if (etcd_ == nullptr) {
    return absl::InvalidArgumentError(
        "--placement_redirects needs --etcd (the placement lives there)");
  }
  if (options_.move_batch_bytes < kMinMoveBatchBytes ||
      options_.move_batch_bytes > options_.max_message_bytes / 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--move_batch_bytes must be in [", kMinMoveBatchBytes, ", --max_message_bytes / 2 = ",
        options_.max_message_bytes / 2, "], got ", options_.move_batch_bytes));
  }
  PS_ASSIGN_OR_RETURN(Placement placement, Placement::FromSpec(CurrentPlacement(), 1));
  placement_gate_ = std::make_unique<PlacementGate>(static_cast<int>(index_), placement);
  PlacementGate* gate = placement_gate_.get();
  BlockMoverOptions mover;
  mover.dispatcher = dispatcher_.get();
  mover.store = &store_;
  mover.tables = &tables_;
  mover.gate = gate;
  mover.address_of = [this](uint32_t index) -> absl::StatusOr<std::string> {
    PS_ASSIGN_OR_RETURN(KeyValue kv, etcd_->Get(etcd_keys::ServerKey(index)));
    PS_ASSIGN_OR_RETURN(etcd_keys::ServerEntry entry, etcd_keys::ParseServerValue(kv.value));
    return entry.address;
  };
  mover.peer = peer_;
  mover.write_options = WriteOptions();
  mover.batch_bytes = options_.move_batch_bytes;
  mover.replicated = [this] { return primary_replication_set_.load(std::memory_order_acquire); };
  mover.stall_after_batches = options_.testing_move_stall_after_batches;
  mover.stall = [this] {
    // Said on stdout, where tests read "listening on" too.
    std::printf("pserver %u: testing: live move stalled\n", index_);
    std::fflush(stdout);
    for (int i = 0; i < 6000 && !StopRequested(); ++i) PauseUnlessStopped(absl::Milliseconds(100));
  };
  mover.log = [this](const std::string& line) { Log(line); };
  block_mover_ = std::make_unique<BlockMover>(std::move(mover));
  block_mover_set_.store(true, std::memory_order_release);
  auto follow = [this, gate](absl::string_view value) {
    absl::StatusOr<v1::Placement> spec = ParsePlacementRecord(value);
    if (!spec.ok()) return;  // a malformed value: the last good one stays
    if (!gate->SetSpec(*spec).ok()) return;
    // A move that ended: what this server handed over leaves its memory.
    if (absl::Status dropped = block_mover_->DropHandedOver(); !dropped.ok()) {
      Log(absl::StrCat("dropping the blocks handed over failed: ", dropped.ToString()));
    }
    const v1::Placement now = gate->spec();
    if (!now.moving() && now.num_servers() <= index_ && !departed_.exchange(true)) {
      // Every block of this server was handed over before the coordinator
      // wrote this stable placement.
      Log(absl::StrCat("placement version ", now.version(), " has ", now.num_servers(),
                       " servers, this is index ", index_, ": departing"));
      if (options_.on_departed) options_.on_departed();
    }
  };
  PS_ASSIGN_OR_RETURN(
      placement_watcher_,
      etcd_->Watch(
          etcd_keys::PlacementKey(), /*start_revision=*/0, [follow](const WatchEvent& event) {
            if (event.type == WatchEvent::Type::kPut && event.kv.key == etcd_keys::PlacementKey()) {
              follow(event.kv.value);
            }
          }));
  // What changed before the watch started (older versions are ignored).
  absl::StatusOr<KeyValue> now = etcd_->Get(etcd_keys::PlacementKey());
  if (now.ok()) follow(now->value);
  // A standby that took its shard over mid-move: the marks its primary
  // shipped (cc/server/move.h, "Moves with replication").
  move_marks_.SeedGate(*gate, store_);
  dispatcher_->SetPlacementGate(gate);
  Log(absl::StrCat("placement redirects on: blocks checked against placement version ",
                   gate->version()));
  return absl::OkStatus();
}

Server::~Server() {
  Shutdown();
  if (options_.process_slots != nullptr) options_.process_slots->Remove(instance_id_);
}

}  // namespace pserver
