#include "cc/server/bulk_listener.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "cc/core/status_macros.h"
#include "cc/security/bulk_aead_choice.h"
#include "cc/security/tls_byte_stream.h"
#include "cc/server/replica_channel.h"
#include "cc/rpc/spill_writer.h"
#include "cc/rpc/buffer_pool.h"
#include "cc/rpc/table_frame.h"
#include "cc/rpc/wire.h"
#include "cc/server/service.h"
#include "cc/server/streamed_push_pull.h"
#include "cc/trace/trace.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace pserver {
namespace {

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  size_t filled = 0;
  while (filled < n) {
    const ssize_t got = getrandom(out.data() + filled, n - filled, 0);
    if (got > 0) filled += static_cast<size_t>(got);
  }
  return out;
}

const char* MethodName(FrameMethod method) {
  switch (method) {
    case FrameMethod::kGetParams:
      return "GetParams";
    case FrameMethod::kSendGrads:
      return "SendGrads";
    case FrameMethod::kPushPull:
      return "PushPull";
    case FrameMethod::kTablePull:
      return "TablePull";
    case FrameMethod::kTablePush:
      return "TablePush";
    case FrameMethod::kTableRowsPull:
      return "TablePullRows";
    case FrameMethod::kTableRowsPush:
      return "TablePushRows";
    case FrameMethod::kReplicate:
      return "Replicate";
    case FrameMethod::kHello:
      break;
  }
  return "";
}

// The method a frame is authorized as (roles, docs/security.md): a table
// frame as the control call it stands for.
const char* AuthorizedAs(FrameMethod method) {
  switch (method) {
    case FrameMethod::kTableRowsPull:
      return "TablePull";
    case FrameMethod::kTableRowsPush:
      return "TablePush";
    default:
      return MethodName(method);
  }
}

// Pushes from this size on are read in pieces of kScanChunkBytes, each
// followed by the scan of the gradients it completed (PushFiniteScan).
constexpr size_t kScanWhileReadingBytes = size_t{1} << 20;
constexpr size_t kScanChunkBytes = size_t{256} << 10;

// Reads `n` bytes into `dest`, advancing `scan` after each piece.
absl::Status ReadScanning(ByteStream& stream, char* dest, size_t n, PushFiniteScan* scan) {
  for (size_t done = 0; done < n;) {
    const size_t piece = std::min(kScanChunkBytes, n - done);
    PS_RETURN_IF_ERROR(stream.Read(dest + done, piece));
    done += piece;
    scan->Advance(done);
  }
  return absl::OkStatus();
}

void SetReceiveTimeout(int fd, absl::Duration timeout) {
  timeval tv = absl::ToTimeval(timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

}  // namespace

BulkListener::BulkListener(Dispatcher* dispatcher, const BulkListenerOptions& options)
    : dispatcher_(dispatcher),
      options_(options),
      request_budget_(options.max_request_bytes_in_flight,
                      BudgetNames{"bulk channel request", "bulk channel requests",
                                  "bytes of bulk channel requests being read or served",
                                  "--max_bulk_request_bytes_in_flight",
                                  "send fewer parameters per call"}),
      deadlines_(options.frame_receive_timeout, [dispatcher] { dispatcher->CountMalformed(); }) {}

absl::StatusOr<std::unique_ptr<BulkListener>> BulkListener::Start(
    Dispatcher* dispatcher, const BulkListenerOptions& options) {
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_bulk_connections must be >= 1, not ", options.max_connections));
  }
  std::unique_ptr<BulkListener> listener(new BulkListener(dispatcher, options));
  int port = options.port;
  PS_ASSIGN_OR_RETURN(int tcp, ListenTcp(options.host, &port));
  listener->listen_fds_.push_back(tcp);
  listener->offer_.set_tcp_port(static_cast<uint32_t>(port));
  listener->offer_.set_token(RandomBytes(kChannelTokenBytes));
  listener->offer_.set_max_frame_bytes(options.max_frame_bytes);
  listener->offer_.set_table_frames(kTableFrameVersion);
  if (UseBulkAead(options.tls, "server")) listener->offer_.set_bulk_aead(1);
  if (options.unix_socket) {
    const std::string name =
        absl::StrCat("pserver-bulk-", getpid(), "-", absl::BytesToHexString(RandomBytes(8)));
    absl::StatusOr<int> unix_fd = ListenAbstractUnix(name);
    if (unix_fd.ok()) {  // without it, same-host clients use TCP
      listener->listen_fds_.push_back(*unix_fd);
      listener->offer_.set_unix_socket(name);
    }
  }
  for (int fd : listener->listen_fds_) {
    listener->acceptors_.emplace_back([raw = listener.get(), fd] { raw->AcceptLoop(fd); });
  }
  return listener;
}

