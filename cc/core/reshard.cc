#include "cc/core/reshard.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <system_error>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "cc/core/element_type.h"
#include "cc/core/placement.h"
#include "cc/core/status_macros.h"
#include "cc/core/tables.h"
#include "google/protobuf/util/message_differencer.h"
#include "pserver/v1/table.pb.h"

namespace pserver {
namespace {

namespace fs = std::filesystem;

// cc/server/applied_sequences.h's extension (cc/core cannot depend on the
// server): per-client push sequences, meaningless to another server count.
constexpr absl::string_view kAppliedSequences = "pserver.applied_sequences";
constexpr absl::string_view kShardPrefix = "shard-";

std::string ShardDirOf(const std::string& dir, uint32_t shard) {
  return absl::StrCat(dir, "/", kShardPrefix, shard);
}

// ---- output directory -----------------------------------------------------------

// `to` without trailing slashes ("/" stays "/").
std::string StripSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// OK when `to` does not exist or is an empty directory.
absl::Status CheckOutput(const std::string& to) {
  struct stat st;
  if (::lstat(to.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("output directory ", to, ": ", std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("output directory ", to, " exists and is not a directory"));
  }
  std::error_code ec;
  if (!fs::is_empty(to, ec) || ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        "output directory ", to, " is not empty: reshard into a new or empty directory"));
  }
  return absl::OkStatus();
}

// ---- input ----------------------------------------------------------------------

struct Input {
  uint32_t shard = 0;
  std::unique_ptr<CheckpointReader> reader;
};

// The newest checkpoint of `dir` that verifies whole (of those written for a
// placement that MapsLike `only`, when set); the newer ones that do not
// verify go into `notes`. NOT_FOUND when `only` leaves none.
absl::StatusOr<std::unique_ptr<CheckpointReader>> NewestGood(
    const std::string& dir, const std::vector<CheckpointEntry>& entries,
    const std::optional<v1::Placement>& only, std::vector<std::string>* notes) {
  std::vector<std::string> failures;
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(it->path);
    if (reader.ok() && only.has_value() && !MapsLike((*reader)->info().placement, *only)) {
      continue;  // another generation's
    }
    absl::Status status = reader.status();
    if (status.ok()) status = (*reader)->Verify();
    if (status.ok()) {
      for (const std::string& f : failures) notes->push_back(absl::StrCat("skipped ", f));
      return reader;
    }
    failures.push_back(absl::StrCat(it->path, ": ", status.message()));
  }
  if (failures.empty()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint of the placement looked for in ", dir));
  }
  return absl::DataLossError(absl::StrCat("no checkpoint in ", dir,
                                          " verifies: ", absl::StrJoin(failures, "; ")));
}

}  // namespace

