// SparseTable: one server's shard of a sparse embedding table (or of a KV
// table): uint64 keys to rows of `dim` float32/float64 values, created on
// first push from a deterministic initializer, updated by a per-row
// optimizer, evicted by TTL and capacity, admitted after N sightings.
// Schema and formulas: proto/pserver/v1/table.proto.
//
//   PS_ASSIGN_OR_RETURN(std::unique_ptr<SparseTable> table,
//                       SparseTable::Create("emb", config));
//   std::vector<float> rows(keys.size() * table->dim());
//   PS_RETURN_IF_ERROR(table->Pull(keys, absl::MakeSpan(
//       reinterpret_cast<char*>(rows.data()), rows.size() * sizeof(float))));
//   PS_RETURN_IF_ERROR(table->Push(keys, grad_bytes));  // keys.size() rows
//   table->EvictExpired();                             // now and then
//   std::string payload = table->Serialize();          // checkpoint extension
//
// Rows and gradients travel as little-endian bytes of the element type,
// keys.size() * row_bytes() of them, row i for keys[i].
//
// Rows are created by pushes only. A pull of a key without a row reads the
// initializer's value and creates nothing (the initializer is deterministic
// in (seed, key, column), so the row a later push creates starts from the
// same value): reads cannot grow a table, whatever keys they name.
//
// Admission (eviction.admission_count = N > 1): a key gets a row on its N-th
// sighting, which must be a push. One Pull or Push call sights each distinct
// key once, however often it lists it. A pull counts a sighting up to N - 1
// (never admitting), so the next push admits the key. Before admission a
// push's gradient for the key is dropped; the push that admits the key
// applies to the new row.
// Pending sighting counts are bounded: at most min(4 * capacity, 2^20) keys
// (2^20 without a capacity), split evenly over the internal shards; past the
// bound the key first seen longest ago is forgotten.
//
// Memory budget (SparseTableOptions::row_budget, shared by a server's
// tables: --max_table_row_bytes): every row counts row_budget_bytes()
// against it. A push that would create rows past it is RESOURCE_EXHAUSTED
// naming the table and the flag, and changes nothing (no row created, no
// gradient applied, no admission sighting counted). Only rows created are
// counted: a push reserves room for all its keys at once (one atomic
// operation per call) and gives back what it did not create; only when that
// does not fit does it count exactly, holding every shard's lock. Rows
// evicted or erased, and dropped tables, give their bytes back; rows a
// snapshot brings in (Deserialize, MergeRows) are taken whole.
//
// Eviction: a row is touched by every pull and push of it (options.now is read
// once per call). EvictExpired drops the rows untouched for longer than
// ttl_seconds; nothing expires until it runs (the server calls it now and
// then). With a capacity, inserting a row into a full table first evicts the
// least recently touched row of the whole table. Evicted rows that come back
// are recreated from the initializer, with fresh optimizer state and step 0.
//
// Concurrency and layout: rows live in 32 shards chosen by a hash of the key
// (independent of the hash that partitions keys over servers; the same hash,
// computed once per key and call, places the key in its shard), each with its
// own mutex and open-addressing table of fixed-size slots holding the key
// and its row inline (the key, the row's values, its optimizer state and its
// step count, contiguous), so that a lookup reads one control byte and the
// row's own cache line. A shard's slots of 2 MiB or more lie in transparent
// huge pages (cc/core/huge_page_memory.h: rounded up to whole 2 MiB pages,
// under 2 MiB more per shard), so that lookups at random seldom miss the TLB. A table with a capacity uses a single
// shard, so that LRU order and the capacity bound are exact for the whole
// table (its calls therefore run one at a time). Each row is read and updated
// atomically; a Pull or Push over many rows locks one shard at a time and is
// not one transaction: a concurrent Pull may see some rows of a Push updated
// and others not yet.
//
// Thread-safe: every method may be called concurrently from many threads.
#ifndef PSERVER_CC_CORE_SPARSE_TABLE_H_
#define PSERVER_CC_CORE_SPARSE_TABLE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cc/core/element_type.h"
#include "cc/core/memory_budget.h"
#include "cc/core/row_initializer.h"
#include "cc/core/row_optimizer.h"
#include "pserver/v1/table.pb.h"

