#include "cc/rpc/grpc_status.h"

#include <utility>

#include "absl/strings/match.h"
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

namespace {

// gRPC's words for failures to connect (1.51), each with the cause it means.
// The first match wins, so the more specific come first.
// `detail`: whether gRPC's message says more than the cause.
struct KnownCause {
  const char* says;
  const char* cause;
  bool detail;
};
constexpr KnownCause kKnownCauses[] = {
    {"handshaker shutdown", kAttemptCutOff, false},
    {"Connection refused", "connection refused", false},
    {"DNS resolution failed", "name not resolved", true},
    {"Domain name not found", "name not resolved", true},
    {"Name or service not known", "name not resolved", true},
    {"http1.x", "not a gRPC (pserver) server: an HTTP/1 server answered", false},
    {"Failed parsing HTTP/2", "not a gRPC (pserver) server: it does not speak HTTP/2", false},
    {"timed out before receiving SETTINGS",
     "no connection: TCP was accepted, but no HTTP/2 answer came (not a gRPC server, or a hung "
     "one)",
     false},
    {"before receiving SETTINGS", "not a gRPC (pserver) server: it closed the connection", true},
    {"Connection reset", "connection reset", true},
    {"No such file or directory", "no such socket", true},
    {"No route to host", "no route to host", false},
    {"Network is unreachable", "network unreachable", false},
    {"failed to connect to all addresses", "connection failed", true},
};

}  // namespace

std::string LatestCause(const std::string& earlier, const std::string& latest) {
  const bool vague = latest == kAttemptCutOff || latest == kNoConnectionInTime;
  return vague && !earlier.empty() ? earlier : latest;
}

std::string UnreachableCause(const grpc::Status& status, grpc_connectivity_state state) {
  const std::string& message = status.error_message();
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    if (state == GRPC_CHANNEL_READY) return "";
    return kNoConnectionInTime;
  }
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return "";
  for (const KnownCause& known : kKnownCauses) {
    if (absl::StrContains(message, known.says)) {
      return known.detail ? absl::StrCat(known.cause, " (", message, ")") : known.cause;
    }
  }
  return "";
}

}  // namespace pserver
