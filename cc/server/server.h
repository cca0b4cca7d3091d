// Server: one parameter server process's gRPC endpoint over a ParameterStore.
//
//   ServerOptions options;                  // 127.0.0.1, a free port
//   PS_ASSIGN_OR_RETURN(auto server, Server::Start(options));
//   std::cout << server->address();         // "127.0.0.1:40123"
//   server->Shutdown();                     // also done by the destructor
//
// Fault tolerance (docs/operations.md): with `checkpoint_dir` the server
// loads the newest good checkpoint of its shard before serving, saves on the
// Save RPC, every `checkpoint_interval` and on Shutdown. With
// `etcd_endpoints` it claims the lowest free index under a lease (instead of
// `index`), publishes its address at /ps/<idx> and each durable checkpoint at
// /checkpoints/<idx>, prefers that published checkpoint when loading, and
// re-registers if its lease is lost (etcd restarted). Until registered and
// loaded it answers UNAVAILABLE, which clients retry.
//
// Thread-safe: Shutdown and Save may be called from any thread, more than once.
#ifndef PSERVER_CC_SERVER_SERVER_H_
#define PSERVER_CC_SERVER_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "cc/core/checkpoint.h"
#include "cc/core/parameter_store.h"
#include "cc/core/tables.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/leased_key.h"
#include "cc/log/log.h"
#include "cc/metrics/http_listener.h"
#include "cc/metrics/metrics.h"
#include "cc/rpc/transport_limits.h"
#include "cc/security/tls.h"
#include "cc/server/applied_sequences.h"
#include "cc/server/peer_channel.h"
#include "cc/server/process_slots.h"
#include "cc/server/move.h"
#include "cc/server/replication.h"
#include "cc/server/server_metrics.h"
#include "cc/trace/trace.h"
#include "pserver/v1/registry.pb.h"

namespace grpc {
class Server;
}

namespace pserver {

class Dispatcher;
class ParameterServerService;
class Listener;
class BulkListener;
class EtcdClient;
class LeasedKey;
class Authorizer;
class Fence;
class PlacementGate;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;         // 0: the system picks a free port
  // --- the address others dial (cc/server/advertised_address.h) ---
  // What is published in etcd (/ps/<idx>), in checkpoint records and
  // address(); the bulk channel's TCP port is dialled on it too. Empty:
  // `host`, which must then not be unspecified (0.0.0.0 or ::): Start refuses
  // such a server, naming this option. An IPv6 host is written [addr]:port.
  std::string advertise_host;
  uint32_t index = 0;   // this server's shard index, reported in stats (without etcd)
  // Idle threads kept waiting for calls; 0: two per core, at least 4. More
  // start under load, up to max_threads.
  int num_threads = 0;

  // --- transport limits (docs/limits.md): what one peer may hold ---
  // The largest request after decompression; a bigger one is refused with
  // RESOURCE_EXHAUSTED before it is read. The default fits every request a
  // Client sends (cc/rpc/grpc_status.h).
  size_t max_message_bytes = kDefaultMaxMessageBytes;
  // Compressed requests are refused (UNIMPLEMENTED) unless allowed: a small
  // compressed message may inflate to far more memory than it took to send.
  bool allow_compressed_requests = false;
  // Hard cap on the threads gRPC runs synchronous calls on; a call that
  // finds none free fails RESOURCE_EXHAUSTED. 0: kDefaultMaxThreads.
  int max_threads = 0;
  // File descriptors kept free for etcd, checkpoint files and the calls
  // already served: a new connection that would leave fewer is closed at
  // once (the client retries). Connections are thus bounded by the
  // process's descriptor limit (ulimit -n) minus this.
  int reserve_fds = 32;
  // Concurrent calls on one connection; more wait in the client.
  int max_concurrent_streams = 256;
  // A connection with no call for this long is closed (GOAWAY); clients
  // reconnect on their next call. InfiniteDuration: never.
  absl::Duration max_connection_idle = absl::Minutes(5);
  // A connection whose client has sent nothing for this long after
  // connecting is closed (cc/server/listener.h).
  absl::Duration handshake_timeout = absl::Seconds(10);
  // The server pings a connection with calls after this much silence and
  // closes it if no answer comes within keepalive_timeout.
  absl::Duration keepalive_time = absl::Minutes(1);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  // Stopping Start early: when set and notified (e.g. by SIGTERM), Start
  // gives up waiting for etcd or a free index and returns CANCELLED.
  std::shared_ptr<absl::Notification> stop;

