// Client: a trainer's handle on a set of parameter servers.
//
//   ClientOptions options;
//   options.servers = {"127.0.0.1:7000", "127.0.0.1:7001"};
//   PS_ASSIGN_OR_RETURN(auto client, Client::Connect(options));
//   v1::ParameterConfig config;
//   config.mutable_optimizer()->mutable_adam();
//   PS_RETURN_IF_ERROR(client->InitParam("w", Tensor::FromValues<float>({2}, {0, 0}), config));
//   PS_RETURN_IF_ERROR(client->FinishInitParams());
//   PS_RETURN_IF_ERROR(client->SendGrad("w", Tensor::FromValues<float>({2}, {.1f, -.2f})));
//   PS_ASSIGN_OR_RETURN(Tensor w, client->GetParam("w"));
//
// Placement (cc/core/placement.h, derived from N: jump consistent hashing):
// a parameter lives on the server of its block 0; one larger than
// `block_bytes` is cut into blocks spread over the servers and put back
// together on Get. Calls to different servers go out in parallel, and every
// call has a deadline: `timeout` from its start, or the CallOptions
// deadline passed to it when that is earlier. A batch is checked against the
// layouts the client knows before anything is sent; each server applies its
// part whole or not at all.
//
// Non-finite gradients: before sending anything of a batch (SendGrads,
// PushPull, their async forms), the client scans every gradient for NaN and
// infinity, as the servers do, since a batch split over several servers
// would otherwise be applied by some and refused by others. For a parameter
// configured with non_finite: REJECT (the default) the whole batch fails
// with INVALID_ARGUMENT naming the parameter, block and first bad element
// ("...; nothing of the request was applied"), and nothing is sent; with
// SKIP every block of that gradient is sent marked skip_as_non_finite, so
// every server skips (and counts) its part, and the rest of the batch
// applies. A parameter whose layout the client does not know yet has its
// block 0 read first (only when a gradient for it is not finite).
//
// Live moves (docs/elastic.md): with `etcd_endpoints` the client watches
// etcd /placement and routes every operation by a snapshot of the newest
// version it has seen (routing()); while a move is under way it routes by
// the FROM count. A bulk request (SendGrads, PushPull, GetParams and their
// async forms) that a server refuses with PlacementMoved (the block moved:
// nothing of the request was applied) is followed, not reported: the client
// waits, within the call's deadline, until it has seen that version, then
// sends the refused request's blocks again, as new requests with new ids,
// to their owners under the placement named, and only those. Servers that
// join (etcd /ps/<i> beyond the count connected with, up to
// kMaxPlacementServers) are added as they register. A request whose every
// attempt found its server's port closed ("connection refused": nothing of
// it was delivered) makes the client read /placement again: when etcd holds
// a newer version that no longer counts that server (it departed in a move
// this client has not seen yet), the request is followed as a refusal of
// that version, not retried at the closed port.
//
// Recovery: a request to a server that fails with UNAVAILABLE (or runs past
// `attempt_timeout`) is retried, alone, with exponential backoff and jitter
// until the call's deadline; each push carries a request id (a random client
// id and a per-server sequence number, the same on every retry), so a server
// applies it once even when only its reply was lost. A call that never
// reaches its server (nothing listens, the name does not resolve, the peer
// is not a gRPC server) keeps being retried, so a server that comes up in
// time is reached; at the deadline it fails with DEADLINE_EXCEEDED saying
// why: "server 127.0.0.1:7000 not reachable: connection refused (last of 7
// attempts)". With `etcd_endpoints`
// the client finds the servers in etcd (waiting up to `discovery_timeout` for
// the desired count), follows address changes of a restarted server, and
// registers the trainer at /workers/<id> under a lease (its heartbeat).
// When etcd names another server process at an index (its address or
// instance id changed: a standby took the shard over from a primary that
// went silent, or the server restarted), every request still waiting on
// the old one ends at once and is retried at the new one with the same
// request id, instead of waiting out `attempt_timeout` (servers_replaced()
// counts these).
//
// Thread-safe: one Client may serve many trainer threads.
#ifndef PSERVER_CC_CLIENT_CLIENT_H_
#define PSERVER_CC_CLIENT_CLIENT_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cc/client/cancellation.h"
#include "cc/client/client_trace.h"
#include "cc/client/executor.h"
#include "cc/core/placement.h"
#include "cc/client/ticket.h"
#include "cc/client/transport.h"
#include "cc/client/wire_compressor.h"
#include "cc/core/finite.h"
#include "cc/core/tensor.h"
#include "cc/security/tls.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "grpc/health/v1/health.pb.h"
#include "pserver/v1/config.pb.h"
#include "pserver/v1/service.pb.h"

