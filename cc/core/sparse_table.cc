#include "cc/core/sparse_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cc/core/compression.h"
#include "cc/core/huge_page_memory.h"
#include "cc/core/status_macros.h"
#include "google/protobuf/util/message_differencer.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "sparse_table.cc copies rows as little-endian bytes; port it for big-endian hosts"
#endif

namespace pserver {
namespace {

constexpr uint32_t kNil = std::numeric_limits<uint32_t>::max();
constexpr uint32_t kMaxDim = 1u << 20;
constexpr size_t kShards = 32;  // a power of two: the top 5 bits of a hash pick one
constexpr size_t kMaxPending = size_t{1} << 20;
// How many keys ahead a batch prefetches the rest of a found row.
constexpr size_t kLookAhead = 8;
// How many keys ahead a lookup prefetches the slot of a key's hash, across
// shards (the next shard's first keys are fetched while this one's last
// are found).
constexpr size_t kFindAhead = 32;
// Salts the key hash so that it is independent of the hash that spreads keys
// over servers (which would otherwise send one server's keys to a few
// shards, and crowd their row tables).
constexpr uint64_t kKeySalt = 0xBB67AE8584CAA73Bull;
// Control bytes of the row table: a full slot holds the low 7 bits of its
// key's hash.
constexpr uint8_t kEmpty = 0x80;
constexpr uint8_t kDeleted = 0xFE;
constexpr size_t kMinSlots = 16;

// One hash per key, computed once per call: its top 5 bits pick one of
// kShards shards, bits 7 and up the key's home slot in the shard's row table
// (disjoint from the shard bits for tables under 2^52 slots), its low 7 bits
// the slot's control byte.
uint64_t KeyHash(uint64_t key) { return SplitMix64(key ^ kKeySalt); }
size_t ShardOfHash(uint64_t hash) { return hash >> 59; }

struct RowMeta {
  int64_t touched = 0;   // unix nanos of the last pull or push
  uint32_t prev = kNil;  // LRU list: towards the least recently touched
  uint32_t next = kNil;
};

struct PendingEntry {
  uint32_t count = 0;      // sightings so far
  uint64_t seq = 0;        // when first seen (shard-local), for dropping the oldest
  uint64_t last_call = 0;  // the last Pull/Push that sighted it
};

template <typename T>
T LoadValue(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Copies a row of `bytes` bytes: small rows in fixed 16-byte moves that the
// compiler inlines (a call to memcpy per row costs more than the copy).
inline void CopyRow(char* dest, const char* src, size_t bytes) {
  if (bytes % 16 != 0 || bytes > 512) {
    std::memcpy(dest, src, bytes);
    return;
  }
  for (size_t offset = 0; offset < bytes; offset += 16) {
    std::memcpy(dest + offset, src + offset, 16);
  }
}

// n values left uninitialized, for arrays whose every entry is written
// before it is read.
template <typename T>
std::unique_ptr<T[]> UninitializedArray(size_t n) {
  return std::unique_ptr<T[]>(new T[n]);
}

void AppendU64(std::string* out, uint64_t v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

}  // namespace

// One shard of the rows: an open-addressing table (linear probing) whose
// slots hold the key and its row inline, so that finding a row reads the
// control byte and then the very cache line the row starts on. A slot is
// fixed-size: the key, the row's dim values, its optimizer state (in the
// element type) and its step count. Slots move only when the table is
// rehashed (growth, or too many deleted slots), which the caller arranges
// never to happen while it holds slot numbers (ReserveSlots).
struct alignas(64) SparseTable::Shard {
  absl::Mutex mu;
  // The row table as a lookup's prefetch sees it without the lock (set under
  // mu whenever the table is reallocated). A stale view only prefetches
  // memory that is no longer used, which is harmless: a prefetch never
  // faults.
  std::atomic<const uint8_t*> ctrl_view{nullptr};
  std::atomic<const char*> slots_view{nullptr};
  std::atomic<size_t> mask_view{0};
  std::vector<uint8_t> ctrl ABSL_GUARDED_BY(mu);  // per slot: kEmpty, kDeleted or a hash tag
  // ctrl.size() slots, in huge pages when large (found at random: fewer TLB misses)
  HugePageArray slots ABSL_GUARDED_BY(mu);
  std::vector<RowMeta> meta ABSL_GUARDED_BY(mu);      // per slot
  size_t used ABSL_GUARDED_BY(mu) = 0;     // full slots
  size_t deleted ABSL_GUARDED_BY(mu) = 0;  // kDeleted slots
  uint32_t head ABSL_GUARDED_BY(mu) = kNil;  // least recently touched
  uint32_t tail ABSL_GUARDED_BY(mu) = kNil;  // most recently touched
  absl::flat_hash_map<uint64_t, PendingEntry> pending ABSL_GUARDED_BY(mu);
  // (key, seq) in order of first sighting; entries whose seq no longer
  // matches `pending` are stale and skipped (and compacted away).
  std::deque<std::pair<uint64_t, uint64_t>> pending_order ABSL_GUARDED_BY(mu);
  uint64_t next_seq ABSL_GUARDED_BY(mu) = 0;
};

namespace {

size_t RoundUp8(size_t n) { return (n + 7) & ~size_t{7}; }

// Slots may be full or deleted up to 7/8 of the table.
bool Fits(size_t slots, size_t taken) { return taken <= slots - slots / 8; }

absl::Status ValidateConfig(const std::string& what, const v1::TableConfig& config) {
  if (config.dim() == 0 || config.dim() > kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": dim must be in [1, ", kMaxDim, "], got ", config.dim()));
  }
  if (config.element_type() != v1::FLOAT32 && config.element_type() != v1::FLOAT64) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": element_type must be FLOAT32 or FLOAT64, got ",
                     ElementTypeName(config.element_type())));
  }
  const double ttl = config.eviction().ttl_seconds();
  if (!std::isfinite(ttl) || ttl < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": eviction.ttl_seconds must be finite and >= 0, got ", ttl));
  }
  if (config.has_wire_compression()) {
    PS_RETURN_IF_ERROR(
        ValidateWireCompressionFor(config.wire_compression(), config.element_type(), what, "table"));
  }
  return absl::OkStatus();
}

}  // namespace

v1::TableConfig SparseTable::NormalizedConfig(v1::TableConfig config) {
  if (config.element_type() == v1::ELEMENT_TYPE_UNSPECIFIED) {
    config.set_element_type(v1::FLOAT32);
  }
  return config;
}

