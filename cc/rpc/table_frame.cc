#include "cc/rpc/table_frame.h"

#include <cstring>

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"

namespace pserver {
namespace {

// Keys and header fields are copied as they lie in memory: little-endian.
#ifndef ABSL_IS_LITTLE_ENDIAN
#error "the table frames are written as this host's memory: a little-endian host is assumed"
#endif

constexpr uint32_t kMagic = 0x31545350;  // "PST1" little-endian

template <typename T>
void Put(T value, char* out) {
  std::memcpy(out, &value, sizeof(T));
}

template <typename T>
T Get(const char* in) {
  T value;
  std::memcpy(&value, in, sizeof(T));
  return value;
}

// Offsets in the request header.
constexpr size_t kValueTypeAt = 4, kPaddingAt = 5, kTableLengthAt = 8, kWorkerLengthAt = 12,
                 kKeyCountAt = 16, kValueBytesAt = 24, kClientIdAt = 32, kSequenceAt = 40,
                 kClockAt = 48;
static_assert(kClockAt + 8 == kTableFrameHeaderBytes);

size_t PaddedTo8(size_t n) { return (n + 7) & ~size_t{7}; }

}  // namespace

absl::InlinedVector<absl::string_view, 3> EncodeTableFrame(const TableFrame& frame,
                                                           std::string* head) {
  const size_t names = frame.table.size() + frame.worker.size();
  head->assign(kTableFrameHeaderBytes + PaddedTo8(names), '\0');
  char* out = head->data();
  Put<uint32_t>(kMagic, out);
  Put<uint8_t>(frame.value_type, out + kValueTypeAt);
  Put<uint32_t>(static_cast<uint32_t>(frame.table.size()), out + kTableLengthAt);
  Put<uint32_t>(static_cast<uint32_t>(frame.worker.size()), out + kWorkerLengthAt);
  Put<uint64_t>(frame.keys.size(), out + kKeyCountAt);
  Put<uint64_t>(frame.values.size(), out + kValueBytesAt);
  Put<uint64_t>(frame.client_id, out + kClientIdAt);
  Put<uint64_t>(frame.sequence, out + kSequenceAt);
  Put<int64_t>(frame.clock, out + kClockAt);
  std::memcpy(out + kTableFrameHeaderBytes, frame.table.data(), frame.table.size());
  std::memcpy(out + kTableFrameHeaderBytes + frame.table.size(), frame.worker.data(),
              frame.worker.size());
  absl::InlinedVector<absl::string_view, 3> parts = {*head};
  if (!frame.keys.empty()) {
    parts.emplace_back(reinterpret_cast<const char*>(frame.keys.data()),
                       frame.keys.size() * sizeof(uint64_t));
  }
  if (!frame.values.empty()) parts.push_back(frame.values);
  return parts;
}

absl::StatusOr<TableFrame> DecodeTableFrame(absl::string_view payload, bool push,
                                            size_t max_name_bytes,
                                            std::vector<uint64_t>* scratch) {
  const char* kind = push ? "table push frame" : "table pull frame";
  if (payload.size() < kTableFrameHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(kind, " of ", payload.size(),
                                                   " bytes is shorter than its ",
                                                   kTableFrameHeaderBytes, "-byte header"));
  }
  const char* in = payload.data();
  if (Get<uint32_t>(in) != kMagic) {
    return absl::InvalidArgumentError(absl::StrCat(kind, ": bad magic"));
  }
  if (in[kPaddingAt] != 0 || in[kPaddingAt + 1] != 0 || in[kPaddingAt + 2] != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kind, ": nonzero header padding"));
  }
  TableFrame frame;
  frame.value_type = Get<uint8_t>(in + kValueTypeAt);
  const uint32_t table_bytes = Get<uint32_t>(in + kTableLengthAt);
  const uint32_t worker_bytes = Get<uint32_t>(in + kWorkerLengthAt);
  const uint64_t key_count = Get<uint64_t>(in + kKeyCountAt);
  const uint64_t value_bytes = Get<uint64_t>(in + kValueBytesAt);
  frame.client_id = Get<uint64_t>(in + kClientIdAt);
  frame.sequence = Get<uint64_t>(in + kSequenceAt);
  frame.clock = Get<int64_t>(in + kClockAt);
  if (table_bytes > max_name_bytes || worker_bytes > max_name_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(kind, ": a table name of ", table_bytes,
                                                   " bytes or a worker of ", worker_bytes,
                                                   " bytes exceeds the limit of ", max_name_bytes));
  }
  if (!push && (value_bytes != 0 || frame.client_id != 0 || frame.sequence != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kind, " carries ", value_bytes, " value bytes and request id (",
                     frame.client_id, ", ", frame.sequence, "): a pull carries neither"));
  }
  // Every length is checked against what is left, so that no sum overflows.
  const size_t keys_at = kTableFrameHeaderBytes + PaddedTo8(size_t{table_bytes} + worker_bytes);
  const size_t left = payload.size() >= keys_at ? payload.size() - keys_at : 0;
  if (payload.size() < keys_at || key_count > left / sizeof(uint64_t) ||
      value_bytes != left - key_count * sizeof(uint64_t)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kind, " of ", payload.size(), " bytes does not match its header (", table_bytes,
        "-byte table name, ", worker_bytes, "-byte worker, ", key_count, " keys, ", value_bytes,
        " value bytes): truncated, overlong or corrupt"));
  }
  frame.table = payload.substr(kTableFrameHeaderBytes, table_bytes);
  frame.worker = payload.substr(kTableFrameHeaderBytes + table_bytes, worker_bytes);
  for (size_t i = kTableFrameHeaderBytes + table_bytes + worker_bytes; i < keys_at; ++i) {
    if (in[i] != 0) return absl::InvalidArgumentError(absl::StrCat(kind, ": nonzero padding"));
  }
  const char* keys = in + keys_at;
  if (reinterpret_cast<uintptr_t>(keys) % alignof(uint64_t) == 0) {
    frame.keys = absl::MakeConstSpan(reinterpret_cast<const uint64_t*>(keys), key_count);
  } else {
    scratch->resize(key_count);
    if (key_count > 0) std::memcpy(scratch->data(), keys, key_count * sizeof(uint64_t));
    frame.keys = *scratch;
  }
  frame.values = payload.substr(keys_at + key_count * sizeof(uint64_t));
  return frame;
}

