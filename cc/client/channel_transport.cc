#include "cc/client/channel_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "cc/client/call_group.h"
#include "cc/client/cancellation.h"
#include "cc/core/status_macros.h"
#include "cc/rpc/buffer_pool.h"
#include "cc/rpc/byte_stream.h"
#include "cc/rpc/table_frame.h"
#include "cc/rpc/transport_limits.h"
#include "cc/rpc/wire.h"
#include "cc/security/tls_byte_stream.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace pserver {

// One connection of the bulk channel: callers write their frames themselves
// (one at a time). Replies are read by whoever holds the read turn: a caller
// waiting in a CallGroup for its one call still running, when that is the
// connection's only call, reads its own reply (no hand-off: two wake-ups
// per round trip, the server's and the caller's); a reader thread reads
// whenever a call has no such waiter or several calls are in flight (so a
// caller blocked writing never waits on a reply nobody reads, and the
// replies of a group's calls to several servers are read in parallel).
// Table calls are the exception: their replies are small (CallGroup's
// `small` helpers), so the waiter of a table call split over servers reads
// each server's reply itself, one after the other, on its connection.
// After answering a call with no waiter the reader keeps the turn, waiting
// in the stream for the next reply as a plain reader would (callers that
// never wait in a CallGroup pay no wake-up of the reader per call); after
// answering a waiter's call it gives the turn back.
class ChannelTransport::Connection : public std::enable_shared_from_this<Connection> {
 public:
  // `counters` are the transport's (replies read by waiting callers,
  // pulled bytes read in place or through a buffer).
  Connection(std::unique_ptr<ByteStream> stream, DeadlineTimer* timer, Counters* counters)
      : stream_(std::move(stream)), timer_(timer), counters_(counters) {}
  ~Connection() { Close(); }

  // Whether the server speaks the table frames (cc/rpc/table_frame.h).
  bool table_frames = false;

  // Presents `token` and waits for the server's answer, then starts reading.
  absl::Status Hello(const std::string& token) {
    char header[kFrameHeaderBytes];
    EncodeRequestHeader({FrameMethod::kHello, 0, 0, token.size()}, header);
    PS_RETURN_IF_ERROR(stream_->Write({absl::string_view(header, sizeof(header)), token}));
    PS_ASSIGN_OR_RETURN(ReplyHeader reply, ReadReply());
    if (reply.code != absl::StatusCode::kOk) return absl::Status(reply.code, message_);
    reader_ = std::thread([this] { ReadLoop(); });
    return absl::OkStatus();
  }

  bool broken() const {
    absl::MutexLock lock(&mu_);
    return broken_;
  }

  // Sends one call; `done` runs once (on another thread, or here on error).
  // A table pull's `rows` get its rows (put straight into `rows_into` when
  // they fit it exactly, or scattered there at `rows_at`: TableFrame's)
  // instead of `sink`.
  void Send(FrameMethod method, absl::Span<const absl::string_view> payload, BlockSink sink,
            absl::Time deadline, Done done, TraceRecorder* trace, RowsSink rows = nullptr,
            absl::Span<char> rows_into = {}, absl::Span<const size_t> rows_at = {},
            size_t row_bytes = 0) {
    if (!rows_at.empty() && row_bytes == 0) rows_into = {};
    // A call waited for in a CallGroup, with no cancellation to watch while
    // it waits, may read its own reply on the waiting thread.
    CallGroup* waiter = nullptr;
    if (const auto* c = done.target<CallGroup::Completion>();
        c != nullptr && Cancellation::Current() == nullptr) {
      waiter = c->group;
    }
    // A table call's reply is small: at most the client's
    // max_request_bytes of rows (Table splits larger calls), none for a push.
    const bool table = method == FrameMethod::kTablePull || method == FrameMethod::kTablePush ||
                       method == FrameMethod::kTableRowsPull ||
                       method == FrameMethod::kTableRowsPush;
    uint64_t id = 0;
    bool watch = false;  // the first deadline to watch is this call's
    {
      absl::MutexLock lock(&mu_);
      if (!broken_) {
        id = next_id_++;
        Pending& call = pending_[id];
        call.whole_reply = table;
        call.sink = std::move(sink);
        call.rows = std::move(rows);
        call.rows_into = rows_into;
        call.rows_at = rows_at;
        call.row_bytes = row_bytes;
        call.done = std::move(done);
        call.trace = trace;
        call.deadline = deadline;
        call.helped = waiter != nullptr;
        if (!call.helped) ++unhelped_;
        watch = deadline < watch_at_;
        if (watch) watch_at_ = deadline;
      }
    }
    if (id == 0) {
      done(absl::UnavailableError("the bulk channel connection was lost; retry"));
      return;
    }
    std::weak_ptr<Connection> self = weak_from_this();
    if (waiter != nullptr) {
      waiter->AddHelper(
          [self, id](bool read) {
            if (auto c = self.lock()) c->Help(id, read);
          },
          /*small=*/table);
    }
    if (watch) Watch(deadline);
    std::shared_ptr<Cancellation::Registration> cancel;
    if (Cancellation* current = Cancellation::Current(); current != nullptr) {
      cancel = std::make_shared<Cancellation::Registration>(current->OnCancel([self, id] {
        if (auto c = self.lock()) c->Finish(id, absl::CancelledError("the call was cancelled"), true);
      }));
      absl::MutexLock lock(&mu_);
      auto it = pending_.find(id);
      if (it != pending_.end()) it->second.cancel = std::move(cancel);
    }
    const absl::Status written = WriteRequest(method, id, deadline, payload);
    if (!written.ok()) Break(absl::UnavailableError(absl::StrCat("bulk channel: ", written.message())));
    // The request is out: a call that ended meanwhile (deadline, cancel, a
    // broken connection) reports now, having let go of the caller's memory.
    std::optional<Pending> ended;
    {
      absl::MutexLock lock(&mu_);
      auto it = pending_.find(id);
      if (it == pending_.end()) return;
      it->second.writing = false;
      if (it->second.result.has_value()) ended = Take(it);
    }
    if (ended.has_value()) Report(*ended, *ended->result);
  }

