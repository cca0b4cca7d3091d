#include "cc/core/tables.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "cc/core/compression.h"
#include "cc/core/names.h"
#include "cc/core/status_macros.h"
#include "cc/core/table_wire.h"
#include "google/protobuf/util/message_differencer.h"

namespace pserver {
namespace {

int64_t UnixNanos() { return absl::ToUnixNanos(absl::Now()); }

int64_t StalenessOf(const v1::Consistency& consistency) {
  switch (consistency.model()) {
    case v1::Consistency::BSP:
      return 0;
    case v1::Consistency::SSP:
      return consistency.staleness();
    default:
      return -1;  // ASP: never waits
  }
}

// Keeps in `add` the keys (and their values, `row_bytes` each) that `keep`
// accepts; with `keep_accepted` false, the others.
void FilterAdd(const SparseTable::KeyFilter& keep, bool keep_accepted, size_t row_bytes,
               v1::PendingAdds::Add* add) {
  std::string keys, values;
  const size_t n = add->keys().size() / 8;
  for (size_t k = 0; k < n; ++k) {
    uint64_t key;
    std::memcpy(&key, add->keys().data() + k * 8, 8);
    if (keep(key) != keep_accepted) continue;
    keys.append(add->keys(), k * 8, 8);
    values.append(add->values(), k * row_bytes, row_bytes);
  }
  add->set_keys(std::move(keys));
  add->set_values(std::move(values));
}

void DropKeys(const SparseTable::KeyFilter& drop, size_t row_bytes, v1::PendingAdds::Add* add) {
  FilterAdd(drop, /*keep_accepted=*/false, row_bytes, add);
}

ReduceOp ReduceOpOf(v1::AllReduceRequest::Op op) {
  return op == v1::AllReduceRequest::MEAN ? ReduceOp::kMean : ReduceOp::kSum;
}

}  // namespace

absl::Status TableHandler::Pull(SparseTable& table, absl::Span<const uint64_t> keys,
                                absl::Span<char> out) {
  return table.Pull(keys, out);
}

absl::Status TableHandler::Push(SparseTable& table, absl::Span<const uint64_t> keys,
                                absl::string_view values) {
  return table.Push(keys, values);
}

namespace {

Collectives::Options CollectivesOptions(const TablesOptions& tables, DeadlineTimer* timer) {
  Collectives::Options options;
  options.timer = timer;
  options.max_held_bytes = tables.max_collective_bytes;
  return options;
}

}  // namespace

namespace {

// `options` with its tables' shared row budget.
TablesOptions WithRowBudget(TablesOptions options) {
  options.table.row_budget = std::make_shared<MemoryBudget>(options.max_row_bytes);
  return options;
}

}  // namespace

Tables::Tables(TablesOptions options)
    : options_(WithRowBudget(std::move(options))),
      collectives_(CollectivesOptions(options_, &timer_)) {}

Tables::~Tables() { Shutdown(); }

absl::Status Tables::Create(const v1::CreateTableRequest& request) {
  PS_RETURN_IF_ERROR(ValidateName("table", request.name()));
  const v1::TableConfig config = SparseTable::NormalizedConfig(request.config());
  {
    absl::MutexLock lock(&mu_);
    auto it = tables_.find(request.name());
    if (it != tables_.end()) {
      if (google::protobuf::util::MessageDifferencer::Equals(it->second->table->config(), config)) {
        return absl::OkStatus();
      }
      return absl::AlreadyExistsError(
          absl::StrCat("table '", request.name(), "' already exists with another config: {",
                       it->second->table->config().ShortDebugString(), "}, asked for {",
                       config.ShortDebugString(), "}"));
    }
    PS_RETURN_IF_ERROR(CheckRoomForTable(request.name()));
  }
  // Built outside the lock; a racing create of the same name keeps the first.
  PS_ASSIGN_OR_RETURN(auto table, SparseTable::Create(request.name(), config, options_.table));
  auto entry = std::make_shared<Entry>(&timer_, options_.max_workers_per_table);
  entry->table = std::move(table);
  absl::MutexLock lock(&mu_);
  if (tables_.contains(request.name())) return absl::OkStatus();
  PS_RETURN_IF_ERROR(CheckRoomForTable(request.name()));  // racing creates of other names
  tables_.emplace(request.name(), std::move(entry));
  return absl::OkStatus();
}

absl::Status Tables::CheckRoomForTable(absl::string_view name) const {
  if (tables_.size() < options_.max_tables) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("table '", name, "' not created: this server holds ", tables_.size(),
                   " tables, the most --max_tables=", options_.max_tables, " allows"));
}

