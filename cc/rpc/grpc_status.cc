#include "cc/rpc/grpc_status.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "grpc/compression.h"

namespace pserver {

absl::Status CheckRequestPayloadSizes(size_t block_bytes, size_t max_request_bytes) {
  for (const auto& [name, value] : {std::pair<const char*, size_t>{"block_bytes", block_bytes},
                                    {"max_request_bytes", max_request_bytes}}) {
    if (value > kMaxRequestPayloadBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " is ", value, "; at most ", kMaxRequestPayloadBytes,
                       " so that every request fits the servers' --max_message_bytes (default ",
                       kDefaultMaxMessageBytes, ")"));
    }
  }
  return absl::OkStatus();
}

void SetClientTransportLimits(grpc::ChannelArguments* args) {
  args->SetMaxReceiveMessageSize(static_cast<int>(kDefaultMaxMessageBytes));
  args->SetMaxSendMessageSize(static_cast<int>(kDefaultMaxMessageBytes));
  // Only "identity": a compressed reply is refused before it is inflated.
  args->SetInt(GRPC_COMPRESSION_CHANNEL_ENABLED_ALGORITHMS_BITSET, 1 << GRPC_COMPRESS_NONE);
  args->SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
               static_cast<int>(absl::ToInt64Milliseconds(kClientKeepaliveTime)));
  args->SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
               static_cast<int>(absl::ToInt64Milliseconds(kClientKeepaliveTimeout)));
  // Pings only while calls are in flight, also on a call that waits long
  // without data (a barrier): the server allows that (kMinClientPingInterval).
  args->SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  args->SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

grpc::ChannelArguments DefaultChannelArguments() {
  grpc::ChannelArguments args;
  SetClientTransportLimits(&args);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kInitialStreamWindowBytes);
  return args;
}

}  // namespace pserver
