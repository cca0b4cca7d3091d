#include "cc/server/move.h"

#include <malloc.h>

#include <algorithm>
#include <limits>
#include <map>
#include <iterator>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/core/placement.h"
#include "cc/core/reshard.h"
#include "cc/core/status_macros.h"
#include "cc/rpc/grpc_status.h"
#include "cc/server/replication.h"
#include "grpcpp/grpcpp.h"
#include "pserver/v1/service.grpc.pb.h"

namespace pserver {
namespace {

uint64_t StateBytes(const BlockSnapshot& block) {
  uint64_t bytes = block.content.size();
  for (const auto& [name, slot] : block.optimizer.slots) bytes += slot.size();
  return bytes;
}

// Takes one table's hand-over (`extensions`, as Tables::ExportRows wrote
// them) into `tables` as it is: every key accepted, nothing replaced (a
// backup applying what its primary vetted; a copy of its own).
absl::Status ImportAsIs(Tables& tables, const std::map<std::string, std::string>& extensions) {
  return tables
      .ImportRows(
          extensions,
          [](const std::string&, const v1::TableConfig&, uint64_t) { return absl::OkStatus(); },
          [](uint64_t) { return false; })
      .status();
}

// The part of one table's hand-over whose keys `keep` accepts, in the same
// form: the hand-over taken into tables of its own and exported again.
absl::StatusOr<std::map<std::string, std::string>> KeepTableRows(
    const std::map<std::string, std::string>& extensions, const SparseTable::KeyFilter& keep) {
  Tables scratch;
  PS_RETURN_IF_ERROR(ImportAsIs(scratch, extensions));
  const std::vector<std::string> names = scratch.Names();
  std::map<std::string, std::string> kept;
  PS_RETURN_IF_ERROR(scratch.ExportRows(names.at(0), keep, &kept).status());
  scratch.Shutdown();
  return kept;
}

}  // namespace

BlockMover::~BlockMover() {
  std::thread worker;
  {
    absl::MutexLock lock(&worker_mu_);
    worker = std::move(worker_);
  }
  if (worker.joinable()) worker.join();  // it takes worker_mu_ as it ends
}

void BlockMover::MoveAsync(const v1::MoveBlocksRequest& request, v1::MoveBlocksResponse* response,
                           std::function<void(absl::Status)> done) {
  absl::MutexLock lock(&worker_mu_);
  if (running_) {
    return done(absl::UnavailableError(
        "this server is handing blocks over already (an earlier MoveBlocks); retry"));
  }
  // Finished (it cleared running_); it may still be calling its done.
  if (worker_.joinable()) worker_.join();
  running_ = true;
  worker_ = std::thread([this, request, response, done = std::move(done)] {
    absl::StatusOr<v1::MoveBlocksResponse> moved = Move(request);
    {
      absl::MutexLock lock(&worker_mu_);
      running_ = false;
    }
    if (moved.ok()) *response = *std::move(moved);
    done(moved.status());
  });
}

absl::StatusOr<v1::MoveBlocksResponse> BlockMover::Move(const v1::MoveBlocksRequest& request) {
  absl::MutexLock serial(&move_mu_);
  PlacementGate& gate = *options_.gate;
  const v1::Placement spec = gate.spec();
  const uint64_t version = request.version();
  if (spec.version() < version) {
    return absl::UnavailableError(absl::StrCat("server ", gate.self(), " knows placement version ",
                                               spec.version(), ", not yet ", version, "; retry"));
  }
  if (spec.version() != version || !spec.moving()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "MoveBlocks for placement version ", version, ": this server is at version ",
        spec.version(), spec.moving() ? " (moving)" : " (not moving)",
        "; read etcd /placement and ask for the move it holds"));
  }
  // What leaves this server, by destination, in (name, index) order.
  std::map<int, std::vector<PlacementGate::BlockKey>> leaving;
  for (PlacementGate::BlockKey& key : options_.store->BlockKeys()) {
    if (std::optional<int> to = gate.Destination(version, key.first, key.second)) {
      leaving[*to].push_back(std::move(key));
    }
  }
  v1::MoveBlocksResponse response;
  uint32_t batches_sent = 0;
  for (const auto& [to, keys] : leaving) {
    StoreSnapshot batch;
    std::vector<PlacementGate::BlockKey> held;
    uint64_t batch_bytes = 0;
    auto flush = [&]() -> absl::Status {
      if (held.empty()) return absl::OkStatus();
      // Held here and on the backups before the copy can reach the new owner.
      absl::Status sent = Mark(version, v1::MoveMarks::HELD, held);
      if (sent.ok()) sent = Send(version, static_cast<uint32_t>(to), batch);
      if (sent.ok()) BatchSent(&batches_sent);
      if (sent.ok()) {
        sent = Mark(version, v1::MoveMarks::HANDED_OVER, held);  // releases them
      } else if (!replicated()) {
        gate.Release(held, /*handed_over=*/false);  // served here again
      }
      if (!sent.ok() && options_.log) {
        options_.log(absl::StrCat("placement version ", version, ": handing ", held.size(),
                                  " blocks to server ", to, " failed (",
                                  replicated() ? "held here; " : "served here again; ",
                                  "MoveBlocks again sends them): ", sent.ToString()));
      }
      if (sent.ok()) {
        response.set_blocks_moved(response.blocks_moved() + held.size());
        response.set_bytes_moved(response.bytes_moved() + batch_bytes);
      }
      batch.blocks.clear();
      held.clear();
      batch_bytes = 0;
      return sent;
    };
    for (const PlacementGate::BlockKey& key : keys) {
      {
        // No push is between its gate check and its apply meanwhile: once
        // held, nothing changes the block here.
        absl::WriterMutexLock lock(&options_.dispatcher->apply_mu());
        gate.Hold({key});
      }
      held.push_back(key);
      absl::StatusOr<StoreSnapshot> one = options_.store->TakeSnapshot(
          [&](absl::string_view name, uint32_t index) {
            return index == key.second && name == key.first;
          });
      if (!one.ok()) {
        // Replicated: a held block stays held (its backups may hold the mark).
        if (!replicated()) gate.Release(held, /*handed_over=*/false);
        return one.status();
      }
      batch.initialized = one->initialized;
      for (BlockSnapshot& block : one->blocks) {
        batch_bytes += StateBytes(block);
        batch.blocks.push_back(std::move(block));
      }
      if (batch_bytes >= options_.batch_bytes) PS_RETURN_IF_ERROR(flush());
    }
    PS_RETURN_IF_ERROR(flush());
  }
  PS_RETURN_IF_ERROR(MoveTables(version, &response, &batches_sent));
  response.set_blocks_handed_over(gate.handed_over());
  if (options_.log && (response.blocks_moved() > 0 || response.rows_moved() > 0)) {
    options_.log(absl::StrCat("placement version ", version, ": handed ",
                              response.blocks_moved(), " blocks and ", response.rows_moved(),
                              " table rows (", response.bytes_moved(),
                              " bytes) to their new owners"));
  }
  return response;
}