  // --- etcd registry (empty endpoints: none, the embedded default) ---
  std::vector<std::string> etcd_endpoints;  // "host:port"
  std::string cluster = "default";          // keys live under /pserver/<cluster>
  // Desired count, written to /ps_desired if absent; Start fails naming both
  // counts if /ps_desired holds another. Without etcd: the cluster's size,
  // recorded in checkpoints (0: unknown).
  uint32_t num_servers = 0;
  absl::Duration lease_ttl = absl::Seconds(5);
  // How long Start waits for a free index (all taken: a killed server's
  // lease has not expired yet) and for etcd.
  absl::Duration register_timeout = absl::Seconds(60);

  // --- replication, the standby model (docs/replication.md) ---
  // A standby (--standby, needs etcd): claims no index; it holds
  // /standby/<i> of a shard whose primary has no backup, copies that shard
  // from its primary (AttachStandby), applies the primary's writes
  // (Replicate), and serves no client until /ps/<i> is gone: then it takes
  // the shard over (epoch + 1) and serves as its primary. Start returns only
  // then (or CANCELLED when options.stop is notified).
  bool standby = false;
  // A standby's preferred shard among those with the fewest backups: a
  // server that stepped down from it rejoins it (RejoinOptions,
  // cc/server/standby_slots.h). Unset: the lowest index among them.
  std::optional<uint32_t> standby_prefer_shard;
  // The other servers of this process (--replicas, cc/server/process_slots.h):
  // a standby attaches to no shard one of them holds or backs up. Null: none.
  std::shared_ptr<ProcessSlots> process_slots;
  // The largest copy a standby accepts from the primary named in etcd
  // (--max_standby_copy_bytes): a bigger one fails the attach with
  // RESOURCE_EXHAUSTED naming the flag, nothing loaded. The copy travels in
  // one gRPC message, so at most 2^31-1.
  size_t max_standby_copy_bytes = size_t{1} << 30;
  // A primary that lets a standby attach (--accept_standbys): its writes go
  // through the replication path (cc/server/replication.h) and, once a
  // standby attached, are acknowledged only after the standby has them.
  // Off (the default): writes are applied as before. With TLS and roles the
  // servers dial each other with their own credentials (peer_token_file).
  bool accept_standbys = false;
  // The most standbys attached to this server's shard at once
  // (--max_standbys, 1-64): one more is refused with FAILED_PRECONDITION
  // naming the flag (each holds a copy's worth of the primary's time and a
  // connection, and every write waits for each).
  size_t max_standbys = 2;
  // A primary's bounds on a standby joining its shard: the writes made
  // since the standby's copy, queued for it while it loads the copy
  // (--max_joining_bytes, 1 KiB-1 TiB), and how long it may take to load
  // and apply the first of them (--join_timeout, 1 s-1 h). Past either it
  // is let go unlisted, told so at its next check (at most 250 ms later),
  // and copies again. A standby not listed within join_timeout + 1 min of
  // its copy copies again too (its primary may be gone).
  uint64_t max_joining_bytes = uint64_t{256} << 20;
  absl::Duration join_timeout = absl::Minutes(2);
  // How long a primary's write may take to reach a backup, retries
  // included, before the backup is dropped (--replicate_timeout, 1 s-1 h).
  // A backup whose address refuses connections, or that answers that it
  // left its shard, is dropped at once.
  absl::Duration replicate_timeout = absl::Seconds(10);
  // A primary's bytes of its last writes kept in memory so that a standby
  // rejoining with the shard's state up to an earlier LSN of its lineage
  // (dropped, let go, or the other backup after a takeover) is sent only
  // the writes after it, no copy (--catch_up_bytes; 0: off, else 1 KiB -
  // 1 TiB; default 256 MiB, as --max_joining_bytes: a catch-up past that is
  // refused anyway). Kept only while a standby may be away (fewer backups
  // than this primary had, one joining); a write every backup acknowledged
  // is let go at once. With it every write is numbered also while no
  // standby is attached.
  uint64_t catch_up_bytes = uint64_t{256} << 20;

