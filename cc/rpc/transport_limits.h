// Transport limits that a pserver Client and Server must agree on: the
// largest message either end accepts, and the keepalive pings a client may
// send without the server closing its connection for pinging too often.
// Header-only and free of gRPC, so that option structs can name them.
//
//   builder.SetMaxReceiveMessageSize(kDefaultMaxMessageBytes);   // server
//   if (options.max_request_bytes > kMaxRequestPayloadBytes) ... // client
#ifndef PSERVER_CC_RPC_TRANSPORT_LIMITS_H_
#define PSERVER_CC_RPC_TRANSPORT_LIMITS_H_

#include <cstddef>

#include "absl/time/time.h"

namespace pserver {

// The largest gRPC message (after decompression) a server accepts by
// default (pserver --max_message_bytes) and a client accepts in a reply.
inline constexpr size_t kDefaultMaxMessageBytes = size_t{64} << 20;

// The most payload a client puts in one request (ClientOptions block_bytes
// and max_request_bytes). A request carries at most about 6 bytes per
// payload byte (a table request of 2-byte rows also holds an up to 10-byte
// key per row), so 8x headroom keeps every request under the default
// message limit.
inline constexpr size_t kMaxRequestPayloadBytes = kDefaultMaxMessageBytes / 8;

// Client keepalive: a ping after this much silence on a connection with
// calls in flight, given up (connection closed) after the timeout. Never
// more often than the server's kMinClientPingInterval, or the server would
// close the connection ("too_many_pings").
inline constexpr absl::Duration kClientKeepaliveTime = absl::Minutes(1);
inline constexpr absl::Duration kClientKeepaliveTimeout = absl::Seconds(20);
inline constexpr absl::Duration kMinClientPingInterval = absl::Seconds(30);
static_assert(kClientKeepaliveTime >= kMinClientPingInterval,
              "clients would ping more often than servers allow");

}  // namespace pserver

#endif  // PSERVER_CC_RPC_TRANSPORT_LIMITS_H_