namespace pserver {

struct SparseTableOptions {
  // Time source for TTL eviction and last-touch stamps; tests inject a fake.
  std::function<absl::Time()> now = [] { return absl::Now(); };
  // The bytes of rows this table may create, shared with the server's
  // other tables (--max_table_row_bytes); null: no bound.
  std::shared_ptr<MemoryBudget> row_budget;
};

// Thread-safe.
class SparseTable {
 public:
  // INVALID_ARGUMENT naming the field for a bad config (dim 0 or > 1<<20,
  // element type not FLOAT32/FLOAT64 — UNSPECIFIED means FLOAT32, uniform
  // low >= high, normal stddev < 0, non-finite values, negative ttl, bad
  // optimizer values). Messages start with "table '<name>': ".
  static absl::StatusOr<std::unique_ptr<SparseTable>> Create(std::string name,
                                                             const v1::TableConfig& config,
                                                             SparseTableOptions options = {});

  // The config as a table keeps it (element type UNSPECIFIED becomes
  // FLOAT32), so that equal configs compare equal.
  static v1::TableConfig NormalizedConfig(v1::TableConfig config);

  SparseTable(const SparseTable&) = delete;
  SparseTable& operator=(const SparseTable&) = delete;
  ~SparseTable();

  const std::string& name() const { return name_; }
  // As given (element type UNSPECIFIED normalized to FLOAT32).
  const v1::TableConfig& config() const { return config_; }
  uint32_t dim() const { return dim_; }
  ElementType element_type() const { return config_.element_type(); }
  size_t row_bytes() const { return row_bytes_; }  // dim * element size
  // Optimizer state values per row (see RowOptimizer::state_per_row).
  uint32_t state_per_row() const { return state_per_row_; }
  // What one row counts against SparseTableOptions::row_budget: its slot
  // (key, values, optimizer state, step count) and the slot's bookkeeping
  // (LRU links and stamp, control byte). The slot arrays themselves hold
  // 8/7 to 16/7 slots per row (they double when 7/8 full).
  size_t row_budget_bytes() const { return row_budget_bytes_; }

  // Writes keys.size() rows to `out` (exactly keys.size() * row_bytes()
  // bytes, else INVALID_ARGUMENT naming both sizes, nothing changes) in the
  // order of `keys` (duplicates allowed). A key without a row reads the
  // initializer's value; no row is created (and nothing evicted). A key not
  // yet admitted (admission_count) counts a sighting, short of admission.
  // Touches the last-use time of the rows read.
  absl::Status Pull(absl::Span<const uint64_t> keys, absl::Span<char> out);

  // `grads`: keys.size() * row_bytes() bytes (else INVALID_ARGUMENT, nothing
  // changes). Duplicate keys within the call are summed (in double), then
  // each distinct row's optimizer runs once with the summed gradient.
  // Not-yet-admitted keys count a sighting; their gradient is dropped.
  // Non-finite gradient values (or sums) -> INVALID_ARGUMENT naming the key,
  // nothing applied (everything is checked before anything is applied).
  absl::Status Push(absl::Span<const uint64_t> keys, absl::string_view grads);

  // Evicts rows untouched for longer than eviction.ttl_seconds (none without
  // a TTL). Returns how many.
  size_t EvictExpired();

  // The initializer's value of `key` (row_bytes() bytes into out; a shorter
  // `out` gets as many whole values as fit).
  void InitialRow(uint64_t key, absl::Span<char> out) const;

  // name, rows, bytes (values + optimizer state of held rows), evictions,
  // pending_keys, keys_pulled, keys_pushed (keys as listed in accepted
  // calls, duplicates included), admissions and admission_refusals (a push's
  // sighting of a key short of admission). Leaves min_clock/workers unset.
  v1::TableStats Stats() const;