absl::StatusOr<std::map<uint32_t, std::vector<CheckpointEntry>>> ListShardCheckpoints(
    const std::string& from) {
  std::error_code ec;
  if (!fs::is_directory(from, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory ", from, " does not exist"));
  }
  std::map<uint32_t, std::vector<CheckpointEntry>> shards;
  for (const fs::directory_entry& entry : fs::directory_iterator(from, ec)) {
    absl::string_view name = entry.path().filename().native();
    uint32_t shard = 0;
    if (!absl::ConsumePrefix(&name, kShardPrefix) || !absl::SimpleAtoi(name, &shard) ||
        name != absl::StrCat(shard)) {
      continue;
    }
    PS_ASSIGN_OR_RETURN(std::vector<CheckpointEntry> held, ListCheckpoints(entry.path().string()));
    if (!held.empty()) shards[shard] = std::move(held);
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", from, ": ", ec.message()));
  return shards;
}

namespace {

// The chosen checkpoint of every shard 0..N-1 of `from`, checked to be one
// cluster's.
absl::StatusOr<std::vector<Input>> OpenInputs(const std::string& from, ReshardResult* result,
                                              const ReshardOptions& options) {
  PS_ASSIGN_OR_RETURN(auto shards, ListShardCheckpoints(from));
  if (shards.empty()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint in ", from,
                                            ": no shard-<k> directory holding ckpt-* directories"));
  }
  std::vector<Input> inputs;
  for (const auto& [shard, held] : shards) {
    const std::string dir = ShardDirOf(from, shard);
    absl::StatusOr<std::unique_ptr<CheckpointReader>> newest =
        NewestGood(dir, held, options.from_placement, &result->notes);
    if (absl::IsNotFound(newest.status())) continue;  // none of this generation
    PS_RETURN_IF_ERROR(newest.status());
    std::unique_ptr<CheckpointReader> reader = *std::move(newest);
    const CheckpointInfo info = reader->info();
    if (info.shard != shard) {
      return absl::DataLossError(absl::StrCat("checkpoint ", info.path, " belongs to shard ",
                                              info.shard, ", but lies in ", dir));
    }
    if (options.progress) {
      options.progress(absl::StrCat("read shard ", shard, ": ", info.path, " (sequence ",
                                    info.sequence, ", every checksum verified)"));
    }
    inputs.push_back(Input{shard, std::move(reader)});
  }
  if (inputs.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no checkpoint in ", from, " of placement ",
                     options.from_placement.has_value() ? options.from_placement->ShortDebugString()
                                                        : std::string("(any)")));
  }
  // One cluster, one server count.
  const CheckpointInfo first = inputs[0].reader->info();
  uint32_t recorded = 0;
  std::string recorded_by;
  for (const Input& in : inputs) {
    const CheckpointInfo info = in.reader->info();
    if (info.cluster != first.cluster) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoints of different clusters in ", from, ": ", first.path, " is of cluster '",
          first.cluster, "', ", info.path, " of cluster '", info.cluster, "'"));
    }
    if (info.num_servers == 0) continue;
    if (recorded != 0 && info.num_servers != recorded) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoints of different server counts in ", from, ": ", recorded_by,
          " was written by ", recorded, " servers, ", info.path, " by ", info.num_servers));
    }
    recorded = info.num_servers;
    recorded_by = info.path;
  }
  const uint32_t n = recorded != 0 ? recorded : inputs.back().shard + 1;
  if (inputs.back().shard >= n) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoints of different server counts in ", from, ": ", recorded_by, " was written by ",
        n, " servers, but there is shard ", inputs.back().shard, " (",
        inputs.back().reader->path(), ")"));
  }
  for (uint32_t k = 0; k < n; ++k) {
    if (k >= inputs.size() || inputs[k].shard != k) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", k, " of ", n, " is missing: no checkpoint in ",
                       ShardDirOf(from, k), "; every shard's checkpoint is needed to reshard"));
    }
  }
  result->from_servers = n;
  result->cluster = first.cluster;
  for (const Input& in : inputs) {
    result->inputs.push_back(in.reader->path());
    result->sequence = std::max(result->sequence, in.reader->info().sequence);
  }
  ++result->sequence;
  return inputs;
}

// ---- dense blocks ---------------------------------------------------------------

// A block of an input checkpoint: (input, index into its parameters).
using BlockRef = std::pair<const CheckpointReader*, int>;

// Checks every parameter is whole (each block once, consistent type, shape
// and block count) and returns, per output shard, the blocks it gets.
absl::StatusOr<std::vector<std::vector<BlockRef>>> PlanBlocks(const std::vector<Input>& inputs,
                                                              const Placement& placement) {
  struct Seen {
    v1::CheckpointParameter first;  // without data
    std::string where;
    std::set<uint32_t> blocks;
  };
  std::map<std::string, Seen> params;
  std::vector<std::vector<BlockRef>> plan(placement.num_servers());
  for (const Input& in : inputs) {
    const auto& list = in.reader->manifest().parameters();
    for (int i = 0; i < list.size(); ++i) {
      const v1::CheckpointParameter& p = list[i];
      const uint32_t count = std::max<uint32_t>(1, p.block().count());
      const uint32_t index = p.block().index();
      auto [it, fresh] = params.try_emplace(p.name());
      Seen& seen = it->second;
      if (fresh) {
        seen.first.set_element_type(p.element_type());
        *seen.first.mutable_shape() = p.shape();
        seen.first.mutable_block()->set_count(count);
        seen.where = in.reader->path();
      } else if (seen.first.element_type() != p.element_type() ||
                 seen.first.shape_size() != p.shape_size() ||
                 !std::equal(p.shape().begin(), p.shape().end(), seen.first.shape().begin()) ||
                 seen.first.block().count() != count) {
        return absl::DataLossError(absl::StrCat("checkpoints ", seen.where, " and ",
                                                in.reader->path(), " disagree on parameter '",
                                                p.name(), "' (type, shape or block count)"));
      }
      if (index >= count || !seen.blocks.insert(index).second) {
        return absl::DataLossError(absl::StrCat("parameter '", p.name(), "' block ", index,
                                                " of ", count, " in ", in.reader->path(),
                                                index >= count ? " is out of range"
                                                               : " is in two checkpoints"));
      }
      plan[placement.ServerOf(p.name(), index)].emplace_back(in.reader.get(), i);
    }
  }
  for (const auto& [name, seen] : params) {
    if (seen.blocks.size() != seen.first.block().count()) {
      return absl::DataLossError(
          absl::StrCat("parameter '", name, "' is cut into ", seen.first.block().count(),
                       " blocks but the checkpoints hold ", seen.blocks.size(), " of them"));
    }
  }
  return plan;
}

