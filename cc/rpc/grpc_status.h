// Conversions between absl::Status and grpc::Status, and the channel and
// server settings every pserver gRPC endpoint shares. absl::StatusCode and
// grpc::StatusCode have the same numbering, so codes pass through unchanged.
//
//   return ToGrpcStatus(store.Get(ref, &out));         // server side
//   absl::Status s = FromGrpcStatus(call_status);      // client side
#ifndef PSERVER_CC_RPC_GRPC_STATUS_H_
#define PSERVER_CC_RPC_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "cc/rpc/transport_limits.h"
#include "grpcpp/grpcpp.h"

namespace pserver {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// The HTTP/2 stream window both ends start with: large enough for a whole
// ~1 MiB block at once; measured 1.4x more small operations per second than
// gRPC's default here (bench/RESULTS.md).
inline constexpr int kInitialStreamWindowBytes = 4 << 20;

// Trailing metadata of the bulk calls (GetParams, SendGrads, PushPull): a
// serialized v1::ServerTrace saying when the server received and finished
// the call, for the stage timestamps of the client's tickets.
inline constexpr char kServerTraceMetadataKey[] = "pserver-trace-bin";

// Channel arguments for a client channel to one server: replies and
// requests of at most kDefaultMaxMessageBytes (requests are cut into ~1 MiB
// blocks); no compression accepted (a rogue server's small compressed reply
// must not inflate to gigabytes here); keepalive pings the server's policy
// allows (cc/rpc/transport_limits.h); the stream window above; and a
// private subchannel so several channels to one address are really separate.
grpc::ChannelArguments DefaultChannelArguments();

// Why a call never reached its server, in a few words, from the call's
// status and its channel's state when it ended: "connection refused", "name
// not resolved", "not a gRPC (pserver) server", "no connection within the
// deadline", ... each followed by gRPC's own detail where it adds any. Empty
// when the server was reached (its own UNAVAILABLE, a slow reply on a
// connected channel) or the status is not UNAVAILABLE or DEADLINE_EXCEEDED.
std::string UnreachableCause(const grpc::Status& status, grpc_connectivity_state state);

// Two causes that say only that no connection was made, not why: gRPC cut
// an attempt off (re-resolution replaced it, ...), or the call's deadline
// came while the channel was still connecting.
inline constexpr char kAttemptCutOff[] = "connection attempt cut off";
inline constexpr char kNoConnectionInTime[] =
    "no connection within the deadline (the TCP or HTTP/2 handshake did not complete)";
// The cause to report after `earlier` and then `latest` (UnreachableCause
// values): the latest, unless it is one of the two above and the earlier
// says more.
std::string LatestCause(const std::string& earlier, const std::string& latest);

// INVALID_ARGUMENT naming the option when a client's block_bytes or
// max_request_bytes exceeds kMaxRequestPayloadBytes: its requests could pass
// the servers' default --max_message_bytes.
absl::Status CheckRequestPayloadSizes(size_t block_bytes, size_t max_request_bytes);

// Applies the limits above to a channel's arguments (also for tests).
void SetClientTransportLimits(grpc::ChannelArguments* args);

}  // namespace pserver

#endif  // PSERVER_CC_RPC_GRPC_STATUS_H_