  // Checkpoint payload: a serialized v1::SparseTableSnapshot of every row
  // (values, optimizer state, step counts), admission counters and counters.
  // Consistent per row (shards are copied one after another). Rows are
  // written least recently touched first, so a restored table keeps the LRU
  // order (last-touch times restart at the restoring clock's now).
  std::string Serialize() const { return SerializeRows(nullptr); }
  // The same for the rows (and keys awaiting admission) of the keys `keep`
  // accepts (null: all); the counters (evictions, keys pulled, ...) only
  // with all. A live move hands rows over this way (docs/elastic.md).
  using KeyFilter = std::function<bool(uint64_t key)>;
  std::string SerializeRows(const KeyFilter& keep) const;
  // Adds the rows and keys awaiting admission of a snapshot of this table
  // (SerializeRows of a table of the same config) to it, all or nothing:
  // DATA_LOSS for a snapshot whose arrays disagree, FAILED_PRECONDITION for
  // another config, a key this table holds already that `replaced` (may be
  // null) does not accept, or more rows than eviction.capacity. The rows and
  // admission keys `replaced` accepts are dropped first (a hand-over sent
  // again replaces the first copy). Counters are not added. Returns the rows
  // added.
  absl::StatusOr<uint64_t> MergeRows(const v1::SparseTableSnapshot& snap,
                                     const KeyFilter& replaced = nullptr);
  // Drops the rows and admission keys that `drop` accepts; returns the rows.
  uint64_t EraseRows(const KeyFilter& drop);

  // A table from Serialize()'s bytes. DATA_LOSS with a clear message for
  // bytes that do not parse or whose arrays disagree with rows/dim/
  // state_per_row; INVALID_ARGUMENT for a config Create would refuse.
  static absl::StatusOr<std::unique_ptr<SparseTable>> Deserialize(absl::string_view bytes,
                                                                  SparseTableOptions options = {});

 private:
  struct Shard;

  SparseTable(std::string name, v1::TableConfig config, SparseTableOptions options,
              RowInitializer initializer, RowOptimizer optimizer);

  struct KeyBatch;

  Shard& ShardOf(uint64_t key) const;
  // The shard of a key of KeyHash `hash`.
  size_t ShardIndexOf(uint64_t hash) const;
  // Checks `snap`'s arrays against its rows and this table's layout.
  absl::Status CheckSnapshot(const v1::SparseTableSnapshot& snap, const std::string& what) const;
  // Inserts `snap`'s rows and pending keys (checked): DATA_LOSS for a key
  // held already (rows inserted before it stay).
  absl::Status InsertRows(const v1::SparseTableSnapshot& snap, const std::string& what);
  // The bytes of `slot` in `shard` (values, then state); the caller holds shard.mu.
  char* SlotData(Shard& shard, uint32_t slot) const;
  uint64_t KeyOf(const Shard& shard, uint32_t slot) const;
  // The slot of `key`, kNil for none; the caller holds shard.mu.
  uint32_t FindSlot(const Shard& shard, uint64_t key) const;
  // The same for a key of KeyHash `hash`.
  uint32_t FindSlot(const Shard& shard, uint64_t key, uint64_t hash) const;
  // Starts fetching the memory FindSlot reads first for a key of KeyHash
  // `hash`, in whichever shard holds it; needs no lock.
  void PrefetchSlot(uint64_t hash) const;
  // Starts fetching the rest of `slot`'s row; the caller holds shard.mu.
  void PrefetchRow(Shard& shard, uint32_t slot) const;
  // Makes room for `more` new rows, so that creating them moves no slot
  // (rehashing, which moves every slot, happens here only).
  void ReserveSlots(Shard& shard, size_t more);
  // Moves every row into a table of `slots` slots (a power of two), keeping
  // the LRU order.
  void Rehash(Shard& shard, size_t slots);
  // The row's step count (updates applied), kept in its slot; the caller
  // holds shard.mu.
  uint64_t& StepOf(Shard& shard, uint32_t slot) const;
  int64_t NowNanos() const;
  // Orders positions 0..keys.size()-1 by shard, so each shard is locked
  // once, hashing each key once.
  void GroupByShard(absl::Span<const uint64_t> keys, KeyBatch& batch) const;
  // first[i] (keys.size() entries) = the position of the first listing of
  // keys[i] (i itself for a key not listed before). Returns whether any key
  // is listed twice.
  bool FirstOccurrences(absl::Span<const uint64_t> keys, const KeyBatch& batch,
                        uint32_t* first) const;

  // slots[j - begin] = the slot of the key at batch.order[j] in `shard`
  // (for j in [begin, end), one shard's run), kNil for none, prefetching
  // ahead; the caller holds shard.mu.
  void FindSlots(Shard& shard, absl::Span<const uint64_t> keys, const KeyBatch& batch,
                 uint32_t begin, uint32_t end, uint32_t* slots) const;