// ---- tables ---------------------------------------------------------------------

// A table's extensions over the inputs.
struct TableParts {
  std::vector<std::pair<const CheckpointReader*, int>> tables;   // "table/<name>"
  std::vector<std::pair<const CheckpointReader*, int>> pending;  // "pending/<name>"
  bool has_clocks = false;
  std::string clocks;  // the merged v1::WorkerClocksSnapshot
};

absl::StatusOr<std::string> ReadExtension(const CheckpointReader& reader, int index) {
  return reader.ReadData(reader.manifest().extensions(index).data());
}

template <typename Message>
absl::StatusOr<Message> ParseExtension(const CheckpointReader& reader, int index) {
  PS_ASSIGN_OR_RETURN(std::string bytes, ReadExtension(reader, index));
  Message message;
  if (bytes.size() > static_cast<size_t>(INT32_MAX) || !message.ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat("extension '",
                                            reader.manifest().extensions(index).name(), "' in ",
                                            reader.path(), " does not parse"));
  }
  return message;
}

// The workers of every input's clocks: each at the lowest clock recorded.
absl::StatusOr<std::string> MergeClocks(
    const std::string& table, const std::vector<std::pair<const CheckpointReader*, int>>& parts,
    std::vector<std::string>* notes) {
  std::map<std::string, std::pair<int64_t, int64_t>> range;  // worker -> (lowest, highest)
  std::map<std::string, size_t> present;
  for (const auto& [reader, index] : parts) {
    PS_ASSIGN_OR_RETURN(auto snapshot, ParseExtension<v1::WorkerClocksSnapshot>(*reader, index));
    for (const v1::WorkerClocksSnapshot::Worker& w : snapshot.workers()) {
      auto [it, fresh] = range.try_emplace(w.id(), w.clock(), w.clock());
      it->second.first = std::min(it->second.first, w.clock());
      it->second.second = std::max(it->second.second, w.clock());
      ++present[w.id()];
    }
  }
  v1::WorkerClocksSnapshot merged;
  for (const auto& [id, lowest_highest] : range) {
    const auto [lowest, highest] = lowest_highest;
    if (lowest != highest || present[id] != parts.size()) {
      notes->push_back(absl::StrCat("table '", table, "': worker '", id, "' has clocks ", lowest,
                                    "..", highest, " on ", present[id], " of ", parts.size(),
                                    " shards; kept the lowest, ", lowest));
    }
    v1::WorkerClocksSnapshot::Worker* w = merged.add_workers();
    w->set_id(id);
    w->set_clock(lowest);
  }
  return merged.SerializeAsString();
}

