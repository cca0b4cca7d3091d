// StreamPushPull: a bulk channel PushPull whose reply is written while its
// push is applied (bulk_listener.cc), instead of after the whole push.
//
// Once every gradient passed its checks (so nothing can refuse the push
// any more), the reply frame's header goes out with the reply's length,
// counted up front from the opened blocks; then each pulled block is sent
// as soon as this push's gradients to it are applied (a block the push
// does not touch, at once), straight from the parameter under its read
// lock, so the socket carries block i while block i + 1 is applied. A
// block is sent only as far as the socket takes it without waiting (a
// FrameWriter, cc/rpc/spill_writer.h): the rest is copied, and the copy
// written once no lock is held, so a slow reader never holds a block's
// lock or the push's. Each pulled block is the value after this push,
// consistent in itself, as before; what the push does and answers is
// PushPullScanned's.
//
// On a plain socket the writer is a SpillWriter. Over the bulk channel's
// AEAD layer (mutual TLS, docs/security.md) it is AeadStream::StartFrame:
// each block is sealed straight from the parameter under its read lock
// into the stream's send buffer (sealing takes CPU, never the peer), in the
// very records an unstreamed reply's Write would make, and what the socket
// does not take stays sealed until no lock is held. So the sealing and
// sending of block i overlap the apply of block i + 1 and the client's
// opening of what came before. (TLS records without the AEAD layer are not
// streamed: served as before.)
//
// Where it does not apply it does nothing and says so, and the frame is
// served as before: a push shipped to backups first (its reply waits for
// them, docs/replication.md), a pulled block not in host memory, a read
// that would fail, a reply that does not fit the reply budget now.
#ifndef PSERVER_CC_SERVER_STREAMED_PUSH_PULL_H_
#define PSERVER_CC_SERVER_STREAMED_PUSH_PULL_H_

#include <optional>

#include "absl/status/status.h"
#include "cc/rpc/byte_stream.h"
#include "cc/rpc/frame.h"
#include "cc/rpc/spill_writer.h"
#include "cc/rpc/wire.h"
#include "cc/server/dispatcher.h"
#include "cc/server/reply_budget.h"
#include "grpcpp/support/byte_buffer.h"

namespace pserver {

struct StreamedPushPull {
  enum class Outcome {
    kNotStreamed,  // nothing done: serve the frame as before
    kAnswered,     // refused before any byte was written: reply `status`
    kWritten,      // the reply was written; `status` is the write's (an
                   // error: the connection must be dropped)
  };
  Outcome outcome = Outcome::kNotStreamed;
  absl::Status status;
  // kNotStreamed once the request was decoded: it, so that the frame is
  // served without decoding it again (service.h PushPullDecoded).
  std::optional<PushRequest> decoded;
};

// `request`: a PushPullRequest's bytes (`scan`, may be null, as for
// BulkPushFn); `reply`: the reply header's call id and times;
// `start_frame`: the writer of the reply frame (null: not streamed), made
// before anything is applied; `hold`: the reply's bytes held until it is
// sent.
StreamedPushPull StreamPushPull(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                                const PushFiniteScan* scan, ReplyHeader reply,
                                StartFrameFn start_frame, ReplyHold* hold);
// On a plain socket (a SpillWriter).
StreamedPushPull StreamPushPull(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                                const PushFiniteScan* scan, ReplyHeader reply,
                                SocketStream& socket, ReplyHold* hold);

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_STREAMED_PUSH_PULL_H_