absl::Status BlockMover::Send(uint64_t version, uint32_t to, const StoreSnapshot& batch,
                              const std::vector<v1::MovedBuckets>& buckets) {
  PS_ASSIGN_OR_RETURN(std::vector<v1::SnapshotFile> files,
                      SnapshotToFiles(batch, static_cast<uint32_t>(options_.gate->self()),
                                      options_.write_options));
  v1::ReceiveBlocksRequest request;
  request.set_version(version);
  request.set_from_server(static_cast<uint32_t>(options_.gate->self()));
  for (v1::SnapshotFile& file : files) *request.add_files() = std::move(file);
  for (const v1::MovedBuckets& moved : buckets) *request.add_table_buckets() = moved;
  grpc::ChannelArguments arguments;
  arguments.SetMaxSendMessageSize(-1);
  const absl::Time deadline = absl::Now() + options_.send_timeout;
  std::string address;
  std::unique_ptr<v1::ParameterServer::Stub> stub;
  absl::Status status;
  // UNAVAILABLE: the destination has not seen the placement yet, is still
  // starting, or died and its standby is taking over (/ps/<to> is read
  // again every attempt: its successor's address); retried until the
  // deadline.
  for (int attempt = 0; attempt < 10000; ++attempt) {
    absl::StatusOr<std::string> now = options_.address_of(to);
    if (now.ok() && *now != address) {
      address = *now;
      stub = v1::ParameterServer::NewStub(PeerChannel(address, options_.peer, arguments));
    }
    if (stub == nullptr) {
      status = now.status();
    } else {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(deadline));
      AddPeerMetadata(options_.peer, &context);
      v1::ReceiveBlocksResponse response;
      status = FromGrpcStatus(stub->ReceiveBlocks(&context, request, &response));
    }
    const bool retry = absl::IsUnavailable(status) || absl::IsNotFound(status);
    if (!retry || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("handing ", batch.blocks.size(), " blocks",
                                     buckets.empty() ? "" : " and table buckets", " to server ", to,
                                     " at ", address.empty() ? "(not registered)" : address, ": ",
                                     status.message()));
  }
  return absl::OkStatus();
}

void BlockMover::BatchSent(uint32_t* batches_sent) const {
  if (++*batches_sent == options_.stall_after_batches && options_.stall) options_.stall();
}

absl::Status BlockMover::Mark(uint64_t version, v1::MoveMarks::State state,
                              const std::vector<PlacementGate::BlockKey>& blocks,
                              const std::vector<v1::MovedBuckets>& buckets) {
  v1::MoveMarks marks;
  marks.set_version(version);
  marks.set_state(state);
  for (const PlacementGate::BlockKey& key : blocks) {
    v1::ParamRef* ref = marks.add_blocks();
    ref->set_name(key.first);
    ref->mutable_block()->set_index(key.second);
  }
  for (const v1::MovedBuckets& moved : buckets) *marks.add_buckets() = moved;
  return ShipMarks(marks);
}