  // Ends the connection: every call not done fails with `why`.
  void Break(const absl::Status& why) {
    std::vector<Pending> failed;
    {
      absl::MutexLock lock(&mu_);
      broken_ = true;
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->second.writing || it->second.receiving) {  // reported once written / received
          if (!it->second.result.has_value()) it->second.result = why;
          ++it;
        } else {
          failed.push_back(Take(it++));
        }
      }
    }
    stream_->Shutdown();
    for (Pending& call : failed) Report(call, why);
  }

  // Stops the reader; every call still pending fails UNAVAILABLE.
  void Close() {
    Break(absl::UnavailableError("the bulk channel connection was closed; retry"));
    if (reader_.joinable() && reader_.get_id() != std::this_thread::get_id()) reader_.join();
    if (reader_.joinable()) reader_.detach();
  }

 private:
  struct Pending {
    BlockSink sink;
    RowsSink rows;               // a table pull's (instead of `sink`)
    absl::Span<char> rows_into;  // where its rows may go as they arrive
    absl::Span<const size_t> rows_at;  // scattered there (TableFrame::rows_at)
    size_t row_bytes = 0;
    Done done;
    TraceRecorder* trace = nullptr;
    absl::Time deadline = absl::InfiniteFuture();
    std::shared_ptr<Cancellation::Registration> cancel;
    bool whole_reply = false;  // the sink gets the reply's payload as it is
    bool writing = true;                // Send is still writing its request
    bool receiving = false;             // its rows or blocks are being read into caller memory
    bool helped = false;                // its waiter reads replies (Help)
    std::optional<absl::Status> result; // ended while writing
  };

  // Takes call `it` out of pending_.
  Pending Take(std::map<uint64_t, Pending>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Pending call = std::move(it->second);
    if (!call.helped) --unhelped_;
    pending_.erase(it);
    return call;
  }

  // Writes one request frame (callers take turns).
  absl::Status WriteRequest(FrameMethod method, uint64_t id, absl::Time deadline,
                            absl::Span<const absl::string_view> payload) {
    uint64_t bytes = 0;
    for (absl::string_view part : payload) bytes += part.size();
    RequestHeader header{method, id, 0, bytes};
    if (deadline != absl::InfiniteFuture()) {
      header.timeout_micros = static_cast<uint64_t>(
          std::max<int64_t>(1, absl::ToInt64Microseconds(deadline - absl::Now())));
    }
    char encoded[kFrameHeaderBytes];
    EncodeRequestHeader(header, encoded);
    absl::InlinedVector<absl::string_view, 8> parts = {absl::string_view(encoded, sizeof(encoded))};
    parts.insert(parts.end(), payload.begin(), payload.end());
    absl::MutexLock lock(&write_mu_);
    return stream_->Write(parts);
  }

  // Ends call `id` with `status` (a deadline or a cancellation: `drop`
  // also breaks the connection, whose reply would come too late).
  void Finish(uint64_t id, const absl::Status& status, bool drop) {
    std::optional<Pending> ended;
    {
      absl::MutexLock lock(&mu_);
      auto it = pending_.find(id);
      if (it == pending_.end()) return;
      if (it->second.writing || it->second.receiving) {
        if (!it->second.result.has_value()) it->second.result = status;
      } else {
        ended = Take(it);
      }
    }
    if (ended.has_value()) Report(*ended, status);
    if (drop) Break(absl::UnavailableError("the bulk channel connection was dropped; retry"));
  }

  // Deadlines: one timer per connection, at the earliest deadline of its
  // calls (calls usually end long before; most calls schedule nothing).
  void Watch(absl::Time when) {
    std::weak_ptr<Connection> self = weak_from_this();
    timer_->Schedule(when, [self] {
      if (auto c = self.lock()) c->ExpireDue();
    });
  }

  // Fails the calls whose deadline passed (and drops the connection: their
  // replies would come too late), then watches the next deadline.
  void ExpireDue() {
    std::vector<uint64_t> due;
    absl::Time next = absl::InfiniteFuture();
    {
      absl::MutexLock lock(&mu_);
      const absl::Time now = absl::Now();
      for (const auto& [id, call] : pending_) {
        if (call.deadline <= now) {
          due.push_back(id);
        } else {
          next = std::min(next, call.deadline);
        }
      }
      watch_at_ = due.empty() ? next : absl::InfiniteFuture();
    }
    for (uint64_t id : due) {
      Finish(id, absl::DeadlineExceededError("deadline exceeded on the bulk channel"), false);
    }
    if (!due.empty()) {
      Break(absl::UnavailableError("the bulk channel connection was dropped; retry"));
    } else if (next != absl::InfiniteFuture()) {
      Watch(next);
    }
  }

  void Report(Pending& call, const absl::Status& status) {
    call.cancel.reset();
    call.sink = nullptr;
    call.rows = nullptr;
    Done done = std::move(call.done);
    done(status);
  }

  // Reads one reply into message_ and payload_ (the read turn's).
  absl::StatusOr<ReplyHeader> ReadReply() {
    PS_ASSIGN_OR_RETURN(ReplyHeader header, ReadReplyHead());
    PS_RETURN_IF_ERROR(ReadPayload(header.payload_bytes));
    return header;
  }

  // A reply's header and status message (into message_).
  absl::StatusOr<ReplyHeader> ReadReplyHead() {
    char encoded[kReplyHeaderBytes];
    PS_RETURN_IF_ERROR(stream_->Read(encoded, sizeof(encoded)));
    PS_ASSIGN_OR_RETURN(ReplyHeader header, DecodeReplyHeader(encoded, kDefaultMaxMessageBytes));
    message_.resize(header.message_bytes);
    PS_RETURN_IF_ERROR(stream_->Read(message_.data(), message_.size()));
    return header;
  }

  // A reply's payload, into payload_.
  absl::Status ReadPayload(uint64_t bytes) {
    payload_ = ProcessBufferPool().Take(bytes);  // a warm buffer when large (buffer_pool.h)
    return stream_->Read(MutableData(payload_), payload_.size());
  }

  // Hands a reply's blocks (or, `whole`, its payload) to the call's sink.
  static absl::Status Deliver(const grpc::Slice& payload, const Pending& call) {
    const absl::string_view bytes(reinterpret_cast<const char*>(payload.begin()), payload.size());
    if (call.rows) {
      PS_ASSIGN_OR_RETURN(const TablePullReply reply, DecodeTablePullReply(bytes));
      return call.rows(reply.content_type, reply.values);
    }
    if (!call.sink) return absl::OkStatus();
    if (call.whole_reply) return call.sink(v1::Parameter(), Segments{bytes});
    ParamsResponse blocks;
    PS_RETURN_IF_ERROR(DecodeParamsResponse(grpc::ByteBuffer(&payload, 1), &blocks));
    for (size_t i = 0; i < blocks.headers.size(); ++i) {
      PS_RETURN_IF_ERROR(call.sink(blocks.headers[i], blocks.contents[i]));
    }
    return absl::OkStatus();
  }

  // The call `id` a reply answers, taken out; none for an unknown id (or
  // one that ended meanwhile). A reply may come before its Send has
  // returned from writing (the server read it all): wait for that.
  std::optional<Pending> TakeAnswered(uint64_t id) {
    absl::MutexLock lock(&mu_);
    AwaitWritten(id);
    auto it = pending_.find(id);
    if (it == pending_.end()) return std::nullopt;
    return Take(it);
  }

  void AwaitWritten(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto written = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = pending_.find(id);
      return it == pending_.end() || !it->second.writing;
    };
    mu_.Await(absl::Condition(&written));
  }

  // Whether `reply` is read straight from the stream into the caller's
  // memory: a table pull's rows when it offered memory (Pending::rows_into)
  // and they fit it exactly, or a pull's blocks when its sink says where
  // they go (BlockSink::Where; each block that goes nowhere goes through a
  // buffer); the call is then marked receiving, so that a deadline, a
  // cancellation or a lost connection leaves it (and the memory) to this
  // reader until the reply is read. Null: the payload goes into a buffer of
  // its own.
  // A receiving call is not taken out nor changed but for its `result` by
  // others, so the reader may use it without the lock until it takes it.
  Pending* ReceiveInto(const ReplyHeader& reply) {
    if (reply.code != absl::StatusCode::kOk) return nullptr;
    absl::MutexLock lock(&mu_);
    AwaitWritten(reply.call_id);
    auto it = pending_.find(reply.call_id);
    if (it == pending_.end() || it->second.result.has_value()) return nullptr;
    const Pending& call = it->second;
    const bool rows = !call.rows_into.empty() &&
                      reply.payload_bytes == kTablePullReplyHeaderBytes + RowsBytes(call);
    const bool blocks = !call.rows && !call.whole_reply && call.sink.has_where();
    if (!rows && !blocks) return nullptr;
    it->second.receiving = true;
    return &it->second;
  }

  // The bytes of rows `call` expects where it offered them.
  static uint64_t RowsBytes(const Pending& call) {
    return call.rows_at.empty() ? call.rows_into.size() : call.rows_at.size() * call.row_bytes;
  }

  // Reads a table pull reply's rows into `call`'s rows_into (in order, or
  // scattered at rows_at) and hands them to its rows sink (`*status`: what
  // that says). An error: the stream failed.
  absl::Status ReceiveRows(uint64_t payload_bytes, const Pending& call, absl::Status* status) {
    char header[kTablePullReplyHeaderBytes];
    PS_RETURN_IF_ERROR(stream_->Read(header, sizeof(header)));
    if (call.rows_at.empty()) {
      PS_RETURN_IF_ERROR(stream_->Read(call.rows_into.data(), call.rows_into.size()));
    } else {
      PS_RETURN_IF_ERROR(ReadScattered(call));
    }
    absl::StatusOr<uint32_t> content_type = DecodeTablePullReplyHeader(header, payload_bytes);
    *status = content_type.ok()
                  ? call.rows(*content_type, absl::string_view(call.rows_into.data(), RowsBytes(call)))
                  : content_type.status();
    return absl::OkStatus();
  }

  // Reads a GetParams or PushPull reply's blocks (wire.h
  // ReadParamsResponse): each content straight into the caller's memory
  // where `call`'s sink says it goes, else through a buffer, and hands each
  // block to the sink (`*status`: what they say). An error: the stream failed.
  absl::Status ReceiveBlocks(uint64_t payload_bytes, const Pending& call, absl::Status* status) {
    ParamsReadStats stats;
    const absl::Status read = ReadParamsResponse(
        payload_bytes, [this](char* dest, size_t n) { return stream_->Read(dest, n); },
        [&call](const v1::Parameter& header, uint64_t size) { return call.sink.Where(header, size); },
        [&call](const v1::Parameter& header, const Segments& content) {
          return call.sink(header, content);
        },
        status, &stats);
    counters_->bytes_in_place.fetch_add(stats.bytes_in_place, std::memory_order_relaxed);
    counters_->bytes_buffered.fetch_add(stats.bytes_buffered, std::memory_order_relaxed);
    return read;
  }

  // Reads `call`'s rows a piece at a time into scratch_ (kept between
  // replies, so no buffer per reply) and copies each row to its place.
  absl::Status ReadScattered(const Pending& call) {
    constexpr size_t kPieceBytes = size_t{64} << 10;
    const size_t row = call.row_bytes;
    const size_t per_piece = std::max<size_t>(1, kPieceBytes / row);
    for (size_t j = 0; j < call.rows_at.size(); j += per_piece) {
      const size_t n = std::min(per_piece, call.rows_at.size() - j);
      if (scratch_.size() < n * row) scratch_.resize(n * row);
      PS_RETURN_IF_ERROR(stream_->Read(scratch_.data(), n * row));
      for (size_t k = 0; k < n; ++k) {
        std::memcpy(call.rows_into.data() + call.rows_at[j + k] * row, scratch_.data() + k * row,
                    row);
      }
    }
    return absl::OkStatus();
  }

  static absl::Status Lost(const absl::Status& why) {
    return absl::UnavailableError(
        absl::StrCat("the bulk channel connection was lost (", why.message(), "); retry"));
  }

  // Reads one reply and completes its call (the read turn held); `*helped`:
  // that call had a waiter reading for it. False when the connection broke
  // (its calls failed).
  bool ReadOne(bool* helped) {
    absl::StatusOr<ReplyHeader> reply = ReadReplyHead();
    if (!reply.ok()) {
      Break(Lost(reply.status()));
      return false;
    }
    absl::Status status(reply->code, message_);
    std::optional<Pending> call;
    if (Pending* receiving = ReceiveInto(*reply); receiving != nullptr) {
      // The call stays pending (receiving) while its rows or blocks are read.
      const absl::Status read = receiving->rows
                                    ? ReceiveRows(reply->payload_bytes, *receiving, &status)
                                    : ReceiveBlocks(reply->payload_bytes, *receiving, &status);
      {
        absl::MutexLock lock(&mu_);
        call = Take(pending_.find(reply->call_id));
      }
      if (call->result.has_value()) {
        status = *call->result;  // it ended meanwhile (deadline, cancel, a broken connection)
      } else if (!read.ok()) {
        status = Lost(read);
      }
      if (!read.ok()) {
        Report(*call, status);
        Break(Lost(read));
        return false;
      }
    } else {
      if (absl::Status read = ReadPayload(reply->payload_bytes); !read.ok()) {
        Break(Lost(read));
        return false;
      }
      call = TakeAnswered(reply->call_id);
      if (!call.has_value()) {
        Break(absl::UnavailableError("bulk channel: the server answered a call not made"));
        return false;
      }
      if (status.ok()) status = Deliver(payload_, *call);
      payload_ = grpc::Slice();
    }
    *helped = call->helped;
    if (call->trace != nullptr) {
      v1::ServerTrace times;
      times.set_received_unix_nanos(reply->received_unix_nanos);
      times.set_processed_unix_nanos(reply->processed_unix_nanos);
      call->trace->Server(times);
    }
    Report(*call, status);
    return true;
  }

  // Takes the read turn once `may_read` holds (false: `stop` held first),
  // reads one reply and gives the turn back (`*helped` as ReadOne's). False
  // when the connection broke or `stop` held.
  template <typename MayRead, typename Stop>
  bool ReadTurn(MayRead may_read, Stop stop, bool* helped) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return broken_ || stop() || (!reading_ && may_read());
      };
      mu_.Await(absl::Condition(&ready));
      if (broken_ || stop()) return false;
      reading_ = true;
    }
    const bool read = ReadOne(helped);
    absl::MutexLock lock(&mu_);
    reading_ = false;
    return read;
  }

  // The reader thread: reads while a call has no waiter to read for it, or
  // several calls are in flight, or the last reply it read was for a call
  // with no waiter (the next one likely has none either).
  void ReadLoop() {
    bool helped = true;  // nothing read yet: wait for a call with no waiter
    while (ReadTurn(
        [this, &helped]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return !helped || unhelped_ > 0 || pending_.size() > 1;
        },
        [] { return false; }, &helped)) {
    }
  }

  // A CallGroup's waiter: reads replies until call `id` is over; or, not
  // to `read`, leaves the call to the reader thread.
  void Help(uint64_t id, bool read) {
    if (!read) {
      absl::MutexLock lock(&mu_);
      auto it = pending_.find(id);
      if (it != pending_.end() && it->second.helped) {
        it->second.helped = false;
        ++unhelped_;
      }
      return;
    }
    bool helped = false;
    while (ReadTurn([] { return true; },
                    [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                      return pending_.find(id) == pending_.end();
                    },
                    &helped)) {
      counters_->waiter_reads.fetch_add(1, std::memory_order_relaxed);
    }
  }

  const std::unique_ptr<ByteStream> stream_;
  DeadlineTimer* const timer_;
  Counters* const counters_;
  std::thread reader_;
  absl::Mutex write_mu_;
  // The read turn's: the reply being read.
  std::string message_;
  grpc::Slice payload_;
  std::vector<char> scratch_;  // scattered rows, a piece at a time
  mutable absl::Mutex mu_;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;  // someone holds the read turn
  absl::Time watch_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();  // the timer's
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  int unhelped_ ABSL_GUARDED_BY(mu_) = 0;  // pending calls no waiter reads for
};

