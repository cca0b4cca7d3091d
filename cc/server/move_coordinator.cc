#include "cc/server/move_coordinator.h"

#include <algorithm>
#include <functional>
#include <future>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cc/core/placement.h"
#include "cc/core/status_macros.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/placement_record.h"
#include "cc/auth/token_file.h"
#include "cc/rpc/grpc_status.h"
#include "cc/server/peer_channel.h"
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

// Where /ps/<index> is now: its address, or UNAVAILABLE while it is not
// registered (a standby taking the shard over deletes it first).
absl::StatusOr<std::string> RegisteredAddress(EtcdClient& etcd, uint32_t index) {
  absl::StatusOr<KeyValue> entry = etcd.Get(etcd_keys::ServerKey(index));
  absl::StatusOr<etcd_keys::ServerEntry> parsed =
      entry.ok() ? etcd_keys::ParseServerValue(entry->value)
                 : absl::StatusOr<etcd_keys::ServerEntry>(entry.status());
  if (!parsed.ok()) {
    return absl::UnavailableError(
        absl::StrCat("/ps/", index, " is not registered: ", parsed.status().message()));
  }
  return parsed->address;
}

// MoveBlocks for `version` on the server `where` names at each attempt,
// presenting `peer`, retried while UNAVAILABLE (it is still starting, has
// not seen the placement yet or its destination has not, or it died and its
// standby is taking the shard over) until `deadline`; `*address` is the one
// last asked. An UNAVAILABLE that shows a TLS cause (the handshake failed:
// a credential problem, not a wait) is not retried once every answer at one
// address showed it for kTlsCauseFor (gRPC dials again within its reconnect
// backoff, about 1 s), and its cause is named: a server killed while it was
// dialled also closes the connection at once, and a later dial then reaches
// its successor or is refused.
constexpr absl::Duration kTlsCauseFor = absl::Seconds(3);

absl::StatusOr<v1::MoveBlocksResponse> MoveBlocksOn(
    const std::function<absl::StatusOr<std::string>()>& where, const PeerCredentials& peer,
    uint64_t version, absl::Time deadline, std::string* address) {
  std::unique_ptr<v1::ParameterServer::Stub> stub;
  v1::MoveBlocksRequest request;
  request.set_version(version);
  absl::Status status;
  absl::Time tls_cause_since = absl::InfiniteFuture();  // at *address, every answer since
  for (int attempt = 0; attempt < 100000; ++attempt) {
    absl::StatusOr<std::string> now = where();
    if (now.ok() && *now != *address) {
      *address = *now;
      stub = v1::ParameterServer::NewStub(PeerChannel(*address, peer));
      tls_cause_since = absl::InfiniteFuture();
    }
    if (stub == nullptr) {
      status = now.status();
    } else {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(deadline));
      AddPeerMetadata(peer, &context);
      v1::MoveBlocksResponse response;
      status = FromGrpcStatus(stub->MoveBlocks(&context, request, &response));
      if (status.ok()) return response;
      const std::string tls = DescribeTlsFailure(status.message(), peer.tls.enabled());
      if (tls.empty() || !absl::IsUnavailable(status)) {
        tls_cause_since = absl::InfiniteFuture();
      } else if (tls_cause_since == absl::InfiniteFuture()) {
        tls_cause_since = absl::Now();
      }
      if (absl::Now() - tls_cause_since >= kTlsCauseFor) {
        return absl::UnavailableError(absl::StrCat(tls, ": ", status.message()));
      }
    }
    if (!absl::IsUnavailable(status) || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return status;
}

// How long CheckTakesPart waits for a server that answers UNAVAILABLE.
constexpr absl::Duration kProbeTime = absl::Seconds(60);

// Whether the server at `address` takes part in moves and accepts `peer`:
// MoveBlocks for the stable version `version` moves nothing, and a server
// that would take part answers it FAILED_PRECONDITION "... (not moving)"
// (BlockMover::Move). Any other answer (PERMISSION_DENIED or
// UNAUTHENTICATED for credentials the server refuses, FAILED_PRECONDITION
// for a server with --replicas or no --placement_redirects, a TLS handshake
// that fails) is returned.
absl::Status CheckTakesPart(const std::string& address, const PeerCredentials& peer,
                            uint64_t version, absl::Time deadline) {
  std::string asked;
  absl::StatusOr<v1::MoveBlocksResponse> probe = MoveBlocksOn(
      [&address]() -> absl::StatusOr<std::string> { return address; }, peer, version,
      std::min(deadline, absl::Now() + kProbeTime), &asked);
  if (absl::IsFailedPrecondition(probe.status()) &&
      absl::StrContains(probe.status().message(), "(not moving)")) {
    return absl::OkStatus();
  }
  if (probe.ok()) {
    return absl::InternalError(
        absl::StrCat("MoveBlocks for the stable placement version ", version, " succeeded"));
  }
  return probe.status();
}

// The checks of `options` that need no etcd.
absl::Status CheckScaleOptions(const ScaleOptions& options) {
  if (options.to < 1 || options.to > kMaxPlacementServers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the server count must be in [1, ", kMaxPlacementServers, "], got ", options.to));
  }
  if (options.tls.enabled()) PS_RETURN_IF_ERROR(CheckTlsOptions(options.tls));
  if (!options.token.empty()) {
    if (const std::string problem = TokenProblem(options.token); !problem.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("the token: ", problem));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteDesired(EtcdClient& etcd, uint32_t count) {
  return etcd.Put(etcd_keys::DesiredKey(), absl::StrCat(count));
}

}  // namespace

absl::StatusOr<ScaleResult> ScaleCluster(const ScaleOptions& options) {
  PS_RETURN_IF_ERROR(CheckScaleOptions(options));
  const uint32_t to = options.to;
  const PeerCredentials peer{.tls = options.tls, .token = options.token};
  const absl::Time deadline = absl::Now() + options.timeout;
  auto say = [&](const std::string& line) {
    if (options.progress) options.progress(line);
  };
  EtcdClientOptions etcd_options;
  etcd_options.endpoints = options.etcd_endpoints;
  etcd_options.prefix = etcd_keys::ClusterPrefix(options.cluster);
  etcd_options.tls = options.etcd_tls;
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
    // Nothing is written unless every old owner would take part.
    std::vector<uint32_t> missing;
    PS_ASSIGN_OR_RETURN(std::vector<std::string> owners,
                        Registered(*etcd, held.num_servers(), &missing));
    if (!missing.empty()) {
      return absl::UnavailableError(absl::StrCat(
          "server ", missing.front(), " of ", held.num_servers(),
          " is not registered in etcd: nothing was changed; run again once it is"));
    }
    for (uint32_t i = 0; i < held.num_servers(); ++i) {
      absl::Status takes_part = CheckTakesPart(owners[i], peer, held.version(), deadline);
      if (!takes_part.ok()) {
        return absl::Status(takes_part.code(),
                            absl::StrCat("server ", i, " at ", owners[i], " would not hand its "
                                         "blocks over: ", takes_part.message(),
                                         "; nothing was changed"));
      }
    }
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
    moves.push_back(std::async(std::launch::async, [&etcd, &peer, &asked, i, version, deadline] {
      return MoveBlocksOn([&etcd, i] { return RegisteredAddress(*etcd, i); }, peer, version,
                          deadline, &asked[i]);
    }));
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
