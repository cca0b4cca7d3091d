// Dispatcher: the one mapping of every server operation onto a server's
// ParameterStore and Tables. The gRPC service (service.h) and the in-process
// transport (in_process_transport.h) both call it, so that a server answers
// the same over either by construction.
//
//   Dispatcher dispatcher(&store, &tables, /*index=*/0);
//   v1::GetStatsRequest request;
//   v1::GetStatsResponse response;
//   dispatcher.Call("GetStats", request, &response, {}, [](absl::Status s) { ... });
//
// Control methods (every method of pserver.v1.ParameterServer but the bulk
// three) are found by name in one table; their request and response types
// come from the service's descriptor. Bulk data (pushes with a request id,
// reads into a sink) are plain methods on borrowed views: no tensor byte is
// copied into a protobuf message.
//
// What every operation shares lives here: the serving check (UNAVAILABLE
// while a server is still starting, or once it stepped down), the write
// fence (every write checked before it is applied and again before it is
// acknowledged, cc/server/fence.h), exactly-once pushes (AppliedSequences
// under apply_mu), the counters GetStats reports, the reply budget, the
// Save/ListWorkers hooks, fault injection, and waits that end early when
// cancelled.
//
// Thread-safe, as the store and tables are.
#ifndef PSERVER_CC_SERVER_DISPATCHER_H_
#define PSERVER_CC_SERVER_DISPATCHER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cc/core/gradient_view.h"
#include "cc/core/parameter_store.h"
#include "cc/core/request_id.h"
#include "cc/core/tables.h"
#include "cc/core/waiters.h"
#include "cc/server/applied_sequences.h"
#include "cc/server/backup_log.h"
#include "cc/server/fence.h"
#include "cc/server/placement_gate.h"
#include "cc/server/reply_budget.h"
#include "cc/server/request_metrics.h"
#include "cc/trace/trace.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "pserver/v1/registry.pb.h"
#include "pserver/v1/service.pb.h"