absl::StatusOr<std::shared_ptr<Tables::Entry>> Tables::Find(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = tables_.find(name);
  if (it == tables_.end()) return absl::NotFoundError(absl::StrCat("no table '", name, "'"));
  return it->second;
}

std::shared_ptr<TableHandler> Tables::HandlerOf(absl::string_view name) const {
  static TableHandler* const kDefault = new TableHandler();
  absl::MutexLock lock(&mu_);
  auto it = handlers_.find(name);
  if (it != handlers_.end()) return it->second;
  return std::shared_ptr<TableHandler>(std::shared_ptr<TableHandler>(), kDefault);
}

bool Tables::HasHandler(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  return handlers_.contains(name);
}

void Tables::MaybeSweep(Entry& entry) {
  if (entry.table->config().eviction().ttl_seconds() <= 0) return;
  const absl::Time now = Now();
  {
    absl::MutexLock lock(&entry.sweep_mu);
    if (now - entry.last_sweep < options_.sweep_interval) return;
    entry.last_sweep = now;
  }
  entry.table->EvictExpired();
}

absl::Status Tables::Pull(const v1::TablePullRequest& request, v1::TablePullResponse* response,
                          absl::Time deadline) {
  BlockingWait wait;
  PullAsync(request, response, deadline, wait.Done());
  return wait.Wait();
}

CancelWait Tables::PullAsync(const v1::TablePullRequest& request, v1::TablePullResponse* response,
                             absl::Time deadline, WaitDone done) {
  const int64_t received = UnixNanos();
  auto fail = [&](absl::Status status) {
    done(std::move(status));
    return CancelWait([] {});
  };
  absl::StatusOr<std::shared_ptr<Entry>> found = Find(request.table());
  if (!found.ok()) return fail(found.status());
  std::shared_ptr<Entry> entry = *std::move(found);
  absl::StatusOr<KeysView> keys = KeysView::Of(request.keys());  // `request` outlives the read
  if (!keys.ok()) return fail(keys.status());
  const int64_t staleness = StalenessOf(entry->table->config().consistency());
  if (staleness < 0 || request.worker().empty()) {
    return fail(Read(*entry, request, keys->keys(), response, received));
  }
  CancelWait cancel = entry->clocks.WaitUntilAllAsync(
      request.clock() - staleness, deadline,
      [this, entry, keys = *std::move(keys), &request, response, received,
       done = std::move(done)](absl::Status waited) {
        if (!waited.ok()) {
          done(absl::Status(waited.code(), absl::StrCat("table '", request.table(), "': read by ",
                                                        request.worker(), " at clock ",
                                                        request.clock(), ": ", waited.message())));
          return;
        }
        done(Read(*entry, request, keys.keys(), response, received));
      });
  // Keeps the entry (and its clocks) alive for the cancel.
  return [entry, cancel = std::move(cancel)] { cancel(); };
}

absl::Status Tables::Read(Entry& entry, const v1::TablePullRequest& request,
                          absl::Span<const uint64_t> keys, v1::TablePullResponse* response,
                          int64_t received) {
  std::string* values = response->mutable_values();
  absl::Status status = ReadRows(
      entry, request.table(), keys, request.wire_type(),
      [&](size_t bytes, ElementType content_type) -> absl::StatusOr<absl::Span<char>> {
        values->resize(bytes);
        if (content_type != v1::ELEMENT_TYPE_UNSPECIFIED) response->set_content_type(content_type);
        return absl::MakeSpan(*values);
      });
  if (!status.ok()) {
    response->clear_values();
    response->clear_content_type();
    return status;
  }
  response->mutable_trace()->set_received_unix_nanos(received);
  response->mutable_trace()->set_processed_unix_nanos(UnixNanos());
  return absl::OkStatus();
}

