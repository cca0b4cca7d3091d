// Tables: one server's sparse and KV tables, their workers' clocks, and the
// rendezvous slots of collectives. The gRPC service and the in-process
// transport both answer table and collective requests through this class, so
// the two paths cannot drift apart.
//
//   Tables tables;
//   v1::CreateTableRequest create;
//   create.set_name("emb");
//   create.mutable_config()->set_dim(16);
//   PS_RETURN_IF_ERROR(tables.Create(create));
//   v1::TablePullResponse rows;
//   PS_RETURN_IF_ERROR(tables.Pull(pull_request, &rows, deadline));
//
// Consistency: a pull that names a worker and its clock c waits, under BSP
// (staleness 0) or SSP (staleness s), until every registered worker of the
// table has reached clock c - s, or the deadline; ASP never waits. Waiting
// holds no thread with the asynchronous forms (PullAsync, BarrierAsync, ...):
// a released read runs on the thread of the clock change that let it
// through, after that change's held-back adds were applied.
//
// Reads never create rows: a pull of a key without a row returns the
// initializer's value (see SparseTable::Pull), so reads cannot grow a table.
//
// Extension point: SetHandler installs a TableHandler that receives every
// pull and push of one table on this server (ps-lite's request handle), and
// may answer it itself or hand it on to the table.
//
// Thread-safe.
#ifndef PSERVER_CC_CORE_TABLES_H_
#define PSERVER_CC_CORE_TABLES_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cc/core/collectives.h"
#include "cc/core/memory_budget.h"
#include "cc/core/sparse_table.h"
#include "cc/core/table_keys.h"
#include "cc/core/waiters.h"
#include "cc/core/worker_clocks.h"
#include "pserver/v1/service.pb.h"
#include "pserver/v1/table.pb.h"

namespace pserver {

// Custom request handling for one table. The defaults do what the table
// does on its own; override either to change it (e.g. keep only the maximum
// of the pushed values, count or filter keys, compute rows on the fly).
// Called from many threads at once; `table` is the table's own storage.
class TableHandler {
 public:
  virtual ~TableHandler() = default;
  // Fills `out` (keys.size() * table.row_bytes() bytes) with the rows of `keys`.
  virtual absl::Status Pull(SparseTable& table, absl::Span<const uint64_t> keys,
                            absl::Span<char> out);
  // Applies `values` (keys.size() * table.row_bytes() bytes) for `keys`.
  virtual absl::Status Push(SparseTable& table, absl::Span<const uint64_t> keys,
                            absl::string_view values);
};

// One pull or push of a table as borrowed views: what a TablePullRequest /
// TablePushRequest carries, without the message (the bulk channel's table
// frames, cc/rpc/table_frame.h, are read into one in place).
struct TableRowsView {
  absl::string_view table;
  absl::Span<const uint64_t> keys;
  // A push's rows, in `value_type`; empty for a pull.
  absl::string_view values;
  // A push: the type `values` travel in; a pull: the type its rows are asked
  // in (TableConfig.wire_compression). Unset: as stored.
  ElementType value_type = v1::ELEMENT_TYPE_UNSPECIFIED;
  absl::string_view worker;  // a push's (BSP holds adds back by clock)
  int64_t clock = 0;
};

struct TablesOptions {
  SparseTableOptions table;  // time source of every table (tests inject one)
  // How often expired rows (Eviction.ttl_seconds) are swept: on a table's
  // next request once this much time has passed since its last sweep.
  absl::Duration sweep_interval = absl::Seconds(1);
  // Bytes that waiting collectives may hold in all
  // (Collectives::Options::max_held_bytes, --max_collective_bytes).
  uint64_t max_collective_bytes = uint64_t{1} << 30;
  // Workers joined to one table's clocks at once (--max_workers_per_table).
  size_t max_workers_per_table = WorkerClocks::kDefaultMaxWorkers;
  // Bytes (keys and values) of BSP adds one table holds back for slower
  // workers (--max_held_add_bytes); past it a push is UNAVAILABLE ("retry"),
  // one add larger than it RESOURCE_EXHAUSTED.
  uint64_t max_held_add_bytes = uint64_t{1} << 30;
  // Tables Create may make (--max_tables); past it Create is
  // RESOURCE_EXHAUSTED naming the flag and nothing is created. Tables a
  // checkpoint or a live move brings in are taken whole.
  size_t max_tables = kDefaultMaxTables;
  static constexpr size_t kDefaultMaxTables = 4096;
  // Bytes of rows (SparseTable::row_budget_bytes each) all tables together
  // may create (--max_table_row_bytes); past it a push is RESOURCE_EXHAUSTED
  // naming the table and the flag, nothing of it applied. Rows a checkpoint
  // or a live move brings in are taken whole; evicted, erased and dropped
  // rows give theirs back.
  uint64_t max_row_bytes = MemoryBudget::kUnlimited;
};

class Tables {
 public:
  explicit Tables(TablesOptions options = {});
  ~Tables();
  Tables(const Tables&) = delete;
  Tables& operator=(const Tables&) = delete;