namespace pserver {

class EtcdClient;
class LeasedKey;
class Watcher;

struct ClientOptions {
  // host:port of every server, in shard-index order.
  std::vector<std::string> servers;
  // Parameters larger than this are split into blocks over all servers.
  // Every client of a cluster must use the same value.
  size_t block_bytes = size_t{1} << 20;
  // Batches are cut into requests of about this many payload bytes.
  size_t max_request_bytes = size_t{1} << 20;
  // Deadline of every call.
  absl::Duration timeout = absl::Seconds(30);
  // gRPC channels (TCP connections) per server; calls are spread over them.
  // Also the bulk channel's connections per server.
  int channels_per_server = 2;
  // Push, pull and push+pull over the servers' bulk channel (a framed TCP
  // stream beside gRPC, or a Unix socket on the same host;
  // cc/client/channel_transport.h) when a server offers one; gRPC otherwise.
  bool bulk_channel = true;
  // The bulk channel's reader polls this long for a reply before it sleeps
  // (ChannelTransportOptions::read_spin); 0: never.
  absl::Duration bulk_read_spin = absl::Microseconds(50);
  // A bulk TCP connection's unsent bytes at which a blocking write returns
  // (TCP_NOTSENT_LOWAT; ChannelTransportOptions::unsent_bytes): a push+pull
  // to several servers sends its requests one after another instead of all
  // at once, so that the first replies overlap the later requests. Plain
  // and TLS connections to other hosts; not the Unix socket, not a loopback
  // peer (nothing to pace there). 0: the kernel's default
  // (net.ipv4.tcp_notsent_lowat, unlimited unless set). At least 0.
  int bulk_unsent_bytes = 128 << 10;
  // Threads that run the *Async calls (started on the first one). Table
  // pulls and pushes between processes need none while they wait: their
  // requests go out from the calling thread and their tickets are finished
  // by the transport (docs/tables.md "Asynchronous calls and tickets").
  int async_threads = 4;
  // Async calls (tickets not done) this client holds at most. One more
  // *Async call blocks its caller until one ends, or fails its ticket
  // DEADLINE_EXCEEDED naming this option at the call's deadline. At least 1.
  int max_async_in_flight = 1024;

  // --- recovery ---
  // Deadline of one attempt of one request to one server; one that runs out
  // is retried (within `timeout`). 0: an attempt may take all of `timeout`
  // (with etcd_endpoints: 10 s, so that a server that hangs is given up on).
  // With etcd_endpoints an attempt to a server that etcd replaces (a
  // standby took its shard over) ends when the watch sees it, not at this
  // timeout.
  absl::Duration attempt_timeout = absl::ZeroDuration();
  // Backoff between attempts: doubles from initial to max, with +-50% jitter.
  // With etcd_endpoints, a wait ends as soon as the watch moves a server to a
  // new address (a standby took its shard over), and the backoff starts
  // again from initial.
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(1);

  // --- discovery through etcd (empty: use `servers`) ---
  std::vector<std::string> etcd_endpoints;  // "host:port"
  std::string cluster = "default";          // keys under /pserver/<cluster>
  // How long Connect waits for /ps_desired servers to be registered; etcd
  // reads are cut short to end by then too.
  absl::Duration discovery_timeout = absl::Seconds(60);
  // The trainer's registration /workers/<worker_id>; empty: a random id.
  bool register_worker = true;
  std::string worker_id;
  absl::Duration worker_lease_ttl = absl::Seconds(10);
  // Testing only: the /placement watch's events are ignored, so that this
  // client's view lags (tests of the re-read on a refused dial).
  bool testing_ignore_placement_watch = false;

  // --- TLS (cc/security/tls.h): cert, key and ca, all three or none ---
  // The client presents tls.cert and verifies each server's certificate
  // against tls.ca and the host it dials (or tls.server_name). With TLS
  // the bulk channel is TLS too (TCP; no Unix socket).
  TlsOptions tls;

  // --- security (docs/security.md) ---
  // A bearer token for servers with roles (--auth_tokens_file), sent as
  // "authorization: Bearer <token>" with every call and in the bulk
  // channel's hello; "": none.
  std::string token;
  // etcd over TLS with this client's certificate (etcd --client-cert-auth);
  // unset: plaintext.
  EtcdTlsOptions etcd_tls;
  // Registry fencing: refuse a /ps/<idx> entry that names no server
  // instance (a bare "host:port", as written by hand or by etcdctl).
  // Entries that name one are always checked, by the server reached.
  bool require_instance_id = false;

