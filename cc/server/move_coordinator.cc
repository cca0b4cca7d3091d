#include "cc/server/move_coordinator.h"

#include <algorithm>
#include <functional>
#include <future>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cc/core/placement.h"
#include "cc/core/status_macros.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/placement_record.h"
#include "cc/rpc/grpc_status.h"
#include "grpcpp/grpcpp.h"
#include "pserver/v1/service.grpc.pb.h"

namespace pserver {
namespace {

// Registered servers' addresses by index, for indexes below `count`; every
// one of them once all are registered, else the ones missing in `missing`.
absl::StatusOr<std::vector<std::string>> Registered(EtcdClient& etcd, uint32_t count,
                                                    std::vector<uint32_t>* missing) {
  PS_ASSIGN_OR_RETURN(std::vector<KeyValue> servers, etcd.GetPrefix(etcd_keys::ServersPrefix()));
  std::vector<std::string> addresses(count);
  for (const KeyValue& kv : servers) {
    absl::StatusOr<uint32_t> index = etcd_keys::ParseServerKey(kv.key);
    if (!index.ok() || *index >= count) continue;
    absl::StatusOr<etcd_keys::ServerEntry> entry = etcd_keys::ParseServerValue(kv.value);
    if (entry.ok()) addresses[*index] = entry->address;
  }
  missing->clear();
  for (uint32_t i = 0; i < count; ++i) {
    if (addresses[i].empty()) missing->push_back(i);
  }
  return addresses;
}

// MoveBlocks on whoever holds /ps/<index> now, retried while UNAVAILABLE
// (it has not seen the placement yet, its destination has not, or it died
// and its standby is taking the shard over: /ps/<index> is read again every
// attempt) until `deadline`.
absl::StatusOr<v1::MoveBlocksResponse> MoveBlocksOn(EtcdClient& etcd, uint32_t index,
                                                    uint64_t version, absl::Time deadline,
                                                    std::string* address) {
  std::unique_ptr<v1::ParameterServer::Stub> stub;
  v1::MoveBlocksRequest request;
  request.set_version(version);
  absl::Status status;
  for (int attempt = 0; attempt < 100000; ++attempt) {
    absl::StatusOr<KeyValue> entry = etcd.Get(etcd_keys::ServerKey(index));
    absl::StatusOr<etcd_keys::ServerEntry> parsed =
        entry.ok() ? etcd_keys::ParseServerValue(entry->value)
                   : absl::StatusOr<etcd_keys::ServerEntry>(entry.status());
    if (parsed.ok() && parsed->address != *address) {
      *address = parsed->address;
      stub = v1::ParameterServer::NewStub(
          grpc::CreateChannel(*address, grpc::InsecureChannelCredentials()));
    }
    if (stub == nullptr) {
      // Not registered (a standby taking over deletes it first).
      status = absl::UnavailableError(absl::StrCat("/ps/", index, " is not registered: ",
                                                   parsed.status().message()));
    } else {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(deadline));
      v1::MoveBlocksResponse response;
      status = FromGrpcStatus(stub->MoveBlocks(&context, request, &response));
      if (status.ok()) return response;
    }
    if (!absl::IsUnavailable(status) || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return status;
}

absl::Status WriteDesired(EtcdClient& etcd, uint32_t count) {
  return etcd.Put(etcd_keys::DesiredKey(), absl::StrCat(count));
}

}  // namespace

absl::StatusOr<ScaleResult> ScaleCluster(const ScaleOptions& options) {
  const uint32_t to = options.to;
  if (to < 1 || to > kMaxPlacementServers) {
    return absl::InvalidArgumentError(
        absl::StrCat("the server count must be in [1, ", kMaxPlacementServers, "], got ", to));
  }
  const absl::Time deadline = absl::Now() + options.timeout;
  auto say = [&](const std::string& line) {
    if (options.progress) options.progress(line);
  };
  EtcdClientOptions etcd_options;
  etcd_options.endpoints = options.etcd_endpoints;
  etcd_options.prefix = etcd_keys::ClusterPrefix(options.cluster);
  PS_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> etcd, EtcdClient::Connect(etcd_options));
  const std::string key = etcd_keys::PlacementKey();