BulkListener::~BulkListener() { Stop(); }

void BulkListener::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  for (int fd : listen_fds_) shutdown(fd, SHUT_RDWR);  // wakes accept()
  for (std::thread& t : acceptors_) t.join();
  for (int fd : listen_fds_) close(fd);
  std::list<std::unique_ptr<Connection>> connections;
  {
    absl::MutexLock lock(&mu_);
    connections = std::move(connections_);
    for (auto& c : connections) c->stream->Shutdown();
  }
  for (auto& c : connections) c->thread.join();
}

void BulkListener::DropConnections() {
  absl::MutexLock lock(&mu_);
  for (auto& c : connections_) c->stream->Shutdown();
}

int BulkListener::connections() const {
  absl::MutexLock lock(&mu_);
  int live = 0;
  for (const auto& c : connections_) live += c->finished.load() ? 0 : 1;
  return live;
}

void BulkListener::AcceptLoop(int listen_fd) {
  while (true) {
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      Admit(fd);
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    // Out of descriptors or memory: wait a little for connections to end.
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(100));
    if (stopping_) return;
  }
}

void BulkListener::Admit(int fd) {
  auto stream = std::make_unique<SocketStream>(fd);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // fails harmlessly on Unix
  SetSocketBuffers(fd);  // a Unix socket's are not inherited from its listener
  if (!options_.tls.enabled()) stream->SpinBeforeBlocking({options_.read_spin});
  absl::MutexLock lock(&mu_);
  ReapFinished();
  if (stopping_) return;
  if (static_cast<int>(connections_.size()) >= options_.max_connections) {
    refused_.fetch_add(1);
    // A small frame on a fresh socket does not block.
    WriteReplyFrame(*stream, ReplyHeader{},
                    absl::ResourceExhaustedError(absl::StrCat(
                        "the server serves at most ", options_.max_connections,
                        " bulk channel connections (--max_bulk_connections)")))
        .IgnoreError();
    return;
  }
  auto connection = std::make_unique<Connection>();
  connection->stream = std::move(stream);
  Connection* raw = connection.get();
  connection->thread = std::thread([this, raw] {
    Serve(*raw->stream);
    raw->stream->Shutdown();  // the peer sees the end now; closed when reaped
    raw->finished.store(true);
  });
  connections_.push_back(std::move(connection));
}