  template <typename T>
  absl::Status PullImpl(absl::Span<const uint64_t> keys, absl::Span<char> out);
  // Whether ForEachRow creates missing rows: a push does once the key is
  // admitted; a read never does (it only counts a sighting).
  enum class RowCreation { kOnAdmission, kNever };
  // Finds (or, with kOnAdmission, once admitted, creates) the row of each
  // key of `batch` (GroupByShard of `keys`), shard by shard under the
  // shard's lock, touching it: on_row(i, shard, slot) for keys[i] with a
  // row, on_pending(i) otherwise. With `first` (FirstOccurrences), only
  // each key's first listing.
  // Returns the rows created. With `locked`, the caller holds every
  // shard's lock (a push counting exactly what it creates).
  template <typename T, RowCreation kCreate, typename OnRow, typename OnPending>
  uint64_t ForEachRow(absl::Span<const uint64_t> keys, const KeyBatch& batch,
                      const uint32_t* first, bool locked, OnRow on_row, OnPending on_pending);
  // A push's room in the row budget (`first`: FirstOccurrences of `keys`):
  // a reservation for every key when it fits, else, with every shard's lock
  // taken (`*locked` set), the rows it would create exactly.
  // RESOURCE_EXHAUSTED naming the flag (no lock held) when they do not fit.
  absl::StatusOr<uint64_t> ReserveRows(absl::Span<const uint64_t> keys, const KeyBatch& batch,
                                       const uint32_t* first, bool* locked);
  // Whether a push sighting `key` (no row) now would create its row; the
  // caller holds shard.mu.
  bool WouldAdmit(const Shard& shard, uint64_t key) const;
  void LockAllShards();
  void UnlockAllShards();
  // INVALID_ARGUMENT naming the key, position and column of the first
  // non-finite gradient value.
  template <typename T>
  absl::Status CheckFinite(absl::Span<const uint64_t> keys, absl::string_view grads) const;
  template <typename T>
  absl::Status PushImpl(absl::Span<const uint64_t> keys, absl::string_view grads);

  // Shard helpers; the caller holds shard.mu.
  // Counts a sighting of a key without a row; true if the key is admitted
  // now (and the caller creates its row).
  bool Sight(Shard& shard, uint64_t key, uint64_t call);
  // Counts a read's sighting of a key without a row, up to one short of
  // admission.
  void SightForRead(Shard& shard, uint64_t key, uint64_t call);
  // Creates the row of `key` from the initializer, evicting the least
  // recently touched rows first if the table is at capacity; returns its slot.
  template <typename T>
  uint32_t CreateRow(Shard& shard, uint64_t key, int64_t now);
  uint32_t AllocSlot(Shard& shard, uint64_t key, int64_t now);
  void Touch(Shard& shard, uint32_t slot, int64_t now);
  void Unlink(Shard& shard, uint32_t slot);
  void LinkAtTail(Shard& shard, uint32_t slot, int64_t now);
  void RemoveRow(Shard& shard, uint32_t slot);
  void AddPending(Shard& shard, uint64_t key, uint32_t count, uint64_t call);

  const std::string name_;
  const v1::TableConfig config_;
  const SparseTableOptions options_;
  const RowInitializer initializer_;
  const RowOptimizer optimizer_;
  const uint32_t dim_;
  const size_t element_size_;
  const size_t row_bytes_;
  const uint32_t state_per_row_;
  const size_t step_offset_;  // values then state, rounded up to 8 bytes
  const size_t slot_bytes_;   // the key (uint64), then values, state, the step count (uint64)
  const size_t row_budget_bytes_;
  const uint64_t capacity_;   // 0: none
  const uint32_t admission_count_;
  const absl::Duration ttl_;  // zero: none
  const bool evicts_;         // a capacity or a TTL: rows keep LRU order
  const size_t num_shards_;
  const size_t pending_limit_per_shard_;
  std::unique_ptr<Shard[]> shards_;

  std::atomic<uint64_t> rows_{0};
  std::atomic<uint64_t> pending_{0};
  std::atomic<uint64_t> evictions_{0};
  std::atomic<uint64_t> admissions_{0};
  std::atomic<uint64_t> admission_refusals_{0};
  std::atomic<uint64_t> keys_pulled_{0};
  std::atomic<uint64_t> keys_pushed_{0};
  std::atomic<uint64_t> calls_{0};
};

}  // namespace pserver

#endif  // PSERVER_CC_CORE_SPARSE_TABLE_H_