  // --- tracing (cc/client/client_trace.h, docs/operations.md "Traces") ---
  // Writes every call and request of this client as Chrome trace /
  // Perfetto JSON to this file on FlushTrace and when the client is
  // destroyed. "": the PSERVER_TRACE environment variable's file, if set.
  std::string trace_file;
  // Events held in memory (the newest; older ones are dropped and counted).
  // 0: PSERVER_TRACE_MAX_EVENTS if set, else 262144.
  size_t trace_max_events = 0;
};

// A named tensor: a gradient to send, or a parameter to initialize. It holds
// its tensor by value: build it with std::move, or use the single-tensor
// calls (SendGrad, PushPull(name, ...)), which borrow and never copy.
struct NamedTensor {
  std::string name;
  Tensor tensor;
};

struct ParamInit {
  std::string name;
  Tensor value;
  v1::ParameterConfig config;
};

// A parameter's element type and shape (Client::GetLayout).
struct ParamLayout {
  ElementType type;
  Shape shape;
  // How its gradients and reads travel (ParameterConfig.wire_compression).
  v1::WireCompression compression = {};
};

// Per-call settings: a call ends by min(now + options.timeout, deadline).
struct CallOptions {
  absl::Time deadline = absl::InfiniteFuture();
  // Receives the call's stage times (the *Async forms set it; a blocking
  // call may be traced too). Must outlive the call.
  TraceRecorder* trace = nullptr;
  // Ends the call with CANCELLED once cancelled (cc/client/cancellation.h),
  // its gRPC requests in flight cancelled. Must outlive the call.
  Cancellation* cancel = nullptr;
};

class Client {
 public:
  // A client over gRPC to options.servers. INVALID_ARGUMENT for no servers,
  // an address that is not host:port, [IPv6]:port or unix:/path (naming the
  // server's index, the address and what is wrong), or a zero block size,
  // request size or timeout. Does not wait for the servers: a call does.
  // With etcd_endpoints, waits up to discovery_timeout for the servers (every
  // etcd read included); DEADLINE_EXCEEDED then says what was missing, or
  // which etcd endpoint could not be read and why.
  // A block or request size over kMaxRequestPayloadBytes (8 MiB,
  // cc/rpc/transport_limits.h) is INVALID_ARGUMENT too.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  // A client over the given transports (one per server, in index order);
  // options.servers is ignored.
  static absl::StatusOr<std::unique_ptr<Client>> Create(
      const ClientOptions& options, std::vector<std::unique_ptr<Transport>> transports);

  ~Client();

  // Initializes a parameter (all its blocks). The first init of a name wins;
  // later ones get ALREADY_EXISTS "pserver already initialized".
  absl::Status InitParam(const std::string& name, const Tensor& value,
                         const v1::ParameterConfig& config = {}, const CallOptions& call = {});
  absl::Status InitParams(absl::Span<const ParamInit> params, const CallOptions& call = {});

  // Tells every server that initialization is over; idempotent.
  absl::Status FinishInitParams(const CallOptions& call = {});

  absl::StatusOr<Tensor> GetParam(const std::string& name, const CallOptions& call = {});
  // The parameters in the order of `names`.
  absl::StatusOr<std::vector<Tensor>> GetParams(absl::Span<const std::string> names,
                                                const CallOptions& call = {});
  // Like GetParams, into `outs` (one per name): a tensor that already has the
  // parameter's type and shape is filled in place, without allocating, so a
  // training loop can pull into the same buffers every step. On error the
  // contents of `outs` are unspecified.
  absl::Status GetParamsInto(absl::Span<const std::string> names, absl::Span<Tensor> outs,
                             const CallOptions& call = {});

  // Gradients are sent straight from the tensors' memory (no copy).
  absl::Status SendGrad(const std::string& name, const Tensor& grad, const CallOptions& call = {});
  absl::Status SendGrads(absl::Span<const NamedTensor> grads, const CallOptions& call = {});

  // Sends the gradients and reads the updated parameters back in one round
  // trip per server: outs[i] gets parameter grads[i].name after its update
  // (filled in place when it already has the right type and shape).
  absl::Status PushPull(absl::Span<const NamedTensor> grads, absl::Span<Tensor> outs,
                        const CallOptions& call = {});
  absl::Status PushPull(const std::string& name, const Tensor& grad, Tensor* out,
                        const CallOptions& call = {});

  // Every parameter of the cluster, in name order, each once: a parameter
  // split into blocks over several servers is merged (blocks_held summed over
  // them). Each server is read a page at a time (ListParams, at most 1000
  // names a reply); the whole list is held here. DATA_LOSS for a server that
  // answers pages out of order (which would never end).
  absl::StatusOr<std::vector<v1::ParamListing>> ListParams(const CallOptions& call = {});