  absl::StatusOr<KeyValue> read = etcd->Get(key);
  if (absl::IsNotFound(read.status())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "etcd ", etcd_options.prefix, key, " is missing: no server of cluster '",
        options.cluster, "' has started"));
  }
  PS_RETURN_IF_ERROR(read.status());
  PS_ASSIGN_OR_RETURN(v1::Placement held, ParsePlacementRecord(read->value));
  ScaleResult result;
  result.to = to;
  v1::Placement moving = held;
  if (held.moving()) {
    if (held.num_servers() != to) {
      return absl::FailedPreconditionError(absl::StrCat(
          "a move from ", held.from_num_servers(), " to ", held.num_servers(),
          " servers is under way (etcd ", key, " version ", held.version(),
          "): finish it first (psctl scale ", held.num_servers(), ")"));
    }
    say(absl::StrCat("placement version ", held.version(), ": resuming the move from ",
                     held.from_num_servers(), " to ", to, " servers"));
  } else if (held.num_servers() == to) {
    PS_RETURN_IF_ERROR(WriteDesired(*etcd, to));
    result.from = to;
    result.version = held.version();
    say(absl::StrCat("placement version ", held.version(), " has ", to,
                     " servers already: nothing to move"));
    return result;
  } else {
    moving.set_version(held.version() + 1);
    moving.set_num_servers(to);
    moving.set_moving(true);
    moving.set_from_num_servers(held.num_servers());
    PS_ASSIGN_OR_RETURN(TxnResult written,
                        etcd->Txn({Compare::ModRevisionEquals(key, read->mod_revision)},
                                  {TxnOp::Put(key, FormatPlacementRecord(moving))}));
    if (!written.succeeded) {
      return absl::AbortedError(absl::StrCat("etcd ", key, " changed meanwhile; run again"));
    }
    say(absl::StrCat("placement version ", moving.version(), ": moving from ",
                     held.num_servers(), " to ", to, " servers"));
  }
  const uint32_t from = moving.from_num_servers();
  result.from = from;
  const uint64_t version = moving.version();
  const uint32_t all = std::max(from, to);
  const std::string stuck = absl::StrCat("; the move stays under way (etcd ", key, " version ",
                                         version, "): run psctl scale ", to, " again");

  if (to > from) PS_RETURN_IF_ERROR(WriteDesired(*etcd, to));
  std::vector<std::string> addresses;
  bool waiting_said = false;
  for (int round = 0;; ++round) {
    std::vector<uint32_t> missing;
    PS_ASSIGN_OR_RETURN(addresses, Registered(*etcd, all, &missing));
    if (missing.empty()) break;
    if (absl::Now() >= deadline || round >= 1000000) {
      return absl::DeadlineExceededError(absl::StrCat(
          "servers ", missing.front(), "..", missing.back(), " did not register in time", stuck));
    }
    if (!waiting_said) {
      say(absl::StrCat("waiting for ", missing.size(), " server(s) to register (index ",
                       missing.front(), " first): start them with --etcd and "
                       "--placement_redirects"));
      waiting_said = true;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }

  // Every old owner hands its leaving blocks over, all at once.
  std::vector<std::future<absl::StatusOr<v1::MoveBlocksResponse>>> moves;
  std::vector<std::string> asked(from);  // the address each was last asked at
  for (uint32_t i = 0; i < from; ++i) {
    moves.push_back(std::async(std::launch::async, MoveBlocksOn, std::ref(*etcd), i, version,
                               deadline, &asked[i]));
  }
  absl::Status failed;
  for (uint32_t i = 0; i < from; ++i) {
    absl::StatusOr<v1::MoveBlocksResponse> moved = moves[i].get();
    if (!moved.ok()) {
      if (failed.ok()) {
        failed = absl::Status(moved.status().code(),
                              absl::StrCat("server ", i, " at ", asked[i], ": ",
                                           moved.status().message(), stuck));
      }
      continue;
    }
    result.blocks_moved += moved->blocks_moved();
    result.bytes_moved += moved->bytes_moved();
    say(absl::StrCat("server ", i, ": handed over ", moved->blocks_moved(), " blocks, ",
                     moved->bytes_moved(), " bytes (", moved->blocks_handed_over(),
                     " in this move in all)"));
  }
  PS_RETURN_IF_ERROR(failed);

  PS_ASSIGN_OR_RETURN(KeyValue now, etcd->Get(key));
  PS_ASSIGN_OR_RETURN(v1::Placement current, ParsePlacementRecord(now.value));
  if (current.version() != version || !current.moving()) {
    return absl::AbortedError(absl::StrCat("etcd ", key, " changed during the move (now version ",
                                           current.version(), "); run again"));
  }
  v1::Placement stable = moving;
  stable.set_version(version + 1);
  stable.set_moving(false);
  stable.set_from_num_servers(0);
  PS_ASSIGN_OR_RETURN(TxnResult written,
                      etcd->Txn({Compare::ModRevisionEquals(key, now.mod_revision)},
                                {TxnOp::Put(key, FormatPlacementRecord(stable))}));
  if (!written.succeeded) {
    return absl::AbortedError(absl::StrCat("etcd ", key, " changed meanwhile", stuck));
  }
  if (to < from) PS_RETURN_IF_ERROR(WriteDesired(*etcd, to));
  result.version = stable.version();
  result.moved = true;
  say(absl::StrCat("placement version ", stable.version(), ": ", to, " servers; moved ",
                   result.blocks_moved, " blocks, ", result.bytes_moved, " bytes",
                   to < from ? absl::StrCat("; servers ", to, "..", from - 1, " exit") : ""));
  return result;
}

}  // namespace pserver
