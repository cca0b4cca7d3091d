#include "cc/server/move.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/core/placement.h"
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
  for (const auto& [to, keys] : leaving) {
    StoreSnapshot batch;
    std::vector<PlacementGate::BlockKey> held;
    uint64_t batch_bytes = 0;
    auto flush = [&]() -> absl::Status {
      if (held.empty()) return absl::OkStatus();
      absl::Status sent = Send(version, static_cast<uint32_t>(to), batch);
      gate.Release(held, sent.ok());
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
        gate.Release(held, /*handed_over=*/false);
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
  PS_RETURN_IF_ERROR(MoveTables(version, &response));
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
  PS_ASSIGN_OR_RETURN(std::string address, options_.address_of(to));
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
  std::unique_ptr<v1::ParameterServer::Stub> stub = v1::ParameterServer::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), arguments));
  const absl::Time deadline = absl::Now() + options_.send_timeout;
  absl::Status status;
  // UNAVAILABLE: the destination has not seen the placement yet, or is
  // still starting; retried until the deadline.
  for (int attempt = 0; attempt < 10000; ++attempt) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    v1::ReceiveBlocksResponse response;
    status = FromGrpcStatus(stub->ReceiveBlocks(&context, request, &response));
    if (!absl::IsUnavailable(status) || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("handing ", batch.blocks.size(), " blocks",
                                     buckets.empty() ? "" : " and table buckets", " to server ", to,
                                     " at ", address, ": ", status.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ReceiveBlocksResponse> BlockMover::Receive(
    const v1::ReceiveBlocksRequest& request) {
  PS_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadSnapshotFiles(request.files()));
  if (!loaded.snapshot.blocks.empty() && request.table_buckets_size() > 0) {
    return absl::InvalidArgumentError("a hand-over of blocks and table buckets at once");
  }
  v1::ReceiveBlocksResponse response;
  if (request.table_buckets_size() > 0) {
    PS_ASSIGN_OR_RETURN(const uint64_t rows, ReceiveTable(request, loaded.snapshot.extensions));
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
  PS_RETURN_IF_ERROR(options_.store->Merge(std::move(loaded.snapshot)));
  options_.gate->Received(keys);
  response.set_blocks(keys.size());
  if (options_.log) {
    options_.log(absl::StrCat("placement version ", request.version(), ": received ",
                              keys.size(), " blocks from server ", request.from_server()));
  }
  return response;
}

absl::Status BlockMover::MoveTables(uint64_t version, v1::MoveBlocksResponse* response) {
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
      PS_RETURN_IF_ERROR(SendBuckets(version, table.name(), config, begin, end, response));
      begin = end;
    }
  }
  return absl::OkStatus();
}

absl::Status BlockMover::SendBuckets(uint64_t version, const std::string& table,
                                     const v1::TableConfig& config, uint32_t begin, uint32_t end,
                                     v1::MoveBlocksResponse* response) {
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
  absl::Status sent;
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
  // A failure leaves the buckets served here; some new owners may have
  // taken their rows (they serve them only once this server hands them
  // over: a MoveBlocks called again sends the buckets to every server, and
  // one that took them already acknowledges them).
  gate.ReleaseBuckets(table, begin, end, sent.ok());
  if (!sent.ok()) return sent;
  response->set_rows_moved(response->rows_moved() + rows);
  response->set_bytes_moved(response->bytes_moved() + bytes);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> BlockMover::ReceiveTable(
    const v1::ReceiveBlocksRequest& request, const std::map<std::string, std::string>& extensions) {
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
  PS_ASSIGN_OR_RETURN(
      const uint64_t rows,
      options_.tables->ImportRows(
          extensions,
          [&](const std::string& name, const v1::TableConfig& config, uint64_t key) -> absl::Status {
            if (name != table || !in_buckets(key)) {
              return absl::InvalidArgumentError(absl::StrCat(
                  "table '", name, "' key ", key, " is outside the buckets handed over"));
            }
            return gate.CheckReceiveKey(request.version(), from, name, config.partitioning(),
                                        key);
          },
          // What an earlier copy of these buckets left here (a hand-over
          // sent again after its reply, or another new owner's, failed):
          // this one replaces it. No client wrote to them here: they are
          // not served before the old owner hands them over.
          [&](uint64_t key) {
            if (!in_buckets(key)) return false;
            absl::StatusOr<std::optional<int>> owner =
                gate.KeyDestination(request.version(), from, partitioning, key);
            return owner.ok() && *owner == gate.self();
          }));
  for (const v1::MovedBuckets& moved : request.table_buckets()) {
    gate.ReceivedBuckets(table, from, moved.begin(), moved.end());
  }
  if (options_.log && rows > 0) {
    options_.log(absl::StrCat("placement version ", request.version(), ": received ", rows,
                              " rows of table '", table, "' from server ", from));
  }
  return rows;
}

}  // namespace pserver