  // One entry per server, in index order.
  absl::StatusOr<std::vector<v1::ServerStats>> GetStats(const CallOptions& call = {});
  // The same with `request`'s options (state_checksum: each server also
  // reports a checksum of its shard's whole state).
  absl::StatusOr<std::vector<v1::ServerStats>> GetStats(const v1::GetStatsRequest& request,
                                                        const CallOptions& call = {});
  // Every server's answer to gRPC's health check (grpc.health.v1, service
  // ""), in index order: SERVING once registered, loaded and serving,
  // NOT_SERVING while starting or draining. An unreachable server is retried
  // until the deadline, then the call fails naming it.
  using HealthStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;
  absl::StatusOr<std::vector<HealthStatus>> CheckHealth(const CallOptions& call = {});

  // Writes a checkpoint on every server, in parallel (each server's Save RPC:
  // durable, then published to etcd if the server has one). The first
  // failure names its server; FAILED_PRECONDITION from a server without a
  // checkpoint directory.
  absl::Status SaveCheckpoint(const CallOptions& call = {});

  // The element type and shape of parameter `name`, without reading its
  // values: what the client learned at init or a first read, or else the
  // header of its block 0 from its home server (GetParamInfo). NOT_FOUND for
  // an unknown parameter; FAILED_PRECONDITION before FinishInitParams.
  absl::StatusOr<ParamLayout> GetLayout(const std::string& name, const CallOptions& call = {});
  // The layout this client already knows (after init or a first read), if
  // any; asks no server.
  std::optional<ParamLayout> KnownLayout(const std::string& name) const;

  // --- asynchronous forms (cc/client/ticket.h) ---
  // Each returns a ticket at once and runs the call on the client's
  // executor (options.async_threads); its deadline counts from now. The
  // ticket's trace records when the call was queued, sent, received and
  // processed by the servers, and answered.
  //
  // Zero-copy: these calls BORROW their arguments. `grads` (the NamedTensor
  // array and every tensor in it), `names` and `outs` must stay alive and
  // unchanged (outs: untouched) until the ticket is done; `outs` holds the
  // results only once the ticket succeeded.
  Ticket SendGradsAsync(absl::Span<const NamedTensor> grads, const CallOptions& call = {});
  Ticket GetParamsIntoAsync(absl::Span<const std::string> names, absl::Span<Tensor> outs,
                            const CallOptions& call = {});
  Ticket PushPullAsync(absl::Span<const NamedTensor> grads, absl::Span<Tensor> outs,
                       const CallOptions& call = {});
  // Runs `call_fn` on the executor under a new ticket, passing it `call`
  // with the ticket's trace and an absolute deadline: how the async forms
  // (and Table's) are made.
  Ticket RunAsync(std::function<absl::Status(const CallOptions&)> call_fn,
                  const CallOptions& call = {});

  // Writes the trace recorded so far (ClientOptions::trace_file); OK and
  // nothing written when not tracing.
  absl::Status FlushTrace();
  // The client's trace (null when not tracing): Table's calls record into it.
  ClientTrace* trace() const { return trace_.get(); }

  // How the client routes at one moment: a snapshot of the newest
  // placement it has seen (etcd /placement, read at connect and watched; or,
  // without etcd, derived from N: JUMP, version 0). Every operation takes
  // one when it starts.
  struct Routing {
    // Where blocks and table keys are sent: while a move is under way, the
    // FROM count (at the moving record's version).
    Placement route;
    // The placement named (num_servers): where a block goes once its old
    // owner refused it with PlacementMoved. `route` when not moving.
    Placement target;
    bool moving = false;
    // The servers that hold state under it: the larger of both counts.
    int num_servers() const { return std::max(route.num_servers(), target.num_servers()); }
  };
  Routing routing() const ABSL_LOCKS_EXCLUDED(transports_mu_);
  // routing().num_servers(): the servers of calls made to every server.
  int num_servers() const { return routing().num_servers(); }
  // routing().route: how names and keys map to servers now.
  Placement placement() const { return routing().route; }
  // The newest /placement version this client routes by (0: none, derived
  // from N).
  uint64_t etcd_placement_version() const { return placement_version_.load(); }
  // Blocks sent again after a PlacementMoved (redirects followed), and the
  // times a call waited for a newer /placement than it had seen, so far.
  uint64_t redirects() const { return redirects_.load(); }
  uint64_t placement_waits() const { return placement_waits_.load(); }
  // The most rounds of one call's bulk requests (the first sending and the
  // redirects followed): a call that is refused more often reports it.
  static constexpr int kMaxRedirectRounds = 16;
  // This client's random id in push request ids.
  uint64_t client_id() const { return client_id_; }
  // The current address of every server, in index order.
  std::vector<std::string> addresses() const;
  // With etcd: the id this trainer registered under (/workers/<id>).
  const std::string& worker_id() const { return worker_id_; }
  // Registrations of this trainer so far (more than 1 after its lease was
  // lost and it registered again), and leases lost.
  int worker_registrations() const;
  int worker_leases_lost() const;
  // Requests retried, and transports replaced by the etcd watch (a server
  // registered again), so far.
  uint64_t retries() const { return retries_.load(); }
  uint64_t address_changes() const { return address_changes_.load(); }
  // Times the etcd watch found another server process at an index (its
  // address or instance changed: a standby took the shard over), so far.
  // Each time the calls in flight to the old one ended at once (UNAVAILABLE,
  // Transport::Abandon) and were retried at the new one.
  uint64_t servers_replaced() const { return servers_replaced_.load(); }
  // Gradients this client sent marked to be skipped (a NaN or infinity for
  // a parameter configured with non_finite: SKIP), so far.
  uint64_t non_finite_skipped() const { return non_finite_skipped_.load(); }
  // The top-k error-feedback residual this client keeps for parameter
  // `name` (ParameterConfig.wire_compression); empty if none.
  std::vector<float> wire_residual(const std::string& name) const {
    return compressor_.Residual(name);
  }

