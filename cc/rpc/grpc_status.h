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
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
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

// INVALID_ARGUMENT naming the option when a client's block_bytes or
// max_request_bytes exceeds kMaxRequestPayloadBytes: its requests could pass
// the servers' default --max_message_bytes.
absl::Status CheckRequestPayloadSizes(size_t block_bytes, size_t max_request_bytes);

// Applies the limits above to a channel's arguments (also for tests).
void SetClientTransportLimits(grpc::ChannelArguments* args);

}  // namespace pserver

#endif  // PSERVER_CC_RPC_GRPC_STATUS_H_