absl::StatusOr<std::unique_ptr<SparseTable>> SparseTable::Create(std::string name,
                                                                 const v1::TableConfig& config,
                                                                 SparseTableOptions options) {
  const std::string what = absl::StrCat("table '", name, "'");
  v1::TableConfig normalized = NormalizedConfig(config);
  PS_RETURN_IF_ERROR(ValidateConfig(what, normalized));
  PS_ASSIGN_OR_RETURN(RowInitializer initializer,
                      RowInitializer::Create(normalized.initializer(), what));
  PS_ASSIGN_OR_RETURN(RowOptimizer optimizer, RowOptimizer::Create(normalized.optimizer(), what));
  if (!options.now) options.now = [] { return absl::Now(); };
  return std::unique_ptr<SparseTable>(new SparseTable(std::move(name), std::move(normalized),
                                                      std::move(options), initializer, optimizer));
}

SparseTable::SparseTable(std::string name, v1::TableConfig config, SparseTableOptions options,
                         RowInitializer initializer, RowOptimizer optimizer)
    : name_(std::move(name)),
      config_(std::move(config)),
      options_(std::move(options)),
      initializer_(initializer),
      optimizer_(optimizer),
      dim_(config_.dim()),
      element_size_(ElementSize(config_.element_type())),
      row_bytes_(static_cast<size_t>(dim_) * element_size_),
      state_per_row_(optimizer_.state_per_row(dim_)),
      step_offset_(RoundUp8((static_cast<size_t>(dim_) + state_per_row_) * element_size_)),
      slot_bytes_(sizeof(uint64_t) + step_offset_ + sizeof(uint64_t)),
      row_budget_bytes_(slot_bytes_ + sizeof(RowMeta) + sizeof(uint8_t)),
      capacity_(config_.eviction().capacity()),
      admission_count_(config_.eviction().admission_count()),
      ttl_(absl::Seconds(config_.eviction().ttl_seconds())),
      evicts_(capacity_ > 0 || ttl_ > absl::ZeroDuration()),
      num_shards_(capacity_ > 0 ? 1 : kShards),
      pending_limit_per_shard_(std::max<size_t>(
          1, (capacity_ > 0 ? std::min<uint64_t>(capacity_, kMaxPending / 4) * 4 : kMaxPending) /
                 num_shards_)),
      shards_(new Shard[num_shards_]) {}

SparseTable::~SparseTable() {
  if (options_.row_budget != nullptr) {
    options_.row_budget->Release(rows_.load(std::memory_order_relaxed) * row_budget_bytes_);
  }
}

SparseTable::Shard& SparseTable::ShardOf(uint64_t key) const {
  return shards_[ShardIndexOf(KeyHash(key))];
}

size_t SparseTable::ShardIndexOf(uint64_t hash) const {
  return num_shards_ == 1 ? 0 : ShardOfHash(hash);
}

char* SparseTable::SlotData(Shard& shard, uint32_t slot) const {
  return shard.slots.get() + static_cast<size_t>(slot) * slot_bytes_ + sizeof(uint64_t);
}

uint64_t SparseTable::KeyOf(const Shard& shard, uint32_t slot) const {
  return LoadValue<uint64_t>(shard.slots.get() + static_cast<size_t>(slot) * slot_bytes_);
}

uint32_t SparseTable::FindSlot(const Shard& shard, uint64_t key) const {
  return FindSlot(shard, key, KeyHash(key));
}

uint32_t SparseTable::FindSlot(const Shard& shard, uint64_t key, uint64_t hash) const {
  if (shard.ctrl.empty()) return kNil;
  const size_t mask = shard.ctrl.size() - 1;
  const uint8_t tag = hash & 0x7F;
  for (size_t pos = (hash >> 7) & mask;; pos = (pos + 1) & mask) {
    const uint8_t c = shard.ctrl[pos];
    if (c == kEmpty) return kNil;
    if (c == tag && KeyOf(shard, static_cast<uint32_t>(pos)) == key) {
      return static_cast<uint32_t>(pos);
    }
  }
}

void SparseTable::PrefetchSlot(uint64_t hash) const {
  const Shard& shard = shards_[ShardIndexOf(hash)];
  const uint8_t* ctrl = shard.ctrl_view.load(std::memory_order_relaxed);
  if (ctrl == nullptr) return;
  const size_t pos = (hash >> 7) & shard.mask_view.load(std::memory_order_relaxed);
  __builtin_prefetch(ctrl + pos);
  __builtin_prefetch(shard.slots_view.load(std::memory_order_relaxed) + pos * slot_bytes_);
}

void SparseTable::PrefetchRow(Shard& shard, uint32_t slot) const {
  // Every cache line of the slot but the first (its key's, which the
  // lookup read), up to 8.
  const uintptr_t begin = reinterpret_cast<uintptr_t>(shard.slots.get()) +
                          static_cast<size_t>(slot) * slot_bytes_;
  const uintptr_t end = begin + std::min<size_t>(slot_bytes_, 8 * 64);
  for (uintptr_t line = (begin | 63) + 1; line < end; line += 64) {
    __builtin_prefetch(reinterpret_cast<const void*>(line));
  }
}

void SparseTable::ReserveSlots(Shard& shard, size_t more) {
  size_t size = std::max(kMinSlots, shard.ctrl.size());
  while (!Fits(size, shard.used + more)) size *= 2;
  // Rehashed when the table must grow, or when deleted slots crowd it.
  if (size == shard.ctrl.size() && Fits(size, shard.used + shard.deleted + more)) return;
  Rehash(shard, size);
}

namespace {

// The free (empty or deleted) slot where `key` goes in `ctrl`, and its
// control byte.
uint32_t Place(const std::vector<uint8_t>& ctrl, uint64_t key, uint8_t* tag) {
  const size_t mask = ctrl.size() - 1;
  const uint64_t hash = KeyHash(key);
  *tag = hash & 0x7F;
  size_t pos = (hash >> 7) & mask;
  while (ctrl[pos] != kEmpty && ctrl[pos] != kDeleted) pos = (pos + 1) & mask;
  return static_cast<uint32_t>(pos);
}

}  // namespace