  // --- the client's internal interface ---
  // What the client's own parts (Table, KvWorker, WorkerGroup, DeviceIo in
  // cc/client) build their calls from: not for applications, and not a
  // stable API.

  // Starts one call per index i in [0, n) through the current transport of
  // server_of(i), and retries those that fail with UNAVAILABLE (or an
  // attempt's deadline) with backoff until `deadline`, each through the then
  // current transport. Returns the first failure (in index order) that was
  // not retried or ran out of time, naming its server. A deadline already
  // passed is DEADLINE_EXCEEDED, and nothing is sent.
  using StartCall =
      std::function<void(size_t i, Transport& transport, absl::Time deadline, Transport::Done)>;
  // Each request started is reported to `trace` (if any) as sent; when the
  // client traces, `describe` (if given) adds what request i carries to its
  // span.
  using DescribeRequest = std::function<void(size_t i, trace::Args& args)>;
  // With `moved` (n statuses): a request a server refuses with
  // PlacementMoved is not a failure; its refusal (naming the server) is
  // stored at (*moved)[i] for the caller to re-route.
  // With `first`: its attempt was made already (StartFirstAttempt): its
  // results are taken as the first round's, and only what failed is sent
  // again (the same requests: a push keeps its ids).
  struct FirstAttempt {
    std::vector<std::shared_ptr<Transport>> used;  // each call's transport
    std::vector<absl::Status> results;             // each call's status
  };
  absl::Status RunWithRetries(size_t n, const std::function<int(size_t)>& server_of,
                              const StartCall& start, absl::Time deadline,
                              TraceRecorder* trace = nullptr,
                              const DescribeRequest& describe = nullptr,
                              std::vector<absl::Status>* moved = nullptr,
                              const FirstAttempt* first = nullptr);
  // The first attempt of RunWithRetries' calls, started now from this
  // thread and not waited for: `then` runs once with its results, on the
  // thread that completes the last call (a transport's; this one before
  // StartFirstAttempt returns if they all complete at once, as in-process
  // calls do). `server_of`, `start` and `may_block` are used only during
  // this call. The client's own trace() records no request of it. False,
  // and nothing started, when `may_block` (if given) says of a transport it
  // would use that a call through it may block this thread.
  bool StartFirstAttempt(size_t n, const std::function<int(size_t)>& server_of,
                         const StartCall& start, absl::Time deadline, TraceRecorder* trace,
                         std::function<void(FirstAttempt)> then,
                         const std::function<bool(const Transport&)>& may_block = nullptr);
  // An async call's place among options.max_async_in_flight: waits until
  // `deadline` for one (DEADLINE_EXCEEDED naming the option). The call gives
  // it back with ReleaseAsync when it ends, before it finishes its ticket.
  absl::Status AcquireAsync(absl::Time deadline);
  void ReleaseAsync();
  // Async calls not ended yet.
  int async_in_flight() const;
  // Runs `closure` on the executor (options.async_threads).
  void Schedule(std::function<void()> closure);
  // Sleeps `sleep` before a retry, or less once address_changes() is no
  // longer `changes` (the etcd watch moved a server: retry there now). True
  // when `cancel` (may be null) was cancelled meanwhile.
  bool WaitToRetry(absl::Duration sleep, uint64_t changes, Cancellation* cancel) const;
  static constexpr absl::Duration kMovedCheckInterval = absl::Milliseconds(10);
  // RunWithRetries with one call per server i in [0, n) (n: num_servers()
  // of the caller's snapshot).
  absl::Status RunOnEveryServer(size_t n, const StartCall& start, absl::Time deadline);
  // Control call `method` (transport.h) with the same `request` to every
  // server; the answers in index order.
  template <typename Response>
  absl::StatusOr<std::vector<Response>> CallEveryServer(absl::string_view method,
                                                        const google::protobuf::Message& request,
                                                        const CallOptions& call) {
    const ClientTrace::Call span(trace_.get(), method);
    const Cancellation::Scope cancel_scope(call.cancel);
    std::vector<Response> responses(num_servers());
    absl::Status status = RunOnEveryServer(
        responses.size(), [&](size_t i, Transport& t, absl::Time deadline, Transport::Done done) {
          responses[i].Clear();
          t.Call(method, request, &responses[i], deadline, std::move(done));
        },
        Deadline(call));
    if (!status.ok()) return status;
    return responses;
  }
  // Following PlacementMoved (see "Live moves" above): after round `round`
  // of a call whose requests `refusals` (non-empty) were refused with
  // PlacementMoved, `rerouted` when some of their `items` now go elsewhere
  // than they went: waits, within `deadline`, until this client routes by
  // the newest version named, then OK with `*routing` the snapshot to send
  // the refused items again by (each to its owner under routing->target);
  // the error to report otherwise (no /placement followed, the deadline,
  // a server that disagrees, kMaxRedirectRounds, naming the items as
  // `what`). Counts `items` as redirects.
  absl::Status FollowRefusals(absl::Span<const absl::Status* const> refusals, bool rerouted,
                              int round, size_t items, absl::string_view what,
                              absl::Time deadline, Routing* routing);
  // The next push sequence number for `server` (exactly-once ids; 0 <=
  // server < kMaxPlacementServers).
  uint64_t NextSequence(int server) { return sequences_[server].fetch_add(1) + 1; }
  // Routes by `spec` from now on (what the etcd /placement watch calls):
  // a version not newer than the one held is ignored (OK). INVALID_ARGUMENT,
  // nothing changed, for a spec CheckPlacementSpec refuses or a move from a
  // count outside [1, kMaxPlacementServers]. Servers it names that have no
  // transport yet get one that answers UNAVAILABLE until SetTransport (a
  // call retries them until its deadline). A client updated this way (or
  // connected to etcd) waits for newer versions when redirected; one that
  // is not reports a PlacementMoved at once.
  absl::Status UpdatePlacement(const v1::Placement& spec) ABSL_LOCKS_EXCLUDED(transports_mu_);
  // The transport of server `server` from now on (what discovery calls when
  // /ps/<server> is registered or changes); calls in flight keep theirs.
  // INVALID_ARGUMENT for an index outside [0, kMaxPlacementServers).
  absl::Status SetTransport(int server, std::unique_ptr<Transport> transport)
      ABSL_LOCKS_EXCLUDED(transports_mu_);
  // When a call started now with `call` must end: the earlier of the
  // client's timeout and the call's deadline.
  absl::Time Deadline(const CallOptions& call) const {
    return std::min(absl::Now() + options_.timeout, call.deadline);
  }
  const ClientOptions& options() const { return options_; }