namespace {

// The parts of a byte buffer (its slices stay in `slices`).
std::vector<absl::string_view> Parts(const grpc::ByteBuffer& buffer,
                                     std::vector<grpc::Slice>* slices) {
  std::vector<absl::string_view> parts;
  if (!buffer.Dump(slices).ok()) return parts;
  for (const grpc::Slice& s : *slices) {
    parts.emplace_back(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return parts;
}

}  // namespace

ChannelTransport::ChannelTransport(std::unique_ptr<Transport> grpc, ChannelTransportOptions options)
    : grpc_(std::move(grpc)), options_(options) {
  slots_.resize(std::max(1, options_.connections));
}

ChannelTransport::~ChannelTransport() {
  std::vector<std::shared_ptr<Connection>> slots;
  {
    absl::MutexLock lock(&mu_);
    slots.swap(slots_);
  }
  for (auto& c : slots) {
    if (c != nullptr) c->Close();
  }
}

std::string ChannelTransport::route() const {
  absl::MutexLock lock(&mu_);
  return route_;
}

void ChannelTransport::FallBack(const absl::Status& why) {
  grpc_until_ = absl::Now() + options_.retry_after;
  have_offer_ = false;
  route_ = "grpc";
  if (logged_) return;
  logged_ = true;
  std::fprintf(stderr, "pserver client: bulk calls to %s use gRPC: %s\n", address().c_str(),
               std::string(why.message()).c_str());
}

namespace {

// Whether the socket's peer is a loopback address (127.0.0.0/8, ::1, or
// 127.x mapped into IPv6).
bool PeerIsLoopback(int fd) {
  sockaddr_storage peer{};
  socklen_t size = sizeof(peer);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &size) != 0) return false;
  if (peer.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&peer);
    return (ntohl(v4->sin_addr.s_addr) >> 24) == 127;
  }
  if (peer.ss_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(&peer)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
    return IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::shared_ptr<ChannelTransport::Connection>> ChannelTransport::Connect(
    const v1::OpenChannelResponse& offer, absl::Time deadline) {
  std::unique_ptr<ByteStream> stream;
  bool unix_socket = false;
  if (options_.unix_socket && !options_.tls.enabled() && !offer.unix_socket().empty()) {
    absl::StatusOr<std::unique_ptr<ByteStream>> local = ConnectAbstractUnix(offer.unix_socket());
    if (local.ok()) {
      stream = *std::move(local);
      unix_socket = true;
    }
  }
  std::string host;
  if (stream == nullptr) {
    host = TargetHost(address());
    if (host.empty() || offer.tcp_port() == 0) {
      return absl::UnavailableError("the bulk channel has no TCP port for this address");
    }
    PS_ASSIGN_OR_RETURN(stream, ConnectTcp(host, static_cast<int>(offer.tcp_port()),
                                           deadline - absl::Now()));
    if (auto* tcp = dynamic_cast<SocketStream*>(stream.get());
        tcp != nullptr && options_.unsent_bytes > 0 &&
        (options_.unsent_bytes_on_loopback || !PeerIsLoopback(tcp->fd()))) {
      // Best effort, as the socket buffers: a kernel without it writes as
      // before. TLS keeps the socket (StartTlsClient takes a dup of it).
      const int bytes = options_.unsent_bytes;
      setsockopt(tcp->fd(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &bytes, sizeof(bytes));
    }
  }
  // From here to the hello's answer a silent server is cut off by the
  // deadline or by Abandon.
  auto* socket = dynamic_cast<SocketStream*>(stream.get());
  if (socket == nullptr) return absl::InternalError("bulk channel: not a socket");
  PS_RETURN_IF_ERROR(BeginConnecting(socket->fd(), deadline));
  std::shared_ptr<Connection> connection;
  absl::Status opened;
  if (!unix_socket && options_.tls.enabled()) {
    absl::StatusOr<std::unique_ptr<ByteStream>> tls = StartTlsClient(
        std::move(stream), options_.tls, host, deadline, offer.bulk_aead() >= 1);
    if (tls.ok()) {
      stream = *std::move(tls);
    } else {
      opened = tls.status();
    }
  }
  if (opened.ok()) {
    if (auto* plain = dynamic_cast<SocketStream*>(stream.get()); plain != nullptr) {
      plain->SpinBeforeBlocking({options_.read_spin});  // a small reply: poll before sleeping
    }
    connection = std::make_shared<Connection>(std::move(stream), &timer_, &counters_);
    opened = connection->Hello(offer.token() + options_.bearer_token);
  }
  // Why the socket was cut says more than the failed read it caused.
  const absl::Status cut = EndConnecting();
  PS_RETURN_IF_ERROR(cut);
  PS_RETURN_IF_ERROR(opened);
  connection->table_frames = offer.table_frames() >= kTableFrameVersion;
  over_unix_ = unix_socket;
  opened_.fetch_add(1);
  return connection;
}

absl::Status ChannelTransport::BeginConnecting(int fd, absl::Time deadline) {
  absl::MutexLock lock(&connecting_mu_);
  if (abandoned_why_.has_value()) return *abandoned_why_;
  connect_cut_.reset();
  connecting_fd_ = dup(fd);
  if (connecting_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("bulk channel: dup of a connecting socket failed: ", std::strerror(errno)));
  }
  const uint64_t id = ++connecting_id_;
  const absl::Duration timeout = options_.connect_timeout;
  connect_timer_ = timer_.Schedule(deadline, [this, id, timeout] {
    absl::MutexLock lock(&connecting_mu_);
    if (connecting_id_ != id || connecting_fd_ < 0) return;  // answered meanwhile
    connect_cut_ = absl::DeadlineExceededError(absl::StrCat(
        "bulk channel to ", address(), ": no answer to the hello within the call's deadline or ",
        absl::FormatDuration(timeout), " (connect_timeout)"));
    shutdown(connecting_fd_, SHUT_RDWR);
  });
  return absl::OkStatus();
}

absl::Status ChannelTransport::EndConnecting() {
  absl::MutexLock lock(&connecting_mu_);
  timer_.Cancel(connect_timer_);  // a callback that runs anyway finds no socket
  close(connecting_fd_);
  connecting_fd_ = -1;
  return connect_cut_.value_or(absl::OkStatus());
}

absl::StatusOr<std::shared_ptr<ChannelTransport::Connection>> ChannelTransport::Open(
    absl::Time deadline) {
  if (have_offer_) {
    absl::StatusOr<std::shared_ptr<Connection>> again = Connect(offer_, deadline);
    if (again.ok()) return again;
    have_offer_ = false;  // a restarted server has a new token and port: ask
  }
  v1::OpenChannelRequest request;
  v1::OpenChannelResponse response;
  absl::Notification answered;
  absl::Status status;
  grpc_->Call("OpenChannel", request, &response, deadline, [&](absl::Status s) {
    status = std::move(s);
    answered.Notify();
  });
  answered.WaitForNotification();
  PS_RETURN_IF_ERROR(status);
  offer_ = std::move(response);
  have_offer_ = true;
  return Connect(offer_, deadline);
}

std::shared_ptr<ChannelTransport::Connection> ChannelTransport::Pick(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (abandoned_ || absl::Now() < grpc_until_) return nullptr;  // gRPC (which fails at once)
  std::shared_ptr<Connection>& slot = slots_[next_.fetch_add(1) % slots_.size()];
  if (slot != nullptr && !slot->broken()) return slot;
  if (slot != nullptr) {
    slot->Close();
    slot = nullptr;
  }
  absl::StatusOr<std::shared_ptr<Connection>> opened =
      Open(std::min(deadline, absl::Now() + options_.connect_timeout));
  if (!opened.ok()) {
    // A server gRPC cannot reach either: this call goes to gRPC, which says
    // why, and the next one tries again. Anything else (the channel off,
    // full, blocked): gRPC for a while.
    const bool unreachable = !have_offer_ && (absl::IsUnavailable(opened.status()) ||
                                              absl::IsDeadlineExceeded(opened.status()));
    if (!unreachable) FallBack(opened.status());
    return nullptr;
  }
  slot = *std::move(opened);
  route_ = over_unix_ ? "unix" : "tcp";
  return slot;
}

namespace {

// The bulk channel method that carries control call `method` with
// `request`: the table calls, but for a read by a worker (a consistent read
// may wait for other workers' clocks, which the TablePull control call does
// without holding a thread); none for any other call.
std::optional<FrameMethod> TableFrameMethod(absl::string_view method,
                                            const google::protobuf::Message& request) {
  if (method == "TablePush" &&
      request.GetDescriptor() == v1::TablePushRequest::descriptor()) {
    return FrameMethod::kTablePush;
  }
  if (method == "TablePull" && request.GetDescriptor() == v1::TablePullRequest::descriptor() &&
      static_cast<const v1::TablePullRequest&>(request).worker().empty()) {
    return FrameMethod::kTablePull;
  }
  return std::nullopt;
}

}  // namespace

void ChannelTransport::Call(absl::string_view method, const google::protobuf::Message& request,
                            google::protobuf::Message* response, absl::Time deadline, Done done) {
  if (const std::optional<FrameMethod> frame = TableFrameMethod(method, request);
      frame.has_value()) {
    const std::string bytes = request.SerializeAsString();  // written before Send returns
    const absl::string_view part = bytes;
    BlockSink parse = [response](const v1::Parameter&, const Segments& content) {
      const std::string joined = content.size() == 1 ? std::string() : absl::StrJoin(content, "");
      const absl::string_view bytes = content.size() == 1 ? content[0] : joined;
      if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
          !response->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
        return absl::DataLossError(
            absl::StrCat("bulk channel: malformed ", response->GetTypeName(), " reply"));
      }
      return absl::OkStatus();
    };
    if (Send(*frame, absl::MakeConstSpan(&part, 1), std::move(parse), deadline, done, nullptr)) {
      return;
    }
  }
  grpc_->Call(method, request, response, deadline, std::move(done));
}

bool ChannelTransport::Send(FrameMethod method, absl::Span<const absl::string_view> payload,
                            BlockSink sink, absl::Time deadline, Done& done,
                            TraceRecorder* trace) {
  std::shared_ptr<Connection> connection = Pick(deadline);
  if (connection == nullptr) return false;
  connection->Send(method, payload, std::move(sink), deadline, std::move(done), trace);
  return true;
}

bool ChannelTransport::TableRows(FrameMethod method, const TableFrame& frame, RowsSink rows,
                                 absl::Time deadline, Done& done, TraceRecorder* trace) {
  std::shared_ptr<Connection> connection = Pick(deadline);
  if (connection == nullptr || !connection->table_frames) return false;
  std::string head;  // written before Send returns
  const absl::InlinedVector<absl::string_view, 3> parts = EncodeTableFrame(frame, &head);
  const absl::Span<char> rows_into = rows ? frame.rows_into : absl::Span<char>();
  connection->Send(method, parts, nullptr, deadline, std::move(done), trace, std::move(rows),
                   rows_into, frame.rows_at, frame.row_bytes);
  return true;
}

void ChannelTransport::Abandon(const absl::Status& why) {
  grpc_->Abandon(why);  // first: an OpenChannel in flight, and gRPC calls, end now
  {
    // A connection being opened (Pick holds mu_ meanwhile) ends now.
    absl::MutexLock lock(&connecting_mu_);
    abandoned_why_ = why;
    if (connecting_fd_ >= 0) {
      connect_cut_ = why;
      shutdown(connecting_fd_, SHUT_RDWR);
    }
  }
  std::vector<std::shared_ptr<Connection>> slots;
  {
    absl::MutexLock lock(&mu_);
    abandoned_ = true;
    slots = slots_;
  }
  for (const std::shared_ptr<Connection>& c : slots) {
    if (c != nullptr) c->Break(why);
  }
}

void ChannelTransport::Push(const RequestId& id, absl::Span<const GradientView> grads,
                            absl::Time deadline, Done done, TraceRecorder* trace) {
  PushPull(id, grads, {}, nullptr, deadline, std::move(done), trace);
}

void ChannelTransport::PushPull(const RequestId& id, absl::Span<const GradientView> grads,
                                absl::Span<const v1::ParamRef> refs, BlockSink sink,
                                absl::Time deadline, Done done, TraceRecorder* trace) {
  const bool pull = !refs.empty();
  bool sent = false;
  {
    PayloadLease* lease = PayloadLease::Create([] {});
    std::vector<grpc::Slice> slices;
    {
      grpc::ByteBuffer request = EncodePushRequest(grads, refs, lease, id.client, id.sequence);
      sent = Send(pull ? FrameMethod::kPushPull : FrameMethod::kSendGrads, Parts(request, &slices),
                  sink, deadline, done, trace);
    }
    slices.clear();
    lease->Release();
  }
  if (sent) return;
  if (pull) {
    grpc_->PushPull(id, grads, refs, std::move(sink), deadline, std::move(done), trace);
  } else {
    grpc_->Push(id, grads, deadline, std::move(done), trace);
  }
}

void ChannelTransport::Pull(absl::Span<const v1::ParamRef> refs, BlockSink sink,
                            absl::Time deadline, Done done, TraceRecorder* trace) {
  v1::GetParamsRequest request;
  for (const v1::ParamRef& ref : refs) *request.add_params() = ref;
  const std::string bytes = request.SerializeAsString();
  const absl::string_view part = bytes;
  if (Send(FrameMethod::kGetParams, absl::MakeConstSpan(&part, 1), sink, deadline, done, trace)) {
    return;
  }
  grpc_->Pull(refs, std::move(sink), deadline, std::move(done), trace);
}

}  // namespace pserver