namespace pserver {

// The primary's write path when its shard may have backups
// (docs/replication.md; cc/server/replication.h). Not set (R=1, the
// default): writes are applied as they come.
class WriteShipper {
 public:
  virtual ~WriteShipper() = default;
  // Runs `apply` (this replica's copy of write `method`) and, when the shard
  // has backups, ships the write's bytes (`request`, called only then, held
  // as received: not copied) to each; OK once every live replica holds it.
  // `apply` is given `ship`: an apply that checks the write before changing
  // anything calls it once the checks passed (a push: ParameterStore's
  // checks), and the backups then receive and apply the write while this
  // replica applies it; after ship, an error of the apply's own making is
  // DATA_LOSS (this replica no longer matches its backups). One that never
  // calls it is applied first and shipped after.
  virtual absl::Status Write(
      absl::string_view method, absl::FunctionRef<SharedBytes()> request,
      absl::FunctionRef<absl::Status(absl::FunctionRef<void()> ship)> apply) = 0;
};

// What a Server adds beyond the store; every field optional.
// The most parameters one ListParams reply lists (ListParamsRequest.max_entries
// is capped to it; docs/limits.md).
inline constexpr uint32_t kMaxListParamsEntries = 1000;

struct DispatcherHooks {
  // Save: writes (and publishes) a checkpoint. Unset: FAILED_PRECONDITION.
  std::function<absl::StatusOr<v1::CheckpointRecord>()> save;
  // ListWorkers: the live trainers. Unset: FAILED_PRECONDITION.
  std::function<absl::StatusOr<std::vector<v1::WorkerInfo>>()> list_workers;
  // OpenChannel: where this server's bulk channel listens, and its token
  // (cc/server/bulk_listener.h). Unset: FAILED_PRECONDITION (clients keep
  // to gRPC).
  std::function<v1::OpenChannelResponse()> open_channel;
  // Replication (docs/replication.md): AttachStandby on a primary,
  // Replicate on a backup. Unset: FAILED_PRECONDITION. Replicate is served
  // while not serving (a standby serves no client but applies its
  // primary's writes).
  std::function<absl::StatusOr<v1::AttachStandbyResponse>(const v1::AttachStandbyRequest&)>
      attach_standby;
  std::function<absl::Status(const v1::ReplicateRequest&)> replicate;
  // Live moves (docs/elastic.md, cc/server/move.h): MoveBlocks on an old
  // owner, ReceiveBlocks on a new one. Unset: FAILED_PRECONDITION.
  // MoveBlocks sends RPCs of its own: it fills the response and calls done
  // later, from a thread of its own (a gRPC callback thread is not held).
  std::function<void(const v1::MoveBlocksRequest&, v1::MoveBlocksResponse*,
                     std::function<void(absl::Status)> done)>
      move_blocks;
  std::function<absl::StatusOr<v1::ReceiveBlocksResponse>(const v1::ReceiveBlocksRequest&)>
      receive_blocks;
  // GetStats' `degraded`: why the server is degraded ("": it is not). Unset: "".
  std::function<std::string()> degraded;
  // GetStats' `bulk_aead_connections` (BulkListener::aead_connections). Unset: 0.
  std::function<uint64_t()> bulk_aead_connections;
  // Fault injection for tests: every n-th push that is applied is answered
  // UNAVAILABLE, as if its reply had been lost. 0: off.
  uint64_t drop_reply_after_apply_every_n = 0;
  // Bytes of replies (GetParam, GetParams, PushPull) built but not yet sent,
  // over all calls; past it reads get UNAVAILABLE ("retry"; RESOURCE_EXHAUSTED
  // for a single reply larger than the limit)
  // (--max_reply_bytes_in_flight).
  uint64_t max_reply_bytes_in_flight = uint64_t{1} << 30;
};

// A reply's share of the reply budget, given back when the hold is
// destroyed (once the reply was sent). Move-only; empty holds nothing.
class ReplyHold {
 public:
  ReplyHold() = default;
  ReplyHold(ReplyHold&& other) noexcept { *this = std::move(other); }
  ReplyHold& operator=(ReplyHold&& other) noexcept;
  ReplyHold(const ReplyHold&) = delete;
  ReplyHold& operator=(const ReplyHold&) = delete;
  ~ReplyHold() { Reset(); }

  // Takes `bytes` from `budget` (releasing what was held); on failure
  // nothing is held and the reply must not be sent.
  absl::Status Acquire(ReplyBudget* budget, uint64_t bytes);
  void Reset();

 private:
  ReplyBudget* budget_ = nullptr;
  uint64_t bytes_ = 0;
};

class Dispatcher {
 public:
  using Done = std::function<void(absl::Status)>;
  // Receives each block a read returns, in request order: `header` holds all
  // but the content, `content` is valid only during the call. An error ends
  // the read.
  using BlockReader =
      absl::FunctionRef<absl::Status(const v1::Parameter& header, absl::string_view content)>;

  // How a control call is made.
  struct CallContext {
    // When a waiting call gives up (Barrier, AllReduce, Broadcast,
    // consistent TablePull): at most kMaxWait from now.
    absl::Time deadline = absl::InfiniteFuture();
    // Where a reply that counts against the reply budget (GetParam) holds
    // its bytes until it is sent. Null: released as soon as it is built.
    ReplyHold* reply = nullptr;
  };

  // A control method: its descriptor (request and response types) and the
  // prototypes to make its messages from.
  struct Method {
    const google::protobuf::MethodDescriptor* descriptor = nullptr;
    const google::protobuf::Message* request_prototype = nullptr;
    const google::protobuf::Message* response_prototype = nullptr;
    bool needs_serving = true;
    OpMetrics* metrics = nullptr;  // counts, bytes and latency of its requests
    // Changes the shard's state (kWriteMethods): fenced before and after.
    bool writes = false;
    // One of kReplicatedMethods: shipped to backups (SetShipper).
    bool replicated = false;
    std::function<CancelWait(const google::protobuf::Message& request,
                             google::protobuf::Message* response, const CallContext& call,
                             Done done)>
        run;
  };