void EncodeTablePullReplyHeader(uint32_t content_type, uint64_t value_bytes, char* out) {
  Put<uint32_t>(content_type, out);
  Put<uint32_t>(0, out + 4);
  Put<uint64_t>(value_bytes, out + 8);
}

absl::StatusOr<uint32_t> DecodeTablePullReplyHeader(const char* header, uint64_t payload_bytes) {
  if (payload_bytes < kTablePullReplyHeaderBytes) {
    return absl::DataLossError(absl::StrCat("table pull reply of ", payload_bytes,
                                            " bytes is shorter than its header"));
  }
  const uint64_t value_bytes = Get<uint64_t>(header + 8);
  if (Get<uint32_t>(header + 4) != 0 ||
      value_bytes != payload_bytes - kTablePullReplyHeaderBytes) {
    return absl::DataLossError(absl::StrCat("table pull reply of ", payload_bytes,
                                            " bytes does not match its header (", value_bytes,
                                            " value bytes)"));
  }
  return Get<uint32_t>(header);
}

absl::StatusOr<TablePullReply> DecodeTablePullReply(absl::string_view payload) {
  const absl::StatusOr<uint32_t> content_type =
      DecodeTablePullReplyHeader(payload.data(), payload.size());
  if (!content_type.ok()) return content_type.status();
  TablePullReply reply;
  reply.content_type = *content_type;
  reply.values = payload.substr(kTablePullReplyHeaderBytes);
  return reply;
}

}  // namespace pserver
