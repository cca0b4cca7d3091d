// The sparse table calls as bulk methods: TablePull and TablePush over the
// bulk channel (frame.h kTablePull / kTablePush, bulk_listener.h), on the
// very bytes of their gRPC messages (TablePullRequest -> TablePullResponse,
// TablePushRequest -> TablePushResponse, service.proto).
//
// Each runs the dispatcher's control method of the same name, so the serving
// check, exactly-once pushes (client_id, sequence), the counters and every
// error are those of the control call by construction. What differs:
//   - a read's rows are not copied into the reply: the response's `values`
//     string becomes a slice of the reply as it is;
//   - a pull's reply holds reply budget until it is sent
//     (--max_reply_bytes_in_flight), as GetParams' does;
//   - a pull with a `worker` (a consistent read, which may wait for other
//     workers' clocks) is INVALID_ARGUMENT: it must be the TablePull control
//     call, which waits without holding a thread. The client sends only reads
//     without a worker over the channel.
//
// The table frames (frame.h kTableRowsPull / kTableRowsPush, table_frame.h)
// carry the same calls without a protobuf message: the keys and pushed rows
// are read in place from the received buffer, and pulled rows are written
// straight into the reply, whose reply budget is held before it is
// allocated. They run the dispatcher's PullTableRows / PushTableRows: the
// same serving check, fence, exactly-once ids, shipping to backups, finite
// check and wire types as the control calls. A frame that does not decode
// is INVALID_ARGUMENT naming what is wrong (counted as malformed), nothing
// applied; a pull frame with a worker is refused as above.
#ifndef PSERVER_CC_SERVER_TABLE_BULK_H_
#define PSERVER_CC_SERVER_TABLE_BULK_H_

#include "absl/status/status.h"
#include "cc/rpc/table_frame.h"
#include "cc/server/dispatcher.h"
#include "grpcpp/support/byte_buffer.h"

namespace pserver {

// BulkMethodFn (service.h) for "TablePull" and "TablePush".
absl::Status TablePullBulk(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                           grpc::ByteBuffer* response, ReplyHold* hold);
absl::Status TablePushBulk(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                           grpc::ByteBuffer* response, ReplyHold* hold);
// BulkMethodFn for "TablePullRows" and "TablePushRows" (the table frames).
absl::Status TableRowsPullBulk(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                               grpc::ByteBuffer* response, ReplyHold* hold);
absl::Status TableRowsPushBulk(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                               grpc::ByteBuffer* response, ReplyHold* hold);

// What a table frame asks of the dispatcher (PullTableRows /
// PushTableRows): its fields as a view, valid while `frame` is.
TableRowsView TableRowsViewOf(const TableFrame& frame);

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_TABLE_BULK_H_