absl::Status BlockMover::ShipMarks(const v1::MoveMarks& marks, DroppedMarked* dropped) {
  if (marks.blocks_size() > kMaxMoveMarkBlocks) {
    // In records of at most kMaxMoveMarkBlocks blocks (what a backup
    // takes), the buckets with the last.
    DroppedMarked total;
    for (int first = 0; first < marks.blocks_size(); first += kMaxMoveMarkBlocks) {
      const int end = std::min(marks.blocks_size(), first + kMaxMoveMarkBlocks);
      v1::MoveMarks part;
      part.set_version(marks.version());
      part.set_state(marks.state());
      for (int i = first; i < end; ++i) *part.add_blocks() = marks.blocks(i);
      if (end == marks.blocks_size()) {
        *part.mutable_buckets() = marks.buckets();
        if (marks.has_stable()) *part.mutable_stable() = marks.stable();
        part.set_server(marks.server());
      }
      DroppedMarked some;
      PS_RETURN_IF_ERROR(ShipMarks(part, &some));
      total.bytes += some.bytes;
      total.rows += some.rows;
      if (dropped != nullptr) *dropped = total;
    }
    return absl::OkStatus();
  }
  return options_.dispatcher->Ship(
      kMoveMarksWrite, [&] { return SharedBytes::Own(marks.SerializeAsString()); },
      [&](absl::FunctionRef<void()>) {  // shipped after it is applied here
        if (marks.state() == v1::MoveMarks::HANDED_OVER) {
          std::vector<PlacementGate::BlockKey> blocks;
          for (const v1::ParamRef& ref : marks.blocks()) {
            blocks.emplace_back(ref.name(), ref.block().index());
          }
          options_.gate->Release(blocks, true);
          for (const v1::MovedBuckets& moved : marks.buckets()) {
            options_.gate->ReleaseBuckets(moved.table(), moved.begin(), moved.end(), true);
          }
        }
        if (marks.state() == v1::MoveMarks::DROPPED) {
          const DroppedMarked done = DropMarked(marks, *options_.store, options_.tables);
          if (dropped != nullptr) *dropped = done;
        }
        return absl::OkStatus();
      });
}

namespace {

// `buckets` (table, bucket) as runs [begin, end) of each table, in order.
std::vector<v1::MovedBuckets> BucketRuns(
    const std::vector<std::pair<std::string, uint32_t>>& buckets) {
  std::map<std::string, std::set<uint32_t>> by_table;
  for (const auto& [table, bucket] : buckets) by_table[table].insert(bucket);
  std::vector<v1::MovedBuckets> runs;
  for (const auto& [table, set] : by_table) {
    for (auto it = set.begin(); it != set.end();) {
      v1::MovedBuckets run;
      run.set_table(table);
      run.set_begin(*it);
      uint32_t end = *it + 1;
      while (++it != set.end() && *it == end) ++end;
      run.set_end(end);
      runs.push_back(std::move(run));
    }
  }
  return runs;
}

}  // namespace

absl::Status BlockMover::DropHandedOver() {
  absl::MutexLock serial(&move_mu_);
  std::optional<PlacementGate::HandedOver> done = options_.gate->TakeHandedOver();
  if (!done.has_value()) return absl::OkStatus();
  v1::MoveMarks marks;
  marks.set_version(done->version);
  marks.set_state(v1::MoveMarks::DROPPED);
  for (const PlacementGate::BlockKey& key : done->blocks) {
    v1::ParamRef* ref = marks.add_blocks();
    ref->set_name(key.first);
    ref->mutable_block()->set_index(key.second);
  }
  // Table rows whose keys the stable placement gives to another server:
  // the record names the buckets and that placement, so that backups drop
  // exactly the rows dropped here (their tables equal this server's).
  if (options_.tables != nullptr) {
    std::vector<std::pair<std::string, uint32_t>> held;
    for (const auto& bucket : done->buckets) {
      if (options_.tables->ConfigOf(bucket.first).ok()) held.push_back(bucket);
    }
    for (v1::MovedBuckets& run : BucketRuns(held)) *marks.add_buckets() = std::move(run);
  }
  if (marks.buckets_size() > 0) {
    *marks.mutable_stable() = done->stable.spec();
    marks.set_server(static_cast<uint32_t>(options_.gate->self()));
  }
  DroppedMarked dropped_marked;
  const absl::Status dropped = ShipMarks(marks, &dropped_marked);
  const uint64_t bytes = dropped_marked.bytes, rows = dropped_marked.rows;
#ifdef __GLIBC__
  // Freed blocks of a large model lie in malloc's heap (its mmap threshold
  // grows with freed blocks): given back to the system now.
  if (bytes > 0 || rows > 0) malloc_trim(0);
#endif
  if (options_.log && (bytes > 0 || rows > 0 || !dropped.ok())) {
    options_.log(absl::StrCat(
        "placement version ", done->stable.version(), " is stable: dropped the ",
        done->blocks.size(), " blocks (", bytes, " bytes) and ", rows,
        " table rows handed over in the move of version ", done->version,
        dropped.ok() ? "" : absl::StrCat(" (kept: ", dropped.ToString(), ")")));
  }
  return dropped;
}