  static constexpr absl::Duration kMaxWait = absl::Minutes(10);
  // The control methods that change state, fenced (SetFence) before they
  // run and before their success is answered; with the bulk pushes
  // (Push: SendGrads, PushPull).
  static const char* const kWriteMethods[];
  // "/pserver.v1.ParameterServer/": the prefix of every gRPC method path.
  static const char kMethodPrefix[];

  // `store` and `tables` must outlive the dispatcher.
  Dispatcher(ParameterStore* store, Tables* tables, uint32_t index, DispatcherHooks hooks = {});

  // Whether table `name`'s calls go through a custom handler
  // (Tables::SetHandler).
  bool HasTableHandler(absl::string_view name) const { return tables_->HasHandler(name); }
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // ---- control methods, by name ------------------------------------------
  // The control method `name` ("GetStats", or its gRPC path
  // "/pserver.v1.ParameterServer/GetStats"); null for an unknown name and
  // for the bulk methods.
  const Method* FindMethod(absl::string_view name) const;

  // Runs control method `name`: fills `response` and calls `done` exactly
  // once, maybe before returning, maybe later on another thread (a waiting
  // call). `request` and `response` must be the method's types and stay
  // valid until `done` runs. Returns what ends a waiting call early with
  // CANCELLED (a no-op once done, and for calls that do not wait).
  // UNIMPLEMENTED for an unknown method, INVALID_ARGUMENT for a message of
  // another type, UNAVAILABLE while not serving.
  CancelWait Call(absl::string_view name, const google::protobuf::Message& request,
                  google::protobuf::Message* response, const CallContext& call, Done done);

  // The control writes a backup applies from their request bytes
  // (ApplyWrite), null-terminated: kWriteMethods but Save and the
  // collectives (Barrier, AllReduce, Broadcast: their rounds are no shard
  // state).
  static const char* const kReplicatedMethods[];
  // Applies control write `name` (one of kReplicatedMethods) from its
  // request's serialized bytes through Call, the very path a client's call
  // takes, and returns its answer: a backup applying what its primary
  // shipped (cc/server/backup_log.h) ends bit-identical. Applied whether or
  // not the dispatcher is serving and past no fence: a backup's writes come
  // from its primary, which checked them. INVALID_ARGUMENT for another
  // method or bytes that do not parse.
  absl::Status ApplyWrite(absl::string_view name, absl::string_view request);
  // A shipped bulk push (ApplyReplicatedPush): applied once per id, whether
  // or not serving, past no fence.
  absl::Status PushReplicated(const RequestId& id, absl::Span<const GradientView> grads);

  // From now on every replicated write (kReplicatedMethods and the bulk
  // pushes) goes through `shipper` (not owned; outlives the dispatcher).
  // Null (the default): applied as they come.
  void SetShipper(WriteShipper* shipper) { shipper_.store(shipper, std::memory_order_release); }
  // Whether writes go through a shipper now (they may then wait for backups).
  bool Ships() const { return shipper_.load(std::memory_order_acquire) != nullptr; }
  // Runs `apply` through the shipper when one is set, else alone (its
  // `ship` then does nothing). WriteShipper::Write says what `ship` is.
  absl::Status Ship(absl::string_view method, absl::FunctionRef<SharedBytes()> request,
                    absl::FunctionRef<absl::Status(absl::FunctionRef<void()> ship)> apply);