  // --- live moves (docs/elastic.md; needs etcd) ---
  // Check every dense block of a bulk push or read against etcd's
  // /placement, which the server watches: a block it does not own under
  // the newest version is answered with PlacementMoved (FAILED_PRECONDITION
  // naming the version and the owner), nothing applied. Off (the default):
  // blocks are not checked. Only a slice of live moves (docs/elastic.md).
  bool placement_redirects = false;
  // With placement_redirects, the server also takes part in moves
  // (cc/server/move.h): MoveBlocks hands blocks over in batches of at most
  // this many bytes of values and optimizer state (--move_batch_bytes,
  // 1 KiB .. max_message_bytes / 2; one larger block goes alone).
  uint64_t move_batch_bytes = kDefaultMoveBatchBytes;
  // Testing only (--testing_move_stall_after_batches; 0: off): a live move
  // stops here mid-way, saying so on stdout, so that a test can kill this
  // process mid-move (BlockMoverOptions::stall_after_batches).
  uint32_t testing_move_stall_after_batches = 0;
  // Called once when a stable /placement leaves this server out (index >=
  // its count, after a move to fewer servers): the server has handed its
  // blocks over and should drain and exit (pserver does, as on SIGTERM).
  // Unset: it logs and keeps serving nothing.
  std::function<void()> on_departed;

  // --- checkpoints (empty dir: none) ---
  // Shard i lives in <checkpoint_dir>/shard-<i>. Start creates that
  // directory and proves it writable, and loads only checkpoints inside it
  // whose manifest names this shard and cluster and, when known, the same
  // server count (FAILED_PRECONDITION naming both counts otherwise).
  std::string checkpoint_dir;
  // Permission bits of checkpoint files; their directories get the same plus
  // search (0600 -> 0700). See ParseCheckpointFileMode.
  uint32_t checkpoint_file_mode = kDefaultCheckpointFileMode;
  absl::Duration checkpoint_interval = absl::ZeroDuration();  // 0: no periodic saves
  size_t checkpoint_keep = 3;
  bool checkpoint_on_shutdown = true;

  // Where dense shards live: "cpu" (host memory), or "cuda:<N>" as chosen by
  // cc/cuda's ChooseDevice (pserver --device): float32 blocks whose optimizer
  // runs on the GPU (sgd, adagrad, adam, adamw) are kept and updated on that
  // device, every other block in host memory (logged once). Start fails with
  // UNAVAILABLE naming the reason when the device is missing. Sparse and KV
  // tables stay in host memory.
  std::string device = "cpu";

  // Bytes of read replies (GetParam, GetParams, PushPull) built but not yet
  // sent, over all calls; past it reads get UNAVAILABLE ("retry", retried by
  // clients), a single reply larger than it RESOURCE_EXHAUSTED. Must be > 0.
  uint64_t max_reply_bytes_in_flight = uint64_t{1} << 30;
  // Bytes held by collectives waiting for their other participants
  // (AllReduce chunks, unread Broadcast data), over all rounds; past it a
  // contribution gets UNAVAILABLE ("retry"), one larger than it
  // RESOURCE_EXHAUSTED. Must be > 0.
  uint64_t max_collective_bytes = uint64_t{1} << 30;
  // Clients whose applied push sequences are remembered (exactly-once
  // pushes, cc/server/applied_sequences.h); past it the client idle the
  // longest is forgotten (a late retry of its last push is applied again).
  // Must be >= 1.
  uint64_t max_exactly_once_clients = AppliedSequences::kDefaultMaxClients;
  // Workers joined to one table's clocks at once (SSP/BSP); past it a Join is
  // RESOURCE_EXHAUSTED naming the flag. Must be >= 1.
  uint64_t max_workers_per_table = WorkerClocks::kDefaultMaxWorkers;
  // Tables CreateTable may make on this server; past it CreateTable is
  // RESOURCE_EXHAUSTED naming the flag, nothing created. Give a primary and
  // its standbys the same value. Must be >= 1.
  uint64_t max_tables = TablesOptions::kDefaultMaxTables;
  // Bytes of BSP adds one table holds back for slower workers; past it a
  // push is UNAVAILABLE ("retry"), one add larger than it
  // RESOURCE_EXHAUSTED. Must be > 0.
  uint64_t max_held_add_bytes = uint64_t{1} << 30;
  // Bytes of dense parameters (values and optimizer state, all together)
  // InitParam may bring this server to; past it InitParam is
  // RESOURCE_EXHAUSTED naming the parameter and the flag, nothing stored.
  // 0: half of this machine's physical memory (said at start). What a
  // checkpoint, a live move or a standby's copy brings in is taken whole.
  // Give a primary and its standbys the same value.
  uint64_t max_param_bytes = 0;
  // Bytes of table rows (all tables together, SparseTable::row_budget_bytes
  // a row) pushes may create; past it a push is RESOURCE_EXHAUSTED naming
  // the table and the flag, nothing of it applied. 0: half of this
  // machine's physical memory (said at start). Taken whole and given back as
  // max_param_bytes. Give a primary and its standbys the same value.
  uint64_t max_table_row_bytes = 0;