absl::StatusOr<v1::ReceiveBlocksResponse> BlockMover::Receive(
    const v1::ReceiveBlocksRequest& request) {
  if (options_.stall_after_batches > 0 && options_.stall &&
      received_batches_.load() == options_.stall_after_batches) {
    options_.stall();
  }
  PS_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadSnapshotFiles(request.files()));
  if (!loaded.snapshot.blocks.empty() && request.table_buckets_size() > 0) {
    return absl::InvalidArgumentError("a hand-over of blocks and table buckets at once");
  }
  v1::ReceiveBlocksResponse response;
  if (request.table_buckets_size() > 0) {
    PS_ASSIGN_OR_RETURN(const uint64_t rows,
                        ReceiveTable(request, std::move(loaded.snapshot.extensions)));
    response.set_rows(rows);
    return response;
  }
  std::vector<PlacementGate::BlockKey> keys;
  for (const BlockSnapshot& block : loaded.snapshot.blocks) {
    PS_RETURN_IF_ERROR(
        options_.gate->CheckReceive(request.version(), block.name, block.block.index()));
    keys.emplace_back(block.name, block.block.index());
  }
  loaded.snapshot.extensions.clear();  // blocks only
  absl::MutexLock serial(&receive_mu_);
  // What the backups apply: the request as it came, or, when some blocks
  // are kept, a copy of the ones taken.
  v1::ReceiveBlocksRequest taken = request;
  if (replicated()) {
    // Sent again after a failure (the sender's, or a takeover): a block
    // taken already stays as it is here (it may have taken writes since;
    // the sender's copy has not changed, it held it).
    std::vector<BlockSnapshot> fresh;
    for (BlockSnapshot& block : loaded.snapshot.blocks) {
      if (!options_.gate->CheckBlock(block.name, block.block).ok()) {
        fresh.push_back(std::move(block));
      }
    }
    const bool kept_some = fresh.size() != keys.size();
    loaded.snapshot.blocks = std::move(fresh);
    if (kept_some) {
      const uint32_t self = static_cast<uint32_t>(options_.gate->self());
      PS_ASSIGN_OR_RETURN(std::vector<v1::SnapshotFile> files,
                          SnapshotToFiles(loaded.snapshot, self, options_.write_options));
      taken.clear_files();
      for (v1::SnapshotFile& file : files) *taken.add_files() = std::move(file);
    }
  }
  // Here and on this shard's backups before it is acknowledged.
  PS_RETURN_IF_ERROR(options_.dispatcher->Ship(
      "ReceiveBlocks", [&] { return SharedBytes::Own(taken.SerializeAsString()); },
      [&](absl::FunctionRef<void()>) -> absl::Status {  // shipped after it is applied
        PS_RETURN_IF_ERROR(options_.store->Merge(std::move(loaded.snapshot)));
        options_.gate->Received(keys);
        return absl::OkStatus();
      }));
  received_batches_.fetch_add(1);
  response.set_blocks(keys.size());
  if (options_.log) {
    options_.log(absl::StrCat("placement version ", request.version(), ": received ",
                              keys.size(), " blocks from server ", request.from_server()));
  }
  return response;
}

void MoveMarks::SetVersionLocked(uint64_t version) {
  if (version <= version_) return;
  version_ = version;
  marks_.clear();
  received_.clear();
  bucket_marks_.clear();
  received_buckets_.clear();
}

namespace {

absl::StatusOr<v1::MoveMarks> ParseMoveMarks(absl::string_view bytes) {
  v1::MoveMarks marks;
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !marks.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicated ", kMoveMarksWrite, ": malformed (", bytes.size(),
                     " bytes that do not parse)"));
  }
  PS_RETURN_IF_ERROR(CheckMoveMarks(marks));
  return marks;
}

}  // namespace

absl::Status CheckMoveMarks(const v1::MoveMarks& marks) {
  const auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replicated ", kMoveMarksWrite, " (placement version ", marks.version(), "): ", why));
  };
  if (marks.state() != v1::MoveMarks::HELD && marks.state() != v1::MoveMarks::HANDED_OVER &&
      marks.state() != v1::MoveMarks::DROPPED) {
    return refuse(absl::StrCat("state ", static_cast<int>(marks.state()), " is not known"));
  }
  if (marks.version() == 0) return refuse("no placement version");
  if (marks.blocks_size() > kMaxMoveMarkBlocks) {
    return refuse(absl::StrCat(marks.blocks_size(), " blocks, more than the ",
                               kMaxMoveMarkBlocks, " one record may name"));
  }
  std::set<PlacementGate::BlockKey> blocks;
  for (const v1::ParamRef& ref : marks.blocks()) {
    if (ref.name().empty()) return refuse("a block without a parameter name");
    if (!blocks.emplace(ref.name(), ref.block().index()).second) {
      return refuse(absl::StrCat("parameter '", ref.name(), "' block ", ref.block().index(),
                                 " is named twice"));
    }
  }
  // Runs of one table, by begin: each must end before the next begins.
  std::map<std::string, std::map<uint32_t, uint32_t>> runs;
  for (const v1::MovedBuckets& moved : marks.buckets()) {
    if (moved.table().empty()) return refuse("a bucket run without a table name");
    if (moved.begin() >= moved.end() || moved.end() > kKeyBuckets) {
      return refuse(absl::StrCat("table '", moved.table(), "' bucket run [", moved.begin(), ", ",
                                 moved.end(), ") is not within [0, ", kKeyBuckets,
                                 ") or is empty"));
    }
    std::map<uint32_t, uint32_t>& table = runs[moved.table()];
    auto next = table.lower_bound(moved.begin());
    const bool overlaps_next = next != table.end() && next->first < moved.end();
    const bool overlaps_previous = next != table.begin() && std::prev(next)->second > moved.begin();
    if (overlaps_next || overlaps_previous) {
      return refuse(absl::StrCat("table '", moved.table(), "' bucket run [", moved.begin(), ", ",
                                 moved.end(), ") overlaps another run of it"));
    }
    table.emplace(moved.begin(), moved.end());
  }
  if (marks.has_stable() || marks.server() != 0) {
    if (marks.state() != v1::MoveMarks::DROPPED) {
      return refuse("a stable placement or server index in a record that is not DROPPED");
    }
  }
  if (marks.state() == v1::MoveMarks::DROPPED && marks.buckets_size() > 0) {
    if (!marks.has_stable()) return refuse("DROPPED table buckets without the stable placement");
    if (absl::Status spec = CheckPlacementSpec(marks.stable()); !spec.ok()) {
      return refuse(absl::StrCat("its stable placement: ", spec.message()));
    }
    if (marks.stable().moving() || marks.stable().version() <= marks.version()) {
      return refuse(absl::StrCat("its stable placement (version ", marks.stable().version(),
                                 marks.stable().moving() ? ", moving" : "",
                                 ") is not a stable one newer than the move"));
    }
    if (marks.server() >= kMaxPlacementServers) {
      return refuse(absl::StrCat("server index ", marks.server(), " is not below ",
                                 kMaxPlacementServers));
    }
  }
  return absl::OkStatus();
}

