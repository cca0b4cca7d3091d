// Zero-copy encoding of the bulk messages (SendGradsRequest, PushPullRequest,
// GetParamsResponse) straight to and from gRPC byte buffers.
//
// The bytes are exactly the protobuf encoding of the messages in
// proto/pserver/v1/service.proto, so any protobuf client interoperates; what
// differs is that tensor payloads never pass through a protobuf `bytes`
// field: an outgoing payload is a slice that borrows the caller's memory, and
// an incoming one is handed out as the list of gRPC slices it arrived in.
// Everything else (names, shapes, block refs) is encoded and parsed by
// protobuf itself.
//
//   PayloadLease* lease = PayloadLease::Create(on_released);
//   grpc::ByteBuffer request = EncodePushRequest(grads, refs, lease);
//   ...                                     // gRPC sends it; when the call
//   lease->Release();                       // ends, on_released runs once
//                                           // gRPC has let go of the payloads
//   PS_RETURN_IF_ERROR(DecodeParamsResponse(response, &blocks));
//
// The functions are thread-safe; a PayloadLease may be released from any thread.
#ifndef PSERVER_CC_RPC_WIRE_H_
#define PSERVER_CC_RPC_WIRE_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "cc/core/gradient_view.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "pserver/v1/service.pb.h"

namespace pserver {

// Counts the payload slices an outgoing message borrows, and runs a callback
// once the last of them is released and its owner has called Release().
// Deletes itself after that.
class PayloadLease {
 public:
  static PayloadLease* Create(std::function<void()> on_released);

  // The owner's reference: call once, after gRPC is done with the call.
  void Release();

  // A slice over `bytes` that holds a reference on this lease.
  grpc::Slice Borrow(absl::string_view bytes);

 private:
  explicit PayloadLease(std::function<void()> on_released);
  static void Unref(void* lease);

  std::atomic<int> refs_{1};
  std::function<void()> on_released_;
};

// SendGradsRequest (refs empty) or PushPullRequest: the gradients' contents
// are borrowed through `lease` and must stay valid until it fires. Each
// content starts a multiple of 16 bytes into the message (a gradient's header
// carries a few bytes of padding in a field protobuf skips, wire.cc), so a
// reader holding the message in one malloc'd buffer decodes it without a copy.
// `client_id` and `sequence` (0: unset) identify the request for exactly-once
// application (service.proto).
grpc::ByteBuffer EncodePushRequest(absl::Span<const GradientView> grads,
                                   absl::Span<const v1::ParamRef> refs, PayloadLease* lease,
                                   uint64_t client_id = 0, uint64_t sequence = 0);

// A decoded push request. `grads` point into `slices`; keep this alive while
// they are used. A gradient whose content arrived in several pieces, or at an
// address not aligned for its element type, is copied into `scratch`.
struct PushRequest {
  std::vector<grpc::Slice> slices;
  std::vector<v1::Gradient> headers;  // everything but the content
  std::vector<std::string> scratch;
  std::vector<GradientView> grads;
  std::vector<v1::ParamRef> refs;
  uint64_t client_id = 0;  // 0: not set
  uint64_t sequence = 0;
};
// INVALID_ARGUMENT for bytes that are not a well-formed request.
absl::Status DecodePushRequest(const grpc::ByteBuffer& buffer, PushRequest* out);

// Scans a push request's gradients (SendGradsRequest or PushPullRequest
// bytes, in one buffer) for NaN and infinity while the request is still
// arriving: each gradient as soon as all its bytes are in, so that the scan
// runs while the rest is received instead of after it.
//
//   PushFiniteScan scan(absl::string_view(buffer, size));
//   while (...) { read more; scan.Advance(bytes_received_so_far); }
//   DecodePushRequest(same bytes, &push);
//   for (GradientView& g : push.grads) g.checked_finite = scan.Finite(g);
//
// It decides nothing: a gradient it could not scan (cut short, malformed,
// holding a non-finite value, its content not in place) is simply not
// reported, and is scanned by the store as before. Not thread-safe.
class PushFiniteScan {
 public:
  // `message` must outlive the scan and not change once received.
  explicit PushFiniteScan(absl::string_view message) : message_(message) {}
  // The first `received` bytes of the message are in (never fewer than before).
  void Advance(size_t received);
  // Whether `grad` (decoded from the same bytes) was scanned whole, as its
  // own type, and holds no NaN or infinity.
  bool Finite(const GradientView& grad) const;
  size_t gradients_scanned() const { return finite_.size(); }