  // What the client knows of a parameter after init or a first read.
  struct Layout {
    ElementType type;
    Shape shape;
    uint64_t elements;
    uint32_t blocks;
    bool clips_by_norm;  // split gradients must carry their global norm
    // What the servers do with a NaN or infinity: the client checks a batch
    // whole before sending any of it (see "Non-finite gradients" above).
    v1::ParameterConfig::NonFinite non_finite;
    // How its gradients and reads travel (ParameterConfig.wire_compression).
    v1::WireCompression compression = {};
  };
  // The parameter's layout, read from its block 0 (on its home server) if
  // this client has not seen it yet.
  absl::StatusOr<Layout> FindOrLearnLayout(const std::string& name, absl::Time deadline,
                                           TraceRecorder* trace);
  // What to do with a gradient for `name` (of `layout`) in which `bad`, if
  // any, is the first NaN or infinity, counted from element `first` of the
  // parameter, and whose global norm is `norm` (if computed): false to send
  // it as it is; true to send every block of it marked skip_as_non_finite
  // (the parameter skips such gradients); INVALID_ARGUMENT in the server's
  // words where the parameter rejects them.
  absl::StatusOr<bool> NonFiniteVerdict(const std::string& name, const Layout& layout,
                                        uint64_t first, const std::optional<NonFinite>& bad,
                                        std::optional<double> norm) const;
  // Counts a gradient sent marked skip_as_non_finite (non_finite_skipped()).
  void CountNonFiniteSkipped() { non_finite_skipped_.fetch_add(1); }