  // Fault injection for tests: every n-th applied push is answered
  // UNAVAILABLE as if its reply were lost. 0: off.
  uint64_t drop_reply_after_apply_every_n = 0;
  // --- the bulk channel beside gRPC (cc/server/bulk_listener.h) ---
  // Push, pull and push+pull over a framed TCP stream (and, for clients on
  // this host, an abstract Unix socket), offered through OpenChannel.
  // Off: OpenChannel is FAILED_PRECONDITION and clients keep to gRPC.
  bool bulk_channel = true;
  bool bulk_unix_socket = true;
  // Bulk channel connections served at once; more are refused
  // (RESOURCE_EXHAUSTED; the client uses gRPC instead). Must be >= 1.
  int max_bulk_connections = 256;
  // Bulk channel request bytes read or being served at once, over all
  // connections; a frame that does not fit is answered UNAVAILABLE (retried
  // by clients), one larger than all of it RESOURCE_EXHAUSTED.
  uint64_t max_bulk_request_bytes_in_flight = uint64_t{1} << 30;
  // A bulk channel frame's payload must be all in by this long after its
  // header, else its connection is closed and the bytes it held of
  // max_bulk_request_bytes_in_flight given back (clients retry on a new
  // one). Zero or infinite: no deadline (a stalled client then holds its
  // frame's bytes until its connection ends).
  absl::Duration bulk_frame_receive_timeout = absl::Seconds(60);
  // A bulk channel connection's thread polls this long for the next request
  // before it sleeps (BulkListenerOptions::read_spin); 0: never.
  absl::Duration bulk_read_spin = absl::Microseconds(50);

  // --- TLS (cc/security/tls.h): cert, key and ca, all three or none ---
  // With TLS every client must present a certificate that chains to tls.ca
  // (mutual TLS); the files are re-read every tls.reload_interval, so
  // replacing them rotates the certificates without a restart. gRPC's own
  // listener accepts (pserver's Listener hands over plaintext connections
  // only; handshake_timeout still applies), and the bulk channel is mutual
  // TLS too, over TCP only (cc/security/tls_byte_stream.h; files read per
  // connection).
  TlsOptions tls;

  // --- roles (docs/security.md; cc/auth/authorizer.h) ---
  // With a tokens file or a certificate rule, every call needs a principal
  // of this job whose role allows the method: UNAUTHENTICATED without
  // credentials, PERMISSION_DENIED naming role, job and method. All empty:
  // off, every call allowed.
  std::string job;
  std::string auth_tokens_file;  // lines "role job token", re-read on change
  std::string auth_cert_rule;    // e.g. "cn:<role>.<job>", "san:spiffe://<job>/<role>"
  // What this server presents when it dials another server of the cluster
  // (a standby its primary, a primary its backups, an old owner the new
  // one in a live move; cc/server/peer_channel.h): its own TLS certificate
  // (tls above) and, when set, the bearer token in this file. Peers
  // authorize it like any caller: AttachStandby, Replicate and
  // ReceiveBlocks need the admin role of this job. Needed with --standby,
  // --accept_standbys or --placement_redirects when roles come from
  // auth_tokens_file only.
  std::string peer_token_file;
  // etcd over TLS with this server's client certificate (--etcd_tls_ca,
  // --etcd_tls_cert, --etcd_tls_key); unset: plaintext.
  EtcdTlsOptions etcd_tls;