  // ---- bulk data ---------------------------------------------------------
  // Both are UNAVAILABLE while the server is not serving.
  // Applies a batch of gradients whole or not at all, once per id; fenced
  // before and after (a duplicate's acknowledgement too).
  absl::Status Push(const RequestId& id, absl::Span<const GradientView> grads);
  // The same, shipped first (Ship's `ship`): `ship` is called once the
  // batch passed its checks, before it is applied here; an error applying
  // it after that is DATA_LOSS.
  absl::Status Push(const RequestId& id, absl::Span<const GradientView> grads,
                    absl::FunctionRef<void()> ship);
  // Reads `refs` in order into `reader`; stops at the first error.
  absl::Status Read(absl::Span<const v1::ParamRef> refs, BlockReader reader);

  // A PushPull whose reply is written while the push is applied (the bulk
  // channel, bulk_listener.cc): the reads are opened first, then
  // PushStreaming applies the push and the caller reads each opened block
  // as soon as the gradients to it are applied.
  // (A reply waits for backups when Ships(): then it is not streamed.)
  // Read's checks of `refs` (serving, placement, the store's), each block
  // opened; nothing read yet.
  absl::StatusOr<std::vector<ParameterStore::OpenedBlock>> OpenReads(
      absl::Span<const v1::ParamRef> refs);
  // Reads one opened block (ParameterStore::ReadOpened).
  absl::Status ReadOpened(const ParameterStore::OpenedBlock& block,
                          absl::FunctionRef<void(absl::string_view)> read) {
    return store_->ReadOpened(block, read);
  }
  // Counts a read of `sent` content bytes begun at `start` (as Read does).
  void FinishRead(const absl::Status& status, OpMetrics::Clock::time_point start,
                  uint64_t sent) {
    read_metrics_->Finish(status, start, sent);
  }
  // Push, unshipped; `checked` is called once the batch passed its checks,
  // before anything is applied (not for a duplicate, which applies
  // nothing), `applied(i)` after gradient i is applied.
  absl::Status PushStreaming(const RequestId& id, absl::Span<const GradientView> grads,
                             absl::FunctionRef<void()> checked,
                             absl::FunctionRef<void(size_t)> applied);
  // OK if a reply may be built (the reply budget is not spent).
  absl::Status CheckReplyRoom();
  // Holds `bytes` of a built reply in `hold` until it is sent.
  absl::Status HoldReply(uint64_t bytes, ReplyHold* hold) {
    return hold->Acquire(&reply_budget_, bytes);
  }
  // Counts a request too malformed to reach the store (GetStats).
  void CountMalformed() { store_->CountRejected(); }
  // The store's budget of parameter bytes (--max_param_bytes), for metrics.
  const MemoryBudget& param_budget() const { return store_->budget(); }

  // ---- sparse tables on views (the bulk channel's table frames) ----------
  // The TablePush control method on a view, no message: the serving check,
  // the fence before and after, exactly once per (client_id, sequence),
  // shipped to backups (as the TablePushRequest it stands for, built only
  // then), counted and traced as TablePush.
  absl::Status PushTableRows(const TableRowsView& push, uint64_t client_id, uint64_t sequence);
  // The TablePull control method for a read without a worker (it never
  // waits) on a view, the rows where `out` says (Tables::PullRows); counted
  // as TablePull.
  absl::Status PullTableRows(const TableRowsView& pull, Tables::RowsOut out);