void BulkListener::ReapFinished() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if ((*it)->finished.load()) {
      (*it)->thread.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void BulkListener::Serve(SocketStream& socket) {
  // With TLS, frames go through a TLS stream on the same socket (handshake on
  // this connection's thread); shutting `socket` down ends both.
  // The client's verified certificate names its role, as on gRPC
  // (--auth_cert_rule), when its hello carries no bearer token.
  std::unique_ptr<ByteStream> tls;
  std::optional<CertNames> peer;
  if (options_.tls.enabled()) {
    const int fd = dup(socket.fd());
    if (fd < 0) return;
    peer.emplace();
    absl::StatusOr<std::unique_ptr<ByteStream>> secured =
        StartTlsServer(fd, options_.tls, absl::Now() + options_.hello_timeout, &*peer);
    if (!secured.ok()) return;
    tls = *std::move(secured);
    if (TlsUsesBulkAead(*tls)) aead_.fetch_add(1);
  }
  ByteStream& stream = tls != nullptr ? *tls : socket;
  std::optional<Principal> principal;
  if (!CheckHello(stream, socket.fd(), peer, &principal).ok()) return;
  SocketStream* const plain = tls != nullptr ? nullptr : &socket;
  const bool sealed = tls != nullptr && TlsUsesBulkAead(*tls);
  while (ServeFrame(stream, socket, plain, sealed, principal).ok()) {
  }
}

absl::Status BulkListener::CheckHello(ByteStream& stream, int fd,
                                      const std::optional<CertNames>& peer,
                                      std::optional<Principal>* principal) {
  SetReceiveTimeout(fd, options_.hello_timeout);
  char encoded[kFrameHeaderBytes];
  PS_RETURN_IF_ERROR(stream.Read(encoded, sizeof(encoded)));
  const bool auth = options_.auth != nullptr && options_.auth->enabled();
  // The channel token, then a client's bearer token (ignored when auth is off).
  absl::StatusOr<RequestHeader> header =
      DecodeRequestHeader(encoded, kChannelTokenBytes + kMaxTokenBytes);
  if (!header.ok()) return Malformed(stream, 0, header.status());
  std::string token(header->payload_bytes, '\0');
  PS_RETURN_IF_ERROR(stream.Read(token.data(), token.size()));
  const absl::string_view channel_token = absl::string_view(token).substr(0, kChannelTokenBytes);
  if (header->method != FrameMethod::kHello ||
      !ConstantTimeEquals(channel_token, offer_.token())) {
    const absl::Status refused = absl::PermissionDeniedError(
        "bulk channel: the first frame must present this server's token (OpenChannel)");
    return Malformed(stream, header->call_id, refused);
  }
  if (auth) {
    Credentials credentials;
    credentials.bearer_token = token.substr(kChannelTokenBytes);
    credentials.cert = peer;
    absl::StatusOr<Principal> who = options_.auth->Authenticate(credentials);
    if (!who.ok()) {
      ReplyHeader reply;
      reply.call_id = header->call_id;
      WriteReplyFrame(stream, reply, who.status()).IgnoreError();
      return who.status();
    }
    *principal = *std::move(who);
  }
  SetReceiveTimeout(fd, absl::ZeroDuration());
  ReplyHeader reply;
  reply.call_id = header->call_id;
  return WriteReplyFrame(stream, reply, absl::OkStatus());
}

absl::Status BulkListener::Malformed(ByteStream& stream, uint64_t call_id,
                                     const absl::Status& why) {
  malformed_.fetch_add(1);
  dispatcher_->CountMalformed();
  ReplyHeader reply;
  reply.call_id = call_id;
  WriteReplyFrame(stream, reply, why).IgnoreError();
  return why;
}

absl::Status BulkListener::Discard(ByteStream& stream, uint64_t bytes) {
  char sink[64 * 1024];
  while (bytes > 0) {
    const uint64_t n = std::min<uint64_t>(bytes, sizeof(sink));
    PS_RETURN_IF_ERROR(stream.Read(sink, n));
    bytes -= n;
  }
  return absl::OkStatus();
}

absl::Status BulkListener::ServeFrame(ByteStream& stream, SocketStream& socket,
                                      SocketStream* plain, bool sealed,
                                      const std::optional<Principal>& principal) {
  char encoded[kFrameHeaderBytes];
  PS_RETURN_IF_ERROR(stream.Read(encoded, sizeof(encoded)));
  // Stages: the frame (header read to reply written), receiving its payload
  // (and decoding it), applying it (the dispatcher's spans), writing the reply.
  trace::Span frame(dispatcher_->trace(), "bulk frame", "server");
  std::optional<trace::Span> stage(std::in_place, dispatcher_->trace(), "receive", "server");
  ReplyHeader reply;
  const absl::Time received = absl::Now();
  reply.received_unix_nanos = absl::ToUnixNanos(received);
  absl::StatusOr<RequestHeader> header = DecodeRequestHeader(encoded, options_.max_frame_bytes);
  if (!header.ok()) return Malformed(stream, 0, header.status());
  const BulkMethodFn method = FindBulkMethod(MethodName(header->method));
  if (method == nullptr && header->method != FrameMethod::kReplicate) {
    return Malformed(stream, header->call_id,
                     absl::InvalidArgumentError("bulk channel: a second hello frame"));
  }
  reply.call_id = header->call_id;
  // The payload, whether kept or dropped, is all in by the deadline, or the
  // connection goes (and with it any bytes held of the budget).
  FrameDeadlines::Armed receiving = deadlines_.Arm(&socket);
  if (principal.has_value()) {
    if (absl::Status allowed = options_.auth->Authorize(*principal, AuthorizedAs(header->method));
        !allowed.ok()) {
      PS_RETURN_IF_ERROR(Discard(stream, header->payload_bytes));
      receiving.Disarm();
      return WriteReplyFrame(stream, reply, allowed);
    }
  }
  if (absl::Status room = request_budget_.Acquire(header->payload_bytes); !room.ok()) {
    PS_RETURN_IF_ERROR(Discard(stream, header->payload_bytes));
    receiving.Disarm();
    return WriteReplyFrame(stream, reply, room);
  }
  const uint64_t held = header->payload_bytes;
  if (header->method == FrameMethod::kReplicate) {
    absl::Status answer;
    {
      const absl::Cleanup release = [this, held] { request_budget_.Release(held); };
      stage.reset();
      PS_RETURN_IF_ERROR(ServeReplicate(stream, *header, receiving, &answer));
      receiving.Disarm();  // a refused frame's rest was read and dropped
    }
    reply.processed_unix_nanos = absl::ToUnixNanos(absl::Now());
    return WriteReplyFrame(stream, reply, answer);
  }
  grpc::ByteBuffer response;
  ReplyHold hold;
  absl::Status status;
  StreamedPushPull streamed;
  {
    // The request's bytes count against the budget until the method is done
    // with them (a reply that shares a slice keeps its own reference), and are
    // given back before the reply is written.
    const absl::Cleanup release = [this, held] { request_budget_.Release(held); };
    // A large payload goes into a warm buffer (buffer_pool.h: a fresh one
    // may cost its whole repetition in page faults).
    grpc::Slice payload = ProcessBufferPool().Take(header->payload_bytes);
    char* const data = MutableData(payload);
    // A large push is scanned for NaN and infinity as it arrives, each
    // gradient once its bytes are in, while the client is still sending.
    const BulkPushFn push = FindBulkPushMethod(MethodName(header->method));
    std::optional<PushFiniteScan> scan;
    if (push != nullptr && payload.size() >= kScanWhileReadingBytes) {
      scan.emplace(absl::string_view(data, payload.size()));
      PS_RETURN_IF_ERROR(ReadScanning(stream, data, payload.size(), &*scan));
    } else {
      PS_RETURN_IF_ERROR(stream.Read(data, payload.size()));
    }
    receiving.Disarm();
    grpc::ByteBuffer request(&payload, 1);
    stage.reset();
    if (header->timeout_micros > 0 &&
        absl::Now() > received + absl::Microseconds(header->timeout_micros)) {
      status = absl::DeadlineExceededError("the call's deadline passed before it was served");
    } else {
      if ((plain != nullptr || sealed) && header->method == FrameMethod::kPushPull) {
        // Its reply goes out while it is applied (streamed_push_pull.h),
        // sealed as it goes over the AEAD layer.
        const auto start_frame = [&](uint64_t head_bytes,
                                     uint64_t frame_bytes) -> std::unique_ptr<FrameWriter> {
          if (plain != nullptr) return std::make_unique<SpillWriter>(plain);
          return StartSealedFrame(stream, head_bytes, frame_bytes);
        };
        streamed = StreamPushPull(*dispatcher_, request, scan.has_value() ? &*scan : nullptr,
                                  reply, start_frame, &hold);
      }
      if (streamed.outcome == StreamedPushPull::Outcome::kAnswered) {
        status = streamed.status;
      } else if (streamed.outcome == StreamedPushPull::Outcome::kWritten) {
        status = absl::OkStatus();
      } else if (streamed.decoded.has_value()) {  // not decoded again
        status = PushPullDecoded(*dispatcher_, request, *streamed.decoded, &response, &hold);
      } else if (scan.has_value()) {
        status = push(*dispatcher_, request, &*scan, &response, &hold);
      } else {
        status = method(*dispatcher_, request, &response, &hold);
      }
    }
  }
  reply.processed_unix_nanos = absl::ToUnixNanos(absl::Now());
  if (frame.active()) {
    frame.set_args(trace::Args()
                       .Add("method", MethodName(header->method))
                       .Add("call_id", header->call_id)
                       .Add("bytes", held)
                       .Add("status", absl::StatusCodeToString(status.code()))
                       .json());
  }
  // Written already: an error there drops the connection.
  if (streamed.outcome == StreamedPushPull::Outcome::kWritten) return streamed.status;
  stage.emplace(dispatcher_->trace(), "write reply", "server");
  std::vector<grpc::Slice> slices;
  std::vector<absl::string_view> parts;
  if (status.ok() && response.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      parts.emplace_back(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  return WriteReplyFrame(stream, reply, status, parts);
}

absl::Status BulkListener::ServeReplicate(ByteStream& stream, const RequestHeader& header,
                                          FrameDeadlines::Armed& receiving,
                                          absl::Status* answer) {
  uint64_t left = header.payload_bytes;
  // Refuses the frame: the rest of it is read and dropped, nothing applied.
  auto refuse = [&](absl::Status why) {
    dispatcher_->CountMalformed();
    *answer = std::move(why);
    return Discard(stream, left);
  };
  if (left < kReplicateHeaderBytes) {
    size_t unused = 0;
    char none[kReplicateHeaderBytes] = {};
    return refuse(DecodeReplicateHeader(none, left, &unused).status());
  }
  char encoded[kReplicateHeaderBytes];
  PS_RETURN_IF_ERROR(stream.Read(encoded, sizeof(encoded)));
  left -= sizeof(encoded);
  size_t method_bytes = 0;
  absl::StatusOr<ReplicateFrame> frame =
      DecodeReplicateHeader(encoded, header.payload_bytes, &method_bytes);
  if (!frame.ok()) return refuse(frame.status());
  BackupLog::Write write;
  write.epoch = frame->epoch;
  write.lsn = frame->lsn;
  write.method.resize(method_bytes);
  PS_RETURN_IF_ERROR(stream.Read(write.method.data(), method_bytes));
  left -= method_bytes;
  if (absl::Status known = CheckReplicatedMethod(write.method); !known.ok()) return refuse(known);
  if (!options_.replicate) {
    *answer = absl::FailedPreconditionError("this server is no backup (not a --standby)");
    return Discard(stream, left);
  }
  // The request's bytes straight into the write the backup log keeps (a
  // buffer not zero-filled first: the read fills it, or the connection and
  // the write go). A large push is scanned for NaN and infinity as it
  // arrives, as a client's is: the apply then skips the gradients found
  // finite in these very bytes.
  char* data = nullptr;
  write.shared = SharedBytes::Uninitialized(left, &data);
  if (write.method == "SendGrads" && left >= kScanWhileReadingBytes) {
    auto scan = std::make_shared<PushFiniteScan>(absl::string_view(data, left));
    PS_RETURN_IF_ERROR(ReadScanning(stream, data, left, scan.get()));
    write.finite_scan = std::move(scan);
  } else {
    PS_RETURN_IF_ERROR(stream.Read(data, left));
  }
  receiving.Disarm();  // applying it may wait for the copy (not the client)
  *answer = options_.replicate(frame->shard, std::move(write));
  return absl::OkStatus();
}

}  // namespace pserver