DroppedMarked DropMarked(const v1::MoveMarks& marks, ParameterStore& store, Tables* tables) {
  DroppedMarked dropped;
  std::vector<PlacementGate::BlockKey> blocks;
  for (const v1::ParamRef& ref : marks.blocks()) blocks.emplace_back(ref.name(), ref.block().index());
  dropped.bytes = store.EraseBlocks(blocks);
  if (tables == nullptr || marks.buckets_size() == 0) return dropped;
  absl::StatusOr<Placement> stable = Placement::FromSpec(marks.stable(), 1 << 20);
  if (!stable.ok()) return dropped;  // CheckMoveMarks refuses it
  std::map<std::string, std::vector<bool>> left;
  for (const v1::MovedBuckets& moved : marks.buckets()) {
    std::vector<bool>& buckets = left[moved.table()];
    buckets.resize(kKeyBuckets, false);
    for (uint32_t b = moved.begin(); b < moved.end() && b < kKeyBuckets; ++b) buckets[b] = true;
  }
  const int self = static_cast<int>(marks.server());
  for (const auto& [table, buckets] : left) {
    absl::StatusOr<v1::TableConfig> config = tables->ConfigOf(table);
    if (!config.ok()) continue;  // not held here
    absl::StatusOr<uint64_t> erased = tables->DropRows(table, [&](uint64_t key) {
      if (!buckets[KeyBucket(key)]) return false;
      absl::StatusOr<int> owner = KeyServer(key, config->partitioning(), *stable);
      return owner.ok() && *owner != self;
    });
    if (erased.ok()) dropped.rows += *erased;
  }
  return dropped;
}

absl::Status MoveMarks::Apply(absl::string_view bytes) {
  PS_ASSIGN_OR_RETURN(const v1::MoveMarks marks, ParseMoveMarks(bytes));
  return Apply(marks);
}

absl::Status MoveMarks::Apply(const v1::MoveMarks& marks) {
  PS_RETURN_IF_ERROR(CheckMoveMarks(marks));
  absl::MutexLock lock(&mu_);
  SetVersionLocked(marks.version());
  if (marks.version() != version_) return absl::OkStatus();  // an older move's
  for (const v1::ParamRef& ref : marks.blocks()) {
    const PlacementGate::BlockKey key(ref.name(), ref.block().index());
    if (marks.state() == v1::MoveMarks::DROPPED) {
      marks_.erase(key);  // the move is over for it
    } else {
      marks_[key] = marks.state();
    }
  }
  for (const v1::MovedBuckets& moved : marks.buckets()) {
    for (uint32_t b = moved.begin(); b < moved.end() && b < kKeyBuckets; ++b) {
      bucket_marks_[{moved.table(), b}] = marks.state();
    }
  }
  return absl::OkStatus();
}

void MoveMarks::Clear() {
  absl::MutexLock lock(&mu_);
  version_ = 0;
  marks_.clear();
  received_.clear();
  bucket_marks_.clear();
  received_buckets_.clear();
}

void MoveMarks::Received(uint64_t version, const std::vector<PlacementGate::BlockKey>& blocks) {
  absl::MutexLock lock(&mu_);
  SetVersionLocked(version);
  if (version != version_) return;
  received_.insert(blocks.begin(), blocks.end());
}

void MoveMarks::ReceivedBuckets(uint64_t version, const std::vector<v1::MovedBuckets>& buckets,
                                int from) {
  absl::MutexLock lock(&mu_);
  SetVersionLocked(version);
  if (version != version_) return;
  for (const v1::MovedBuckets& moved : buckets) {
    for (uint32_t b = moved.begin(); b < moved.end() && b < kKeyBuckets; ++b) {
      received_buckets_.emplace(moved.table(), b, from);
    }
  }
}