  // ---- lifecycle and what a Server reads ---------------------------------
  // While not serving (a server still claiming its index or loading its
  // checkpoint) every call but GetStats, TableStats and ListWorkers fails
  // with UNAVAILABLE, which clients retry. A dispatcher starts serving.
  void SetServing(bool serving) { serving_.store(serving, std::memory_order_release); }
  absl::Status CheckServing() const;
  void SetIndex(uint32_t index) { index_.store(index, std::memory_order_relaxed); }
  // From now on writes must pass `fence` (not owned; outlives the
  // dispatcher), and nothing is served once it stepped down. Null: none
  // (no etcd: nothing else can hold the shard).
  void SetFence(Fence* fence) { fence_.store(fence, std::memory_order_release); }
  Fence* fence() const { return fence_.load(std::memory_order_acquire); }  // null: none
  // From now on every block of a bulk push or read, and every key of a
  // TablePush or TablePull, must be this server's under `gate` (not owned;
  // outlives the dispatcher): PlacementMoved otherwise, nothing applied.
  // Null (the default): not checked.
  void SetPlacementGate(const PlacementGate* gate) {
    placement_gate_.store(gate, std::memory_order_release);
  }
  // From now on every request's stages are recorded in `recorder` (not
  // owned; outlives the dispatcher's calls; null: off), and so are the bulk
  // listener's (--trace_file, cc/trace).
  void SetTrace(trace::Recorder* recorder) { trace_.store(recorder, std::memory_order_release); }
  trace::Recorder* trace() const { return trace_.load(std::memory_order_acquire); }
  // OK without a fence; the fence's verdict otherwise.
  absl::Status CheckWrite() const;
  // FAILED_PRECONDITION for a table whose state changes off the write path
  // (eviction, admission): a replicating server (a shipper set) refuses it.
  static absl::Status CheckReplicable(const v1::CreateTableRequest& request);
  uint32_t index() const { return index_.load(std::memory_order_relaxed); }
  // Where this server's /metrics page listens (host:port), for GetStats;
  // "": none.
  void SetMetricsAddress(std::string address) ABSL_LOCKS_EXCLUDED(metrics_address_mu_);

  // The shard's whole state as a checkpoint holds it (docs/checkpoint-format.md):
  // the store's blocks, the applied request ids and the tables (rows,
  // clocks, held-back adds) as extensions, taken with apply_mu() held
  // exclusively so that the store and the applied ids agree. With
  // `keep_keys`, only the table keys it accepts (Tables::SaveTo).
  absl::StatusOr<StoreSnapshot> Snapshot(const Tables::KeyKeep& keep_keys = nullptr);
  // Pushes with a request id (client_id, sequence) are applied at most once.
  AppliedSequences& applied() { return applied_; }
  // Held shared while a push is applied and its id recorded; a checkpoint
  // holds it exclusively so that the store and applied() agree.
  absl::Mutex& apply_mu() { return apply_mu_; }
  uint64_t replies_dropped() const { return replies_dropped_.load(); }
  uint64_t duplicates_ignored() const { return duplicates_.load(); }
  void SetCheckpointSequence(uint64_t sequence) { checkpoint_sequence_.store(sequence); }
  // Bytes of replies built but not yet sent (see max_reply_bytes_in_flight).
  const ReplyBudget& reply_budget() const { return reply_budget_; }
  // What GetStats answers (the counters the metrics export too).
  void FillStats(v1::ServerStats* out) const;
  // Per-method counts, bytes and latency of every request answered.
  const RequestMetrics& request_metrics() const { return request_metrics_; }

 private:
  // Push; `ship` (null: none) as in the overload that takes it; `applied`
  // as PushStreaming's.
  absl::Status PushShipping(const RequestId& id, absl::Span<const GradientView> grads,
                            const absl::FunctionRef<void()>* ship,
                            absl::FunctionRef<void(size_t)> applied);
  // Adds control method `name` answered by `run` (which returns its status);
  // Wait adds one that waits, returning its CancelWait.
  template <typename Request, typename Response>
  void Sync(const char* name, std::function<absl::Status(const Request&, Response*)> run,
            bool needs_serving = true);
  template <typename Request, typename Response>
  void Wait(const char* name,
            std::function<CancelWait(const Request&, Response*, absl::Time, WaitDone)> run);
  // The entry of `name`, checked against the proto's declaration.
  Method& Add(const char* name, bool needs_serving, const google::protobuf::Descriptor* request,
              const google::protobuf::Descriptor* response);
  void AddControlMethods();

