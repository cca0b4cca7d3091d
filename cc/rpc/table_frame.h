// The sparse table frames of the bulk channel (frame.h kTableRowsPull,
// kTableRowsPush): a table's keys and rows as contiguous little-endian arrays
// after a small fixed header, no protobuf message. The client writes them
// straight from the caller's key and value memory (scatter-gather: the
// header, the keys, the values); the server reads them in place (spans over
// the received buffer) and writes pulled rows straight into its reply.
//
//   request payload = header (56 bytes) + table name + worker
//                     + zero bytes up to a multiple of 8
//                     + keys (key_count uint64s) + values (value_bytes)
//   header: magic "PST1" (4), value type (1: the v1::ElementType number;
//           a push's values travel in it, a pull asks for its rows in it;
//           0: as stored), 3 zero bytes, table name length (4), worker
//           length (4), key count (8), value bytes (8; 0 for a pull),
//           client id (8), sequence (8; the push's exactly-once id, 0 for
//           a pull), clock (8, signed; the worker's, with a worker)
//   pull reply payload = content type (4: the rows' ElementType number when
//           the request asked for a wire type, else 0), 4 zero bytes,
//           value bytes (8), then the rows
//   push reply payload = empty
//
// Every integer is little-endian; the keys are at an offset that is a
// multiple of 8, so a receive buffer that is 8-byte aligned holds them
// aligned. Which servers speak it: OpenChannelResponse.table_frames.
#ifndef PSERVER_CC_RPC_TABLE_FRAME_H_
#define PSERVER_CC_RPC_TABLE_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pserver {

inline constexpr size_t kTableFrameHeaderBytes = 56;
inline constexpr size_t kTablePullReplyHeaderBytes = 16;
// The version of the table frames a server speaks
// (OpenChannelResponse.table_frames; 0: none, use the protobuf frames).
inline constexpr uint32_t kTableFrameVersion = 1;

// One table frame's fields, as views (of the caller's memory when encoding,
// of the received payload when decoded).
struct TableFrame {
  absl::string_view table;
  absl::string_view worker;
  int64_t clock = 0;
  uint64_t client_id = 0;
  uint64_t sequence = 0;
  uint8_t value_type = 0;  // v1::ElementType number; 0: as stored
  absl::Span<const uint64_t> keys;
  absl::string_view values;  // a push's rows; empty for a pull
  // Not encoded: where a pull's caller wants its rows (exactly this many
  // bytes, in key order). A transport may put them there as they arrive
  // instead of into a buffer of its own; the rows it hands over are then
  // this memory. Empty: not offered.
  absl::Span<char> rows_into;
  // Not encoded: with `rows_at` (one index per key), the rows go scattered
  // instead: key j's row, `row_bytes` bytes, at rows_into + rows_at[j] *
  // row_bytes (each index below rows_into.size() / row_bytes). A transport
  // that put them there hands over a view of rows_into's first bytes
  // (keys.size() * row_bytes of them), which then are not the rows in key
  // order: the caller knows them by that address. Transports that do not
  // scatter ignore a frame with rows_at for rows_into.
  absl::Span<const size_t> rows_at;
  size_t row_bytes = 0;
};

// The payload of `frame` as parts to write in order: `head` (filled here:
// the header, the names and the padding; the caller keeps it until written),
// then the keys and the values as they are in the caller's memory.
absl::InlinedVector<absl::string_view, 3> EncodeTableFrame(const TableFrame& frame,
                                                           std::string* head);

// Reads a table frame's payload. `push`: the frame is a push (values
// expected), else a pull (none). The keys are a view of `payload` when they
// lie 8-byte aligned there, else copied into `*scratch`. INVALID_ARGUMENT
// naming what is wrong: shorter than its header, a bad magic, nonzero
// padding, names longer than `max_name_bytes`, a pull with values, or
// lengths that do not add up to the payload exactly (truncated or overlong).
absl::StatusOr<TableFrame> DecodeTableFrame(absl::string_view payload, bool push,
                                            size_t max_name_bytes,
                                            std::vector<uint64_t>* scratch);

// The pull reply's header (kTablePullReplyHeaderBytes) for `value_bytes` of
// rows in `content_type`.
void EncodeTablePullReplyHeader(uint32_t content_type, uint64_t value_bytes, char* out);

struct TablePullReply {
  uint32_t content_type = 0;
  absl::string_view values;  // a view of the payload
};
// DATA_LOSS naming what is wrong (a reply this client cannot trust).
absl::StatusOr<TablePullReply> DecodeTablePullReply(absl::string_view payload);
// The same from the reply's header alone (its first kTablePullReplyHeaderBytes,
// at `header`; not read when `payload_bytes` is shorter) and the payload's
// length: the rows' content type. For a reader that puts the rows
// elsewhere than after the header (straight into the caller's output).
absl::StatusOr<uint32_t> DecodeTablePullReplyHeader(const char* header, uint64_t payload_bytes);

}  // namespace pserver

#endif  // PSERVER_CC_RPC_TABLE_FRAME_H_