  // Requests to one server, holding the indices of the items they carry.
  struct Batch {
    int server;
    std::vector<size_t> items;
  };
  // Groups items (their servers and payload bytes) per server into batches
  // of about `max_bytes` payload each (an item larger than that travels
  // alone), keeping the items' order. A server index at or beyond
  // `num_servers` (a newer placement's) is grouped like any other.
  static std::vector<Batch> PackBatches(absl::Span<const int> servers,
                                        absl::Span<const size_t> bytes, size_t max_bytes,
                                        int num_servers);
  // The view of gradient block `b`, whose bytes are `content`.
  static GradientView BlockGradient(absl::string_view name, ElementType type, const BlockSpec& b,
                                    std::optional<double> norm, absl::string_view content);
  // A reference to block `index` of `count` of a parameter.
  static v1::ParamRef BlockRef(const std::string& name, uint32_t index, uint32_t count);

 private:
  struct Assembly;
  struct Exchange;
  struct Item;
  // The layout a returned block's header describes; `what` names it in errors.
  static absl::StatusOr<Layout> LayoutOf(const v1::Parameter& header, const std::string& what);
  // Borrowed forms of NamedTensor and ParamInit: the public single and
  // batched calls share one implementation without copying any tensor.
  struct GradRef {
    const std::string* name;
    const Tensor* tensor;
  };
  struct InitRef {
    const std::string* name;
    const Tensor* value;
    const v1::ParameterConfig* config;
  };
  static std::vector<GradRef> RefsOf(absl::Span<const NamedTensor> grads);

  Client(const ClientOptions& options, std::vector<std::unique_ptr<Transport>> transports);

  std::shared_ptr<Transport> TransportFor(int server) const;
  // How long one attempt of a request may take (0: the whole call).
  absl::Duration AttemptTimeout() const;
  // etcd: finds the servers, watches them, registers the trainer.
  absl::Status StartDiscovery(EtcdClient* etcd, int64_t revision);
  // etcd /placement at connect (nullopt: none there); FAILED_PRECONDITION
  // when a server it routes to is not among those discovered (`servers`,
  // by index; an empty address: not registered).
  static absl::StatusOr<std::optional<v1::Placement>> ReadPlacementFor(
      EtcdClient& etcd, const std::vector<etcd_keys::ServerEntry>& servers, absl::Time deadline);
  // After a dial to `server` was refused: reads etcd /placement again (and
  // routes by it); a PlacementMoved-like refusal of its version when it no
  // longer counts `server`, nullopt otherwise (no etcd, nothing newer, or
  // the server is still counted: retried there).
  std::optional<absl::Status> DepartedServer(int server);
  // Routes by every newer /placement from `revision` on (UpdatePlacement).
  absl::Status WatchPlacement(EtcdClient* etcd, int64_t revision);
  void OnServerChanged(int server, const etcd_keys::ServerEntry& entry);
  // SetTransport; with `entry` (what etcd names at /ps/<server>), when it
  // names another server process than the entry before, the old transport
  // is abandoned (its calls in flight end at once and are retried here).
  absl::Status ReplaceTransport(int server, std::unique_ptr<Transport> transport,
                                const etcd_keys::ServerEntry* entry)
      ABSL_LOCKS_EXCLUDED(transports_mu_);
  // Puts /workers/<worker_id_> = `worker_json` under a lease kept alive,
  // and registered again whenever the lease is lost.
  absl::Status RegisterWorker(std::string worker_json);