absl::Status Tables::ReadRows(Entry& entry, absl::string_view name,
                              absl::Span<const uint64_t> keys, ElementType wire_type,
                              RowsOut out) {
  PS_ASSIGN_OR_RETURN(const bool narrows,
                      PullNarrows(*entry.table, wire_type,
                                  absl::StrCat("read of table '", name, "'")));
  MaybeSweep(entry);
  const size_t bytes = keys.size() * entry.table->row_bytes();
  // Rows as stored go straight where `out` says; narrowed ones through a
  // float32 buffer first.
  std::string stored;
  absl::Span<char> rows;
  if (narrows) {
    stored.resize(bytes);
    rows = absl::MakeSpan(stored);
  } else {
    PS_ASSIGN_OR_RETURN(rows, out(bytes, v1::ELEMENT_TYPE_UNSPECIFIED));
  }
  {
    absl::ReaderMutexLock lock(&entry.bsp_mu);  // after the adds the clock released
    PS_RETURN_IF_ERROR(HandlerOf(name)->Pull(*entry.table, keys, rows));
  }
  if (!narrows) return absl::OkStatus();
  const std::string narrowed = NarrowFloats(wire_type, stored);
  PS_ASSIGN_OR_RETURN(absl::Span<char> wire, out(narrowed.size(), wire_type));
  if (!narrowed.empty()) std::memcpy(wire.data(), narrowed.data(), narrowed.size());
  return absl::OkStatus();
}

absl::Status Tables::PullRows(const TableRowsView& pull, RowsOut out) {
  PS_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(pull.table));
  return ReadRows(*entry, pull.table, pull.keys, pull.value_type, out);
}

absl::Status Tables::Push(const v1::TablePushRequest& request, v1::TablePushResponse* response) {
  const int64_t received = UnixNanos();
  PS_ASSIGN_OR_RETURN(const KeysView view, KeysView::Of(request.keys()));
  TableRowsView push;
  push.table = request.table();
  push.keys = view.keys();
  push.values = request.values();
  push.value_type = request.value_type();
  push.worker = request.worker();
  push.clock = request.clock();
  PS_RETURN_IF_ERROR(PushRows(push));
  if (response != nullptr) {
    response->mutable_trace()->set_received_unix_nanos(received);
    response->mutable_trace()->set_processed_unix_nanos(UnixNanos());
  }
  return absl::OkStatus();
}

namespace {
uint64_t HeldBytes(const v1::PendingAdds::Add& add) {
  return add.keys().size() + add.values().size();
}
}  // namespace

void Tables::Hold(Entry& entry, v1::PendingAdds::Add add) {
  entry.pending_bytes += HeldBytes(add);
  const int64_t clock = add.clock();
  entry.pending[clock].push_back(std::move(add));
}

absl::Status Tables::PushRows(const TableRowsView& push) {
  PS_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(push.table));
  const absl::Span<const uint64_t> keys = push.keys;
  // A compressed push (TableConfig.wire_compression) is widened first.
  PS_ASSIGN_OR_RETURN(
      const std::optional<std::string> widened,
      WidenPushedValues(*entry->table, push.value_type, push.values, keys.size()));
  const absl::string_view values = widened.has_value() ? *widened : push.values;
  MaybeSweep(*entry);
  bool held = false;
  if (HoldsAdds(*entry) && !push.worker.empty()) {
    // Checked now, since a held-back add is acknowledged before it applies.
    const size_t want = keys.size() * entry->table->row_bytes();
    if (values.size() != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("push to table '", push.table, "': ", keys.size(), " keys need ", want,
                       " bytes of values, got ", values.size()));
    }
    absl::MutexLock lock(&entry->bsp_mu);
    if (push.clock >= entry->clocks.MinClock()) {
      v1::PendingAdds::Add add;
      add.set_clock(push.clock);
      add.set_keys(EncodeKeys(keys));
      add.set_values(values.data(), values.size());
      const uint64_t bytes = HeldBytes(add);
      const uint64_t limit = options_.max_held_add_bytes;
      if (bytes > limit || entry->pending_bytes + bytes > limit) {
        const std::string what = absl::StrCat(
            "push to table '", push.table, "' at clock ", push.clock, ": ", bytes,
            " bytes to hold back for slower workers (BSP), ", entry->pending_bytes,
            " held already, the most --max_held_add_bytes allows is ", limit);
        return bytes > limit ? absl::ResourceExhaustedError(what)
                             : absl::UnavailableError(absl::StrCat(what, "; retry later"));
      }
      Hold(*entry, std::move(add));
      held = true;
    }
  }
  if (!held) PS_RETURN_IF_ERROR(Apply(*entry, push.table, keys, values));
  return absl::OkStatus();
}

