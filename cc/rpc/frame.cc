#include "cc/rpc/frame.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace pserver {
namespace {

constexpr uint32_t kMagic = 0x31425350;  // "PSB1" little-endian

void Put(uint64_t value, int bytes, char* out) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

uint64_t Get(const char* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  }
  return value;
}

bool ZeroPadding(const char* in, int bytes) { return Get(in, bytes) == 0; }

}  // namespace

void EncodeRequestHeader(const RequestHeader& header, char out[kFrameHeaderBytes]) {
  Put(kMagic, 4, out);
  Put(static_cast<uint8_t>(header.method), 1, out + 4);
  Put(0, 3, out + 5);
  Put(header.call_id, 8, out + 8);
  Put(header.timeout_micros, 8, out + 16);
  Put(header.payload_bytes, 8, out + 24);
}

absl::StatusOr<RequestHeader> DecodeRequestHeader(const char in[kFrameHeaderBytes],
                                                  uint64_t max_payload_bytes) {
  if (Get(in, 4) != kMagic) return absl::InvalidArgumentError("not a bulk channel frame (magic)");
  const uint64_t method = Get(in + 4, 1);
  if (method < static_cast<uint8_t>(FrameMethod::kHello) ||
      method > static_cast<uint8_t>(FrameMethod::kTableRowsPush)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown bulk channel method ", method));
  }
  if (!ZeroPadding(in + 5, 3)) return absl::InvalidArgumentError("nonzero frame header padding");
  RequestHeader header;
  header.method = static_cast<FrameMethod>(method);
  header.call_id = Get(in + 8, 8);
  header.timeout_micros = Get(in + 16, 8);
  header.payload_bytes = Get(in + 24, 8);
  if (header.payload_bytes > max_payload_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("a bulk channel frame of ",
                                                     header.payload_bytes,
                                                     " bytes exceeds the limit of ",
                                                     max_payload_bytes, " (--max_message_bytes)"));
  }
  return header;
}

void EncodeReplyHeader(const ReplyHeader& header, char out[kReplyHeaderBytes]) {
  Put(kMagic, 4, out);
  Put(static_cast<uint32_t>(header.code), 4, out + 4);
  Put(header.call_id, 8, out + 8);
  Put(header.message_bytes, 4, out + 16);
  Put(0, 4, out + 20);
  Put(header.payload_bytes, 8, out + 24);
  Put(static_cast<uint64_t>(header.received_unix_nanos), 8, out + 32);
  Put(static_cast<uint64_t>(header.processed_unix_nanos), 8, out + 40);
}

absl::StatusOr<ReplyHeader> DecodeReplyHeader(const char in[kReplyHeaderBytes],
                                              uint64_t max_payload_bytes) {
  if (Get(in, 4) != kMagic) return absl::DataLossError("bulk channel reply: bad magic");
  const uint64_t code = Get(in + 4, 4);
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::DataLossError(absl::StrCat("bulk channel reply: unknown status code ", code));
  }
  if (!ZeroPadding(in + 20, 4)) return absl::DataLossError("bulk channel reply: nonzero padding");
  ReplyHeader header;
  header.code = static_cast<absl::StatusCode>(code);
  header.call_id = Get(in + 8, 8);
  header.message_bytes = static_cast<uint32_t>(Get(in + 16, 4));
  header.payload_bytes = Get(in + 24, 8);
  header.received_unix_nanos = static_cast<int64_t>(Get(in + 32, 8));
  header.processed_unix_nanos = static_cast<int64_t>(Get(in + 40, 8));
  if (header.message_bytes > kMaxFrameMessageBytes || header.payload_bytes > max_payload_bytes) {
    return absl::DataLossError(absl::StrCat("bulk channel reply of ", header.payload_bytes,
                                            " bytes (message ", header.message_bytes,
                                            ") exceeds the limit of ", max_payload_bytes));
  }
  return header;
}

absl::Status WriteReplyFrame(ByteStream& stream, ReplyHeader header, const absl::Status& status,
                             absl::Span<const absl::string_view> payload) {
  header.code = status.code();
  const absl::string_view message = status.message().substr(0, kMaxFrameMessageBytes);
  header.message_bytes = static_cast<uint32_t>(message.size());
  header.payload_bytes = 0;
  if (status.ok()) {
    for (absl::string_view part : payload) header.payload_bytes += part.size();
  }
  char encoded[kReplyHeaderBytes];
  EncodeReplyHeader(header, encoded);
  std::vector<absl::string_view> parts = {absl::string_view(encoded, sizeof(encoded)), message};
  if (status.ok()) parts.insert(parts.end(), payload.begin(), payload.end());
  return stream.Write(parts);
}

}  // namespace pserver