  // --- Prometheus metrics (cc/server/server_metrics.h; docs/operations.md) ---
  // Set: GET /metrics is served on metrics_http->host:port (127.0.0.1 unless
  // asked), with its limits (docs/limits.md). Unset: off.
  std::optional<metrics::MetricsHttpOptions> metrics_http;

  // --- traces (cc/trace; docs/operations.md "Traces") ---
  // Set: every request's stages (bulk frame, receive, apply, read, write
  // reply; control calls) are written as Chrome trace JSON to this file at
  // Shutdown. The newest trace_max_events are kept in memory (>= 1).
  std::string trace_file;
  size_t trace_max_events = size_t{1} << 18;
};

// The thread cap when ServerOptions::max_threads is 0.
inline constexpr int kDefaultMaxThreads = 256;

class Server {
 public:
  // INVALID_ARGUMENT for a bad port, thread count or limit; UNAVAILABLE when
  // the address cannot be bound (the message names it); CANCELLED when
  // options.stop was notified while starting.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);

  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // advertise_host (or host):port; [addr]:port for IPv6.
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  // The shard index: options.index, or the one claimed in etcd.
  uint32_t index() const { return index_; }
  ParameterStore& store() { return store_; }
  // Sparse and KV tables, and collectives; SetHandler here installs custom
  // table handlers (cc/core/tables.h).
  Tables& tables() { return tables_; }
  // Every operation of this server, as its gRPC service answers it: what an
  // in-process transport calls (cc/server/in_process_transport.h).
  Dispatcher& dispatcher() { return *dispatcher_; }
  // Drawn at start (random): published with the address at /ps/<index>;
  // a call naming another instance is refused (registry fencing).
  const std::string& instance_id() const { return instance_id_; }
  // The bulk channel's listener; null when it is off.
  BulkListener* bulk_listener() { return bulk_listener_.get(); }
  // The port GET /metrics is served on; 0 when metrics are off.
  int metrics_port() const { return metrics_http_ == nullptr ? 0 : metrics_http_->port(); }
  // Every metric of this server, as /metrics serves it.
  const metrics::Registry& metrics_registry() const { return metrics_registry_; }
  // What the gRPC health service (grpc.health.v1.Health, service "" and
  // "pserver.v1.ParameterServer") answers: SERVING once registered (with
  // etcd: while the lease is held), loaded and serving; NOT_SERVING while
  // starting and from the start of Shutdown. Lease loss is noticed within
  // kSweepInterval.
  bool Healthy() const;

  // Writes a checkpoint now, publishes it to etcd (if any), then prunes old
  // ones. FAILED_PRECONDITION without a checkpoint_dir.
  absl::StatusOr<CheckpointInfo> Save();

  // What Start loaded: empty if nothing; the messages name the checkpoint
  // used and every one skipped, with why (e.g. "checkpoint file checksum
  // validation failed: ...").
  const std::vector<std::string>& load_messages() const { return load_messages_; }
  std::optional<CheckpointInfo> loaded_checkpoint() const { return loaded_; }
  // etcd registrations so far (1 after Start; more after re-registering) and
  // leases lost.
  int registrations() const;
  int leases_lost() const;
  int64_t lease() const;
  // The shard epoch this server claimed (etcd /shards/<index>); 0 without etcd.
  uint64_t epoch() const { return config_.epoch(); }
  // Whether it stepped down (another server claimed its shard while its
  // lease was not renewed): it then refuses every call but the stats,
  // publishes no checkpoint and saves none at shutdown.
  bool stepped_down() const;
  // Whether a stable /placement left this server out after a live move
  // (its index at or above the new count): it answers redirects only.
  bool departed() const { return departed_.load(); }