absl::Status Tables::Apply(Entry& entry, absl::string_view name, absl::Span<const uint64_t> keys,
                           absl::string_view values) {
  return HandlerOf(name)->Push(*entry.table, keys, values);
}

absl::StatusOr<int64_t> Tables::Clock(const v1::ClockRequest& request) {
  PS_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(request.table()));
  if (!HoldsAdds(*entry)) return ChangeClock(*entry, request, nullptr);
  // The reads this change lets through run once bsp_mu is released (declared
  // before the lock), so they see the adds applied below.
  Completions released;
  absl::MutexLock lock(&entry->bsp_mu);
  PS_ASSIGN_OR_RETURN(int64_t clock, ChangeClock(*entry, request, &released));
  ApplyPassed(*entry, entry->clocks.MinClock());
  return clock;
}

void Tables::ApplyPassed(Entry& entry, int64_t min_clock) {
  while (!entry.pending.empty() && (min_clock < 0 || entry.pending.begin()->first < min_clock)) {
    for (const v1::PendingAdds::Add& add : entry.pending.begin()->second) {
      entry.pending_bytes -= HeldBytes(add);
      absl::StatusOr<std::vector<uint64_t>> keys = DecodeKeys(add.keys());
      // Checked when held back; an add the table still refuses (a non-finite
      // value) is dropped, as it would have been refused had it come alone.
      if (keys.ok()) Apply(entry, entry.table->name(), *keys, add.values()).IgnoreError();
    }
    entry.pending.erase(entry.pending.begin());
  }
}

absl::StatusOr<int64_t> Tables::ChangeClock(Entry& entry, const v1::ClockRequest& request,
                                            Completions* released) {
  switch (request.op()) {
    case v1::ClockRequest::JOIN:
      return entry.clocks.Join(request.worker());
    case v1::ClockRequest::LEAVE: {
      PS_ASSIGN_OR_RETURN(int64_t clock, entry.clocks.ClockOf(request.worker()));
      PS_RETURN_IF_ERROR(entry.clocks.Leave(request.worker(), released));
      return clock;
    }
    case v1::ClockRequest::TICK: {
      if (request.to() > 0) {
        PS_ASSIGN_OR_RETURN(int64_t clock, entry.clocks.ClockOf(request.worker()));
        if (clock >= request.to()) return clock;  // a retried tick
      }
      return entry.clocks.Tick(request.worker(), released);
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown clock operation ", static_cast<int>(request.op())));
  }
}

void Tables::Stats(v1::TableStatsResponse* response) const {
  uint64_t waiting = collectives_.waiting();
  for (const auto& [name, entry] : Entries()) {
    v1::TableStats* stats = response->add_tables();
    *stats = entry->table->Stats();
    stats->set_min_clock(entry->clocks.MinClock());
    stats->set_workers(static_cast<uint32_t>(entry->clocks.size()));
    waiting += entry->clocks.waiting();
  }
  response->set_collective_rounds(collectives_.open_slots());
  response->set_collective_bytes(collectives_.held_bytes());
  response->set_waiting_calls(waiting);
}

std::vector<std::pair<std::string, Tables::Clocks>> Tables::AllWorkerClocks() const {
  std::vector<std::pair<std::string, Clocks>> out;
  for (const auto& [name, entry] : Entries()) out.emplace_back(name, entry->clocks.Workers());
  return out;
}

absl::Status Tables::Barrier(const v1::BarrierRequest& request, absl::Time deadline) {
  BlockingWait wait;
  BarrierAsync(request, deadline, wait.Done());
  return wait.Wait();
}

absl::Status Tables::AllReduce(const v1::AllReduceRequest& request, v1::AllReduceResponse* response,
                               absl::Time deadline) {
  BlockingWait wait;
  AllReduceAsync(request, response, deadline, wait.Done());
  return wait.Wait();
}

absl::Status Tables::Broadcast(const v1::BroadcastRequest& request, v1::BroadcastResponse* response,
                               absl::Time deadline) {
  BlockingWait wait;
  BroadcastAsync(request, response, deadline, wait.Done());
  return wait.Wait();
}

CancelWait Tables::BarrierAsync(const v1::BarrierRequest& request, absl::Time deadline,
                                WaitDone done) {
  return collectives_.BarrierAsync(request.name(), request.generation(), request.size(),
                                   request.participant(), deadline, std::move(done));
}

CancelWait Tables::AllReduceAsync(const v1::AllReduceRequest& request,
                                  v1::AllReduceResponse* response, absl::Time deadline,
                                  WaitDone done) {
  return collectives_.AllReduceAsync(request.name(), request.generation(), request.size(),
                                     request.participant(), request.element_type(), request.data(),
                                     ReduceOpOf(request.op()), response->mutable_data(), deadline,
                                     std::move(done));
}

CancelWait Tables::BroadcastAsync(const v1::BroadcastRequest& request,
                                  v1::BroadcastResponse* response, absl::Time deadline,
                                  WaitDone done) {
  if (request.root()) {
    done(collectives_.BroadcastPut(request.name(), request.generation(), request.size(),
                                   request.data()));
    return [] {};
  }
  return collectives_.BroadcastGetAsync(request.name(), request.generation(), request.size(),
                                        request.participant(), response->mutable_data(), deadline,
                                        std::move(done));
}

void Tables::SetHandler(const std::string& name, std::shared_ptr<TableHandler> handler) {
  absl::MutexLock lock(&mu_);
  if (handler == nullptr) {
    handlers_.erase(name);
  } else {
    handlers_[name] = std::move(handler);
  }
}

size_t Tables::EvictExpired() {
  size_t evicted = 0;
  for (const auto& [name, entry] : Entries()) evicted += entry->table->EvictExpired();
  return evicted;
}

std::vector<std::pair<std::string, std::shared_ptr<Tables::Entry>>> Tables::Entries() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<std::string, std::shared_ptr<Entry>>> entries(tables_.begin(),
                                                                      tables_.end());
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return entries;
}

