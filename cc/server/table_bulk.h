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
#ifndef PSERVER_CC_SERVER_TABLE_BULK_H_
#define PSERVER_CC_SERVER_TABLE_BULK_H_

#include "absl/status/status.h"
#include "cc/server/dispatcher.h"
#include "grpcpp/support/byte_buffer.h"

namespace pserver {

// BulkMethodFn (service.h) for "TablePull" and "TablePush".
absl::Status TablePullBulk(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                           grpc::ByteBuffer* response, ReplyHold* hold);
absl::Status TablePushBulk(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                           grpc::ByteBuffer* response, ReplyHold* hold);

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_TABLE_BULK_H_
