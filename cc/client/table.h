// Table: a client's handle on one sparse embedding table or KV table spread
// over all servers (proto/pserver/v1/table.proto). KvWorker: one worker's
// view of a table under BSP/SSP/ASP, with its clock.
//
//   v1::TableConfig config;
//   config.set_dim(16);
//   config.mutable_initializer()->mutable_normal()->set_stddev(0.01);
//   config.mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.1);
//   PS_ASSIGN_OR_RETURN(Table emb, Table::Create(*client, "emb", config));
//   std::vector<float> rows(keys.size() * 16);
//   PS_RETURN_IF_ERROR(emb.Pull<float>(keys, absl::MakeSpan(rows)));
//   PS_RETURN_IF_ERROR(emb.Push<float>(keys, grads));
//
//   // FlexPS-style KV table under SSP(2): reads wait for slow workers.
//   config.mutable_optimizer()->mutable_add();
//   config.mutable_consistency()->set_model(v1::Consistency::SSP);
//   config.mutable_consistency()->set_staleness(2);
//   PS_ASSIGN_OR_RETURN(auto worker, KvWorker::Join(kv, "worker-3"));
//   PS_RETURN_IF_ERROR(worker->Get<float>(keys, absl::MakeSpan(vals)));
//   PS_RETURN_IF_ERROR(worker->Add<float>(keys, deltas));
//   PS_RETURN_IF_ERROR(worker->Clock());
//
// Partitioning: a key lives on one server, chosen by the table's
// Partitioning (hash or key range). A call splits its keys per server, sends
// the parts in parallel (retried like every client call, and pushes applied
// exactly once) and puts the rows back in the order asked.
//
// Thread-safe: a Table is a small value that may be copied and used from many
// threads; it must not outlive its Client. A KvWorker is one worker: use it
// from one thread at a time.
#ifndef PSERVER_CC_CLIENT_TABLE_H_
#define PSERVER_CC_CLIENT_TABLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "cc/client/client.h"
#include "cc/client/table_compressor.h"
#include "cc/core/element_type.h"
#include "cc/core/status_macros.h"
#include "pserver/v1/table.pb.h"

namespace pserver {

class Table {
 public:
  // Creates table `name` on every server; again with the same config it
  // opens the existing table. INVALID_ARGUMENT for a bad config (checked on
  // the client before anything is sent, naming the field); ALREADY_EXISTS
  // when a table of that name has another config.
  static absl::StatusOr<Table> Create(Client& client, std::string name,
                                      const v1::TableConfig& config, const CallOptions& call = {});

  const std::string& name() const { return name_; }
  const v1::TableConfig& config() const { return config_; }
  uint32_t dim() const { return config_.dim(); }
  ElementType element_type() const { return config_.element_type(); }
  size_t row_bytes() const;
  // The server that holds `key`; INVALID_ARGUMENT for a key outside a range
  // partitioning's [range_begin, range_end).
  absl::StatusOr<int> ServerOf(uint64_t key) const;

  // Writes the rows of `keys` into `out` (keys.size() * row_bytes() bytes),
  // in the order of `keys`; rows are created on first touch. `worker` and
  // `clock` make it a consistent read (KvWorker uses them).
  absl::Status Pull(absl::Span<const uint64_t> keys, absl::Span<char> out,
                    const CallOptions& call = {}) const;
  // Applies `grads` (keys.size() * row_bytes() bytes): the table's
  // optimizer, or for a KV table an add. Duplicate keys are summed.
  absl::Status Push(absl::Span<const uint64_t> keys, absl::string_view grads,
                    const CallOptions& call = {}) const;

  // Asynchronous forms (cc/client/ticket.h): return a ticket at once. They
  // BORROW `keys`, `out` and `grads`: keep them alive and unchanged until
  // the ticket is done; `out` holds the rows once it succeeded. Between
  // processes their requests go out from the calling thread and hold no
  // thread while in flight: k tickets are k requests outstanding at once
  // (per server part), each with its own status; a failed attempt is
  // retried on the client's executor (a push with the same ids: applied
  // once). On the embedded cluster (in-process transports) the call runs
  // on the calling thread, and the ticket is done when it returns (but for
  // a table with a custom handler, which may block: on the executor).
  // Tickets in flight together are not ordered with each other.
  Ticket PullAsync(absl::Span<const uint64_t> keys, absl::Span<char> out,
                   const CallOptions& call = {}) const;
  Ticket PushAsync(absl::Span<const uint64_t> keys, absl::string_view grads,
                   const CallOptions& call = {}) const;