void Tables::SaveTo(std::map<std::string, std::string>* extensions, const KeyKeep& keep) const {
  // Not under mu_: a clock change holds an entry's bsp_mu and then mu_.
  for (const auto& [name, entry] : Entries()) {
    if (keep) {
      const v1::TableConfig& config = entry->table->config();
      ExportEntry(
          name, *entry, [&, &name = name](uint64_t key) { return keep(name, config, key); },
          extensions);
      continue;
    }
    (*extensions)[absl::StrCat(kTablePrefix, name)] = entry->table->Serialize();
    (*extensions)[absl::StrCat(kClocksPrefix, name)] = entry->clocks.Serialize();
    absl::MutexLock pending_lock(&entry->bsp_mu);
    if (entry->pending.empty()) continue;
    v1::PendingAdds pending;
    for (const auto& [clock, adds] : entry->pending) {
      for (const v1::PendingAdds::Add& add : adds) *pending.add_adds() = add;
    }
    (*extensions)[absl::StrCat(kPendingPrefix, name)] = pending.SerializeAsString();
  }
}

absl::Status Tables::RestoreFrom(const std::map<std::string, std::string>& extensions,
                                 bool replace) {
  absl::flat_hash_map<std::string, std::shared_ptr<Entry>> restored;
  for (const auto& [key, bytes] : extensions) {
    if (!absl::StartsWith(key, kTablePrefix)) continue;
    auto table = SparseTable::Deserialize(bytes, options_.table);
    if (!table.ok()) {
      return absl::Status(table.status().code(), absl::StrCat("checkpoint extension '", key,
                                                              "': ", table.status().message()));
    }
    auto entry = std::make_shared<Entry>(&timer_, options_.max_workers_per_table);
    entry->table = *std::move(table);
    const std::string name = entry->table->name();
    auto clocks = extensions.find(absl::StrCat(kClocksPrefix, name));
    if (clocks != extensions.end()) {
      absl::Status status = entry->clocks.Restore(clocks->second);
      if (!status.ok()) {
        return absl::Status(status.code(), absl::StrCat("checkpoint extension '", clocks->first,
                                                        "': ", status.message()));
      }
    }
    auto pending = extensions.find(absl::StrCat(kPendingPrefix, name));
    if (pending != extensions.end()) {
      v1::PendingAdds adds;
      if (!adds.ParseFromString(pending->second)) {
        return absl::DataLossError(
            absl::StrCat("checkpoint extension '", pending->first, "' does not parse"));
      }
      absl::MutexLock lock(&entry->bsp_mu);
      for (v1::PendingAdds::Add& add : *adds.mutable_adds()) Hold(*entry, std::move(add));
    }
    restored.emplace(name, std::move(entry));
  }
  absl::MutexLock lock(&mu_);
  if (!replace && !tables_.empty()) {
    return absl::FailedPreconditionError("tables can only be restored into a server without any");
  }
  tables_ = std::move(restored);
  return absl::OkStatus();
}