  // Creates a table. Again with an equal config: OK, nothing changes; with
  // another config: ALREADY_EXISTS. INVALID_ARGUMENT for an empty name or a
  // bad config (naming the field); RESOURCE_EXHAUSTED naming --max_tables
  // when this server holds max_tables tables already (nothing created).
  absl::Status Create(const v1::CreateTableRequest& request);

  // NOT_FOUND "no table 'x'" for an unknown table; INVALID_ARGUMENT for keys
  // that are not whole uint64s or values of the wrong size; DEADLINE_EXCEEDED
  // naming the workers a consistent read waited for.
  absl::Status Pull(const v1::TablePullRequest& request, v1::TablePullResponse* response,
                    absl::Time deadline);
  // Pull without a thread while it waits for clocks: `done` gets the result
  // (possibly before this returns); `request` and `response` must stay valid
  // until then. The CancelWait completes a pull still waiting with
  // CANCELLED; call it only while the Tables exists.
  CancelWait PullAsync(const v1::TablePullRequest& request, v1::TablePullResponse* response,
                       absl::Time deadline, WaitDone done);
  absl::Status Push(const v1::TablePushRequest& request, v1::TablePushResponse* response);

  // Pull and Push on views, no message (the same checks, handler and
  // errors). Where a read's rows go: room for `bytes` bytes of rows in
  // `content_type` (unset: as stored), or an error that ends the read (a
  // reply that does not fit).
  using RowsOut = absl::FunctionRef<absl::StatusOr<absl::Span<char>>(size_t bytes,
                                                                      ElementType content_type)>;
  // Reads now, without a worker: it never waits for clocks (a consistent
  // read is a Pull with a request).
  absl::Status PullRows(const TableRowsView& pull, RowsOut out);
  absl::Status PushRows(const TableRowsView& push);
  absl::StatusOr<int64_t> Clock(const v1::ClockRequest& request);
  void Stats(v1::TableStatsResponse* response) const;
  // Every table's registered workers and their clocks (sorted by worker id),
  // by table name: what the metrics show as clock lag per worker.
  using Clocks = std::vector<std::pair<std::string, int64_t>>;
  std::vector<std::pair<std::string, Clocks>> AllWorkerClocks() const;

  absl::Status Barrier(const v1::BarrierRequest& request, absl::Time deadline);
  absl::Status AllReduce(const v1::AllReduceRequest& request, v1::AllReduceResponse* response,
                         absl::Time deadline);
  absl::Status Broadcast(const v1::BroadcastRequest& request, v1::BroadcastResponse* response,
                         absl::Time deadline);
  // The same without a thread while they wait (see Collectives); the
  // request and response must stay valid until `done` runs.
  CancelWait BarrierAsync(const v1::BarrierRequest& request, absl::Time deadline, WaitDone done);
  CancelWait AllReduceAsync(const v1::AllReduceRequest& request, v1::AllReduceResponse* response,
                            absl::Time deadline, WaitDone done);
  CancelWait BroadcastAsync(const v1::BroadcastRequest& request, v1::BroadcastResponse* response,
                            absl::Time deadline, WaitDone done);

