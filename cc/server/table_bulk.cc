#include "cc/server/table_bulk.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/core/status_macros.h"
#include "cc/core/names.h"
#include "cc/core/waiters.h"
#include "cc/rpc/table_frame.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/slice.h"
#include "pserver/v1/service.pb.h"

namespace pserver {
namespace {

using ::google::protobuf::internal::WireFormatLite;

// Parses `request` into `message`; INVALID_ARGUMENT (counted) if it does not.
absl::Status Parse(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                   google::protobuf::Message* message) {
  grpc::ByteBuffer copy(request);  // shares the slices
  if (grpc::SerializationTraits<google::protobuf::Message>::Deserialize(&copy, message).ok()) {
    return absl::OkStatus();
  }
  dispatcher.CountMalformed();
  return absl::InvalidArgumentError(absl::StrCat("malformed ", message->GetDescriptor()->name()));
}

// Runs control method `name` of the dispatcher; the table methods sent here
// do not wait, so `done` has run when Call returns (BlockingWait in case).
absl::Status Run(Dispatcher& dispatcher, absl::string_view name,
                 const google::protobuf::Message& request, google::protobuf::Message* response) {
  BlockingWait wait;
  dispatcher.Call(name, request, response, Dispatcher::CallContext(), wait.Done());
  return wait.Wait();
}

// A slice that owns `bytes` (no copy).
grpc::Slice OwningSlice(std::unique_ptr<std::string> bytes) {
  std::string* raw = bytes.release();
  return grpc::Slice(raw->data(), raw->size(), [](void* p) { delete static_cast<std::string*>(p); },
                     raw);
}

// A TablePullResponse as a byte buffer: field 1 (`values`) takes over the
// response's string as a slice of its own, then the rest.
grpc::ByteBuffer PullReply(v1::TablePullResponse& response) {
  std::unique_ptr<std::string> values(response.release_values());
  std::string head;
  if (values != nullptr && !values->empty()) {
    google::protobuf::io::StringOutputStream stream(&head);
    google::protobuf::io::CodedOutputStream out(&stream);
    WireFormatLite::WriteTag(v1::TablePullResponse::kValuesFieldNumber,
                             WireFormatLite::WIRETYPE_LENGTH_DELIMITED, &out);
    out.WriteVarint32(static_cast<uint32_t>(values->size()));
  }
  const std::string rest = response.SerializeAsString();  // the trace
  std::vector<grpc::Slice> slices;
  if (!head.empty()) {
    slices.emplace_back(head);
    slices.push_back(OwningSlice(std::move(values)));
  }
  slices.emplace_back(rest);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// A read by a worker may wait: it must be the control call.
absl::Status RefuseWorkerRead(absl::string_view table, absl::string_view worker) {
  return absl::InvalidArgumentError(absl::StrCat(
      "table '", table, "': a read by worker '", worker,
      "' may wait for other workers' clocks: send it as the TablePull control call, not over "
      "the bulk channel"));
}

// A table frame decoded in place: its views point into `*slice` (and
// `*scratch` for keys that lie unaligned). INVALID_ARGUMENT (counted) if it
// does not decode.
absl::StatusOr<TableFrame> DecodeFrame(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                                       bool push, grpc::Slice* slice,
                                       std::vector<uint64_t>* scratch) {
  if (!request.TrySingleSlice(slice).ok() && !request.DumpToSingleSlice(slice).ok()) {
    *slice = grpc::Slice();  // an empty frame
  }
  absl::StatusOr<TableFrame> frame = DecodeTableFrame(
      absl::string_view(reinterpret_cast<const char*>(slice->begin()), slice->size()), push,
      kMaxNameBytes, scratch);
  if (!frame.ok()) dispatcher.CountMalformed();
  return frame;
}

}  // namespace

TableRowsView TableRowsViewOf(const TableFrame& frame) {
  TableRowsView view;
  view.table = frame.table;
  view.keys = frame.keys;
  view.values = frame.values;
  view.value_type = static_cast<ElementType>(frame.value_type);
  view.worker = frame.worker;
  view.clock = frame.clock;
  return view;
}

absl::Status TablePullBulk(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                           grpc::ByteBuffer* response, ReplyHold* hold) {
  // Before parsing, so that a starting server answers UNAVAILABLE whatever
  // it is sent (the control method checks again).
  PS_RETURN_IF_ERROR(dispatcher.CheckServing());
  v1::TablePullRequest parsed;
  PS_RETURN_IF_ERROR(Parse(dispatcher, request, &parsed));
  if (!parsed.worker().empty()) return RefuseWorkerRead(parsed.table(), parsed.worker());
  PS_RETURN_IF_ERROR(dispatcher.CheckReplyRoom());
  v1::TablePullResponse pulled;
  PS_RETURN_IF_ERROR(Run(dispatcher, "TablePull", parsed, &pulled));
  *response = PullReply(pulled);
  return dispatcher.HoldReply(response->Length(), hold);
}

absl::Status TablePushBulk(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                           grpc::ByteBuffer* response, ReplyHold*) {
  PS_RETURN_IF_ERROR(dispatcher.CheckServing());
  v1::TablePushRequest parsed;
  PS_RETURN_IF_ERROR(Parse(dispatcher, request, &parsed));
  v1::TablePushResponse pushed;
  PS_RETURN_IF_ERROR(Run(dispatcher, "TablePush", parsed, &pushed));
  const std::string bytes = pushed.SerializeAsString();
  grpc::Slice slice(bytes);
  *response = grpc::ByteBuffer(&slice, 1);
  return absl::OkStatus();
}

absl::Status TableRowsPullBulk(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                               grpc::ByteBuffer* response, ReplyHold* hold) {
  PS_RETURN_IF_ERROR(dispatcher.CheckServing());
  grpc::Slice payload;
  std::vector<uint64_t> scratch;
  PS_ASSIGN_OR_RETURN(const TableFrame frame,
                      DecodeFrame(dispatcher, request, /*push=*/false, &payload, &scratch));
  if (!frame.worker.empty()) return RefuseWorkerRead(frame.table, frame.worker);
  PS_RETURN_IF_ERROR(dispatcher.CheckReplyRoom());
  grpc::Slice reply;
  PS_RETURN_IF_ERROR(dispatcher.PullTableRows(
      TableRowsViewOf(frame),
      [&](size_t bytes, ElementType content_type) -> absl::StatusOr<absl::Span<char>> {
        // Held before the rows are allocated: a reply that does not fit is
        // never built.
        PS_RETURN_IF_ERROR(dispatcher.HoldReply(kTablePullReplyHeaderBytes + bytes, hold));
        reply = grpc::Slice(kTablePullReplyHeaderBytes + bytes);
        char* data = reinterpret_cast<char*>(const_cast<uint8_t*>(reply.begin()));
        EncodeTablePullReplyHeader(static_cast<uint32_t>(content_type), bytes, data);
        return absl::MakeSpan(data + kTablePullReplyHeaderBytes, bytes);
      }));
  *response = grpc::ByteBuffer(&reply, 1);
  return absl::OkStatus();
}

absl::Status TableRowsPushBulk(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                               grpc::ByteBuffer* response, ReplyHold*) {
  PS_RETURN_IF_ERROR(dispatcher.CheckServing());
  grpc::Slice payload;
  std::vector<uint64_t> scratch;
  PS_ASSIGN_OR_RETURN(const TableFrame frame,
                      DecodeFrame(dispatcher, request, /*push=*/true, &payload, &scratch));
  PS_RETURN_IF_ERROR(dispatcher.PushTableRows(TableRowsViewOf(frame), frame.client_id, frame.sequence));
  *response = grpc::ByteBuffer();
  return absl::OkStatus();
}

}  // namespace pserver