absl::StatusOr<v1::TableConfig> Tables::ConfigOf(absl::string_view name) const {
  PS_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(name));
  return entry->table->config();
}

std::vector<std::string> Tables::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, entry] : Entries()) names.push_back(name);
  return names;
}

absl::StatusOr<Tables::Exported> Tables::ExportRows(
    const std::string& name, const SparseTable::KeyFilter& keep,
    std::map<std::string, std::string>* extensions) const {
  PS_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(name));
  return ExportEntry(name, *entry, keep, extensions);
}

Tables::Exported Tables::ExportEntry(const std::string& name, Entry& entry,
                                     const SparseTable::KeyFilter& keep,
                                     std::map<std::string, std::string>* extensions) {
  const SparseTable& table = *entry.table;
  Exported exported;
  // Under bsp_mu: no clock change applies held-back adds between the rows
  // and the adds taken.
  absl::MutexLock lock(&entry.bsp_mu);
  std::string rows = table.SerializeRows(keep);
  v1::SparseTableSnapshot snap;
  if (snap.ParseFromString(rows)) {
    exported.rows = snap.rows();
    exported.bytes = snap.values().size() + snap.state().size();
  }
  (*extensions)[absl::StrCat(kTablePrefix, name)] = std::move(rows);
  (*extensions)[absl::StrCat(kClocksPrefix, name)] = entry.clocks.Serialize();
  v1::PendingAdds pending;
  const size_t row_bytes = table.row_bytes();
  for (const auto& [clock, adds] : entry.pending) {
    for (const v1::PendingAdds::Add& add : adds) {
      v1::PendingAdds::Add mine = add;
      mine.set_clock(clock);
      FilterAdd(keep, /*keep_accepted=*/true, row_bytes, &mine);
      if (!mine.keys().empty()) *pending.add_adds() = std::move(mine);
    }
  }
  if (pending.adds_size() > 0) {
    (*extensions)[absl::StrCat(kPendingPrefix, name)] = pending.SerializeAsString();
  }
  return exported;
}

void Tables::DropPending(Entry& entry, const SparseTable::KeyFilter& drop) {
  for (auto it = entry.pending.begin(); it != entry.pending.end();) {
    for (v1::PendingAdds::Add& add : it->second) {
      entry.pending_bytes -= HeldBytes(add);
      DropKeys(drop, entry.table->row_bytes(), &add);
      entry.pending_bytes += HeldBytes(add);
    }
    auto& adds_of_clock = it->second;
    adds_of_clock.erase(std::remove_if(adds_of_clock.begin(), adds_of_clock.end(),
                                       [](const v1::PendingAdds::Add& add) {
                                         return add.keys().empty();
                                       }),
                        adds_of_clock.end());
    it = adds_of_clock.empty() ? entry.pending.erase(it) : std::next(it);
  }
}

absl::StatusOr<uint64_t> Tables::DropRows(const std::string& name,
                                          const SparseTable::KeyFilter& drop) {
  PS_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(name));
  absl::MutexLock lock(&entry->bsp_mu);
  const uint64_t rows = entry->table->EraseRows(drop);
  DropPending(*entry, drop);
  return rows;
}