 private:
  struct Scanned {
    size_t size;
    ElementType type;
  };
  absl::string_view message_;
  size_t parsed_ = 0;     // the top-level fields before this offset are done
  bool stopped_ = false;  // malformed: nothing more is scanned
  absl::flat_hash_map<const char*, Scanned> finite_;  // by content address
};

// Appends the bytes of a GetParamsResponse that come before a block's
// content (`header`: everything but the content; the content is
// `content_size` bytes, which follow).
void AppendParamsBlockPrefix(std::string* out, const v1::Parameter& header, size_t content_size);

// Builds a GetParamsResponse one block at a time; each block's content is
// written once, by `fill`, straight into the slice that will be sent.
class ParamsResponseBuilder {
 public:
  // `header` holds everything but the content.
  void Add(const v1::Parameter& header, size_t content_size,
           absl::FunctionRef<void(char* dest)> fill);
  grpc::ByteBuffer Finish();

 private:
  std::vector<grpc::Slice> slices_;
  std::string pending_;  // small fields not yet turned into a slice
};

// One block of a decoded GetParamsResponse; `content` points into the
// response's slices (kept in `slices`).
struct ParamsResponse {
  std::vector<grpc::Slice> slices;
  std::vector<v1::Parameter> headers;  // everything but the content
  std::vector<Segments> contents;
};
// DATA_LOSS for bytes that are not a well-formed response.
absl::Status DecodeParamsResponse(const grpc::ByteBuffer& buffer, ParamsResponse* out);

// Reads a GetParamsResponse of `bytes` bytes (a bulk channel reply's
// payload) from a stream as it arrives, one block at a time, never holding
// the whole message: each block's small fields (its header), then its
// content, which goes straight into the memory `where(header, size)` names
// for it (exactly `size` bytes; asked only when the content is the block's
// last field, as ParamsResponseBuilder and the streamed push+pull write it,
// so the header is complete) or, where it names none, into a buffer; then
// `place(header, content)` (for content read in place, content[0].data()
// is the address `where` gave).
//
//   absl::Status blocks;
//   PS_RETURN_IF_ERROR(ReadParamsResponse(n, read, where, place, &blocks, &stats));
//
// `read(dest, n)` reads exactly n bytes of the stream; ReadParamsResponse
// reads exactly `bytes` (a few hundred ahead of a block's content at most,
// within the message). Returns read's first error (the stream is then out
// of step). Otherwise every byte was read and *blocks says how the blocks
// went: DATA_LOSS for bytes that are not a well-formed response (as
// DecodeParamsResponse says it), else the first error of `place`; after
// either, nothing more is asked of `where` or `place` (the rest is read
// and dropped), and no byte goes where `where` did not point.
struct ParamsReadStats {
  uint64_t bytes_in_place = 0;  // content read straight where `where` said
  uint64_t bytes_buffered = 0;  // content read into a buffer first
};
absl::Status ReadParamsResponse(
    uint64_t bytes, absl::FunctionRef<absl::Status(char* dest, size_t n)> read,
    absl::FunctionRef<char*(const v1::Parameter& header, uint64_t size)> where,
    absl::FunctionRef<absl::Status(const v1::Parameter& header, const Segments& content)> place,
    absl::Status* blocks, ParamsReadStats* stats);

}  // namespace pserver

#endif  // PSERVER_CC_RPC_WIRE_H_
