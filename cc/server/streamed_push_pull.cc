#include "cc/server/streamed_push_pull.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "cc/core/request_id.h"
#include "cc/rpc/spill_writer.h"
#include "cc/server/service.h"

namespace pserver {
namespace {

using Outcome = StreamedPushPull::Outcome;

StreamedPushPull Result(Outcome outcome, absl::Status status = absl::OkStatus()) {
  return StreamedPushPull{outcome, std::move(status)};
}

// For each read, the last gradient of `grads` to its block (-1: none).
std::vector<int64_t> LastGradients(absl::Span<const GradientView> grads,
                                   absl::Span<const ParameterStore::OpenedBlock> reads) {
  absl::flat_hash_map<std::pair<absl::string_view, uint32_t>, int64_t> last;
  for (size_t i = 0; i < grads.size(); ++i) {
    last[{grads[i].name, grads[i].block.index()}] = static_cast<int64_t>(i);
  }
  std::vector<int64_t> out;
  out.reserve(reads.size());
  for (const ParameterStore::OpenedBlock& read : reads) {
    auto it = last.find({read.header().name(), read.header().block().index()});
    out.push_back(it == last.end() ? -1 : it->second);
  }
  return out;
}

}  // namespace

StreamedPushPull StreamPushPull(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                                const PushFiniteScan* scan, ReplyHeader reply,
                                SocketStream& socket, ReplyHold* hold) {
  return StreamPushPull(
      dispatcher, request, scan, reply,
      [&](uint64_t, uint64_t) -> std::unique_ptr<FrameWriter> {
        return std::make_unique<SpillWriter>(&socket);
      },
      hold);
}

StreamedPushPull StreamPushPull(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                                const PushFiniteScan* scan, ReplyHeader reply,
                                StartFrameFn start_frame, ReplyHold* hold) {
  if (dispatcher.Ships()) return Result(Outcome::kNotStreamed);
  // As PushPullScanned: over the budget nothing is applied.
  if (absl::Status room = dispatcher.CheckReplyRoom(); !room.ok()) {
    return Result(Outcome::kAnswered, room);
  }
  PushRequest push;
  if (absl::Status decoded = DecodeBulkPush(dispatcher, request, scan, &push); !decoded.ok()) {
    return Result(Outcome::kAnswered, decoded);
  }
  // Not streamed past here: served as before, from the request decoded.
  const auto not_streamed = [&push] {
    StreamedPushPull result = Result(Outcome::kNotStreamed);
    result.decoded = std::move(push);
    return result;
  };
  const OpMetrics::Clock::time_point read_start = OpMetrics::Clock::now();
  absl::StatusOr<std::vector<ParameterStore::OpenedBlock>> reads =
      dispatcher.OpenReads(push.refs);
  if (!reads.ok()) return not_streamed();  // answered as before
  // The reply's bytes before each block's content, and its whole length.
  std::vector<std::string> prefixes(reads->size());
  uint64_t payload = 0;
  for (size_t j = 0; j < reads->size(); ++j) {
    const ParameterStore::OpenedBlock& read = (*reads)[j];
    if (!read.host()) return not_streamed();
    AppendParamsBlockPrefix(&prefixes[j], read.header(), read.content_bytes());
    payload += prefixes[j].size() + read.content_bytes();
  }
  const uint64_t frame_bytes = kReplyHeaderBytes + payload;
  const std::unique_ptr<FrameWriter> out = start_frame(kReplyHeaderBytes, frame_bytes);
  if (out == nullptr) return not_streamed();
  if (!dispatcher.HoldReply(payload, hold).ok()) return not_streamed();

  const std::vector<int64_t> last = LastGradients(push.grads, *reads);
  // The frame's last byte is held back until the push is acknowledged (it
  // may still fail past its checks: a fence, a device): the client cannot
  // take the reply for an answer before.
  char last_byte = 0;
  const auto add = [&](absl::string_view bytes) {
    if (!bytes.empty() && out->added() + bytes.size() == frame_bytes) {
      last_byte = bytes.back();
      bytes.remove_suffix(1);
    }
    out->Add(bytes);
  };
  bool started = false;
  bool short_read = false;  // a block delivered other than announced
  uint64_t sent = 0;
  size_t next = 0;  // the next read to send
  const auto start = [&] {
    started = true;
    reply.code = absl::StatusCode::kOk;
    reply.message_bytes = 0;
    reply.payload_bytes = payload;
    reply.processed_unix_nanos = absl::ToUnixNanos(absl::Now());
    char header[kReplyHeaderBytes];
    EncodeReplyHeader(reply, header);
    add(absl::string_view(header, sizeof(header)));
  };
  // Sends every read not yet sent whose gradients are applied through `i`.
  const auto send_through = [&](int64_t i) {
    for (; next < reads->size() && last[next] <= i && !short_read; ++next) {
      const ParameterStore::OpenedBlock& read = (*reads)[next];
      add(prefixes[next]);
      absl::Status status = dispatcher.ReadOpened(read, [&](absl::string_view bytes) {
        // Never on host storage; the frame is cut short and the
        // connection dropped rather than a wrong length sent.
        short_read |= bytes.size() != read.content_bytes();
        if (short_read) return;
        add(bytes);
        sent += bytes.size();
      });
      short_read |= !status.ok();
      if (short_read) return;
    }
  };
  const RequestId id{push.client_id, push.sequence};
  absl::Status pushed = dispatcher.PushStreaming(
      id, push.grads,
      [&] {
        start();
        send_through(-1);
      },
      [&](size_t i) { send_through(static_cast<int64_t>(i)); });
  if (!pushed.ok() && !started) return Result(Outcome::kAnswered, pushed);
  if (!pushed.ok()) {
    // Past its checks (an error applying it, or it is no longer ours): the
    // header said OK but the frame is left short of its last byte and the
    // connection dropped; the client retries the same id, which is answered
    // as a duplicate would be.
    dispatcher.FinishRead(pushed, read_start, sent);
    return Result(Outcome::kWritten,
                  absl::UnavailableError(absl::StrCat("streamed push+pull: ", pushed.message())));
  }
  if (!started) start();  // a duplicate: applied before, nothing applied now
  send_through(INT64_MAX);
  if (!short_read) out->Add(absl::string_view(&last_byte, 1));
  absl::Status written = out->Finish();
  dispatcher.FinishRead(short_read ? absl::InternalError("read") : absl::OkStatus(), read_start,
                        sent);
  if (short_read) {
    return Result(Outcome::kWritten,
                  absl::InternalError("streamed push+pull: a block read other than announced"));
  }
  return Result(Outcome::kWritten, written);
}

}  // namespace pserver