void MoveMarks::SeedGate(PlacementGate& gate, const ParameterStore& store) const {
  const v1::Placement spec = gate.spec();
  if (!spec.moving()) return;
  std::vector<PlacementGate::BlockKey> held, handed_over, received;
  if (static_cast<uint32_t>(gate.self()) >= spec.from_num_servers()) {
    for (PlacementGate::BlockKey& key : store.BlockKeys()) received.push_back(std::move(key));
  }
  absl::MutexLock lock(&mu_);
  if (spec.version() != version_) {
    gate.Received(received);
    return;
  }
  for (const auto& [key, state] : marks_) {
    held.push_back(key);
    if (state == v1::MoveMarks::HANDED_OVER) handed_over.push_back(key);
  }
  received.insert(received.end(), received_.begin(), received_.end());
  gate.Hold(held);
  gate.Release(handed_over, /*handed_over=*/true);
  gate.Received(received);
  for (const auto& [bucket, state] : bucket_marks_) {
    const auto& [table, b] = bucket;
    gate.HoldBuckets(table, b, b + 1);
    if (state == v1::MoveMarks::HANDED_OVER) gate.ReleaseBuckets(table, b, b + 1, true);
  }
  for (const auto& [table, b, from] : received_buckets_) gate.ReceivedBuckets(table, from, b, b + 1);
}

namespace {

// FAILED_PRECONDITION naming the first block of a DROPPED `marks` that
// `store` does not hold, or table that `tables` does not hold.
absl::Status CheckDroppedHeld(const v1::MoveMarks& marks, const ParameterStore& store,
                              const Tables& tables) {
  if (marks.blocks_size() > 0) {
    const std::vector<PlacementGate::BlockKey> held = store.BlockKeys();  // sorted
    for (const v1::ParamRef& ref : marks.blocks()) {
      const PlacementGate::BlockKey key(ref.name(), ref.block().index());
      if (!std::binary_search(held.begin(), held.end(), key)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "replicated ", kMoveMarksWrite, " DROPPED (placement version ", marks.version(),
            ") names parameter '", key.first, "' block ", key.second,
            ", which this replica does not hold: refused, nothing dropped"));
      }
    }
  }
  for (const v1::MovedBuckets& moved : marks.buckets()) {
    if (!tables.ConfigOf(moved.table()).ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "replicated ", kMoveMarksWrite, " DROPPED (placement version ", marks.version(),
          ") names table '", moved.table(),
          "', which this replica does not hold: refused, nothing dropped"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool IsMoveWrite(absl::string_view method) {
  return method == kMoveMarksWrite || method == "ReceiveBlocks";
}

absl::Status ApplyMoveWriteOnBackup(absl::string_view method, absl::string_view request,
                                    ParameterStore& store, Tables& tables, MoveMarks& marks) {
  if (method == kMoveMarksWrite) {
    PS_ASSIGN_OR_RETURN(const v1::MoveMarks parsed, ParseMoveMarks(request));
    if (parsed.state() == v1::MoveMarks::DROPPED) {
      // What the primary dropped it held; this replica holds the same.
      PS_RETURN_IF_ERROR(CheckDroppedHeld(parsed, store, tables));
    }
    PS_RETURN_IF_ERROR(marks.Apply(parsed));
    if (parsed.state() == v1::MoveMarks::DROPPED) DropMarked(parsed, store, &tables);
    return absl::OkStatus();
  }
  v1::ReceiveBlocksRequest receive;
  if (method != "ReceiveBlocks" ||
      request.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !receive.ParseFromArray(request.data(), static_cast<int>(request.size()))) {
    return absl::InvalidArgumentError(absl::StrCat("replicated ", method, ": not a move's write"));
  }
  PS_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadSnapshotFiles(receive.files()));
  if (receive.table_buckets_size() > 0) {
    // Rows the primary vetted and took as they are here (it replaced none).
    PS_RETURN_IF_ERROR(ImportAsIs(tables, loaded.snapshot.extensions));
    marks.ReceivedBuckets(receive.version(),
                          {receive.table_buckets().begin(), receive.table_buckets().end()},
                          static_cast<int>(receive.from_server()));
    return absl::OkStatus();
  }
  loaded.snapshot.extensions.clear();
  std::vector<PlacementGate::BlockKey> keys;
  for (const BlockSnapshot& block : loaded.snapshot.blocks) {
    keys.emplace_back(block.name, block.block.index());
  }
  PS_RETURN_IF_ERROR(store.Merge(std::move(loaded.snapshot)));
  marks.Received(receive.version(), keys);
  return absl::OkStatus();
}

absl::Status CheckStandbyMayAttach(const PlacementGate& gate, bool holds_tables) {
  const v1::Placement spec = gate.spec();
  if (!spec.moving() ||
      (static_cast<uint32_t>(gate.self()) >= spec.from_num_servers() && !holds_tables)) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(absl::StrCat(
      "a live move (placement version ", spec.version(), ") is under way on this server ",
      gate.self(), holds_tables ? " (which holds table rows)" : "",
      ": a standby attaches once it ends; retry"));
}

absl::Status CheckNoMoveUnderWay(const PlacementGate& gate) {
  const v1::Placement spec = gate.spec();
  if (!spec.moving()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "a live move from ", spec.from_num_servers(), " to ", spec.num_servers(),
      " servers is under way (placement version ", spec.version(),
      "): no checkpoint until it ends; retry"));
}