  // Stops accepting calls, lets calls in flight finish for up to `grace`,
  // then cancels the rest; then saves a last checkpoint (checkpoint_dir and
  // checkpoint_on_shutdown) and gives up its etcd index. Idempotent.
  void Shutdown(absl::Duration grace = absl::Seconds(5));
  // After Shutdown: how its last checkpoint went (OK when none was due). The
  // pserver binary exits non-zero when it failed.
  absl::Status final_save_status() const;

 private:
  // `device`: the CUDA ordinal dense shards live on; none: host memory.
  Server(const ServerOptions& options, std::optional<int> device);
  StoreOptions MakeStoreOptions(std::optional<int> device);
  // `options` with max_param_bytes and max_table_row_bytes of 0 resolved
  // (half of the physical memory each).
  static ServerOptions WithMemoryBudgets(ServerOptions options);
  // Says the memory budgets and what the loaded state holds of them.
  void LogMemoryBudgets() const;
  static TablesOptions MakeTablesOptions(const ServerOptions& options);

  // etcd: reads /ps_desired and claims the lowest free index. CANCELLED
  // once options.stop is notified.
  absl::Status Register();
  // options.stop was notified: Start gives up.
  bool StopRequested() const;
  // Sleeps for `pause`, or less when options.stop is notified meanwhile.
  void PauseUnlessStopped(absl::Duration pause) const;
  // Loads the shard's checkpoint into the store.
  absl::Status LoadShard();
  // Puts a loaded checkpoint's state into the store, tables and applied ids
  // (`replace`: over the state held, as a standby's fresh copy does).
  absl::Status Restore(LoadedCheckpoint& loaded, bool replace = false);
  // New checkpoints get sequence numbers above `at_least` and every one in
  // ShardDir().
  void SetNextSequence(uint64_t at_least);
  // A standby (options.standby), after Register granted the lease: attaches
  // to a shard (the fewest backups first; its primary refuses past
  // --max_standbys), then waits to take it over. A standby that /shards/<i>
  // stops listing (its primary dropped it, or another backup took over and
  // dropped the rest) copies a shard anew. `retry` runs an etcd call until
  // the deadline, as Register does.
  template <typename Retry>
  absl::Status RunStandby(uint32_t desired, absl::Time deadline, Retry& retry);
  // RunStandby's steps: attach to a shard (holding standby_key_), then
  // follow its primary: true once this standby took over, false when it is
  // no longer listed (copy anew).
  template <typename Retry>
  absl::Status AttachToAShard(uint32_t desired, absl::Time deadline, Retry& retry,
                              const LeasedKeyOptions& standby_options);
  absl::StatusOr<bool> FollowPrimary();
  // The shards a standby may back up: those of etcd's /placement (the
  // larger count while it is moving), or `fallback` when it cannot be read.
  uint32_t ShardCount(uint32_t fallback) const;
  // Whether etcd's /placement is stable and leaves shard `shard` out (it
  // departed in a live move): a standby of it does not take it over.
  // The reason, or "" when it did not.
  std::string Departed(uint32_t shard) const;
  // A standby leaving a departed shard: its instance out of
  // /shards/<index_>.replicas (best effort; the holder stays).
  void LeaveShardConfig();
  // Live standbys of shard `shard` (keys under /standby/<shard>/); -1 when
  // etcd cannot be read.
  int LiveBackups(uint32_t shard) const;
  // A standby slot (process_slots set) backing up index_, listed at
  // `position` among its backups: why it leaves the shard for another that
  // lacks a backup ("" to stay; docs/replication.md, "Replicas in the
  // serving processes"). `over_since`: when it first saw the shard over its
  // wanted backups (a slot listed later leaves only after waiting
  // kLeaveStagger per position, so that one leaves at a time).
  std::string ReasonToRebalance(int position, absl::Time* over_since);
  static constexpr absl::Duration kLeaveStagger = absl::Seconds(2);
  // A joining standby asks its primary (over `stub`) whether its join goes
  // on (PrimaryReplication::CheckJoin): FAILED_PRECONDITION naming why once
  // it was let go; OK, or another error when the primary cannot answer.
  absl::Status CheckJoin(v1::ParameterServer::Stub& stub);
  // Copies shard `shard` from its primary at `primary` and starts applying
  // its writes.
  absl::Status AttachTo(uint32_t shard, const std::string& primary);
  // The shard's primary is gone: NextTakeover (the other backups leave the
  // set: they copy this server's state anew) and /ps/<shard>. False when
  // the claim lost a race (read again); FAILED_PRECONDITION when
  // /shards/<shard> does not list this standby (copy anew).
  absl::StatusOr<bool> TakeOver(uint32_t shard);
  // The published record's checkpoint, if etcd has one this server may trust
  // (inside ShardDir(), naming this shard and cluster, its CRC matching);
  // why not is added to load_messages_.
  std::optional<LoadedCheckpoint> LoadPublished(uint64_t* published_sequence);
  // FAILED_PRECONDITION unless `info` is this shard's, of this cluster, and
  // laid out for this cluster's placement (MapsLike, cc/core/reshard.h).
  absl::Status CheckBelongsHere(const CheckpointInfo& info) const;
  // The placement derived from the server count (JUMP; count 0: unknown),
  // with etcd /placement's version when there is etcd.
  v1::Placement CurrentPlacement() const;
  // FAILED_PRECONDITION, naming the shard, if <checkpoint_dir> holds
  // checkpoints of a shard at or beyond the server count that this server's
  // placement would take as its own generation (their count not recorded).
  absl::Status CheckNoShardBeyondTheCount() const;
  // The newest checkpoint in ShardDir() of another placement, if any: kept
  // by pruning for servers of this placement that have yet to reshard.
  std::vector<std::string> NewestOfAnotherPlacement() const;
  // How this server writes its checkpoints.
  CheckpointWriteOptions WriteOptions() const;
  // When <checkpoint_dir> holds a newer generation of checkpoints of another
  // placement (server count or kind) than this shard's own
  // (PlacementToReshardFrom): this shard's part of them (ReshardShard),
  // saved at once as its checkpoint. nullopt: load as usual.
  absl::StatusOr<std::optional<LoadedCheckpoint>> ReshardAtStart();
  // Save's part after a live move (move.h, "Live moves and checkpoints"):
  // leaves out the blocks handed over and, at the first save of a new
  // placement, numbers checkpoints above every shard's.
  void AfterLiveMove(StoreSnapshot* snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(save_mu_);
  std::string ShardDir() const;  // this server's shard's
  std::string ShardDir(uint32_t shard) const;
  void CheckpointLoop();
  // Evicts expired table rows (Eviction.ttl_seconds) every kSweepInterval,
  // also while no request comes.
  void SweepLoop();
  static constexpr absl::Duration kSweepInterval = absl::Seconds(1);
  absl::StatusOr<std::vector<v1::WorkerInfo>> ListWorkers();
  // One line of the process's log (cc/log), naming this server.
  void Log(const std::string& message, log::Level level = log::Level::kInfo) const;
  // Tells the gRPC health service what Healthy() says now.
  void UpdateHealth();
  EtcdSessionState EtcdState() const;
  // Replication as the metrics show it; Degraded: GetStats' `degraded`
  // ("shard <i> has no backup" once a primary dropped its backup and none
  // attached since; "" otherwise).
  ReplicationState Replication() const;
  std::string Degraded() const;
  // Starts GET /metrics (options.metrics set).
  absl::Status StartMetrics();
  // Fencing (cc/server/fence.h): the thread that re-checks etcd while the
  // lease is unconfirmed, what wakes it, the check of /shards/<index>, and
  // stepping down (logged, the registration released).
  // The highest epoch of shard `shard`'s checkpoints in checkpoint_dir (0:
  // none): a claim goes above it even when etcd lost /shards/<shard>.
  uint64_t EpochOnDisk(uint32_t shard) const;
  void RecheckFenceSoon();
  // options.placement_redirects: the gate at etcd's /placement, kept there.
  absl::Status StartPlacementGate();
  void FenceLoop();
  void CheckShardEpoch();
  // The compares a re-registration of /ps/<shard> after a lost lease makes:
  // /shards/<shard> still holds the configuration this server last wrote.
  std::function<std::vector<Compare>()> ReclaimGuard(uint32_t shard);
  void StepDown(const std::string& reason);

  const ServerOptions options_;
  // Outlives every part that records into it (declared first); written at
  // Shutdown.
  std::unique_ptr<trace::Recorder> trace_;
  ParameterStore store_;
  Tables tables_;
  std::unique_ptr<Dispatcher> dispatcher_;
  const std::string instance_id_;
  std::unique_ptr<Authorizer> auth_;  // roles; disabled when auth is off
  PeerCredentials peer_;              // how it dials other servers (set in Start)
  std::unique_ptr<ParameterServerService> service_;  // the gRPC face of dispatcher_
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<Listener> listener_;  // accepts for grpc_server_
  std::string address_;
  std::string metrics_address_;  // published in /ps/<index> and GetStats; "": none
  int port_ = 0;
  uint32_t index_ = 0;
  // The cluster's server count: /ps_desired with etcd, else
  // options.num_servers (0: unknown).
  uint32_t num_servers_ = 0;
  // etcd /placement's version (Register); 0 without etcd (derived from N).
  uint64_t placement_version_ = 0;
  mutable absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
  absl::Status final_save_status_ ABSL_GUARDED_BY(shutdown_mu_);

  std::vector<std::string> load_messages_;
  std::optional<CheckpointInfo> loaded_;
  std::atomic<bool> loaded_ok_{false};  // the shard is in memory: saving it is safe

  absl::Mutex save_mu_;  // one save at a time
  uint64_t next_sequence_ ABSL_GUARDED_BY(save_mu_) = 1;
  // The placement version the sequence was last raised for after a live
  // move (move.h, "Live moves and checkpoints").
  uint64_t sequence_placement_version_ ABSL_GUARDED_BY(save_mu_) = 0;

  std::unique_ptr<BulkListener> bulk_listener_;  // null: --bulk_channel=off
  std::unique_ptr<EtcdClient> etcd_;
  // /ps/<index_> under a lease, re-registered when the lease is lost.
  std::unique_ptr<LeasedKey> registration_;
  // The epoch claimed and /shards/<index_>'s value as this server wrote it
  // (what a checkpoint publish compares against).
  ShardConfigCell config_;
  // Replication (options.accept_standbys / options.standby).
  std::unique_ptr<PrimaryReplication> primary_replication_;
  std::atomic<bool> primary_replication_set_{false};  // primary_replication_ may be read
  std::unique_ptr<BackupReplication> backup_replication_;  // a standby's, set before gRPC starts
  std::unique_ptr<LeasedKey> standby_key_;  // /standby/<i>/<instance> while a standby
  // A standby: the instance of the primary it copied its shard from (a
  // holder other than it, before this standby was listed: copy anew).
  std::string copied_from_instance_;
  std::string copied_from_address_;  // and its address
  std::unique_ptr<Fence> fence_;  // with etcd only
  // options.placement_redirects: the gate and the /placement watch that
  // keeps it current (destroyed first).
  std::unique_ptr<PlacementGate> placement_gate_;
  std::unique_ptr<Watcher> placement_watcher_;
  std::unique_ptr<BlockMover> block_mover_;  // set with placement_gate_
  std::atomic<bool> block_mover_set_{false};
  std::atomic<bool> departed_{false};
  // A standby's record of its primary's live move (move.h): seeds the gate
  // if it takes the shard over.
  MoveMarks move_marks_;

  absl::Mutex loop_mu_;
  bool stopping_ ABSL_GUARDED_BY(loop_mu_) = false;
  bool fence_recheck_ ABSL_GUARDED_BY(loop_mu_) = false;
  std::thread checkpoint_thread_;
  std::thread fence_thread_;
  std::thread sweep_thread_;

  std::atomic<bool> draining_{false};  // Shutdown has begun: health says NOT_SERVING
  CheckpointMetrics checkpoint_metrics_;
  metrics::Registry metrics_registry_;
  std::unique_ptr<metrics::MetricsHttpListener> metrics_http_;  // null: metrics off
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_SERVER_H_