  // Typed forms: T must be the table's element type.
  template <typename T>
  absl::Status Pull(absl::Span<const uint64_t> keys, absl::Span<T> out,
                    const CallOptions& call = {}) const {
    PS_RETURN_IF_ERROR(CheckType(kElementTypeOf<T>));
    return Pull(keys, absl::Span<char>(reinterpret_cast<char*>(out.data()), out.size() * sizeof(T)),
                call);
  }
  template <typename T>
  absl::Status Push(absl::Span<const uint64_t> keys, absl::Span<const T> grads,
                    const CallOptions& call = {}) const {
    PS_RETURN_IF_ERROR(CheckType(kElementTypeOf<T>));
    return Push(
        keys,
        absl::string_view(reinterpret_cast<const char*>(grads.data()), grads.size() * sizeof(T)),
        call);
  }

  // Compression on the wire (TableConfig.wire_compression): null if none.
  // Copies of this Table share it (and its top-k residuals).
  const TableCompressor* compressor() const { return compressor_.get(); }

  // The table's stats on every server, in index order.
  absl::StatusOr<std::vector<v1::TableStats>> Stats(const CallOptions& call = {}) const;

 private:
  friend class KvWorker;
  Table(Client* client, std::string name, v1::TableConfig config);

  absl::Status CheckType(ElementType type) const;
  // Splits keys per server into requests: each server's keys contiguous,
  // with the positions they came from.
  struct Split;
  // The keys at `positions` (null: all of them), each to its server under
  // routing.route, or routing.target once `by_target` (one flag per key)
  // says an old owner refused it.
  absl::StatusOr<Split> SplitKeys(absl::Span<const uint64_t> keys,
                                  const std::vector<size_t>* positions,
                                  const Client::Routing& routing,
                                  const std::vector<bool>& by_target) const;
  // Sends `keys` in rounds (live moves: "Following PlacementMoved" in
  // client.h): `round` sends one split's parts and stores each part an old
  // owner refused with PlacementMoved in its `moved` slot (see
  // Client::RunWithRetries); the keys of refused parts go again, as new
  // requests, to their owners under the placement named.
  // With `first`, round 1 sends that split, made under `*routing`.
  using Round = std::function<absl::Status(const Split& split, std::vector<absl::Status>* moved)>;
  absl::Status RunRouted(absl::Span<const uint64_t> keys, absl::Time deadline, const Round& round,
                         const Client::Routing* routing = nullptr,
                         const Split* first = nullptr) const;
  // The requests of one round of a pull or a push (one per part of its
  // split), and what to do once they are answered.
  class Requests;
  class PullRequests;
  class PushRequests;
  // Sends `requests` (the parts of `split`) with retries; with `first`,
  // their first attempt was made already (Client::StartFirstAttempt).
  absl::Status RunRound(Requests& requests, const Split& split, absl::Time deadline,
                        TraceRecorder* trace, std::vector<absl::Status>* moved,
                        const Client::FirstAttempt* first = nullptr) const;
  // PullAsync and PushAsync without a thread per call (see there); an
  // async call's state.
  struct AsyncCall;
  Ticket StartAsync(absl::Span<const uint64_t> keys, absl::Span<char> out,
                    absl::string_view grads, bool push, const CallOptions& call) const;
  absl::Status CheckPullBytes(absl::Span<const uint64_t> keys, absl::Span<char> out) const;
  absl::Status CheckPushBytes(absl::Span<const uint64_t> keys, absl::string_view grads) const;
  // Writes the rows server returned for part `i` of `split` (`values`, in
  // `content_type`) where they go in `out`. DATA_LOSS naming the server
  // when they are not that part's rows.
  absl::Status PlaceRows(const Split& split, size_t i, ElementType content_type,
                         absl::string_view values, absl::Span<char> out) const;
  absl::Status DoPull(absl::Span<const uint64_t> keys, absl::Span<char> out,
                      const std::string& worker, int64_t clock, const CallOptions& call) const;
  absl::Status DoPush(absl::Span<const uint64_t> keys, absl::string_view grads,
                      const std::string& worker, int64_t clock, const CallOptions& call) const;