// Every table's parts; refuses an extension it does not know.
absl::StatusOr<std::map<std::string, TableParts>> PlanTables(const std::vector<Input>& inputs,
                                                             std::vector<std::string>* notes) {
  std::map<std::string, TableParts> tables;
  std::map<std::string, std::vector<std::pair<const CheckpointReader*, int>>> clocks;
  bool dropped_sequences = false;
  for (const Input& in : inputs) {
    const auto& extensions = in.reader->manifest().extensions();
    for (int i = 0; i < extensions.size(); ++i) {
      absl::string_view name = extensions[i].name();
      if (name == kAppliedSequences) {
        dropped_sequences = true;
      } else if (absl::ConsumePrefix(&name, Tables::kTablePrefix)) {
        tables[std::string(name)].tables.emplace_back(in.reader.get(), i);
      } else if (absl::ConsumePrefix(&name, Tables::kPendingPrefix)) {
        tables[std::string(name)].pending.emplace_back(in.reader.get(), i);
      } else if (absl::ConsumePrefix(&name, Tables::kClocksPrefix)) {
        clocks[std::string(name)].emplace_back(in.reader.get(), i);
      } else {
        return absl::FailedPreconditionError(
            absl::StrCat("checkpoint ", in.reader->path(), " holds extension '", name,
                         "', which resharding does not know how to split"));
      }
    }
  }
  for (auto& [name, parts] : clocks) {
    auto it = tables.find(name);
    if (it == tables.end() || it->second.tables.empty()) continue;  // as Tables::RestoreFrom
    PS_ASSIGN_OR_RETURN(it->second.clocks, MergeClocks(name, parts, notes));
    it->second.has_clocks = true;
  }
  for (auto it = tables.begin(); it != tables.end();) {
    it = it->second.tables.empty() ? tables.erase(it) : std::next(it);
  }
  if (dropped_sequences) {
    notes->push_back(
        "dropped the exactly-once sets (pserver.applied_sequences): clients' per-server "
        "sequences do not carry over to another server count; restart the job's clients");
  }
  return tables;
}

struct RowLayout {
  size_t row_bytes = 0;
  size_t state_bytes = 0;
};

absl::StatusOr<RowLayout> LayoutOf(const v1::SparseTableSnapshot& snap, const std::string& what) {
  v1::ElementType type = snap.config().element_type();
  if (type == v1::ELEMENT_TYPE_UNSPECIFIED) type = v1::FLOAT32;
  const size_t esize = ElementSize(type);
  if (esize == 0 || snap.config().dim() == 0) {
    return absl::DataLossError(absl::StrCat(what, ": bad element type or dim 0"));
  }
  RowLayout layout{snap.config().dim() * esize, snap.state_per_row() * esize};
  const uint64_t rows = snap.rows();
  const uint64_t pending = snap.pending_keys().size() / 8;
  if (snap.keys().size() / 8 != rows || snap.keys().size() % 8 != 0 ||
      snap.values().size() != rows * layout.row_bytes ||
      snap.state().size() != rows * layout.state_bytes || snap.steps().size() != rows * 8 ||
      snap.pending_keys().size() % 8 != 0 || snap.pending_counts().size() != pending * 4) {
    return absl::DataLossError(
        absl::StrCat(what, ": its keys, values, state, steps or pending keys do not match ",
                     rows, " rows"));
  }
  return layout;
}

uint64_t KeyAt(const std::string& bytes, size_t i) {
  uint64_t key;
  std::memcpy(&key, bytes.data() + i * 8, 8);
  return key;
}

// Appends the rows and pending keys of `in` that output shard `shard` of `m`
// holds to `out`, which was started from the first part (config, layout).
absl::Status AppendRows(const v1::SparseTableSnapshot& in, const std::string& what,
                        const RowLayout& layout, uint32_t shard, const Placement& placement,
                        v1::SparseTableSnapshot* out) {
  const v1::Partitioning& partitioning = in.config().partitioning();
  auto owned = [&](uint64_t key) -> absl::StatusOr<bool> {
    absl::StatusOr<int> server = KeyServer(key, partitioning, placement);
    if (!server.ok()) return absl::DataLossError(absl::StrCat(what, ": ", server.status().message()));
    return static_cast<uint32_t>(*server) == shard;
  };
  uint64_t rows = out->rows();
  for (uint64_t r = 0; r < in.rows(); ++r) {
    PS_ASSIGN_OR_RETURN(bool mine, owned(KeyAt(in.keys(), r)));
    if (!mine) continue;
    out->mutable_keys()->append(in.keys(), r * 8, 8);
    out->mutable_values()->append(in.values(), r * layout.row_bytes, layout.row_bytes);
    out->mutable_state()->append(in.state(), r * layout.state_bytes, layout.state_bytes);
    out->mutable_steps()->append(in.steps(), r * 8, 8);
    ++rows;
  }
  out->set_rows(rows);
  for (size_t p = 0; p < in.pending_keys().size() / 8; ++p) {
    PS_ASSIGN_OR_RETURN(bool mine, owned(KeyAt(in.pending_keys(), p)));
    if (!mine) continue;
    out->mutable_pending_keys()->append(in.pending_keys(), p * 8, 8);
    out->mutable_pending_counts()->append(in.pending_counts(), p * 4, 4);
  }
  return absl::OkStatus();
}