absl::StatusOr<uint64_t> Tables::ImportRows(const std::map<std::string, std::string>& extensions,
                                            const KeyCheck& check,
                                            const SparseTable::KeyFilter& replaced) {
  // Decoded and vetted whole before anything changes.
  const std::string* rows_bytes = nullptr;
  std::string name;
  for (const auto& [key, bytes] : extensions) {
    absl::string_view table_name = key;
    if (!absl::ConsumePrefix(&table_name, kTablePrefix)) continue;
    if (rows_bytes != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("rows of tables '", name, "' and '",
                                                     table_name, "' in one hand-over"));
    }
    rows_bytes = &bytes;
    name = std::string(table_name);
  }
  if (rows_bytes == nullptr) return absl::InvalidArgumentError("a hand-over without a table");
  v1::SparseTableSnapshot snap;
  if (!snap.ParseFromString(*rows_bytes)) {
    return absl::DataLossError(absl::StrCat("rows of table '", name, "' do not parse"));
  }
  if (snap.name() != name) {
    return absl::DataLossError(
        absl::StrCat("extension table/", name, " holds table '", snap.name(), "'"));
  }
  const v1::TableConfig config = SparseTable::NormalizedConfig(snap.config());
  v1::PendingAdds adds;
  if (auto it = extensions.find(absl::StrCat(kPendingPrefix, name)); it != extensions.end()) {
    if (!adds.ParseFromString(it->second)) {
      return absl::DataLossError(absl::StrCat("held-back adds of table '", name, "' do not parse"));
    }
  }
  std::vector<std::vector<uint64_t>> add_keys;
  for (const v1::PendingAdds::Add& add : adds.adds()) {
    PS_ASSIGN_OR_RETURN(std::vector<uint64_t> keys, DecodeKeys(add.keys()));
    for (uint64_t key : keys) PS_RETURN_IF_ERROR(check(name, config, key));
    add_keys.push_back(std::move(keys));
  }
  for (absl::string_view keys : {absl::string_view(snap.keys()), absl::string_view(snap.pending_keys())}) {
    PS_ASSIGN_OR_RETURN(std::vector<uint64_t> decoded, DecodeKeys(keys));
    for (uint64_t key : decoded) PS_RETURN_IF_ERROR(check(name, config, key));
  }
  absl::StatusOr<std::shared_ptr<Entry>> found = Find(name);
  if (!found.ok()) {
    // New here: the table with the sender's clocks (this server's Clock
    // calls for it were refused until now: retry). Two first copies racing:
    // the first one in is kept, with its clocks.
    PS_RETURN_IF_ERROR(ValidateName("table", name));
    PS_ASSIGN_OR_RETURN(auto table, SparseTable::Create(name, config, options_.table));
    auto entry = std::make_shared<Entry>(&timer_, options_.max_workers_per_table);
    entry->table = std::move(table);
    if (auto it = extensions.find(absl::StrCat(kClocksPrefix, name)); it != extensions.end()) {
      absl::Status restored = entry->clocks.Restore(it->second);
      if (!restored.ok()) {
        return absl::Status(restored.code(), absl::StrCat("clocks of table '", name,
                                                          "' handed over: ", restored.message()));
      }
    }
    absl::MutexLock lock(&mu_);
    found = tables_.emplace(name, std::move(entry)).first->second;
  }
  Entry& entry = **found;
  for (size_t a = 0; a < add_keys.size(); ++a) {
    if (adds.adds(a).values().size() != add_keys[a].size() * entry.table->row_bytes()) {
      return absl::DataLossError(
          absl::StrCat("held-back adds of table '", name, "': keys and values disagree"));
    }
  }
  absl::MutexLock lock(&entry.bsp_mu);
  PS_ASSIGN_OR_RETURN(const uint64_t rows, entry.table->MergeRows(snap, replaced));
  if (replaced) DropPending(entry, replaced);
  for (v1::PendingAdds::Add& add : *adds.mutable_adds()) Hold(entry, std::move(add));
  // Adds of a clock every worker here has passed already apply now.
  ApplyPassed(entry, entry.clocks.MinClock());
  return rows;
}

void Tables::Shutdown() {
  collectives_.Shutdown();
  for (const auto& [name, entry] : Entries()) entry->clocks.Shutdown();
}

}  // namespace pserver