size_t KeepOwnedBlocks(const PlacementGate& gate, StoreSnapshot* snapshot) {
  const v1::Placement spec = gate.spec();
  absl::StatusOr<Placement> placement = Placement::FromSpec(spec, 1);
  if (!placement.ok()) return 0;  // the gate holds only placements made from specs
  const size_t before = snapshot->blocks.size();
  std::vector<BlockSnapshot> kept;
  kept.reserve(before);
  for (BlockSnapshot& block : snapshot->blocks) {
    if (placement->ServerOf(block.name, block.block.index()) == gate.self()) {
      kept.push_back(std::move(block));
    }
  }
  snapshot->blocks = std::move(kept);
  return before - snapshot->blocks.size();
}

Tables::KeyKeep OwnedKeys(const PlacementGate& gate) {
  absl::StatusOr<Placement> placement = Placement::FromSpec(gate.spec(), 1);
  const int self = gate.self();
  return [placement = std::move(placement), self](const std::string&, const v1::TableConfig& config,
                                                  uint64_t key) {
    if (!placement.ok()) return true;  // the gate holds only placements made from specs
    absl::StatusOr<int> owner = KeyServer(key, config.partitioning(), *placement);
    return !owner.ok() || *owner == self;  // a key no partitioning places stays
  };
}

uint64_t NewestSequenceOfAnyShard(const std::string& dir) {
  absl::StatusOr<std::map<uint32_t, std::vector<CheckpointEntry>>> shards =
      ListShardCheckpoints(dir);
  if (!shards.ok()) return 0;
  uint64_t newest = 0;
  for (const auto& [shard, held] : *shards) {
    if (!held.empty()) newest = std::max(newest, held.back().sequence);
  }
  return newest;
}

bool JoinsMove(const v1::Placement& placement, uint32_t index) {
  return placement.moving() && placement.num_servers() > placement.from_num_servers() &&
         index >= placement.from_num_servers() && index < placement.num_servers();
}

absl::Status BlockMover::MoveTables(uint64_t version, v1::MoveBlocksResponse* response,
                                    uint32_t* batches_sent) {
  if (options_.tables == nullptr) return absl::OkStatus();
  v1::TableStatsResponse stats;
  options_.tables->Stats(&stats);
  for (const v1::TableStats& table : stats.tables()) {
    PS_ASSIGN_OR_RETURN(const v1::TableConfig config, options_.tables->ConfigOf(table.name()));
    // Buckets per batch: about batch_bytes of this table's rows (its keys
    // spread evenly over the buckets by their hash).
    const uint64_t per_bucket = std::max<uint64_t>(1, table.bytes() / kKeyBuckets);
    const uint32_t per_batch = static_cast<uint32_t>(
        std::clamp<uint64_t>(options_.batch_bytes / per_bucket, 1, kKeyBuckets));
    uint32_t begin = 0;
    while (begin < kKeyBuckets) {
      // A run of buckets not handed over yet (a MoveBlocks called again
      // sends only what is left).
      if (options_.gate->BucketHandedOver(table.name(), begin)) {
        ++begin;
        continue;
      }
      uint32_t end = begin + 1;
      while (end < kKeyBuckets && end - begin < per_batch &&
             !options_.gate->BucketHandedOver(table.name(), end)) {
        ++end;
      }
      PS_RETURN_IF_ERROR(
          SendBuckets(version, table.name(), config, begin, end, response, batches_sent));
      begin = end;
    }
  }
  return absl::OkStatus();
}