  // Routes table `name`'s pulls and pushes through `handler` (null: back to
  // the default). The table need not exist yet.
  void SetHandler(const std::string& name, std::shared_ptr<TableHandler> handler);
  // Whether table `name` has a handler of its own (SetHandler).
  bool HasHandler(absl::string_view name) const;

  // Sweeps expired rows of every table now; returns how many were evicted.
  size_t EvictExpired();

  // Checkpoints: every table as extension "table/<name>", its clocks as
  // "clocks/<name>" and its held-back BSP adds as "pending/<name>". With
  // `keep`, only the rows and held-back adds of the keys it accepts (a
  // server's checkpoint after a live move: the keys it owns now).
  using KeyKeep = std::function<bool(const std::string& table, const v1::TableConfig& config,
                                     uint64_t key)>;
  void SaveTo(std::map<std::string, std::string>* extensions,
              const KeyKeep& keep = nullptr) const;
  // Recreates the tables and clocks found in `extensions` (others are
  // ignored). FAILED_PRECONDITION if a table already exists; DATA_LOSS or
  // INVALID_ARGUMENT naming the extension that does not decode. All or nothing.
  // With `replace`, the tables held are replaced whole instead (a standby
  // loading a fresh copy of its shard).
  absl::Status RestoreFrom(const std::map<std::string, std::string>& extensions,
                           bool replace = false);

  // ---- live moves (docs/elastic.md, cc/server/move.h) ----
  // The (normalized) config of table `name`; NOT_FOUND "no table 'x'".
  absl::StatusOr<v1::TableConfig> ConfigOf(absl::string_view name) const;
  // Every table's name, sorted.
  std::vector<std::string> Names() const;
  // The part of table `name` whose keys `keep` accepts, as a checkpoint
  // holds a table (SaveTo's extensions): "table/<name>" (those rows with
  // their optimizer state and step counts, the keys awaiting admission and
  // the config), "pending/<name>" (the held-back BSP adds of those keys,
  // when there are any) and "clocks/<name>" (every worker's clock). Rows and
  // held-back adds are taken under the table's BSP lock, so that no clock
  // change falls between them. NOT_FOUND for an unknown table.
  struct Exported {
    uint64_t rows = 0;
    uint64_t bytes = 0;  // values and optimizer state of those rows
  };
  absl::StatusOr<Exported> ExportRows(const std::string& name, const SparseTable::KeyFilter& keep,
                                      std::map<std::string, std::string>* extensions) const;
  // Takes what ExportRows wrote for one table: a table not held here is
  // created with its config and clocks (a table held here keeps its own
  // clocks and must have the same config); the rows are added
  // (SparseTable::MergeRows); the held-back adds of a clock every worker
  // here has passed are applied at once, the others held back. `check`
  // vets every key (rows, admission keys, held-back adds) before anything
  // changes: its error is returned, nothing taken. The rows and held-back
  // adds of keys that `replaced` accepts are dropped first (a hand-over sent
  // again replaces the first). INVALID_ARGUMENT unless `extensions` holds
  // exactly one table; DATA_LOSS for bytes that do not decode. Returns the
  // rows taken.
  using KeyCheck = std::function<absl::Status(const std::string& table,
                                              const v1::TableConfig& config, uint64_t key)>;
  absl::StatusOr<uint64_t> ImportRows(const std::map<std::string, std::string>& extensions,
                                      const KeyCheck& check,
                                      const SparseTable::KeyFilter& replaced);

  // Drops the rows, keys awaiting admission and held-back BSP adds of the
  // keys of table `name` that `drop` accepts (a live move's old owner, once
  // the keys are handed over for good); the table, its config and its
  // worker clocks stay. Returns the rows dropped; NOT_FOUND for an unknown
  // table.
  absl::StatusOr<uint64_t> DropRows(const std::string& name, const SparseTable::KeyFilter& drop);