// Output shard `shard`'s part of table `name`: "table/<name>" and, when there
// are any, "pending/<name>", into `extensions`. Returns the rows.
absl::StatusOr<uint64_t> ReshardTable(const std::string& name, const TableParts& parts,
                                      uint32_t shard, const Placement& placement,
                                      std::map<std::string, std::string>* extensions) {
  const uint32_t m = static_cast<uint32_t>(placement.num_servers());
  v1::SparseTableSnapshot out;
  RowLayout layout;
  std::string first_path;
  for (const auto& [reader, index] : parts.tables) {
    PS_ASSIGN_OR_RETURN(auto in, ParseExtension<v1::SparseTableSnapshot>(*reader, index));
    const std::string what = absl::StrCat("table '", name, "' in ", reader->path());
    PS_ASSIGN_OR_RETURN(RowLayout part_layout, LayoutOf(in, what));
    if (first_path.empty()) {
      first_path = reader->path();
      layout = part_layout;
      out.set_name(in.name());
      *out.mutable_config() = in.config();
      out.set_state_per_row(in.state_per_row());
    } else if (!google::protobuf::util::MessageDifferencer::Equals(in.config(), out.config()) ||
               in.state_per_row() != out.state_per_row() || in.name() != out.name()) {
      return absl::DataLossError(absl::StrCat("checkpoints ", first_path, " and ", reader->path(),
                                              " disagree on table '", name, "''s config"));
    }
    PS_RETURN_IF_ERROR(AppendRows(in, what, layout, shard, placement, &out));
    if (shard == 0) {  // the cluster's totals, kept on one server
      out.set_evictions(out.evictions() + in.evictions());
      out.set_keys_pulled(out.keys_pulled() + in.keys_pulled());
      out.set_keys_pushed(out.keys_pushed() + in.keys_pushed());
      out.set_admissions(out.admissions() + in.admissions());
      out.set_admission_refusals(out.admission_refusals() + in.admission_refusals());
    }
  }
  const uint64_t capacity = out.config().eviction().capacity();
  if (capacity > 0 && out.rows() > capacity) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table '", name, "' would hold ", out.rows(), " rows on server ", shard, " of ", m,
        ", more than its eviction.capacity ", capacity, " per server: reshard to more servers"));
  }
  if (out.ByteSizeLong() > static_cast<size_t>(INT32_MAX)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("table '", name, "' on server ", shard, " of ", m, " would be ",
                     out.ByteSizeLong(), " bytes, past 2 GiB: reshard to more servers"));
  }
  (*extensions)[absl::StrCat(Tables::kTablePrefix, name)] = out.SerializeAsString();

  // Held-back adds, split by key; per key, the order of its (one) input.
  std::map<int64_t, std::vector<v1::PendingAdds::Add>> by_clock;
  for (const auto& [reader, index] : parts.pending) {
    PS_ASSIGN_OR_RETURN(auto adds, ParseExtension<v1::PendingAdds>(*reader, index));
    for (const v1::PendingAdds::Add& add : adds.adds()) {
      const size_t n = add.keys().size() / 8;
      if (add.keys().size() % 8 != 0 || add.values().size() != n * layout.row_bytes) {
        return absl::DataLossError(absl::StrCat("held-back adds of table '", name, "' in ",
                                                reader->path(), ": keys and values disagree"));
      }
      v1::PendingAdds::Add mine;
      mine.set_clock(add.clock());
      for (size_t k = 0; k < n; ++k) {
        PS_ASSIGN_OR_RETURN(
            int server, KeyServer(KeyAt(add.keys(), k), out.config().partitioning(), placement));
        if (static_cast<uint32_t>(server) != shard) continue;
        mine.mutable_keys()->append(add.keys(), k * 8, 8);
        mine.mutable_values()->append(add.values(), k * layout.row_bytes, layout.row_bytes);
      }
      if (!mine.keys().empty()) by_clock[add.clock()].push_back(std::move(mine));
    }
  }
  if (!by_clock.empty()) {
    v1::PendingAdds pending;
    for (auto& [clock, adds] : by_clock) {
      for (v1::PendingAdds::Add& add : adds) *pending.add_adds() = std::move(add);
    }
    (*extensions)[absl::StrCat(Tables::kPendingPrefix, name)] = pending.SerializeAsString();
  }
  if (parts.has_clocks) (*extensions)[absl::StrCat(Tables::kClocksPrefix, name)] = parts.clocks;
  return out.rows();
}