void SparseTable::Rehash(Shard& shard, size_t size) {
  std::vector<uint8_t> ctrl(size, kEmpty);
  HugePageArray slots = AllocateHugePageArray(size * slot_bytes_);
  std::vector<RowMeta> meta(size);
  std::vector<uint32_t> moved(shard.ctrl.size(), kNil);  // old slot -> new slot
  for (size_t old = 0; old < shard.ctrl.size(); ++old) {
    if (shard.ctrl[old] & 0x80) continue;  // empty or deleted
    const uint64_t key = KeyOf(shard, static_cast<uint32_t>(old));
    uint8_t tag;
    const uint32_t pos = Place(ctrl, key, &tag);
    ctrl[pos] = tag;
    std::memcpy(slots.get() + pos * slot_bytes_, shard.slots.get() + old * slot_bytes_,
                slot_bytes_);
    meta[pos] = shard.meta[old];
    moved[old] = pos;
  }
  auto relink = [&](uint32_t slot) { return slot == kNil ? kNil : moved[slot]; };
  for (size_t old = 0; old < moved.size(); ++old) {
    if (moved[old] == kNil) continue;
    RowMeta& m = meta[moved[old]];
    m.prev = relink(m.prev);
    m.next = relink(m.next);
  }
  shard.head = relink(shard.head);
  shard.tail = relink(shard.tail);
  shard.ctrl.swap(ctrl);
  shard.slots.swap(slots);
  shard.meta.swap(meta);
  shard.deleted = 0;
  shard.ctrl_view.store(shard.ctrl.data(), std::memory_order_relaxed);
  shard.slots_view.store(shard.slots.get(), std::memory_order_relaxed);
  shard.mask_view.store(shard.ctrl.size() - 1, std::memory_order_relaxed);
}

uint64_t& SparseTable::StepOf(Shard& shard, uint32_t slot) const {
  return *reinterpret_cast<uint64_t*>(SlotData(shard, slot) + step_offset_);
}

int64_t SparseTable::NowNanos() const { return absl::ToUnixNanos(options_.now()); }

// ---- shard helpers (the caller holds shard.mu) -----------------------------

void SparseTable::Unlink(Shard& shard, uint32_t slot) {
  RowMeta& m = shard.meta[slot];
  if (m.prev != kNil)
    shard.meta[m.prev].next = m.next;
  else
    shard.head = m.next;
  if (m.next != kNil)
    shard.meta[m.next].prev = m.prev;
  else
    shard.tail = m.prev;
  m.prev = m.next = kNil;
}

void SparseTable::LinkAtTail(Shard& shard, uint32_t slot, int64_t now) {
  RowMeta& m = shard.meta[slot];
  // Stamps never go backwards along the list, so TTL eviction can stop at the
  // first row that has not expired (threads read the clock before locking, so
  // their stamps may arrive a little out of order).
  if (shard.tail != kNil) now = std::max(now, shard.meta[shard.tail].touched);
  m.touched = now;
  m.prev = shard.tail;
  m.next = kNil;
  if (shard.tail != kNil)
    shard.meta[shard.tail].next = slot;
  else
    shard.head = slot;
  shard.tail = slot;
}

void SparseTable::Touch(Shard& shard, uint32_t slot, int64_t now) {
  // Without a capacity or a TTL nothing reads the LRU order or the stamps
  // (a checkpoint's row order then does not matter): keep creation order.
  if (!evicts_) return;
  if (shard.tail == slot) {
    RowMeta& m = shard.meta[slot];
    m.touched = std::max(m.touched, now);
    return;
  }
  Unlink(shard, slot);
  LinkAtTail(shard, slot, now);
}

void SparseTable::RemoveRow(Shard& shard, uint32_t slot) {
  Unlink(shard, slot);
  shard.ctrl[slot] = kDeleted;
  --shard.used;
  ++shard.deleted;
  rows_.fetch_sub(1, std::memory_order_relaxed);
  if (options_.row_budget != nullptr) options_.row_budget->Release(row_budget_bytes_);
}

uint32_t SparseTable::AllocSlot(Shard& shard, uint64_t key, int64_t now) {
  ReserveSlots(shard, 1);  // a no-op when the caller reserved room
  uint8_t tag;
  const uint32_t slot = Place(shard.ctrl, key, &tag);
  if (shard.ctrl[slot] == kDeleted) --shard.deleted;
  shard.ctrl[slot] = tag;
  ++shard.used;
  std::memcpy(shard.slots.get() + static_cast<size_t>(slot) * slot_bytes_, &key, sizeof(key));
  shard.meta[slot] = RowMeta();
  StepOf(shard, slot) = 0;
  LinkAtTail(shard, slot, now);
  rows_.fetch_add(1, std::memory_order_relaxed);
  return slot;
}