  // Runs `apply` unless the push (client_id, sequence) was applied before;
  // client_id 0 is not tracked. `apply` sets `past_checks` once the push
  // passed its checks (ParameterStore::ApplyGradients' `checked`); an error
  // before that is a refusal that applied nothing, and leaves the id unused:
  // a retry is checked again and gets the same answer, on this replica or
  // on a backup that took the shard over (docs/replication.md, "A refused
  // push"). An error past the checks (a device error) uses the id up.
  // `done`, wrapped to record the call's span (from now until it is
  // called): on this thread's track when it is called before `*returned`
  // is set (the call did not wait), else on the "waiting calls" lanes.
  Done TraceCall(trace::Recorder* recorder, const Method& method,
                 const google::protobuf::Message& request,
                 std::shared_ptr<std::atomic<bool>> returned, Done done);
  absl::Status ApplyOnce(uint64_t client_id, uint64_t sequence,
                         absl::FunctionRef<absl::Status(bool& past_checks)> apply);
  // Read, adding the content bytes delivered to `sent`.
  absl::Status ReadBlocks(absl::Span<const v1::ParamRef> refs, BlockReader reader,
                          uint64_t* sent);
  absl::Status GetParam(const v1::GetParamRequest& request, v1::GetParamResponse* response,
                        ReplyHold* reply);
  // OK when every key of `keys` (a table request's encoded keys) of table
  // `table` may be written (read) here under the placement gate (none: OK).
  // A table not held here while the placement is moving: UNAVAILABLE (it
  // may be handed over); bad keys or an unknown table otherwise: OK, for
  // the table's own call to refuse.
  // `status` of a read of `ref` from the store, except that a block this
  // server no longer holds because it handed it over and dropped it
  // (NOT_FOUND, BlockMover::DropHandedOver) gets the gate's redirect.
  absl::Status RedirectDropped(absl::Status status, const v1::ParamRef& ref) const;
  absl::Status CheckTableKeys(absl::string_view table, absl::string_view keys, bool write) const;
  // The same for keys already decoded (a table frame's).
  absl::Status CheckTableKeys(absl::string_view table, absl::Span<const uint64_t> keys,
                              bool write) const;
  // Whether a table missing here may still be handed over (moving).
  bool TableMayArrive() const;

  ParameterStore* const store_;
  Tables* const tables_;
  std::atomic<uint32_t> index_;
  const DispatcherHooks hooks_;
  const absl::Time started_ = absl::Now();
  std::atomic<bool> serving_{true};
  std::atomic<Fence*> fence_{nullptr};
  std::atomic<const PlacementGate*> placement_gate_{nullptr};
  std::atomic<trace::Recorder*> trace_{nullptr};
  trace::Lanes waiting_lanes_{uint32_t{1} << 30, "waiting calls"};
  std::atomic<WriteShipper*> shipper_{nullptr};
  AppliedSequences applied_;
  absl::Mutex apply_mu_;
  std::atomic<uint64_t> pushes_applied_{0};
  std::atomic<uint64_t> replies_dropped_{0};
  std::atomic<uint64_t> duplicates_{0};
  std::atomic<uint64_t> checkpoint_sequence_{0};
  ReplyBudget reply_budget_;
  mutable absl::Mutex metrics_address_mu_;
  std::string metrics_address_ ABSL_GUARDED_BY(metrics_address_mu_);
  RequestMetrics request_metrics_;  // fixed after construction
  OpMetrics* push_metrics_ = nullptr;
  OpMetrics* read_metrics_ = nullptr;
  OpMetrics* table_push_metrics_ = nullptr;  // TablePush's and TablePull's
  OpMetrics* table_pull_metrics_ = nullptr;
  const google::protobuf::ServiceDescriptor* const service_;
  absl::flat_hash_map<std::string, Method> methods_;  // by short name; fixed after construction
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_DISPATCHER_H_