absl::Status BlockMover::SendBuckets(uint64_t version, const std::string& table,
                                     const v1::TableConfig& config, uint32_t begin, uint32_t end,
                                     v1::MoveBlocksResponse* response, uint32_t* batches_sent) {
  PlacementGate& gate = *options_.gate;
  {
    // No push is between its gate check and its apply meanwhile.
    absl::WriterMutexLock lock(&options_.dispatcher->apply_mu());
    gate.HoldBuckets(table, begin, end);
  }
  v1::MovedBuckets moved;
  moved.set_table(table);
  moved.set_begin(begin);
  moved.set_end(end);
  const int num_servers = static_cast<int>(gate.spec().num_servers());
  uint64_t rows = 0, bytes = 0;
  // Held here and on the backups before a copy can reach a new owner.
  absl::Status sent = Mark(version, v1::MoveMarks::HELD, {}, {moved});
  for (int to = 0; to < num_servers && sent.ok(); ++to) {
    if (to == gate.self()) continue;
    StoreSnapshot batch;
    absl::Status destination_error;
    absl::StatusOr<Tables::Exported> exported = options_.tables->ExportRows(
        table,
        [&](uint64_t key) {
          const uint32_t bucket = KeyBucket(key);
          if (bucket < begin || bucket >= end) return false;
          absl::StatusOr<std::optional<int>> destination =
              gate.KeyDestination(version, gate.self(), config.partitioning(), key);
          if (!destination.ok()) {
            destination_error.Update(destination.status());
            return false;
          }
          return *destination == to;
        },
        &batch.extensions);
    sent = exported.ok() ? destination_error : exported.status();
    if (sent.ok()) sent = Send(version, static_cast<uint32_t>(to), batch, {moved});
    if (sent.ok()) {
      rows += exported->rows;
      bytes += exported->bytes;
    }
  }
  if (sent.ok()) BatchSent(batches_sent);
  if (sent.ok()) {
    sent = Mark(version, v1::MoveMarks::HANDED_OVER, {}, {moved});  // releases them
  } else if (!replicated()) {
    // Served here again; some new owners may have taken their rows: a
    // MoveBlocks called again sends the buckets to every server, and the
    // copy it sends replaces theirs. Replicated, they stay held (their
    // backups may hold the mark): the copy sent again is this one, and a
    // new owner that took it keeps what it holds.
    gate.ReleaseBuckets(table, begin, end, false);
  }
  if (!sent.ok()) return sent;
  response->set_rows_moved(response->rows_moved() + rows);
  response->set_bytes_moved(response->bytes_moved() + bytes);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> BlockMover::ReceiveTable(const v1::ReceiveBlocksRequest& request,
                                                  std::map<std::string, std::string> extensions) {
  if (options_.tables == nullptr) {
    return absl::FailedPreconditionError("this server takes no table rows");
  }
  PlacementGate& gate = *options_.gate;
  PS_RETURN_IF_ERROR(gate.CheckReceiveVersion(request.version()));
  const int from = static_cast<int>(request.from_server());
  const std::string& table = request.table_buckets(0).table();
  v1::Partitioning partitioning;  // of a table held here; one arriving replaces nothing
  if (absl::StatusOr<v1::TableConfig> config = options_.tables->ConfigOf(table); config.ok()) {
    partitioning = config->partitioning();
  }
  for (const v1::MovedBuckets& moved : request.table_buckets()) {
    if (moved.table() != table || moved.begin() >= moved.end() || moved.end() > kKeyBuckets) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table buckets '", moved.table(), "' [", moved.begin(), ", ", moved.end(),
          "): one table, 0 <= begin < end <= ", kKeyBuckets));
    }
  }
  auto in_buckets = [&](uint64_t key) {
    const uint32_t bucket = KeyBucket(key);
    for (const v1::MovedBuckets& moved : request.table_buckets()) {
      if (bucket >= moved.begin() && bucket < moved.end()) return true;
    }
    return false;
  };
  absl::MutexLock serial(&receive_mu_);
  // What the backups apply: the request as it came, or, when some buckets
  // were received already, a copy without their rows.
  v1::ReceiveBlocksRequest kept_request;
  const v1::ReceiveBlocksRequest* taken = &request;
  if (replicated()) {
    // Sent again after a failure (the sender's, or a takeover): a bucket
    // taken already from this sender stays as it is here (its keys may
    // have taken writes since; the sender's copy has not changed, it held
    // them).
    bool kept_some = false;
    for (const v1::MovedBuckets& moved : request.table_buckets()) {
      for (uint32_t b = moved.begin(); b < moved.end() && !kept_some; ++b) {
        kept_some = gate.BucketReceived(table, b, from);
      }
    }
    if (kept_some) {
      PS_ASSIGN_OR_RETURN(extensions, KeepTableRows(extensions, [&](uint64_t key) {
                            return !gate.BucketReceived(table, KeyBucket(key), from);
                          }));
      StoreSnapshot kept;
      kept.extensions = extensions;
      PS_ASSIGN_OR_RETURN(std::vector<v1::SnapshotFile> files,
                          SnapshotToFiles(kept, static_cast<uint32_t>(gate.self()),
                                          options_.write_options));
      kept_request = request;
      kept_request.clear_files();
      for (v1::SnapshotFile& file : files) *kept_request.add_files() = std::move(file);
      taken = &kept_request;
    }
  }
  uint64_t rows = 0;
  // Here and on this shard's backups before it is acknowledged.
  PS_RETURN_IF_ERROR(options_.dispatcher->Ship(
      "ReceiveBlocks", [&] { return SharedBytes::Own(taken->SerializeAsString()); },
      [&](absl::FunctionRef<void()>) -> absl::Status {  // shipped after it is applied
        PS_ASSIGN_OR_RETURN(
            rows,
            options_.tables->ImportRows(
                extensions,
                [&](const std::string& name, const v1::TableConfig& config,
                    uint64_t key) -> absl::Status {
                  if (name != table || !in_buckets(key)) {
                    return absl::InvalidArgumentError(absl::StrCat(
                        "table '", name, "' key ", key, " is outside the buckets handed over"));
                  }
                  return gate.CheckReceiveKey(request.version(), from, name,
                                              config.partitioning(), key);
                },
                // What an earlier copy of these buckets left here (a
                // hand-over sent again after its reply, or another new
                // owner's, failed): this one replaces it (not replicated:
                // the sender served them again meanwhile). Replicated, no
                // earlier copy is left (those buckets were kept above), and
                // the backups replace nothing either.
                [&](uint64_t key) {
                  if (replicated() || !in_buckets(key)) return false;
                  absl::StatusOr<std::optional<int>> owner =
                      gate.KeyDestination(request.version(), from, partitioning, key);
                  return owner.ok() && *owner == gate.self();
                }));
        for (const v1::MovedBuckets& moved : request.table_buckets()) {
          gate.ReceivedBuckets(table, from, moved.begin(), moved.end());
        }
        return absl::OkStatus();
      }));
  received_batches_.fetch_add(1);
  if (options_.log && rows > 0) {
    options_.log(absl::StrCat("placement version ", request.version(), ": received ", rows,
                              " rows of table '", table, "' from server ", from));
  }
  return rows;
}

}  // namespace pserver