template <typename T>
uint32_t SparseTable::CreateRow(Shard& shard, uint64_t key, int64_t now) {
  if (capacity_ > 0) {
    // A table with a capacity has one shard: its head is the whole table's
    // least recently touched row, and rows_ counts exactly this shard.
    while (rows_.load(std::memory_order_relaxed) >= capacity_ && shard.head != kNil) {
      RemoveRow(shard, shard.head);
      evictions_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  const uint32_t slot = AllocSlot(shard, key, now);
  T* row = reinterpret_cast<T*>(SlotData(shard, slot));
  initializer_.Fill<T>(key, absl::MakeSpan(row, dim_));
  optimizer_.InitState<T>(row + dim_, dim_);
  return slot;
}

void SparseTable::AddPending(Shard& shard, uint64_t key, uint32_t count, uint64_t call) {
  const uint64_t seq = shard.next_seq++;
  shard.pending[key] = PendingEntry{count, seq, call};
  shard.pending_order.emplace_back(key, seq);
  pending_.fetch_add(1, std::memory_order_relaxed);
  while (shard.pending.size() > pending_limit_per_shard_ && !shard.pending_order.empty()) {
    auto [old_key, old_seq] = shard.pending_order.front();
    shard.pending_order.pop_front();
    auto it = shard.pending.find(old_key);
    if (it != shard.pending.end() && it->second.seq == old_seq) {
      shard.pending.erase(it);
      pending_.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  // Admitted keys leave stale entries behind; drop them once they dominate.
  if (shard.pending_order.size() > 2 * shard.pending.size() + 64) {
    std::deque<std::pair<uint64_t, uint64_t>> live;
    for (const auto& [k, s] : shard.pending_order) {
      auto it = shard.pending.find(k);
      if (it != shard.pending.end() && it->second.seq == s) live.emplace_back(k, s);
    }
    shard.pending_order.swap(live);
  }
}

bool SparseTable::Sight(Shard& shard, uint64_t key, uint64_t call) {
  if (admission_count_ <= 1) return true;
  auto it = shard.pending.find(key);
  if (it == shard.pending.end()) {
    AddPending(shard, key, 1, call);
    admission_refusals_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  PendingEntry& e = it->second;
  if (e.last_call == call || ++e.count < admission_count_) {
    // Not this call's first sighting of the key, or short of admission.
    e.last_call = call;
    admission_refusals_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  e.last_call = call;
  shard.pending.erase(it);
  pending_.fetch_sub(1, std::memory_order_relaxed);
  admissions_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void SparseTable::SightForRead(Shard& shard, uint64_t key, uint64_t call) {
  if (admission_count_ <= 1) return;
  auto it = shard.pending.find(key);
  if (it == shard.pending.end()) {
    AddPending(shard, key, 1, call);
    return;
  }
  PendingEntry& e = it->second;
  if (e.last_call == call) return;  // this call has sighted it already
  e.last_call = call;
  // A read never admits: it counts up to one short of admission, and the
  // push that comes next admits the key.
  if (e.count + 1 < admission_count_) ++e.count;
}

// One call's keys grouped by shard: positions in shard order (stable), the
// key hash of each, and where each shard's run starts.
// The per-key arrays are left uninitialized (every entry is written before
// it is read): a std::vector would zero-fill them first, about 12
// instructions a key of a 16384-key call (callgrind).
struct SparseTable::KeyBatch {
  size_t size = 0;
  std::unique_ptr<uint32_t[]> order;   // positions of `keys`, shard by shard
  std::unique_ptr<uint64_t[]> hashes;  // hashes[j] = KeyHash(keys[order[j]])
  std::vector<uint32_t> starts;        // shard s: order[starts[s] .. starts[s + 1])
};

// A stable counting sort by shard, hashing each key once.
void SparseTable::GroupByShard(absl::Span<const uint64_t> keys, KeyBatch& batch) const {
  const size_t n = keys.size();
  batch.size = n;
  batch.order = UninitializedArray<uint32_t>(n);
  batch.hashes = UninitializedArray<uint64_t>(n);
  batch.starts.assign(num_shards_ + 1, 0);
  if (num_shards_ == 1) {
    for (size_t i = 0; i < n; ++i) {
      batch.order[i] = static_cast<uint32_t>(i);
      batch.hashes[i] = KeyHash(keys[i]);
    }
    batch.starts[1] = static_cast<uint32_t>(n);
    return;
  }
  const std::unique_ptr<uint64_t[]> hash_of = UninitializedArray<uint64_t>(n);  // by position
  for (size_t i = 0; i < n; ++i) {
    hash_of[i] = KeyHash(keys[i]);
    ++batch.starts[ShardOfHash(hash_of[i]) + 1];
  }
  for (size_t s = 0; s < num_shards_; ++s) batch.starts[s + 1] += batch.starts[s];
  uint32_t next[kShards];
  std::copy(batch.starts.begin(), batch.starts.end() - 1, next);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t j = next[ShardOfHash(hash_of[i])]++;
    batch.order[j] = static_cast<uint32_t>(i);
    batch.hashes[j] = hash_of[i];
  }
}

// Within a shard's run positions ascend, and a key's repeats all lie in its
// shard's run: a small table per run (in cache) finds each first listing.
bool SparseTable::FirstOccurrences(absl::Span<const uint64_t> keys, const KeyBatch& batch,
                                   uint32_t* first) const {
  auto table_size = [](size_t keys) {
    size_t size = 16;
    while (size < 2 * keys) size *= 2;  // at most half full
    return size;
  };
  size_t largest = 0;
  for (size_t s = 0; s < num_shards_; ++s) {
    largest = std::max<size_t>(largest, batch.starts[s + 1] - batch.starts[s]);
  }
  std::vector<uint32_t> table(table_size(largest));
  bool repeated = false;
  for (size_t s = 0; s < num_shards_; ++s) {
    const uint32_t begin = batch.starts[s], end = batch.starts[s + 1];
    if (begin == end) continue;
    const size_t mask = table_size(end - begin) - 1;
    std::fill_n(table.begin(), mask + 1, kNil);
    for (uint32_t j = begin; j < end; ++j) {
      const uint32_t i = batch.order[j];
      size_t h = (batch.hashes[j] >> 7) & mask;
      while (table[h] != kNil && keys[table[h]] != keys[i]) h = (h + 1) & mask;
      if (table[h] == kNil) {
        table[h] = i;
        first[i] = i;
      } else {
        first[i] = table[h];
        repeated = true;
      }
    }
  }
  return repeated;
}

// ---- Pull ------------------------------------------------------------------

absl::Status SparseTable::Pull(absl::Span<const uint64_t> keys, absl::Span<char> out) {
  if (out.size() != keys.size() * row_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", name_, "': pull of ", keys.size(), " keys needs ", keys.size(), " * ",
        row_bytes_, " = ", keys.size() * row_bytes_, " bytes of output, got ", out.size()));
  }
  if (element_size_ == sizeof(double)) return PullImpl<double>(keys, out);
  return PullImpl<float>(keys, out);
}

namespace {

// A shard's lock, unless the caller holds it already.
class ShardLock {
 public:
  ShardLock(absl::Mutex* mu, bool held) : mu_(held ? nullptr : mu) {
    if (mu_ != nullptr) mu_->Lock();
  }
  ~ShardLock() {
    if (mu_ != nullptr) mu_->Unlock();
  }
  ShardLock(const ShardLock&) = delete;
  ShardLock& operator=(const ShardLock&) = delete;

 private:
  absl::Mutex* const mu_;
};

}  // namespace

template <typename T, SparseTable::RowCreation kCreate, typename OnRow, typename OnPending>
uint64_t SparseTable::ForEachRow(absl::Span<const uint64_t> keys, const KeyBatch& batch,
                                 const uint32_t* first, bool locked, OnRow on_row,
                                 OnPending on_pending) {
  const uint64_t call = calls_.fetch_add(1, std::memory_order_relaxed) + 1;
  const int64_t now = NowNanos();
  // Two passes per shard so that the memory of later keys is fetched while
  // earlier ones are handled: the slots first (prefetched kFindAhead keys
  // ahead, across shards), then the rows. A creation may evict (with a
  // capacity) and so change slots found before it: then the row of each key
  // is found just before it is used.
  const bool ahead = capacity_ == 0;
  // Eviction keeps the row's LRU links and stamp (its steps are in its slot).
  const bool uses_meta = evicts_;
  const size_t n = keys.size();
  if (ahead) {
    for (size_t j = 0; j < std::min(n, kFindAhead); ++j) PrefetchSlot(batch.hashes[j]);
  }
  // Slot numbers of the largest shard run (FindSlots).
  std::unique_ptr<uint32_t[]> slots;
  if (ahead) {
    uint32_t largest = 0;
    for (size_t s = 0; s < num_shards_; ++s) {
      largest = std::max(largest, batch.starts[s + 1] - batch.starts[s]);
    }
    slots = UninitializedArray<uint32_t>(largest);
  }
  uint64_t created = 0;
  for (size_t s = 0; s < num_shards_; ++s) {
    const uint32_t begin = batch.starts[s], end = batch.starts[s + 1];
    if (begin == end) continue;
    Shard& shard = shards_[s];
    ShardLock lock(&shard.mu, locked);
    // Room for every key first: a creation then never rehashes (moves) the
    // slots found.
    if constexpr (kCreate == RowCreation::kOnAdmission) ReserveSlots(shard, end - begin);
    if (ahead) FindSlots(shard, keys, batch, begin, end, slots.get());
    for (uint32_t j = begin; j < end; ++j) {
      const uint32_t i = batch.order[j];
      if (first != nullptr && first[i] != i) continue;  // a repeat: its first listing does it
      const uint64_t key = keys[i];
      uint32_t slot = kNil;
      if (ahead) {
        slot = slots[j - begin];
        if (j + kLookAhead < end && slots[j + kLookAhead - begin] != kNil) {
          const uint32_t later = slots[j + kLookAhead - begin];
          PrefetchRow(shard, later);
          if (uses_meta) __builtin_prefetch(&shard.meta[later]);
        }
      } else {
        slot = FindSlot(shard, key, batch.hashes[j]);
      }
      if (slot != kNil) {
        Touch(shard, slot, now);
      } else if constexpr (kCreate == RowCreation::kOnAdmission) {
        if (!Sight(shard, key, call)) {
          on_pending(i);
          continue;
        }
        slot = CreateRow<T>(shard, key, now);
        ++created;
      } else {
        SightForRead(shard, key, call);
        on_pending(i);
        continue;
      }
      on_row(i, shard, slot);
    }
  }
  return created;
}

void SparseTable::FindSlots(Shard& shard, absl::Span<const uint64_t> keys, const KeyBatch& batch,
                            uint32_t begin, uint32_t end, uint32_t* slots) const {
  const size_t n = batch.size;
  for (uint32_t j = begin; j < end; ++j) {
    if (j + kFindAhead < n) PrefetchSlot(batch.hashes[j + kFindAhead]);
    slots[j - begin] = FindSlot(shard, keys[batch.order[j]], batch.hashes[j]);
  }
}

template <typename T>
absl::Status SparseTable::PullImpl(absl::Span<const uint64_t> keys, absl::Span<char> out) {
  std::vector<uint32_t> initial;  // positions that read the initializer's value
  KeyBatch batch;
  GroupByShard(keys, batch);
  ForEachRow<T, RowCreation::kNever>(
      keys, batch, /*first=*/nullptr, /*locked=*/false,
      [&](uint32_t i, Shard& shard, uint32_t slot) {
        CopyRow(out.data() + static_cast<size_t>(i) * row_bytes_, SlotData(shard, slot),
                row_bytes_);
      },
      [&](uint32_t i) { initial.push_back(i); });
  if (!initial.empty()) {
    std::vector<T> row(dim_);  // one buffer for all of them
    for (uint32_t i : initial) {
      initializer_.Fill<T>(keys[i], absl::MakeSpan(row));
      std::memcpy(out.data() + i * row_bytes_, row.data(), row_bytes_);
    }
  }
  keys_pulled_.fetch_add(keys.size(), std::memory_order_relaxed);
  return absl::OkStatus();
}

// ---- Push ------------------------------------------------------------------

absl::Status SparseTable::Push(absl::Span<const uint64_t> keys, absl::string_view grads) {
  if (grads.size() != keys.size() * row_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", name_, "': push of ", keys.size(), " keys needs ", keys.size(), " * ",
        row_bytes_, " = ", keys.size() * row_bytes_, " bytes of gradients, got ", grads.size()));
  }
  if (element_size_ == sizeof(double)) return PushImpl<double>(keys, grads);
  return PushImpl<float>(keys, grads);
}

template <typename T>
absl::Status SparseTable::CheckFinite(absl::Span<const uint64_t> keys,
                                      absl::string_view grads) const {
  const size_t values = keys.size() * dim_;
  for (size_t v = 0; v < values; ++v) {
    const T value = LoadValue<T>(grads.data() + v * sizeof(T));
    if (ABSL_PREDICT_TRUE(std::isfinite(value))) continue;
    const size_t i = v / dim_;
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", name_, "': gradient for key ", keys[i], " (position ", i,
        ") has a non-finite value at column ", v % dim_, ": ", static_cast<double>(value),
        "; nothing was applied"));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status SparseTable::PushImpl(absl::Span<const uint64_t> keys, absl::string_view grads) {
  // Check and sum everything before touching any row.
  PS_RETURN_IF_ERROR(CheckFinite<T>(keys, grads));
  const size_t n = keys.size();
  KeyBatch batch;
  GroupByShard(keys, batch);
  const std::unique_ptr<uint32_t[]> first = UninitializedArray<uint32_t>(n);
  const bool duplicates = FirstOccurrences(keys, batch, first.get());
  // Repeated keys only: the sum of their gradients in double, by position of
  // first occurrence.
  std::vector<uint32_t> sum_of;  // position -> row of `sums`, kNil: not repeated
  std::vector<double> sums;
  auto add_row = [&](double* sum, size_t i) {
    const char* g = grads.data() + i * row_bytes_;
    for (uint32_t c = 0; c < dim_; ++c) {
      sum[c] += static_cast<double>(LoadValue<T>(g + c * sizeof(T)));
    }
  };
  if (duplicates) {
    sum_of.assign(n, kNil);
    for (size_t i = 0; i < n; ++i) {
      if (first[i] == i) continue;
      uint32_t& row = sum_of[first[i]];
      if (row == kNil) {
        row = static_cast<uint32_t>(sums.size() / dim_);
        sums.resize(sums.size() + dim_, 0.0);
        add_row(sums.data() + static_cast<size_t>(row) * dim_, first[i]);
      }
      add_row(sums.data() + static_cast<size_t>(row) * dim_, i);
    }
    for (size_t i = 0; i < n; ++i) {  // in order of first occurrence
      const uint32_t row = sum_of[i];
      if (row == kNil) continue;
      for (uint32_t c = 0; c < dim_; ++c) {
        if (!std::isfinite(sums[static_cast<size_t>(row) * dim_ + c])) {
          return absl::InvalidArgumentError(
              absl::StrCat("table '", name_, "': the summed gradient for key ", keys[i],
                           " overflows at column ", c, "; nothing was applied"));
        }
      }
    }
  }

  // The gradient of a key listed once is read in place when it is aligned
  // for T (the optimizer computes in double either way), else copied here.
  const bool aligned = reinterpret_cast<uintptr_t>(grads.data()) % alignof(T) == 0;
  std::vector<T> one(aligned ? 0 : dim_);
  // Last before anything changes: the room for the rows it may create.
  bool locked = false;
  PS_ASSIGN_OR_RETURN(const uint64_t reserved, ReserveRows(keys, batch, first.get(), &locked));
  const uint64_t created = ForEachRow<T, RowCreation::kOnAdmission>(
      keys, batch, duplicates ? first.get() : nullptr, locked,
      [&](uint32_t i, Shard& shard, uint32_t slot) {
        T* row = reinterpret_cast<T*>(SlotData(shard, slot));
        const uint64_t step = ++StepOf(shard, slot);
        if (duplicates && sum_of[i] != kNil) {
          optimizer_.Apply<T, double>(row, row + dim_,
                                      sums.data() + static_cast<size_t>(sum_of[i]) * dim_, dim_,
                                      step);
          return;
        }
        const char* raw = grads.data() + static_cast<size_t>(i) * row_bytes_;
        if (!aligned) {
          std::memcpy(one.data(), raw, row_bytes_);
          raw = reinterpret_cast<const char*>(one.data());
        }
        optimizer_.Apply<T, T>(row, row + dim_, reinterpret_cast<const T*>(raw), dim_, step);
      },
      [](uint32_t) {});  // not admitted yet: the gradient is dropped
  if (locked) UnlockAllShards();
  if (options_.row_budget != nullptr) {
    options_.row_budget->Settle(reserved, created * row_budget_bytes_);
  }
  keys_pushed_.fetch_add(n, std::memory_order_relaxed);
  return absl::OkStatus();
}

void SparseTable::LockAllShards() {
  for (size_t s = 0; s < num_shards_; ++s) shards_[s].mu.Lock();
}

void SparseTable::UnlockAllShards() {
  for (size_t s = num_shards_; s > 0; --s) shards_[s - 1].mu.Unlock();
}

bool SparseTable::WouldAdmit(const Shard& shard, uint64_t key) const {
  if (admission_count_ <= 1) return true;
  auto it = shard.pending.find(key);
  // A new call's sighting: admitted on the admission_count-th.
  return it != shard.pending.end() && it->second.count + 1 >= admission_count_;
}

absl::StatusOr<uint64_t> SparseTable::ReserveRows(absl::Span<const uint64_t> keys,
                                                  const KeyBatch& batch, const uint32_t* first,
                                                  bool* locked) {
  MemoryBudget* const budget = options_.row_budget.get();
  if (budget == nullptr) return 0;
  // At most one row per key: reserved at once, the rest given back after.
  const uint64_t every_key = keys.size() * row_budget_bytes_;
  if (budget->TryReserve(every_key)) return every_key;
  // Near the limit: the rows it would create, counted with every shard
  // locked (no row can come or go until the push is done).
  LockAllShards();
  uint64_t rows = 0;
  for (size_t s = 0; s < num_shards_; ++s) {
    const Shard& shard = shards_[s];
    for (uint32_t j = batch.starts[s]; j < batch.starts[s + 1]; ++j) {
      const uint32_t i = batch.order[j];
      if (first[i] != i) continue;  // a repeat
      if (FindSlot(shard, keys[i], batch.hashes[j]) == kNil && WouldAdmit(shard, keys[i])) ++rows;
    }
  }
  if (capacity_ > 0) {
    // Past the capacity each new row evicts one: only the growth counts.
    const uint64_t held = rows_.load(std::memory_order_relaxed);
    const uint64_t after = std::min<uint64_t>(capacity_, held + rows);
    rows = after > held ? after - held : 0;
  }
  const uint64_t bytes = rows * row_budget_bytes_;
  if (budget->TryReserve(bytes)) {
    *locked = true;
    return bytes;
  }
  UnlockAllShards();
  return absl::ResourceExhaustedError(absl::StrCat(
      "table '", name_, "': a push of ", keys.size(), " keys would create ", rows, " rows of ",
      row_budget_bytes_, " bytes: this server's tables hold ", budget->used(),
      " bytes of rows, the most --max_table_row_bytes=", budget->limit(),
      " allows; nothing was applied"));
}

// ---- eviction, initial values, stats ----------------------------------------

size_t SparseTable::EvictExpired() {
  if (ttl_ <= absl::ZeroDuration()) return 0;
  const int64_t cutoff = absl::ToUnixNanos(options_.now() - ttl_);
  size_t evicted = 0;
  for (size_t s = 0; s < num_shards_; ++s) {
    Shard& shard = shards_[s];
    absl::MutexLock lock(&shard.mu);
    while (shard.head != kNil && shard.meta[shard.head].touched < cutoff) {
      RemoveRow(shard, shard.head);
      ++evicted;
    }
  }
  evictions_.fetch_add(evicted, std::memory_order_relaxed);
  return evicted;
}

void SparseTable::InitialRow(uint64_t key, absl::Span<char> out) const {
  const size_t values = std::min<size_t>(dim_, out.size() / element_size_);
  if (element_size_ == sizeof(double)) {
    std::vector<double> row(values);
    initializer_.Fill<double>(key, absl::MakeSpan(row));
    std::memcpy(out.data(), row.data(), values * sizeof(double));
  } else {
    std::vector<float> row(values);
    initializer_.Fill<float>(key, absl::MakeSpan(row));
    std::memcpy(out.data(), row.data(), values * sizeof(float));
  }
}

v1::TableStats SparseTable::Stats() const {
  v1::TableStats stats;
  stats.set_name(name_);
  const uint64_t rows = rows_.load(std::memory_order_relaxed);
  stats.set_rows(rows);
  stats.set_bytes(rows * (static_cast<uint64_t>(dim_) + state_per_row_) * element_size_);
  stats.set_evictions(evictions_.load(std::memory_order_relaxed));
  stats.set_admissions(admissions_.load(std::memory_order_relaxed));
  stats.set_admission_refusals(admission_refusals_.load(std::memory_order_relaxed));
  stats.set_pending_keys(pending_.load(std::memory_order_relaxed));
  stats.set_keys_pulled(keys_pulled_.load(std::memory_order_relaxed));
  stats.set_keys_pushed(keys_pushed_.load(std::memory_order_relaxed));
  return stats;
}

// ---- checkpoints -------------------------------------------------------------

std::string SparseTable::SerializeRows(const KeyFilter& keep) const {
  v1::SparseTableSnapshot snap;
  snap.set_name(name_);
  *snap.mutable_config() = config_;
  snap.set_state_per_row(state_per_row_);
  std::string keys, values, state, steps, pending_keys, pending_counts;
  const size_t state_bytes = static_cast<size_t>(state_per_row_) * element_size_;
  // Sized for the rows held now (concurrent inserts may add a few).
  const size_t expected = rows_.load(std::memory_order_relaxed);
  keys.reserve(expected * sizeof(uint64_t));
  values.reserve(expected * row_bytes_);
  state.reserve(expected * state_bytes);
  steps.reserve(expected * sizeof(uint64_t));
  uint64_t rows = 0;
  for (size_t s = 0; s < num_shards_; ++s) {
    Shard& shard = shards_[s];
    absl::MutexLock lock(&shard.mu);
    for (uint32_t slot = shard.head; slot != kNil; slot = shard.meta[slot].next) {
      if (keep && !keep(KeyOf(shard, slot))) continue;
      const char* row = SlotData(shard, slot);
      AppendU64(&keys, KeyOf(shard, slot));
      values.append(row, row_bytes_);
      state.append(row + row_bytes_, state_bytes);
      AppendU64(&steps, StepOf(shard, slot));
      ++rows;
    }
    for (const auto& [key, seq] : shard.pending_order) {
      auto it = shard.pending.find(key);
      if (it == shard.pending.end() || it->second.seq != seq) continue;
      if (keep && !keep(key)) continue;
      AppendU64(&pending_keys, key);
      const uint32_t count = it->second.count;
      pending_counts.append(reinterpret_cast<const char*>(&count), sizeof(count));
    }
  }
  snap.set_rows(rows);
  snap.set_keys(std::move(keys));
  snap.set_values(std::move(values));
  snap.set_state(std::move(state));
  snap.set_steps(std::move(steps));
  snap.set_pending_keys(std::move(pending_keys));
  snap.set_pending_counts(std::move(pending_counts));
  if (keep) return snap.SerializeAsString();  // a part: the counters stay
  snap.set_evictions(evictions_.load(std::memory_order_relaxed));
  snap.set_admissions(admissions_.load(std::memory_order_relaxed));
  snap.set_admission_refusals(admission_refusals_.load(std::memory_order_relaxed));
  snap.set_keys_pulled(keys_pulled_.load(std::memory_order_relaxed));
  snap.set_keys_pushed(keys_pushed_.load(std::memory_order_relaxed));
  return snap.SerializeAsString();
}

namespace {

// DATA_LOSS unless `array` holds exactly `count` items of `item_bytes` each.
absl::Status CheckArray(const std::string& what, const char* field, const std::string& array,
                        uint64_t count, size_t item_bytes, const char* per) {
  const bool ok = item_bytes == 0
                      ? array.empty()
                      : array.size() % item_bytes == 0 && array.size() / item_bytes == count;
  if (ok) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(what, ": snapshot field '", field, "' has ", array.size(),
                                          " bytes, expected ", count, " * ", item_bytes, " (", per,
                                          ")"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SparseTable>> SparseTable::Deserialize(absl::string_view bytes,
                                                                      SparseTableOptions options) {
  v1::SparseTableSnapshot snap;
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !snap.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError(
        absl::StrCat("sparse table snapshot of ", bytes.size(), " bytes does not parse"));
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<SparseTable> table,
                      Create(snap.name(), snap.config(), std::move(options)));
  const std::string what = absl::StrCat("table '", table->name_, "' snapshot");
  PS_RETURN_IF_ERROR(table->CheckSnapshot(snap, what));
  if (table->capacity_ > 0 && snap.rows() > table->capacity_) {
    return absl::DataLossError(
        absl::StrCat(what, ": ", snap.rows(), " rows exceed eviction.capacity ", table->capacity_));
  }
  PS_RETURN_IF_ERROR(table->InsertRows(snap, what));
  table->evictions_.store(snap.evictions(), std::memory_order_relaxed);
  table->admissions_.store(snap.admissions(), std::memory_order_relaxed);
  table->admission_refusals_.store(snap.admission_refusals(), std::memory_order_relaxed);
  table->keys_pulled_.store(snap.keys_pulled(), std::memory_order_relaxed);
  table->keys_pushed_.store(snap.keys_pushed(), std::memory_order_relaxed);
  return table;
}

absl::Status SparseTable::CheckSnapshot(const v1::SparseTableSnapshot& snap,
                                        const std::string& what) const {
  if (snap.state_per_row() != state_per_row_) {
    return absl::DataLossError(absl::StrCat(what, ": state_per_row is ", snap.state_per_row(),
                                            ", but optimizer ", optimizer_.name(), " with dim ",
                                            dim_, " keeps ", state_per_row_));
  }
  const uint64_t rows = snap.rows();
  PS_RETURN_IF_ERROR(
      CheckArray(what, "keys", snap.keys(), rows, sizeof(uint64_t), "8 bytes per row"));
  PS_RETURN_IF_ERROR(
      CheckArray(what, "values", snap.values(), rows, row_bytes_, "dim values per row"));
  PS_RETURN_IF_ERROR(CheckArray(what, "state", snap.state(), rows, state_per_row_ * element_size_,
                                "state_per_row values per row"));
  PS_RETURN_IF_ERROR(
      CheckArray(what, "steps", snap.steps(), rows, sizeof(uint64_t), "8 bytes per row"));
  const uint64_t pending = snap.pending_keys().size() / sizeof(uint64_t);
  PS_RETURN_IF_ERROR(CheckArray(what, "pending_keys", snap.pending_keys(), pending,
                                sizeof(uint64_t), "8 bytes per key"));
  PS_RETURN_IF_ERROR(CheckArray(what, "pending_counts", snap.pending_counts(), pending,
                                sizeof(uint32_t), "4 bytes per pending key"));
  for (uint64_t p = 0; p < pending; ++p) {
    const uint32_t count = LoadValue<uint32_t>(snap.pending_counts().data() + p * sizeof(uint32_t));
    if (count == 0 || count >= admission_count_) {
      return absl::DataLossError(absl::StrCat(
          what, ": pending key ",
          LoadValue<uint64_t>(snap.pending_keys().data() + p * sizeof(uint64_t)), " has count ",
          count, ", outside [1, admission_count) with admission_count ", admission_count_));
    }
  }
  return absl::OkStatus();
}

absl::Status SparseTable::InsertRows(const v1::SparseTableSnapshot& snap, const std::string& what) {
  // Taken whole (past the budget too): counted as they are inserted.
  uint64_t inserted = 0;
  struct Count {
    const SparseTable* table;
    const uint64_t* rows;
    ~Count() {
      if (table->options_.row_budget != nullptr) {
        table->options_.row_budget->Add(*rows * table->row_budget_bytes_);
      }
    }
  } count{this, &inserted};
  const int64_t now = NowNanos();
  const size_t state_bytes = static_cast<size_t>(state_per_row_) * element_size_;
  for (uint64_t r = 0; r < snap.rows(); ++r) {
    const uint64_t key = LoadValue<uint64_t>(snap.keys().data() + r * sizeof(uint64_t));
    Shard& shard = ShardOf(key);
    absl::MutexLock lock(&shard.mu);
    if (FindSlot(shard, key) != kNil || shard.pending.contains(key)) {
      return absl::DataLossError(absl::StrCat(what, ": key ", key, " appears twice"));
    }
    const uint32_t slot = AllocSlot(shard, key, now);
    char* row = SlotData(shard, slot);
    std::memcpy(row, snap.values().data() + r * row_bytes_, row_bytes_);
    std::memcpy(row + row_bytes_, snap.state().data() + r * state_bytes, state_bytes);
    StepOf(shard, slot) = LoadValue<uint64_t>(snap.steps().data() + r * sizeof(uint64_t));
    ++inserted;
  }
  for (size_t p = 0; p < snap.pending_keys().size() / sizeof(uint64_t); ++p) {
    const uint64_t key = LoadValue<uint64_t>(snap.pending_keys().data() + p * sizeof(uint64_t));
    const uint32_t count = LoadValue<uint32_t>(snap.pending_counts().data() + p * sizeof(uint32_t));
    Shard& shard = ShardOf(key);
    absl::MutexLock lock(&shard.mu);
    if (FindSlot(shard, key) != kNil || shard.pending.contains(key)) {
      return absl::DataLossError(
          absl::StrCat(what, ": pending key ", key, " appears twice or also has a row"));
    }
    AddPending(shard, key, count, /*call=*/0);
  }
  return absl::OkStatus();
}

uint64_t SparseTable::EraseRows(const KeyFilter& drop) {
  uint64_t erased = 0;
  for (size_t s = 0; s < num_shards_; ++s) {
    Shard& shard = shards_[s];
    absl::MutexLock lock(&shard.mu);
    for (uint32_t slot = shard.head; slot != kNil;) {
      const uint32_t next = shard.meta[slot].next;
      if (drop(KeyOf(shard, slot))) {
        RemoveRow(shard, slot);
        ++erased;
      }
      slot = next;
    }
    for (auto it = shard.pending.begin(); it != shard.pending.end();) {
      if (drop(it->first)) {
        shard.pending.erase(it++);  // its pending_order entry goes stale
        pending_.fetch_sub(1, std::memory_order_relaxed);
      } else {
        ++it;
      }
    }
    // A shard left mostly empty gives its slots back (a live move's old
    // owner dropping the rows it handed over): rehashed into the smallest
    // size that fits twice its rows.
    size_t size = kMinSlots;
    while (!Fits(size, 2 * shard.used)) size *= 2;
    if (size < shard.ctrl.size() / 2) Rehash(shard, size);
  }
  return erased;
}

absl::StatusOr<uint64_t> SparseTable::MergeRows(const v1::SparseTableSnapshot& snap,
                                                const KeyFilter& replaced) {
  const std::string what = absl::StrCat("rows of table '", name_, "' handed over");
  if (snap.name() != name_ ||
      !google::protobuf::util::MessageDifferencer::Equals(NormalizedConfig(snap.config()),
                                                          config_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": they are of table '", snap.name(), "' with config {",
        snap.config().ShortDebugString(), "}, this one has {", config_.ShortDebugString(), "}"));
  }
  PS_RETURN_IF_ERROR(CheckSnapshot(snap, what));
  if (capacity_ > 0 && rows_.load(std::memory_order_relaxed) + snap.rows() > capacity_) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": ", snap.rows(), " more rows would exceed eviction.capacity ", capacity_));
  }
  // All or nothing: no key may be here already but those replaced (the
  // gate served none of them here before they arrive).
  for (const std::string* keys : {&snap.keys(), &snap.pending_keys()}) {
    for (size_t r = 0; r < keys->size() / sizeof(uint64_t); ++r) {
      const uint64_t key = LoadValue<uint64_t>(keys->data() + r * sizeof(uint64_t));
      if (replaced && replaced(key)) continue;
      Shard& shard = ShardOf(key);
      absl::MutexLock lock(&shard.mu);
      if (FindSlot(shard, key) != kNil || shard.pending.contains(key)) {
        return absl::FailedPreconditionError(
            absl::StrCat(what, ": key ", key, " is here already; nothing taken"));
      }
    }
  }
  if (replaced) EraseRows(replaced);
  PS_RETURN_IF_ERROR(InsertRows(snap, what));
  return snap.rows();
}

}  // namespace pserver