  // Wakes every waiting pull and collective with UNAVAILABLE.
  void Shutdown();

  // The bytes of rows held, against TablesOptions::max_row_bytes.
  const MemoryBudget& row_budget() const { return *options_.table.row_budget; }

  static constexpr absl::string_view kTablePrefix = "table/";
  static constexpr absl::string_view kClocksPrefix = "clocks/";
  static constexpr absl::string_view kPendingPrefix = "pending/";

 private:
  struct Entry {
    Entry(DeadlineTimer* timer, size_t max_workers) : clocks(std::string(), timer, max_workers) {}
    std::unique_ptr<SparseTable> table;
    WorkerClocks clocks;
    absl::Mutex sweep_mu;
    absl::Time last_sweep ABSL_GUARDED_BY(sweep_mu) = absl::InfinitePast();
    // BSP: adds held back by the clock they were made at. A clock change
    // applies the ones every worker has passed while holding bsp_mu
    // exclusively; consistent reads hold it shared, so a read that the
    // clock change let through sees those adds.
    absl::Mutex bsp_mu;
    std::map<int64_t, std::vector<v1::PendingAdds::Add>> pending ABSL_GUARDED_BY(bsp_mu);
    uint64_t pending_bytes ABSL_GUARDED_BY(bsp_mu) = 0;  // keys and values of `pending`
  };
  // Adds `add` to the entry's held-back adds, counting its bytes.
  static void Hold(Entry& entry, v1::PendingAdds::Add add)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(entry.bsp_mu);

  absl::StatusOr<std::shared_ptr<Entry>> Find(absl::string_view name) const;
  // OK when one more table fits under options_.max_tables; the refusal
  // naming `name` and the flag otherwise.
  absl::Status CheckRoomForTable(absl::string_view name) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ExportRows of `entry` (table `name`).
  static Exported ExportEntry(const std::string& name, Entry& entry,
                              const SparseTable::KeyFilter& keep,
                              std::map<std::string, std::string>* extensions);
  // Applies the adds of every clock below `min_clock` (every one when it is
  // negative: no worker) and drops them from `pending`.
  void ApplyPassed(Entry& entry, int64_t min_clock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(entry.bsp_mu);
  // Drops the held-back adds of the keys `drop` accepts.
  void DropPending(Entry& entry, const SparseTable::KeyFilter& drop)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(entry.bsp_mu);
  // Every table, by name. Lock order: an entry's bsp_mu before mu_.
  std::vector<std::pair<std::string, std::shared_ptr<Entry>>> Entries() const;
  std::shared_ptr<TableHandler> HandlerOf(absl::string_view name) const;
  void MaybeSweep(Entry& entry);
  absl::Status Apply(Entry& entry, absl::string_view name, absl::Span<const uint64_t> keys,
                     absl::string_view values);
  // Runs a clock change; the reads it lets through go to `released`.
  absl::StatusOr<int64_t> ChangeClock(Entry& entry, const v1::ClockRequest& request,
                                      Completions* released);
  // Reads `keys` of `entry` into the response (after any wait).
  absl::Status Read(Entry& entry, const v1::TablePullRequest& request,
                    absl::Span<const uint64_t> keys, v1::TablePullResponse* response,
                    int64_t received);
  // Reads `keys` of `entry` (table `name`) into `out`, in `wire_type`.
  absl::Status ReadRows(Entry& entry, absl::string_view name, absl::Span<const uint64_t> keys,
                        ElementType wire_type, RowsOut out);
  static bool HoldsAdds(const Entry& entry) {
    return entry.table->config().consistency().model() == v1::Consistency::BSP;
  }
  absl::Time Now() const { return options_.table.now(); }

  const TablesOptions options_;
  // The deadlines of every wait (clocks and collectives); destroyed last.
  DeadlineTimer timer_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Entry>> tables_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<TableHandler>> handlers_ ABSL_GUARDED_BY(mu_);
  Collectives collectives_;
};

}  // namespace pserver

#endif  // PSERVER_CC_CORE_TABLES_H_