uint64_t DataBytes(const StoreSnapshot& snapshot) {
  uint64_t bytes = 0;
  for (const BlockSnapshot& block : snapshot.blocks) {
    bytes += block.content.size();
    for (const auto& [name, slot] : block.optimizer.slots) bytes += slot.size();
  }
  for (const auto& [name, value] : snapshot.extensions) bytes += value.size();
  return bytes;
}

std::string RandomHex() {
  absl::BitGen gen;
  return absl::StrFormat("%016x", absl::Uniform<uint64_t>(gen));
}

// What every output shard is made of.
struct Plan {
  Placement placement;
  std::vector<std::vector<BlockRef>> blocks;  // per output shard
  std::map<std::string, TableParts> tables;
  bool initialized = false;
};

absl::StatusOr<Plan> MakePlan(const std::vector<Input>& inputs, const ReshardOptions& options,
                              ReshardResult* result) {
  Plan plan{Placement(static_cast<int>(options.num_servers), 1), {}, {}, false};
  PS_ASSIGN_OR_RETURN(plan.blocks, PlanBlocks(inputs, plan.placement));
  PS_ASSIGN_OR_RETURN(plan.tables, PlanTables(inputs, &result->notes));
  for (const Input& in : inputs) plan.initialized |= in.reader->manifest().initialized();
  return plan;
}

// Output shard `shard`'s store; adds its blocks, rows and bytes to `result`.
absl::StatusOr<StoreSnapshot> BuildShard(const Plan& plan, uint32_t shard,
                                         ReshardResult* result, uint64_t* rows) {
  StoreSnapshot snapshot;
  snapshot.initialized = plan.initialized;
  for (const auto& [reader, index] : plan.blocks[shard]) {
    PS_ASSIGN_OR_RETURN(BlockSnapshot block, reader->ReadBlock(index));
    snapshot.blocks.push_back(std::move(block));
  }
  *rows = 0;
  for (const auto& [name, parts] : plan.tables) {
    PS_ASSIGN_OR_RETURN(uint64_t table_rows,
                        ReshardTable(name, parts, shard, plan.placement, &snapshot.extensions));
    *rows += table_rows;
  }
  result->blocks += snapshot.blocks.size();
  result->table_rows += *rows;
  result->bytes += DataBytes(snapshot);
  return snapshot;
}