  Client* client_;
  std::string name_;
  v1::TableConfig config_;
  std::shared_ptr<TableCompressor> compressor_;
};

// One worker of a table with clocks (FlexPS's KVClientTable): joins the
// table's clocks on every server, reads at its clock (waiting as the
// table's consistency says), writes, and advances its clock. Leaves the
// table when destroyed (best effort; Leave reports errors).
class KvWorker {
 public:
  // Registers `worker` (non-empty, unique per table) on every server, at the
  // slowest registered worker's clock.
  static absl::StatusOr<std::unique_ptr<KvWorker>> Join(const Table& table, std::string worker,
                                                        const CallOptions& call = {});
  ~KvWorker();
  KvWorker(const KvWorker&) = delete;
  KvWorker& operator=(const KvWorker&) = delete;

  const std::string& id() const { return worker_; }
  int64_t clock() const { return clock_; }
  const Table& table() const { return table_; }

  // Get waits (on the servers) until every worker has reached clock() -
  // staleness; DEADLINE_EXCEEDED names the workers holding it back. Under BSP
  // an Add is applied once every worker has passed the clock it was made at,
  // so a Get at clock c sees exactly the adds of clocks before c.
  absl::Status Get(absl::Span<const uint64_t> keys, absl::Span<char> out,
                   const CallOptions& call = {});
  absl::Status Add(absl::Span<const uint64_t> keys, absl::string_view vals,
                   const CallOptions& call = {});
  template <typename T>
  absl::Status Get(absl::Span<const uint64_t> keys, absl::Span<T> out,
                   const CallOptions& call = {}) {
    PS_RETURN_IF_ERROR(table_.CheckType(kElementTypeOf<T>));
    return Get(keys, absl::Span<char>(reinterpret_cast<char*>(out.data()), out.size() * sizeof(T)),
               call);
  }
  template <typename T>
  absl::Status Add(absl::Span<const uint64_t> keys, absl::Span<const T> vals,
                   const CallOptions& call = {}) {
    PS_RETURN_IF_ERROR(table_.CheckType(kElementTypeOf<T>));
    return Add(
        keys,
        absl::string_view(reinterpret_cast<const char*>(vals.data()), vals.size() * sizeof(T)),
        call);
  }
  // Chunk forms: chunk c is keys [c * chunk_size, (c + 1) * chunk_size) of
  // the table's config; `out`/`vals` hold chunk_ids.size() * chunk_size rows.
  absl::Status GetChunk(absl::Span<const uint64_t> chunk_ids, absl::Span<char> out,
                        const CallOptions& call = {});
  absl::Status AddChunk(absl::Span<const uint64_t> chunk_ids, absl::string_view vals,
                        const CallOptions& call = {});

  // Asynchronous forms (cc/client/ticket.h), at the worker's clock when
  // called; they BORROW `keys`, `out` and `vals` until the ticket is done.
  Ticket GetAsync(absl::Span<const uint64_t> keys, absl::Span<char> out,
                  const CallOptions& call = {});
  Ticket AddAsync(absl::Span<const uint64_t> keys, absl::string_view vals,
                  const CallOptions& call = {});

  // Advances this worker's clock by one on every server, after the adds it
  // made asynchronously have completed (the first of them to fail fails the
  // Clock, which then does not advance).
  absl::Status Clock(const CallOptions& call = {});
  // Unregisters from every server; later calls fail with FAILED_PRECONDITION.
  absl::Status Leave(const CallOptions& call = {});

 private:
  KvWorker(Table table, std::string worker, int64_t clock);
  absl::StatusOr<int64_t> ClockOp(v1::ClockRequest::Op op, const CallOptions& call) const;
  absl::Status CheckJoined() const;
  std::vector<uint64_t> ChunkKeys(absl::Span<const uint64_t> chunk_ids) const;

  Table table_;
  std::string worker_;
  int64_t clock_;
  bool left_ = false;
  std::vector<Ticket> adds_in_flight_;  // AddAsync since the last Clock
};

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_TABLE_H_