  std::optional<Layout> FindLayout(const std::string& name) const;
  void RememberLayout(const std::string& name, Layout layout);
  absl::Status DoInitParams(absl::Span<const InitRef> params, absl::Time deadline);
  absl::Status DoSendGrads(absl::Span<const GradRef> grads, absl::Time deadline,
                           TraceRecorder* trace);
  absl::Status DoPushPull(absl::Span<const GradRef> grads, absl::Span<Tensor> outs,
                          absl::Time deadline, TraceRecorder* trace);
  // Checks a gradient against what is known of its parameter.
  absl::Status CheckGradient(const GradRef& grad) const;
  // The blocks of a gradient, as views of its memory, after checking it for
  // NaN and infinity (NonFiniteVerdict; learning the parameter's layout
  // first if needed).
  // Blocks of a parameter configured with wire_compression are encoded,
  // into buffers kept in *encoded.
  absl::StatusOr<std::vector<GradientView>> GradientBlocks(const GradRef& grad,
                                                           std::deque<std::string>* encoded,
                                                           absl::Time deadline,
                                                           TraceRecorder* trace);
  // A reference to block `index` of `count` of a parameter of `layout`,
  // asking for its values in the wire type of its compression.
  static v1::ParamRef PullRef(const std::string& name, const Layout& layout, uint32_t index,
                              uint32_t count);
  // Routes `items` by the current placement, packs them into requests of
  // about max_request_bytes per server, runs them all in parallel and
  // places every returned block. A request refused with PlacementMoved is
  // followed (see the top of this file): its items go again, under new
  // request ids, to their owners under the placement named; at most
  // kMaxRedirectRounds rounds.
  absl::Status Run(const std::vector<Item>& items, std::vector<Assembly>& assemblies,
                   absl::Time deadline, TraceRecorder* trace);
  // One round of Run: items[pending[k]] to servers[k]. The refusals
  // (PlacementMoved) with the items of each refused request.
  struct Refusal {
    absl::Status status;
    std::vector<size_t> items;
  };
  absl::Status RunRound(const std::vector<Item>& items, absl::Span<const size_t> pending,
                        absl::Span<const int> servers, std::vector<Assembly>& assemblies,
                        absl::Time deadline, TraceRecorder* trace, std::vector<Refusal>* refused);
  // Waits until this client routes by /placement `version` or newer; false
  // at `deadline` or when `cancel` (may be null) was cancelled.
  bool WaitForPlacement(uint64_t version, absl::Time deadline, Cancellation* cancel);
  // Grows transports_ (placeholders answering UNAVAILABLE) to `count`.
  void CoverServersLocked(int count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(transports_mu_);
  static void DescribeExchange(const Exchange& x, const RequestId& id, trace::Args& args);
  // DATA_LOSS naming the first parameter some of whose blocks never came.
  static absl::Status CheckComplete(const std::vector<Assembly>& assemblies);
  // Copies one returned block into its parameter's output (nothing to copy
  // when `content` is already there: PlaceFor's address).
  absl::Status PlaceBlock(Assembly& a, const v1::Parameter& header, const Segments& content,
                          const std::string& from);
  // Where in `a`'s output the content of a block answering `ref` goes, when
  // `header` (complete but for the content, `bytes` long) is that block's,
  // its content travels in the output's type and fits there: what
  // PlaceBlock would copy it to, so a transport may read it there straight
  // from the wire. Null otherwise (the layout not known yet, a compressed
  // content, anything unexpected: PlaceBlock then decides, as before).
  static char* PlaceFor(const Assembly& a, const v1::ParamRef& ref, const v1::Parameter& header,
                        uint64_t bytes);

  const ClientOptions options_;
  // Destroyed last (written then), after every call and transport is done.
  std::unique_ptr<ClientTrace> trace_;
  mutable absl::Mutex transports_mu_;
  Routing routing_ ABSL_GUARDED_BY(transports_mu_);
  std::atomic<uint64_t> placement_version_{0};  // routing_'s, written under the lock
  // The placement is kept up to date (etcd, or UpdatePlacement): worth
  // waiting for on a redirect.
  std::atomic<bool> placement_followed_{false};
  // Replaced when a server moves; calls in flight hold their own reference.
  // Grows (never shrinks) as servers join, up to kMaxPlacementServers;
  // never null (a server not registered yet has a placeholder).
  std::vector<std::shared_ptr<Transport>> transports_ ABSL_GUARDED_BY(transports_mu_);
  // What etcd named at /ps/<i> for each index seen (with etcd only).
  absl::flat_hash_map<int, etcd_keys::ServerEntry> entries_ ABSL_GUARDED_BY(transports_mu_);
  const uint64_t client_id_;
  // Last push sequence, per server index: kMaxPlacementServers of them
  // (32 KiB), so that servers joining never move them.
  std::unique_ptr<std::atomic<uint64_t>[]> sequences_;
  std::atomic<uint64_t> redirects_{0};
  std::atomic<uint64_t> placement_waits_{0};
  std::atomic<uint64_t> retries_{0};
  std::atomic<uint64_t> address_changes_{0};
  std::atomic<uint64_t> servers_replaced_{0};
  std::atomic<uint64_t> non_finite_skipped_{0};
  WireCompressor compressor_;  // top-k residuals

  // etcd discovery (null without). Destroyed watcher first, etcd last.
  std::unique_ptr<EtcdClient> etcd_;
  std::string worker_id_;
  std::unique_ptr<LeasedKey> worker_registration_;  // /workers/<worker_id_>
  std::unique_ptr<Watcher> watcher_;
  std::unique_ptr<Watcher> placement_watcher_;

  mutable absl::Mutex layouts_mu_;
  absl::flat_hash_map<std::string, Layout> layouts_ ABSL_GUARDED_BY(layouts_mu_);

  absl::once_flag executor_once_;
  std::unique_ptr<Executor> executor_;  // the async calls; stopped first
  mutable absl::Mutex async_mu_;
  int async_in_flight_ ABSL_GUARDED_BY(async_mu_) = 0;
};

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_CLIENT_H_