// Writes every output shard's checkpoint under `tmp`.
absl::Status WriteShards(const std::vector<Input>& inputs, const std::string& tmp,
                         const ReshardOptions& options, ReshardResult* result) {
  const uint32_t m = options.num_servers;
  PS_ASSIGN_OR_RETURN(Plan plan, MakePlan(inputs, options, result));
  CheckpointWriteOptions write;
  write.file_mode = options.file_mode;
  write.cluster = result->cluster;
  write.num_servers = m;
  write.placement = plan.placement.spec();
  for (uint32_t shard = 0; shard < m; ++shard) {
    uint64_t rows = 0;
    PS_ASSIGN_OR_RETURN(StoreSnapshot snapshot, BuildShard(plan, shard, result, &rows));
    PS_ASSIGN_OR_RETURN(CheckpointInfo info, SaveCheckpoint(snapshot, ShardDirOf(tmp, shard),
                                                            shard, result->sequence, write));
    result->written.push_back(std::move(info));
    if (options.progress) {
      options.progress(absl::StrCat("wrote shard ", shard + 1, "/", m, ": ",
                                    snapshot.blocks.size(), " blocks, ", rows, " table rows, ",
                                    DataBytes(snapshot), " bytes (", result->bytes,
                                    " bytes so far)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const ReshardOptions& options) {
  if (options.num_servers < 1 || options.num_servers > kMaxReshardServers) {
    return absl::InvalidArgumentError(absl::StrCat("the server count to reshard to must be in [1, ",
                                                   kMaxReshardServers, "], got ",
                                                   options.num_servers));
  }
  return CheckCheckpointFileMode(options.file_mode);
}

}  // namespace

absl::StatusOr<ReshardResult> ReshardCheckpoints(const std::string& from, const std::string& to_in,
                                                 const ReshardOptions& options) {
  PS_RETURN_IF_ERROR(CheckOptions(options));
  if (from.empty() || to_in.empty()) {
    return absl::InvalidArgumentError("the input and output directories must be named");
  }
  const std::string to = StripSlashes(to_in);
  std::error_code ec;
  if (fs::weakly_canonical(from, ec) == fs::weakly_canonical(to, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reshard writes a new directory: ", to, " is the input ", from));
  }
  PS_RETURN_IF_ERROR(CheckOutput(to));
  ReshardResult result;
  result.to_servers = options.num_servers;
  PS_ASSIGN_OR_RETURN(std::vector<Input> inputs, OpenInputs(from, &result, options));

  fs::path target(to);
  const std::string parent =
      target.has_parent_path() ? target.parent_path().string() : std::string(".");
  const std::string tmp = absl::StrCat(parent, "/.", target.filename().string(), ".tmp-reshard-",
                                       RandomHex());
  PS_RETURN_IF_ERROR(CheckWritableDirectory(tmp, options.file_mode));
  absl::Status status = WriteShards(inputs, tmp, options, &result);
  if (status.ok()) status = SyncDirectory(tmp);
  if (status.ok()) status = CheckOutput(to);  // nobody filled it meanwhile
  if (status.ok() && std::rename(tmp.c_str(), to.c_str()) != 0) {
    status = absl::FailedPreconditionError(
        absl::StrCat("cannot rename ", tmp, " to ", to, ": ", std::strerror(errno)));
  }
  if (!status.ok()) {
    fs::remove_all(tmp, ec);
    return status;
  }
  PS_RETURN_IF_ERROR(SyncDirectory(parent));
  for (CheckpointInfo& info : result.written) {
    info.path = absl::StrCat(ShardDirOf(to, info.shard), "/", CheckpointDirName(info.sequence));
  }
  if (options.progress) {
    for (const std::string& note : result.notes) options.progress(absl::StrCat("note: ", note));
    options.progress(absl::StrCat("resharded ", result.from_servers, " servers' checkpoints to ",
                                  result.to_servers, " in ", to, ": ", result.blocks,
                                  " blocks, ", result.table_rows, " table rows, ", result.bytes,
                                  " bytes, sequence ", result.sequence));
  }
  return result;
}

absl::StatusOr<ReshardedShard> ReshardShard(const std::string& from, uint32_t shard,
                                            const ReshardOptions& options) {
  PS_RETURN_IF_ERROR(CheckOptions(options));
  if (shard >= options.num_servers) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", shard, " is not one of ", options.num_servers, " servers"));
  }
  ReshardedShard out;
  out.result.to_servers = options.num_servers;
  PS_ASSIGN_OR_RETURN(std::vector<Input> inputs, OpenInputs(from, &out.result, options));
  PS_ASSIGN_OR_RETURN(Plan plan, MakePlan(inputs, options, &out.result));
  uint64_t rows = 0;
  PS_ASSIGN_OR_RETURN(out.snapshot, BuildShard(plan, shard, &out.result, &rows));
  return out;
}

bool MapsLike(const v1::Placement& a, const v1::Placement& b) {
  if (a.num_servers() != 0 && b.num_servers() != 0 && a.num_servers() != b.num_servers()) {
    return false;
  }
  return a.kind() == b.kind() || (a.num_servers() == 1 && b.num_servers() <= 1) ||
         (b.num_servers() == 1 && a.num_servers() <= 1);
}

absl::StatusOr<std::optional<v1::Placement>> PlacementToReshardFrom(
    const std::string& dir, uint32_t shard, const v1::Placement& current) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  PS_ASSIGN_OR_RETURN(auto shards, ListShardCheckpoints(dir));
  uint64_t own_current = 0;  // the newest of `shard` that maps like `current`
  std::optional<CheckpointInfo> other;  // the newest anywhere that does not
  for (const auto& [k, held] : shards) {
    for (const CheckpointEntry& entry : held) {
      absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(entry.path);
      if (!reader.ok()) continue;  // a damaged one is the loader's business
      const CheckpointInfo& info = (*reader)->info();
      if (MapsLike(info.placement, current)) {
        if (k == shard) own_current = std::max(own_current, info.sequence);
      } else if (!other.has_value() || info.sequence > other->sequence) {
        other = info;
      }
    }
  }
  if (!other.has_value() || other->sequence <= own_current) return std::nullopt;
  return other->placement;
}

}  // namespace pserver
