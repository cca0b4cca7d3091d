// Framing of the bulk channel: a byte stream beside gRPC (TCP, or an abstract
// Unix socket on the same host) that carries the three bulk methods with the
// very message bytes their raw gRPC methods carry (cc/rpc/wire.h).
//
//   request  = header (32 bytes) + payload (SendGradsRequest, GetParamsRequest,
//              PushPullRequest, TablePullRequest, TablePushRequest, a table
//              frame for kTableRowsPull / kTableRowsPush (table_frame.h), a
//              primary's replicated write for kReplicate, or the token for
//              kHello)
//   reply    = header (48 bytes) + status message + payload (SendGradsResponse,
//              GetParamsResponse, TablePullResponse, TablePushResponse, or a
//              table frame's reply, when the status is OK)
//
// Every integer is little-endian. Request header: magic "PSB1", method (1
// byte), 3 zero bytes, call id (8), timeout in microseconds (8; 0: none),
// payload length (8). Reply header: magic, status code (4, absl/gRPC
// numbering), call id (8), message length (4), 4 zero bytes, payload length
// (8), then when the server received and finished the call (Unix
// nanoseconds, 8 each; the stage times of the client's tickets). A connection starts with a kHello frame presenting the server's token
// (v1::OpenChannelResponse); replies may come in any order, matched by id.
#ifndef PSERVER_CC_RPC_FRAME_H_
#define PSERVER_CC_RPC_FRAME_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "cc/rpc/byte_stream.h"

namespace pserver {

enum class FrameMethod : uint8_t {
  kHello = 1,
  kGetParams = 2,
  kSendGrads = 3,
  kPushPull = 4,
  // A sparse table's TablePullRequest / TablePushRequest (service.proto),
  // answered by its TablePullResponse / TablePushResponse.
  kTablePull = 5,
  kTablePush = 6,
  // A primary's replicated write to its backup (cc/server/replica_channel.h:
  // a 32-byte replication header, the method name, the request's bytes),
  // answered with an empty payload once the backup applied it.
  kReplicate = 7,
  // A sparse table's pull / push as a raw table frame (cc/rpc/table_frame.h:
  // keys and rows as contiguous arrays, no protobuf message), for servers
  // whose OpenChannelResponse.table_frames says they speak it.
  kTableRowsPull = 8,
  kTableRowsPush = 9,
};

inline constexpr size_t kFrameHeaderBytes = 32;
inline constexpr size_t kReplyHeaderBytes = 48;
// The token a connection's first frame presents.
inline constexpr size_t kChannelTokenBytes = 16;
// The longest status message a reply carries (longer ones are cut).
inline constexpr size_t kMaxFrameMessageBytes = 16 << 10;

struct RequestHeader {
  FrameMethod method = FrameMethod::kHello;
  uint64_t call_id = 0;
  uint64_t timeout_micros = 0;  // 0: no deadline
  uint64_t payload_bytes = 0;
};

struct ReplyHeader {
  uint64_t call_id = 0;
  absl::StatusCode code = absl::StatusCode::kOk;
  uint32_t message_bytes = 0;
  uint64_t payload_bytes = 0;
  int64_t received_unix_nanos = 0;
  int64_t processed_unix_nanos = 0;
};

void EncodeRequestHeader(const RequestHeader& header, char out[kFrameHeaderBytes]);
// INVALID_ARGUMENT naming what is wrong: bad magic, unknown method, nonzero
// padding, or a payload over `max_payload_bytes` (RESOURCE_EXHAUSTED).
absl::StatusOr<RequestHeader> DecodeRequestHeader(const char in[kFrameHeaderBytes],
                                                  uint64_t max_payload_bytes);

void EncodeReplyHeader(const ReplyHeader& header, char out[kReplyHeaderBytes]);
// DATA_LOSS naming what is wrong (a reply this client cannot trust).
absl::StatusOr<ReplyHeader> DecodeReplyHeader(const char in[kReplyHeaderBytes],
                                              uint64_t max_payload_bytes);

// Writes one reply frame: `header` (its code, message and payload lengths
// taken from `status` and `payload`), `status`'s message (cut to
// kMaxFrameMessageBytes), then `payload` (sent only when `status` is OK).
absl::Status WriteReplyFrame(ByteStream& stream, ReplyHeader header, const absl::Status& status,
                             absl::Span<const absl::string_view> payload = {});

}  // namespace pserver

#endif  // PSERVER_CC_RPC_FRAME_H_
