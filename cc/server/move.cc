#include "cc/server/move.h"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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
      if (sent.ok() && ++batches_sent == options_.stall_after_batches && options_.stall) {
        options_.stall();
      }
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
  response.set_blocks_handed_over(gate.handed_over());
  if (options_.log && response.blocks_moved() > 0) {
    options_.log(absl::StrCat("placement version ", version, ": handed ",
                              response.blocks_moved(), " blocks (", response.bytes_moved(),
                              " bytes) to their new owners"));
  }
  return response;
}

absl::Status BlockMover::Send(uint64_t version, uint32_t to, const StoreSnapshot& batch) {
  PS_ASSIGN_OR_RETURN(std::vector<v1::SnapshotFile> files,
                      SnapshotToFiles(batch, static_cast<uint32_t>(options_.gate->self()),
                                      options_.write_options));
  v1::ReceiveBlocksRequest request;
  request.set_version(version);
  request.set_from_server(static_cast<uint32_t>(options_.gate->self()));
  for (v1::SnapshotFile& file : files) *request.add_files() = std::move(file);
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
                        absl::StrCat("handing ", batch.blocks.size(), " blocks to server ", to,
                                     " at ", address.empty() ? "(not registered)" : address, ": ",
                                     status.message()));
  }
  return absl::OkStatus();
}

absl::Status BlockMover::Mark(uint64_t version, v1::MoveMarks::State state,
                              const std::vector<PlacementGate::BlockKey>& blocks) {
  v1::MoveMarks marks;
  marks.set_version(version);
  marks.set_state(state);
  for (const PlacementGate::BlockKey& key : blocks) {
    v1::ParamRef* ref = marks.add_blocks();
    ref->set_name(key.first);
    ref->mutable_block()->set_index(key.second);
  }
  return options_.dispatcher->Ship(
      kMoveMarksWrite, [&] { return SharedBytes::Own(marks.SerializeAsString()); },
      [&](absl::FunctionRef<void()>) {  // shipped after it is applied here
        if (state == v1::MoveMarks::HANDED_OVER) options_.gate->Release(blocks, true);
        return absl::OkStatus();
      });
}

absl::StatusOr<v1::ReceiveBlocksResponse> BlockMover::Receive(
    const v1::ReceiveBlocksRequest& request) {
  if (options_.stall_after_batches > 0 && options_.stall &&
      received_batches_.load() == options_.stall_after_batches) {
    options_.stall();
  }
  PS_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadSnapshotFiles(request.files()));
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
  v1::ReceiveBlocksResponse response;
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
}

absl::Status MoveMarks::Apply(absl::string_view bytes) {
  v1::MoveMarks marks;
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !marks.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(absl::StrCat("replicated ", kMoveMarksWrite, ": malformed"));
  }
  absl::MutexLock lock(&mu_);
  SetVersionLocked(marks.version());
  if (marks.version() != version_) return absl::OkStatus();  // an older move's
  for (const v1::ParamRef& ref : marks.blocks()) {
    marks_[{ref.name(), ref.block().index()}] = marks.state();
  }
  return absl::OkStatus();
}

void MoveMarks::Clear() {
  absl::MutexLock lock(&mu_);
  version_ = 0;
  marks_.clear();
  received_.clear();
}

void MoveMarks::Received(uint64_t version, const std::vector<PlacementGate::BlockKey>& blocks) {
  absl::MutexLock lock(&mu_);
  SetVersionLocked(version);
  if (version != version_) return;
  received_.insert(blocks.begin(), blocks.end());
}

void MoveMarks::SeedGate(PlacementGate& gate, const ParameterStore& store) const {
  const v1::Placement spec = gate.spec();
  if (!spec.moving()) return;
  std::vector<PlacementGate::BlockKey> held, handed_over, received;
  if (static_cast<uint32_t>(gate.self()) >= spec.from_num_servers()) {
    for (PlacementGate::BlockKey& key : store.BlockKeys()) received.push_back(std::move(key));
  }
  {
    absl::MutexLock lock(&mu_);
    if (spec.version() == version_) {
      for (const auto& [key, state] : marks_) {
        held.push_back(key);
        if (state == v1::MoveMarks::HANDED_OVER) handed_over.push_back(key);
      }
      received.insert(received.end(), received_.begin(), received_.end());
    }
  }
  gate.Hold(held);
  gate.Release(handed_over, /*handed_over=*/true);
  gate.Received(received);
}

bool IsMoveWrite(absl::string_view method) {
  return method == kMoveMarksWrite || method == "ReceiveBlocks";
}

absl::Status ApplyMoveWriteOnBackup(absl::string_view method, absl::string_view request,
                                    ParameterStore& store, MoveMarks& marks) {
  if (method == kMoveMarksWrite) return marks.Apply(request);
  v1::ReceiveBlocksRequest receive;
  if (method != "ReceiveBlocks" ||
      request.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !receive.ParseFromArray(request.data(), static_cast<int>(request.size()))) {
    return absl::InvalidArgumentError(absl::StrCat("replicated ", method, ": not a move's write"));
  }
  PS_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadSnapshotFiles(receive.files()));
  loaded.snapshot.extensions.clear();
  std::vector<PlacementGate::BlockKey> keys;
  for (const BlockSnapshot& block : loaded.snapshot.blocks) {
    keys.emplace_back(block.name, block.block.index());
  }
  PS_RETURN_IF_ERROR(store.Merge(std::move(loaded.snapshot)));
  marks.Received(receive.version(), keys);
  return absl::OkStatus();
}

absl::Status CheckStandbyMayAttach(const PlacementGate& gate) {
  const v1::Placement spec = gate.spec();
  if (!spec.moving() || static_cast<uint32_t>(gate.self()) >= spec.from_num_servers()) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(absl::StrCat(
      "a live move (placement version ", spec.version(), ") is under way on this server ",
      gate.self(), ": a standby attaches once it ends; retry"));
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

}  // namespace pserver
